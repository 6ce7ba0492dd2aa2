"""How wide the length-sorting window of a dataset job should be: padded tokens and examples per second.

    python benchmarks/batch_window.py [--windows 4 16 1000] [--examples 1000] [--runs 3]
        [--out benchmarks/results/batch_window.md]

A dataset job (``rulegraph explain-dataset``, ``rulegraph evaluate``) sorts its examples by length inside
windows of ``window × batch`` consecutive examples, then cuts batches (:func:`rulegraph.scale.batches.batches`):
each batch is padded to its longest member, so a narrow window pads more, a wide one strays further from the
file's order. For each window: the padded tokens of the first ``--examples`` held-out Rotten Tomatoes sentences
on the demo model (MiniLM-L6 + head; the tokens as the job counts them, batch 16), then ``rulegraph
explain-dataset`` (attnlrp, one thread) run ``--runs`` times per window, the windows alternated, each in a fresh
process with the window set as the default of ``batches``: the examples per second the job reports.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, job_lengths, machine, report, rt_sentences

#: a job's command line with ``batches``' window set first (argv[1]: the window)
JOB = ("import sys\nimport rulegraph.scale.batches\nsys.modules['rulegraph.scale.batches'].batches.__defaults__ = "
       "(int(sys.argv.pop(1)),)\nfrom rulegraph.cli import main\nsys.exit(main(sys.argv[1:]))")


def padded(model: Path, data: Path, windows: list[int], batch: int) -> dict[int, tuple[int, int, int]]:
    """Per window: (batches, tokens, padded tokens) of the job's batches over ``data``."""
    from rulegraph.scale.batches import batches
    lengths = job_lengths(model, data)
    out = {}
    for w in windows:
        cut = batches(lengths, batch, 8192, window=w)
        out[w] = (len(cut), sum(lengths), sum(len(b) * max(lengths[i] for i in b) for b in cut))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[4, 16, 1000])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "sentiment-minilm" / "model.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "batch_window.md")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp())
    data = rt_sentences(args.examples, work)
    tokens = padded(args.model, data, args.windows, 16)
    rates: dict[int, list[float]] = {w: [] for w in args.windows}
    for r in range(args.runs):
        for w in args.windows if r % 2 == 0 else reversed(args.windows):
            out = work / f"{w}-{r}"
            subprocess.run([sys.executable, "-c", JOB, str(w), "explain-dataset", str(args.model), "--rules",
                            "attnlrp", "--data", str(data), "--out", str(out), "-q"], check=True,
                           capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            rates[w].append(json.loads((out / "summary.json").read_text())["examples_per_second"])
    first = statistics.median(rates[args.windows[0]])
    rows = []
    for w in args.windows:
        n, real, pad = tokens[w]
        rate = statistics.median(rates[w])
        rows.append([f"{w} × 16 = {w * 16}", n, real, pad, f"{pad / real - 1:.1%}",
                     " / ".join(f"{x:.1f}" for x in rates[w]), f"{rate:.1f}", f"{rate / first:.2f}×"])
    text = report(args.out, "The length-sorting window of a dataset job — demo model, Rotten Tomatoes",
                  [machine(1), f"the first {args.examples} held-out sentences, batch 16; explain-dataset attnlrp, "
                               f"one thread, {args.runs} runs per window alternated (examples/s as the job reports "
                               "it)"],
                  ["window (examples)", "batches", "tokens", "padded tokens", "padding", "examples/s, each run",
                   "median", f"vs window {args.windows[0]}"], rows)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
