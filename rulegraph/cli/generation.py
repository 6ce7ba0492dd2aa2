"""``rulegraph explain MODEL --generate N --text PROMPT`` (or ``--continuation TEXT``): explain every
generated token of a language model, decoder-only or encoder–decoder
(:func:`rulegraph.generation.generate`), shown as a matrix (``cli/matrix.py``)."""
from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from ..errors import InputError
from .console import err, out
from .options import Bounded, pass_arguments


def generation_options(f):
    """``--generate N``, ``--continuation TEXT``, ``--batch K`` and ``--span`` of ``explain`` (and the
    deprecated ``--steps``, now ``--continuation`` with ``-i decoder_input_ids=…``)."""
    for decorator in reversed([
        click.option("--generate", "generate_n", type=Bounded(int, 1), default=None, metavar="N",
                     help="a language model (decoder-only or encoder–decoder): generate N tokens greedily after the "
                          "--text prompt (the source) and explain each"),
        click.option("--continuation", default=None, metavar="TEXT",
                     help="a language model: explain each token of this continuation of the --text prompt (the "
                          "target of an encoder–decoder) instead of generating"),
        click.option("--batch", "batch", type=Bounded(int, 1), default=None, metavar="K",
                     help="with --continuation and a rule set: steps explained per forward (default: all, at "
                          "most 256; fewer: less memory; each step has its own walk and audit either way)"),
        click.option("--span", is_flag=True,
                     help="with --generate/--continuation and a rule set: also explain the tokens together, as one "
                          "objective (the sum of their logits, or log-probabilities with --score logprob), in one "
                          "more walk: the matrix's last column, Σ span"),
        click.option("--ignore-eos", is_flag=True,
                     help="with --generate: go on after the end-of-sequence token (default: stop after it)"),
        click.option("--steps", is_flag=True, hidden=True),
    ]):
        f = decorator(f)
    return f


def explain_generation(graph, model, rules, method, options, texts, tokenizer, raw_inputs, steps,
                       continuation, batch, opts, json_path, html_path, png_path, force, ignore_eos=False,
                       span=False, picture=None, clip=None, media=None) -> None:
    """Refuse what does not apply to generation, run it with a progress bar, show and write it (``media``: the
    picture's or the clip's file, which no output may overwrite)."""
    import torch

    from ..generation import generate
    from ..render.figure import generation_figure, save
    from ..render.page import generation_page
    from ..ruleset import RuleSet
    from . import matrix
    from .inputs import check_outputs, parse_inputs, read_files, write
    for option, value in (("--target", opts.get("target")), ("--contrast", opts.get("contrast")),
                          ("--position", opts.get("position")), ("--objective", opts.get("objective")),
                          ("--targets", opts.get("targets"))):
        if value is not None:
            raise InputError(f"{option} does not apply with --generate/--continuation: each step explains the "
                             "token it generated, at its own position")
    if steps is not None and continuation is not None:
        raise InputError("give --generate N or --continuation TEXT, not both")
    if len(texts) > 1:
        raise InputError("--generate/--continuation takes one prompt: give --text once")
    inputs = parse_inputs(graph, raw_inputs) if raw_inputs else {}
    if clip is not None:
        if texts or "input_ids" in inputs:
            raise InputError("a speech-to-text model's source is its clip (--audio): give no --text or input_ids")
    elif bool(texts) == ("input_ids" in inputs):
        raise InputError("give the prompt with --text \"…\" or --input input_ids=1,2,3, not both"
                         if texts else "give the prompt with --text \"…\" (or --input input_ids=1,2,3)")
    if continuation is not None and not continuation.strip():
        raise InputError("--continuation is empty")
    options = {**options, **pass_arguments(RuleSet.load(rules) if rules else None, opts)}
    reads = read_files(model, tokenizer, rules, raw_inputs, media)
    check_outputs([(json_path, "--json"), (html_path, "--html"), (png_path, "--png")], force, reads)
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeRemainingColumn(), console=err,
                        transient=True)
    with progress:
        task = progress.add_task("explaining generated tokens", total=steps or None)
        g = generate(graph, rules or method, text=texts[0] if texts else None, inputs=inputs or None, max_new_tokens=steps,
                     continuation=continuation, tokenizer=tokenizer if tokenizer or texts else None,
                     batch=batch, output=opts["output_name"], device=opts["device"],
                     dtype=getattr(torch, opts["dtype"]), score=opts.get("score") or "logit", ignore_eos=ignore_eos,
                     progress=lambda k: progress.advance(task, k), span=span, image=picture, audio=clip,
                     **options)
    g.extra["model"] = str(model)
    if not (json_path is not None and str(json_path) == "-"):
        if g.continuation is not None:
            out.print(f"[bold]generated[/]: {g.continuation!r}" if g.mode == "greedy"
                      else f"[bold]continuation[/]: {g.continuation!r}")
        out.print(matrix.steps_table(g))
        table = matrix.matrix_table(g)
        if table is not None:
            out.print(table)
    if json_path is not None:
        write(json_path, json.dumps(g.to_dict(), indent=2), force, "JSON", reads)
    if html_path is not None:
        write(html_path, generation_page(g, str(model)), force, "HTML", reads)
    if png_path is not None:
        save(generation_figure(g), png_path)
        err.print(f"[dim]wrote heatmap to {escape(str(png_path))}[/]")
