"""Word deletion against its closed form on the bag-of-words model (closed_form.py)."""
from __future__ import annotations

import pytest

from closed_form import IDS, REMOVAL, W, case, model
from rulegraph.evaluate import metrics as M


def test_word_deletion_deletes_whole_words_by_summed_score():
    words = [None, 0, 0, 1, 2, 2, 3, 4, 5, 6, 7, None]
    c = case(words=words)
    sign = 1 if c.target == 1 else -1
    groups = {}
    for i, wd in enumerate(words):
        if wd is not None:
            groups.setdefault(wd, []).append(i)
    ranked = sorted(groups.values(), key=lambda g: -sign * sum(W[IDS[i]] for i in g))
    ys = []
    for m in range(4):
        gone = {i for g in ranked[:m] for i in g}
        kept = [IDS[i] for i in range(len(IDS)) if i not in gone]
        ys.append(float(int(float(W[kept].sum()) > 0) == c.target))
    result = M.word_deletion(model, c, REMOVAL, max_words=3)
    assert result.curve == ys
    assert result.value == pytest.approx(sum(ys[1:]) / 3)


def test_word_deletion_skips_examples_predicted_wrongly():
    assert M.word_deletion(model, case(label=1), REMOVAL, max_words=3).value is None
