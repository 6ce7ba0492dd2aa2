"""``gae`` (Chefer, Gur & Wolf 2021, Eqs. 5–6) against the method written with autograd on the
Hugging Face module: the attention probabilities it returns (``output_attentions=True``, eager
attention) kept with ``retain_grad``, ∂(target logit)/∂A by backward, then the rule in numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import IDS, as_exported, cli_json, hf, run


def chefer(model, targets, row=0):
    out = hf(model, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    out.logits[torch.arange(len(targets)), torch.tensor(targets)].sum().backward()
    n = IDS.shape[1]
    r = np.broadcast_to(np.eye(n), (IDS.shape[0], n, n)).copy()
    for a in out.attentions:                                    # first block to last
        cam = np.clip(a.grad.numpy() * a.detach().numpy(), 0, None).mean(axis=1)     # Eq. 5
        r = r + np.einsum("bij,bjk->bik", cam, r)                                    # Eq. 6
    return r[:, row, :]


@pytest.fixture(scope="module")
def model(bert):
    return as_exported(bert)


def test_gae_matches_autograd_on_the_torch_module(model, bert_onnx):
    e = run(bert_onnx, "gae")
    expected = chefer(model, e.target)
    got = e.relevance["input_ids"].numpy()
    assert np.abs(expected - np.eye(IDS.shape[1])[0]).max() > 0      # the gradients are not all zero
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=0)
    other = run(bert_onnx, "gae", row=3)
    np.testing.assert_allclose(other.relevance["input_ids"].numpy(), chefer(model, e.target, row=3), rtol=1e-8)


def test_gae_of_another_target(model, bert_onnx):
    e = run(bert_onnx, "gae", target=[1, 0])
    np.testing.assert_allclose(e.relevance["input_ids"].numpy(), chefer(model, [1, 0]), rtol=1e-8, atol=0)


def test_gae_on_the_command_line(capsys, tmp_path, bert_onnx):
    doc = cli_json(capsys, tmp_path, bert_onnx, "gae")
    assert {"relevance", "tokens", "target"} <= set(doc)
    assert doc["method"] == "gae" and doc["rows"] == [0]
