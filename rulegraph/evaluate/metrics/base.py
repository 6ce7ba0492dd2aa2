"""What every faithfulness metric shares: the example it sees (:class:`Case`), how tokens are
removed (:class:`Removal`), how many a fraction is (:func:`count`), the area under a curve,
and the :class:`Metric` base class with its declarations.

A metric asks for some perturbed versions of an example (:meth:`Metric.inputs`) and turns the
model's logits on them into a value and a curve (:meth:`Metric.reduce`). The runner gathers
the inputs of many examples and metrics, runs each distinct sequence once, in batches, and
hands the logits back; :func:`compute` does the same for one example.

Each metric *declares* what the command line, the runner, the plots and the docs read:
``name`` (its registry key), ``default`` (in the default metric set), ``higher_is_better``
(the direction ↑/↓), ``title`` (plots and tables), ``x_label`` (its curve's axis) and
``options``: typed :class:`~rulegraph.options.Option` s with a default, a help text and a valid
range. An option's ``name`` is its key in the flat settings (``config.json``) and on the command
line (``aopc_k`` → ``--aopc-k``), its ``attr`` the metric's field it sets; metrics that share a
knob (the curve ``steps``) declare the same name, and the declarations must agree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from ...errors import InputError, choices
from ...options import Option
from ...registry import Registry
from ..protocols import count as counting
from ...tokens import Tokens

if TYPE_CHECKING:               # torch is imported where logits are computed, so the declarations
    from torch import Tensor    # (and `rulegraph evaluate --help`) load without it
ModelFn = Callable[[Sequence[Tokens]], "Tensor"]


@dataclass(frozen=True)
class Removal:
    """How removed tokens are treated: replaced by ``token``, or deleted when it is ``None``."""

    mode: str = "mask"
    token: int | None = None
    unk: int | None = None          # the [UNK] id AUAC starts from
    rule: str = "round-half-up"     # how a fraction becomes a count (evaluate.protocols.COUNTS)
    min_count: int = 0              # at least this many at every fraction > 0

    def apply(self, tokens: Tokens, positions) -> Tokens:
        return tokens.remove(positions, self.token)

    @property
    def hidden(self) -> int | None:
        """What AUAC's start puts in place of every token: [UNK] (Ali et al. 2022), a zero embedding under
        ``zero``, nothing (``None``: deleted) under ``delete``."""
        return None if self.token is None else self.token if self.mode == "zero" else self.unk

    def count(self, fraction: float, n: int) -> int:
        """Tokens removed at ``fraction`` of ``n`` under this protocol's counting rule."""
        return counting(self.rule, fraction, n, self.min_count)


@dataclass
class Case:
    """One explained example as the metrics see it."""

    tokens: Tokens
    special: Sequence[bool]
    scores: Sequence[float]          # one per position
    target: int                      # the explained class ŷ
    label: int | None = None
    words: Sequence[int | None] | None = None   # word index per token (None: special)
    answer: Sequence[bool] | None = None        # answer-span positions (span QA)

    @property
    def removable(self) -> list[int]:
        return [i for i, s in enumerate(self.special) if not s]

    def most_relevant_first(self) -> list[int]:
        return sorted(self.removable, key=lambda i: (-self.scores[i], i))

    def least_relevant_first(self) -> list[int]:
        """Removable positions, lowest (most negative) score first; ties by position."""
        return sorted(self.removable, key=lambda i: (self.scores[i], i))

    def least_abs_first(self) -> list[int]:
        return sorted(self.removable, key=lambda i: (abs(self.scores[i]), i))


@dataclass
class Result:
    value: float | None
    curve: list[float] | None = None


def count(fraction: float, n: int) -> int:
    """Tokens in a fraction of ``n``: ⌊f·n + ½⌋."""
    return min(n, int(math.floor(fraction * n + 0.5)))


def area(ys: Sequence[float], xs: Sequence[float]) -> float:
    """Trapezoid area under ``ys`` over ``xs``."""
    return float(sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(xs) - 1)))


def logp(logits: Tensor, target: int) -> float:
    """log p(target) under the softmax of ``logits``, in float64."""
    import torch
    return float(torch.log_softmax(logits.double(), -1)[target])


def quantity(logits: Tensor, target: int, score: str = "probability") -> float:
    """The explained class's ``probability``, ``logit`` or ``log-odds`` log(p / (1 − p)) under ``logits``
    (a protocol's ``score``, evaluate/protocols.py), in float64."""
    if score == "logit":
        return float(logits[target])
    lp = logp(logits, target)
    if score == "log-odds":
        return lp - math.log(-math.expm1(lp)) if lp < 0 else math.inf
    return math.exp(lp)


def correct(logits: Tensor, reference: int) -> float:
    return float(int(logits.argmax()) == reference)


def reference(case: Case, logits: dict[Tokens, Tensor]) -> int:
    """The class "accuracy" compares with: the label, or the prediction on the full input."""
    return case.label if case.label is not None else int(logits[case.tokens].argmax())


@dataclass
class Metric:
    """Base class of the metrics; see the module docstring for the declarations."""

    removal: Removal = field(default_factory=Removal)

    name: ClassVar[str] = ""
    default: ClassVar[bool] = True
    higher_is_better: ClassVar[bool] = True
    title: ClassVar[str] = ""
    x_label: ClassVar[str] = ""
    #: what a record must give for the metric to score it (``"answer"``: span QA), else None
    needs: ClassVar[str | None] = None
    options: ClassVar[tuple[Option, ...]] = ()
    protocol: ClassVar[tuple[str, ...]] = ()    # protocol fields it reads (grid, score), passed by build()

    def __post_init__(self):
        for o in self.options:
            setattr(self, o.attribute, o.parse(getattr(self, o.attribute), f"{self.title or self.name}: {o.flag}"))

    @classmethod
    def from_settings(cls, removal: Removal, settings: dict[str, Any], protocol: dict[str, Any] | None = None) -> "Metric":
        """This metric with its options read from the flat settings (missing keys: the defaults) and
        the protocol fields it declares from ``protocol``."""
        extra = {k: v for k, v in (protocol or {}).items() if k in cls.protocol}
        return cls(removal, **{o.attribute: settings.get(o.name, o.default) for o in cls.options}, **extra)

    @classmethod
    def direction(cls) -> str:
        return "↑" if cls.higher_is_better else "↓"

    def xs(self) -> list[float]:
        raise NotImplementedError

    def inputs(self, case: Case) -> list[Tokens]:
        raise NotImplementedError

    def reduce(self, case: Case, logits: dict[Tokens, Tensor]) -> Result:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} ({'higher' if self.higher_is_better else 'lower'} is better)"


#: Metric name → class, in the order of the import list of ``evaluate/metrics/__init__.py``.
METRICS: Registry[type[Metric]] = Registry("metric", InputError)


def metric(name: str):
    """Register a :class:`Metric` subclass under ``name``; its option keys must agree with
    those other metrics already declared under the same key."""
    def register(cls: type[Metric]) -> type[Metric]:
        declared = all_options()
        for o in cls.options:
            other = declared.get(o.name)
            if other is not None and (other.type, other.default, other.low, other.high) != \
                    (o.type, o.default, o.low, o.high):
                raise RuntimeError(f"metric {name!r} declares option {o.name!r} unlike another metric")
        METRICS.add(name, cls)
        return cls
    return register


def all_options() -> dict[str, Option]:
    """Every declared option by key (a shared key once), in registration order."""
    out: dict[str, Option] = {}
    for _, cls in METRICS.items():
        for o in cls.options:
            out.setdefault(o.name, o)
    return out


def defaults() -> list[str]:
    """The metrics on by default (declared ``default = True``), in registration order."""
    return [name for name, cls in METRICS.items() if cls.default]


def settings(given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The flat settings: every declared option's value (``given`` or its default), checked."""
    declared = all_options()
    given = dict(given or {})
    unknown = [k for k in given if k not in declared]
    if unknown:
        raise InputError(f"unknown metric option {unknown[0]!r}; {choices(list(declared), unknown[0])}")
    return {key: o.parse(given[key], f"metric settings: {o.flag}") if key in given else o.default
            for key, o in declared.items()}


def build(names: Sequence[str], removal: Removal, given: dict[str, Any] | None = None,
          protocol: dict[str, Any] | None = None) -> list[Metric]:
    """Metric objects for ``names`` with the options of ``given`` (flat settings) and the protocol's
    fields (``grid``, ``score``: see ``evaluate/protocols.py``)."""
    resolved = settings(given)
    return [METRICS.get(n).from_settings(removal, resolved, protocol) for n in names]


def compute(metric: Metric, model: ModelFn, case: Case) -> Result:
    """One metric on one example: run the inputs it needs (each distinct one once), reduce."""
    import torch
    seqs = list(dict.fromkeys(metric.inputs(case)))
    logits = model(seqs) if seqs else torch.zeros((0, 0))
    return metric.reduce(case, dict(zip(seqs, logits)))
