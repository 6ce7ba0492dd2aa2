"""The hiding and revealing games against their closed forms on the bag-of-words model (closed_form.py)."""
from __future__ import annotations

import pytest

from closed_form import IDS, REMOVAL, W, case, ideal, model, trapezoid
from rulegraph.evaluate import metrics as M


def test_hiding_and_revealing_games_count_correct_predictions():
    c = case(label=None)
    order = ideal(c)
    xs = [j / 5 for j in range(6)]

    def correct(removed):     # argmax of (−s/2, s/2); a tie (s = 0) is class 0, as torch's argmax
        kept = [IDS[i] for i in range(len(IDS)) if i not in removed]
        return float(int(float(W[kept].sum()) > 0) == c.target)
    hiding = [correct(order[:round(f * 10)]) for f in xs]
    revealing = [correct(order[round(f * 10):]) for f in xs]
    h, r = M.hiding(model, c, REMOVAL, steps=5), M.revealing(model, c, REMOVAL, steps=5)
    assert h.curve == hiding and r.curve == revealing
    assert h.value == pytest.approx(trapezoid(hiding, xs)) and r.value == pytest.approx(trapezoid(revealing, xs))
    assert hiding[0] == 1.0 and 0.0 in hiding


def test_accuracy_against_the_label_when_there_is_one():
    c = case(label=1)           # the model predicts 0 (s < 0): wrong on the full input
    assert M.hiding(model, c, REMOVAL, steps=5).curve[0] == 0.0
