"""Would a dataset job pay for compiled replays? The shapes its batches take, and one shape's compile against
what it saves.

    python benchmarks/compiled_payback.py [--examples 1000] [--rounds 8] [--threads 2]
        [--out benchmarks/results/compiled_payback.md]

``explain(…, compiled=True)`` compiles the replay once per input shape (a first call of tens of seconds), and
a dataset job pads each batch to its longest member, so its batches come in many shapes. On the demo model
(MiniLM-L6 + head, attnlrp with the audit, float32): the batches ``rulegraph explain-dataset`` cuts from the
first ``--examples`` held-out Rotten Tomatoes sentences (batch 16, :func:`rulegraph.scale.batches.batches`)
counted by shape; then, at the job's most frequent shape, the interpreter's and the compiled replay's time per
batch, interleaved, and the compile's one-off cost (a fresh TorchInductor cache): how many batches of one
shape repay its compile, and what compiling every shape of this job would cost against what it would save.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import REPO, interleave, job_lengths, machine, random_feeds, report, rt_sentences


def shapes(model: Path, data: Path, batch: int) -> collections.Counter:
    """The job's batches over ``data``, counted by (examples, padded length)."""
    from rulegraph.scale.batches import batches
    lengths = job_lengths(model, data)
    return collections.Counter((len(b), max(lengths[i] for i in b)) for b in batches(lengths, batch, 8192))


def timed(graph, rules, batch: int, length: int, rounds: int) -> tuple[float, float, float]:
    """Milliseconds per explanation of a ``batch`` × ``length`` batch by the interpreter and compiled (medians,
    interleaved), and the compiled one's first call in seconds."""
    import rulegraph
    feeds = random_feeds(length, batch)
    start = time.perf_counter()
    rulegraph.explain(graph, rules, feeds, compiled=True)
    first = time.perf_counter() - start
    times = interleave({"interpreter": lambda: rulegraph.explain(graph, rules, feeds),
                        "compiled": lambda: rulegraph.explain(graph, rules, feeds, compiled=True)}, rounds)
    return statistics.median(times["interpreter"]), statistics.median(times["compiled"]), first


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "sentiment-minilm" / "model.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "compiled_payback.md")
    args = parser.parse_args(argv)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()      # a cold compile, as on a first run
    torch.set_num_threads(args.threads)
    import rulegraph
    counts = shapes(args.model, rt_sentences(args.examples, Path(tempfile.mkdtemp())), 16)
    graph, rules = rulegraph.load(args.model), rulegraph.RuleSet.load("attnlrp")
    frequent = counts.most_common(1)[0][0]
    largest = max(counts, key=lambda s: (s[0] * s[1], s))
    rows = [["batches in the job", sum(counts.values()), "", ""],
            ["distinct shapes (examples × padded length)", len(counts), "", ""]]
    savings, compiles = [], []
    for what, (batch, length) in (("most frequent", frequent), ("largest", largest)):
        plain, compiled, first = timed(graph, rules, batch, length, args.rounds)
        savings.append(plain - compiled)
        compiles.append(first)
        n = counts[batch, length]
        shape = f"{what} shape, {batch} × {length} ({n} batch{'es' if n > 1 else ''})"
        rows += [[shape, "explanation, interpreter", f"{plain:.1f} ms", "1.00×"],
                 [shape, "explanation, compiled", f"{compiled:.1f} ms", f"{compiled / plain:.2f}×"],
                 [shape, "compile (first call)", f"{first:.1f} s", ""],
                 [shape, "batches of this shape that repay its compile",
                  f"{first * 1e3 / (plain - compiled):,.0f}" if plain > compiled else "never", ""]]
    rows.append(["the whole job", "compiling each of its shapes (their mean compile per shape)",
                 f"{len(counts) * statistics.mean(compiles):.0f} s", ""])
    rows.append(["the whole job", "saved if every batch saved the most either shape saves",
                 f"{sum(counts.values()) * max(savings) / 1e3:.1f} s", ""])
    report(args.out, "Compiled replays on a dataset job: shapes, compile and savings",
           [f"{machine(args.threads)} · the demo model, attnlrp with the audit, float32 · the first {args.examples} "
            f"held-out Rotten Tomatoes sentences at batch 16 · medians of {args.rounds} interleaved rounds; a cold "
            "TorchInductor cache"],
           ["", "", "value", "vs the interpreter"], rows)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
