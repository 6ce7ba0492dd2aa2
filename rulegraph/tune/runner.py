"""A tuning run: split the data once, search on ``tune``, choose on ``validation``, report on ``test``.

Each trial's choice (:meth:`~rulegraph.tune.space.Space.sample`) is written as a rule file
(``DIR/trials/NNNN.yaml``, derived from the starting rule set) and scored by the evaluation
(:class:`rulegraph.evaluate.runner.Evaluation`, as ``rulegraph evaluate`` scores a method) on the
tune part, its results kept in ``DIR/evals/tune-NNNN`` (so an interrupted trial resumes too). A trial
whose rule set binds the model's nodes to the rules an earlier finished trial's did
(:meth:`~rulegraph.ruleset.Binding.fingerprint`: the sampler often returns to the best choice, e.g. the
z-rule, once its random start-up is over; and a choice for nodes the model lacks changes nothing) takes
that trial's score and audit, not a second evaluation of the same rules (``same_as`` in
``trials.parquet``). A study resumes where the starting rule file's text changed but binds the model's
nodes as before, and where the space file's text changed but samples the same (:meth:`Space.digest`). Its
conservation is audited on a few texts of the tune part (:mod:`rulegraph.audit`): a trial whose
constants absorb more than ``max_leak`` of the explained value, or whose rules break conservation
where they claim to conserve (the audit's unexpected breaks), or — with ``conserving`` — break it
at all, is flagged, reported and not chosen. The best ``finalists`` trials of the tune part are
scored on the validation part; the best there is the tuned rule set, scored once on the test part
against the starting rule set and any other given (``against``, e.g. the best shipped one): the
paired difference per text, 95 % bootstrap interval (:mod:`rulegraph.evaluate.paired`).

Outputs in ``DIR``: ``study.db`` (the Optuna study), ``split.csv`` and ``data/``, ``trials/``,
``evals/``, ``tuned.yaml`` (a rule file with a header saying what it was tuned on, the metric,
the split sizes and the test figures), ``trials.parquet``, ``trials.png`` and ``tune.json``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, RuleFileError, choices, read_text
from ..files import FolderLock, write_file
from ..passes.base import decided
from ..scale.listener import Listener
from . import search
from .space import Space, default_space, load as load_space, rounded, space_path as resolve_space
from .split import FRACTIONS, PARTS, read_records, split as split_records

#: files a run writes in DIR (checked before any work)
OUTPUTS = ("tuned.yaml", "trials.parquet", "trials.png", "tune.json", "split.csv", "study.db")
#: the audit's breaks (a share of the explained value) a conserving run allows: rounding
BREAK_TOLERANCE = 1e-3


@dataclass
class Settings:
    """Everything a tuning run is given."""

    model: str
    data: str
    start: str                      # the starting rule set: a shipped name or a YAML path (--from)
    metric: str
    out: str
    protocol: str = "default"
    space: str | None = None        # a search-space YAML or a shipped space's name; None: the start's models' one
    trials: int = 20
    seed: int = 0
    split: tuple[float, float, float] = FRACTIONS
    finalists: int = 3
    conserving: bool = False
    max_leak: float = 0.5
    audit_texts: int = 4
    prune: bool = False
    tokenizer: str | None = None
    batch: int = 16
    device: str = "cpu"
    dtype: str = "float32"
    force: bool = False
    against: list[str] = field(default_factory=list)     # more rule sets compared with the tuned one on test
    settings: dict[str, Any] = field(default_factory=dict)      # metric options (as rulegraph evaluate's)


@dataclass
class Result:
    """What a run found: the tuned trial, its figures on each part, the paired difference on test."""

    trial: int
    tune: float
    validation: dict[int, float]
    test: dict[str, dict[str, float]]       # method → {mean, low, high, n}
    paired: dict[str, float]                # tuned − start: mean, low, high, n
    sizes: dict[str, int]
    flagged: dict[int, str]
    path: Path
    against: dict[str, dict[str, float]] = field(default_factory=dict)     # label → tuned − it, as ``paired``


class TuneListener(Listener):
    """What a tuning run says (the command line prints it): each trial as it ends, and the phases."""

    def trial(self, number: int, value: float | None, state: str, params: dict[str, Any], flag: str,
              error: str) -> None:
        """A trial ended (``state``: complete, pruned, fail); ``flag``: why the audit flagged it; ``error``: why
        it failed."""


class Tuning:
    """One tuning run of :class:`Settings` (see the module docstring)."""

    def __init__(self, settings: Settings, listener: TuneListener | None = None, engine=None):
        """``engine``: where each evaluation's texts are explained and scored (:mod:`rulegraph.scale`; default
        this process); the figures do not depend on it."""
        from ..evaluate import metrics as M
        from ..evaluate import protocols as P
        from ..ruleset import RuleSet
        from ..rules import shipped_rule_sets
        search.optuna()             # missing: an error naming the extra, before any work
        self.s = settings
        self.engine = engine
        self.listener = listener or TuneListener()
        self.out = Path(settings.out)
        if settings.metric not in M.METRICS:
            raise InputError(f"unknown metric {settings.metric!r}; {choices(M.METRICS, settings.metric)}")
        self.higher = M.METRICS.get(settings.metric).higher_is_better
        P.PROTOCOLS.get(settings.protocol)
        self.start = RuleSet.load(settings.start)
        shipped = shipped_rule_sets(None)
        self.start_path = shipped[settings.start] if settings.start in shipped else Path(settings.start)
        self.start_text = read_text(self.start_path, "rule file", RuleFileError)
        self.start_label = settings.start if settings.start in shipped else f"start={settings.start}"
        space_path = resolve_space(settings.space) if settings.space else default_space(self.start.models)
        self.space_text = read_text(Path(space_path), "search space", RuleFileError)
        space = load_space(space_path)
        self.space_content = space.digest()
        if space.pass_name != self.start.pass_name:
            raise InputError(f"the search space {space_path} is for the {space.pass_name} pass, the rule set "
                             f"{settings.start} for the {self.start.pass_name} pass")
        self.space: Space = space.conserving() if settings.conserving else space
        self.records = read_records(Path(settings.data))
        #: label → method of the rule sets compared on test besides the start (a shipped name, or against1=PATH)
        self.against: dict[str, str] = {}
        for k, name in enumerate(settings.against, 1):
            RuleSet.load(name)
            label = name if name in shipped else f"against{k}"
            if label in (self.start_label.partition("=")[0], *self.against):
                raise InputError(f"--against {name} is the starting rule set or given twice")
            self.against[label] = name

    # ---- the run ------------------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What decides a study's numbers: a resumed run must match it."""
        from ..scale.job import contents
        def sha(text: str) -> str:
            return hashlib.sha256(text.encode()).hexdigest()
        s = self.s
        return {**contents(s.model, s.data, s.tokenizer), "start": sha(self.start_text),
                "start_rules": decided(self.graph, self.start), "space": sha(self.space_text),
                "space_content": self.space_content,
                "metric": s.metric, "protocol": s.protocol, "seed": s.seed, "split": list(s.split),
                "conserving": s.conserving, "max_leak": s.max_leak, "audit_texts": s.audit_texts, "prune": s.prune,
                "settings": s.settings, "dtype": s.dtype}

    def run(self) -> Result:
        """The run in ``DIR``, locked against a second run there (:class:`~rulegraph.files.FolderLock`)."""
        self.out.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(self.out, "a tuning study")
        lock.acquire()
        try:
            return self._run()
        finally:
            lock.release()

    def _run(self) -> Result:
        s = self.s
        if s.force:
            for name in ("study.db", "trials", "evals", "data"):
                target = self.out / name
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        from ..loaders import load
        self.graph = load(s.model)
        # the study first: one of other settings is refused before anything in DIR changes (the split is
        # a function of the settings it checks: the data by content, the seed, the shares). A starting rule
        # file whose text changed resumes where it binds the model's nodes to the same rules, a space whose
        # text changed where it samples the same (Space.digest).
        study = search.open_study(f"sqlite:///{self.out / 'study.db'}", "maximize" if self.higher else "minimize",
                                  self.identity(), s.prune, equivalent={"start": "start_rules",
                                                                        "space": "space_content"})
        parts = split_records(self.records, s.seed, s.split)
        self.paths = parts.write(self.out)
        self.sizes = parts.sizes()
        self.listener.note(f"split (seed {s.seed}): " + ", ".join(f"{p} {n}" for p, n in self.sizes.items()))
        done = search.counted(study)
        if done:
            self.listener.note(f"resuming the study in {self.out / 'study.db'}: {done} of {s.trials} trials done")
        self.space = self.space.at_depth(self.graph.block_count)       # depth ranges as this model's blocks
        inert = self.space.inert(self.graph, self.start_text)
        self.inert = [name for name, _ in inert]
        for name, line in inert:
            self.listener.note(f"{self.space.source}:{line}: {name} changes no rule of this model's nodes (none is "
                               "selected, or an earlier entry of the starting rule set or a per_layer item takes "
                               "them): its samples cannot move a score", "warning")
        self.audit_texts = [str(r.get("text") or r.get("context")) for r in
                            (parts.records[i] for i in parts.parts["tune"][:s.audit_texts])]
        (self.out / "trials").mkdir(exist_ok=True)
        search.optimize(study, self.space, self.objective, s.trials, s.seed, self.said)
        ranked = search.finished(study)
        repeats = sum("same_as" in t.user_attrs for t in ranked)
        if repeats:
            self.listener.note(f"{repeats} of {len(ranked)} finished trials bound the model's nodes to the rules of "
                               f"an earlier trial (its score taken, no evaluation): {len(ranked) - repeats} distinct "
                               "rule sets were scored; repeats cost nothing, so more --trials explore more")
        if not ranked:
            errors = [t.user_attrs.get("error") for t in study.trials if t.user_attrs.get("error")]
            raise InputError("no trial finished" + (f" (first error: {errors[0]})" if errors else ""))
        flagged = {t.number: t.user_attrs["flag"] for t in ranked if t.user_attrs.get("flag")}
        clean = [t for t in ranked if t.number not in flagged]
        if not clean:
            self.listener.note("every finished trial is flagged (see trials.parquet); choosing among them", "error")
        finalists = (clean or ranked)[:s.finalists]
        self.listener.note(f"validation: trials {', '.join(str(t.number) for t in finalists)}")
        validation = self.validate(finalists)
        best = min(finalists, key=lambda t: ((-1 if self.higher else 1) * validation[t.number],
                                             finalists.index(t)))
        self.listener.note(f"test: trial {best.number} against {s.start}")
        test, paired, against = self.test(best.number)
        result = Result(best.number, best.value, validation, test, paired, self.sizes, flagged,
                        self.out / "tuned.yaml", against)
        self.write(study, result, best)
        return result

    def said(self, trial) -> None:
        self.listener.trial(trial.number, trial.value, trial.state.name.lower(), trial.params,
                            trial.user_attrs.get("flag", ""), trial.user_attrs.get("error", ""))

    # ---- a trial ------------------------------------------------------------------------------------

    def rule_text(self, chosen: dict, header: str) -> str:
        name = f"{self.start.name or Path(self.s.start).stem}-tuned"
        description = (f"{self.start.name or self.s.start} with its rules for "
                       f"{', '.join(i.id for i in self.space.items)} chosen by rulegraph tune "
                       f"({self.s.metric} under the {self.s.protocol} protocol).")
        return self.space.rule_text(self.start_text, chosen, name=name, description=description, header=header)

    def objective(self, trial, chosen: dict) -> float:
        from ..ruleset import RuleSet
        path = self.out / "trials" / f"{trial.number:04d}.yaml"
        write_file(path, self.rule_text(chosen, f"rulegraph tune: trial {trial.number} of {self.s.start}"),
                   "a trial's rule file")
        trial.set_user_attr("rules", path.relative_to(self.out).as_posix())     # (the folder can move)
        trial.set_user_attr("choice", chosen)
        ruleset = RuleSet.load(path)
        bound = decided(self.graph, ruleset)
        trial.set_user_attr("rules_bound", bound)
        same = next((t for t in search.finished(trial.study) if t.user_attrs.get("rules_bound") == bound), None)
        if same is not None:            # the model's nodes bound to the same rules as a finished trial's: its score
            trial.set_user_attr("same_as", same.number)
            for key in ("conservation", "flag"):
                if key in same.user_attrs:
                    trial.set_user_attr(key, same.user_attrs[key])
            return same.value
        self.conservation(trial, ruleset)
        records = self.sizes["tune"]
        steps = [max(1, records // 2), records] if self.s.prune and records > 1 else [records]
        value = float("nan")
        for k, n in enumerate(steps):
            value = self.score("tune", f"evals/tune-{trial.number:04d}", {f"trial-{trial.number}": path}, n)[
                f"trial-{trial.number}"]
            if k < len(steps) - 1:
                trial.report(value, k)
                if trial.should_prune():
                    raise search.optuna().TrialPruned()
        return value

    def conservation(self, trial, ruleset) -> None:
        """Audit the trial's rule set on a few tune texts; flag a leak or a break (module docstring)."""
        from ..api import explain
        from ..interpreter import DTYPES
        e = explain(self.graph, ruleset, text=self.audit_texts, tokenizer=self.s.tokenizer, device=self.s.device,
                    dtype=DTYPES[self.s.dtype])
        audit = e.audit
        shares = audit.conservation.summary(items=len(self.audit_texts))
        figures = {"tokens": shares.tokens, "absorbed": shares.absorbed, "breaks": shares.breaks,
                   "unexpected": len(audit.unexpected)}
        trial.set_user_attr("conservation", figures)
        flags = []
        if shares.absorbed is not None and abs(shares.absorbed) > self.s.max_leak:
            flags.append(f"constants absorb {shares.absorbed:+.0%} of the explained value (over {self.s.max_leak:.0%})")
        if audit.unexpected:
            flags.append(f"breaks conservation at {len(audit.unexpected)} nodes whose rules conserve "
                         f"(first: {audit.unexpected[0].name}, rule {audit.unexpected[0].rule})")
        if self.s.conserving and shares.breaks is not None and abs(shares.breaks) > BREAK_TOLERANCE:
            flags.append(f"its rules break conservation by design ({shares.breaks:+.1%} of the explained value)")
        if flags:
            trial.set_user_attr("flag", "; ".join(flags))

    # ---- the evaluations ----------------------------------------------------------------------------

    def evaluation(self, part: str, folder: str, methods: dict[str, Path | str], n: int | None = None):
        """The evaluation of ``methods`` (label → a shipped name or a rule file) on ``part``, in ``DIR/folder``
        (resumed if there); the summary, and each label's method name in its table (``LABEL=PATH``)."""
        from ..evaluate.runner import Config, Evaluation
        names = {label: f"{label}={path}" if label != str(path) else label for label, path in methods.items()}
        config = Config(model=str(self.s.model), data=str(self.paths[part]), methods=list(names.values()),
                        metrics=[self.s.metric], tokenizer=self.s.tokenizer, settings=dict(self.s.settings),
                        seed=self.s.seed, n=n, device=self.s.device, dtype=self.s.dtype, batch=self.s.batch,
                        protocol=self.s.protocol)
        return Evaluation(config, self.out / folder, listener=Quiet(self.listener), progress=False,
                          engine=self.engine).run(), names

    def score(self, part: str, folder: str, methods: dict[str, Path], n: int | None = None) -> dict[str, float]:
        """Label → the mean of the metric on ``part`` (the first ``n`` texts)."""
        summary, names = self.evaluation(part, folder, methods, n)
        out = {}
        for label, name in names.items():
            cell = summary.table.get(name, {}).get(self.s.metric)
            if cell is None:
                why = f" ({summary.failed[name]['error']})" if name in summary.failed else ""
                raise InputError(f"{label}: no text of the {part} part scored on {self.s.metric}{why}")
            out[label] = cell["mean"]
        return out

    def validate(self, finalists: list) -> dict[int, float]:
        methods = {f"trial-{t.number}": self.out / t.user_attrs["rules"] for t in finalists}
        scores = self.score("validation", "evals/validation", methods)
        return {t.number: scores[f"trial-{t.number}"] for t in finalists}

    def test(self, number: int) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, dict[str, float]]]:
        """The tuned trial, the starting rule set and those of ``against`` on the test part: label → {mean, low,
        high, n}; the paired difference tuned − start; and tuned − each of ``against``."""
        from ..evaluate import paired
        tuned, start = f"trial-{number}", self.start_label.partition("=")[0]
        methods = {tuned: self.out / "trials" / f"{number:04d}.yaml",
                   start: self.start_label.partition("=")[2] or self.start_label}
        methods.update(self.against)
        summary, names = self.evaluation("test", "evals/test", methods)
        table = {label: summary.table.get(name, {}).get(self.s.metric, {}) for label, name in names.items()}

        def difference(label: str) -> dict[str, float]:
            d = paired.difference(summary.rows, names[tuned], names[label], self.s.metric, self.s.seed)
            return {"mean": d.mean, "low": d.low, "high": d.high, "n": d.n}
        return table, difference(start), {label: difference(label) for label in self.against}

    # ---- the outputs --------------------------------------------------------------------------------

    def header(self, result: Result) -> str:
        s, t = self.s, result.test
        tuned, start = t[f"trial-{result.trial}"], t[self.start_label.partition("=")[0]]
        sizes = ", ".join(f"{p} {n}" for p, n in result.sizes.items())
        p = result.paired
        return "\n".join([
            f"Tuned by rulegraph tune from {s.start} on {Path(s.model).name} with {Path(s.data).name}.",
            f"Metric: {s.metric} ({'higher' if self.higher else 'lower'} is better), protocol {s.protocol}; "
            f"search space: {s.space or 'the shipped ' + self.start.models + ' space'}"
            f"{' (conserving rules only)' if s.conserving else ''}.",
            f"Split (seed {s.seed}, by a hash of each text): {sizes} texts; trial {result.trial} of {s.trials} chosen "
            f"on validation ({result.validation[result.trial]:.4g}; tune {result.tune:.4g}).",
            f"Test: tuned {tuned.get('mean', float('nan')):.4g}, {s.start} {start.get('mean', float('nan')):.4g}; "
            f"paired difference tuned − {s.start} {p['mean']:+.4g} [95% bootstrap {p['low']:+.4g}, {p['high']:+.4g}] "
            f"over {p['n']} texts.",
            *(f"Against {self.against[label]}: paired difference tuned − it {d['mean']:+.4g} [95% bootstrap "
              f"{d['low']:+.4g}, {d['high']:+.4g}] over {d['n']} texts (it: {t[label].get('mean', float('nan')):.4g})."
              for label, d in result.against.items()),
        ])

    def write(self, study, result: Result, best) -> None:
        text = self.rule_text(best.user_attrs["choice"], self.header(result))
        write_file(self.out / "tuned.yaml", text, "tuned.yaml")
        from ..ruleset import RuleSet
        RuleSet.from_yaml(text, source=str(self.out / "tuned.yaml"))     # loads like any rule file
        rows = trial_rows(study, result)
        from ..scale.journal import write_parquet
        write_parquet(rows, self.out / "trials.parquet")
        from .plots import trials_plot
        trials_plot(rows, self.space.names(), self.s.metric, self.out / "trials.png")
        doc = {"settings": {**asdict(self.s), "out": str(self.s.out)}, "split": result.sizes, "trial": result.trial,
               "tune": result.tune, "validation": {str(k): v for k, v in result.validation.items()},
               "test": result.test, "paired": {f"trial-{result.trial} − {self.start_label.partition('=')[0]}":
                                                result.paired},
               "against": {f"trial-{result.trial} − {label}": d for label, d in result.against.items()},
               "flagged": {str(k): v for k, v in result.flagged.items()}, "inert": self.inert,
               "distinct": len({t.user_attrs.get("rules_bound") for t in search.finished(study)}),
               "interval": f"95% percentile bootstrap over the test texts (seed {self.s.seed})"}
        write_file(self.out / "tune.json", json.dumps(doc, indent=2, default=str) + "\n", "tune.json")


def trial_rows(study, result: Result) -> list[dict]:
    """One row per trial: number, state, value, the sampled params, the conservation figures, flags."""
    rows, stopped = [], set(search.interrupted(study))
    for t in study.trials:
        c = t.user_attrs.get("conservation", {})
        rows.append({"trial": t.number, "state": t.state.name.lower(), "value": t.value,
                     "validation": result.validation.get(t.number), "chosen": t.number == result.trial,
                     **{f"param.{k}": rounded(v) if isinstance(v, float) else v if isinstance(v, int) else str(v)
                        for k, v in t.params.items()},       # as the trial's rule file has them
                     "tokens_share": c.get("tokens"), "absorbed_share": c.get("absorbed"),
                     "breaks_share": c.get("breaks"), "unexpected_breaks": c.get("unexpected"),
                     "flag": t.user_attrs.get("flag"), "error": t.user_attrs.get("error"),
                     "interrupted": t.number in stopped, "rules": t.user_attrs.get("rules"),
                     "same_as": t.user_attrs.get("same_as")})
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]


class Quiet(Listener):
    """An evaluation's listener inside a tuning run: its error notes passed on, the rest silent."""

    def __init__(self, parent: Listener):
        self.parent = parent

    def note(self, text: str, level: str = "info") -> None:
        if level == "error":
            self.parent.note(text, level)
