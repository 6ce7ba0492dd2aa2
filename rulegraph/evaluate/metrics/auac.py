"""AUAC (Ali et al. 2022 Sec. 6.2): start from all-[UNK], reveal the most relevant tokens first;
the area under p(ŷ) over the fraction revealed. ↑ (``delete``: start from nothing; ``zero``: from zero
token embeddings.)"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...tokens import Tokens
from .base import Case, Metric, ModelFn, Option, Removal, Result, area, compute, logp, metric

#: The curve resolution, shared by AUAC, AU-MSE and the hiding / revealing games.
STEPS = Option("steps", "steps", int, 20, "curve points − 1 for AUAC, AU-MSE, hiding and revealing "
               "(fractions 0, 1/steps, …, 1)", 1, 1000)


@dataclass
class Fractions(Metric):
    """A curve over the fractions 0, 1/steps, …, 1 of the removable tokens."""

    options = (STEPS,)
    steps: int = 20

    def xs(self) -> list[float]:
        return [j / self.steps for j in range(self.steps + 1)]


@metric("auac")
@dataclass
class AUAC(Fractions):
    title = "activation (AUAC): p(ŷ)"
    x_label = "fraction of tokens revealed (most relevant first, from [UNK])"

    def revealed(self, case: Case, f: float) -> Tokens:
        order = case.most_relevant_first()
        hidden = order[self.removal.count(f, len(order)):]
        return case.tokens.remove(hidden, self.removal.hidden)

    def inputs(self, case):
        return [self.revealed(case, f) for f in self.xs()]

    def reduce(self, case, logits):
        curve = [math.exp(logp(logits[self.revealed(case, f)], case.target)) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


def auac(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(AUAC(removal, steps), model, case)
