"""Area between the least- and most-relevant-first perturbation curves (the faithfulness measure of
Achtibat et al., ICML 2024, "AttnLRP", Table 1). Tokens are removed most relevant first (MoRF:
highest score first) and least relevant first (LeRF: lowest, i.e. most negative, score first); at
each fraction f the explained class's score (a protocol's ``score``: the ``logit`` under
``achtibat2024``) is recorded on both; the value is the area over f ∈ [0, 1] of
LeRF(f) − MoRF(f) (trapezoids over the protocol's grid, or over 0, 1/steps, …, 1). ↑ A method
ranking the tokens that carry the prediction first makes MoRF fall and LeRF hold or rise; scores
that say nothing (all equal) give 0, since ties are broken by position the same way for both.
The curve kept is LeRF − MoRF at each fraction. Off by default; ``--protocol achtibat2024``
reports it."""
from __future__ import annotations

from dataclasses import dataclass

from ...tokens import Tokens
from .auac import STEPS
from .base import Case, Metric, ModelFn, Removal, Result, area, compute, metric, quantity


@metric("morf-lerf")
@dataclass
class MorfLerf(Metric):
    default = False
    title = "area between LeRF and MoRF: f(x̃ LeRF) − f(x̃ MoRF)"
    x_label = "fraction of tokens removed"
    options = (STEPS,)
    protocol = ("grid", "score")
    steps: int = 20
    grid: tuple[float, ...] | None = None       # the protocol's fractions in %, instead of 0, 1/steps, …, 1
    score: str = "probability"                  # probability | logit | log-odds of ŷ

    def xs(self) -> list[float]:
        if self.grid is not None:
            return [k / 100 for k in self.grid]
        return [j / self.steps for j in range(self.steps + 1)]

    def morf(self, case: Case, f: float) -> Tokens:
        order = case.most_relevant_first()
        return self.removal.apply(case.tokens, order[:self.removal.count(f, len(order))])

    def lerf(self, case: Case, f: float) -> Tokens:
        order = case.least_relevant_first()
        return self.removal.apply(case.tokens, order[:self.removal.count(f, len(order))])

    def inputs(self, case: Case) -> list[Tokens]:
        return [seq for f in self.xs() for seq in (self.morf(case, f), self.lerf(case, f))]

    def reduce(self, case, logits):
        gap = [quantity(logits[self.lerf(case, f)], case.target, self.score)
               - quantity(logits[self.morf(case, f)], case.target, self.score) for f in self.xs()]
        return Result(area(gap, self.xs()), gap)


def morf_lerf(model: ModelFn, case: Case, removal: Removal, steps: int = 20, grid: tuple[float, ...] | None = None,
              score: str = "probability") -> Result:
    return compute(MorfLerf(removal, steps=steps, grid=grid, score=score), model, case)
