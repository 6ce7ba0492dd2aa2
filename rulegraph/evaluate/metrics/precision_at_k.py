"""Precision@k for span QA (Song et al. 2024 App. D): the share of the k highest-scored tokens
inside the answer span. ↑ Off by default (it needs an ``answer`` column)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import Case, Metric, Option, Result, metric


@metric("precision@k")
@dataclass
class PrecisionAtK(Metric):
    default = False
    title = "Precision@k: top-k tokens in the answer"
    x_label = ""
    needs = "answer"
    options = (Option("precision_k", int, 20, "Precision@k: k", low=1, high=100_000, attr="k"),)
    k: int = 20

    def xs(self) -> list[float]:
        return []

    def inputs(self, case):
        return []

    def reduce(self, case, logits):
        if case.answer is None:
            return Result(None, None)
        top = case.most_relevant_first()[:self.k]
        if not top:
            return Result(None, None)
        return Result(sum(bool(case.answer[i]) for i in top) / len(top), None)


def precision_at_k(case: Case, k: int = 20) -> Result:
    return PrecisionAtK(k=k).reduce(case, {})
