"""CNN rule sets (Zennit's composites), BatchNorm folding and per-layer params, on tiny CNNs
built with plain torch.nn (no torchvision) and exported to ONNX."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import cnn
import rulegraph
from rulegraph.canonize import fold_batchnorm
from rulegraph.errors import RuleFileError, RuleMatchError
from rulegraph.ruleset import RuleSet

F64 = torch.float64
COMPOSITES = ["epsilon-gamma-box", "epsilon-plus-flat"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cnn")
    x = cnn.image(2, 8)
    return {
        "cnn": cnn.onnx(cnn.build("cnn"), folder / "cnn.onnx", x),
        "resnet": cnn.onnx(cnn.build("resnet"), folder / "resnet.onnx", x),
        "resnet_bn": cnn.onnx(cnn.build("resnet"), folder / "resnet_bn.onnx", x, keep_batchnorm=True),
        "mlp": cnn.onnx(cnn.build("mlp"), folder / "mlp.onnx", cnn.image(2, 2)),
    }


def rules_by_op(graph, ruleset):
    binding = (RuleSet.load(ruleset) if isinstance(ruleset, str) else ruleset).bind(graph)
    assert not binding.unmatched
    return [(n.op, binding.assignments[n.name].rule.name) for n in binding.reached]


@pytest.mark.parametrize("name", ["cnn", "resnet", "resnet_bn"])
@pytest.mark.parametrize("composite", COMPOSITES)
def test_composites_cover_and_conserve(exports, name, composite):
    x = cnn.image(2, 8)
    e = rulegraph.explain(str(exports[name]), composite, {"pixel_values": x}, dtype=F64)
    c = e.audit.conservation
    assert abs(c.residual) <= 1e-10 * abs(c.output_value)
    assert c.breaks == 0.0 and not e.audit.unexpected and not e.audit.expected
    assert c.absorbed != 0.0                                   # biases and stabilisers take their share
    assert e.boundary["pixel_values"].shape == x.shape


def test_epsilon_gamma_box_assignment(exports):
    graph = rulegraph.load(str(exports["cnn"]))
    assigned = rules_by_op(graph, "epsilon-gamma-box")
    convs = [r for op, r in assigned if op == "Conv"]
    assert convs == ["zbox", "gamma", "gamma"]                 # zB only on the first convolution
    assert {r for op, r in assigned if op == "Gemm"} == {"epsilon"}
    assert {r for op, r in assigned if op in ("AveragePool", "GlobalAveragePool")} == {"epsilon"}
    assert {r for op, r in assigned if op == "Relu"} == {"identity"}
    assert {r for op, r in assigned if op in ("MaxPool", "Flatten")} == {"route"}


def test_epsilon_plus_flat_assignment(exports):
    assigned = rules_by_op(rulegraph.load(str(exports["cnn"])), "epsilon-plus-flat")
    assert [r for op, r in assigned if op == "Conv"] == ["flat", "zplus", "zplus"]
    mlp = rules_by_op(rulegraph.load(str(exports["mlp"])), "epsilon-plus-flat")
    assert [r for op, r in mlp if op == "Gemm"] == ["flat", "epsilon", "epsilon"]   # the first dense layer


def test_fold_batchnorm_keeps_the_function(exports):
    graph = rulegraph.load(str(exports["resnet_bn"]))
    folded = fold_batchnorm(graph)
    assert "BatchNormalization" in graph.op_types() and "BatchNormalization" not in folded.op_types()
    x = {"pixel_values": cnn.image(2, 8)}
    before = rulegraph.run(graph, x, dtype=F64)[graph.outputs[0]]
    after = rulegraph.run(folded, x, dtype=F64)[folded.outputs[0]]
    torch.testing.assert_close(after, before, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("composite", COMPOSITES)
def test_folding_in_the_rule_set_matches_the_exporters_folding(exports, composite):
    """The exporter folds BatchNorm in float32; the rule set's canonizer in float64: equal to ~1e-6."""
    x = {"pixel_values": cnn.image(2, 8)}
    ours = rulegraph.explain(str(exports["resnet_bn"]), composite, x, dtype=F64).boundary["pixel_values"]
    exported = rulegraph.explain(str(exports["resnet"]), composite, x, dtype=F64).boundary["pixel_values"]
    assert float((ours - exported).abs().max() / exported.abs().max()) < 1e-4


def test_unfolded_batchnorm_gives_a_different_gamma_result(exports):
    """Without folding, γ sees the bare convolution: the canonizer is not a no-op."""
    x = {"pixel_values": cnn.image(2, 8)}
    rs = RuleSet.load("epsilon-gamma-box")
    folded = rulegraph.explain(str(exports["resnet_bn"]), rs, x, dtype=F64).boundary["pixel_values"]
    bare_rules = dataclasses.replace(rs, canonize=())        # a copy: the loaded rule set is shared
    bare = rulegraph.explain(str(exports["resnet_bn"]), bare_rules, x, dtype=F64).boundary["pixel_values"]
    assert float((folded - bare).abs().max() / folded.abs().max()) > 1e-3


PER_LAYER = """\
boundary: inputs
rules:
  - op: Conv
    rule: gamma
    params: {gamma: 0.25}
    per_layer:
      - {name: "/3/*", params: {gamma: 0.1}}
      - {scope: ["6", "6.*"], params: {gamma: 0.0, stabilizer: 0.01}}
  - op: [Gemm, AveragePool, GlobalAveragePool]
    rule: epsilon
  - op: [Relu]
    rule: identity
  - op: "*"
    rule: route
"""


def test_per_layer_params_by_name(exports):
    graph = rulegraph.load(str(exports["cnn"]))
    binding = (RuleSet.from_yaml(PER_LAYER, source="p.yaml")).bind(graph)
    convs = [(binding.assignments[n.name].rule, binding.assignments[n.name].where)
             for n in binding.reached if n.op == "Conv"]
    names = [n.name for n in binding.reached if n.op == "Conv"]
    expected = {0: 0.25, 3: 0.1, 6: 0.0}
    for name, (r, where) in zip(names, convs):
        index = int(name.split("/")[1])             # TorchScript names: /<module index>/Conv
        assert r.gamma == expected[index], name
        assert where == {0: "p.yaml:3", 3: "p.yaml:7", 6: "p.yaml:8"}[index]
        assert r.stabilizer == (0.01 if index == 6 else 1e-6)


def test_per_layer_params_by_block(bert_onnx):
    text = """\
rules:
  - op: [MatMul, Einsum]
    inputs: {0: {from: Softmax, through: [Where, Cast, Dropout, Identity]}}
    rule: ah
  - op: [Add, Gemm]
    rule: epsilon
    params: {epsilon: 1.0e-6}
    per_layer:
      - {blocks: "1-3", params: {epsilon: 0.5}}
      - {blocks: [0], params: {bias: false}}
  - op: "*"
    rule: gradient
"""
    graph = rulegraph.load(str(bert_onnx))
    binding = (RuleSet.from_yaml(text)).bind(graph)
    seen = {}
    for n in binding.reached:
        a = binding.assignments[n.name]
        if a.rule.name == "epsilon":
            seen.setdefault(graph.layers[n.name], set()).add((a.rule.epsilon, a.rule.bias))
    assert seen["block 1"] == {(0.5, True)}
    assert seen["block 0"] == {(1e-6, False)}
    assert seen["head"] == {(1e-6, True)}


@pytest.mark.parametrize("per_layer, message", [
    ('[{blocks: "3-1", params: {gamma: 0.1}}]', "p.yaml:5: empty block range '3-1'"),
    ('[{blocks: "a", params: {gamma: 0.1}}]', "p.yaml:5: blocks must be block numbers or ranges"),
    ('[{name: "*", params: {gama: 0.1}}]', "p.yaml:5: rule 'gamma' has no param 'gama'; did you mean 'gamma'?"),
    ('[{params: {gamma: 0.1}}]', "p.yaml:5: a per_layer item needs `blocks:`, `name:` or `scope:`"),
    ('[{name: "*"}]', "p.yaml:5: a per_layer item needs `params:`"),
    ('[{layer: 1, params: {}}]', "p.yaml:5: unknown key 'layer' in a per_layer item"),
    ("{}", "p.yaml:5: per_layer must be a non-empty list"),
])
def test_per_layer_errors_name_the_line(per_layer, message):
    text = f"rules:\n  - op: Conv\n    rule: gamma\n    params: {{gamma: 0.25}}\n    per_layer: {per_layer}\n"
    with pytest.raises(RuleFileError) as info:
        RuleSet.from_yaml(text, source="p.yaml")
    assert str(info.value).startswith(message)


def test_zbox_bounds_must_fit_the_channels(exports):
    text = ("boundary: inputs\non_unmatched: route\nrules:\n  - op: Conv\n    rule: zbox\n"
            "    params: {low: [0, 0], high: [1, 1]}\n  - op: Gemm\n    rule: epsilon\n"
            "  - op: [Relu, AveragePool, GlobalAveragePool]\n    rule: identity\n")
    with pytest.raises(RuleMatchError, match=r"2 bounds per channel \(low/high\) but the convolution takes 6 input channels"):
        rulegraph.explain(str(exports["cnn"]), RuleSet.from_yaml(text), {"pixel_values": cnn.image(1, 8)},
                          dtype=F64)
    dense = ("boundary: inputs\non_unmatched: route\nrules:\n  - op: Gemm\n    inputs: {0: {from: input, through: "
             "[Flatten]}}\n    rule: zbox\n    params: {low: [0, 0], high: [1, 1]}\n  - op: Gemm\n    rule: epsilon\n"
             "  - op: Relu\n    rule: identity\n")
    with pytest.raises(RuleMatchError, match="2 bounds per channel but the input has shape"):   # known only at run time
        rulegraph.explain(str(exports["mlp"]), RuleSet.from_yaml(dense), {"pixel_values": cnn.image(1, 2)}, dtype=F64)


def test_unknown_canonizer_is_a_line_error():
    with pytest.raises(RuleFileError, match=r"x.yaml:1: unknown canonizer 'batchnorms'; did you mean 'batchnorm'"):
        RuleSet.from_yaml("canonize: [batchnorms]\nrules:\n  - op: Conv\n    rule: gamma\n", source="x.yaml")


def test_cnn_rule_sets_are_listed_apart():
    assert set(rulegraph.shipped_rule_sets("cnns")) == set(COMPOSITES)
    assert not set(COMPOSITES) & set(rulegraph.shipped_rule_sets())
    assert set(COMPOSITES) <= set(rulegraph.shipped_rule_sets(None))
    with pytest.raises(RuleFileError, match=r"x.yaml:1: unknown models 'cnn'; did you mean 'cnns'"):
        RuleSet.from_yaml("models: cnn\nrules:\n  - op: Conv\n    rule: gamma\n", source="x.yaml")
