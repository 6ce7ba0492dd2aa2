#!/usr/bin/env bash
# A scratch environment with the peer libraries rulegraph is checked against:
# Zennit (LRP rules), zennit-crp 0.6.0 (conditional relevance), LXT 2.1 (AttnLRP), PyDec 0.3.0
# (linear decomposition), Captum.
# Never a runtime dependency: they pull torch 2.14.1 (CUDA build, ~5.5 GB) and
# torchvision, and LXT 2.1 needs transformers 4.5x. Tests marked `peer` use it
# through `$RULEGRAPH_PEERS` (default: .peers/ in the repository) and skip without it;
# run them with `.peers/bin/python -m pytest -m peer`.
#
#   bash benchmarks/peers/setup.sh [DIR]
set -euo pipefail
DIR="${1:-${RULEGRAPH_PEERS:-$(cd "$(dirname "$0")/../.." && pwd)/.peers}}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$DIR/bin/python" ]; then
  "$PYTHON" -m venv "$DIR"
fi
"$DIR/bin/python" -m pip install --quiet --upgrade pip
"$DIR/bin/python" -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1" "transformers==4.56.2" \
    zennit tabulate matplotlib accelerate onnx onnxscript numpy
"$DIR/bin/python" -m pip install --quiet --no-deps lxt==2.1 pydec==0.3.0 captum zennit-crp==0.6.0
# rulegraph itself, so one process can run it beside the peers (benchmarks, `pytest -m peer`)
"$DIR/bin/python" -m pip install --quiet onnxruntime networkx pyyaml rich click tokenizers pytest hypothesis pyarrow \
    safetensors pillow
"$DIR/bin/python" -m pip install --quiet --no-deps -e "$(cd "$(dirname "$0")/../.." && pwd)"
"$DIR/bin/python" - <<'PY'
import torch, torchvision, transformers, zennit, lxt, captum, crp
print("peers ready:", "torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__, "zennit", getattr(zennit, "__version__", "?"))
PY
