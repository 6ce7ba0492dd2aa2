"""``rulegraph heads calibrate``: which attention heads are positional / syntactic (Mask-LRP's head mask)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import InputError
from .console import err, out
from .options import OUTPUT, PNG, Bounded, model_argument


@click.group("heads")
def heads_cmd():
    """Attention heads: calibrate Mask-LRP's head mask from a dataset."""


@heads_cmd.command("calibrate")
@model_argument
@click.option("--data", "data", required=True, type=click.Path(path_type=Path), metavar="FILE.csv",
              help="CSV with a `text` column (other columns are ignored)")
@click.option("--n", "n", type=Bounded(int, 1), default=500, show_default=True,
              help="use the first N texts of the file (≥ 1)")
@click.option("--out", "out_path", type=OUTPUT, default=Path("masks.yaml"), show_default=True,
              help="the mask file to write (YAML; name it in mask-lrp's `masks:` param)")
@click.option("--png", "png_path", type=PNG, default=None,
              help="also draw blocks × heads: positional / syntactic / neither (NAME: NAME.png)")
@click.option("--tokenizer", type=click.Path(path_type=Path), metavar="PATH",
              help="tokenizer.json (default: the one next to the model)")
@click.option("--xi-pos", type=Bounded(float, 0, 1), default=0.8, show_default=True,
              help="ξ_pos of Eq. 8: the share of tokens a positional head attends at one offset (0…1)")
@click.option("--xi-synt", type=Bounded(float, 0, 1), default=0.1, show_default=True,
              help="ξ_synt of Eq. 7: the margin over max(λ_k) a syntactic head needs (0…1)")
@click.option("--no-syntax", is_flag=True, help="positional heads only, even where spaCy is installed")
@click.option("--force", is_flag=True, help="overwrite --out / --png")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def calibrate_cmd(model, data, n, out_path, png_path, tokenizer, xi_pos, xi_synt, no_syntax, force, quiet):
    """Find MODEL's positional heads (argmax attention at one relative position for > ξ_pos of the
    tokens, Song et al. 2024 Eq. 8) and syntactic heads (nsubj, dobj, amod, advmod hit more often
    than max(λ_k) + ξ_synt, Eq. 7; needs `pip install 'rulegraph[heads]'`) over the texts of --data;
    write the mask file (--out) and the picture (--png)."""
    from ..calibrate import calibrate, header, load_parser, plot
    from ..scale.data import read_rows
    from ..heads import mask_text
    from ..text import TextEncoder
    from ..files import write_file
    from .inputs import check_outputs, load_model, read_files
    if not Path(data).is_file():
        raise InputError(f"data file not found: {data}" if not Path(data).exists() else
                         f"--data {data} is not a file; give a CSV, JSON lines or Parquet file")
    reads = read_files(model, tokenizer, None, (), data)
    check_outputs([(out_path, "--out"), (png_path, "--png")], force, reads)
    graph = load_model(model)
    encoder = TextEncoder.for_model(graph, model, tokenizer)
    rows = [r for r in read_rows(Path(data), None, n) if not r.problem]
    parser, syntax = (None, "--no-syntax given") if no_syntax else load_parser()
    if parser is None:
        err.print(f"[yellow]positional heads only[/]: {escape(syntax)}; syntactic heads are not computed")
    with Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=quiet, transient=True) as bar:
        task = bar.add_task("texts", total=len(rows))
        cal = calibrate(graph, encoder, [r.text for r in rows], parser=parser, syntax=syntax, xi_pos=xi_pos,
                        xi_synt=xi_synt, progress=lambda k: bar.advance(task, k))
    text = mask_text(cal.types, **header(cal, str(model), str(data), xi_pos, xi_synt))
    if str(out_path) == "-":
        click.echo(text)
    else:
        write_file(out_path, text, "the mask file")
    t = Table(title=f"{cal.texts} texts, {cal.tokens} tokens, {cal.seconds:.1f} s")
    t.add_column("block", justify="right")
    t.add_column("heads")
    for b in cal.blocks:
        marks = {"positional": "[blue]P[/]", "syntactic": "[dark_orange]S[/]", "none": "[dim]·[/]"}
        t.add_row(str(b.block), " ".join(marks[k] for k in cal.types[b.block]))
    out.print(t)
    total = sum(b.heads for b in cal.blocks)
    synt = f"{cal.count('syntactic')} syntactic" if cal.syntactic is not None else "syntactic not computed"
    out.print(f"{cal.count('positional')} positional, {synt}, "
              f"{total - cal.count('positional') - cal.count('syntactic')} neither, of {total} heads "
              f"(mask rate {(cal.count('positional') + cal.count('syntactic')) / total:.3f})")
    if parser is None:
        out.print(f"[yellow]positional heads only[/] ({escape(syntax)})")
    if png_path is not None:
        plot(cal, png_path)
    err.print(f"[dim]wrote {escape(str(out_path))}{', ' + escape(str(png_path)) if png_path else ''}[/]")
