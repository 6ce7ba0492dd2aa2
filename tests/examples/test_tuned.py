"""The tuned rule files shipped in examples/tuned/ (written by `rulegraph tune`, their headers saying what
they were tuned on and the test figures) load like any rule file and explain a transformer; those tuned
from a conserving rule set conserve, and none breaks conservation where its rules claim to conserve."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rulegraph
import tiny
from rulegraph.ruleset import RuleSet

TUNED = sorted((Path(__file__).resolve().parents[2] / "examples" / "tuned").glob("*.yaml"))
#: each shipped tuned file → the rule set it was tuned from
STARTS = {"demo-mask-10-50-dense.yaml": "cp-lrp", "demo-mask-10-50.yaml": "cp-lrp",
          "imdb-lm-achtibat2024.yaml": "attnlrp", "imdb-mask-10-50-dense.yaml": "cp-lrp"}
#: starting rule sets that conserve everywhere (lrp-ah-ln keeps GELU's and SiLU's gradient: the audit books
#: those breaks, expected ones)
CONSERVING = {"cp-lrp"}


def test_there_are_tuned_files():
    assert [p.name for p in TUNED] == sorted(STARTS)


@pytest.mark.parametrize("path", TUNED, ids=lambda p: p.name)
def test_a_tuned_file_loads_says_what_it_was_tuned_on_and_conserves(path, bert_onnx):
    start = STARTS[path.name]
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert header[0].startswith(f"# Tuned by rulegraph tune from {start} ") and "paired difference" in header[3]
    rules = RuleSet.load(path)
    assert rules.name == f"{start}-tuned"
    e = rulegraph.explain(bert_onnx, rules, tiny.token_inputs(), dtype=torch.float64)
    assert not e.audit.unexpected
    c = e.audit.conservation
    if start in CONSERVING:
        assert c.relative_error < 1e-10 and c.breaks == 0


@pytest.mark.parametrize("path", [p for p in TUNED if "-lm-" in p.name], ids=lambda p: p.name)
def test_a_language_model_s_tuned_file_explains_a_causal_lm_at_its_last_token(path, causal_lm):
    _, model = causal_lm
    e = rulegraph.explain(model, RuleSet.load(path), text="w1 w2 w3 w4", dtype=torch.float64)
    assert e.position == 3 and not e.audit.unexpected
    assert torch.isfinite(e.relevance["input_ids"]).all()
