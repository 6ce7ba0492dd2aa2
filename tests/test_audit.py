"""The conservation audit on hand-built ONNX graphs: per-node, per-layer and graph figures
against sums computed by hand in numpy (float64 graphs, run in float64).

The expected numbers come from closed-form LRP written here, never from the library's own
output: relevance in/out of each node, what biases and ε absorb, what a non-conserving rule
breaks, what is stranded at a node without a rule, and what crosses each layer's border.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import rulegraph
from handbuilt import model, node, seed, stabilize, two_branch_net
from rulegraph import RuleSet

F64 = torch.float64
RNG = np.random.default_rng(11)
X = RNG.normal(size=(2, 4))
W1, B1 = RNG.normal(size=(4, 5)), RNG.normal(size=5)
W2, B2 = RNG.normal(size=(5, 3)), RNG.normal(size=3)
TARGET = [1, 0]
EPSILON = 0.5


def approx(value, rel=1e-11, abs=1e-12):
    return pytest.approx(float(value), rel=rel, abs=abs)


def explain(onnx_model, rules: str, source: str, feeds=None, target=TARGET):
    feeds = feeds if feeds is not None else {"x": X}
    return rulegraph.explain(onnx_model, RuleSet.from_yaml(rules, source=source),
                             {k: torch.from_numpy(v) for k, v in feeds.items()}, target=target, dtype=F64)


def by_name(audit) -> dict:
    return {n.name: n for n in audit.nodes}


# -- the ε MLP: every figure by hand -------------------------------------------------------

MLP_RULES = f"""\
boundary: inputs
rules:
  - op: Gemm
    rule: epsilon
    params: {{epsilon: {EPSILON}}}
  - op: Relu
    rule: identity
"""


@pytest.fixture(scope="module")
def mlp_case():
    net = model([node("Gemm", ["x", "W1", "b1"], ["h"], "fc1/Gemm"),
                 node("Relu", ["h"], ["a"], "act/Relu"),
                 node("Gemm", ["a", "W2", "b2"], ["y"], "fc2/Gemm")],
                {"W1": W1, "b1": B1, "W2": W2, "b2": B2}, {"x": 4}, {"y": 3})
    h = X @ W1 + B1
    a = np.maximum(h, 0)
    y = a @ W2 + B2
    r_y = seed(y, TARGET)
    s2 = r_y / stabilize(y, EPSILON)
    r_a = a * (s2 @ W2.T)
    s1 = r_a / stabilize(h, EPSILON)
    r_x = X * (s1 @ W1.T)
    hand = {
        "output": r_y.sum(), "r_a": r_a.sum(), "r_x": r_x.sum(),
        # what the bias and the stabiliser take at each layer: Σ s·b and Σ s·ε·sign z
        "bias2": (s2 * B2).sum(), "eps2": (s2 * (stabilize(y, EPSILON) - y)).sum(),
        "bias1": (s1 * B1).sum(), "eps1": (s1 * (stabilize(h, EPSILON) - h)).sum(),
    }
    return explain(net, MLP_RULES, "mlp.yaml"), hand


def test_mlp_node_figures(mlp_case):
    e, hand = mlp_case
    nodes = by_name(e.audit)
    assert [n.name for n in e.audit.nodes] == ["fc2/Gemm", "act/Relu", "fc1/Gemm"]     # the walk's order
    fc2, relu, fc1 = nodes["fc2/Gemm"], nodes["act/Relu"], nodes["fc1/Gemm"]

    assert (fc2.op, fc2.rule, fc2.where, fc2.conserving) == ("Gemm", "epsilon", "mlp.yaml:3", True)
    assert fc2.relevance_in == approx(hand["output"])
    assert fc2.relevance_out == approx(hand["r_a"])
    assert fc2.absorbed == approx(hand["bias2"] + hand["eps2"])
    assert hand["eps2"] != 0 and hand["bias2"] != 0                 # both shares matter in this example

    assert (relu.op, relu.rule, relu.where, relu.conserving) == ("Relu", "identity", "mlp.yaml:6", True)
    assert relu.relevance_in == approx(hand["r_a"]) and relu.relevance_out == approx(hand["r_a"])
    assert relu.absorbed == 0.0

    assert (fc1.op, fc1.rule, fc1.where) == ("Gemm", "epsilon", "mlp.yaml:3")
    assert fc1.relevance_in == approx(hand["r_a"])
    assert fc1.relevance_out == approx(hand["r_x"])
    assert fc1.absorbed == approx(hand["bias1"] + hand["eps1"])

    for n in (fc2, relu, fc1):          # conserving: in = out + absorbed, no break, error at rounding
        assert n.breaks == 0.0
        assert abs(n.error) < 1e-12 and n.relative_error < 1e-12
        assert n.layer == "model"       # no block numbers, nothing named like an embedding


def test_mlp_graph_conservation(mlp_case):
    e, hand = mlp_case
    c = e.audit.conservation
    assert c.output_value == approx(hand["output"])
    assert c.input_total == approx(hand["r_x"])
    assert c.absorbed == approx(hand["bias1"] + hand["eps1"] + hand["bias2"] + hand["eps2"])
    assert c.breaks == 0.0
    assert abs(c.residual) < 1e-12 * abs(c.output_value) and c.relative_error < 1e-12
    assert c.input_total + c.absorbed + c.breaks + c.residual == approx(c.output_value, rel=1e-14)
    assert c.stranded == {}
    assert e.audit.ok and not e.audit.unexpected and not e.audit.expected
    assert e.audit.tolerance == 1e-9                       # the float64 tolerance


def test_mlp_single_layer(mlp_case):
    e, hand = mlp_case
    [layer] = e.audit.layers
    assert (layer.name, layer.nodes) == ("model", 3)
    assert layer.relevance_in == approx(hand["output"])    # the seed enters at the output
    assert layer.relevance_out == approx(hand["r_x"])      # what leaves to the input
    assert layer.absorbed == approx(hand["bias1"] + hand["eps1"] + hand["bias2"] + hand["eps2"])
    assert layer.breaks == 0.0 and layer.relative_error < 1e-12


# -- breaks by design ---------------------------------------------------------------------

def tanh_net():
    return model([node("MatMul", ["x", "W1"], ["h"], "fc1/MatMul"),
                  node("Tanh", ["h"], ["t"], "act/Tanh"),
                  node("MatMul", ["t", "W2"], ["y"], "fc2/MatMul")],
                 {"W1": W1, "W2": W2}, {"x": 4}, {"y": 3})


def test_gradient_through_tanh_breaks_there():
    """GI at the Tanh: R(h) = h ⊙ (1 − t²) ⊙ R(t)/t, which is not R(t); the difference is a break."""
    h = X @ W1
    t = np.tanh(h)
    y = t @ W2
    r_t = t * ((seed(y, TARGET) / y) @ W2.T)
    r_h = h * (1 - t ** 2) * r_t / t
    expected_break = r_t.sum() - r_h.sum()
    e = explain(tanh_net(), "boundary: inputs\nrules:\n  - {op: '*', rule: gradient}\n", "gi.yaml")
    nodes = by_name(e.audit)
    tanh = nodes["act/Tanh"]
    assert not tanh.conserving and tanh.rule == "gradient"
    assert tanh.relevance_in == approx(r_t.sum()) and tanh.relevance_out == approx(r_h.sum())
    assert tanh.breaks == approx(expected_break) and abs(expected_break) > 1e-3
    assert tanh.error == 0.0 and tanh.relative_error == 0.0
    for name in ("fc1/MatMul", "fc2/MatMul"):              # GI conserves on the linear nodes
        assert nodes[name].conserving and nodes[name].breaks == 0.0 and abs(nodes[name].error) < 1e-12
    assert [n.name for n in e.audit.expected] == ["act/Tanh"] and not e.audit.unexpected
    c = e.audit.conservation
    assert c.breaks == approx(expected_break) and c.absorbed == 0.0
    assert c.input_total == approx(r_h.sum())              # fc1 hands all of R(h) to x
    assert abs(c.residual) < 1e-12 * abs(c.output_value)


def test_gradient_on_relu_is_not_declared_conserving_but_breaks_nothing():
    """ReLU is not affine, so GI is not declared to conserve there; yet x ⊙ 1[x>0] ⊙ R/relu(x) = R:
    the node is non-conserving with a zero break, and not listed among the expected breaks."""
    net = model([node("MatMul", ["x", "W1"], ["h"], "fc1/MatMul"), node("Relu", ["h"], ["a"], "act/Relu"),
                 node("MatMul", ["a", "W2"], ["y"], "fc2/MatMul")], {"W1": W1, "W2": W2}, {"x": 4}, {"y": 3})
    e = explain(net, "boundary: inputs\nrules:\n  - {op: '*', rule: gradient}\n", "gi.yaml")
    relu = by_name(e.audit)["act/Relu"]
    assert not relu.conserving
    assert abs(relu.breaks) <= 1e-14 * abs(relu.relevance_in)
    y = np.maximum(X @ W1, 0) @ W2
    assert e.audit.conservation.input_total == approx(y[np.arange(2), TARGET].sum())


def test_stop_books_everything_arriving_as_a_break():
    V = RNG.normal(size=(4, 5))
    net = two_branch_net(W1, V, W2)
    u, tx = X @ W1, np.tanh(X)
    v = tx @ V
    z = u + v
    y = z @ W2
    r_z = z * ((seed(y, TARGET) / y) @ W2.T)
    r_u, r_v = u * r_z / z, v * r_z / z
    r_tx = tx * ((r_v / v) @ V.T)                           # z-rule through right/MatMul
    e = explain(net, "boundary: inputs\nrules:\n  - {op: Tanh, rule: stop}\n  - {op: '*', rule: zero}\n",
                "stop.yaml")
    stop = by_name(e.audit)["right/Tanh"]
    assert (stop.rule, stop.where, stop.conserving) == ("stop", "stop.yaml:3", False)
    assert stop.relevance_in == approx(r_tx.sum()) and stop.relevance_out == 0.0 and stop.absorbed == 0.0
    assert stop.breaks == approx(r_v.sum())                 # = Σ R(tx): right/MatMul conserves
    c = e.audit.conservation
    assert c.breaks == approx(r_v.sum())
    assert c.input_total == approx(r_u.sum())
    assert c.output_value == approx(y[np.arange(2), TARGET].sum())
    assert abs(c.residual) < 1e-12 * abs(c.output_value)
    assert [n.name for n in e.audit.expected] == ["right/Tanh"]


# -- stranded relevance ---------------------------------------------------------------------

def test_unmatched_node_is_reported_as_stranded():
    h = X @ W1
    t = np.tanh(h)
    y = t @ W2
    r_t = t * ((seed(y, TARGET) / y) @ W2.T)
    rules = "boundary: inputs\non_unmatched: warn\nrules:\n  - {op: MatMul, rule: zero}\n"
    with pytest.warns(UserWarning, match="have no rule"):
        e = explain(tanh_net(), rules, "warn.yaml")
    c = e.audit.conservation
    assert list(c.stranded) == ["act/Tanh"]
    assert c.stranded["act/Tanh"] == approx(r_t.sum())
    assert c.stranded["act/Tanh"] == approx(y[np.arange(2), TARGET].sum())   # no bias: all of it
    assert c.input_total == 0.0 and c.absorbed == 0.0 and c.breaks == 0.0
    assert c.residual == approx(r_t.sum())                  # stranded relevance is unexplained residual
    assert not e.audit.ok


# -- layers ---------------------------------------------------------------------------------

LAYERED_RULES = "boundary: inputs\nrules:\n  - {op: '*', rule: zero}\n"


@pytest.fixture(scope="module")
def layered():
    """x → embeddings → block 0 (dense + residual) → an unnumbered scale → block 1 (dense with
    bias + residual) → classifier, with BERT-style node names."""
    E, A0, A1, C = (RNG.normal(size=s) for s in [(4, 6), (6, 6), (6, 6), (6, 3)])
    c, d1 = RNG.uniform(0.5, 1.5, size=6), RNG.normal(size=6)
    net = model([
        node("MatMul", ["x", "E"], ["e"], "/bert/embeddings/word/MatMul"),
        node("MatMul", ["e", "A0"], ["a0"], "/bert/encoder/layer.0/dense/MatMul"),
        node("Add", ["a0", "e"], ["r0"], "/bert/encoder/layer.0/Add"),
        node("Mul", ["r0", "c"], ["m"], "/bert/encoder/scale/Mul"),
        node("MatMul", ["m", "A1"], ["b1"], "/bert/encoder/layer.1/dense/MatMul"),
        node("Add", ["b1", "d1"], ["bb"], "/bert/encoder/layer.1/dense/Add"),
        node("Add", ["bb", "m"], ["r1"], "/bert/encoder/layer.1/Add"),
        node("MatMul", ["r1", "C"], ["y"], "/classifier/MatMul"),
    ], {"E": E, "A0": A0, "c": c, "A1": A1, "d1": d1, "C": C}, {"x": 4}, {"y": 3})
    # forward
    e = X @ E
    a0 = e @ A0
    r0 = a0 + e
    m = r0 * c
    b1 = m @ A1
    bb = b1 + d1
    r1 = bb + m
    y = r1 @ C
    # the z-rule backward, node by node
    r_y = seed(y, TARGET)
    r_r1 = r1 * ((r_y / y) @ C.T)
    r_bb, r_m_skip = bb * r_r1 / r1, m * r_r1 / r1
    r_b1, absorbed_d1 = b1 * r_bb / bb, d1 * r_bb / bb
    r_m = r_m_skip + m * ((r_b1 / b1) @ A1.T)
    r_r0 = r_m                                              # the Mul by a constant hands R on
    r_a0, r_e_skip = a0 * r_r0 / r0, e * r_r0 / r0
    r_e = r_e_skip + e * ((r_a0 / a0) @ A0.T)
    r_x = X * ((r_e / e) @ E.T)
    hand = {k: float(v.sum()) for k, v in dict(y=r_y, r1=r_r1, m=r_m, e=r_e, x=r_x, d1=absorbed_d1).items()}
    return rulegraph.load(net), explain(net, LAYERED_RULES, "layers.yaml"), hand


def test_layer_names_from_node_names(layered):
    graph, e, _ = layered
    expected = {
        "/bert/embeddings/word/MatMul": "embeddings",
        "/bert/encoder/layer.0/dense/MatMul": "block 0",
        "/bert/encoder/layer.0/Add": "block 0",
        "/bert/encoder/scale/Mul": "block 0",          # unnumbered between blocks: the block before
        "/bert/encoder/layer.1/dense/MatMul": "block 1",
        "/bert/encoder/layer.1/dense/Add": "block 1",
        "/bert/encoder/layer.1/Add": "block 1",
        "/classifier/MatMul": "head",                   # after the last block
    }
    assert graph.layers == expected
    assert {n.name: n.layer for n in e.audit.nodes} == expected


def test_layer_figures_are_the_flows_across_their_borders(layered):
    _, e, hand = layered
    layers = {layer.name: layer for layer in e.audit.layers}
    assert [layer.name for layer in e.audit.layers] == ["embeddings", "block 0", "block 1", "head"]
    assert [layers[k].nodes for k in layers] == [1, 3, 3, 1]
    flows = {  # name: (in, out, absorbed)
        "head": (hand["y"], hand["r1"], 0.0),
        "block 1": (hand["r1"], hand["m"], hand["d1"]),   # both consumers of m sit in block 1
        "block 0": (hand["m"], hand["e"], 0.0),           # both consumers of e sit in block 0
        "embeddings": (hand["e"], hand["x"], 0.0),
    }
    for name, (r_in, r_out, absorbed) in flows.items():
        layer = layers[name]
        assert layer.relevance_in == approx(r_in), name
        assert layer.relevance_out == approx(r_out), name
        assert layer.absorbed == approx(absorbed), name
        assert layer.breaks == 0.0 and layer.relative_error < 1e-12, name
    assert abs(hand["d1"]) > 1e-3                         # the bias really takes a share
    c = e.audit.conservation
    assert c.input_total == approx(hand["x"]) and c.absorbed == approx(hand["d1"])
    assert abs(c.residual) < 1e-12 * abs(c.output_value)


def test_layer_names_other_conventions():
    """GPT-2 (``h.0``), ``layers_1`` and ``blocks.2`` numbering; ``patch`` marks embeddings."""
    names = ["/m/patch_embed/Mul", "/m/h.0/Mul", "/m/mid/Mul", "/m/layers_1/Mul", "/m/blocks.2/attn/Mul",
             "/m/norm/Mul", "/m/head/Mul"]
    values = ["x"] + [f"v{i}" for i in range(len(names))]
    net = model([node("Mul", [a, "c"], [b], n) for n, a, b in zip(names, values[:-1], values[1:])],
                {"c": np.full(4, 2.0)}, {"x": 4}, {values[-1]: 4})
    graph = rulegraph.load(net)
    assert [graph.layers[n] for n in names] == ["embeddings", "block 0", "block 0", "block 1", "block 2",
                                                "head", "head"]
