"""AUAC (Ali et al. 2022 Sec. 6.2): start from all-[UNK], reveal the most relevant tokens first;
the area under p(ŷ) over the fraction revealed. ↑ (``delete``: start from nothing; ``zero``: from zero
token embeddings.)"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...tokens import Tokens
from .base import Case, Metric, ModelFn, Option, Removal, Result, area, compute, logp, metric

#: The curve resolution, shared by AUAC, AU-MSE and the hiding / revealing games.
STEPS = Option("steps", int, 20, "curve points − 1 for AUAC, AU-MSE, hiding and revealing "
               "(fractions 0, 1/steps, …, 1)", low=1, high=1000)


@dataclass
class Fractions(Metric):
    """A curve over the fractions 0, 1/steps, …, 1 of the removable tokens, ranked by
    :meth:`order`: at fraction f the tokens :meth:`selected` picks among the first ⌊f·n⌉ are
    removed (:meth:`perturbed`), :meth:`point` reads the curve there from the model's logits,
    and the value is the area under the curve."""

    options = (STEPS,)
    steps: int = 20

    def xs(self) -> list[float]:
        return [j / self.steps for j in range(self.steps + 1)]

    def order(self, case: Case) -> list[int]:
        return case.most_relevant_first()

    def selected(self, order: list[int], n: int) -> list[int]:
        """The tokens removed when ``n`` of ``order`` are counted: the first ``n`` (hiding)."""
        return order[:n]

    def perturbed(self, case: Case, f: float) -> Tokens:
        order = self.order(case)
        return self.removal.apply(case.tokens, self.selected(order, self.removal.count(f, len(order))))

    def inputs(self, case):
        return [case.tokens, *(self.perturbed(case, f) for f in self.xs())]

    def point(self, case: Case, logits: dict, y) -> float:
        raise NotImplementedError

    def reduce(self, case, logits):
        curve = [self.point(case, logits, logits[self.perturbed(case, f)]) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


@metric("auac")
@dataclass
class AUAC(Fractions):
    title = "activation (AUAC): p(ŷ)"
    x_label = "fraction of tokens revealed (most relevant first, from [UNK])"

    def selected(self, order, n):
        return order[n:]

    def perturbed(self, case, f):
        order = self.order(case)
        hidden = self.selected(order, self.removal.count(f, len(order)))
        return case.tokens.remove(hidden, self.removal.hidden)

    def inputs(self, case):
        return [self.perturbed(case, f) for f in self.xs()]

    def point(self, case, logits, y):
        return math.exp(logp(y, case.target))


def auac(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(AUAC(removal, steps), model, case)
