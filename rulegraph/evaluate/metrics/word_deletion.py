"""Accuracy vs words deleted (Wu & Ong 2021 Fig. 1): delete the 1…W most relevant words (a
word's score is the sum of its tokens'), on examples the model classifies correctly; the
value is the mean accuracy over 1…W words. ↓"""
from __future__ import annotations

from dataclasses import dataclass

from ...tokens import Tokens
from .base import Case, Metric, ModelFn, Option, Removal, Result, compute, correct, metric, reference


@metric("word-deletion")
@dataclass
class WordDeletion(Metric):
    higher_is_better = False
    title = "accuracy vs words deleted"
    x_label = "words deleted (most relevant first)"
    options = (Option("words", int, 10, "word-deletion: up to this many words", low=1, high=10_000, attr="max_words"),)
    max_words: int = 10

    def xs(self) -> list[float]:
        return [float(m) for m in range(self.max_words + 1)]

    def words(self, case: Case) -> list[list[int]]:
        """Removable positions grouped into words, most relevant word first."""
        groups: dict[object, list[int]] = {}
        for i in case.removable:
            w = case.words[i] if case.words is not None else None
            groups.setdefault(("w", w) if w is not None else ("t", i), []).append(i)
        words = list(groups.values())
        return sorted(words, key=lambda g: (-sum(case.scores[i] for i in g), g[0]))

    def deleted(self, case: Case, m: int) -> Tokens:
        return self.removal.apply(case.tokens, [i for g in self.words(case)[:m] for i in g])

    def inputs(self, case):
        return [case.tokens, *(self.deleted(case, m) for m in range(self.max_words + 1))]

    def reduce(self, case, logits):
        ref = reference(case, logits)
        if int(logits[case.tokens].argmax()) != ref:
            return Result(None, None)       # only initially correct examples count (Wu & Ong 2021)
        curve = [correct(logits[self.deleted(case, m)], ref) for m in range(self.max_words + 1)]
        return Result(sum(curve[1:]) / self.max_words, curve)


def word_deletion(model: ModelFn, case: Case, removal: Removal, max_words: int = 10) -> Result:
    return compute(WordDeletion(removal=removal, max_words=max_words), model, case)
