"""Mixture-of-experts causal LMs (tiny random Qwen3-MoE, Mixtral, OLMoE; 4 experts, top-2): the
dense experts implementation used for export equals transformers' own; `rulegraph export` writes a
graph (TorchScript and dynamo exporters) that agrees with onnxruntime and the module at another
length; every transformer rule set conserves on it in float64, `gi` equals autograd
Gradient×Input, and the audit lists relevance per expert — none for an expert no position picked,
the router holding none under the rule sets that hold the routing weights constant."""
from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
import tiny
from targets import same
from rulegraph.cli import main
from rulegraph.exporters.moe import DENSE, use_dense_experts


@pytest.mark.parametrize("kind", sorted(tiny.MOE))
@pytest.mark.parametrize("reference", ["eager", "grouped_mm"])
def test_the_dense_experts_equal_transformers_own(kind, reference):
    module = tiny.moe_lm(kind)
    module.set_experts_implementation(reference)
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=2, length=7, pad=2)
    with torch.no_grad():
        expected = module(**feeds).logits
        assert use_dense_experts(module) and module.config._experts_implementation == DENSE
        ours = module(**feeds).logits
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_a_dense_model_is_left_alone():
    module = tiny.causal_lm("llama")
    assert not use_dense_experts(module)


@pytest.fixture(scope="module", params=[("qwen3_moe", "torchscript"), ("mixtral", "torchscript"),
                                        ("qwen3_moe", "dynamo")], ids=lambda p: "-".join(p))
def exported(request, tmp_path_factory):
    kind, exporter = request.param
    folder = tmp_path_factory.mktemp(f"moe_{kind}_{exporter}")
    module = tiny.save_causal_lm(kind, folder / "hf")
    assert main(["export", str(folder / "hf"), str(folder / "out"), "--exporter", exporter]) == 0
    return module, folder / "out" / "model.onnx"


def test_forward_equals_onnxruntime_and_the_module(exported):
    module, path = exported
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=2, length=11, pad=3)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    with torch.no_grad():
        expected = module(**feeds).logits.numpy()          # transformers' own experts (grouped products)
    assert np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()
    ours = rulegraph.run(rulegraph.load(path), feeds)["logits"].numpy()
    assert np.abs(ours - logits).max() <= 1e-4 * np.abs(logits).max()


def test_every_rule_set_conserves_and_splits_over_the_picked_experts(exported):
    _, path = exported
    graph = rulegraph.load(path)
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=9)
    for rules in sorted(rulegraph.shipped_rule_sets()):
        e = rulegraph.explain(graph, rules, feeds, dtype=torch.float64)
        c = e.audit.conservation
        assert abs(c.output_value) > 1e-3 and abs(c.residual) <= 1e-9 * abs(c.output_value), rules
        assert not e.audit.unexpected, rules
        if rulegraph.RuleSet.load(rules).pass_name != "relevance":
            continue
        blocks = e.audit.experts
        assert len(blocks) == 2 and [b.layer for b in blocks] == ["block 0", "block 1"], rules
        for block in blocks:
            assert sum(block.tokens) == 9 * 2                                  # 9 positions, top-2
            assert all(block.relevance[k] == 0.0 for k in block.unpicked), rules
            if rules == "gi":
                continue
            node = next(n for n in e.audit.nodes if n.name == block.node)       # the router: held constant
            assert node.relevance_out == pytest.approx(node.relevance_in, rel=1e-12, abs=1e-15), rules
            assert sum(block.relevance) == pytest.approx(node.relevance_in, rel=1e-9, abs=1e-15), rules


@pytest.mark.parametrize("rules", ["attnlrp", "gi"])
def test_top_tokens_in_one_batched_walk_equal_each_alone(exported, rules):
    """The experts' routing under the batched walk (``targets=``: a target axis through every rule, the
    routing weights shared): each next token's map, audit and per-expert figures equal its own walk's."""
    _, path = exported
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=9)
    for e in rulegraph.explain(path, rules, feeds, targets="top-3", dtype=torch.float64):
        alone = rulegraph.explain(path, rules, feeds, target=e.target[0], dtype=torch.float64)
        same(e, alone)
        for a, b in zip(e.audit.experts, alone.audit.experts, strict=True):
            assert a.relevance == pytest.approx(b.relevance, rel=1e-12, abs=1e-15)


def test_gi_equals_autograd(exported):
    """`gi` is x·∂f/∂x of the module (transformers' own loop over the picked experts, float64): the
    gradient reaches the router through the top-k weights, as autograd's does."""
    module, path = exported
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=9)
    e = rulegraph.explain(path, "gi", feeds, dtype=torch.float64)
    expected = tiny.next_token_gi(module, feeds, e.target[0])
    ours = torch.as_tensor(e.scores("input_ids"), dtype=torch.float64)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_the_audit_command_shows_relevance_per_expert(exported, capsys):
    _, path = exported
    assert main(["audit", str(path), "-r", "lrp-ah-ln", "-t", "w1 w2 w3"]) == 0      # conserved: nothing flagged
    out = capsys.readouterr().out
    assert "relevance per expert" in out and "expert 3" in out


def test_olmoe_exports_and_conserves(tmp_path):
    tiny.save_causal_lm("olmoe", tmp_path / "hf")
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "out")]) == 0
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=6)
    e = rulegraph.explain(tmp_path / "out" / "model.onnx", "lrp-ah-ln", feeds, dtype=torch.float64)
    assert abs(e.audit.conservation.residual) <= 1e-9 * abs(e.audit.conservation.output_value)
    assert len(e.audit.experts) == 2


def test_the_torch_export_program_explains_like_the_onnx_export(tmp_path):
    """`--format fx`: the router's top-k, in-place renormalisation and scatter are lowered, and every
    rule set gives the TorchScript export's scores."""
    tiny.save_causal_lm("qwen3_moe", tmp_path / "hf")
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "onnx")]) == 0
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "fx"), "--format", "fx"]) == 0
    fx, onnx_graph = rulegraph.load(tmp_path / "fx" / "model.pt2"), rulegraph.load(tmp_path / "onnx" / "model.onnx")
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), batch=1, length=7)
    for rules in ("lrp-ah-ln", "attnlrp", "gi"):
        a = torch.as_tensor(rulegraph.explain(fx, rules, feeds, dtype=torch.float64).scores("input_ids"))
        b = torch.as_tensor(rulegraph.explain(onnx_graph, rules, feeds, dtype=torch.float64).scores("input_ids"))
        assert (a - b).abs().max() <= 1e-6 * b.abs().max(), rules
