"""The baselines' registry and declared properties, which the runner and the plots read instead
of branching on names."""
from __future__ import annotations

import pytest

from rulegraph.errors import InputError
from rulegraph.methods import BASELINES, RELEVANCE, Option, baseline, get, methods


def test_baselines_register_in_the_import_order():
    assert BASELINES.names() == ["random", "gs", "ig", "loo", "attention", "rollout", "mask-lrp-rollout", "mask-lrp-random",
                                  "lat", "gae", "layer-saliency"]


def test_each_method_declares_what_its_scores_are():
    for name, m in methods().items():
        assert m.units(), name
        assert m.additive == (m.units() == RELEVANCE), name     # additive scores are relevance, and only they
    assert get("loo").units() == "logit drop"
    assert get("loo").units({"drop": "prob"}) == "probability drop"
    assert [n for n, m in methods().items() if m.seeded] == ["random", "mask-lrp-random"]
    assert {n for n, m in methods().items() if m.reference} == {"random", "attention", "rollout", "lat"}
    assert get("lat").units() == "attention share (sums to 1)"
    assert [o.name for o in get("layer-saliency").options] == ["layer", "top_tau", "head"]


def test_a_baseline_name_twice_is_refused_and_unknown_names_list_the_choices():
    with pytest.raises(RuntimeError, match="registered twice"):
        baseline("gs", "again", Option("x", int, 0))(lambda req, x: None)
    with pytest.raises(InputError, match="unknown method 'rolout'"):
        get("rolout")
