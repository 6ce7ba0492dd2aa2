"""AttnLRP and CP-LRP rule sets on tiny BERT, GPT-2 and ViT exports: full coverage, the logit
reconstructed, and the audit's expected breaks exactly where the rules say (the softmax)."""
from __future__ import annotations

import pytest
import torch

import tiny
import rulegraph
from rulegraph.ruleset import RuleSet

F64 = torch.float64


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


def vit():
    from transformers import ViTConfig, ViTForImageClassification
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=3, attn_implementation="eager")
    return ViTForImageClassification(config).eval()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attnlrp")
    gpt2_names = ("input_ids", "attention_mask")
    vit_path = folder / "vit.onnx"
    torch.onnx.export(_Logits(vit()), (torch.randn(1, 3, 16, 16),), str(vit_path), input_names=["pixel_values"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})
    return {
        "bert": (tiny.onnx(tiny.build("bert"), folder / "bert.onnx"), tiny.token_inputs(batch=2, length=8, pad=2)),
        "gpt2": (tiny.onnx(tiny.build("gpt2"), folder / "gpt2.onnx", names=gpt2_names, exporter="dynamo"),
                 tiny.token_inputs(gpt2_names, batch=2, length=8, pad=2)),
        "vit": (vit_path, {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3),
                                                       dtype=F64)}),
    }


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit"])
@pytest.mark.parametrize("rules", ["attnlrp", "cp-lrp"])
def test_rule_set_covers_and_reconstructs(models, name, rules):
    path, feeds = models[name]
    graph = rulegraph.load(str(path))
    binding = (RuleSet.load(rules)).bind(graph)
    assert not binding.unmatched
    e = rulegraph.explain(graph, rules, feeds, dtype=F64)
    c = e.audit.conservation
    assert abs(c.residual) <= 1e-10 * abs(c.output_value)
    assert not e.audit.unexpected
    if rules == "attnlrp":      # only the softmax rule breaks, and it does
        assert {n.op for n in e.audit.expected} == {"Softmax"}
        assert all(n.rule == "softmax" for n in e.audit.nodes if not n.conserving)
        assert c.breaks != 0.0
        d = e.audit.to_dict()
        assert set(d["expected_breaks"]["by_rule"]) == {"softmax"}
        assert d["unexpected_breaks"]["nodes"] == []
    else:                       # CP-LRP conserves everywhere: queries and keys get nothing
        assert c.breaks == 0.0 and not e.audit.expected
        assert "Softmax" not in {n.op for n in binding.reached}


def test_attnlrp_uniform_rule_on_attention_products(models):
    path, _ = models["bert"]
    graph = rulegraph.load(str(path))
    binding = (RuleSet.load("attnlrp")).bind(graph)
    products = [n for n in binding.reached if n.op == "MatMul" and all(v in binding.tainted for v in n.inputs)]
    assert len(products) == 2 * tiny.SIZE["layers"]             # Q·Kᵀ and P·V per block
    assert {binding.assignments[n.name].rule.name for n in products} == {"uniform"}
