"""What the explain, audit and check commands share: reading the model and the inputs,
running the explanations with a progress bar, and writing outputs whole."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click
import torch
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from ..api import explain
from ..errors import InputError
from ..explanation import Explanation
from ..ir import Graph
from ..loaders import load
from ..methods import explain_with
from ..objective import parse as parse_objective
from ..passes.base import RUNNER_UP
from ..text import Encoded, TextEncoder
from .console import err
from .decomposition import pass_arguments


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
    """``--target`` / ``--contrast`` given as text: the id of the one token it tokenizes to (with
    the model's tokenizer, no special tokens added; see :meth:`TextEncoder.token_id`); ``--objective``
    parsed, its token texts resolved the same way."""
    opts = dict(opts)
    if opts.get("objective") is not None:
        opts["objective"] = parse_objective(opts["objective"])
    texts = {o: opts.get(o) for o in ("target", "contrast") if isinstance(opts.get(o), str)
             and not (o == "contrast" and opts[o] == RUNNER_UP)}
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
    return opts


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


def write(path: Path, content: str, force: bool, what: str) -> None:
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


def to_json(results: list[tuple[Explanation, Any]]) -> str:
    docs = [e.to_dict() for e, _ in results]
    return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2)
