"""LOdds against its closed form on the bag-of-words model (closed_form.py)."""
from __future__ import annotations

import math

import pytest

from closed_form import REMOVAL, case, ideal, model, p_target
from rulegraph.evaluate import metrics as M


def test_lodds_at_20_percent():
    c = case()
    order = ideal(c)
    expected = math.log(p_target(c, order[:2])) - math.log(p_target(c, []))
    assert M.lodds(model, c, REMOVAL, k=20).value == pytest.approx(expected, abs=1e-12)
