"""Evaluation protocols: the details that decide a faithfulness number and differ between papers.

Published AOPC / AUAC figures are comparable only under the protocol that produced them: which
token replaces a removed one, the grid of removal fractions, how a fraction of ``L`` tokens
becomes a count, which inputs are too short to count, and which quantity of the explained class
the drops are taken of. Each preset below is one declaration in :data:`PROTOCOLS`; every field
can be overridden on the command line (``rulegraph evaluate --protocol NAME --count round …``),
and the resolved protocol is written into ``config.json`` and ``summary.json`` and printed above
the table. Where a paper does not fix a detail, its preset's description says what was chosen.

Fields (:class:`Protocol`):

``removal``     ``mask`` ([MASK]; [UNK] without one), ``unk``, ``pad``, ``delete`` or ``zero`` (the token
                embedding set to zero, the position kept)
``grid``        AOPC's k in % of the removable tokens; ``None``: 0…``--aopc-k`` in ``--aopc-step`` steps
``count``       tokens removed at fraction f of L removable ones: ``round-half-up`` ⌊fL + ½⌋,
                ``round`` (Python's, half to even), ``floor`` ⌊fL⌋, ``ceil`` ⌈fL⌉
``min_count``   at least this many tokens at every f > 0 (never more than L)
``min_length``  inputs of fewer tokens ([CLS]/[SEP] included) are skipped, and counted
``score``       AOPC's drops of the explained class's ``probability``, ``logit`` or ``log-odds``
``settings``    metric options the protocol fixes (the curve ``steps``), unless given
``metrics``     the metrics reported when ``--metrics`` is not given (``None``: those on by default)

A preset overridden on the command line is described as such: :meth:`Protocol.describe` gives the
preset's text followed by each field that differs from it, and the one-line :meth:`Protocol.summary`
names ``preset + overrides``; the grid, once given, replaces ``--aopc-k``/``--aopc-step``, which are
then neither printed nor written among the settings.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import InputError, choices
from ..registry import Registry
from ..tokens import REMOVALS

COUNTS = ("round-half-up", "round", "floor", "ceil")
#: what AOPC measures at each step (a protocol's ``score``)
MEASURES = ("probability", "logit", "log-odds")
FIELDS = ("removal", "grid", "count", "min_count", "min_length", "score")
#: the command-line option of each field
FLAGS = {"removal": "--removal", "grid": "--aopc-grid", "count": "--count", "min_count": "--min-count",
         "min_length": "--min-length", "score": "--score"}
#: the metric settings a grid replaces (``--aopc-k``/``--aopc-step`` make the default grid)
GRID_SETTINGS = ("aopc_k", "aopc_step")


def count(rule: str, fraction: float, n: int, minimum: int = 0) -> int:
    """Tokens removed at ``fraction`` of ``n`` under ``rule``; at least ``minimum`` when
    ``fraction`` > 0, never more than ``n``."""
    x = fraction * n
    if rule == "round-half-up":
        k = int(math.floor(x + 0.5))
    elif rule == "round":
        k = round(x)
    elif rule == "floor":
        k = int(math.floor(x + 1e-9))       # 0.29·100 is 28.999999999999996 in floating point
    elif rule == "ceil":
        k = int(math.ceil(x - 1e-9))
    else:
        raise InputError(f"unknown counting rule {rule!r}; {choices(COUNTS, rule)}")
    if fraction > 0:
        k = max(k, minimum)
    return min(n, k)


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol (see the module docstring for the fields)."""

    name: str
    description: str
    removal: str = "mask"
    grid: tuple[float, ...] | None = None
    count: str = "round-half-up"
    min_count: int = 0
    min_length: int = 0
    score: str = "probability"
    settings: dict[str, Any] = field(default_factory=dict)
    metrics: tuple[str, ...] | None = None
    preset: "Protocol | None" = field(default=None, repr=False, compare=False)   # what override() started from

    def __post_init__(self):
        if self.removal not in REMOVALS:
            raise InputError(f"unknown removal {self.removal!r}; {choices(REMOVALS, self.removal)}")
        if self.count not in COUNTS:
            raise InputError(f"unknown counting rule {self.count!r}; {choices(COUNTS, self.count)}")
        if self.score not in MEASURES:
            raise InputError(f"unknown score {self.score!r}; {choices(MEASURES, self.score)}")
        for what, value in (("--min-count", self.min_count), ("--min-length", self.min_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"{what} must be an integer ≥ 0 (got {value!r})")
        if self.grid is not None:
            grid = tuple(float(k) for k in self.grid)
            if not grid or any(not 0 <= k <= 100 for k in grid) or len(set(grid)) != len(grid):
                raise InputError(f"--aopc-grid must list distinct percentages in 0…100 (got {self.grid!r})")
            object.__setattr__(self, "grid", grid)

    def override(self, **given: Any) -> "Protocol":
        """This protocol with the fields given (``None``: keep the preset's); it remembers the preset."""
        unknown = [k for k in given if k not in FIELDS]
        if unknown:
            raise InputError(f"a protocol has no field {unknown[0]!r}; {choices(FIELDS, unknown[0])}")
        return replace(self, **{k: v for k, v in given.items() if v is not None}, preset=self.preset or self)

    def overrides(self) -> dict[str, Any]:
        """The fields that differ from the preset this protocol was made from (JSON-ready)."""
        if self.preset is None:
            return {}
        mine, theirs = self.fields(), self.preset.fields()
        return {k: v for k, v in mine.items() if v != theirs[k]}

    def describe(self) -> str:
        """The preset's description, followed by the fields overridden (with the preset's values)."""
        changed = self.overrides()
        if not changed:
            return self.description
        theirs = self.preset.fields()
        return self.description.rstrip(".") + ". Overridden here: " + "; ".join(
            f"{FLAGS[k]} {_shown(k, v)} (preset: {_shown(k, theirs[k])})" for k, v in changed.items()) + "."

    def fields(self) -> dict[str, Any]:
        """The fields that decide the numbers (JSON-ready)."""
        d = asdict(self)
        return {k: (list(d[k]) if k == "grid" and d[k] is not None else d[k]) for k in FIELDS}

    def identity(self) -> dict[str, Any]:
        """The fields that differ from the ``default`` preset, by their ``config.json`` keys (removal
        is always there already): a run under the default protocol keeps the identity it had before
        protocols existed, so it resumes."""
        default = PROTOCOLS.get("default").fields()
        return {f"protocol_{k}": v for k, v in self.fields().items() if k != "removal" and v != default[k]}

    def grid_for(self, k_max: int, k_step: int) -> tuple[float, ...]:
        """AOPC's percentages: the grid, or 0…k_max in k_step steps (the default)."""
        return self.grid if self.grid is not None else tuple(float(k) for k in range(0, k_max + 1, k_step))

    def summary(self, k_max: int = 20, k_step: int = 1) -> str:
        """One line: what this protocol does."""
        token = {"mask": "[MASK]", "unk": "[UNK]", "pad": "[PAD]", "delete": "deleted",
                 "zero": "zero embeddings"}[self.removal]
        grid = self.grid_for(k_max, k_step)
        shown = ", ".join(f"{k:g}" for k in grid) if len(grid) <= 12 else f"{grid[0]:g}, {grid[1]:g}, …, {grid[-1]:g}"
        rule = {"round-half-up": "⌊kL + ½⌋", "round": "round(kL) (half to even)", "floor": "⌊kL⌋",
                "ceil": "⌈kL⌉"}[self.count]
        name = self.name + (" + " + ", ".join(FLAGS[k] for k in self.overrides()) if self.overrides() else "")
        parts = [f"protocol {name}: removed tokens {token}", f"AOPC k ∈ {{{shown}}} %",
                 f"count {rule}" + (f", at least {self.min_count}" if self.min_count else ""),
                 f"AOPC of the {self.score}"]
        if self.min_length:
            parts.append(f"inputs under {self.min_length} tokens skipped")
        if self.settings:
            parts.append(", ".join(f"{k}={v}" for k, v in self.settings.items()))
        return "; ".join(parts)


def _shown(name: str, value: Any) -> str:
    """A field's value as the command line writes it."""
    if name == "grid":
        return "0…--aopc-k in --aopc-step steps" if value is None else ",".join(f"{k:g}" for k in value)
    return str(value)


#: The presets by name.
PROTOCOLS: Registry[Protocol] = Registry("protocol", InputError)


def protocol(name: str, description: str, **fields: Any) -> Protocol:
    """Declare a preset."""
    p = Protocol(name, description, **fields)
    PROTOCOLS.add(name, p)
    return p


protocol("default", "rulegraph's own protocol (the tables of docs/evaluation.md): [MASK] unless --removal, "
         "AOPC over k = 0, s, 2s, …, K % (--aopc-k K = 20, --aopc-step s = 1; k = 0 is in the mean, "
         "as in Samek et al. 2017), ⌊kL + ½⌋ tokens, no minimum, no length limit, drops of the probability")
protocol("decompx", "DecompX (Modarressi et al., ACL 2023): [MASK], AOPC over K = 0, 10, …, 90 %, drops of the "
         "probability of the predicted class. The paper does not state how kL is rounded: round-half-up "
         "(this project's rule) is chosen; override with --count.",
         removal="mask", grid=tuple(range(0, 100, 10)))
protocol("mask-lrp", "Mask-LRP (Song et al., 2024): removed tokens become [PAD] (token id 0 in BERT, as their "
         "code does), AOPC over the nine fractions j/9, j = 1…9 (≈ 11 %…100 %), inputs under 20 tokens skipped, "
         "drops of the predicted class's probability (App. D, Eq. 12). The rounding of kL is not stated: "
         "round-half-up is chosen.",
         removal="pad", grid=tuple(100 * j / 9 for j in range(1, 10)), min_length=20)
protocol("ali2022", "Ali et al. (ICML 2022, \"XAI for Transformers\") Sec. 6.2: [UNK] for removed tokens (and "
         "the all-[UNK] start of AUAC), fractions 0, 10, …, 100 % (AOPC grid, and the curves of AUAC / "
         "AU-MSE / hiding / revealing at steps = 10), probability of the correct class. The rounding is not "
         "stated: round-half-up is chosen.",
         removal="unk", grid=tuple(range(0, 101, 10)), settings={"steps": 10})
protocol("yang2023", "Yang et al. (ACL 2023, linear decomposition): the top k % tokens are deleted, AOPC as in "
         "Chen et al. (2020): 1/(K+1) Σ_{k=1..K} of the probability drop with K = 20 — the mean over "
         "k = 0, 1, …, 20 % (the k = 0 term is 0). The paper does not say whether k counts percent steps "
         "or tokens, nor the rounding: percent steps and round-half-up are chosen.",
         removal="delete", grid=tuple(range(0, 21)))
protocol("mask-10-50", "the top k % replaced by [MASK] for k = 10, 20, 30, 40, 50 % (k = 0 not in the mean), "
         "max(1, round(kL)) tokens (Python's round, half to even), drops of the probability: the protocol of an "
         "independent re-implementation of this evaluation (docs/evaluation.md), which rulegraph reproduces per "
         "sentence under it.",
         removal="mask", grid=(10, 20, 30, 40, 50), count="round", min_count=1)
protocol("achtibat2024", "AttnLRP (Achtibat et al., ICML 2024, Table 1), as its authors describe it: relevance at "
         "the input embeddings; most- and least-relevant-first ablation with the token embeddings set to zero (the "
         "position kept: a causal LM's later tokens keep their positions, and no [MASK]/[UNK] token is needed, "
         "which a byte-level LM tokenizer lacks); the logit of the predicted token recorded at each step; the area "
         "between the two curves (metric morf-lerf). Steps are not stated: fractions 0, 10, …, 100 % of the "
         "removable tokens, ⌊kL + ½⌋ tokens, trapezoids over the fraction axis, are chosen. For classifiers and "
         "causal LMs (explained at the last token, for the token it predicts).",
         removal="zero", grid=tuple(range(0, 101, 10)), score="logit", metrics=("morf-lerf",))


def resolve(name: str = "default", **given: Any) -> Protocol:
    """The preset ``name`` with the fields given on the command line."""
    return PROTOCOLS.get(name).override(**given)


def parse_grid(value: str | None) -> tuple[float, ...] | None:
    """``--aopc-grid 10,20,30`` → (10.0, 20.0, 30.0)."""
    if value is None:
        return None
    try:
        grid = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise InputError(f"--aopc-grid must be comma-separated percentages, e.g. 10,20,30,40,50 (got {value!r})") \
            from None
    if not grid:
        raise InputError("--aopc-grid is empty; give percentages, e.g. 10,20,30,40,50")
    return grid
