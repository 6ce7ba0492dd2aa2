"""Faithfulness metrics: pure functions of (model call, token ids, scores).

A metric asks for some perturbed versions of an example (:meth:`Metric.inputs`), and
turns the model's logits on them into a value and a curve (:meth:`Metric.reduce`). The
runner gathers the inputs of many examples and metrics, runs each distinct sequence
once, in batches, and hands the logits back; :func:`compute` does the same for one
example (the tests use it with closed-form models).

Conventions, for every metric:

* Only *removable* positions are ever removed: special tokens ([CLS], [SEP], padding)
  stay. ``n`` is their number; a fraction ``f`` of them is ``⌊f·n + ½⌋`` tokens.
* "Most relevant first" orders removable positions by score, highest first; ties by position.
* Removal (``Removal``): ``mask`` replaces a token by [MASK] (by [UNK] when the
  vocabulary has no [MASK]), ``unk`` by [UNK], ``delete`` drops it (the sequence
  shortens). AUAC always starts from [UNK], as in Ali et al. (2022) (``delete``: from nothing).
* ``p`` is the softmax probability of the explained class ŷ (the model's prediction on
  the full input, which the method explained); logits are the raw outputs.
* Areas are trapezoids over the fraction axis [0, 1], so they do not grow with length.

Definitions (x̃ᵏ: x with the top-k% removed):

``aopc``       AOPC (Yang et al. 2023; Song et al. 2024): mean over k ∈ {0, s, 2s, …, K}% (step s, default 1) of p(ŷ|x) − p(ŷ|x̃ᵏ). ↑
``lodds``      LOdds (Song et al. 2024 App. D): log p(ŷ|x̃ᵏ) − log p(ŷ|x) at k = 20%. ↓
``auac``       AUAC (Ali et al. 2022 Sec. 6.2): start from all-[UNK], reveal most relevant first;
               area under p(ŷ) over the fraction revealed. ↑
``au-mse``     AU-MSE (Ali et al. 2022): remove least-|relevant| first; area under the mean over
               classes of (y₀ − yₜ)², y the logits. ↓
``hiding``     hiding game (Hou & Castanon 2023, "Decoding layer saliency in transformers", App. A.1): hide most relevant first; area under
               accuracy. ↓ (a good method breaks the prediction quickly)
``revealing``  revealing game (Hou & Castanon 2023): from all hidden, reveal most relevant first;
               area under accuracy. ↑
``word-deletion`` accuracy vs words deleted (Wu & Ong 2021 Fig. 1): delete the 1…W most relevant
               words (a word's score is the sum of its tokens'), on examples the model
               classifies correctly; the value is the mean accuracy over 1…W words. ↓
``precision@k`` span QA (Song et al. 2024 App. D): share of the k highest-scored tokens inside the
               answer span. ↑

"Accuracy" compares the prediction with the example's label, or with the prediction on
the full input when there is no label.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..errors import InputError
from ..methods.sequences import Tokens

Tensor = torch.Tensor
ModelFn = Callable[[Sequence[Tokens]], Tensor]


@dataclass(frozen=True)
class Removal:
    """How removed tokens are treated: replaced by ``token``, or deleted when it is ``None``."""

    mode: str = "mask"
    token: int | None = None
    unk: int | None = None          # the [UNK] id AUAC starts from

    def apply(self, tokens: Tokens, positions) -> Tokens:
        return tokens.remove(positions, self.token)


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


def _logp(logits: Tensor, target: int) -> float:
    return float(torch.log_softmax(logits.double(), -1)[target])


def _correct(logits: Tensor, case: Case, reference: int) -> float:
    return float(int(logits.argmax()) == reference)


class Metric:
    """Base class: ``name``, whether higher is better, and the x-axis of its curve."""

    name = ""
    higher_is_better: bool = True
    x_label = ""

    def xs(self) -> list[float]:
        raise NotImplementedError

    def inputs(self, case: Case) -> list[Tokens]:
        raise NotImplementedError

    def reduce(self, case: Case, logits: dict[Tokens, Tensor]) -> Result:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} ({'higher' if self.higher_is_better else 'lower'} is better)"


def _reference(case: Case, logits: dict[Tokens, Tensor]) -> int:
    return case.label if case.label is not None else int(logits[case.tokens].argmax())


@dataclass
class Deletion(Metric):
    """Most relevant first, at fractions — shared by AOPC and LOdds."""

    removal: Removal
    percents: tuple[int, ...] = ()

    def xs(self) -> list[float]:
        return [float(k) for k in self.percents]

    def perturbed(self, case: Case, percent: float) -> Tokens:
        order = case.most_relevant_first()
        return self.removal.apply(case.tokens, order[:count(percent / 100, len(order))])

    def inputs(self, case: Case) -> list[Tokens]:
        return [case.tokens, *(self.perturbed(case, k) for k in self.percents)]


@dataclass
class AOPC(Deletion):
    name = "aopc"
    x_label = "% of tokens removed (most relevant first)"
    k_max: int = 20
    k_step: int = 1

    def __post_init__(self):
        if self.k_max < 0 or self.k_step < 1:
            raise InputError(f"AOPC needs K ≥ 0 and a step ≥ 1 (got K={self.k_max}, step={self.k_step})")
        self.percents = tuple(range(0, self.k_max + 1, self.k_step))

    def reduce(self, case, logits):
        p0 = math.exp(_logp(logits[case.tokens], case.target))
        drops = [p0 - math.exp(_logp(logits[self.perturbed(case, k)], case.target)) for k in self.percents]
        return Result(sum(drops) / len(drops), drops)


@dataclass
class LOdds(Deletion):
    name = "lodds"
    higher_is_better = False
    x_label = "% of tokens removed"
    k: int = 20

    def __post_init__(self):
        self.percents = (self.k,)

    def reduce(self, case, logits):
        value = _logp(logits[self.perturbed(case, self.k)], case.target) - _logp(logits[case.tokens], case.target)
        return Result(value, None)


@dataclass
class _Fractions(Metric):
    removal: Removal
    steps: int = 20

    def xs(self) -> list[float]:
        return [j / self.steps for j in range(self.steps + 1)]


@dataclass
class AUAC(_Fractions):
    name = "auac"
    x_label = "fraction of tokens revealed (most relevant first, from [UNK])"

    def revealed(self, case: Case, f: float) -> Tokens:
        order = case.most_relevant_first()
        hidden = order[count(f, len(order)):]
        return case.tokens.remove(hidden, None if self.removal.token is None else self.removal.unk)

    def inputs(self, case):
        return [self.revealed(case, f) for f in self.xs()]

    def reduce(self, case, logits):
        curve = [math.exp(_logp(logits[self.revealed(case, f)], case.target)) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


@dataclass
class AUMSE(_Fractions):
    name = "au-mse"
    higher_is_better = False
    x_label = "fraction of tokens removed (least |relevant| first)"

    def pruned(self, case: Case, f: float) -> Tokens:
        order = case.least_abs_first()
        return self.removal.apply(case.tokens, order[:count(f, len(order))])

    def inputs(self, case):
        return [case.tokens, *(self.pruned(case, f) for f in self.xs())]

    def reduce(self, case, logits):
        y0 = logits[case.tokens].double()
        curve = [float(((y0 - logits[self.pruned(case, f)].double()) ** 2).mean()) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


@dataclass
class Hiding(_Fractions):
    name = "hiding"
    higher_is_better = False
    x_label = "fraction of tokens hidden (most relevant first)"

    def hidden(self, case: Case, f: float) -> Tokens:
        order = case.most_relevant_first()
        return self.removal.apply(case.tokens, order[:count(f, len(order))])

    def inputs(self, case):
        return [case.tokens, *(self.hidden(case, f) for f in self.xs())]

    def reduce(self, case, logits):
        ref = _reference(case, logits)
        curve = [_correct(logits[self.hidden(case, f)], case, ref) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


@dataclass
class Revealing(_Fractions):
    name = "revealing"
    x_label = "fraction of tokens revealed (most relevant first)"

    def revealed(self, case: Case, f: float) -> Tokens:
        order = case.most_relevant_first()
        return self.removal.apply(case.tokens, order[count(f, len(order)):])

    def inputs(self, case):
        return [case.tokens, *(self.revealed(case, f) for f in self.xs())]

    def reduce(self, case, logits):
        ref = _reference(case, logits)
        curve = [_correct(logits[self.revealed(case, f)], case, ref) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


@dataclass
class WordDeletion(Metric):
    name = "word-deletion"
    higher_is_better = False
    x_label = "words deleted (most relevant first)"
    removal: Removal = field(default_factory=Removal)
    max_words: int = 10

    def xs(self) -> list[float]:
        return [float(m) for m in range(self.max_words + 1)]

    def words(self, case: Case) -> list[list[int]]:
        """Removable positions grouped into words, most relevant word first."""
        groups: dict[object, list[int]] = {}
        for i in case.removable:
            w = case.words[i] if case.words is not None else None
            groups.setdefault(("w", w) if w is not None else ("t", i), []).append(i)
        words = list(groups.values())
        return sorted(words, key=lambda g: (-sum(case.scores[i] for i in g), g[0]))

    def deleted(self, case: Case, m: int) -> Tokens:
        return self.removal.apply(case.tokens, [i for g in self.words(case)[:m] for i in g])

    def inputs(self, case):
        return [case.tokens, *(self.deleted(case, m) for m in range(self.max_words + 1))]

    def reduce(self, case, logits):
        ref = _reference(case, logits)
        if int(logits[case.tokens].argmax()) != ref:
            return Result(None, None)       # only initially correct examples count (Wu & Ong 2021)
        curve = [_correct(logits[self.deleted(case, m)], case, ref) for m in range(self.max_words + 1)]
        return Result(sum(curve[1:]) / self.max_words, curve)


@dataclass
class PrecisionAtK(Metric):
    name = "precision@k"
    x_label = ""
    k: int = 20

    def xs(self) -> list[float]:
        return []

    def inputs(self, case):
        return []

    def reduce(self, case, logits):
        if case.answer is None:
            return Result(None, None)
        top = case.most_relevant_first()[:self.k]
        if not top:
            return Result(None, None)
        return Result(sum(bool(case.answer[i]) for i in top) / len(top), None)


#: Metric names → constructor taking (removal, settings).
METRICS = ("aopc", "lodds", "auac", "au-mse", "hiding", "revealing", "word-deletion", "precision@k")


@dataclass(frozen=True)
class Settings:
    """The tunable numbers of the metrics (defaults as in the papers where they say)."""

    aopc_k: int = 20            # AOPC: k ∈ {0, step, …, K}%
    aopc_step: int = 1
    lodds_k: int = 20           # LOdds at k%
    steps: int = 20             # curve points − 1 for AUAC, AU-MSE, hiding, revealing
    words: int = 10             # word-deletion: up to this many words
    precision_k: int = 20       # Precision@k


def build(names: Sequence[str], removal: Removal, settings: Settings = Settings()) -> list[Metric]:
    """Metric objects for ``names`` (see :data:`METRICS`)."""
    table = {
        "aopc": lambda: AOPC(removal, k_max=settings.aopc_k, k_step=settings.aopc_step),
        "lodds": lambda: LOdds(removal, k=settings.lodds_k),
        "auac": lambda: AUAC(removal, settings.steps),
        "au-mse": lambda: AUMSE(removal, settings.steps),
        "hiding": lambda: Hiding(removal, settings.steps),
        "revealing": lambda: Revealing(removal, settings.steps),
        "word-deletion": lambda: WordDeletion(removal=removal, max_words=settings.words),
        "precision@k": lambda: PrecisionAtK(k=settings.precision_k),
    }
    return [table[n]() for n in names]


def compute(metric: Metric, model: ModelFn, case: Case) -> Result:
    """One metric on one example: run the inputs it needs (each distinct one once), reduce."""
    seqs = list(dict.fromkeys(metric.inputs(case)))
    logits = model(seqs) if seqs else torch.zeros((0, 0))
    return metric.reduce(case, dict(zip(seqs, logits)))


# -- the same as plain functions ----------------------------------------------------------------

def aopc(model: ModelFn, case: Case, removal: Removal, k_max: int = 20, k_step: int = 1) -> Result:
    return compute(AOPC(removal, k_max=k_max, k_step=k_step), model, case)


def lodds(model: ModelFn, case: Case, removal: Removal, k: int = 20) -> Result:
    return compute(LOdds(removal, k=k), model, case)


def auac(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(AUAC(removal, steps), model, case)


def au_mse(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(AUMSE(removal, steps), model, case)


def hiding(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(Hiding(removal, steps), model, case)


def revealing(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(Revealing(removal, steps), model, case)


def word_deletion(model: ModelFn, case: Case, removal: Removal, max_words: int = 10) -> Result:
    return compute(WordDeletion(removal=removal, max_words=max_words), model, case)


def precision_at_k(case: Case, k: int = 20) -> Result:
    return PrecisionAtK(k=k).reduce(case, {})
