"""The decomposition pass on the real demo model (MiniLM fine-tuned on Rotten Tomatoes):
exact reconstruction at every node. Needs the model `make demo` builds; skips without it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import rulegraph
from rulegraph.passes.decomposition import run_pass
from rulegraph.text import TextEncoder

CACHE = Path(os.environ.get("RULEGRAPH_CACHE", Path(__file__).resolve().parents[2] / ".cache")) / "sentiment-minilm"
pytestmark = pytest.mark.skipif(not (CACHE / "model.onnx").exists(),
                                reason=f"no demo model in {CACHE}; `make demo` builds it")

SENTENCES = ["a gorgeous , witty , seductive movie .", "the plot is thin and the jokes fall flat ."]


@pytest.fixture(scope="module")
def demo():
    graph = rulegraph.load(CACHE / "model.onnx")
    encoder = TextEncoder.for_model(graph, CACHE / "model.onnx", None)
    return graph, [encoder.encode(s) for s in SENTENCES]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_components_sum_to_every_value(demo, dtype, tolerance):
    graph, encoded = demo
    for enc in encoded:
        result = run_pass(graph, rulegraph.RuleSet.load("decomposition"), enc.inputs, dtype=dtype)
        assert len(result.errors) == len(result.binding.reached)
        worst = max(float(gap) / float(scale) for gap, scale in result.errors.values())
        assert worst <= tolerance


def test_word_groups_add_up_to_the_logit(demo):
    graph, encoded = demo
    enc = encoded[0]
    e = rulegraph.explain(graph, "decomposition", enc.inputs, dtype=torch.float64, groups="word",
                  word_ids=[enc.word_ids], tokens=[enc.tokens])
    doc = e.extra["decomposition"]
    assert len(doc["groups"]) == len(set(w for w in enc.word_ids if w is not None)) + 2   # + [CLS], [SEP]
    assert sum(g["score"] for g in doc["groups"]) + doc["bias"] == pytest.approx(e.output_value[0], rel=1e-10)
    scores = {g["label"]: g["score"] for g in doc["groups"]}
    assert e.labels[e.target[0]] == "positive" and scores["gorgeous"] == max(scores.values())
