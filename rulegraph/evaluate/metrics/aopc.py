"""AOPC (Yang et al. 2023; Song et al. 2024): the mean over k ∈ {0, s, 2s, …, K}% (step s), or
over a protocol's grid, of f(x) − f(x̃ᵏ), x̃ᵏ being x with its k% most relevant tokens removed and
f the probability p(ŷ|·) (or, under a protocol saying so, the logit or the log-odds of ŷ). ↑"""
from __future__ import annotations

from dataclasses import dataclass

from ...tokens import Tokens
from .base import Case, Metric, ModelFn, Option, Removal, Result, compute, metric, quantity


@dataclass
class Deletion(Metric):
    """Most relevant first, at percentages — shared by AOPC and LOdds."""

    percents: tuple[float, ...] = ()

    def xs(self) -> list[float]:
        return [float(k) for k in self.percents]

    def perturbed(self, case: Case, percent: float) -> Tokens:
        order = case.most_relevant_first()
        return self.removal.apply(case.tokens, order[:self.removal.count(percent / 100, len(order))])

    def inputs(self, case: Case) -> list[Tokens]:
        return [case.tokens, *(self.perturbed(case, k) for k in self.percents)]


@metric("aopc")
@dataclass
class AOPC(Deletion):
    title = "AOPC: p(ŷ|x) − p(ŷ|x̃ᵏ)"
    x_label = "% of tokens removed (most relevant first)"
    options = (
        Option("aopc_k", int, 20, "AOPC: mean over k = 0…K % removed", low=0, high=100, attr="k_max"),
        Option("aopc_step", int, 1, "AOPC: k in steps of this many %", low=1, high=100, attr="k_step"),
    )
    protocol = ("grid", "score")
    k_max: int = 20
    k_step: int = 1
    grid: tuple[float, ...] | None = None       # the protocol's k in %, instead of 0…k_max by k_step
    score: str = "probability"                  # probability | logit | log-odds of ŷ

    def __post_init__(self):
        super().__post_init__()
        if self.score != "probability":     # the plots' panel says which quantity dropped
            self.title = {"logit": "AOPC: z(ŷ|x) − z(ŷ|x̃ᵏ), the logit",
                          "log-odds": "AOPC: log-odds(ŷ|x) − log-odds(ŷ|x̃ᵏ)"}[self.score]
        if self.grid is not None:
            self.percents = tuple(self.grid)
        else:       # integers, as before protocols: the same curve keys and the same values
            self.percents = tuple(range(0, self.k_max + 1, self.k_step))

    def value(self, logits, target: int) -> float:
        return quantity(logits, target, self.score)

    def reduce(self, case, logits):
        f0 = self.value(logits[case.tokens], case.target)
        drops = [f0 - self.value(logits[self.perturbed(case, k)], case.target) for k in self.percents]
        return Result(sum(drops) / len(drops), drops)


def aopc(model: ModelFn, case: Case, removal: Removal, k_max: int = 20, k_step: int = 1,
         grid: tuple[float, ...] | None = None, score: str = "probability") -> Result:
    return compute(AOPC(removal, k_max=k_max, k_step=k_step, grid=grid, score=score), model, case)
