"""Two checkouts of rulegraph on short inputs, call by call interleaved (``--threads``, default one): wall, CPU time.

    python benchmarks/short_inputs_ab.py OLD_FOLDER [--rounds 30] [--threads 1]
        [--cases forward@94 lrp-ah-ln@94 attnlrp@128 gi@94 ...] [--out benchmarks/results/short_inputs_ab.md]

``OLD_FOLDER`` holds the other checkout's ``rulegraph/`` and ``rules/`` (``git archive REV rulegraph rules |
tar -x -C OLD_FOLDER``); this checkout is the new one. One worker process per checkout (its folder first on
``PYTHONPATH``, one torch thread unless ``--threads``) loads the demo model (MiniLM-L6 + head, float32, batch 1) and the
references every worker times alike: torch autograd Gradient×Input on the Hugging Face module (no weight
gradients, :func:`harness.gradient_times_input`) and the onnxruntime forward. The parent asks the two
workers in turn, call by call, alternating which goes first, so a loaded machine slows both alike; and
starts a fresh pair ``--pairs`` times (the order of their starts alternating): two processes running the
same code differ by up to ±15% on a loaded 2-core machine (where their pages lie, which core's neighbour
they share), so one pair's ratio says little, the median over pairs more.

A case is ``KIND@TOKENS``: ``forward`` (``Plan.run`` keeping nothing), a rule set's name (``explain`` with
its audit), ``NAME/noaudit``, ``hf-gi`` or ``ort``. Random token ids (the cost per node does not depend
on which). Reported: medians, and the median over rounds of the per-round ratio new / old (wall and
CPU time: the process's CPU time is what a loaded machine disturbs least); then, per checkout, each
rulegraph case's CPU median over its reference's at the same length (the forward over onnxruntime's, an
explanation over autograd Gradient×Input).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from harness import REPO, in_turn, machine, report

WORKER = r'''
import sys, time, warnings
import torch
threads = int(sys.argv[3])
torch.set_num_threads(threads)
warnings.filterwarnings("ignore")
import onnxruntime as ort
import rulegraph
sys.path.insert(0, sys.argv[1])
from harness import bert_gi, random_feeds, serve
model = sys.argv[2]
graph = rulegraph.load(model)
names = {i.name for i in graph.inputs}
plan = rulegraph.prepare(graph)
module = session = None

def case(c):
    global module, session
    kind, n = c.split("@")
    feeds = {k: v for k, v in random_feeds(int(n)).items() if k in names}
    if kind == "forward":
        return lambda: plan.run(feeds, keep=frozenset())
    if kind == "ort":
        if session is None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        numpy_feeds = {k: v.numpy() for k, v in feeds.items()}
        return lambda: session.run(None, numpy_feeds)
    if kind == "hf-gi":
        if module is None:
            from transformers import BertForSequenceClassification
            module = BertForSequenceClassification.from_pretrained(model.rsplit("/", 1)[0] + "/hf",
                                                                   attn_implementation="eager").eval()
        return bert_gi(module, feeds)
    method, _, flag = kind.partition("/")
    return lambda: rulegraph.explain(graph, method, feeds, audit=flag != "noaudit")

serve({c: case(c) for c in sys.argv[4:]}, lambda: (time.perf_counter(), time.process_time()))
'''

CASES = ["forward@94", "forward@128", "ort@94", "ort@128", "hf-gi@94", "lrp-ah-ln@94", "gi@94", "attnlrp@128",
         "attnlrp/noaudit@128", "attnlrp@8"]


def run_pair(args, env: dict, reverse: bool) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """One worker per checkout (started in the order ``reverse`` says), the cases asked of both in turn."""
    workers = {}
    order = (("new", REPO), ("old", args.old.resolve())) if reverse else (("old", args.old.resolve()), ("new", REPO))
    for name, folder in order:
        workers[name] = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(REPO / "benchmarks"), str(args.model.resolve()), str(args.threads),
             *args.cases],
            cwd="/", text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(env, PYTHONPATH=str(folder)))
    got = in_turn(workers, ["old", "new"], args.cases, args.rounds)
    return {key: ([wall * 1e3 for wall, _ in figures], [cpu * 1e3 for _, cpu in figures])
            for key, figures in got.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("--rounds", type=int, default=10, help="calls of each case per worker pair")
    parser.add_argument("--pairs", type=int, default=6, help="worker pairs, each started afresh")
    parser.add_argument("--cases", nargs="+", default=CASES)
    parser.add_argument("--threads", type=int, default=1, help="torch's and onnxruntime's threads per worker")
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "sentiment-minilm" / "model.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "short_inputs_ab.md")
    args = parser.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    times = {(n, c): ([], []) for n in ("old", "new") for c in args.cases}
    pair_ratios: dict[str, list[float]] = {c: [] for c in args.cases}
    for pair in range(args.pairs):
        got = run_pair(args, env, reverse=pair % 2 == 1)
        for key, (wall, cpu) in got.items():
            times[key][0].extend(wall)
            times[key][1].extend(cpu)
        for c in args.cases:
            pair_ratios[c].append(statistics.median(got["new", c][1]) / statistics.median(got["old", c][1]))
    rows = []
    for c in args.cases:
        (ow, oc), (nw, nc) = times["old", c], times["new", c]
        rows.append([c, f"{statistics.median(ow):.1f}", f"{statistics.median(nw):.1f}",
                     f"{statistics.median(n / o for n, o in zip(nw, ow)):.3f}", f"{statistics.median(oc):.1f}",
                     f"{statistics.median(nc):.1f}", f"{statistics.median(n / o for n, o in zip(nc, oc)):.3f}",
                     f"{statistics.median(pair_ratios[c]):.3f} ({min(pair_ratios[c]):.2f}–{max(pair_ratios[c]):.2f})"])
    cpu = {key: statistics.median(ts[1]) for key, ts in times.items()}
    for c in args.cases:
        kind, n = c.split("@")
        reference = f"ort@{n}" if kind == "forward" else f"hf-gi@{n}"
        if kind not in ("ort", "hf-gi") and reference in args.cases:
            rows.append([f"{c} / {reference} (CPU)", "", "", "", f"{cpu['old', c] / cpu['old', reference]:.2f}×",
                         f"{cpu['new', c] / cpu['new', reference]:.2f}×", "", ""])
    load = os.getloadavg()
    report(args.out, "Short inputs, two checkouts interleaved — demo model (MiniLM-L6 + head, float32, batch 1)",
           [f"{machine(args.threads)} · {args.pairs} worker pairs × {args.rounds} rounds, call by call interleaved · load average "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end"],
           ["case", "old wall ms", "new wall ms", "new/old wall", "old CPU ms", "new CPU ms", "new/old CPU",
            "new/old CPU, median over pairs (range)"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
