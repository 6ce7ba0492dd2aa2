"""AU-MSE against its closed form on the bag-of-words model (closed_form.py)."""
from __future__ import annotations

import pytest

from closed_form import IDS, REMOVAL, SPECIAL, W, case, model, trapezoid
from rulegraph.evaluate import metrics as M


def test_au_mse_prunes_least_absolute_relevance_first():
    c = case()
    order = sorted([i for i in range(len(IDS)) if not SPECIAL[i]], key=lambda i: abs(W[IDS[i]]))
    xs = [j / 5 for j in range(6)]
    # logits (−s/2, s/2): both change by Δs/2, so the mean squared difference is (Δs/2)²
    ys = [(float(sum(W[IDS[i]] for i in order[:round(f * 10)])) / 2) ** 2 for f in xs]
    result = M.au_mse(model, c, REMOVAL, steps=5)
    assert result.curve == pytest.approx(ys, abs=1e-12)
    assert result.value == pytest.approx(trapezoid(ys, xs), abs=1e-12)
