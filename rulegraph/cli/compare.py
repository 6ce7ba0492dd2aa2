"""``rulegraph compare``: paired differences between methods from results already written."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from .console import out
from .options import OUTPUT, Bounded


@click.command("compare")
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--paired", "pairs", required=True, metavar="A-B,C-D,…",
              help="pairs of methods: A − B per text, mean and 95% bootstrap interval over the texts both scored")
@click.option("--metrics", "metric_names", default=None, metavar="A,B,…",
              help="metrics to compare (default: every metric the results hold)")
@click.option("--seed", type=Bounded(int, 0, 2**32 - 1), default=0, show_default=True,
              help="seed of the bootstrap (an evaluation's --seed gives the same intervals)")
@click.option("--markdown", "markdown_path", type=OUTPUT, default=None, metavar="FILE",
              help="also write the table as Markdown")
@click.option("--csv", "csv_path", type=OUTPUT, default=None, metavar="FILE",
              help="also write pair, metric, mean, interval and texts as CSV")
@click.option("--force", is_flag=True, help="overwrite --markdown / --csv files")
def compare_cmd(results, pairs, metric_names, seed, markdown_path, csv_path, force):
    """Paired differences A − B per text between methods of evaluations already run: RESULTS are
    `rulegraph evaluate` output folders (or their results.jsonl / .jsonl.gz files); several are read
    together when they scored the same texts with different methods."""
    from ..evaluate import paired
    from .evaluate import render_paired
    from .inputs import check_outputs, write
    check_outputs([(markdown_path, "--markdown"), (csv_path, "--csv")], force, [str(r) for r in results])
    rows = paired.read_results(results)
    if not rows:
        raise InputError(f"no results rows in {', '.join(map(str, results))}")
    methods = sorted({r["method"] for r in rows})
    metrics = [m.strip() for m in metric_names.split(",") if m.strip()] if metric_names else None
    result = paired.table(rows, paired.parse_pairs(pairs, methods), metrics, seed)
    out.print(render_paired(result))
    if markdown_path is not None:
        write(markdown_path, paired.CAPTION + "\n\n" + paired.markdown(result), force, "the paired table")
    if csv_path is not None:
        write(csv_path, paired.csv_text(result).rstrip("\n"), force, "the paired differences")
