"""``rulegraph explain-dataset``: one method over a whole data file, on an engine.

Output (``OUT/``): ``explanations.parquet``, one row per record of the data file, ordered by
record::

    example          record number in the file (0-based)
    text, label      as read
    tokens, ids      the model's tokens and their ids
    relevance        the method's score of each token (list, aligned with ``tokens``)
    target           the explained class (the predicted one unless ``target="label"``)
    prediction       the predicted class
    output_value     the explained logit
    relevance_sum    Σ relevance
    gap              output_value − relevance_sum: what the tokens do not carry (biases, ε,
                     non-conserving rules; ``rulegraph audit`` takes it apart per layer)
    batch_error      rule sets: the conservation audit's relative residual over the row's batch
    error            why the record could not be explained (``None`` when it was)
    explain_seconds  the batch's explanation time per row

``summary.json`` (rows, failed rows, the engine, throughput) and ``rows.jsonl``, the journal a
re-run resumes from (same settings; otherwise an error naming what differs, or ``--force``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import methods as registry
from ..errors import InputError, RulegraphError
from ..evaluate.data import Example, Row, encode, read_rows
from ..evaluate.listener import Listener
from ..loaders import load
from ..text import TextEncoder
from .batches import batches
from .engines import Engine, Task, engine as make_engine
from .feeds import batch_feeds, token_scores
from .journal import Journal, write_parquet

JOURNAL, CONFIG, TABLE, SUMMARY = "rows.jsonl", "config.json", "explanations.parquet", "summary.json"
TARGETS = ("predicted", "label")
#: what may differ between two runs of the same rows (timing)
UNTIMED = ("explain_seconds",)


@dataclass
class DatasetConfig:
    """Everything that decides the rows. ``identity()`` must match for a run to resume."""

    model: str
    data: str
    method: str
    options: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    target: str = "predicted"
    n: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    batch: int = 16
    batch_tokens: int = 8192

    def identity(self) -> dict[str, Any]:
        tokenizer = Path(self.tokenizer) if self.tokenizer else Path(self.model).parent / "tokenizer.json"
        method = Path(self.method)
        return {"model": _digest(Path(self.model)), "data": _digest(Path(self.data)),
                "tokenizer": _digest(tokenizer) if tokenizer.is_file() else None,
                "method": _digest(method) if method.suffix in (".yaml", ".yml") else self.method,
                "options": self.options, "target": self.target, "n": self.n, "dtype": self.dtype, "seed": self.seed,
                "batch": self.batch, "batch_tokens": self.batch_tokens}


def _digest(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"file not found: {path}")
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


def failed(row: Row, error: str, example: Example | None = None) -> dict:
    """The row of a record that could not be explained, with why."""
    return {"example": row.index, "text": row.text, "label": row.label,
            "tokens": list(example.encoded.tokens) if example else None, "error": error}


class ExplainWorker:
    """What runs on a worker: the model loaded once, then ``examples → rows``; an example the
    method fails on becomes a row with its ``error``."""

    def __init__(self, config: DatasetConfig):
        self.config = config
        self.graph = load(config.model)
        encoder = TextEncoder.for_model(self.graph, config.model, config.tokenizer)
        self.vocab = registry.Vocab.from_tokenizer(encoder.tokenizer)
        self.method = registry.get(config.method)
        self.options = self.method.resolve(config.options)

    def __call__(self, examples: list[Example]) -> list[dict]:
        try:
            return self._explain(examples)
        except Exception:       # noqa: BLE001 — which examples fail is found one by one below
            return [self._one(e) for e in examples]

    def _one(self, example: Example) -> dict:
        try:
            return self._explain([example])[0]
        except Exception as exc:    # noqa: BLE001 — recorded as the example's row, counted in the summary
            why = str(exc).splitlines()[0] if str(exc) else ""
            return failed(example.row, why if isinstance(exc, RulegraphError) else f"{type(exc).__name__}: {why}",
                          example)

    def _explain(self, examples: list[Example]) -> list[dict]:
        cfg = self.config
        feeds, special = batch_feeds(self.graph, examples, self.vocab.pad or 0)
        ids = feeds[registry.token_input(self.graph)]
        target = [e.row.label for e in examples] if cfg.target == "label" else None
        started = time.perf_counter()
        e = registry.explain_with(self.graph, self.method, feeds, target, device=cfg.device, dtype=_dtype(cfg.dtype),
                                  special=special, vocab=self.vocab, audit=self.method.kind == "rules",
                                  **self.options)
        seconds = (time.perf_counter() - started) / len(examples)
        scores = token_scores(e, ids.shape, self.method.name)
        batch_error = e.audit.conservation.relative_error if e.audit is not None else None
        rows = []
        for b, ex in enumerate(examples):
            n = ex.length
            relevance = scores[b, :n].tolist()
            total = float(scores[b, :n].sum())
            rows.append({"example": ex.row.index, "text": ex.row.text, "label": ex.row.label,
                         "tokens": list(ex.encoded.tokens), "ids": ids[b, :n].tolist(), "relevance": relevance,
                         "target": e.target[b], "prediction": int(e.output_tensor[b].argmax()),
                         "output_value": e.output_value[b], "relevance_sum": total,
                         "gap": e.output_value[b] - total, "batch_error": batch_error, "error": None,
                         "explain_seconds": seconds})
        return rows


def explain_dataset(config: DatasetConfig, out: Path, *, engine: Engine | None = None, force: bool = False,
                    listener: Listener | None = None) -> dict[str, Any]:
    """Explain every record of ``config.data`` with ``config.method``; returns the summary.

    Everything the user gave is read and checked first (model, method and options, data file,
    labels): a problem there is an error before any file is written."""
    engine = engine or make_engine("local")
    engine.check(config.device)
    listener = listener or Listener()
    out = Path(out)
    if config.target not in TARGETS:
        raise InputError(f"unknown target {config.target!r}; valid: {', '.join(TARGETS)}")
    method = registry.get(config.method)
    method.resolve(config.options)              # unknown or bad options: an error naming the valid ones
    graph = load(config.model)
    encoder = TextEncoder.for_model(graph, config.model, config.tokenizer)
    labels = graph.metadata.get("rulegraph.labels")
    rows = read_rows(Path(config.data), json.loads(labels) if labels else None, config.n)
    if config.target == "label":
        missing = [r.index for r in rows if not r.problem and r.label is None]
        if missing:
            raise InputError(f"--target label: record {missing[0]} of {config.data} has no label "
                             f"({len(missing)} records lack one)")
    examples, truncated = encode(rows, encoder)
    journal = _prepare(config, out, force)
    done = {r["example"] for r in journal.read(repair=True)}
    journal.append(failed(r, r.problem) for r in rows if r.problem and r.index not in done)
    if truncated:
        listener.note(f"{truncated} of {len(examples)} texts truncated to {encoder.max_length} tokens")
    todo = [e for e in examples if e.row.index not in done]
    tasks = [Task(k, [todo[i] for i in members], sum(todo[i].length for i in members))
             for k, members in enumerate(batches([e.length for e in todo], config.batch, config.batch_tokens))]
    total = len(rows)
    written = total - len(todo)
    listener.start(max(sum(t.cost for t in tasks), 1), f"{written}/{total} explained")
    started = time.perf_counter()

    def finished(task: Task, result: list[dict] | None, error: str | None) -> None:
        nonlocal written
        result = result if error is None else [failed(e.row, error, e) for e in task.payload]
        journal.append(result)
        written += len(result)
        listener.advance(task.cost, f"{written}/{total} explained")
    try:
        listener.method(method.name)
        engine.run(functools.partial(ExplainWorker, config), tasks, finished)
    finally:
        listener.stop()
    seconds = time.perf_counter() - started
    result = sorted(journal.read(), key=lambda r: r["example"])
    wanted = {r.index for r in rows}
    result = [r for r in result if r["example"] in wanted]
    write_parquet(result, out / TABLE)
    bad = [r for r in result if r.get("error")]
    summary = {"rows": len(result), "explained": len(result) - len(bad), "failed": len(bad),
               "first_error": bad[0]["error"] if bad else None, "method": method.name, "engine": engine.describe(),
               "config": asdict(config), "run_seconds": seconds,
               "explained_now": len(todo), "examples_per_second": len(todo) / seconds if todo and seconds else None}
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _prepare(config: DatasetConfig, out: Path, force: bool) -> Journal:
    """Start, resume or refuse (results of other settings in ``out``)."""
    journal, stored_at = Journal(out / JOURNAL), out / CONFIG
    identity = config.identity()
    if force:
        for name in (JOURNAL, CONFIG, TABLE, SUMMARY):
            (out / name).unlink(missing_ok=True)
    elif stored_at.exists():
        stored = json.loads(stored_at.read_text())
        if stored != identity:
            diff = [k for k in sorted(set(stored) | set(identity)) if stored.get(k) != identity.get(k)]
            raise InputError(f"{out} holds explanations made with other settings ({', '.join(diff)}); "
                             "pass --force to start over, or choose another --out")
    elif any((out / name).exists() for name in (JOURNAL, TABLE, SUMMARY)):
        raise InputError(f"{out} holds outputs without {CONFIG}; pass --force to overwrite them")
    out.mkdir(parents=True, exist_ok=True)
    stored_at.write_text(json.dumps(identity, indent=2) + "\n")
    return journal
