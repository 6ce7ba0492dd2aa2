"""AU-MSE (Ali et al. 2022): remove the least |relevant| tokens first; the area under the mean
over classes of (y₀ − yₜ)², y the logits. ↓"""
from __future__ import annotations

from dataclasses import dataclass

from .auac import Fractions
from .base import Case, ModelFn, Removal, Result, compute, metric


@metric("au-mse")
@dataclass
class AUMSE(Fractions):
    higher_is_better = False
    title = "pruning (AU-MSE): MSE of logits"
    x_label = "fraction of tokens removed (least |relevant| first)"

    def order(self, case):
        return case.least_abs_first()

    def point(self, case, logits, y):
        return float(((logits[case.tokens].double() - y.double()) ** 2).mean())


def au_mse(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(AUMSE(removal, steps), model, case)
