"""Mask-LRP's final attribution (Song et al. 2024, Eq. 10–11) and its random-mask control.

The rollout is rebuilt independently from its pieces: the attention probabilities and their total
gradient come from the Hugging Face module itself (autograd, probabilities made leaves by a hook),
the masked head relevance at each value product from rulegraph's head-mask rule (checked on its own
against hand sums in tests/propagation/test_head_mask.py), and Eq. 10–11 are written out here."""
from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

import rulegraph
import tiny
from rulegraph.heads import HeadMasks, find_heads
from rulegraph.methods import explain_with
from rulegraph.methods.baselines.masklrp import random_masks, rule_set
from rulegraph.propagation.masked import masked

F64 = torch.float64
TYPES = {0: ("syntactic", "none", "positional", "none"), 1: ("none", "positional", "none", "syntactic")}


def _hf_attention_and_gradients(bert, inputs, target):
    """Per block: A [batch, heads, q, k] and ∂logit/∂A (total), from the HF module in float64."""
    model = copy.deepcopy(bert).double()
    captured = []

    def keep(module, args, output):
        probs = output[1]
        probs.retain_grad()
        captured.append(probs)

    hooks = [layer.attention.self.register_forward_hook(keep) for layer in model.bert.encoder.layer]
    try:
        out = model(**inputs, output_attentions=True).logits
        out[0, target].backward()
    finally:
        for h in hooks:
            h.remove()
    return [(a.detach(), a.grad.detach()) for a in captured]


def test_rollout_is_eq_10_11_of_its_pieces(bert, bert_onnx, tmp_path):
    inputs = tiny.token_inputs(length=7)
    masks = HeadMasks(TYPES)
    graph = rulegraph.load(bert_onnx)
    path = tmp_path / "m.yaml"
    path.write_text("heads:\n" + "".join(f"  {b}: [{', '.join(t)}]\n" for b, t in TYPES.items()))
    e = explain_with(graph, "mask-lrp-rollout", inputs, dtype=F64, masks=str(path), row=0)
    target = e.target[0]
    pieces = _hf_attention_and_gradients(bert, {k: v for k, v in inputs.items()}, target)

    # the masked relevance at each block's value product, by rulegraph's rule, and A, V, O by the forward
    blocks = find_heads(graph)
    nodes = [graph.node(b.product) for b in blocks]
    r = rulegraph.explain(graph, rule_set(masks), inputs, dtype=F64, record=[n.outputs[0] for n in nodes])
    env = rulegraph.prepare(graph, "cpu", F64).run(inputs)
    rollout = torch.eye(inputs["input_ids"].shape[1], dtype=F64)
    for b, node, (a_hf, grad) in zip(blocks, nodes, pieces):
        a, v, o = (env[x].double() for x in (node.inputs[0], node.inputs[1], node.outputs[0]))
        torch.testing.assert_close(a, a_hf, rtol=1e-8, atol=1e-12)           # the same attention maps
        kept = masked(r.recorded[node.outputs[0]], TYPES[b.block])
        edge = a * torch.einsum("bhkd,bhqd->bhqk", v, torch.where(o == 0, 0.0, kept / o))
        cam = (grad * edge).mean(1).clamp(min=0)[0] + torch.eye(a.shape[-1], dtype=F64)      # Eq. 10
        rollout = cam @ rollout                                                              # Eq. 11
    expected = rollout[0]
    got = e.relevance["input_ids"][0]
    assert got[0] == pytest.approx(float(expected[0]), rel=1e-12)            # [CLS]: the identity's 1 dominates
    words = expected[1:].abs().max()
    assert words > 0
    torch.testing.assert_close(got[1:] / words, expected[1:] / words, rtol=1e-6, atol=1e-6)


def test_random_mask_keeps_the_rate_and_the_type_counts_and_is_seeded(bert_onnx):
    blocks = find_heads(rulegraph.load(bert_onnx))
    masks = HeadMasks(TYPES)
    one, again, other = (random_masks(masks, blocks, seed) for seed in (1, 1, 2))
    count = Counter(t for ts in masks.types.values() for t in ts)
    for m in (one, other):
        assert Counter(t for ts in m.types.values() for t in ts) == count
        assert m.rate == masks.rate
    assert one.types == again.types
    assert any(random_masks(masks, blocks, s).types != masks.types for s in range(5))


def test_random_control_differs_from_the_calibrated_mask(bert_onnx, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("heads:\n" + "".join(f"  {b}: [{', '.join(t)}]\n" for b, t in TYPES.items()))
    graph = rulegraph.load(bert_onnx)
    inputs = tiny.token_inputs(length=7)
    calibrated = explain_with(graph, "mask-lrp-rollout", inputs, dtype=F64, masks=str(path))
    runs = [explain_with(graph, "mask-lrp-random", inputs, dtype=F64, masks=str(path), seed=s) for s in (3, 3)]
    assert torch.equal(runs[0].relevance["input_ids"], runs[1].relevance["input_ids"])      # seeded
    base = calibrated.relevance["input_ids"][0, 1:]

    def words(seed):
        return explain_with(graph, "mask-lrp-random", inputs, dtype=F64, masks=str(path),
                            seed=seed).relevance["input_ids"][0, 1:]
    differs = [not torch.allclose(words(s) / base.abs().max(), base / base.abs().max(), rtol=1e-3, atol=1e-3)
               for s in range(4)]
    assert any(differs)
    with pytest.raises(rulegraph.RulegraphError, match="needs -o mask-lrp-random.masks=FILE"):
        explain_with(graph, "mask-lrp-random", inputs)
