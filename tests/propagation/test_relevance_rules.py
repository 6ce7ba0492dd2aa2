"""Each rule against an independent closed form, on one node, in float64.

The references are written out from the formulas (Ali et al. 2022, Sec. 4 for AH
and LN), not from the rule implementations: matrices and einsums, no VJPs.
"""
from __future__ import annotations

import pytest
import torch

from rulegraph.ir import Node
from rulegraph.ops import lookup
from rulegraph.propagation import RULES
from rulegraph.propagation.signal import Contribution, Incoming, Site

F64 = torch.float64
torch.manual_seed(0)


def apply(rule_name: str, op: str, inputs: list, relevance: torch.Tensor, *, tainted=None, signal=False,
          params=None, **attrs):
    """Run one rule on one node; returns (relevance per input, absorbed extra, output)."""
    spec = lookup(op)
    attrs = {**spec.defaults, **attrs}        # as the interpreter completes them
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
    rule = RULES["relevance"].get(rule_name)(**(params or {}))
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


# -- attention and layer norm (Ali et al. 2022, Sec. 4) ---------------------------------------------------

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


def test_ln_rule_on_instance_norm_closed_form():
    """GroupNorm's export (InstanceNormalization, PoolFormer): per item and channel, the linear map
    αC over the spatial positions (α = 1/√(Var+ε) of that channel) times γ_c, plus β_c."""
    n, c, h, w = 2, 3, 2, 4
    x, gamma, beta, r = rand(n, c, h, w) * 2 + 0.5, rand(c), rand(c), rand(n, c, h, w)
    rel, _, y = apply("ln", "InstanceNormalization", [x, gamma, beta], r, tainted=[True, False, False],
                      epsilon=1e-5)
    m = h * w
    centering = torch.eye(m, dtype=F64) - torch.full((m, m), 1.0 / m, dtype=F64)
    reference = torch.zeros_like(x)
    for i in range(n):
        for k in range(c):
            xs, rs, ys = x[i, k].reshape(-1), r[i, k].reshape(-1), y[i, k].reshape(-1)
            alpha = 1.0 / torch.sqrt(xs.var(unbiased=False) + 1e-5)
            reference[i, k] = torch.einsum("p,pq,q->p", xs, alpha * centering * gamma[k], rs / ys).reshape(h, w)
    close(rel[0], reference)
    absorbed = (beta.reshape(1, c, 1, 1) * (r / y)).sum()
    close(rel[0].sum() + absorbed, r.sum())
    close(rel[2].sum(), absorbed)


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
    rel, _, _ = apply("route", "Transpose", [x], r, signal=signal, perm=[2, 1, 0])
    close(rel[0], r.permute(2, 1, 0))
    r = rand(2, 2, 4)
    rel, _, _ = apply("route", "Slice", [x, [1], [3], [1], [1]], r, tainted=[True, False, False, False, False])
    expected = torch.zeros_like(x)
    expected[:, 1:3] = r
    close(rel[0], expected)
    r = rand(2, 3, 4)
    rel, _, _ = apply("route", "Gather", [x, torch.tensor([0, 2, 0])], r, tainted=[True, False], axis=1)
    expected = torch.zeros_like(x)
    expected[:, 0] = r[:, 0] + r[:, 2]
    expected[:, 2] = r[:, 1]
    close(rel[0], expected)


def test_pass_through_concat_absorbs_the_constant_piece():
    x, c = rand(2, 3), rand(2, 2)
    r = rand(2, 5)
    rel, _, _ = apply("route", "Concat", [x, c], r, tainted=[True, False], axis=1)
    close(rel[0], r[:, :3])
    close(rel[1], r[:, 3:])
    x, r = rand(2, 1, 3), rand(2, 4, 3)
    rel, _, _ = apply("route", "Expand", [x, [2, 4, 3]], r, tainted=[True, False])
    close(rel[0], r.sum(1, keepdim=True))


def test_detaching_every_input_is_a_break_not_conservation():
    from rulegraph.propagation.gradient import Gradient
    node = Node("n", "Mul", ("a", "b"), ("o",))
    assert Gradient(detach=[1]).conserves(node, lookup("Mul"), [True, True])
    assert not Gradient(detach=[0, 1]).conserves(node, lookup("Mul"), [True, True])


# -- ε without bias, γ, αβ, z⁺, flat, w², zB (references written from the formulas, per element) -----

def stab(z, eps):
    """z + ε·sign z, sign 0 := +1 (Zennit's stabiliser)."""
    return z + eps * torch.where(z >= 0, 1.0, -1.0).to(F64)


def distribute(contrib, denom, r):
    """R_i = Σ_j contrib_ij / denom_j · R_j, for a batch: contrib (B, I, J), denom and r (B, J)."""
    return torch.einsum("bij,bj->bi", contrib, r / denom)


def test_epsilon_without_bias_leaves_the_bias_out_of_z():
    x, w, b, r = rand(3, 5), rand(5, 4), rand(4), rand(3, 4)
    rel, extra, _ = apply("epsilon", "Gemm", [x, w, b], r, tainted=[True, False, False],
                          params={"epsilon": 0.01, "bias": False})
    contrib = torch.einsum("bi,ij->bij", x, w)
    close(rel[0], distribute(contrib, stab(contrib.sum(1), 0.01), r))
    assert rel[2] is None                                        # the bias absorbs nothing
    close(rel[0].sum() + sum(extra), r.sum())                    # ε absorbs the rest


def gemm_case(positive_x=False):
    x = rand(4, 6)
    if positive_x:
        x = x.abs()
    return x, rand(6, 5), rand(5), rand(4, 5)


@pytest.mark.parametrize("gamma", [0.0, 0.25, 1.0])
def test_gamma_on_positive_inputs_is_montavon_eq7(gamma):
    """x ≥ 0, z_j > 0: R_i = Σ_j x_i (w_ij + γ w_ij⁺) / (Σ_i' x_i' (w_i'j + γ w_i'j⁺) + b_j + γ b_j⁺ + ε) R_j."""
    x, w, b, r = gemm_case(positive_x=True)
    rel, extra, z = apply("gamma", "Gemm", [x, w, b], r, tainted=[True, False, False], params={"gamma": gamma})
    contrib = torch.einsum("bi,ij->bij", x, w + gamma * w.clamp(min=0))
    pos = distribute(contrib, stab(contrib.sum(1) + b + gamma * b.clamp(min=0), 1e-6), r * (z > 0))
    contrib_n = torch.einsum("bi,ij->bij", x, w + gamma * w.clamp(max=0))
    neg = distribute(contrib_n, stab(contrib_n.sum(1) + b + gamma * b.clamp(max=0), 1e-6), r * (z < 0))
    close(rel[0], pos + neg)
    close(rel[0].sum() + sum(extra), r.sum())


def test_gamma_signed_inputs_crosses_weight_signs():
    """Signed x (Zennit's generalised γ): positive outputs favour x⁺w⁺ and x⁻w⁻, negative the reverse."""
    x, w, b, r = gemm_case()
    g = 0.5
    rel, extra, z = apply("gamma", "Gemm", [x, w, b], r, tainted=[True, False, False], params={"gamma": g})
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(w.shape[1]):
            if z[n, j] == 0:
                continue
            up = z[n, j] > 0
            c = []
            for i in range(x.shape[1]):
                favoured = max(w[i, j], 0) if (x[n, i] > 0) == bool(up) else min(w[i, j], 0)
                c.append(x[n, i] * (w[i, j] + g * favoured))
            bias = b[j] + g * (max(b[j], 0) if up else min(b[j], 0))
            denom = sum(c) + bias
            denom = denom + 1e-6 * (1 if denom >= 0 else -1)
            for i in range(x.shape[1]):
                out[n, i] += c[i] / denom * r[n, j]
    close(rel[0], out)
    close(rel[0].sum() + sum(extra), r.sum())


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (2.0, 1.0), (1.5, 0.5)])
def test_alphabeta_on_signed_contributions(alpha, beta):
    x, w, b, r = gemm_case()
    rel, extra, _ = apply("alphabeta", "Gemm", [x, w, b], r, tainted=[True, False, False],
                          params={"alpha": alpha, "beta": beta})
    c = torch.einsum("bi,ij->bij", x, w)                         # contributions x_i w_ij
    p, n = c.clamp(min=0), c.clamp(max=0)
    reference = (alpha * distribute(p, stab(p.sum(1) + b.clamp(min=0), 1e-6), r)
                 - beta * distribute(n, stab(n.sum(1) + b.clamp(max=0), 1e-6), r))
    close(rel[0], reference)
    close(rel[0].sum() + sum(extra), r.sum())


def test_zplus_uses_positive_contributions_not_positive_weights():
    x, w, b, r = gemm_case()
    rel, _, _ = apply("zplus", "Gemm", [x, w, b], r, tainted=[True, False, False])
    ab, _, _ = apply("alphabeta", "Gemm", [x, w, b], r, tainted=[True, False, False],
                     params={"alpha": 1.0, "beta": 0.0})
    close(rel[0], ab[0])
    wplus = torch.einsum("bi,ij->bij", x, w.clamp(min=0))        # the w⁺-only variant differs on signed x
    assert float((rel[0] - distribute(wplus, stab(wplus.sum(1) + b.clamp(min=0), 1e-6), r)).abs().max()) > 1e-3


def test_alphabeta_requires_alpha_minus_beta_one():
    from rulegraph.errors import RuleFileError
    from rulegraph.ruleset import RuleSet
    text = "rules:\n  - op: Gemm\n    rule: alphabeta\n    params: {alpha: 2, beta: 2}\n"
    with pytest.raises(RuleFileError, match=r"<string>:4: bad params for rule 'alphabeta': alpha − beta must be 1"):
        RuleSet.from_yaml(text)


def test_flat_and_wsquare_on_gemm():
    x, w, b, r = gemm_case()
    rel, extra, _ = apply("flat", "Gemm", [x, w, b], r, tainted=[True, False, False])
    close(rel[0], (r / (6 + 1e-6)).sum(1, keepdim=True).expand(4, 6))   # every input of the 6 gets R_j / 6
    close(rel[0].sum() + sum(extra), r.sum())
    rel, extra, _ = apply("wsquare", "Gemm", [x, w, b], r, tainted=[True, False, False])
    w2 = (w ** 2).expand(4, 6, 5)
    close(rel[0], distribute(w2, stab(w2.sum(1) + b ** 2, 1e-6), r))
    close(rel[0].sum() + sum(extra), r.sum())


def test_flat_on_padded_conv_counts_the_receptive_field():
    """1-d conv, kernel 3, pad 1: edge outputs see 2 inputs, the others 3."""
    x, w, b, r = rand(1, 2, 5), rand(4, 2, 3), rand(4), rand(1, 4, 5)
    rel, _, _ = apply("flat", "Conv", [x, w, b], r, tainted=[True, False, False], pads=[1, 1])
    reference = torch.zeros_like(x)
    for j in range(5):                       # output position
        inputs = [(c, i) for c in range(2) for i in range(j - 1, j + 2) if 0 <= i < 5]
        for c, i in inputs:
            reference[0, c, i] += r[0, :, j].sum() / (len(inputs) + 1e-6)
    close(rel[0], reference)


@pytest.mark.parametrize("bounds", [(-1.0, 2.0), ([-1.0, -2.0, 0.0], [1.0, 2.0, 3.0])])
def test_zbox_on_a_pointwise_conv(bounds):
    """R_i = Σ_j (x_i w_ij − l_i w_ij⁺ − h_i w_ij⁻) / Σ_i' (…) · R_j, per pixel (1×1 conv = channel matmul)."""
    low, high = bounds
    lows = torch.tensor(low if isinstance(low, list) else [low] * 3, dtype=F64)
    highs = torch.tensor(high if isinstance(high, list) else [high] * 3, dtype=F64)
    x = lows.reshape(1, 3, 1, 1) + (highs - lows).reshape(1, 3, 1, 1) * torch.rand(2, 3, 4, 4, dtype=F64)
    w, b, r = rand(5, 3, 1, 1), rand(5), rand(2, 5, 4, 4)
    rel, extra, _ = apply("zbox", "Conv", [x, w, b], r, tainted=[True, False, False],
                          params={"low": low if isinstance(low, list) else [low],
                                  "high": high if isinstance(high, list) else [high]})
    xs = x.permute(0, 2, 3, 1).reshape(-1, 3)                   # pixels × channels
    wm = w[:, :, 0, 0].T                                         # channels × outputs
    c = (torch.einsum("bi,ij->bij", xs, wm) - torch.einsum("i,ij->ij", lows, wm.clamp(min=0))
         - torch.einsum("i,ij->ij", highs, wm.clamp(max=0)))
    rs = r.permute(0, 2, 3, 1).reshape(-1, 5)
    reference = distribute(c, stab(c.sum(1), 1e-6), rs).reshape(2, 4, 4, 3).permute(0, 3, 1, 2)
    close(rel[0], reference)
    close(rel[0].sum() + sum(extra), r.sum())


def test_modified_weight_rules_on_matmul_with_weight_first():
    """y = W·x (the weight as input 0): the rules follow the op, not a fixed input position."""
    w, x, r = rand(5, 6), rand(6, 3), rand(5, 3)
    rel, _, _ = apply("alphabeta", "MatMul", [w, x], r, tainted=[False, True])
    c = torch.einsum("ji,ib->bij", w, x)
    p, n = c.clamp(min=0), c.clamp(max=0)
    reference = 2 * distribute(p, stab(p.sum(1), 1e-6), r.T) - distribute(n, stab(n.sum(1), 1e-6), r.T)
    close(rel[1], reference.T)


# -- AttnLRP (Achtibat et al. 2024) ------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("signal", [False, True])
def test_softmax_rule_is_proposition_3_1(axis, signal):
    x, r = rand(2, 4, 5), rand(2, 4, 5)
    rel, _, s = apply("softmax", "Softmax", [x], r, axis=axis, signal=signal)
    close(rel[0], x * (r - s * r.sum(axis, keepdim=True)))


def test_uniform_rule_splits_a_product_of_activations_in_half():
    a, b, r = rand(3, 4), rand(4, 5), rand(3, 5)
    rel, extra, z = apply("uniform", "MatMul", [a, b], r)
    close(rel[0], torch.einsum("ik,kj,ij->ik", a, b, r / z) / 2)
    close(rel[1], torch.einsum("ik,kj,ij->kj", a, b, r / z) / 2)
    close(rel[0].sum() + rel[1].sum(), r.sum())
    rel, extra, z = apply("uniform", "Mul", [a, a.flip(0)], r[:, :4], params={"epsilon": 0.1})
    close(rel[0], r[:, :4] * z / stab(z, 0.1) / 2)
    close(rel[0].sum() + rel[1].sum() + sum(extra), r[:, :4].sum())



@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_uniform_rule_splits_scores_on_the_smaller_side_bit_for_bit(dtype):
    """Q·Kᵀ's L × L signal is split after the VJP, on Q and K (a power of two divides exactly): the
    same bits as halving the scores' signal first, and the closed form."""
    from rulegraph.propagation.gradient import _gradient_contributions
    q, k = torch.randn(2, 24, 4, dtype=dtype), torch.randn(2, 4, 24, dtype=dtype)
    z = q @ k
    g = torch.randn(2, 24, 24, dtype=dtype)
    incoming = Incoming(z)
    incoming.add(Contribution(signal=g))
    node = Node("n", "MatMul", ("q", "k"), ("o",), {})
    site = Site(node=node, spec=lookup("MatMul"), attrs={}, inputs=[q, k], outputs=[z], tainted=[True, True],
                incoming=[incoming])
    split = RULES["relevance"].get("uniform")().propagate(site)
    halved_first = _gradient_contributions(site, [True, True], [g / 2])
    for c, reference in zip(split, halved_first):
        assert torch.equal(c.signal, reference.signal)
    r = (z * g).to(F64)
    close(q.to(F64) * split[0].signal.to(F64), torch.einsum("bik,bkj,bij->bik", q.to(F64), k.to(F64), g.to(F64)) / 2,
          tol=1e-5 if dtype == torch.float32 else 1e-12)
    close((q * split[0].signal).sum().to(F64) + (k * split[1].signal).sum().to(F64), r.sum(),
          tol=1e-4 if dtype == torch.float32 else 1e-12)

# -- gated products: signal-take-all (Arras et al. 2017) ------------------------------------------

@pytest.mark.parametrize("signal", [False, True])
@pytest.mark.parametrize("order", ["gate last", "gate first"])
def test_gate_hands_all_relevance_to_the_signal(signal, order):
    """SiLU x·σ(x) and squeeze-and-excitation x·σ(s) with s per channel: R(x) = R, the gate gets none."""
    x, r = rand(2, 4, 3, 3), rand(2, 4, 3, 3)
    # hard sigmoid is 0 below −3, where x·gate = 0 carries no relevance: drawn above it, whatever tests ran before
    squeeze = rand(2, 4, 1, 1).clamp(-2.9, 2.9)
    for gate in (torch.sigmoid(x), torch.nn.functional.hardsigmoid(squeeze)):   # SiLU, then SE
        inputs, k = ([x, gate], 1) if order == "gate last" else ([gate, x], 0)
        rel, extra, z = apply("gate", "Mul", inputs, r, signal=signal, params={"gate": k})
        reference = torch.where(z == 0, 0.0, x * gate / torch.where(z == 0, 1.0, z) * r)  # x_i g_i / z_i · R_i
        close(rel[1 - k], reference)
        close(rel[1 - k], r)
        assert rel[k] is None and not extra


def test_gate_check_names_what_is_wrong():
    from rulegraph.propagation.gradient import Gate
    node, spec = Node("n", "Mul", ("a", "b"), ("o",)), lookup("Mul")
    assert Gate(gate=1).check(node, spec, [True, True]) is None
    assert Gate(gate=1).conserves(node, spec, [True, True])
    assert "gate=2 but the node has 2 inputs" in Gate(gate=2).check(node, spec, [True, True])
    assert "must depend on the model's input" in Gate(gate=1).check(node, spec, [False, True])
    assert "it applies to Mul" in Gate().check(Node("n", "Add", ("a", "b"), ("o",)), lookup("Add"), [True, True])
