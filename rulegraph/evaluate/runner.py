"""The evaluation runner: explain a data set with several methods, score every explanation
with the faithfulness metrics, and aggregate.

An evaluation is a dataset job (:mod:`rulegraph.scale.job`: the output folder started, resumed
or refused by its settings, length-bucketed batches × methods as tasks on an engine, one JSON
line per text × method appended to ``results.jsonl``) whose worker, :class:`EvalWorker`, also
scores each explanation: every distinct perturbed sequence the metrics ask for is run once per
method and batch, through one plan (or onnxruntime). Deterministic: the same batches on every
engine, rows ordered by example before aggregation, seeded random baseline and bootstrap.
``results.parquet`` holds the rows at the end; :mod:`.summary` aggregates and writes the rest.

The runner holds data only: what it has to say while running (notes, progress) goes to a
:class:`~rulegraph.scale.listener.Listener`, which the command line (``rulegraph.cli.evaluate``)
draws in the terminal.

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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import methods
from ..errors import InputError, RulegraphError, choices
from ..loaders import load
from ..methods.sequences import fixed_batch
from ..passes.base import decided, labels as model_labels
from ..scale import Engine, engine as make_engine
from ..scale.data import Example, Row, encode, read_rows
from ..scale.job import DTYPES, Folder, Job, Worker, contents, is_causal, method_options, on_workers, read_files
from ..scale.journal import write_parquet
from ..scale.listener import Listener
from ..text import TextEncoder
from . import metrics as M
from . import paired
from . import protocols as P
from .summary import BOOTSTRAP, Summary, aggregate, failures, parquet_row, write

RESULTS = "results.jsonl"
OUTPUTS = ("table.csv", "summary.json", "curves.png", "conservation.png", "results.parquet", "paired.csv")


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
        return {**contents(self.model, self.data, self.tokenizer), "metrics": list(self.metrics), "options": self.options, "removal": self.resolved().removal,
                "settings": self.all_settings(), "seed": self.seed, "dtype": self.dtype,
                **self.resolved().identity()}

    def options_by_method(self) -> dict[str, dict[str, Any]]:
        """Name → the options given for it, in ``methods`` order (the worker's view of the settings); a
        ``LABEL=METHOD`` method's options may be given under its label."""
        return {name: self.options.get(name, self.options.get(name.partition("=")[0], {})) for name in self.methods}

    def all_settings(self) -> dict[str, Any]:
        """Every metric option: those given, else the protocol's (e.g. ``steps``), else the default."""
        return M.settings({**P.PROTOCOLS.get(self.protocol).settings, **self.settings})


class Evaluation:
    """An evaluation of ``config`` into the folder ``out``: ``listener`` gets the notes and, unless
    ``progress=False`` (``rulegraph evaluate -q``), the progress (:class:`~rulegraph.scale.listener.Listener`)."""

    def __init__(self, config: Config, out: Path, *, force: bool = False, listener: Listener | None = None,
                 progress: bool = True, engine: Engine | None = None, pairs: str | list[str] | None = None):
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
            raise InputError(f"no methods given; {choices(methods.names())}")
        self.methods = {name: methods.get(name) for name in config.methods}
        labels = {name.partition("=")[0] for name in self.methods}
        for name in config.options:
            if name not in self.methods and name not in labels:
                raise InputError(f"options given for {name!r}, which is not among --methods "
                                 f"({', '.join(config.methods)})")
        self.options = method_options(config.options_by_method(), config.seed)
        # paired differences A − B to report (--paired), checked against the methods before any work
        self.pairs = paired.parse_pairs(pairs, config.methods) if pairs else []
        self.failed: dict[str, dict[str, Any]] = {}     # method → texts it failed on (see failures())
        self.job = Job(Folder(self.out, RESULTS, OUTPUTS, "results"), list(self.methods), self.engine, self.listener)

    def metric_protocol(self) -> dict[str, Any]:
        """The protocol fields the metrics read (AOPC: grid, score)."""
        return {"grid": self.protocol.grid, "score": self.protocol.score}

    def metrics(self, vocab: methods.Vocab | None = None) -> list[M.Metric]:
        """The metrics under this evaluation's protocol (``vocab``: the ids the removal uses)."""
        pr = self.protocol
        removal = M.Removal(pr.removal) if vocab is None else \
            M.Removal(pr.removal, vocab.replacement(pr.removal), vocab.unk, pr.count, pr.min_count)
        return M.build(self.config.metrics, removal, self.settings, self.metric_protocol())

    def run(self, compute: bool = True) -> Summary:
        """Evaluate what ``results.jsonl`` lacks (``compute=False``: nothing), then aggregate all of it.

        Everything the user gave is read and checked first (model, tokenizer, texts, labels):
        a problem there is an error before any file is written."""
        cfg, pr = self.config, self.protocol
        if compute:
            self.engine.check(cfg.device)
        torch.manual_seed(cfg.seed)
        graph = load(cfg.model)
        encoder = TextEncoder.for_model(graph, cfg.model, cfg.tokenizer)
        vocab = methods.Vocab.from_tokenizer(encoder.tokenizer)
        labels = model_labels(graph)
        rows = read_rows(Path(cfg.data), labels, cfg.n, classes=self._classes(labels, graph, encoder))
        examples, truncated = encode(rows, encoder)
        skipped = sum(e.length < pr.min_length for e in examples)
        examples = [e for e in examples if e.length >= pr.min_length]
        if skipped:
            self.listener.note(f"{skipped} of {skipped + len(examples)} texts have fewer than {pr.min_length} tokens "
                               f"and are skipped (protocol {cfg.protocol})")
        if not examples:
            raise InputError(f"every text has fewer than {pr.min_length} tokens (--min-length); nothing to evaluate")
        for metric in self.metrics():
            if metric.needs == "answer" and not any(e.answer is not None for e in examples):
                raise InputError(f"metric {metric.name!r} scores span-QA answers: no record of {cfg.data} has an "
                                 "`answer` found in its text; drop it from --metrics, or give answers")
        description = {"protocol": {"name": cfg.protocol, **pr.fields(), "aopc_grid": list(self.grid)}}
        rule_sets = {name: m for name, m in self.methods.items() if m.rule_set}
        rule_files = [m.rules for m in rule_sets.values() if isinstance(m.rules, str)
                      and Path(m.rules).suffix in (".yaml", ".yml")]
        # what each rule set decides on the model: a folder's rows of a rule file changed since are not resumed
        members = {name: decided(graph, m.ruleset()) for name, m in rule_sets.items()}
        self.job.open(cfg.identity(), description, self.force, read_files(cfg.model, cfg.data, cfg.tokenizer,
                                                                           *rule_files), members)
        try:
            return self._run(graph, encoder, vocab, rows, examples, truncated, skipped, compute)
        finally:
            self.job.close()

    def _run(self, graph, encoder: TextEncoder, vocab, rows: list[Row], examples: list[Example], truncated: int,
             skipped: int, compute: bool) -> Summary:
        """The open job's work: the results the journal lacks, then the aggregate and its files."""
        cfg, pr = self.config, self.protocol
        bad = [r for r in rows if r.problem]
        self.job.record(failed_row(r, name, r.problem) for r in bad for name in self.methods
                        if (r.index, name) not in self.job.done)
        if bad:
            self.listener.note(f"{len(bad)} records cannot be read and are failed rows (first: {bad[0].problem})",
                               "error")
        if truncated:
            self.listener.note(f"{truncated} of {len(examples)} texts truncated to {encoder.max_length} tokens")
        tasks = self.job.tasks(examples, min(cfg.batch, fixed_batch(graph) or cfg.batch), cfg.batch_tokens,
                               is_causal(graph, examples[0], cfg.device))
        self.job.run(functools.partial(EvalWorker, on_workers(cfg)), tasks if compute else [], failed_row,
                     total=len(examples) * len(self.methods), progress=self.show_progress)
        results = self.job.rows({e.row.index for e in examples} | {r.index for r in bad})
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
        metrics = self.metrics(vocab)
        summary = aggregate(results, list(self.methods), metrics, cfg.seed, len(complete))
        unscored = [m.name for m in metrics if not any(m.name in per for per in summary.table.values())]
        if results and len(unscored) == len(metrics):
            raise InputError(f"no metric scored any text ({', '.join(unscored)}): nothing to report; see "
                             "`rulegraph evaluate --help` for what each metric needs")
        if unscored:
            self.listener.note(f"{', '.join(unscored)} scored no text (e.g. word-deletion counts only texts the model "
                               "gets right); left out of the table", "error")
        summary.failed = failures(results, list(self.methods))
        summary.scores = {n: m.units(self.options[n]) for n, m in self.methods.items()}
        summary.skipped = skipped
        summary.protocol = pr.summary(self.settings["aopc_k"], self.settings["aopc_step"])
        if self.pairs:
            summary.paired = paired.table(results, self.pairs, [m.name for m in metrics], cfg.seed)
        write(self.out, summary, metrics, self._context(summary), self.methods)
        if results:
            write_parquet([parquet_row(r) for r in results], self.out / "results.parquet")
        return summary

    def _context(self, summary: Summary) -> dict[str, Any]:
        """What ``summary.json`` says of the settings and the protocol."""
        cfg, pr = self.config, self.protocol
        shown = {k: v for k, v in self.settings.items() if pr.grid is None or k not in P.GRID_SETTINGS}
        return {
            "config": {**asdict(cfg), "settings": shown},
            "removal": pr.removal,
            "protocol": {"name": cfg.protocol, **pr.fields(), "aopc_grid": list(self.grid),
                         "overrides": pr.overrides(), "description": pr.describe(), "summary": summary.protocol},
            "skipped": {"texts": summary.skipped, "min_length": pr.min_length},
            "interval": f"95% percentile bootstrap over examples ({BOOTSTRAP} resamples, seed {cfg.seed})",
        }

    def _classes(self, labels: list[str] | None, graph, encoder: TextEncoder) -> int | None:
        """How many classes the model's output has: its declared labels, else one forward."""
        if labels:
            return len(labels)
        try:
            enc = encoder.encode("a")
        except RulegraphError:
            return None
        model = methods.TokenModel(graph, device=self.config.device, dtype=DTYPES[self.config.dtype])
        tokens = methods.Tokens(tuple(enc.inputs["input_ids"][0].tolist()),
                                 tuple(enc.inputs["token_type_ids"][0].tolist()))
        return int(model([tokens]).shape[-1])


def failed_row(row: Row, method: str, error: str, example: Example | None = None) -> dict:
    """The row of a text a method could not be evaluated on: counted in the summary, never silent."""
    return {"example": row.index, "method": method, "tokens": example.length if example else 0, "label": row.label,
            "error": error}


class EvalWorker(Worker):
    """A worker of an evaluation: each example explained, then scored by the metrics."""

    def __init__(self, config: Config):
        super().__init__(config)
        pr = config.resolved()
        removal = M.Removal(pr.removal, self.vocab.replacement(pr.removal), self.vocab.unk, pr.count, pr.min_count)
        self.metrics = M.build(config.metrics, removal, config.all_settings(), {"grid": pr.grid, "score": pr.score})
        self.model = methods.TokenModel(self.graph, device=config.device, dtype=self.dtype, pad_id=self.vocab.pad,
                                         batch_tokens=config.batch_tokens, runtime=config.runtime,
                                         zeroed=pr.removal == "zero")
        self.warm_model = False

    def failed(self, row: Row, method: str, error: str, example: Example | None = None) -> dict:
        return failed_row(row, method, error, example)

    def rows(self, name: str, pending: list[Example], next_token: bool) -> list[dict]:
        x = self.explain(name, pending, next_token)
        explanation, metrics, model = x.explanation, self.metrics, self.model
        cases = [M.Case(example_tokens(e), e.encoded.special, x.scores[b, :e.length].tolist(),
                        explanation.target[b], e.row.label, e.encoded.word_ids, e.answer)
                 for b, e in enumerate(pending)]
        wanted = list(dict.fromkeys(seq for case in cases for metric in metrics for seq in metric.inputs(case)))
        if wanted and not self.warm_model:  # the metrics' model too (a session to open, a plan to prepare)
            model(wanted[:1])
            self.warm_model = True
        started = time.perf_counter()
        logits = dict(zip(wanted, model(wanted))) if wanted else {}
        metric_seconds = time.perf_counter() - started
        rows = []
        for b, (e, case) in enumerate(zip(pending, cases, strict=True)):
            values, curves = {}, {}
            for metric in metrics:
                result = metric.reduce(case, logits)
                values[metric.name] = result.value
                if result.curve is not None:
                    curves[metric.name] = result.curve
            out = explanation.output_at(x.position)[b]
            rows.append({
                "example": e.row.index, "method": name, "tokens": e.length, "label": e.row.label,
                "target": explanation.target[b], "prediction": int(out.argmax()),
                "logit": explanation.output_value[b], "relevance_sum": float(x.scores[b, :e.length].sum()),
                "explain_seconds": x.seconds / len(pending), "metric_seconds": metric_seconds / len(pending),
                "metrics": values, "curves": curves,
            })
        return rows


def example_tokens(example: Example) -> methods.Tokens:
    """The example's token sequence (ids and token types), as the metrics perturb it."""
    return methods.Tokens(tuple(example.encoded.inputs["input_ids"][0].tolist()),
                           tuple(example.encoded.inputs["token_type_ids"][0].tolist()))
