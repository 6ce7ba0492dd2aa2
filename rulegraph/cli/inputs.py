"""What the explain, audit and check commands share: reading the model and the inputs,
running the explanations with a progress bar, and writing outputs whole."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import torch
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from .. import files
from ..api import explain
from ..errors import InputError
from ..explanation import Explanation
from ..ir import Graph
from ..loaders import load
from ..methods import explain_with
from ..objective import parse as parse_objective
from ..text import Encoded, TextEncoder
from .console import err
from .options import pass_arguments


def load_model(path: Path) -> Graph:
    with err.status(f"loading {path}…"):
        return load(path)


def parse_inputs(graph: Graph, raw: tuple[str, ...]) -> dict[str, torch.Tensor]:
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


def requests_of(graph: Graph, model: Path, texts, tokenizer, raw_inputs,
                question: str | None = None) -> list[tuple[dict, Encoded | None]]:
    """The explanations asked for: one per --text (after the --question, for span QA), or one from
    --input values."""
    extra = parse_inputs(graph, raw_inputs)
    texts = _texts(texts)
    if question is not None and not texts:
        raise InputError("--question is encoded before a --text (the context); give --text too")
    if texts:
        encoder = TextEncoder.for_model(graph, model, tokenizer)
        return [(encoder.fill(graph, enc, extra), enc) for enc in (encoder.encode(t, question) for t in texts)]
    if not extra:
        raise InputError("give --text \"…\" (with a tokenizer) or --input NAME=… for each model input")
    if "attention_mask" in (i.name for i in graph.inputs) and "attention_mask" not in extra and "input_ids" in extra:
        extra["attention_mask"] = torch.ones_like(extra["input_ids"])
    if "token_type_ids" in (i.name for i in graph.inputs) and "token_type_ids" not in extra and "input_ids" in extra:
        extra["token_type_ids"] = torch.zeros_like(extra["input_ids"])
    return [(extra, None)]


def resolve_targets(graph: Graph, model: Path, tokenizer, opts: dict[str, Any]) -> dict[str, Any]:
    """``--target`` / ``--contrast`` given as text: a class label the export records
    (``rulegraph.labels``), else the id of the one token it tokenizes to (with the model's
    tokenizer, no special tokens added; see :meth:`TextEncoder.token_id`) — only for an output
    indexed by the vocabulary (a language model's): text given to a classifier or a span-QA
    output is refused, never read as a class or position index. ``--objective`` is parsed, its
    token texts resolved the same way."""
    from ..passes.base import labels
    opts = dict(opts)
    if opts.get("objective") is not None:
        opts["objective"] = parse_objective(opts["objective"])
    names = labels(graph) or []
    for option in ("target", "contrast"):
        if isinstance(opts.get(option), str) and opts[option] in names:
            opts[option] = names.index(opts[option])
    texts = {o: opts.get(o) for o in ("target", "contrast") if isinstance(opts.get(o), str)}
    if opts.get("objective") is not None and any(isinstance(t, str) for t in opts["objective"].tokens):
        texts["objective"] = next(t for t in opts["objective"].tokens if isinstance(t, str))
    if not texts:
        return opts
    try:
        encoder = TextEncoder.for_model(graph, model, tokenizer)
    except InputError as exc:
        raise InputError(f"--{next(iter(texts))} {next(iter(texts.values()))!r} is text, which needs the model's "
                         f"tokenizer ({exc}); or give a token id") from None
    for option in texts:
        if option == "objective":
            opts[option] = opts[option].resolve(lambda text: encoder.token_id(text, "--objective token"))
        else:
            opts[option] = encoder.token_id(opts[option], f"--{option}")
    _refuse_text_for_indices(graph, opts.get("output_name"), texts, names)
    return opts


def _refuse_text_for_indices(graph: Graph, output: str | None, texts: dict[str, str], names: list[str]) -> None:
    """A token's text names a token id: refuse it where the explained output is not indexed by the
    vocabulary (a classifier's classes, a span-QA output's positions), found by one forward on a
    small dummy input (nothing is refused when that forward cannot run)."""
    from ..errors import RulegraphError
    from ..heads import dummy_inputs
    from ..interpreter import prepare
    output = output or graph.outputs[0]
    feeds = dummy_inputs(graph, length=7)
    try:
        plan = prepare(graph)
        with torch.no_grad():
            out = plan.run(feeds, keep=frozenset())[output]
    except (RulegraphError, KeyError):
        return
    vocabulary = max((rows for rows, _ in plan.limits.ids.values()), default=None)    # the largest table
    if out.dim() >= 2 and out.shape[-1] == vocabulary:
        return
    option, text = next(iter(texts.items()))
    positions = out.dim() == 2 and any(f.dim() == 2 and f.shape[1] == out.shape[-1] for f in feeds.values())
    valid = "a position index" if positions else f"a class index (0…{out.shape[-1] - 1})"
    valid += f" or a label ({', '.join(names)})" if names else ""
    raise InputError(f"--{option} {text!r} is text, but output {output!r} is not indexed by the vocabulary (it scores "
                     f"{'positions' if positions else f'{out.shape[-1]} classes'}); give {valid}")


def dummy_forward(graph: Graph) -> bool:
    """``check``: one forward on a small dummy input (:func:`rulegraph.heads.dummy_inputs`), which
    finds an op asking for a tensor over the budget (``explain`` would stop there); returns whether
    it did. Another failure is only a note: the dummy input may not be one the model accepts."""
    from ..errors import LimitError, RulegraphError
    from ..heads import dummy_inputs
    from ..interpreter import prepare
    try:
        with torch.no_grad():
            prepare(graph).run(dummy_inputs(graph), keep=frozenset())
    except LimitError as exc:
        err.print(f"[red]the forward cannot run[/]: {escape(str(exc))}", soft_wrap=True)
        return True
    except RulegraphError as exc:
        err.print(f"[yellow]a forward on a dummy input failed[/] (explain's inputs may still run): "
                  f"{escape(str(exc))}", soft_wrap=True)
    return False


def run_all(graph, ruleset, requests, opts, method=None) -> list[tuple[Explanation, Encoded | None]]:
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
                                 position=opts["position"], device=opts["device"], dtype=getattr(torch, opts["dtype"]),
                                 special=special, vocab=method[2],
                                 **{("target_score" if k == "score" else k): v for k, v in _targets(opts).items()},
                                 **method[1])
            else:
                e = explain(graph, ruleset, feeds, opts["target"], output=opts["output_name"],
                            position=opts["position"], device=opts["device"], dtype=getattr(torch, opts["dtype"]),
                            **_targets(opts), **pass_arguments(ruleset, opts, enc))
            if enc is not None:
                e.tokens = [enc.tokens]
                e.extra["text"] = enc.text
            results.append((e, enc))
            progress.advance(task)
    return results


def _targets(opts: dict[str, Any]) -> dict[str, Any]:
    """``contrast``, ``score`` and ``objective`` for the explain call, only when asked for."""
    given = {"contrast": opts.get("contrast"), "score": opts.get("score") or "logit"}
    given = {} if given == {"contrast": None, "score": "logit"} else given
    return given if opts.get("objective") is None else {**given, "objective": opts["objective"]}


def read_files(model: Path, tokenizer=None, rules=None, raw_inputs: tuple[str, ...] = (), *more) -> list[str]:
    """The files a command reads (the model, its tokenizer, a rule file, ``--input`` arrays, an
    image…): an output is never written over one of them."""
    files_ = [model, tokenizer or Path(model).parent / "tokenizer.json", rules, *more]
    files_ += [item.partition("=")[2] for item in raw_inputs if item.endswith(".npy")]
    return [str(f) for f in files_ if f]


def check_output(path: Path | None, force: bool, option: str, inputs=()) -> None:
    """Refuse, before any work, an output path that cannot or must not be written: empty, a
    symbolic link, a directory, not a regular file, an existing file without ``--force``, one of
    the ``inputs`` this run reads (even with ``--force``), in a folder that is not writable
    (:func:`rulegraph.files.check_output`)."""
    files.check_output(path, force, option, inputs)


def write(path: Path, content: str, force: bool, what: str, inputs=()) -> None:
    """Write ``content`` whole or not at all, never through a link (:func:`rulegraph.files.write_file`)."""
    if str(path) == "-":
        click.echo(content)
        return
    check_output(path, force, what, inputs)
    files.write_file(path, content, what)
    err.print(f"[dim]wrote {what} to {escape(str(path))}[/]")


def to_json(results: list[tuple[Explanation, Any]]) -> str:
    docs = [e.to_dict() for e, _ in results]
    return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2)
