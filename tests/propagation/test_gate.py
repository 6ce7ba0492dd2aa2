"""The gate rule (signal-take-all, Arras et al. 2017) on a tiny handbuilt graph with SiLU written as
x·σ(x) and a squeeze-and-excitation-like gate, against relevance computed by hand in numpy (float64)."""
from __future__ import annotations

import numpy as np
import torch

import rulegraph
from handbuilt import model, node
from rulegraph.ruleset import RuleSet

RULES = """\
boundary: inputs
rules:
  - op: Mul
    inputs: {1: {from: [Sigmoid, HardSigmoid]}}
    rule: gate
    params: {gate: 1}
  - op: Mul
    inputs: {0: {from: [Sigmoid, HardSigmoid]}}
    rule: gate
    params: {gate: 0}
  - op: [MatMul, Add]
    rule: epsilon
    params: {epsilon: 0}
"""


def test_gated_net_against_the_closed_form(tmp_path):
    """h = x·σ(x) (SiLU), g = hardsigmoid(h·A) one gate per item, u = g·h (gate first), y = u·W + b.
    z-rule on the dense layer, the bias absorbs b_k; the gates pass everything to the signal:
    R(x_j) = R(h_j) = R(u_j) = u_j W_jk, and nothing reaches the gate branch."""
    rng = np.random.default_rng(0)
    A, W, b = rng.normal(size=(4, 1)), rng.normal(size=(4, 3)), rng.normal(size=(3,))
    graph = model([node("Sigmoid", ["x"], ["s"], "silu/Sigmoid"),
                   node("Mul", ["x", "s"], ["h"], "silu/Mul"),
                   node("MatMul", ["h", "A"], ["q"], "se/MatMul"),
                   node("HardSigmoid", ["q"], ["g"], "se/HardSigmoid", alpha=1 / 6, beta=0.5),
                   node("Mul", ["g", "h"], ["u"], "se/Mul"),
                   node("MatMul", ["u", "W"], ["v"], "fc/MatMul"),
                   node("Add", ["v", "b"], ["y"], "fc/Add")],
                  {"A": A, "W": W, "b": b}, {"x": 4}, {"y": 3})
    path = tmp_path / "gated.onnx"
    path.write_bytes(graph.SerializeToString())
    x = rng.normal(size=(2, 4))
    h = x / (1 + np.exp(-x))
    g = np.clip(np.float32(1 / 6) * (h @ A) + 0.5, 0, 1)       # ONNX float attributes are float32
    u = g * h
    y = u @ W + b
    target = [int(k) for k in y.argmax(1)]
    expected = u * W[:, target].T                                 # R(x_j) = u_j W_jk
    rs = RuleSet.from_yaml(RULES)
    binding = rs.bind(rulegraph.load(str(path)))
    assert [n.name for n in binding.reached] == ["silu/Mul", "se/Mul", "fc/MatMul", "fc/Add"]  # no gate branch
    assert [binding.assignments[n].rule.gate for n in ("silu/Mul", "se/Mul")] == [1, 0]
    e = rulegraph.explain(str(path), rs, {"x": torch.from_numpy(x)}, target=target, dtype=torch.float64)
    got = e.boundary["x"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    c = e.audit.conservation
    assert abs(c.absorbed - float(b[target].sum())) <= 1e-12 and abs(c.residual) <= 1e-12 * abs(c.output_value)
    assert c.breaks == 0.0 and not e.audit.unexpected
