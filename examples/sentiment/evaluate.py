"""Faithfulness of the explanation methods on the two sentiment models, as in the papers' tables.

    python examples/sentiment/evaluate.py rt   [--n 500]  # demo model, held-out Rotten Tomatoes sentences
    python examples/sentiment/evaluate.py imdb [--n 200]  # IMDB model, held-out IMDB reviews (≤ 512 tokens)
    python examples/sentiment/evaluate.py all             # both, then the tables and plots in docs/evaluation/
    python examples/sentiment/evaluate.py imdb --engine ray --num-workers 2   # on Ray workers (rulegraph[ray]), as committed
    python examples/sentiment/evaluate.py imdb --name imdb-rest --engine ray   # the other six methods, as committed

Each part runs ``rulegraph evaluate`` (:class:`rulegraph.evaluate.runner.Evaluation`) on the
first ``N`` texts of the held-out 20% split of ``data.py`` (the split the model was tested
on, never trained on). Results are appended to ``.cache/eval/<part>/results.jsonl``: an
interrupted run continues where it stopped when started again. ``--docs`` copies the table
(Markdown), the plots, ``summary.json`` and the per-text results (``<part>-results.jsonl.gz``,
with ``<part>-config.json``) of every part to ``docs/evaluation/``; a run with no results in
``.cache`` starts from those, so it continues the committed run on any machine.

Settings (the same for both parts, chosen for two shared CPU cores): removed tokens become
[UNK] (special tokens stay), AOPC over k ∈ {0, 10, 20}%, LOdds at 20%, curves (AUAC,
AU-MSE, hiding, revealing) at 20% steps, word deletion up to 4 words, IG with 8
Gauss–Legendre nodes from the all-[PAD] baseline (its completeness gap is recorded).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from rich.console import Console

import data
import train
import train_imdb
from runs import EVAL_DIR, copy_to_docs, count_rows, record_segment, seed_from_docs
from rulegraph.cli.evaluate import TerminalListener, render_table
from rulegraph.evaluate import metrics as M
from rulegraph.evaluate.runner import Config, Evaluation
from rulegraph.evaluate.summary import markdown_table
from rulegraph.ruleset import shipped_rule_sets
from rulegraph.scale import Engine, engine as make_engine

#: The papers' comparison: baselines, then the rule sets.
BASE_METHODS = ["random", "attention", "rollout", "gi", "ig", "loo", "lrp-ah", "lrp-ah-ln"]
#: Rule sets added to the table when they ship.
OPTIONAL_METHODS = ["attnlrp", "decomposition"]
#: The attention-based methods of the later papers: Mask-LRP's rollout with the calibrated head mask
#: (docs/heads/, `rulegraph heads calibrate`) and its random-mask control, LAT, GAE, decoded layer saliency.
ATTENTION_METHODS = ["mask-lrp-rollout", "mask-lrp-random", "lat", "gae", "layer-saliency"]
#: The head mask of each part's model (calibrated on that part's evaluation texts).
MASKS = {"rt": "docs/heads/minilm-rt-masks.yaml", "imdb": "docs/heads/minilm-imdb-masks.yaml"}
METRICS = ["aopc", "lodds", "auac", "au-mse", "hiding", "revealing", "word-deletion"]
SETTINGS = {"aopc_k": 20, "aopc_step": 10, "lodds_k": 20, "steps": 5, "words": 4}     # the metrics' options
OPTIONS = {"ig": {"steps": "8", "baseline": "pad"}}
#: Per-part additions. IMDB: the decomposition with signed α, so the pass is linearized (one
#: backward) instead of carrying all ~230 components (~40 s a review on 2 cores). In this GELU
#: model α enters at one node only, the pooler's tanh; RT keeps the rule file's hybrid α.
PART_OPTIONS = {"imdb": {"decomposition": {"alpha": "signed"}}}
for _part, _masks in MASKS.items():
    for _method in ("mask-lrp-rollout", "mask-lrp-random"):
        PART_OPTIONS.setdefault(_part, {})[_method] = {"masks": _masks}
REMOVAL = "unk"
PARTS = {"rt": 500, "imdb": 200}


#: Default methods by results name where they are not all of them: the committed IMDB evaluation ran
#: through Ray in two runs of the same part, `imdb` (the attention-based methods and four others) and
#: `imdb-rest` (`--name imdb-rest`: the remaining six).
PART_METHODS = {"imdb": ["random", "rollout", "lrp-ah-ln", "attnlrp", *ATTENTION_METHODS],
                "imdb-rest": ["attention", "gi", "ig", "loo", "lrp-ah", "decomposition"]}


def methods(name: str | None = None) -> list[str]:
    """The default methods of a results name (a part, or ``--name``)."""
    if name in PART_METHODS:
        return PART_METHODS[name]
    shipped = shipped_rule_sets()
    return BASE_METHODS + [m for m in OPTIONAL_METHODS if m in shipped] + ATTENTION_METHODS


def write_csv(path: Path, examples: list[data.Example]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(examples)
    return path


def part_inputs(part: str, n: int) -> tuple[Path, Path]:
    """(model.onnx, data CSV) of one part; trains the model first if it is not cached."""
    if part == "rt":
        model = train.ensure_model()
        _, test = data.rotten_tomatoes(train.SEED)
    else:
        model = train_imdb.ensure_model()
        _, test = data.imdb(train.SEED)
    return model, write_csv(EVAL_DIR / f"{part}-test.csv", test[:n])


def part_config(part: str, n: int, method_names: list[str]) -> Config:
    """The evaluation settings of one part (training its model first if it is not cached)."""
    model, csv_path = part_inputs(part, n)
    options = {**OPTIONS, **PART_OPTIONS.get(part, {})}
    return Config(model=str(model), data=str(csv_path), methods=method_names, metrics=METRICS,
                  options={k: v for k, v in options.items() if k in method_names}, removal=REMOVAL,
                  settings=SETTINGS, seed=0, n=n, batch=8 if part == "rt" else 4)


def run(part: str, n: int, method_names: list[str], threads: int | None, console: Console,
        compute: bool = True, engine: Engine | None = None, name: str | None = None) -> Path:
    """Evaluate one part into ``.cache/eval/<name>`` (``name``: default the part's own)."""
    name = name or part
    config = part_config(part, n, method_names)
    if threads:
        import torch
        torch.set_num_threads(threads)
    out = EVAL_DIR / name
    seed_from_docs(name, out, config, console)
    engine = engine or make_engine("local")
    rows_before, started = count_rows(out), time.perf_counter()
    summary = Evaluation(config, out, listener=TerminalListener(console), engine=engine).run(compute)
    if compute:
        record_segment(out, {"engine": engine.describe(), "threads": threads, "rows_before": rows_before,
                             "rows_after": count_rows(out), "wall_seconds": time.perf_counter() - started})
    metrics = M.build(METRICS, M.Removal(REMOVAL), SETTINGS)
    Console(highlight=False, width=200).print(render_table(summary, metrics, f"{name}: {summary.n_examples} texts"))
    (out / "table.md").write_text(markdown_table(summary, metrics) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["rt", "imdb", "all"])
    parser.add_argument("--n", type=int, default=None, help="texts per part (default: rt 500, imdb 200)")
    parser.add_argument("--methods", default=None, help="comma-separated (default: the papers' list + shipped extras; "
                                                        "for imdb and imdb-rest the committed runs', PART_METHODS)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--docs", action="store_true", help="copy tables and plots to docs/evaluation/")
    parser.add_argument("--report-only", action="store_true", help="no more evaluation: tables of what is done")
    parser.add_argument("--engine", choices=["local", "ray"], default="local", help="where the texts run")
    parser.add_argument("--num-workers", type=int, default=2, help="ray: workers (one model each, one thread each)")
    parser.add_argument("--name", default=None, help="results folder and docs prefix (default: the part), for "
                                                     "another set of methods on the same part")
    args = parser.parse_args(argv)
    if args.name and args.part == "all":
        parser.error("--name applies to one part")
    engine = make_engine("ray", num_workers=args.num_workers) if args.engine == "ray" else make_engine("local")
    console = Console(stderr=True)
    for part in (["rt", "imdb"] if args.part == "all" else [args.part]):
        chosen = args.methods.split(",") if args.methods else methods(args.name or part)
        run(part, args.n or PARTS[part], chosen, args.threads, console, not args.report_only, engine, args.name)
        if args.docs:
            copy_to_docs(args.name or part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
