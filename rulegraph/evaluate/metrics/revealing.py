"""Revealing game (Hou & Castanon 2023): from all hidden, reveal the most relevant tokens first;
the area under accuracy. ↑"""
from __future__ import annotations

from dataclasses import dataclass

from ...tokens import Tokens
from .auac import Fractions
from .base import Case, ModelFn, Removal, Result, area, compute, correct, metric, reference


@metric("revealing")
@dataclass
class Revealing(Fractions):
    title = "revealing game: accuracy"
    x_label = "fraction of tokens revealed (most relevant first)"

    def revealed(self, case: Case, f: float) -> Tokens:
        order = case.most_relevant_first()
        return self.removal.apply(case.tokens, order[self.removal.count(f, len(order)):])

    def inputs(self, case):
        return [case.tokens, *(self.revealed(case, f) for f in self.xs())]

    def reduce(self, case, logits):
        ref = reference(case, logits)
        curve = [correct(logits[self.revealed(case, f)], ref) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


def revealing(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(Revealing(removal, steps), model, case)
