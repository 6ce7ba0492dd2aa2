"""Conservation as a property: on random networks, whatever the rule set, the audit's
boundary + absorbed + breaks reconstruct the output, and conserving rules leave no residual."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import rulegraph
from rulegraph import RuleSet

F64 = torch.float64

Z_RULE = RuleSet.from_yaml("rules:\n  - op: '*'\n    rule: zero\n", source="z.yaml")
EPSILON = RuleSet.from_yaml("""
rules:
  - op: Gemm
    rule: epsilon
    params: {epsilon: 0.01}
  - op: [Relu, Tanh]
    rule: identity
  - op: '*'
    rule: gradient
""", source="eps.yaml")


def random_network(widths: list[int], seed: int, *, bias: bool, residual: bool, activation: str):
    """x → (Gemm → activation [+ x]) per layer → Gemm to 3 classes, as an ONNX model."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        w = numpy_helper.from_array(rng.normal(size=(a, b)).astype(np.float32) / np.sqrt(a), f"w{k}")
        c = numpy_helper.from_array((rng.normal(size=b) * bias).astype(np.float32), f"b{k}")
        inits += [w, c]
        nodes.append(helper.make_node("Gemm", [prev, f"w{k}", f"b{k}"], [f"z{k}"], name=f"layers.{k}.linear"))
        nodes.append(helper.make_node(activation, [f"z{k}"], [f"h{k}"], name=f"layers.{k}.act"))
        out = f"h{k}"
        if residual and a == b:
            nodes.append(helper.make_node("Add", [out, prev], [f"r{k}"], name=f"layers.{k}.residual"))
            out = f"r{k}"
        prev = out
    w = numpy_helper.from_array(rng.normal(size=(widths[-1], 3)).astype(np.float32), "w_out")
    inits.append(w)
    nodes.append(helper.make_node("Gemm", [prev, "w_out"], ["y"], name="head"))
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", widths[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


networks = st.builds(
    lambda widths, seed, bias, residual, activation: (widths, seed, bias, residual, activation),
    st.lists(st.sampled_from([3, 4, 6]), min_size=2, max_size=5), st.integers(0, 10_000), st.booleans(),
    st.booleans(), st.sampled_from(["Relu", "Tanh"]))


@settings(max_examples=40, deadline=None)
@given(networks, st.integers(1, 3))
def test_audit_reconstructs_the_output(net, batch):
    widths, seed, bias, residual, activation = net
    model = random_network(widths, seed, bias=bias, residual=residual, activation=activation)
    x = torch.from_numpy(np.random.default_rng(seed + 1).normal(size=(batch, widths[0])).astype(np.float32))
    for rules in ("gi", Z_RULE, EPSILON):
        e = rulegraph.explain(model, rules, {"x": x}, dtype=F64)
        c = e.audit.conservation
        assert c.output_value == pytest.approx(sum(e.output_value), rel=1e-12)
        assert abs(c.residual) <= 1e-9 * max(1.0, abs(c.output_value))
        assert not e.audit.unexpected
        assert float(e.boundary["x"].sum()) == pytest.approx(c.input_total, rel=1e-12, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(networks)
def test_z_rule_without_biases_conserves_exactly_to_the_input(net):
    """With no biases, LRP-0 through ReLU networks keeps every bit of relevance: Σ R(x) = f(x)."""
    widths, seed, _, residual, _ = net
    model = random_network(widths, seed, bias=False, residual=residual, activation="Relu")
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(1, widths[0])).astype(np.float32))
    e = rulegraph.explain(model, Z_RULE, {"x": x}, dtype=F64)
    assert float(e.relevance["x"].sum()) == pytest.approx(e.output_value[0], rel=1e-9, abs=1e-12)
    assert e.audit.conservation.absorbed == pytest.approx(0.0, abs=1e-12)


def test_a_huge_epsilon_absorbs_everything():
    """ε → ∞ leaves no relevance for the input: the stabiliser absorbs it all, and the audit says so."""
    model = random_network([4, 4, 4], 3, bias=True, residual=False, activation="Relu")
    x = torch.randn(1, 4)
    rules = RuleSet.from_yaml("rules:\n  - op: Gemm\n    rule: epsilon\n    params: {epsilon: 1.0e+8}\n"
                              "  - op: '*'\n    rule: gradient\n")
    c = rulegraph.explain(model, rules, {"x": x}, dtype=F64).audit.conservation
    assert abs(c.input_total) < 1e-6 * abs(c.output_value)
    assert c.absorbed == pytest.approx(c.output_value, rel=1e-6)
