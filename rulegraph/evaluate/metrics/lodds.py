"""LOdds (Song et al. 2024 App. D): log p(ŷ|x̃ᵏ) − log p(ŷ|x) with the k% most relevant tokens
removed (k = 20). ↓"""
from __future__ import annotations

from dataclasses import dataclass

from .aopc import Deletion
from .base import Case, ModelFn, Option, Removal, Result, compute, logp, metric


@metric("lodds")
@dataclass
class LOdds(Deletion):
    higher_is_better = False
    title = "LOdds: log p(ŷ|x̃ᵏ) − log p(ŷ|x)"
    x_label = "% of tokens removed"
    options = (Option("lodds_k", int, 20, "LOdds: % removed", low=0, high=100, attr="k"),)
    k: int = 20

    def __post_init__(self):
        super().__post_init__()
        self.percents = (self.k,)

    def reduce(self, case, logits):
        value = logp(logits[self.perturbed(case, self.k)], case.target) - logp(logits[case.tokens], case.target)
        return Result(value, None)


def lodds(model: ModelFn, case: Case, removal: Removal, k: int = 20) -> Result:
    return compute(LOdds(removal, k=k), model, case)
