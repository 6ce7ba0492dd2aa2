"""Command line: ``rulegraph explain | audit | check | rules | methods | evaluate | export``.

Errors in what the user gave (files, rule files, inputs, options) print one line
and exit 2; ``check`` exits 1 when a node has no rule and the rule set says
``on_unmatched: error``; ``audit`` exits 1 when conservation is flagged. Set
``RULEGRAPH_DEBUG=1`` to see tracebacks.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import click
import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..errors import InputError, RulegraphError
from ..explain import Explanation, explain, prepared
from ..ir import Graph
from ..loaders import load
from ..methods import explain_with
from ..ruleset import RuleSet, shipped_rule_sets
from ..text import Encoded, TextEncoder
from . import render
from .decomposition import decomposition_options, pass_arguments, reconstruction_table

# piped output (logs, CI) gets room for the tables instead of the default 80 columns
out = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)

DTYPES = {"float32": torch.float32, "float64": torch.float64}


# -- shared options --------------------------------------------------------------------------

class OutputPath(click.ParamType):
    """A file to write (``-``: standard output); an empty value is refused, not read as ``.``."""

    name = "path"

    def convert(self, value, param, ctx):
        if isinstance(value, Path):
            return value
        if not str(value).strip():
            raise InputError(f"{param.opts[0] if param else 'the output'} is an empty path; give a file name, "
                             "or '-' for standard output")
        return Path(value)


OUTPUT = OutputPath()


def model_argument(f):
    return click.argument("model", type=click.Path(dir_okay=True, path_type=Path))(f)


def rules_option(f):
    names = ", ".join(sorted(shipped_rule_sets(None)))
    return click.option("--rules", "-r", required=True, metavar="NAME|PATH",
                        help=f"a shipped rule set ({names}) or a YAML rule file")(f)


def method_options(f):
    """``explain``: a rule set (--rules) or any method (--method: baselines too), with -o options."""
    names = ", ".join(sorted(shipped_rule_sets(None)))
    for decorator in reversed([
        click.option("--rules", "-r", metavar="NAME|PATH", help=f"a shipped rule set ({names}) or a YAML rule file"),
        click.option("--method", "-m", metavar="NAME",
                     help="instead of --rules: any method of `rulegraph methods` — a rule set, or a baseline "
                          "(random, gs, ig, loo, attention, rollout)"),
        click.option("--option", "-o", "method_option", multiple=True, metavar="KEY=VALUE",
                     help="an option of the --method, e.g. -o steps=50 for ig (repeatable)"),
    ]):
        f = decorator(f)
    return f


def input_options(f):
    for decorator in reversed([
        click.option("--text", "-t", "texts", multiple=True, metavar="TEXT",
                     help="text to explain (repeatable; each is explained on its own)"),
        click.option("--tokenizer", type=click.Path(exists=False, path_type=Path), metavar="PATH",
                     help="tokenizer.json (default: the one next to the model)"),
        click.option("--input", "-i", "raw_inputs", multiple=True, metavar="NAME=V1,V2,…|NAME=FILE.npy",
                     help="a model input as comma-separated values (one row) or a .npy file (repeatable)"),
        click.option("--target", type=int, default=None, help="class index to explain (default: the argmax)"),
        click.option("--position", type=int, default=None,
                     help="for [batch, positions, classes] outputs: the position explained (default: last)"),
        click.option("--output", "output_name", default=None, help="graph output to explain (default: the first)"),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True),
        click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="float32", show_default=True),
    ]):
        f = decorator(f)
    return f


def image_options(f):
    """``explain --image``: preprocessing (see rulegraph.image) and the heatmap PNG."""
    from ..image import IMAGENET_MEAN, IMAGENET_STD
    floats = click.Tuple([float, float, float])
    for decorator in reversed([
        click.option("--image", "image_path", type=click.Path(path_type=Path), metavar="PATH",
                     help="an image for a vision model: resized, center-cropped, normalised (see --size, --mean)"),
        click.option("--png", "png_path", type=OUTPUT, metavar="OUT",
                     help="write the pixel heatmap as a PNG (default with --image and --html: beside the page)"),
        click.option("--size", "image_size", type=int, default=224, show_default=True, help="center-crop size"),
        click.option("--resize", "image_resize", type=int, default=256, show_default=True,
                     help="shorter side before the crop"),
        click.option("--mean", "image_mean", type=floats, default=IMAGENET_MEAN, show_default=True,
                     help="per-channel mean subtracted (R G B)"),
        click.option("--std", "image_std", type=floats, default=IMAGENET_STD, show_default=True,
                     help="per-channel std divided by (R G B)"),
    ]):
        f = decorator(f)
    return f


def _load_model(path: Path) -> Graph:
    with err.status(f"loading {path}…"):
        return load(path)


def _parse_inputs(graph: Graph, raw: tuple[str, ...]) -> dict[str, torch.Tensor]:
    infos = {i.name: i for i in graph.inputs}
    feeds = {}
    for item in raw:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(f"--input {item!r} must look like NAME=1,2,3 or NAME=file.npy")
        if name not in infos:
            raise InputError(f"--input {name}: the model has no such input; inputs: "
                             f"{', '.join(i.describe() for i in graph.inputs)}")
        info = infos[name]
        if value.endswith(".npy"):
            feeds[name] = _npy(name, Path(value))
            continue
        try:
            numbers = [float(v) if info.is_float else int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            kind = "numbers" if info.is_float else "integers"
            raise InputError(f"--input {name}: expected comma-separated {kind}, got {value!r}") from None
        if not numbers:
            raise InputError(f"--input {name} is empty")
        feeds[name] = torch.tensor([numbers], dtype=info.dtype)
    return feeds


def _npy(name: str, path: Path) -> torch.Tensor:
    """An input from a ``.npy`` file (plain arrays only: pickled objects are refused)."""
    import numpy as np
    if not path.is_file():
        raise InputError(f"--input {name}: {'not a file' if path.exists() else 'file not found'}: {path}")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"--input {name}: {path} is not a readable .npy array ({str(exc).splitlines()[0]})") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        raise InputError(f"--input {name}: {path} holds {getattr(array, 'dtype', type(array).__name__)} values; "
                         "give numbers (bool, int or float)")
    return torch.from_numpy(np.ascontiguousarray(array))


def _texts(texts: tuple[str, ...]) -> tuple[str, ...]:
    """The --text values, refused when the shell handed over bytes that are not UTF-8."""
    for t in texts:
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError("--text is not valid UTF-8 (check the terminal's or the file's encoding)") from None
    return texts


def _requests(graph: Graph, model: Path, texts, tokenizer, raw_inputs) -> list[tuple[dict, Encoded | None]]:
    """The explanations asked for: one per --text, or one from --input values."""
    extra = _parse_inputs(graph, raw_inputs)
    texts = _texts(texts)
    if texts:
        encoder = TextEncoder.for_model(graph, model, tokenizer)
        return [(encoder.fill(graph, enc, extra), enc) for enc in (encoder.encode(t) for t in texts)]
    if not extra:
        raise InputError("give --text \"…\" (with a tokenizer) or --input NAME=… for each model input")
    if "attention_mask" in (i.name for i in graph.inputs) and "attention_mask" not in extra and "input_ids" in extra:
        extra["attention_mask"] = torch.ones_like(extra["input_ids"])
    if "token_type_ids" in (i.name for i in graph.inputs) and "token_type_ids" not in extra and "input_ids" in extra:
        extra["token_type_ids"] = torch.zeros_like(extra["input_ids"])
    return [(extra, None)]


def _run(graph, ruleset, requests, opts, method=None) -> list[tuple[Explanation, Encoded | None]]:
    results = []
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                        console=err, transient=True, disable=len(requests) < 2)
    with progress:
        task = progress.add_task("explaining", total=len(requests))
        for feeds, enc in requests:
            if method is not None:  # (name, options, vocab): a method of rulegraph.methods
                special = torch.tensor([enc.special]) if enc is not None else None
                e = explain_with(graph, method[0], feeds, opts["target"], output=opts["output_name"],
                                 position=opts["position"], device=opts["device"], dtype=DTYPES[opts["dtype"]],
                                 special=special, vocab=method[2], **method[1])
            else:
                e = explain(graph, ruleset, feeds, opts["target"], output=opts["output_name"],
                            position=opts["position"], device=opts["device"], dtype=DTYPES[opts["dtype"]],
                            **pass_arguments(ruleset, opts, enc))
            if enc is not None:
                e.tokens = [enc.tokens]
                e.extra["text"] = enc.text
            results.append((e, enc))
            progress.advance(task)
    return results


def check_output(path: Path | None, force: bool, option: str) -> None:
    """Refuse, before any work, an output path that cannot be written: empty, a directory, not a
    regular file, an existing file without ``--force``, or in a folder that is not writable."""
    if path is None or str(path) == "-":
        return
    if not str(path).strip():
        raise InputError(f"{option} is an empty path; give a file name, or '-' for standard output")
    if path.is_dir():
        raise InputError(f"{option} {path} is a directory; give a file name inside it")
    if path.exists() and not path.is_file():
        raise InputError(f"{option} {path} is not a regular file (a device or a pipe); give a file name")
    if path.exists() and not force:
        raise InputError(f"{option} {path} exists; pass --force to overwrite it")
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or \
            (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{option} {path}: cannot write there (permission denied in {folder})")


def _write(path: Path, content: str, force: bool, what: str) -> None:
    """Write ``content`` whole or not at all (a temporary file beside it, then a rename)."""
    if str(path) == "-":
        click.echo(content)
        return
    check_output(path, force, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.rulegraph-partial")
    try:
        staged.write_text(content)
        os.replace(staged, path)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise InputError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    err.print(f"[dim]wrote {what} to {escape(str(path))}[/]")


def _json(results: list[tuple[Explanation, Any]]) -> str:
    docs = [e.to_dict() for e, _ in results]
    return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2)


# -- commands ----------------------------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="rulegraph")
def cli():
    """Explain exported networks with declarative propagation rules, and audit conservation
    layer by layer."""


@cli.command("explain")
@model_argument
@method_options
@input_options
@decomposition_options
@click.option("--json", "json_path", type=OUTPUT, help="write the explanation as JSON ('-': stdout)")
@click.option("--html", "html_path", type=OUTPUT, help="write a self-contained heatmap page")
@click.option("--force", is_flag=True, help="overwrite existing --json/--html/--png files")
@image_options
def explain_cmd(model, rules, method, method_option, texts, tokenizer, raw_inputs, json_path, html_path, force,
                image_path, png_path, image_size, image_resize, image_mean, image_std, **opts):
    """Relevance of each input token for MODEL's output, with the conservation summary.
    Give a rule set with --rules, or any method (baselines too) with --method."""
    if bool(rules) == bool(method):
        raise InputError("give --rules NAME|PATH or --method NAME (see `rulegraph methods`), not both"
                         if rules else "give --rules NAME|PATH or --method NAME (see `rulegraph methods`)")
    if method_option and not method:
        raise InputError("-o/--option sets options of a --method; rule sets take none")
    graph = _load_model(model)
    chosen = None
    if method:
        from ..methods import Vocab, get
        from .evaluate import parse_options
        m = get(method)
        options = m.resolve(parse_options(method_option, [m.name]).get(m.name, {}))
        vocab = None
        if texts or tokenizer:
            vocab = Vocab.from_tokenizer(TextEncoder.for_model(graph, model, tokenizer).tokenizer)
        chosen = (m, options, vocab)
        ruleset = None
    else:
        ruleset = RuleSet.load(rules)
    if png_path is None and image_path is not None and html_path is not None and str(html_path) != "-":
        png_path = html_path.with_suffix(".png")      # the heatmap beside the page
    for path, option in ((json_path, "--json"), (html_path, "--html"), (png_path, "--png")):
        check_output(path, force, option)
    if image_path is not None:
        from ..image import load_image
        pixels = next((i.name for i in graph.inputs if i.is_float), None)
        if pixels is None or texts:
            raise InputError("--image needs a model with a float (pixel) input, and no --text")
        pre = dict(size=image_size, resize=image_resize, mean=image_mean, std=image_std)
        requests = [({**_parse_inputs(graph, raw_inputs), pixels: load_image(image_path, **pre)}, None)]
    else:
        requests = _requests(graph, model, texts, tokenizer, raw_inputs)
    if png_path is not None and image_path is None:
        raise InputError("--png writes an image heatmap: give --image PATH")
    results = _run(graph, ruleset, requests, opts, chosen)
    if png_path is not None:
        from ..image import write_heatmap
        e = results[0][0]
        write_heatmap(e.boundary[pixels], png_path, image=requests[0][0][pixels], mean=image_mean, std=image_std,
                      title=f"{e.rules}: {e.output}[{e.target[0]}]")
        err.print(f"[dim]wrote heatmap to {escape(str(png_path))}[/]")
    quiet = json_path is not None and str(json_path) == "-"
    for i, (e, enc) in enumerate(results):
        if quiet:
            break
        if image_path is not None:
            out.print(render.summary_table(e))
            continue
        if len(results) > 1:
            out.rule(f"{i + 1}/{len(results)}")
        key = next(iter(e.relevance))
        tokens = enc.tokens if enc else [str(k) for k in range(len(e.scores(key)))]
        out.print(render.heatmap_text(tokens, e.scores(key), enc.special if enc else None))
        out.print(render.top_tokens(tokens, e.scores(key), enc.special if enc else None))
        note = render.mass_note(tokens, e.scores(key), enc.special if enc else None)
        if note:
            out.print(Text(note, style="yellow"))
        out.print(render.summary_table(e))
    if json_path is not None:
        _write(json_path, _json(results), force, "JSON")
    if html_path is not None:
        page = render.html_report([(e, enc.tokens if enc else None, enc.special if enc else None,
                                    enc.text if enc else None) for e, enc in results], str(model))
        _write(html_path, page, force, "HTML")


@cli.command("audit")
@model_argument
@rules_option
@input_options
@decomposition_options
@click.option("--json", "json_path", type=OUTPUT, help="write the audit as JSON ('-': stdout)")
@click.option("--top", type=click.IntRange(min=0), default=25, show_default=True,
              help="nodes to list (largest absorbed/breaks/errors)")
@click.option("--all", "all_nodes", is_flag=True, help="list every node")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def audit_cmd(model, rules, texts, tokenizer, raw_inputs, json_path, top, all_nodes, force, **opts):
    """Per-layer and per-node conservation table. Exits 1 if conservation is flagged."""
    check_output(json_path, force, "--json")
    graph = _load_model(model)
    ruleset = RuleSet.load(rules)
    results = _run(graph, ruleset, _requests(graph, model, texts, tokenizer, raw_inputs), opts)
    flagged = False
    docs = []
    for e, enc in results:
        a = e.audit
        flagged |= not a.ok or bool(a.unexpected)
        if json_path is not None:
            d = e.to_dict()
            d["nodes"] = [vars(n) for n in a.nodes]
            docs.append(d)
        if json_path is not None and str(json_path) == "-":
            continue
        if enc is not None:
            out.rule(escape(enc.text[:80]))
        out.print(render.summary_table(e))
        out.print(reconstruction_table(a) if hasattr(a, "reconstruction") else render.layers_table(a))
        out.print(render.nodes_table(a, None if all_nodes else top))
    if json_path is not None:
        _write(json_path, json.dumps(docs[0] if len(docs) == 1 else docs, indent=2), force, "audit")
    if flagged:
        err.print("[red]conservation flagged[/]: residual or a conserving node exceeds the tolerance")
        sys.exit(1)


@cli.command("check")
@model_argument
@rules_option
@click.option("--nodes", "show_nodes", is_flag=True, help="list every node with its rule")
def check_cmd(model, rules, show_nodes):
    """Which rule each node got, and from which rule-file line. Exits 1 on unmatched nodes
    when the rule set says `on_unmatched: error`."""
    graph, ruleset = prepared(_load_model(model), rules)
    binding = ruleset.bind(graph)
    if show_nodes:
        t = Table(title=f"rule per node ({len(binding.reached)} reached by relevance)")
        for col in ("node", "op", "layer", "rule", "from"):
            t.add_column(col, overflow="fold")
        for n in binding.reached:
            a = binding.assignments.get(n.name)
            t.add_row(n.name, n.op, graph.layers[n.name], a.rule.describe() if a else "[red]unmatched[/]",
                      a.where if a else "")
        out.print(t)
    else:
        counts = Counter((n.op, binding.assignments[n.name].rule.describe(), binding.assignments[n.name].where)
                         for n in binding.reached if n.name in binding.assignments)
        t = Table(title=f"{graph.name or model}: {len(binding.reached)} of {len(graph.nodes)} nodes reached by "
                        f"relevance, boundary: {', '.join(sorted(set(binding.boundary.values())))}")
        for col in ("op", "rule", "from", "nodes"):
            t.add_column(col, justify="right" if col == "nodes" else "left")
        for (op, rule, where), k in sorted(counts.items(), key=lambda kv: kv[0][2]):
            t.add_row(op, rule, where, str(k))
        out.print(t)
    if binding.unmatched:
        out.print(f"[red]{len(binding.unmatched)} node(s) without a rule[/] (on_unmatched: {ruleset.on_unmatched}):")
        for n in binding.unmatched[:50]:
            out.print(f"  {n.name}  [dim]({n.op})[/]")
        if ruleset.on_unmatched == "error":
            sys.exit(1)
    else:
        out.print("[green]every node relevance reaches has a rule[/]")


@cli.command("rules")
@click.argument("name", required=False)
def rules_cmd(name):
    """List the shipped rule sets, or print one."""
    shipped = shipped_rule_sets(None)
    if name:
        rs = RuleSet.load(name)
        path = shipped.get(name, Path(name))
        out.print(path.read_text() if path.exists() else rs)
        return
    t = Table(title="shipped rule sets (rulegraph rules NAME prints one)")
    t.add_column("name")
    t.add_column("description", overflow="fold")
    for key in sorted(shipped):
        t.add_row(key, RuleSet.load(key).description)
    out.print(t)


@cli.command("export")
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["onnx", "fx"]), default="onnx", show_default=True,
              help="onnx: OUT_DIR/model.onnx; fx: a torch.export program saved as OUT_DIR/model.pt2")
@click.option("--exporter", type=click.Choice(["torchscript", "dynamo"]), default="torchscript", show_default=True,
              help="ONNX exporter")
@click.option("--opset", type=int, default=18, show_default=True)
@click.option("--attention", type=click.Choice(["eager", "sdpa"]), default="eager", show_default=True,
              help="attention implementation to export (eager gives an explicit Softmax → MatMul)")
@click.option("--force", is_flag=True, help="overwrite an existing export")
def export_cmd(source, out_dir, fmt, exporter, opset, attention, force):
    """Export a Hugging Face model directory SOURCE to OUT_DIR/model.onnx or model.pt2 (+ tokenizer.json)."""
    from ..exporters import export_hf, save_hf_fx
    from ..exporters.to_onnx import check_exporter_options
    try:
        check_exporter_options(exporter, opset)
    except ValueError as exc:
        raise InputError(f"--opset/--exporter: {exc}") from None
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"OUT_DIR {out_dir} is a file; give a folder")
    made = not out_dir.exists()
    with err.status(f"exporting {source} ({fmt}{', ' + exporter + ' exporter' if fmt == 'onnx' else ''})…"):
        try:
            if fmt == "fx":
                path = save_hf_fx(source, out_dir, attention=attention, overwrite=force)
            else:
                path = export_hf(source, out_dir, exporter=exporter, attention=attention, opset=opset, overwrite=force)
        except FileExistsError as exc:
            raise InputError(f"{exc.filename or str(exc).split(' already')[0]} already exists; pass --force to "
                             "overwrite it") from None
        except (ValueError, FileNotFoundError) as exc:
            raise InputError(str(exc)) from None
        finally:
            if made and out_dir.is_dir() and not any(out_dir.iterdir()):
                out_dir.rmdir()           # leave no empty folder behind a failed export
    out.print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")


def _register_commands() -> None:
    from .evaluate import evaluate_cmd
    from .methods import methods_cmd
    cli.add_command(evaluate_cmd)
    cli.add_command(methods_cmd)


_register_commands()


# -- entry point --------------------------------------------------------------------------------

def _show_warning(message, category, filename, lineno, file=None, line=None):
    err.print(f"[yellow]warning:[/] {escape(str(message))}", soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    debug = bool(os.environ.get("RULEGRAPH_DEBUG"))
    try:
        cli.main(args=argv, prog_name="rulegraph", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        err.print("aborted")
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except RulegraphError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    except Exception as exc:  # a defect: still one line, with a way to see more
        if debug:
            raise
        err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} "
                  "(set RULEGRAPH_DEBUG=1 for the traceback)", soft_wrap=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
