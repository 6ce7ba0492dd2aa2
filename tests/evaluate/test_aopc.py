"""AOPC against its closed form on the bag-of-words model (closed_form.py)."""
from __future__ import annotations

import numpy as np
import pytest

from closed_form import IDS, REMOVAL, case, ideal, model, p_target
from rulegraph.evaluate import metrics as M


def test_aopc_of_the_exact_contributions_matches_the_closed_form():
    c = case()
    order = ideal(c)
    expected = np.mean([p_target(c, []) - p_target(c, order[:round(k / 100 * 10 + 1e-9)]) for k in (0, 10, 20)])
    # counts ⌊k·n/100 + ½⌋ with n = 10: 0, 1, 2 (no ties at .5 here)
    result = M.aopc(model, c, REMOVAL, k_max=20, k_step=10)
    assert result.value == pytest.approx(expected, abs=1e-12)
    assert len(result.curve) == 3 and result.curve[0] == 0


def test_aopc_of_the_exact_contributions_beats_every_other_order():
    """Removing the largest contributions first maximises each term, so no scoring does better."""
    c = case()
    best = M.aopc(model, c, REMOVAL, k_max=30, k_step=10).value
    rng = np.random.default_rng(0)
    for _ in range(20):
        other = case(scores=list(rng.normal(size=len(IDS))))
        assert M.aopc(model, other, REMOVAL, k_max=30, k_step=10).value <= best + 1e-12
