"""Each rule against an independent closed form, on one node, in float64.

The references are written out from the formulas (DESIGN.md; seeds/002 Sec. 4 for AH
and LN), not from the rule implementations: matrices and einsums, no VJPs.
"""
from __future__ import annotations

import pytest
import torch

from rulegraph.ir import Node
from rulegraph.ops import lookup
from rulegraph.rules import RULES, Contribution, Incoming, Site

F64 = torch.float64
torch.manual_seed(0)


def apply(rule_name: str, op: str, inputs: list, relevance: torch.Tensor, *, tainted=None, signal=False,
          params=None, **attrs):
    """Run one rule on one node; returns (relevance per input, absorbed extra, output)."""
    spec = lookup(op)
    out = spec.forward(*inputs, **attrs)
    outputs = list(out) if isinstance(out, tuple) else [out]
    incoming = Incoming(outputs[0])
    if signal:  # the same relevance handed over as output ⊙ signal
        incoming.add(Contribution(signal=relevance / outputs[0]))
    else:
        incoming.add(Contribution(relevance=relevance))
    tainted = tainted if tainted is not None else [isinstance(x, torch.Tensor) for x in inputs]
    node = Node("n", op, tuple(f"i{k}" for k in range(len(inputs))), ("o",), attrs)
    site = Site(node=node, spec=spec, attrs=attrs, inputs=inputs, outputs=outputs, tainted=tainted,
                incoming=[incoming] + [None] * (len(outputs) - 1))
    rule = RULES[rule_name](**(params or {}))
    contributions = rule.propagate(site)
    rel = [c.tensor(x) if c is not None else None for c, x in zip(contributions, inputs)]
    return rel, [t.sum() for t in site.absorbed], outputs[0]


def rand(*shape):
    return torch.randn(*shape, dtype=F64)


def close(a, b, tol=1e-10):
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


# -- linear layers ------------------------------------------------------------------------------

def lrp_epsilon_linear(x, w, b, r, eps):
    """Zennit-style reference: R_i = Σ_j x_i w_ij R_j / (z_j + ε sign z_j), z = xW + b."""
    z = x @ w + b
    sign = torch.where(z >= 0, 1.0, -1.0).to(F64)
    return torch.einsum("bi,ij,bj->bi", x, w, r / (z + eps * sign))


@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.5])
@pytest.mark.parametrize("signal", [False, True])
def test_epsilon_on_gemm(eps, signal):
    x, w, b, r = rand(3, 5), rand(5, 4), rand(4), rand(3, 4)
    rel, extra, z = apply("epsilon", "Gemm", [x, w, b], r, tainted=[True, False, False], signal=signal,
                          params={"epsilon": eps})
    close(rel[0], lrp_epsilon_linear(x, w, b, r, eps))
    sign = torch.where(z >= 0, 1.0, -1.0).to(F64)
    s = r / (z + eps * sign)
    close(rel[2], b * s.sum(0))                       # the bias absorbs b_j · R_j / (z_j + ε)
    if eps:
        close(sum(extra), (s * eps * sign).sum())     # the stabiliser absorbs the rest
    close(rel[0].sum() + rel[2].sum() + sum(extra, torch.zeros((), dtype=F64)), r.sum())


def test_zero_rule_is_epsilon_zero_and_gradient_on_affine_ops():
    x, w, b, r = rand(2, 5), rand(5, 3), rand(3), rand(2, 3)
    zero, _, _ = apply("zero", "Gemm", [x, w, b], r, tainted=[True, False, False])
    grad, _, _ = apply("gradient", "Gemm", [x, w, b], r, tainted=[True, False, False])
    reference = lrp_epsilon_linear(x, w, b, r, 0.0)
    close(zero[0], reference)
    close(grad[0], reference)


def test_epsilon_on_matmul_with_transposed_weight_and_batch():
    x, w, r = rand(2, 3, 5), rand(5, 4), rand(2, 3, 4)
    rel, _, _ = apply("epsilon", "MatMul", [x, w], r, tainted=[True, False], params={"epsilon": 0.1})
    close(rel[0], lrp_epsilon_linear(x.reshape(6, 5), w, torch.zeros(4, dtype=F64), r.reshape(6, 4), 0.1).reshape(2, 3, 5))


# -- attention and layer norm (seeds/002, Sec. 4) ---------------------------------------------------

def test_ah_rule_closed_form():
    """R(x_i) = Σ_j x_i p_ij / Σ_i' x_i' p_i'j · R(y_j), with y = P·V per head; P gets none."""
    p = torch.softmax(rand(2, 4, 6, 6), -1)
    v, r = rand(2, 4, 6, 3), rand(2, 4, 6, 3)
    rel, _, y = apply("ah", "MatMul", [p, v], r)
    contrib = torch.einsum("bhji,bhik->bhjik", p, v)             # p_ji · v_ik, for output row j
    reference = (contrib / contrib.sum(3, keepdim=True) * r.unsqueeze(3)).sum(2)
    assert rel[0] is None
    close(rel[1], reference)
    close(rel[1].sum(), r.sum())


@pytest.mark.parametrize("with_bias", [True, False])
def test_ln_rule_closed_form(with_bias):
    """LN as the linear map αC (C = I − 11ᵀ/N) times γ, plus β: the z-rule with those weights."""
    n = 7
    x, gamma, beta, r = rand(3, n) * 3 + 1, rand(n), rand(n), rand(3, n)
    inputs = [x, gamma, beta] if with_bias else [x, gamma]
    rel, _, y = apply("ln", "LayerNormalization", inputs, r, tainted=[True] + [False] * (len(inputs) - 1),
                      epsilon=1e-5)
    centering = torch.eye(n, dtype=F64) - torch.full((n, n), 1.0 / n, dtype=F64)
    reference = torch.zeros_like(x)
    for b in range(3):
        alpha = 1.0 / torch.sqrt(x[b].var(unbiased=False) + 1e-5)
        weights = alpha * centering * gamma                      # W_ij = α (δ_ij − 1/N) γ_j
        reference[b] = torch.einsum("i,ij,j->i", x[b], weights, r[b] / y[b])
    close(rel[0], reference)
    absorbed = (beta * (r / y)).sum() if with_bias else 0.0
    close(rel[0].sum() + absorbed, r.sum())


def test_ln_rule_on_decomposed_layer_norm_divides_by_a_constant():
    centered, std, r = rand(2, 5), rand(2, 1).abs() + 0.5, rand(2, 5)
    rel, _, _ = apply("ln", "Div", [centered, std], r, tainted=[True, True])
    close(rel[0], r)
    assert rel[1] is None


# -- gradient, identity, pass, stop ----------------------------------------------------------------

def test_gradient_on_erf_is_gradient_times_input():
    x, r = rand(4, 6), rand(4, 6)
    rel, _, y = apply("gradient", "Erf", [x], r)
    derivative = 2 / torch.pi ** 0.5 * torch.exp(-x * x)
    close(rel[0], x * derivative * r / y)


def test_gradient_on_softmax():
    x, r = rand(3, 5), rand(3, 5)
    rel, _, p = apply("gradient", "Softmax", [x], r, axis=-1)
    g = r / p
    jacobian_t = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    close(rel[0], x * torch.einsum("bij,bj->bi", jacobian_t, g))


def test_gradient_with_a_detached_gate_passes_relevance_whole():
    """GELU/SiLU as x · gate(x) with the gate held constant: R_x = R (the identity rule's effect)."""
    x, r = rand(3, 4), rand(3, 4)
    gate = torch.sigmoid(x)
    rel, _, _ = apply("gradient", "Mul", [x, gate], r, params={"detach": [1]})
    close(rel[0], r)
    assert rel[1] is None


def test_identity_and_stop():
    x, r = rand(2, 3), rand(2, 3)
    rel, _, _ = apply("identity", "Tanh", [x], r)
    close(rel[0], r)
    rel, _, _ = apply("stop", "Tanh", [x], r)
    assert rel == [None]


@pytest.mark.parametrize("signal", [False, True])
def test_pass_routes_relevance_by_index(signal):
    x = rand(2, 3, 4)
    r = rand(4, 3, 2)
    rel, _, _ = apply("pass", "Transpose", [x], r, signal=signal, perm=[2, 1, 0])
    close(rel[0], r.permute(2, 1, 0))
    r = rand(2, 2, 4)
    rel, _, _ = apply("pass", "Slice", [x, [1], [3], [1], [1]], r, tainted=[True, False, False, False, False])
    expected = torch.zeros_like(x)
    expected[:, 1:3] = r
    close(rel[0], expected)
    r = rand(2, 3, 4)
    rel, _, _ = apply("pass", "Gather", [x, torch.tensor([0, 2, 0])], r, tainted=[True, False], axis=1)
    expected = torch.zeros_like(x)
    expected[:, 0] = r[:, 0] + r[:, 2]
    expected[:, 2] = r[:, 1]
    close(rel[0], expected)


def test_pass_through_concat_absorbs_the_constant_piece():
    x, c = rand(2, 3), rand(2, 2)
    r = rand(2, 5)
    rel, _, _ = apply("pass", "Concat", [x, c], r, tainted=[True, False], axis=1)
    close(rel[0], r[:, :3])
    close(rel[1], r[:, 3:])
    x, r = rand(2, 1, 3), rand(2, 4, 3)
    rel, _, _ = apply("pass", "Expand", [x, [2, 4, 3]], r, tainted=[True, False])
    close(rel[0], r.sum(1, keepdim=True))


def test_detaching_every_input_is_a_break_not_conservation():
    from rulegraph.rules import Gradient
    node = Node("n", "Mul", ("a", "b"), ("o",))
    assert Gradient(detach=[1]).conserves(node, lookup("Mul"), [True, True])
    assert not Gradient(detach=[0, 1]).conserves(node, lookup("Mul"), [True, True])
