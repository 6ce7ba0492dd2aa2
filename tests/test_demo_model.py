"""The issue's acceptance checks on the real demo model (MiniLM fine-tuned on Rotten
Tomatoes). They need the model that `make demo` builds and skip without it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
from rulegraph.text import TextEncoder

CACHE = Path(os.environ.get("RULEGRAPH_CACHE", Path(__file__).resolve().parents[1] / ".cache")) / "sentiment-minilm"
pytestmark = pytest.mark.skipif(not (CACHE / "metrics.json").exists(),
                                reason=f"no demo model in {CACHE}; `make demo` builds it")

SENTENCES = ["a gorgeous , witty , seductive movie .", "the plot is thin and the jokes fall flat .",
             "it 's a charming and often affecting journey ."]


@pytest.fixture(scope="module")
def demo():
    graph = rulegraph.load(CACHE / "model.onnx")
    encoder = TextEncoder.for_model(graph, CACHE / "model.onnx", None)
    return graph, [encoder.encode(s).inputs for s in SENTENCES]


def test_fine_tuned_accuracy():
    assert json.loads((CACHE / "metrics.json").read_text())["test_accuracy"] >= 0.78


def test_forward_matches_onnxruntime(demo):
    graph, feeds = demo
    session = ort.InferenceSession(str(CACHE / "model.onnx"), providers=["CPUExecutionProvider"])
    for f in feeds:
        expected = session.run(None, {k: v.numpy() for k, v in f.items()})[0]
        got = rulegraph.run(graph, f)["logits"].numpy()
        assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_rule_set_reconstructs_the_logit(demo, rules):
    graph, feeds = demo
    for f in feeds:
        e = rulegraph.explain(graph, rules, f)
        assert e.audit.conservation.relative_error <= 1e-4
        assert not e.audit.unexpected
        if rules == "epsilon":
            assert e.audit.conservation.breaks == 0.0


def test_lrp_ah_ln_points_at_sentiment_words(demo):
    graph, feeds = demo
    e = rulegraph.explain(graph, "lrp-ah-ln", feeds[0])
    tokens = ["[CLS]", "a", "gorgeous", ",", "witty", ",", "seductive", "movie", ".", "[SEP]"]
    scores = dict(zip(tokens, e.scores()))
    assert e.labels[e.target[0]] == "positive"
    assert scores["gorgeous"] == max(scores[t] for t in tokens[1:-1])
    assert torch.isfinite(e.relevance["input_ids"]).all()


@pytest.mark.parametrize("method", ["ig", "lrp-ah-ln", "decomposition"])
def test_any_methods_words_are_the_tokenizers_words_and_sum_its_token_scores(method):
    """"unforgettable" is four word pieces, "," its own word: ``words()`` sums the pieces of each of the
    tokenizer's words (special tokens left out), and equals the decomposition's word groups
    (Group Additivity: signed α, float64)."""
    text, demo = "an unforgettable, gorgeous movie", str(CACHE / "model.onnx")
    e = rulegraph.explain(demo, method, text=text, dtype=torch.float64,
                          **({"alpha": "signed"} if method == "decomposition" else {}))
    scores, ids = e.scores(), e.word_ids[0]
    expected = [sum(s for s, w in zip(scores, ids) if w == word) for word in sorted({w for w in ids if w is not None})]
    assert [w for w, _ in e.words()] == ["an", "unforgettable", ",", "gorgeous", "movie"]
    np.testing.assert_allclose([s for _, s in e.words()], expected, rtol=1e-12)
    assert [d["word"] for d in e.to_dict()["words"]] == [w for w, _ in e.words()]
    if method == "decomposition":
        grouped = rulegraph.explain(demo, method, text=text, dtype=torch.float64, alpha="signed", groups="word")
        by_label = {g["label"]: g["score"] for g in grouped.extra["decomposition"]["groups"]}
        np.testing.assert_allclose([s for _, s in e.words()], [by_label[w] for w, _ in e.words()], rtol=1e-9)
