"""Where a short explanation's time goes, native frames included: matrix products, other kernels, the audit's
dots, torch's dispatch and Python bindings, the interpreter's own Python, the C library.

    python benchmarks/native_profile.py [--cases lrp-ah-ln@94 attnlrp@128] [--calls 150] [--py-spy py-spy]
        [--out benchmarks/results/native_profile.md]

Needs ``py-spy`` (``pip install py-spy``, in any environment: it samples another process). Each case runs in
a process of its own on the demo model (MiniLM-L6 + head, float32, batch 1, one torch thread, random token
ids): five explanations to warm up, then ``--calls`` more, sampled by ``py-spy record --native`` at 300 Hz.
Only the samples inside the timed calls count; the same loop's time without the profiler is reported beside
the time under it (native sampling slows it). Each sample is booked by its innermost frame: a frame in
Python source is the interpreter's own Python; one in ``libtorch_cpu`` is MKL's ``sgemm`` (the matrix
products), its ``dot`` (the audit's sums in signal form), another kernel (TensorIterator loops, SLEEF and VML
functions, softmax, LayerNorm), or torch's dispatch (operator look-up, tensor allocation and bookkeeping);
``libtorch_python`` is the binding between Python and torch (argument parsing, wrapping); ``libpython`` the
Python runtime; ``libc`` mostly ``malloc``/``free`` and locks. Per-node kernel and Python times by op kind:
``node_profile.py``.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, machine, report

LOOP = r'''
import sys, time, torch
torch.set_num_threads(1)
import rulegraph
graph = rulegraph.load(sys.argv[1])
method, n = sys.argv[2].split("@")
n = int(n)
feeds = {"input_ids": torch.randint(1000, 5000, (1, n), generator=torch.Generator().manual_seed(n)),
         "attention_mask": torch.ones(1, n, dtype=torch.long), "token_type_ids": torch.zeros(1, n, dtype=torch.long)}
for _ in range(5):
    rulegraph.explain(graph, method, feeds)
def timed(calls):
    for _ in range(calls):
        rulegraph.explain(graph, method, feeds)
started = time.perf_counter()
timed(int(sys.argv[3]))
print("per call ms", (time.perf_counter() - started) / int(sys.argv[3]) * 1e3)
'''

KINDS = ["sgemm (matrix products)", "other kernels", "dot (the audit's sums)", "torch dispatch", "torch binding",
         "Python code", "Python runtime", "libc", "other"]


def kind(frame: str) -> str:
    """The kind of work a sample's innermost frame ``name (file:line)`` / ``name (library)`` is."""
    name, _, where = frame.rpartition(" (")
    if ".py:" in where:
        return "Python code"
    if "libtorch_cpu" in where:
        if name.startswith("mkl_blas") and "dot" in name:
            return "dot (the audit's sums)"
        if name.startswith("mkl_blas"):
            return "sgemm (matrix products)"
        if any(k in name for k in ("function_ref", "Sleef", "mkl_vml", "kernel", "Kernel", "Rowwise", "vectorized")):
            return "other kernels"
        return "torch dispatch"
    if "libtorch_python" in where:
        return "torch binding"
    if "libc10" in where:
        return "torch dispatch"
    if "libpython" in where:
        return "Python runtime"
    if "libc.so" in where or "ld-linux" in where:
        return "libc"
    return "other"


def per_call(command: list[str]) -> float:
    """The loop's milliseconds per explanation, run under ``command`` (py-spy's, or none)."""
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    return float(next(line for line in done.stdout.splitlines() if line.startswith("per call ms")).split()[-1])


def profile(args, case: str) -> tuple[float, float, collections.Counter]:
    """The explanation's time alone and under py-spy, and the samples per kind of innermost frame."""
    raw = Path(tempfile.mkdtemp()) / "raw.txt"
    loop = [sys.executable, "-c", LOOP, str(args.model), case, str(args.calls)]
    alone = per_call(loop)
    sampled = per_call([args.py_spy, "record", "--native", "-r", "300", "-f", "raw", "-o", str(raw), "--", *loop])
    counts: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if any(f.startswith("timed (") for f in frames):
            counts[kind(frames[-1])] += int(n)
    return alone, sampled, counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["lrp-ah-ln@94", "attnlrp@128"])
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--py-spy", default="py-spy")
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "sentiment-minilm" / "model.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "native_profile.md")
    args = parser.parse_args(argv)
    measured = {case: profile(args, case) for case in args.cases}
    rows = [[k, *(f"{100 * c[k] / sum(c.values()):.1f}%" for _, _, c in measured.values())] for k in KINDS]
    rows.append(["one explanation, alone / under py-spy",
                 *(f"{alone:.1f} / {sampled:.1f} ms" for alone, sampled, _ in measured.values())])
    rows.append(["samples", *(str(sum(c.values())) for _, _, c in measured.values())])
    print(report(args.out, "Where a short explanation's time goes, native frames included — demo model",
                 [f"{machine(1)} · {args.calls} explanations per case sampled at 300 Hz by py-spy --native; each "
                  "sample booked by its innermost frame"], ["innermost frame", *args.cases], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
