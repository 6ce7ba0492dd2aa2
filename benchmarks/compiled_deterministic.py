"""What torch's deterministic mode costs a compiled replay (``compiled=True`` compiles and runs its traces in it,
so that TorchInductor leaves scatters to ATen's kernels: ``rulegraph.passes.replay._scatters_in_aten``).

    python benchmarks/compiled_deterministic.py [--length 128] [--rounds 30] [--threads 2]
        [--out benchmarks/results/compiled_deterministic.md]

The demo model (MiniLM-L6 + head), AttnLRP with the audit, float32, batch 1: two copies of the graph, each
compiled once (a cold TorchInductor cache), one in the mode and one without it, then timed interleaved.
Without the mode TorchInductor generates its own scatters, which the mode exists to avoid (they wrote past
their buffer on a Bloom); the demo model's walk is not affected by that fault, so both run here.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from harness import REPO, interleave, machine, random_feeds, report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "sentiment-minilm" / "model.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "compiled_deterministic.md")
    args = parser.parse_args(argv)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
    torch.set_num_threads(args.threads)
    import rulegraph
    from rulegraph.passes import replay
    in_mode = replay._scatters_in_aten
    graphs = {"in deterministic mode (as shipped)": (rulegraph.load(args.model), in_mode),
              "without it": (rulegraph.load(args.model), contextlib.nullcontext)}
    feeds = random_feeds(args.length)

    def call(name: str):
        graph, mode = graphs[name]

        def run():
            replay._scatters_in_aten = mode           # read by the compiled replay at every call
            return rulegraph.explain(graph, "attnlrp", feeds, compiled=True)
        return run
    calls = {name: call(name) for name in graphs}
    try:
        for run in calls.values():
            run()                                     # each graph's compile
        times = interleave(calls, args.rounds)
    finally:
        replay._scatters_in_aten = in_mode
    base = statistics.median(times["without it"])
    rows = [[name, f"{statistics.median(t):.2f}", f"{statistics.median(t) / base:.3f}×"] for name, t in times.items()]
    report(args.out, "A compiled replay in torch's deterministic mode and without it",
           [f"{machine(args.threads)} · the demo model, attnlrp with the audit, {args.length} tokens, float32, "
            f"batch 1 · medians of {args.rounds} interleaved rounds"],
           ["compiled replay", "median ms", "vs without the mode"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
