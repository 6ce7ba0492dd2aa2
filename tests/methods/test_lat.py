"""``lat`` (Wu & Ong 2021, Eq. 10) and ``rollout`` against the head-averaged attention matrices of
the Hugging Face module itself (eager attention, ``output_attentions=True``), multiplied in numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import IDS, MASK, as_exported, cli_json, hf, run
from rulegraph.errors import InputError


@pytest.fixture(scope="module")
def attentions(bert):
    with torch.no_grad():
        return [a.numpy() for a in hf(as_exported(bert), output_attentions=True).attentions]


def traced(attentions, row=0):
    """Eq. 10 with each head carrying R^j / H: R_{l−1,i} = Σ_j mean_h A_l^(h)[j, i] R_{l,j}, from e_row down."""
    r = np.zeros((IDS.shape[0], IDS.shape[1]))
    r[:, row] = 1.0
    for a in reversed(attentions):
        r = np.einsum("bj,bji->bi", r, a.mean(axis=1))
    return r


def test_lat_is_the_product_of_head_averaged_attention(attentions, bert_onnx):
    e = run(bert_onnx, "lat")
    expected = traced(attentions)
    np.testing.assert_allclose(e.relevance["input_ids"].numpy(), expected, rtol=1e-12, atol=1e-15)
    assert e.relevance["input_ids"].dtype == torch.float64
    # conserving: the scores sum to 1 after every block, and padding gets nothing
    np.testing.assert_allclose(np.array(e.extra["block_sums"]), 1.0, atol=1e-12)
    assert float(e.relevance["input_ids"][1, 7]) == 0.0


def test_lat_reads_another_row(attentions, bert_onnx):
    e = run(bert_onnx, "lat", row=-1)                  # the last real token: [SEP] of each item
    last = [int(m.sum()) - 1 for m in MASK]
    for b, q in enumerate(last):
        np.testing.assert_allclose(e.relevance["input_ids"][b].numpy(), traced(attentions, q)[b], rtol=1e-12,
                                   atol=1e-15)


def test_rollout_is_the_same_product_with_the_residual_identity(attentions, bert_onnx):
    """Rollout without its identity term is LAT; with it (0.5·A + 0.5·I), the same product of the mixed matrices."""
    none = run(bert_onnx, "rollout", residual=0.0)
    np.testing.assert_allclose(none.relevance["input_ids"].numpy(), traced(attentions), rtol=1e-12, atol=1e-15)
    half = run(bert_onnx, "rollout")
    eye = np.eye(IDS.shape[1])
    mixed = [np.broadcast_to(0.5 * a.mean(1, keepdims=True) + 0.5 * eye, a.shape) for a in attentions]
    np.testing.assert_allclose(half.relevance["input_ids"].numpy(), traced(mixed), rtol=1e-12, atol=1e-15)


def test_lat_on_the_command_line(capsys, tmp_path, bert_onnx):
    doc = cli_json(capsys, tmp_path, bert_onnx, "lat")
    assert {"relevance", "tokens", "target"} <= set(doc)
    assert doc["method"] == "lat" and len(doc["block_sums"][0]) == 2
    scores = doc["relevance"]
    assert scores
    with pytest.raises(InputError, match="outside the 8 positions"):
        run(bert_onnx, "lat", row=8)
