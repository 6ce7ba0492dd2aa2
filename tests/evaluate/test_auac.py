"""AUAC against its closed form on the bag-of-words model (closed_form.py)."""
from __future__ import annotations

import pytest

from closed_form import REMOVAL, UNK, case, ideal, model, p_target, trapezoid
from rulegraph.evaluate import metrics as M


def test_auac_reveals_most_relevant_first_from_all_unk():
    c = case()
    order = ideal(c)
    xs = [j / 5 for j in range(6)]
    ys = [p_target(c, order[round(f * 10):]) for f in xs]     # hidden = all but the first f·n revealed
    result = M.auac(model, c, REMOVAL, steps=5)
    assert result.curve == pytest.approx(ys, abs=1e-12)
    assert result.value == pytest.approx(trapezoid(ys, xs), abs=1e-12)
    assert ys[0] == pytest.approx(0.5)      # all [UNK]: s = 0
