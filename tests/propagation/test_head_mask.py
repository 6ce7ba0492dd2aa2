"""The head-mask rule against per-head relevance sums computed by hand on the Hugging Face module
(float64): AH relevance at block 1's heads is context ⊙ ∂f/∂context with the attention probabilities
and LayerNorm's std detached (Ali et al. 2022), summed per head, then masked and renormalised
(Song et al. 2024, Sec. 4.3); and the block conserves in the audit."""
from __future__ import annotations

import pytest
import torch

import rulegraph
import tiny
from rulegraph.ruleset import RuleSet

TYPES = ["syntactic", "none", "positional", "syntactic"]
RULES = f"""name: masked-ah-ln
rules:
  - op: MatMul
    inputs:
      0: {{from: Softmax}}
    rule: head-mask
    params: {{inline: {{1: [{', '.join(TYPES)}]}}}}
  - op: LayerNormalization
    rule: ln
  - trait: routing
    rule: route
  - op: "*"
    rule: gradient
"""


def _per_head_reference(model, x, heads=4):
    """Σ_{q,d} O ⊙ ∂f/∂O per head of block 1, probabilities and LN std detached."""
    import torch.nn.functional as F
    model = model.double()
    original_softmax, original_ln = F.softmax, F.layer_norm

    def softmax(t, *a, **k):
        return original_softmax(t, *a, **k).detach()

    def layer_norm(t, shape, weight=None, bias=None, eps=1e-5):
        mean = t.mean(-1, keepdim=True)
        std = ((t - mean).pow(2).mean(-1, keepdim=True) + eps).sqrt().detach()
        return (t - mean) / std * weight + bias

    captured = {}

    def hook(module, inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        out.retain_grad()
        captured["o"] = out
    handle = model.bert.encoder.layer[1].attention.self.register_forward_hook(hook)
    F.softmax, F.layer_norm = softmax, layer_norm
    try:
        logits = model(**x).logits
        target = logits.argmax(-1)
        logits.gather(1, target[:, None]).sum().backward()
    finally:
        F.softmax, F.layer_norm = original_softmax, original_ln
        handle.remove()
    o = captured["o"]
    r = (o * o.grad).detach()                                 # [batch, q, heads·d]
    return r.reshape(r.shape[0], r.shape[1], heads, -1).sum((1, 3))    # [batch, heads]


def _masked(sums):
    synt = [m for m, t in enumerate(TYPES) if t == "syntactic"]
    pos = [m for m, t in enumerate(TYPES) if t == "positional"]
    total = sums.sum(1)
    s_synt, s_pos = sums[:, synt].sum(1), sums[:, pos].sum(1)
    denominator = s_synt.abs() + s_pos.abs()
    out = torch.zeros_like(sums)
    for group, s in ((synt, s_synt), (pos, s_pos)):
        out[:, group] = sums[:, group] * (s.abs() / denominator * total / s)[:, None]
    return out


def test_head_mask_against_hand_sums(bert, bert_onnx):
    x = tiny.token_inputs(batch=2, pad=2)
    reference = _masked(_per_head_reference(bert, x))
    graph = rulegraph.load(bert_onnx)
    from rulegraph.heads import find_heads
    (block1,) = [graph.node(b.product) for b in find_heads(graph) if b.block == 1]
    values = block1.inputs[1]                       # what the rule hands on: the values' relevance, per head
    e = rulegraph.explain(graph, RuleSet.from_yaml(RULES), x, dtype=torch.float64, record=[values])
    got = e.recorded[values].sum((2, 3))
    block1 = block1.name
    assert got[:, 1].abs().max() == 0                                  # the `none` head is dropped
    assert torch.allclose(got, reference, rtol=1e-9, atol=1e-12)
    assert torch.allclose(got.sum(1), _per_head_reference(bert, x).sum(1), rtol=1e-9)   # block total kept
    layers = {layer.name: layer for layer in e.audit.layers}
    block = layers["block 1"]
    assert abs(block.relevance_in - block.relevance_out - block.absorbed - block.breaks) < 1e-10
    node = next(n for n in e.audit.nodes if n.name == block1)
    assert node.conserving and abs(node.error) < 1e-12


def test_mask_lrp_rule_set_conserves_per_block(bert_onnx, tmp_path):
    masks = tmp_path / "m.yaml"
    masks.write_text("heads:\n  0: [positional, none, none, syntactic]\n  1: [none, syntactic, none, none]\n")
    text = RuleSet.load("mask-lrp")
    path = tmp_path / "rules.yaml"
    from rulegraph.ruleset import shipped_rule_sets
    path.write_text(shipped_rule_sets()["mask-lrp"].read_text().replace('masks: ""', f'masks: "{masks}"'))
    x = tiny.token_inputs(batch=2, pad=2)
    g = rulegraph.load(bert_onnx)
    masked = rulegraph.explain(g, str(path), x, dtype=torch.float64)
    plain = rulegraph.explain(g, text, x, dtype=torch.float64)
    for e in (masked, plain):
        assert e.audit.conservation.breaks == 0
        for layer in e.audit.layers:
            assert abs(layer.relevance_in - layer.relevance_out - layer.absorbed) < 1e-10 * max(1, abs(layer.relevance_in))
    assert not torch.allclose(masked.relevance["input_ids"], plain.relevance["input_ids"])
