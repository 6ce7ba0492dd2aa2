"""Which quantity should a conserving rule set explain on a classifier: the logit, the log-probability, or the
contrast to the runner-up class? Measured on the demo model (MiniLM fine-tuned on Rotten Tomatoes).

    python examples/sentiment/quantity.py [--n 300] [--docs]

The faithfulness metrics score the predicted class's probability, while a rule set explains its logit by
default. Each of the conserving rule sets (epsilon, cp-lrp, decomposition, lrp-ah-ln, attnlrp) is run three
ways in one evaluation, as three methods: ``R`` (the logit z_A), ``R/logprob=R`` with ``-o score=logprob``
(z_A − Σ p·z with p held constant, whose gradient is that of log p_A) and ``R/contrast=R`` with
``-o contrast=runner-up`` (z_A − z_B, B the best other class: log p_A − log p_B). On a two-class model the
log-probability's seed e_A − p is p_B (e_A − e_B), the contrast's scaled by p_B > 0; every one of these rule
sets is linear in its seed, so the two rank the tokens alike and their metrics agree (the evaluation measures
it rather than assume it).

Two protocols, each a run on the first ``N`` held-out sentences of the demo's split: ``default`` with
[UNK] and the settings of the committed RT table (``evaluate.py``: AOPC over k ∈ {0, 10, 20} %, LOdds at 20 %,
curves at 20 % steps, word deletion up to 4 words), and ``mask-10-50`` ([MASK], k = 10…50 %,
max(1, round(kL)), AOPC and LOdds). Paired differences per text: each rule set's logprob and contrast
against its logit, and the leading method against every other. Results in ``.cache/eval/rt-quantity`` and
``rt-quantity-mask-10-50`` (resumable); ``--docs`` copies tables, plots, summaries, per-text results and the
paired tables to ``docs/evaluation/``, and writes the rule set × quantity table of both runs,
``docs/evaluation/rt-quantity.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console

import data
import train
from evaluate import METRICS, REMOVAL, SETTINGS, write_csv
from runs import DOCS_DIR, EVAL_DIR, copy_to_docs, count_rows, record_segment, seed_from_docs
from rulegraph.cli.evaluate import TerminalListener, render_paired, render_table
from rulegraph.evaluate import metrics as M, paired
from rulegraph.evaluate.runner import Config, Evaluation
from rulegraph.evaluate.summary import markdown_table
from rulegraph.scale import engine as make_engine

RULE_SETS = ["epsilon", "cp-lrp", "decomposition", "lrp-ah-ln", "attnlrp"]
#: quantity → the method options that explain it (the logit: none)
QUANTITIES = {"logit": {}, "logprob": {"score": "logprob"}, "contrast": {"contrast": "runner-up"}}
N = 300
#: sentences written to the data file; ``--n`` evaluates the first N, so a larger N continues a run
POOL = 1000
#: run name → (protocol, removal, metrics, settings)
RUNS = {"rt-quantity": ("default", REMOVAL, METRICS, SETTINGS),
        "rt-quantity-mask-10-50": ("mask-10-50", "mask", ["aopc", "lodds"], {"lodds_k": 20})}


def method(rules: str, quantity: str) -> str:
    """The method spec of a rule set explaining a quantity (``R``, or ``R/quantity=R``)."""
    return rules if quantity == "logit" else f"{rules}/{quantity}={rules}"


def methods() -> list[str]:
    return [method(r, q) for r in RULE_SETS for q in QUANTITIES]


def config(name: str, n: int) -> Config:
    protocol, removal, metrics, settings = RUNS[name]
    _, test = data.rotten_tomatoes(train.SEED)
    csv_path = write_csv(EVAL_DIR / "rt-quantity-test.csv", test[:POOL])
    options = {method(r, q): dict(o) for r in RULE_SETS for q, o in QUANTITIES.items() if o}
    return Config(model=str(train.ensure_model()), data=str(csv_path), methods=methods(), metrics=metrics,
                  options=options, removal=removal, settings=settings, seed=0, n=n, batch=8, protocol=protocol)


def pairs(summary, lead: str) -> list[tuple[str, str]]:
    """Per rule set, its contrast against its logit and its logprob against its contrast; then the method
    with the best mean ``lead`` against each rule set's logit."""
    out = [p for r in RULE_SETS for p in ((method(r, "contrast"), r), (method(r, "logprob"), method(r, "contrast")))]
    means = {m: per[lead]["mean"] for m, per in summary.table.items() if lead in per}
    best = (max if M.METRICS.get(lead).higher_is_better else min)(means, key=means.get)
    return out + [(best, r) for r in RULE_SETS if r != best and (best, r) not in out]


def run(name: str, n: int, threads: int | None, docs: bool, console: Console, compute: bool = True) -> Path:
    cfg = config(name, n)
    if threads:
        import torch
        torch.set_num_threads(threads)
    out = EVAL_DIR / name
    seed_from_docs(name, out, cfg, console)
    engine = make_engine("local")
    rows_before, started = count_rows(out), time.perf_counter()
    evaluation = Evaluation(cfg, out, listener=TerminalListener(console), engine=engine)
    summary = evaluation.run(compute)
    if compute:
        record_segment(out, {"engine": engine.describe(), "threads": threads, "rows_before": rows_before,
                             "rows_after": count_rows(out), "wall_seconds": time.perf_counter() - started})
    metrics = evaluation.metrics()
    wide = Console(highlight=False, width=220)
    wide.print(render_table(summary, metrics, f"{name}: {summary.n_examples} texts"))
    (out / "table.md").write_text(markdown_table(summary, metrics) + "\n")
    result = paired.table(summary.rows, pairs(summary, "aopc"), [m.name for m in metrics], cfg.seed)
    wide.print(render_paired(result))
    (out / "paired.md").write_text(paired.CAPTION + "\n\n" + paired.markdown(result) + "\n")
    if docs:
        copy_to_docs(name)
        (DOCS_DIR / f"{name}-paired.md").write_text((out / "paired.md").read_text())
    return out


def combined_table(names: list[str]) -> str:
    """Rule set × quantity rows, AOPC and LOdds of each run as columns (mean [95% interval]), from the runs'
    summary.json: the table of docs/evaluation.md."""
    docs = {name: json.loads((EVAL_DIR / name / "summary.json").read_text()) for name in names}
    head = [f"{metric} ({docs[n]['protocol']['name']}) {'↑' if docs[n]['higher_is_better'][metric] else '↓'}"
            for n in names for metric in ("aopc", "lodds")]
    lines = ["| rule set | explains | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(head)]
    for r in RULE_SETS:
        for q in QUANTITIES:
            cells = []
            for n in names:
                for metric in ("aopc", "lodds"):
                    s = docs[n]["table"][method(r, q)][metric]
                    cells.append(f"{s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]")
            lines.append(f"| {r} | {q} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=N, help="held-out sentences (default: %(default)s)")
    parser.add_argument("--runs", default=",".join(RUNS), help="which runs (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--docs", action="store_true", help="copy tables and plots to docs/evaluation/")
    parser.add_argument("--report-only", action="store_true", help="no more evaluation: tables of what is done")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    for name in args.runs.split(","):
        if name not in RUNS:
            parser.error(f"unknown run {name!r}; valid: {', '.join(RUNS)}")
        run(name, args.n, args.threads, args.docs, console, not args.report_only)
    if args.docs and all((EVAL_DIR / name / "summary.json").exists() for name in RUNS):
        (DOCS_DIR / "rt-quantity.md").write_text(combined_table(list(RUNS)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
