"""``rulegraph explain-dataset``: one method over every record of a data file, on an engine."""
from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ..errors import InputError
from .console import err, out
from .evaluate import TerminalListener, parse_options
from .options import DTYPES, Bounded, check_folder, engine_options, make_engine, method_options, model_argument

TARGETS = ("predicted", "label")


@click.command("explain-dataset")
@model_argument
@method_options
@click.option("--data", "data", required=True, type=click.Path(path_type=Path), metavar="FILE",
              help="CSV, JSON lines (.jsonl) or Parquet with a `text` column (and optionally `label`)")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="folder for explanations.parquet, summary.json and rows.jsonl (the journal a re-run resumes from)")
@click.option("--tokenizer", type=click.Path(path_type=Path), metavar="PATH",
              help="tokenizer.json (default: the one next to the model)")
@click.option("--target", type=click.Choice(TARGETS), default="predicted", show_default=True,
              help="the class explained: the predicted one, or the record's `label`")
@click.option("--n", "n", type=Bounded(int, 1), default=None, help="the first N records (default: all; ≥ 1)")
@click.option("--batch", type=Bounded(int, 1, 65536), default=16, show_default=True,
              help="examples explained together, bucketed by length (1…65536)")
@click.option("--batch-tokens", type=Bounded(int, 1, 2**24), default=8192, show_default=True,
              help="padded tokens per forward batch (1…2²⁴)")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--seed", type=Bounded(int, 0, 2**32 - 1), default=0, show_default=True,
              help="seed of seeded methods (random, mask-lrp-random)")
@click.option("--threads", type=Bounded(int, 1, 1024), default=None,
              help="torch CPU threads of the local engine (default: torch's choice; 1…1024)")
@click.option("--at", "at", multiple=True, metavar="SELECTOR",
              help="each row's relevance per unit (heads, neurons, channels) at the values a selector picks, e.g. "
                   "'every attention output' (docs/inside.md); repeatable; rule sets only")
@click.option("--top", type=Bounded(int, 1, 100000), default=None, metavar="K",
              help="with --at: the K units carrying the most |relevance| over the data set, to OUT/top-units.json "
                   "and a table")
@engine_options
@click.option("--force", is_flag=True, help="discard what --out holds and start over")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def explain_dataset_cmd(model, rules, method, method_option, data, out_dir, tokenizer, target, n, batch, batch_tokens,
                        device, dtype, seed, threads, at, top, engine_name, address, num_workers, cpus_per_worker,
                        gpus_per_worker, force, quiet):
    """Explain every record of --data with a rule set (--rules) or any method (--method), and write
    one row per record to OUT/explanations.parquet: tokens, per-token relevance, target, output
    value, conservation figures, and the error of a record that could not be explained.

    Resumable: a re-run with the same settings continues from OUT/rows.jsonl. With --engine ray
    the records run on Ray workers (one loaded model each); the rows are the same."""
    if bool(rules) == bool(method):
        raise InputError("give --rules NAME|PATH or --method NAME (see `rulegraph methods`), not both"
                         if rules else "give --rules NAME|PATH or --method NAME (see `rulegraph methods`)")
    if method_option and not method:
        raise InputError("-o/--option sets options of a --method; rule sets take none")
    if not Path(data).is_file():
        raise InputError(f"data file not found: {data}" if not Path(data).is_dir()
                         else f"--data {data} is a directory; give a CSV, JSON lines or Parquet file")
    check_folder(Path(out_dir), "--out")
    name = method or rules
    from ..methods import get
    options = parse_options(method_option, [get(name).name]).get(get(name).name, {}) if method_option else {}
    engine = make_engine(engine_name, address, num_workers, cpus_per_worker, gpus_per_worker)
    import torch
    from ..scale.explain import DatasetConfig, explain_dataset
    if threads:
        torch.set_num_threads(threads)
    config = DatasetConfig(model=str(model), data=str(data), method=name, options=options,
                           tokenizer=str(tokenizer) if tokenizer else None, target=target, n=n, device=device,
                           dtype=dtype, seed=seed, batch=batch, batch_tokens=batch_tokens, at=list(at), top=top)
    summary = explain_dataset(config, out_dir, engine=engine, force=force, listener=TerminalListener(err),
                              progress=not quiet)
    rate = summary["examples_per_second"]
    out.print(f"{summary['rows']} rows: {summary['explained']} explained, {summary['failed']} failed "
              f"({summary['engine']}" + (f", {rate:.1f} examples/s" if rate else ", nothing new to explain") + ")")
    if summary["failed"]:
        err.print(f"[red]first error: {escape(summary['first_error'])}[/]", soft_wrap=True)
    if summary.get("top_units") is not None:
        out.print(_top_table(summary["top_units"]))
    wrote = "explanations.parquet, summary.json, rows.jsonl" + (", top-units.json" if top else "")
    err.print(f"[dim]wrote {out_dir}/{wrote}[/]")


def _top_table(units: list[dict]):
    """The units carrying most relevance over the data set, strongest first."""
    from rich.table import Table
    table = Table(title="units carrying the most relevance (Σ over examples of |R|)")
    for name, justify in (("block", "right"), ("value", "left"), ("unit", "left"), ("Σ |R|", "right"),
                          ("mean R", "right"), ("examples", "right")):
        table.add_column(name, justify=justify)
    for u in units:
        table.add_row("" if u["block"] is None else str(u["block"]), escape(u["value"]), f"{u['kind']} {u['unit']}",
                      f"{u['carried']:.4g}", f"{u['mean']:+.4g}", str(u["examples"]))
    return table
