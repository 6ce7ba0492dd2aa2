"""What keeping the C heap between explanations (``rulegraph.heap``) gives: time and page faults per call.

    python benchmarks/heap.py [--threads 1 2] [--pairs 4] [--rounds 12] [--dataset 1000]
        [--out benchmarks/results/heap.md]

Two worker processes at a time, one with ``RULEGRAPH_KEEP_HEAP=0`` (glibc trims its heap as it does by
default), one without (rulegraph keeps :data:`rulegraph.heap.PAD` bytes at its top). Each loads the demo model
(MiniLM-L6 + head, float32, batch 1) and the Hugging Face module, then is asked for the cases in turn, call by
call, alternating which worker goes first; ``--pairs`` fresh pairs, the order of their starts alternating.
Each worker runs what a user's process runs: explanations, and (as a reference) torch autograd
Gradient×Input on the module; no onnxruntime session (one in the process changes glibc's thresholds,
``results/short_inputs_ab.md`` was measured with one). Reported per case: medians of wall time and of the
minor page faults of a call, and the median of the per-call ratio kept / trimmed.

``--dataset N``: then ``rulegraph explain-dataset`` (attnlrp, one thread) on the first N held-out Rotten
Tomatoes sentences, three runs each way, alternated: examples per second as the job reports it, and peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, in_turn, machine, report, rt_sentences

WORKER = r'''
import resource, sys, time, warnings
import torch
torch.set_num_threads(int(sys.argv[3]))
warnings.filterwarnings("ignore")
import rulegraph
sys.path.insert(0, sys.argv[1])
from harness import bert_gi, random_feeds, serve
model = sys.argv[2]
graph = rulegraph.load(model)
from transformers import BertForSequenceClassification
module = BertForSequenceClassification.from_pretrained(model.rsplit("/", 1)[0] + "/hf",
                                                       attn_implementation="eager").eval()

def case(c):
    kind, n = c.split("@")
    feeds = random_feeds(int(n))
    return bert_gi(module, feeds) if kind == "hf-gi" else lambda: rulegraph.explain(graph, kind, feeds)

serve({c: case(c) for c in sys.argv[4:]},
      lambda: (time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt))
'''

CASES = ["hf-gi@94", "lrp-ah-ln@94", "gi@94", "hf-gi@128", "attnlrp@128"]
WAYS = {"kept": {}, "trimmed": {"RULEGRAPH_KEEP_HEAP": "0"}}


def run_pair(args, threads: int, reverse: bool) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    workers = {}
    for way in reversed(WAYS) if reverse else WAYS:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false", **WAYS[way])
        workers[way] = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(REPO / "benchmarks"), str(args.model), str(threads), *args.cases],
            cwd="/", text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    got = in_turn(workers, list(WAYS), args.cases, args.rounds)
    return {key: ([wall * 1e3 for wall, _ in figures], [faults for _, faults in figures])
            for key, figures in got.items()}


def calls(args, threads: int) -> list[list]:
    times = {(way, c): ([], []) for way in WAYS for c in args.cases}
    for pair in range(args.pairs):
        for key, (wall, faults) in run_pair(args, threads, reverse=pair % 2 == 1).items():
            times[key][0].extend(wall)
            times[key][1].extend(faults)
    rows = []
    for c in args.cases:
        (kw, kf), (tw, tf) = times["kept", c], times["trimmed", c]
        rows.append([threads, c, f"{statistics.median(tw):.1f}", f"{statistics.median(kw):.1f}",
                     f"{statistics.median(k / t for k, t in zip(kw, tw)):.3f}", f"{statistics.median(tf):.0f}",
                     f"{statistics.median(kf):.0f}"])
    return rows


#: the command line in a process that prints its own peak RSS (KiB) last
DATASET = ("import resource, sys\nfrom rulegraph.cli import main\nrc = main(sys.argv[1:])\n"
           "print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\nsys.exit(rc)")


def dataset(args) -> list[list]:
    """explain-dataset three times each way, alternated: examples/s (the job's figure) and peak RSS."""
    work = Path(tempfile.mkdtemp())
    data = rt_sentences(args.dataset, work)
    got: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for r in range(3):
        for way in WAYS if r % 2 == 0 else reversed(WAYS):
            out = work / f"{way}-{r}"
            done = subprocess.run([sys.executable, "-c", DATASET, "explain-dataset", str(args.model), "--rules",
                                   "attnlrp", "--data", str(data), "--out", str(out), "--threads", "1"], check=True,
                                  capture_output=True, text=True,
                                  env=dict(os.environ, OMP_NUM_THREADS="1", **WAYS[way]))
            peak = int(done.stdout.split()[-1]) / 1024
            got[way].append((json.loads((out / "summary.json").read_text())["examples_per_second"], peak))
    return [[1, f"explain-dataset attnlrp, {args.dataset} sentences ({way})",
             f"{statistics.median(x for x, _ in got[way]):.1f} examples/s",
             " / ".join(f"{p:.0f}" for _, p in got[way])] for way in WAYS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--pairs", type=int, default=4, help="worker pairs, each started afresh")
    parser.add_argument("--rounds", type=int, default=12, help="calls of each case per worker pair")
    parser.add_argument("--cases", nargs="+", default=CASES)
    parser.add_argument("--dataset", type=int, default=0, help="sentences for the explain-dataset rows (0: none)")
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "sentiment-minilm" / "model.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "heap.md")
    args = parser.parse_args(argv)
    started = time.time()
    rows = [row for threads in args.threads for row in calls(args, threads)]
    conditions = (f"{machine().rsplit(' · ', 1)[0]} · {args.pairs} worker pairs × {args.rounds} rounds per thread "
                  "count, call by call interleaved · trimmed: RULEGRAPH_KEEP_HEAP=0 (glibc's default); kept: "
                  "rulegraph.heap's pad")
    text = report(args.out, "The C heap kept between explanations — demo model (MiniLM-L6 + head, float32, batch 1)",
                  [conditions],
                  ["threads", "case", "trimmed ms", "kept ms", "kept / trimmed", "trimmed faults", "kept faults"],
                  rows)
    if args.dataset:
        more = dataset(args)
        with args.out.open("a") as f:
            f.write("\n| threads | job | rate (median of 3) | peak RSS MiB, each run |\n|---:|---|---:|---:|\n")
            f.writelines("| " + " | ".join(map(str, row)) + " |\n" for row in more)
        text += "".join(str(row) + "\n" for row in more)
    print(text)
    print(f"({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
