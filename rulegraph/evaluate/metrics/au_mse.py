"""AU-MSE (Ali et al. 2022): remove the least |relevant| tokens first; the area under the mean
over classes of (y₀ − yₜ)², y the logits. ↓"""
from __future__ import annotations

from dataclasses import dataclass

from ...tokens import Tokens
from .auac import Fractions
from .base import Case, ModelFn, Removal, Result, area, compute, metric


@metric("au-mse")
@dataclass
class AUMSE(Fractions):
    higher_is_better = False
    title = "pruning (AU-MSE): MSE of logits"
    x_label = "fraction of tokens removed (least |relevant| first)"

    def pruned(self, case: Case, f: float) -> Tokens:
        order = case.least_abs_first()
        return self.removal.apply(case.tokens, order[:self.removal.count(f, len(order))])

    def inputs(self, case):
        return [case.tokens, *(self.pruned(case, f) for f in self.xs())]

    def reduce(self, case, logits):
        y0 = logits[case.tokens].double()
        curve = [float(((y0 - logits[self.pruned(case, f)].double()) ** 2).mean()) for f in self.xs()]
        return Result(area(curve, self.xs()), curve)


def au_mse(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(AUMSE(removal, steps), model, case)
