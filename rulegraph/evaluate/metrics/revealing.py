"""Revealing game (Hou & Castanon 2023): from all hidden, reveal the most relevant tokens first;
the area under accuracy. ↑"""
from __future__ import annotations

from dataclasses import dataclass

from .base import Case, ModelFn, Removal, Result, compute, metric
from .hiding import Hiding


@metric("revealing")
@dataclass
class Revealing(Hiding):
    higher_is_better = True
    title = "revealing game: accuracy"
    x_label = "fraction of tokens revealed (most relevant first)"

    def selected(self, order, n):
        return order[n:]


def revealing(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(Revealing(removal, steps), model, case)
