"""Hiding game (Hou & Castanon 2023, "Decoding layer saliency in transformers", App. A.1): hide
the most relevant tokens first; the area under accuracy. ↓ (a good method breaks the
prediction quickly). "Accuracy" compares with the label, or with the prediction on the full
input when there is none."""
from __future__ import annotations

from dataclasses import dataclass

from .auac import Fractions
from .base import Case, ModelFn, Removal, Result, compute, correct, metric, reference


@metric("hiding")
@dataclass
class Hiding(Fractions):
    higher_is_better = False
    title = "hiding game: accuracy"
    x_label = "fraction of tokens hidden (most relevant first)"

    def point(self, case, logits, y):
        return correct(y, reference(case, logits))


def hiding(model: ModelFn, case: Case, removal: Removal, steps: int = 20) -> Result:
    return compute(Hiding(removal, steps), model, case)
