"""The matrix products of a sentence-length forward: torch's options against onnxruntime's, one thread.

    python benchmarks/small_matmul.py [--rounds 400] [--out benchmarks/results/small_matmul.md]

At 94–128 tokens a MiniLM-size layer's products are [T, 384] × [384, 384 | 1536] and [T, 1536] × [1536, 384],
where onnxruntime's forward is faster than rulegraph's. Each product of an activation ``x`` [1, T, k] with a
weight ``W`` [k, n] (what an ONNX MatMul holds) is timed as:

* ``torch.matmul(x, W)``: what rulegraph's MatMul does;
* ``torch.mm`` on the 2-D view of ``x`` (what ``matmul`` folds to);
* ``F.linear(x, Wᵀ)`` with the transposed weight made contiguous once (the layout a ``nn.Linear`` holds);
* oneDNN's linear on a weight reordered (packed) once for ``T`` rows (``torch.ops.mkldnn``), a second copy
  of the weight;
* onnxruntime's MatMul (its weight prepacked at session creation).

Calls alternate (one of each per round, the order reversed every other round); the table gives the median
and its ratio to ``torch.matmul``, and each result's largest difference from ``torch.matmul``'s relative to
its largest entry (0: the same bits).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from harness import REPO, machine, report

SHAPES = [(94, 384, 384), (94, 384, 1536), (94, 1536, 384), (128, 384, 1536), (128, 1536, 384)]


def onnxruntime_matmul(weight: torch.Tensor, rows: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    k, n = weight.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])],
                              [numpy_helper.from_array(weight.numpy(), "W")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(helper.make_model(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(None, {"x": x.numpy()})[0])


def options(x: torch.Tensor, weight: torch.Tensor) -> dict:
    rows, (k, n) = x.shape[1], weight.shape
    transposed = weight.t().contiguous()
    made = {
        "torch.matmul(x, W)": lambda: torch.matmul(x, weight),
        "torch.mm on the 2-D view": lambda: torch.mm(x.view(rows, k), weight).view(1, rows, n),
        "F.linear(x, Wᵀ contiguous)": lambda: torch.nn.functional.linear(x, transposed),
    }
    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(transposed, batch_size=rows)
        made["oneDNN linear, packed weight"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none",
                                                                                          [], "")
    run = onnxruntime_matmul(weight, rows)
    made["onnxruntime MatMul"] = lambda: run(x)
    return made


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "small_matmul.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for t, k, n in SHAPES:
        x, weight = torch.randn(1, t, k), torch.randn(k, n) / np.sqrt(k)
        calls = options(x, weight)
        reference = calls["torch.matmul(x, W)"]()
        differences = {name: float((call() - reference).abs().max() / reference.abs().max())
                       for name, call in calls.items()}
        times: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(args.rounds):
            for name in names if r % 2 else names[::-1]:
                start = time.perf_counter()
                calls[name]()
                times[name].append((time.perf_counter() - start) * 1e6)
        base = statistics.median(times["torch.matmul(x, W)"])
        rows += [[f"[{t}, {k}] × [{k}, {n}]", name, f"{statistics.median(ts):.1f}",
                  f"{statistics.median(ts) / base:.2f}×", f"{differences[name]:.1e}"] for name, ts in times.items()]
    report(args.out, "Small matrix products, one thread", [machine(threads=1),
           f"float32, median of {args.rounds} alternating rounds (µs); difference: max |y − matmul's| / max |matmul's|."],
           ["product", "computed by", "median µs", "vs torch.matmul", "difference"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
