"""Fuzzing: whatever a rule file or an input array holds, rulegraph answers with a RuleSet / an
Explanation or with a RulegraphError — never another exception."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rulegraph
import tiny
from rulegraph.errors import RuleFileError, RulegraphError
from rulegraph.propagation import RULES

KEYS = ["op", "trait", "name", "scope", "inputs", "rule", "params", "per_layer", "note", "rulez", "from"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8),
                    st.sampled_from(["*", "Add", "MatMul", "routing", "gradient", "epsilon", "0-3", "[x"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS + ["epsilon", "gamma",
                                                                                               "detach", "0"]),
                                                                       inner, max_size=3)), max_leaves=8)
ENTRY = st.fixed_dictionaries({"rule": st.sampled_from(list(RULES["relevance"]) + ["nope"])},
                              optional={k: VALUES for k in KEYS if k != "rule"})
FILES = st.fixed_dictionaries({"rules": st.lists(ENTRY, max_size=3)},
                              optional={"boundary": VALUES, "on_unmatched": VALUES, "pass": VALUES, "name": VALUES})
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(FILES)
def test_any_structured_rule_file_parses_or_names_its_line(doc):
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        rulegraph.RuleSet.from_yaml(text, source="f.yaml")
    except RuleFileError as exc:
        assert str(exc).startswith("f.yaml") and "\n" not in str(exc)


@FAST
@given(st.text(max_size=200))
def test_any_text_parses_or_is_refused(text):
    try:
        rulegraph.RuleSet.from_yaml(text, source="f.yaml")
    except RuleFileError as exc:
        assert str(exc).startswith("f.yaml")


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = tiny.onnx(tiny.build("bert"), tmp_path_factory.mktemp("fuzz") / "model.onnx")
    return rulegraph.load(path)


ARRAYS = st.tuples(st.integers(1, 2), st.integers(0, 70), st.integers(-3, 130), st.sampled_from(
    [np.int64, np.int32, np.float32, np.bool_]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(ARRAYS, ARRAYS, st.integers(-2, 3))
def test_any_input_array_explains_or_is_refused(graph, ids, mask, target):
    def make(spec, seed):
        batch, length, high, dtype = spec
        rng = np.random.default_rng(seed)
        return rng.integers(min(0, high), max(high, 1), size=(batch, length)).astype(dtype)
    feeds = {"input_ids": make(ids, 0), "attention_mask": make(mask, 1), "token_type_ids": make(ids, 2) * 0}
    try:
        e = rulegraph.explain(graph, "lrp-ah-ln", feeds, target=target, audit=False)
    except RulegraphError as exc:
        assert "\n" not in str(exc)
    else:
        assert torch.isfinite(e.relevance["input_ids"]).all()
