"""The evaluation runner: explain a data set with several methods, score every explanation
with the faithfulness metrics, and aggregate.

Batched (examples bucketed by length, :func:`rulegraph.scale.batches`, and explained in padded
batches; every perturbed sequence run once per method and batch through one plan), on an engine
(:mod:`rulegraph.scale`: this process, or a Ray cluster; each worker an :class:`EvalWorker`),
resumable (one JSON line per example × method appended to ``results.jsonl``; a re-run skips
what is there), deterministic (the same batches on every engine, rows ordered by example before
aggregation, seeded random baseline and bootstrap). ``results.parquet`` holds the rows at the end.

The runner holds data only: what it has to say while running (notes, progress) goes to a
:class:`Listener`, which the command line (``rulegraph.cli.evaluate``) draws in the terminal;
the terminal table is drawn there too, the Markdown table is :func:`markdown_table`.

A causal LM (an output ``[batch, positions, vocabulary]``) is explained at each text's last
token, for the next token it predicts there, one text at a time (a padded batch has no common
last position); the metrics read the next-token logits after each perturbed sequence. Span-QA
data (rows with a question) is explained one text at a time too, so that the predicted start is
one of the text's own tokens, never padding.

A causal LM (an output ``[batch, positions, vocabulary]``) is explained at each text's last
token, for the next token it predicts there, one text at a time (a padded batch has no common
last position); the metrics read the next-token logits after each perturbed sequence. Span-QA
data (rows with a question) is explained one text at a time too, so that the predicted start is
one of the text's own tokens, never padding.

Speed: each method is called once on one text before its timed calls (a warm-up: binding,
plan preparation, sessions), so ``explained/min`` does not depend on which method runs first.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import methods as registry
from ..errors import InputError, RulegraphError, choices
from ..loaders import load
from ..scale import Engine, Journal, Task, batches, engine as make_engine
from ..scale.feeds import batch_feeds, token_scores
from ..scale.journal import write_parquet
from ..text import TextEncoder
from . import metrics as M
from . import protocols as P
from .data import Example, Row, encode, read_rows
from .listener import Listener

RESULTS = "results.jsonl"
CONFIG = "config.json"
OUTPUTS = ("table.csv", "summary.json", "curves.png", "conservation.png", "results.parquet")
BOOTSTRAP = 2000
TIMING = ("explained/min and evaluated/min exclude one warm-up call per method (and one forward of the "
          "metrics' model), made before the timed calls")


@dataclass
class Config:
    """Everything that decides the numbers. ``identity()`` must match for a run to resume."""

    model: str
    data: str
    methods: list[str]
    metrics: list[str] = field(default_factory=M.defaults)
    tokenizer: str | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    removal: str | None = None      # None: the protocol's ([MASK] under the default protocol)
    settings: dict[str, Any] = field(default_factory=dict)     # metric options by key (M.all_options)
    seed: int = 0
    n: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    batch: int = 16                 # examples explained together (at most)
    batch_tokens: int = 8192        # padded tokens per forward batch
    runtime: str = "auto"           # what runs the metrics' forwards (tokens.RUNTIMES)
    # the evaluation protocol (evaluate/protocols.py): a preset, and its fields overridden where given
    # (``removal`` above is one of them); None: the preset's
    protocol: str = "default"
    grid: list[float] | None = None         # AOPC's k in %; the default preset's: 0…aopc_k in aopc_step steps
    count: str | None = None
    min_count: int | None = None
    min_length: int | None = None
    score: str | None = None

    def resolved(self) -> P.Protocol:
        """The preset with the fields given here."""
        return P.PROTOCOLS.get(self.protocol).override(
            removal=self.removal, grid=tuple(self.grid) if self.grid is not None else None, count=self.count,
            min_count=self.min_count, min_length=self.min_length, score=self.score)

    def identity(self) -> dict[str, Any]:
        """The model, tokenizer and data by content (SHA-256), not path: a run moved to another
        folder or machine resumes, one against other weights or texts is refused. Protocol fields
        enter only where they differ from the ``default`` preset, so default runs keep the
        identity they had before protocols existed."""
        tokenizer = Path(self.tokenizer) if self.tokenizer else Path(self.model).parent / "tokenizer.json"
        return {"model": _digest(self.model), "data": _digest(self.data),
                "tokenizer": _digest(tokenizer) if tokenizer.is_file() else None,
                "metrics": list(self.metrics), "options": self.options, "removal": self.resolved().removal,
                "settings": self.all_settings(), "seed": self.seed, "dtype": self.dtype,
                **self.resolved().identity()}

    def all_settings(self) -> dict[str, Any]:
        """Every metric option: those given, else the protocol's (e.g. ``steps``), else the default."""
        return M.settings({**P.PROTOCOLS.get(self.protocol).settings, **self.settings})


@dataclass
class Summary:
    table: dict[str, dict[str, dict[str, float]]]       # method → metric → {mean, low, high, n}
    curves: dict[str, dict[str, list[float]]]            # metric → method → mean curve
    throughput: dict[str, dict[str, float]]
    n_examples: int
    rows: list[dict]
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)   # method → {texts, of, error, examples}
    scores: dict[str, str] = field(default_factory=dict)    # method → the quantity its scores are
    skipped: int = 0                # texts under the protocol's minimum length, not evaluated
    protocol: str = ""              # the resolved protocol in one line


def _digest(path: str) -> str:
    """``sha256:<hex>`` of a file's bytes."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"file not found: {path}")
    h = hashlib.sha256()
    with file.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


class Evaluation:
    def __init__(self, config: Config, out: Path, *, force: bool = False, listener: Listener | None = None,
                 progress: bool = True, engine: Engine | None = None):
        self.config = config
        self.out = Path(out)
        self.force = force
        self.listener = listener or Listener()
        self.show_progress = progress
        self.engine = engine or make_engine("local")
        for name in config.metrics:
            M.METRICS.get(name)             # unknown metric: an error naming the valid ones
        self.protocol = config.resolved()       # checks every field, naming the valid choices
        self.settings = config.all_settings()       # checks every field, naming the valid choices
        self.grid = self.protocol.grid_for(self.settings["aopc_k"], self.settings["aopc_step"])
        if not config.methods:
            raise InputError(f"no methods given; {choices(registry.names())}")
        self.methods = {name: registry.get(name) for name in config.methods}
        for name, opts in config.options.items():
            if name not in self.methods:
                raise InputError(f"options given for {name!r}, which is not among --methods "
                                 f"({', '.join(config.methods)})")
        self.failed: dict[str, dict[str, Any]] = {}     # method → texts it failed on (see failures())
        self.options = method_options(config, self.methods)
        self.journal = Journal(self.out / RESULTS)

    # -- files ------------------------------------------------------------------------------
    def _prepare_out(self) -> set[tuple[int, str]]:
        """Start, resume or refuse; returns the (row, method) pairs already done."""
        results, config = self.out / RESULTS, self.out / CONFIG
        identity = self.config.identity()
        described = {**identity, "protocol": {"name": self.config.protocol, **self.protocol.fields(),
                                              "aopc_grid": list(self.grid)}}
        if self.force:
            for name in (RESULTS, CONFIG, *OUTPUTS):
                (self.out / name).unlink(missing_ok=True)
        elif config.exists():
            stored = json.loads(config.read_text())
            stored.pop("protocol", None)        # a description; what decides the numbers is in the identity
            if stored != identity:
                diff = [k for k in sorted(set(stored) | set(identity)) if stored.get(k) != identity.get(k)]
                raise InputError(f"{self.out} holds results made with other settings ({', '.join(diff)}); "
                                 "pass --force to start over, or choose another --out")
        elif results.exists() or any((self.out / name).exists() for name in OUTPUTS):
            raise InputError(f"{self.out} holds evaluation outputs without {CONFIG}; pass --force to overwrite them")
        self.out.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps(described, indent=2) + "\n")
        return {(r["example"], r["method"]) for r in self.journal.read(repair=True)}

    # -- running ----------------------------------------------------------------------------
    def run(self, compute: bool = True) -> Summary:
        """Evaluate what ``results.jsonl`` lacks (``compute=False``: nothing), then aggregate all of it.

        Everything the user gave is read and checked first (model, tokenizer, texts, labels):
        a problem there is an error before any file is written."""
        cfg = self.config
        if compute:
            self.engine.check(cfg.device)
        torch.manual_seed(cfg.seed)
        graph = load(cfg.model)
        encoder = TextEncoder.for_model(graph, cfg.model, cfg.tokenizer)
        vocab = registry.Vocab.from_tokenizer(encoder.tokenizer)
        pr = self.protocol
        removal = M.Removal(pr.removal, vocab.replacement(pr.removal), vocab.unk, pr.count, pr.min_count)
        labels = graph.metadata.get("rulegraph.labels")
        labels = json.loads(labels) if labels else None
        model = registry.TokenModel(graph, device=cfg.device, dtype=_dtype(cfg.dtype), pad_id=vocab.pad,
                                    batch_tokens=cfg.batch_tokens, runtime=cfg.runtime)
        classes = self._classes(labels, encoder, model)
        rows = read_rows(Path(cfg.data), labels, cfg.n, classes=classes)
        examples, truncated = encode(rows, encoder)
        skipped = sum(e.length < pr.min_length for e in examples)
        examples = [e for e in examples if e.length >= pr.min_length]
        if skipped:
            self.listener.note(f"{skipped} of {skipped + len(examples)} texts have fewer than {pr.min_length} tokens "
                               f"and are skipped (protocol {cfg.protocol})")
        if not examples:
            raise InputError(f"every text has fewer than {pr.min_length} tokens (--min-length); nothing to evaluate")
        done = self._prepare_out()
        bad = [r for r in rows if r.problem]
        self.journal.append(failed_row(r, name, r.problem) for r in bad for name in self.methods
                            if (r.index, name) not in done)
        if bad:
            self.listener.note(f"{len(bad)} records cannot be read and are failed rows (first: {bad[0].problem})",
                               "error")
        if truncated:
            self.listener.note(f"{truncated} of {len(examples)} texts truncated to {encoder.max_length} tokens")
        metrics = M.build(cfg.metrics, removal, self.settings, self.metric_protocol())
        next_token = model.next_token(example_tokens(examples[0]))
        alone = next_token or any(e.row.question is not None for e in examples)
        tasks = []
        for b, members in enumerate(batches([e.length for e in examples], 1 if alone else cfg.batch,
                                            cfg.batch_tokens)):
            for name in self.methods:
                pending = [examples[i] for i in members if (examples[i].row.index, name) not in done]
                if pending:
                    tasks.append(Task((b, name), (name, pending, next_token), sum(e.length for e in pending)))
        pairs_total = len(examples) * len(self.methods)
        pairs_done = pairs_total - sum(len(task.payload[1]) for task in tasks)
        progress = self.listener if self.show_progress else Listener()
        progress.start(max(sum(task.cost for task in tasks), 1), f"{pairs_done}/{pairs_total} explained")

        def finished(task: Task, rows: list[dict] | None, error: str | None) -> None:
            nonlocal pairs_done
            name, pending, _ = task.payload
            rows = rows if error is None else [failed_row(e.row, name, error, e.length) for e in pending]
            self.journal.append(rows)
            pairs_done += len(rows)
            progress.method(name)
            progress.advance(task.cost, f"{pairs_done}/{pairs_total} explained")
        try:
            self.engine.run(functools.partial(EvalWorker, cfg), tasks if compute else [], finished)
        finally:
            progress.stop()
        wanted = {e.row.index for e in examples} | {r.index for r in bad}
        order = {name: k for k, name in enumerate(self.methods)}
        results = sorted((r for r in self.journal.read() if r["example"] in wanted and r["method"] in self.methods),
                         key=lambda r: (r["example"], order[r["method"]]))
        self.failed = failures(results, list(self.methods))
        for name, f in self.failed.items():
            if f["texts"] == f["of"]:
                raise InputError(f"method {name!r} failed on every text ({f['texts']} of {f['of']}): {f['error']}")
        # a stopped run: aggregate only the texts every method has finished (paired comparison;
        # a text a method failed on counts as finished, and is left out of that method's figures)
        per_example: dict[int, set[str]] = {}
        for r in results:
            per_example.setdefault(r["example"], set()).add(r["method"])
        complete = {i for i, ms in per_example.items() if set(self.methods) <= ms}
        results = [r for r in results if r["example"] in complete]
        evaluated = len(complete)
        summary = aggregate(results, list(self.methods), metrics, cfg.seed, evaluated)
        summary.failed = failures(results, list(self.methods))
        summary.scores = {n: m.quantity(self.options[n]) for n, m in self.methods.items()}
        summary.skipped = skipped
        summary.protocol = self.protocol.summary(self.settings["aopc_k"], self.settings["aopc_step"])
        self._write(summary, metrics)
        if results:
            write_parquet([parquet_row(r) for r in results], self.out / "results.parquet")
        return summary

    def metric_protocol(self) -> dict[str, Any]:
        """The protocol fields the metrics read (AOPC: grid, score)."""
        return {"grid": self.protocol.grid, "score": self.protocol.score}

    @staticmethod
    def _classes(labels: list[str] | None, encoder: TextEncoder, model: registry.TokenModel) -> int | None:
        """How many classes the model's output has: its declared labels, else one forward."""
        if labels:
            return len(labels)
        try:
            enc = encoder.encode("a")
        except RulegraphError:
            return None
        tokens = registry.Tokens(tuple(enc.inputs["input_ids"][0].tolist()),
                                 tuple(enc.inputs["token_type_ids"][0].tolist()))
        return int(model([tokens]).shape[-1])


    # -- outputs ----------------------------------------------------------------------------
    def _write(self, summary: Summary, metrics: list[M.Metric]) -> None:
        from . import plots
        lines = ["method,metric,mean,ci_low,ci_high,n"]
        for method, per in summary.table.items():
            for metric, s in per.items():
                lines.append(f"{method},{metric},{s['mean']:.6g},{s['low']:.6g},{s['high']:.6g},{s['n']}")
        (self.out / "table.csv").write_text("\n".join(lines) + "\n")
        doc = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "config": {**asdict(self.config), "settings": self.settings},
            "removal": self.protocol.removal,
            "protocol": {"name": self.config.protocol, **self.protocol.fields(), "aopc_grid": list(self.grid),
                         "description": P.PROTOCOLS.get(self.config.protocol).description,
                         "summary": summary.protocol},
            "skipped": {"texts": summary.skipped, "min_length": self.protocol.min_length},
            "interval": f"95% percentile bootstrap over examples ({BOOTSTRAP} resamples, seed {self.config.seed})",
            "n_examples": summary.n_examples,
            "table": summary.table,
            "higher_is_better": {m.name: m.higher_is_better for m in metrics},
            "curves": summary.curves,
            "curve_x": {m.name: m.xs() for m in metrics if m.xs()},
            "throughput": summary.throughput,
            "timing": TIMING,
            "scores": summary.scores,
            "failed": summary.failed,
        }
        (self.out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
        plots.curves(summary, metrics, self.out / "curves.png", {n: m.reference for n, m in self.methods.items()})
        plots.conservation(summary, {n: m.additive for n, m in self.methods.items()}, self.out / "conservation.png")


def method_options(config: Config, methods: dict[str, registry.Method]) -> dict[str, dict[str, Any]]:
    """Each method's resolved options (seeded methods get the run's seed unless given one)."""
    out = {}
    for name, m in methods.items():
        opts = dict(config.options.get(name, {}))
        if m.seeded and "seed" not in opts:
            opts["seed"] = config.seed
        out[name] = m.resolve(opts)
    return out


def failed_row(row: Row, method: str, error: str, tokens: int = 0) -> dict:
    """The row of a text a method could not be evaluated on: counted in the summary, never silent."""
    return {"example": row.index, "method": method, "tokens": tokens, "label": row.label, "error": error}


def parquet_row(row: dict) -> dict:
    """A results row with its metrics and curves as columns (``metric.<name>``, ``curve.<name>``)."""
    flat = {k: v for k, v in row.items() if k not in ("metrics", "curves")}
    flat.setdefault("error", None)
    flat.update({f"metric.{k}": v for k, v in row.get("metrics", {}).items()})
    flat.update({f"curve.{k}": v for k, v in row.get("curves", {}).items()})
    return flat


class EvalWorker:
    """What runs on a worker: the model loaded once, then ``(method, examples) → rows``, one per
    example (a text the method fails on is a row with its ``error``)."""

    def __init__(self, config: Config):
        self.config = cfg = config
        self.graph = load(cfg.model)
        encoder = TextEncoder.for_model(self.graph, cfg.model, cfg.tokenizer)
        self.vocab = registry.Vocab.from_tokenizer(encoder.tokenizer)
        pr = cfg.resolved()
        settings = cfg.all_settings()
        removal = M.Removal(pr.removal, self.vocab.replacement(pr.removal), self.vocab.unk, pr.count, pr.min_count)
        self.metrics = M.build(cfg.metrics, removal, settings, {"grid": pr.grid, "score": pr.score})
        self.model = registry.TokenModel(self.graph, device=cfg.device, dtype=_dtype(cfg.dtype), pad_id=self.vocab.pad,
                                         batch_tokens=cfg.batch_tokens, runtime=cfg.runtime)
        self.methods = {name: registry.get(name) for name in cfg.methods}
        self.options = method_options(cfg, self.methods)
        self.warm: set[str] = set()             # methods called once already (untimed)
        self.warm_model = False

    def __call__(self, payload: tuple[str, list[Example], bool]) -> list[dict]:
        """``(method, examples, next_token)``: with ``next_token`` (a causal LM, one text) the
        method explains the last position."""
        name, pending, next_token = payload
        method = self.methods[name]
        try:
            return self._evaluate(method, pending, next_token)
        except Exception:       # noqa: BLE001 — which texts fail is found one by one below
            return [self._evaluate_one(method, e, next_token) for e in pending]

    def _evaluate_one(self, method, example: Example, next_token: bool) -> dict:
        """One text alone; a failure is recorded as that text's row (``error``), and counted in the summary."""
        try:
            return self._evaluate(method, [example], next_token)[0]
        except Exception as exc:    # noqa: BLE001 — recorded per text, reported in the summary, never silent
            why = str(exc).splitlines()[0] if str(exc) else ""
            why = why if isinstance(exc, RulegraphError) else f"{type(exc).__name__}: {why}"
            return failed_row(example.row, method.name, why, example.length)

    def _evaluate(self, method, pending: list[Example], next_token: bool = False) -> list[dict]:
        cfg, graph, vocab, metrics, model = self.config, self.graph, self.vocab, self.metrics, self.model
        feeds, special = batch_feeds(graph, pending, vocab.pad or 0)
        ids = feeds[registry.token_input(graph)]
        position = ids.shape[1] - 1 if next_token else None      # one text per task then
        if method.name not in self.warm:    # one untimed call first: the timing leaves out the warm-up
            registry.explain_with(graph, method, {k: v[:1] for k, v in feeds.items()}, device=cfg.device,
                                  dtype=_dtype(cfg.dtype), special=special[:1], vocab=vocab, audit=False,
                                  position=position, **self.options[method.name])
            self.warm.add(method.name)
        started = time.perf_counter()
        explanation = registry.explain_with(graph, method, feeds, device=cfg.device, dtype=_dtype(cfg.dtype),
                                            special=special, vocab=vocab, audit=False, position=position,
                                            **self.options[method.name])
        explain_seconds = time.perf_counter() - started
        scores = token_scores(explanation, ids.shape, method.name)
        cases = []
        for b, e in enumerate(pending):
            n = e.length
            cases.append(M.Case(example_tokens(e), e.encoded.special, scores[b, :n].tolist(), explanation.target[b],
                                e.row.label, e.encoded.word_ids, e.answer))
        wanted = list(dict.fromkeys(seq for case in cases for metric in metrics for seq in metric.inputs(case)))
        if wanted and not self.warm_model:  # the metrics' model too (a session to open, a plan to prepare)
            model(wanted[:1])
            self.warm_model = True
        started = time.perf_counter()
        logits = dict(zip(wanted, model(wanted))) if wanted else {}
        metric_seconds = time.perf_counter() - started
        rows = []
        for b, (e, case) in enumerate(zip(pending, cases)):
            values, curves = {}, {}
            for metric in metrics:
                result = metric.reduce(case, logits)
                values[metric.name] = result.value
                if result.curve is not None:
                    curves[metric.name] = result.curve
            out = explanation.output_tensor[b]
            out = out if position is None else out[position]
            rows.append({
                "example": e.row.index, "method": method.name, "tokens": e.length, "label": e.row.label,
                "target": explanation.target[b], "prediction": int(out.argmax()),
                "logit": explanation.output_value[b], "relevance_sum": float(scores[b, :e.length].sum()),
                "explain_seconds": explain_seconds / len(pending), "metric_seconds": metric_seconds / len(pending),
                "metrics": values, "curves": curves,
            })
        return rows


def example_tokens(example: Example) -> registry.Tokens:
    """The example's token sequence (ids and token types), as the metrics perturb it."""
    return registry.Tokens(tuple(example.encoded.inputs["input_ids"][0].tolist()),
                           tuple(example.encoded.inputs["token_type_ids"][0].tolist()))


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {cores} cores, {platform.system()} {platform.release()}, torch {torch.__version__}"


def failures(rows: list[dict], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method that failed on some texts: how many (``texts`` of ``of``) and the first error."""
    out = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        bad = [r for r in mine if "error" in r]
        if bad:
            out[method] = {"texts": len(bad), "of": len(mine), "error": bad[0]["error"],
                           "examples": [r["example"] for r in bad]}
    return out


def bootstrap(values: list[float], seed: int, resamples: int = BOOTSTRAP) -> tuple[float, float, float]:
    """Mean and 95% percentile-bootstrap interval."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (resamples, len(v)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(v.mean()), float(low), float(high)


def aggregate(rows: list[dict], methods: list[str], metrics: list[M.Metric], seed: int, n_examples: int) -> Summary:
    table: dict[str, dict[str, dict[str, float]]] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    throughput: dict[str, dict[str, float]] = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method and "error" not in r]
        if not mine:
            continue
        table[method] = {}
        for metric in metrics:
            values = [r["metrics"].get(metric.name) for r in mine]
            values = [v for v in values if v is not None]
            if not values:
                continue
            mean, low, high = bootstrap(values, seed)
            table[method][metric.name] = {"mean": mean, "low": low, "high": high, "n": len(values)}
            series = [r["curves"][metric.name] for r in mine if metric.name in r.get("curves", {})]
            if series:
                curves.setdefault(metric.name, {})[method] = np.mean(np.asarray(series, dtype=np.float64), 0).tolist()
        explain = sum(r["explain_seconds"] for r in mine)
        total = explain + sum(r["metric_seconds"] for r in mine)
        throughput[method] = {
            "examples": len(mine), "mean_tokens": float(np.mean([r["tokens"] for r in mine])),
            "explain_seconds": explain, "metric_seconds": total - explain,
            "explain_per_minute": 60 * len(mine) / explain if explain else float("inf"),
            "evaluated_per_minute": 60 * len(mine) / total if total else float("inf"),
        }
    return Summary(table, curves, throughput, n_examples, rows)


def table_rows(summary: Summary, metrics: list[M.Metric], cell, bold):
    """(shown metrics, [(method, cells)]): each cell ``cell(stats)``, the best mean per metric
    passed through ``bold``, ``–`` where a method has no figure."""
    shown = [m for m in metrics if any(m.name in per for per in summary.table.values())]
    best = {}
    for m in shown:
        means = {k: per[m.name]["mean"] for k, per in summary.table.items() if m.name in per}
        best[m.name] = (max if m.higher_is_better else min)(means, key=means.get)
    rows = [(method, ["–" if m.name not in per else bold(cell(per[m.name])) if best[m.name] == method
                      else cell(per[m.name]) for m in shown])
            for method, per in summary.table.items()]
    return shown, rows


def header(m: M.Metric) -> str:
    """A metric's column head: its name and direction."""
    return f"{m.name} {m.direction()}"


def markdown_table(summary: Summary, metrics: list[M.Metric]) -> str:
    """The same table in Markdown (for docs)."""
    shown, rows = table_rows(summary, metrics, lambda s: f"{s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]",
                        lambda text: f"**{text}**")
    lines = ["| method | " + " | ".join(map(header, shown)) + " |", "|" + "---|" * (len(shown) + 1)]
    lines += [f"| {method} | " + " | ".join(cells) + " |" for method, cells in rows]
    return "\n".join(lines)
