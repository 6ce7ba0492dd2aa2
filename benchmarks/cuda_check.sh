#!/usr/bin/env bash
# The checks that need a GPU, in one run: the CUDA tests (tests/test_cuda.py, skipped without CUDA),
# then the GPU benchmark (benchmarks/cuda_speed.py). Run from the repository root, on a machine that has torch,
# transformers and onnxruntime (rulegraph itself is installed from the checkout, without its dependencies, where
# it is missing):
#   bash benchmarks/cuda_check.sh [FOLDER]      # logs and the benchmark's table go to FOLDER
set -uo pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
PYTHONSAFEPATH=1 python3 -c "import rulegraph" 2>/dev/null ||
    python3 -m pip install -q --no-deps --no-build-isolation --no-index . || exit 1
nvidia-smi -L
python3 -c "import sys, torch, transformers, onnxruntime; print(sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'onnxruntime', onnxruntime.__version__, torch.cuda.get_device_name())"
# PYTHONSAFEPATH: the installed rulegraph, not the source folder of the same name in the working directory
PYTHONSAFEPATH=1 timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py \
    --durations=5 2>&1 | tee "$out/cuda_tests.log"
tests=$?
PYTHONUNBUFFERED=1 timeout 300 python3 benchmarks/cuda_speed.py --work /tmp/bench-models \
    --out "$out/cuda_speed.md" 2>&1 | tee "$out/cuda_speed.log"
exit $(( tests || $? ))
