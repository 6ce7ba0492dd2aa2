"""``rulegraph explain-dataset``: one method over a whole data file, on an engine.

Output (``OUT/``): ``explanations.parquet``, one row per record of the data file, ordered by
record::

    example          record number in the file (0-based)
    method           the method's name
    text, label      as read
    tokens, ids      the model's tokens and their ids
    relevance        the method's score of each token (list, aligned with ``tokens``)
    target           the explained class (the predicted one unless ``target="label"``; a causal LM:
                     the next token after the text's last one)
    prediction       the predicted class (a causal LM: the predicted next token)
    output_value     the explained logit
    relevance_sum    Σ relevance
    gap              output_value − relevance_sum: what the tokens do not carry (biases, ε,
                     non-conserving rules; ``rulegraph audit`` takes it apart per layer)
    batch_error      rule sets: the conservation audit's relative residual over the row's batch
    error            why the record could not be explained (``None`` when it was)
    explain_seconds  the batch's explanation time per row
    units            with ``--at``: per selected value its selector, value, block, unit kind (head,
                     channel, unit) and each unit's relevance, summed over positions
                     (:meth:`rulegraph.inside.Inside.per_unit`)

With ``--top K`` (and ``--at``), ``top-units.json``: the K units carrying the most relevance over the
data set, ``Σ_examples |R_unit|``, strongest first, each with its mean signed relevance
(:func:`top_units`).

``summary.json`` (rows, failed rows, the engine, throughput) and ``rows.jsonl``, the journal a
re-run resumes from (same settings; otherwise an error naming what differs, or ``--force``).
The job runs on the driver of :mod:`.job`, as ``rulegraph evaluate`` does.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import methods
from ..errors import InputError
from ..files import write_file
from ..loaders import load
from ..methods.sequences import fixed_batch
from ..passes.base import labels
from ..text import TextEncoder
from .data import Example, Row, encode, read_rows
from .engines import Engine, engine as make_engine
from .job import Folder, Job, Worker, contents, digest, is_causal, method_options, on_workers, read_files
from .journal import write_parquet
from .listener import Listener

JOURNAL, TABLE, SUMMARY, TOP = "rows.jsonl", "explanations.parquet", "summary.json", "top-units.json"
TARGETS = ("predicted", "label")


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
    at: list[str] = field(default_factory=list)     # selectors: each row's per-unit relevance (rulegraph.inside)
    top: int | None = None                          # the K units carrying most relevance over the data set

    def options_by_method(self) -> dict[str, dict[str, Any]]:
        """The job's one method and its options (the worker's view of the settings; ``at`` a rule set's)."""
        return {self.method: {**self.options, **({"at": list(self.at)} if self.at else {})}}

    def identity(self) -> dict[str, Any]:
        method = Path(self.method)
        return {**contents(self.model, self.data, self.tokenizer),
                "method": digest(method) if method.suffix in (".yaml", ".yml") else self.method,
                "options": self.options, "target": self.target, "n": self.n, "dtype": self.dtype, "seed": self.seed,
                "batch": self.batch, "batch_tokens": self.batch_tokens, **({"at": self.at} if self.at else {})}


def failed(row: Row, method: str, error: str, example: Example | None = None) -> dict:
    """The row of a record that could not be explained, with why."""
    return {"example": row.index, "method": method, "text": row.text, "label": row.label,
            "tokens": list(example.encoded.tokens) if example else None, "error": error}


class ExplainWorker(Worker):
    """A worker of explain-dataset: each example's tokens, relevance and explained output."""

    audit = True

    def rows(self, name: str, examples: list[Example], next_token: bool) -> list[dict]:
        target = [e.row.label for e in examples] if self.job.target == "label" else None
        x = self.explain(name, examples, next_token, target)
        e = x.explanation
        batch_error = e.audit.conservation.relative_error if e.audit is not None else None
        rows = []
        for b, ex in enumerate(examples):
            n = ex.length
            total = float(x.scores[b, :n].sum())
            out = e.output_at(x.position)[b]
            rows.append({"example": ex.row.index, "method": name, "text": ex.row.text, "label": ex.row.label,
                         "tokens": list(ex.encoded.tokens), "ids": x.ids[b, :n].tolist(),
                         "relevance": x.scores[b, :n].tolist(), "target": e.target[b], "prediction": int(out.argmax()),
                         "output_value": e.output_value[b], "relevance_sum": total, "gap": e.output_value[b] - total,
                         "batch_error": batch_error, "error": None, "explain_seconds": x.seconds / len(examples)})
            if e.inside:
                rows[-1]["units"] = units(e, b)
        return rows

    def failed(self, row: Row, method: str, error: str, example: Example | None = None) -> dict:
        return failed(row, method, error, example)


def units(e, item: int) -> list[dict[str, Any]]:
    """Per value ``--at`` selected, item ``item``'s relevance per unit (summed over positions)."""
    return [{"selector": selector, "value": x.value, "block": x.block,
             "kind": "head" if x.heads else "channel" if "channel" in x.axes else "unit",
             "relevance": x.per_unit()[item].tolist()} for selector, found in e.inside.items() for x in found]


def top_units(rows: list[dict], k: int) -> list[dict[str, Any]]:
    """The ``k`` units carrying the most relevance over the rows: ``Σ_examples |R_unit|``, with the mean signed
    ``R_unit`` and the number of examples, strongest first (ties in the order the rows list the units)."""
    carried: dict[tuple, list[float]] = {}
    for row in rows:
        for u in row.get("units") or ():
            for i, r in enumerate(u["relevance"]):
                carried.setdefault((u["selector"], u["value"], u["block"], u["kind"], i), []).append(r)
    ranked = sorted(carried.items(), key=lambda item: -sum(abs(r) for r in item[1]))[:k]
    return [{"selector": s, "value": v, "block": b, "kind": kind, "unit": i,
             "carried": sum(abs(r) for r in rs), "mean": sum(rs) / len(rs), "examples": len(rs)}
            for (s, v, b, kind, i), rs in ranked]


def explain_dataset(config: DatasetConfig, out: Path, *, engine: Engine | None = None, force: bool = False,
                    listener: Listener | None = None, progress: bool = True) -> dict[str, Any]:
    """Explain every record of ``config.data`` with ``config.method``; returns the summary.
    ``listener`` gets the notes and, unless ``progress=False``, the progress (:class:`~.listener.Listener`).

    Everything the user gave is read and checked first (model, method and options, data file,
    labels): a problem there is an error before any file is written."""
    engine = engine or make_engine("local")
    engine.check(config.device)
    listener = listener or Listener()
    if config.target not in TARGETS:
        raise InputError(f"unknown target {config.target!r}; valid: {', '.join(TARGETS)}")
    if config.top is not None and not config.at:
        raise InputError("--top K ranks the units --at selects: give --at SELECTOR too (docs/inside.md)")
    if config.at and not methods.get(config.method).rule_set:
        raise InputError(f"--at reads the relevance pass's walk: give a rule set (--rules), not {config.method}")
    name = methods.get(config.method).name
    method_options(config.options_by_method(), config.seed)       # unknown or bad options: an error naming the valid ones
    graph = load(config.model)
    encoder = TextEncoder.for_model(graph, config.model, config.tokenizer)
    names = labels(graph)
    rows = read_rows(Path(config.data), names, config.n, classes=len(names) if names else None)
    if config.target == "label":
        missing = [r.index for r in rows if not r.problem and r.label is None]
        if missing:
            raise InputError(f"--target label: record {missing[0]} of {config.data} has no label "
                             f"({len(missing)} records lack one)")
    examples, truncated = encode(rows, encoder)
    job = Job(Folder(out, JOURNAL, (TABLE, SUMMARY, TOP), "explanations"), [name], engine, listener, default_method=name)
    rules = config.method if Path(config.method).suffix in (".yaml", ".yml") else None
    job.open(config.identity(), force=force, inputs=read_files(config.model, config.data, config.tokenizer, rules))
    try:
        return _run(job, config, graph, encoder, rows, examples, truncated, name, engine, out, listener, progress)
    finally:
        job.close()


def _run(job: Job, config: DatasetConfig, graph, encoder: TextEncoder, rows: list[Row], examples: list[Example],
         truncated: int, name: str, engine: Engine, out: Path, listener: Listener, progress: bool) -> dict[str, Any]:
    """The open job's work: the rows the journal lacks, then the table and the summary."""
    job.record(failed(r, name, r.problem) for r in rows if r.problem and (r.index, name) not in job.done)
    if truncated:
        listener.note(f"{truncated} of {len(examples)} texts truncated to {encoder.max_length} tokens")
    causal = bool(examples) and is_causal(graph, examples[0], config.device)
    tasks = job.tasks(examples, min(config.batch, fixed_batch(graph) or config.batch), config.batch_tokens, causal)
    seconds = job.run(functools.partial(ExplainWorker, on_workers(config)), tasks, failed, total=len(examples),
                      progress=progress)
    result = job.rows({r.index for r in rows})
    write_parquet(result, Path(out) / TABLE)
    bad = [r for r in result if r.get("error")]
    now = sum(len(task.payload[1]) for task in tasks)
    summary = {"rows": len(result), "explained": len(result) - len(bad), "failed": len(bad),
               "first_error": bad[0]["error"] if bad else None, "method": name, "engine": engine.describe(),
               "config": asdict(config), "run_seconds": seconds,
               "explained_now": now, "examples_per_second": now / seconds if now and seconds else None}
    if config.top is not None:
        summary["top_units"] = top_units(result, config.top)
        write_file(Path(out) / TOP, json.dumps(summary["top_units"], indent=2) + "\n", TOP)
    write_file(Path(out) / SUMMARY, json.dumps(summary, indent=2) + "\n", SUMMARY)
    return summary
