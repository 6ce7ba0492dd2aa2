"""The conventions every metric shares (removable positions, removal, counting), on the bag-of-words model."""
from __future__ import annotations

import pytest

from closed_form import IDS, REMOVAL, UNK, case, model
from rulegraph.errors import InputError
from rulegraph.evaluate import metrics as M


def test_special_tokens_are_never_removed():
    c = case()
    metric = M.AOPC(REMOVAL, k_max=100, k_step=50)
    for seq in metric.inputs(c):
        assert seq.ids[0] == 2 and seq.ids[-1] == 3
    assert metric.perturbed(c, 100).ids == (2,) + (UNK,) * 10 + (3,)


def test_delete_and_replacement_agree_when_the_replacement_counts_zero():
    c = case()
    delete = M.Removal("delete", None, UNK)
    for name in ("aopc", "lodds", "au-mse", "hiding", "revealing"):
        metric_u, metric_d = M.build([name], REMOVAL)[0], M.build([name], delete)[0]
        assert M.compute(metric_u, model, c).value == pytest.approx(M.compute(metric_d, model, c).value, abs=1e-12)
    shorter = M.Deletion(delete, (20,)).perturbed(c, 20)
    assert len(shorter) == len(IDS) - 2


def test_fraction_counts_round_half_up():
    assert [M.count(f, 10) for f in (0, 0.04, 0.05, 0.15, 1)] == [0, 0, 1, 2, 10]


def test_bad_aopc_settings_are_input_errors():
    with pytest.raises(InputError, match="AOPC"):
        M.AOPC(REMOVAL, k_max=20, k_step=0)
