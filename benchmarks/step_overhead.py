"""The interpreter's own cost per step of the forward, against the ops alone, side by side in one run.

    python benchmarks/step_overhead.py [--lengths 2 16 94 512] [--rounds 40] [--threads 1]
        [--out benchmarks/results/step_overhead.md]

On the demo model (MiniLM-L6 + head, float32, batch 1, real text cut to each length), two ways
interleaved, round after round: ``Plan.run`` keeping no value (as ``explain`` runs it: the free
schedule, writing into dying inputs, the size checks, the shape cache) and the same value-dependent
steps' op functions called one after another on the arguments of a full run (no bookkeeping at all; every
output freshly allocated and dropped). The difference, divided by the steps, is what the interpreter
adds per step: dispatch, the size and budget checks, the donor checks and freeing. It can come out
below zero where writing into dying inputs saves more than the bookkeeping costs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

from harness import REPO, interleave, machine, report

sys.path.insert(0, str(REPO / "examples" / "sentiment"))

from explain_speed import inputs_of_length  # noqa: E402
from train import ensure_model  # noqa: E402

import rulegraph  # noqa: E402
from rulegraph.text import TextEncoder  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2, 16, 94, 512])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "step_overhead.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_path = ensure_model()
    plan = rulegraph.prepare(rulegraph.load(model_path))
    encoder = TextEncoder(model_path.parent / "tokenizer.json")
    rows = []
    for length in args.lengths:
        feeds = inputs_of_length(encoder, length)
        values = plan.run(feeds)
        calls = [(s.spec.forward, values.arguments(s), s.attrs) for s in plan.value_steps]
        del values

        def ops_alone():
            for forward, arguments, attrs in calls:
                forward(*arguments, **attrs)
        times = interleave({"interpreter": lambda: plan.run(feeds, keep=frozenset()), "ops alone": ops_alone},
                           args.rounds)
        run, bare = statistics.median(times["interpreter"]), statistics.median(times["ops alone"])
        steps = len(calls)
        rows.append([length, steps, f"{run:.2f} ms", f"{bare:.2f} ms", f"{(run - bare) / steps * 1e3:.1f} µs",
                     f"{(run - bare) / run:.0%}"])
    report(args.out, "Interpreter overhead per step — demo model forward (MiniLM-L6 + head, float32, batch 1)",
           [f"{machine(args.threads)} · {args.rounds} interleaved rounds, medians"],
           ["tokens", "value steps", "Plan.run", "ops alone", "overhead per step", "share of Plan.run"], rows)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
