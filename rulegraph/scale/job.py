"""A dataset job: methods over every record of a data file, written to an output folder.

``rulegraph explain-dataset`` (:mod:`.explain`) and ``rulegraph evaluate``
(:mod:`rulegraph.evaluate.runner`) are two jobs on this one driver; an evaluation is a job
whose worker also scores each explanation. The driver

1. opens the output folder (:class:`Folder`): a new one is started; one whose ``config.json``
   holds the same settings (the model, tokenizer and data by content digest) is resumed; one
   holding other settings is refused, naming what differs (``force`` starts over), and so is one
   holding rows of a rule set that now binds the model otherwise (``members``: methods may be added);
2. cuts the work into tasks (:meth:`Job.tasks`): length-bucketed batches
   (:func:`~.batches.batches`) × methods, without the (example, method) pairs the journal
   holds; one example per task where a text must be explained alone (a causal LM, at its last
   token; span QA, so that the answer lies in the text's own tokens);
3. runs them on an engine (:mod:`.engines`), appending each finished task's rows to the
   journal (:class:`~.journal.Journal`) at once, a task that could not run as failed rows;
4. reads the journal back, ordered by example, then method.

A :class:`Worker` loads the model once; given a task it explains the batch with the method,
and where that fails, each example alone, so an example the method fails on is a failed row
(with its ``error``) and the others still run.
"""
from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from .. import methods
from ..errors import InputError, RulegraphError
from ..files import FolderLock, refuse_input, refuse_link, write_file
from ..explanation import Explanation
from ..facts import has_positions
from ..interpreter import DTYPES, prepare
from ..ir import Graph
from ..loaders import load
from ..loaders.onnx import model_file
from ..text import TextEncoder
from .batches import batches
from .data import Example, Row
from .engines import Engine, Task
from .feeds import batch_feeds, token_scores
from .journal import Journal
from .listener import Listener

CONFIG = "config.json"
#: the key of ``config.json`` under which each method's own identity is kept (:meth:`Folder.open`)
MEMBERS = "members"


def digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file's bytes, read in blocks."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"file not found: {path}")
    h = hashlib.sha256()
    with file.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


def contents(model: str, data: str, tokenizer: str | None) -> dict[str, str | None]:
    """The job's files by content: a folder moved elsewhere resumes, other weights or texts do not.
    ``model``: a model file, or the folder ``rulegraph export`` wrote (:func:`~rulegraph.loaders.onnx.model_file`)."""
    model = model_file(model)
    vocabulary = Path(tokenizer) if tokenizer else model.parent / "tokenizer.json"
    return {"model": digest(model), "data": digest(data),
            "tokenizer": digest(vocabulary) if vocabulary.is_file() else None}


def read_files(model: str, data: str, tokenizer: str | None, *more: str | None) -> list[str]:
    """The files a job reads (the model, the data, the tokenizer, a rule file…): its outputs never replace them."""
    model = model_file(model)
    vocabulary = tokenizer or str(model.parent / "tokenizer.json")
    return [str(p) for p in (model, data, vocabulary, *more) if p]


def on_workers(config: Any) -> Any:
    """The job's settings (a dataclass with ``model`` and ``tokenizer``) as the workers get them: the
    files as absolute paths, since a worker of a cluster started elsewhere (``--address``) runs in a
    folder of its own, where a path relative to the user's folder names nothing."""
    return replace(config, model=str(Path(config.model).absolute()),
                   tokenizer=str(Path(config.tokenizer).absolute()) if config.tokenizer else None)


def method_options(raw: dict[str, dict[str, Any]], seed: int) -> dict[str, dict[str, Any]]:
    """Each method's options checked and completed (a seeded method gets the job's ``seed`` unless given one)."""
    out = {}
    for name, given in raw.items():
        method = methods.get(name)
        options = dict(given)
        if method.seeded and "seed" not in options:
            options["seed"] = seed
        out[name] = method.resolve(options)
    return out


def is_causal(graph: Graph, example: Example, device: str = "cpu") -> bool:
    """Whether the model's (first) output has a positions axis, ``[batch, positions, vocabulary]``:
    a causal LM, explained at each text's last token, for the next token it predicts there."""
    return has_positions(graph, None, lambda: batch_feeds(graph, [example], 0)[0], prepare(graph, device, torch.float32))


class Folder:
    """A job's output folder: ``config.json`` (the settings that decide the rows), the
    ``journal`` of rows, and the ``outputs`` the job writes at the end from the journal.

    While a job has it open, the folder is locked (:class:`~rulegraph.files.FolderLock`): a
    second run on it is refused with the first one's pid. Its files are never written through a
    symbolic link, and never when one of them is a file the job reads (``inputs``) or a
    ``config.json`` that some other program wrote (a model's folder): not even with ``force``."""

    def __init__(self, path: Path, journal: str, outputs: tuple[str, ...], holds: str):
        self.path = Path(path)
        self.journal = Journal(self.path / journal)
        self.outputs = outputs
        self.holds = holds              # what the folder holds, for messages ("explanations", "results")
        self.lock = FolderLock(self.path, holds)

    def names(self) -> tuple[str, ...]:
        """Every file the job writes in the folder."""
        return (self.journal.path.name, CONFIG, *self.outputs)

    def open(self, identity: dict, description: dict | None = None, force: bool = False,
             inputs: Iterable = (), members: dict[str, str] | None = None) -> Journal:
        """Start, resume or refuse (see the module docstring). ``config.json`` holds ``identity``
        and ``description`` (context that does not decide the rows, e.g. a protocol's summary);
        ``inputs``: the files the job reads. ``members``: method → what decides its rows beyond the identity
        (what its rule set decides on the model): a method the folder holds rows of is refused where that
        changed, while methods may come and go (``config.json`` keeps every method's, under ``members``)."""
        stored_at = self.path / CONFIG
        description = description or {}
        members = members or {}
        for name in self.names():
            refuse_link(self.path / name)
            refuse_input(self.path / name, "", inputs)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create {self.path}: {exc.strerror or exc}") from None
        self.lock.acquire()
        try:
            stored = self._stored(stored_at, force)
            if force:
                for name in self.names():
                    (self.path / name).unlink(missing_ok=True)
            elif stored is not None:
                held = stored.pop(MEMBERS, None)
                held = held if isinstance(held, dict) else {}
                stored = {k: v for k, v in stored.items() if k not in description}
                if stored != identity:
                    diff = [k for k in sorted(set(stored) | set(identity)) if stored.get(k) != identity.get(k)]
                    raise InputError(f"{self.path} holds {self.holds} made with other settings ({', '.join(diff)}); "
                                     "pass --force to start over, or choose another --out")
                changed = [name for name, value in members.items() if held.get(name, value) != value]
                if changed:
                    raise InputError(
                        f"{self.path} holds {self.holds} of {', '.join(changed)} made with other rules (the rule "
                        "file changed since, and binds the model otherwise); pass --force to start over, give the "
                        "changed file another label (LABEL=FILE), or choose another --out")
                members = {**held, **members}
            elif self.journal.path.exists() or any((self.path / name).exists() for name in self.outputs):
                raise InputError(f"{self.path} holds {self.holds} without {CONFIG}; pass --force to overwrite them")
            write_file(stored_at, json.dumps({**identity, **description, MEMBERS: members}, indent=2) + "\n",
                       CONFIG)
        except BaseException:
            self.lock.release()
            raise
        return self.journal

    def _stored(self, path: Path, force: bool) -> dict | None:
        """The settings ``config.json`` holds (``None``: none, or one cut short that ``force``
        replaces); a ``config.json`` that is not a job's settings file is refused even with ``force``."""
        if not path.exists():
            return None
        try:
            stored = json.loads(path.read_bytes())
        except (ValueError, OSError):
            if force:
                return None
            raise InputError(f"{path} is not valid JSON (cut short by a stop?); pass --force to start over") from None
        if not isinstance(stored, dict) or not all(str(stored.get(k, "")).startswith("sha256:") for k in ("model", "data")):
            raise InputError(f"{path} is not the settings file of a rulegraph run (another program's config.json, "
                             "e.g. a model's); choose another --out (--force never replaces it)")
        return stored

    def close(self) -> None:
        """Release the folder's lock (the end of the process releases it too)."""
        self.lock.release()


@dataclass
class Explained:
    """A batch explained by a worker: the explanation, the token ids it read, each token's
    score (float64, ``[batch, tokens]``) and the explanation's time."""

    explanation: Explanation
    ids: torch.Tensor
    scores: torch.Tensor
    seconds: float
    position: int | None


class Worker:
    """What runs on a worker of the engine: the model loaded once, then ``(method, examples,
    next_token) → rows``, one per example. Subclasses say what a row holds (:meth:`rows`,
    :meth:`failed`); ``job`` is the job's settings (``model``, ``tokenizer``, ``device``,
    ``dtype``, ``seed`` and ``options_by_method()``: method name → options)."""

    audit = False               # whether the explanations are audited (rule sets)

    def __init__(self, job: Any):
        self.job = job
        self.graph = load(job.model)
        encoder = TextEncoder.for_model(self.graph, job.model, job.tokenizer)
        self.vocab = methods.Vocab.from_tokenizer(encoder.tokenizer)
        self.options = method_options(job.options_by_method(), job.seed)
        self.methods = {name: methods.get(name) for name in self.options}
        self.dtype = DTYPES[job.dtype]
        self.warm: set[str] = set()           # methods called once already (untimed)

    def __call__(self, payload: tuple[str, list[Example], bool]) -> list[dict]:
        """``(method, examples, next_token)``: with ``next_token`` (a causal LM, one text) the
        method explains the last position."""
        name, examples, next_token = payload
        try:
            return self.rows(name, examples, next_token)
        except Exception:       # noqa: BLE001 — which examples fail is found one by one below
            return [self._alone(name, e, next_token) for e in examples]

    def _alone(self, name: str, example: Example, next_token: bool) -> dict:
        try:
            return self.rows(name, [example], next_token)[0]
        except Exception as exc:    # noqa: BLE001 — recorded as the example's row, counted in the summary
            why = str(exc).splitlines()[0] if str(exc) else ""
            return self.failed(example.row, name, why if isinstance(exc, RulegraphError) else
                               f"{type(exc).__name__}: {why}", example)

    def explain(self, name: str, examples: list[Example], next_token: bool, target=None) -> Explained:
        """``examples`` padded into one batch and explained with the method ``name`` (its first
        call, on one example, is untimed: binding, plans and sessions are prepared there)."""
        method = self.methods[name]
        feeds, special = batch_feeds(self.graph, examples, self.vocab.pad or 0)
        ids = feeds[methods.token_input(self.graph)]
        position = ids.shape[1] - 1 if next_token else None      # one text per task then
        call = functools.partial(methods.explain_with, self.graph, method, device=self.job.device, dtype=self.dtype,
                                 vocab=self.vocab, audit=self.audit and method.rule_set, position=position,
                                 **self.options[name])
        if name not in self.warm:
            call({k: v[:1] for k, v in feeds.items()}, None if target is None else target[:1], special=special[:1])
            self.warm.add(name)
        started = time.perf_counter()
        e = call(feeds, target, special=special)
        seconds = time.perf_counter() - started
        return Explained(e, ids, token_scores(e, ids.shape, method.name), seconds, position)

    def rows(self, name: str, examples: list[Example], next_token: bool) -> list[dict]:
        raise NotImplementedError

    def failed(self, row: Row, method: str, error: str, example: Example | None = None) -> dict:
        """The row of an example the method could not be run on, with why."""
        raise NotImplementedError


class Job:
    """The driver's side of a dataset job (see the module docstring)."""

    def __init__(self, folder: Folder, methods: list[str], engine: Engine, listener: Listener | None = None,
                 default_method: str | None = None):
        self.folder = folder
        self.methods = methods
        self.engine = engine
        self.listener = listener or Listener()
        self.default_method = default_method        # the method of journal rows that do not name one
        self.done: set[tuple[int, str]] = set()

    def open(self, identity: dict, description: dict | None = None, force: bool = False, inputs: Iterable = (),
             members: dict[str, str] | None = None) -> None:
        """Open (and lock) the folder; :attr:`done` holds the (example, method) pairs the journal has;
        ``inputs``: the files the job reads (never written over); ``members``: :meth:`Folder.open`'s."""
        journal = self.folder.open(identity, description, force, inputs, members)
        try:
            self.done = {(r["example"], r.get("method", self.default_method)) for r in journal.read(repair=True)}
        except BaseException:
            self.folder.close()
            raise

    def close(self) -> None:
        """The job is over: the folder's lock is released."""
        self.folder.close()

    def record(self, rows: Iterable[dict]) -> None:
        self.folder.journal.append(rows)

    def tasks(self, examples: list[Example], batch: int, batch_tokens: int, next_token: bool) -> list[Task]:
        """Batches × methods of the pairs not done yet; one example per batch for a causal LM
        (``next_token``) or span QA."""
        alone = next_token or any(e.row.question is not None for e in examples)
        out = []
        for b, members in enumerate(batches([e.length for e in examples], 1 if alone else batch, batch_tokens)):
            for name in self.methods:
                pending = [examples[i] for i in members if (examples[i].row.index, name) not in self.done]
                if pending:
                    out.append(Task((b, name), (name, pending, next_token), sum(e.length for e in pending)))
        return out

    def run(self, factory: Callable[[], Worker], tasks: list[Task], failed: Callable[[Row, str, str, Example], dict],
            total: int, progress: bool = True) -> float:
        """Run ``tasks`` on the engine, each task's rows to the journal as it finishes (a task that
        could not run: ``failed`` rows); ``total``: the (example, method) pairs of the whole job,
        for the progress line, which goes to the job's listener in the order
        :class:`~.listener.Listener` defines (``progress=False``: to none; the notes still do).
        Returns the seconds it took."""
        shown = self.listener if progress else Listener()
        done = total - sum(len(task.payload[1]) for task in tasks)
        shown.start(max(sum(task.cost for task in tasks), 1), f"{done}/{total} explained")
        if tasks:
            shown.method(tasks[0].payload[0])

        def finished(task: Task, rows: list[dict] | None, error: str | None) -> None:
            nonlocal done
            name, pending, _ = task.payload
            rows = rows if error is None else [failed(e.row, name, error, e) for e in pending]
            self.record(rows)
            done += len(rows)
            shown.method(name)
            shown.advance(task.cost, f"{done}/{total} explained")
        started = time.perf_counter()
        try:
            self.engine.run(factory, tasks, finished)
        finally:
            shown.stop()
        return time.perf_counter() - started

    def rows(self, examples: set[int]) -> list[dict]:
        """The journal's rows of ``examples`` and this job's methods, by example then method."""
        order = {name: k for k, name in enumerate(self.methods)}
        rows = [r for r in self.folder.journal.read() if r["example"] in examples
                and r.setdefault("method", self.default_method) in order]
        return sorted(rows, key=lambda r: (r["example"], order[r["method"]]))
