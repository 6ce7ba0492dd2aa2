"""What the explain, audit and check commands share: reading the model and the inputs,
running the explanations with a progress bar, and writing outputs whole."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import torch
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from .. import files
from ..api import explain
from ..errors import InputError
from ..explanation import Explanation
from ..facts import roles, token_feeds
from ..ir import Graph
from ..loaders import load
from .console import err


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


def requests_of(graph: Graph, texts, raw_inputs, question: str | None = None) -> list[dict[str, Any]]:
    """The explanations asked for, as :func:`rulegraph.explain` arguments: one per --text (after the
    --question, for span QA; --input values fill what the text does not), or one from --input values."""
    extra = parse_inputs(graph, raw_inputs)
    texts = _texts(texts)
    if question is not None and not texts:
        raise InputError("--question is encoded before a --text (the context); give --text too")
    if texts:
        return [{"text": t, "inputs": extra or None} for t in texts]
    if not extra:
        raise InputError("give --text \"…\" (with a tokenizer) or --input NAME=… for each model input")
    ids = extra.get(roles(graph).ids)
    if ids is not None:             # a mask of ones and zero token types where not given
        extra = {**extra, **token_feeds(graph, ids, given=extra)}
    return [{"inputs": extra}]


def run_all(graph, method, requests: list[dict[str, Any]], opts: dict[str, Any], options: dict[str, Any],
            tokenizer=None, question: str | None = None) -> list[Explanation]:
    """Each request explained by :func:`rulegraph.explain` (a progress bar for several): the command
    line and the Python API take the same arguments and give the same explanations."""
    results = []
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeRemainingColumn(),
                        console=err, transient=True, disable=len(requests) < 2)
    with progress:
        task = progress.add_task("explaining", total=len(requests))
        for request in requests:
            e = explain(graph, method, target=opts["target"], contrast=opts.get("contrast"),
                        score=opts.get("score") or "logit", objective=opts.get("objective"),
                        output=opts["output_name"], position=opts["position"], device=opts["device"],
                        dtype=getattr(torch, opts["dtype"]), tokenizer=tokenizer, targets=opts.get("targets"),
                        question=question if "text" in request else None, **request, **options)
            results.extend(e if isinstance(e, list) else [e])     # --targets, condition alternatives: several
            progress.advance(task)
    return results


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


def check_outputs(outputs, force: bool, inputs=()) -> None:
    """Refuse, before any work, the outputs of one run (``(path, option)`` pairs) that cannot all be
    written: each as :func:`check_output`, and two of them on one file
    (:func:`rulegraph.files.check_outputs`). A run writes all its outputs or none."""
    files.check_outputs(outputs, force, inputs)


def write(path: Path, content: str, force: bool, what: str, inputs=()) -> None:
    """Write ``content`` whole or not at all, never through a link (:func:`rulegraph.files.write_file`)."""
    if str(path) == "-":
        click.echo(content)
        return
    check_output(path, force, what, inputs)
    files.write_file(path, content, what)
    err.print(f"[dim]wrote {what} to {escape(str(path))}[/]")


def to_json(results: list[Explanation]) -> str:
    docs = [e.to_dict() for e in results]
    return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2)
