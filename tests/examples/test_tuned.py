"""The tuned rule files shipped in examples/tuned/ (written by `rulegraph tune`, their headers saying what
they were tuned on and the test figures) load like any rule file and explain a transformer, conserving."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rulegraph
import tiny
from rulegraph.ruleset import RuleSet

TUNED = sorted((Path(__file__).resolve().parents[2] / "examples" / "tuned").glob("*.yaml"))


def test_there_are_tuned_files():
    assert [p.name for p in TUNED] == ["demo-mask-10-50-dense.yaml", "demo-mask-10-50.yaml"]


@pytest.mark.parametrize("path", TUNED, ids=lambda p: p.name)
def test_a_tuned_file_loads_says_what_it_was_tuned_on_and_conserves(path, bert_onnx):
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert header[0].startswith("# Tuned by rulegraph tune from cp-lrp") and "paired difference" in header[3]
    rules = RuleSet.load(path)
    assert rules.name == "cp-lrp-tuned"
    e = rulegraph.explain(bert_onnx, rules, tiny.token_inputs(), dtype=torch.float64)
    c = e.audit.conservation
    assert c.relative_error < 1e-10 and c.breaks == 0
