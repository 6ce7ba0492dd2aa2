"""``layer-saliency`` (Hou & Castanon 2023, Alg. 1) against Alg. 1 written out on the Hugging Face
module: h_l from ``output_hidden_states=True`` (kept with ``retain_grad``), ∂y/∂h_l by autograd,
decoding by the tied word embeddings (or a separate LM head), the loops of lines 6–12."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import IDS, MASK, as_exported, cli_json, hf, run
from rulegraph.errors import InputError


@pytest.fixture(scope="module")
def model(bert):
    return as_exported(bert)


def algorithm_1(model, targets, layer, tau=None, head=None):
    out = hf(model, output_hidden_states=True)
    for h in out.hidden_states:
        h.retain_grad()
    out.logits[torch.arange(len(targets)), torch.tensor(targets)].sum().backward()
    h = out.hidden_states[layer]
    alpha = torch.relu((h.grad * h).sum(-1)).detach().numpy()                         # line 3
    with torch.no_grad():
        logits = head(h) if head is not None else h @ model.bert.embeddings.word_embeddings.weight.T
        p = logits.softmax(-1).numpy()                                                # line 4
    scores = np.zeros(IDS.shape)
    for b in range(IDS.shape[0]):
        n = int(MASK[b].sum())
        tokens = sorted(set(IDS[b, :n].tolist()))
        d = np.array([[p[b, j, t] for j in range(n)] for t in tokens])                # line 5: D̂ [T, n]
        tau_b = len(tokens) if tau is None else tau
        s = np.zeros(len(tokens))
        for i in range(len(tokens)):                                                  # lines 6–12
            for j in range(n):
                if d[i, j] in sorted(d[:, j], reverse=True)[:tau_b]:
                    s[i] += d[i, j] * alpha[b, j]
        for j in range(n):
            scores[b, j] = s[tokens.index(int(IDS[b, j]))]
    return scores


@pytest.mark.parametrize("options,layer", [({}, 1), ({"layer": 0}, 0), ({"layer": -1, "top_tau": 2}, 2)])
def test_layer_saliency_matches_algorithm_1_on_the_torch_module(model, bert_onnx, options, layer):
    e = run(bert_onnx, "layer-saliency", **options)
    assert e.extra["layer"] == layer                                # default: the middle, ⌊2/2⌋ = 1
    assert e.extra["decoder"].startswith("tied word embeddings")
    expected = algorithm_1(model, e.target, layer, options.get("top_tau"))
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(e.relevance["input_ids"].numpy(), expected, rtol=1e-8, atol=0)
    assert e.relevance["input_ids"][0, 1] == e.relevance["input_ids"][0, 4]      # the same token, the same score


def test_an_lm_head_given_as_an_onnx_model_decodes(model, bert_onnx, tmp_path):
    torch.manual_seed(5)
    head = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 100)).double().eval()
    path = tmp_path / "head.onnx"
    torch.onnx.export(head.float(), (torch.zeros(1, 3, 32),), str(path), input_names=["hidden"], output_names=["logits"],
                      dynamic_axes={"hidden": {0: "b", 1: "n"}, "logits": {0: "b", 1: "n"}}, dynamo=False)
    head.double()
    e = run(bert_onnx, "layer-saliency", head=str(path), top_tau=3)
    assert e.extra["decoder"] == f"LM head {path}"
    expected = algorithm_1(model, e.target, 1, 3, head=head)
    np.testing.assert_allclose(e.relevance["input_ids"].numpy(), expected, rtol=1e-8, atol=0)


def test_bad_layers_and_taus_are_refused(bert_onnx):
    with pytest.raises(InputError, match="layer 3 does not exist"):
        run(bert_onnx, "layer-saliency", layer=3)
    with pytest.raises(InputError, match="at least 1"):
        run(bert_onnx, "layer-saliency", top_tau=0)


def test_layer_saliency_on_the_command_line(capsys, tmp_path, bert_onnx):
    doc = cli_json(capsys, tmp_path, bert_onnx, "layer-saliency", "layer=2", "top_tau=2")
    assert {"relevance", "tokens", "target"} <= set(doc)
    assert doc["layer"] == 2 and doc["decoder"].startswith("tied word embeddings") and doc["options"]["top_tau"] == 2
