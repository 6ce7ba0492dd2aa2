"""Precision@k against its closed form on the bag-of-words model (closed_form.py)."""
from __future__ import annotations

import pytest

from closed_form import case, ideal
from rulegraph.evaluate import metrics as M


def test_precision_at_k_counts_top_tokens_inside_the_answer():
    answer = [False] * 12
    c = case(answer=answer)
    top = ideal(c)
    for i in top[:2] + top[5:6]:
        answer[i] = True
    assert M.precision_at_k(c, k=3).value == pytest.approx(2 / 3)
    assert M.precision_at_k(c, k=6).value == pytest.approx(3 / 6)
    assert M.precision_at_k(case(), k=3).value is None       # no answer span: no value
