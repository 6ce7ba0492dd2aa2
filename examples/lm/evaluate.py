"""Faithfulness of every method that runs on a causal LM, on the IMDB language model made by train.py.

    python examples/lm/evaluate.py [--n 400] [--docs]

The task is next-token prediction on held-out IMDB sentences: from the held-out 20% of the reviews
(never trained on; the reviews after the first 500, which measured the perplexity), the first
sentence of each review with 8 to 40 words, cut before its last word; the text is that prefix
(after ``<|endoftext|>``), and the method explains the logit of the token the model predicts next
(its argmax at the last position; ``rulegraph evaluate`` does this for any causal LM). Texts of 10
to 48 tokens are kept: the data file holds the first 2,000, the evaluation the first ``N`` (a later
run with a larger ``N`` continues the same run).

Protocol ``achtibat2024`` (Achtibat et al., ICML 2024, Table 1): most- and least-relevant-first
removal with the token embeddings set to zero, the predicted token's logit at fractions 0, 10, …,
100 % of the context, and the area between the two curves (``morf-lerf``); on the same perturbed
sequences, ``aopc`` (the logit's drop, most relevant first), ``logprob-drop`` (the drop of the
predicted token's log-probability) and ``lodds`` (log-probability change at 20 %). Methods: the
random, attention, rollout and GAE baselines, gradient×input, integrated gradients (16 nodes, zero
baseline: the same zero embeddings), leave-one-out (mode ``zero``: the same removal), and the
rule sets lrp-ah-ln, cp-lrp, epsilon, attnlrp and the decomposition.

Results go to ``.cache/eval/lm`` (resumable); ``--docs`` copies the table, plots, summary, per-text
results and the paired differences (the best method by ``morf-lerf`` against each other method, and
the rule sets against each other, IG and GAE) to ``docs/evaluation/lm-*``.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from pathlib import Path

from rich.console import Console

import train
sys.path.insert(0, str(train.REPO / "examples" / "sentiment"))
import runs  # noqa: E402  (examples/sentiment/runs.py: resuming, run.json, copying to docs)
from rulegraph.cli.evaluate import TerminalListener, render_paired, render_table  # noqa: E402
from rulegraph.evaluate import paired  # noqa: E402
from rulegraph.evaluate import protocols as P  # noqa: E402
from rulegraph.evaluate.runner import Config, Evaluation  # noqa: E402
from rulegraph.evaluate.summary import markdown_table  # noqa: E402
from rulegraph.scale import engine as make_engine  # noqa: E402

PART = "lm"
N = 400
#: texts written to the data file; ``--n`` evaluates the first N of them, so a run with a larger N resumes
POOL = 2000
METHODS = ["random", "attention", "rollout", "gae", "gi", "ig", "loo", "lrp-ah-ln", "cp-lrp", "epsilon", "attnlrp",
           "decomposition"]
OPTIONS = {"ig": {"steps": "16", "baseline": "zero"}, "loo": {"mode": "zero"}}
PROTOCOL = "achtibat2024"
METRICS = ["morf-lerf", "aopc", "logprob-drop", "lodds"]
#: the held-out reviews the texts come from start after those that measured the perplexity
FIRST_REVIEW = train.PERPLEXITY_REVIEWS
WORDS = (8, 40)
TOKENS = (10, 48)
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def texts(n: int) -> list[str]:
    """The first ``n`` prefixes (see the module docstring), one per held-out review."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(train.ensure_model().parent / "tokenizer.json"))
    _, held_out = train.reviews()
    chosen = []
    for review in held_out[FIRST_REVIEW:]:
        for sentence in SENTENCE.split(review):
            words = sentence.split()
            if not WORDS[0] <= len(words) <= WORDS[1]:
                continue
            prefix = " ".join(words[:-1])
            if TOKENS[0] <= len(tokenizer.encode(prefix).ids) <= TOKENS[1]:
                chosen.append(prefix)
                break
        if len(chosen) == n:
            break
    return chosen


def config(n: int) -> Config:
    model = train.ensure_model()
    path = runs.EVAL_DIR / f"{PART}-texts.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text"])
        writer.writerows([t] for t in texts(POOL))
    protocol = P.PROTOCOLS.get(PROTOCOL)
    return Config(model=str(model), data=str(path), methods=METHODS, metrics=METRICS, options=OPTIONS,
                  removal=protocol.removal, seed=0, n=n, batch=1, protocol=PROTOCOL)


#: the rule sets against each other and against the strongest other methods, besides the leader against all
PAIRS = [("lrp-ah-ln", "attnlrp"), ("lrp-ah-ln", "cp-lrp"), ("cp-lrp", "attnlrp"), ("cp-lrp", "epsilon"),
         ("cp-lrp", "decomposition"), ("lrp-ah-ln", "ig"), ("lrp-ah-ln", "gae"), ("attnlrp", "ig"), ("ig", "gi")]


def pairs(summary) -> list[tuple[str, str]]:
    """The method with the largest mean ``morf-lerf`` against every other method, then :data:`PAIRS`."""
    means = {m: per["morf-lerf"]["mean"] for m, per in summary.table.items() if "morf-lerf" in per}
    best = max(means, key=means.get)
    lead = [(best, m) for m in sorted(means, key=means.get, reverse=True) if m != best]
    return lead + [p for p in PAIRS if p not in lead and all(m in means for m in p)]


def run(n: int, threads: int | None, docs: bool, console: Console, compute: bool = True) -> Path:
    cfg = config(n)
    if threads:
        import torch
        torch.set_num_threads(threads)
    out = runs.EVAL_DIR / PART
    runs.seed_from_docs(PART, out, cfg, console)
    engine = make_engine("local")
    rows_before, started = runs.count_rows(out), time.perf_counter()
    evaluation = Evaluation(cfg, out, listener=TerminalListener(console), engine=engine)
    summary = evaluation.run(compute)
    if compute:
        runs.record_segment(out, {"engine": engine.describe(), "threads": threads, "rows_before": rows_before,
                                       "rows_after": runs.count_rows(out),
                                       "wall_seconds": time.perf_counter() - started})
    metrics = evaluation.metrics()
    Console(highlight=False, width=200).print(render_table(summary, metrics, f"{PART}: {summary.n_examples} texts"))
    (out / "table.md").write_text(markdown_table(summary, metrics) + "\n")
    result = paired.table(summary.rows, pairs(summary), METRICS, cfg.seed)
    Console(highlight=False, width=200).print(render_paired(result))
    (out / "paired.md").write_text(paired.CAPTION + "\n\n" + paired.markdown(result) + "\n")
    if docs:
        runs.copy_to_docs(PART)
        (runs.DOCS_DIR / f"{PART}-paired.md").write_text((out / "paired.md").read_text())
        metrics_json = json.loads((train.ensure_model().parent / "metrics.json").read_text())
        (runs.DOCS_DIR / f"{PART}-model.json").write_text(json.dumps(
            {"settings": train.settings(), "metrics": metrics_json}, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=N, help="texts (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--docs", action="store_true", help="copy tables and plots to docs/evaluation/lm-*")
    parser.add_argument("--report-only", action="store_true", help="no more evaluation: tables of what is done")
    args = parser.parse_args(argv)
    run(args.n, args.threads, args.docs, Console(stderr=True), not args.report_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
