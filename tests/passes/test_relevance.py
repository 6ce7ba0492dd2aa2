"""The relevance walk on hand-built ONNX graphs, against relevance computed by hand in numpy.

Each test builds a small float64 graph, runs ``rulegraph.explain`` with an inline rule
file in float64, and compares the relevance read at the input with a closed-form
computation of the same rules written independently here (LRP-ε, the z-rule,
Gradient×Input, ``identity``, ``stop``): the library's output is never its own reference.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import rulegraph
from handbuilt import model, node, seed, stabilize, two_branch_net
from rulegraph import RuleSet

F64 = torch.float64
RNG = np.random.default_rng(7)
X = RNG.normal(size=(3, 4))                    # three items, four features
W1, B1 = RNG.normal(size=(4, 5)), RNG.normal(size=5)
W2, B2 = RNG.normal(size=(5, 3)), RNG.normal(size=3)
TARGET = [0, 2, 1]


def close(got, expected, rtol=1e-12):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), expected, rtol=rtol, atol=1e-13)


def run(onnx_model, rules: str, feeds: dict[str, np.ndarray], target=TARGET, source="walk.yaml", **kwargs):
    return rulegraph.explain(onnx_model, RuleSet.from_yaml(rules, source=source),
                             {k: torch.from_numpy(v) for k, v in feeds.items()}, target=target, dtype=F64, **kwargs)


# -- a two-layer MLP under LRP-ε ------------------------------------------------------------

def mlp():
    """y = relu(x·W1 + b1)·W2 + b2, two Gemm nodes and a Relu."""
    return model([node("Gemm", ["x", "W1", "b1"], ["h"], "fc1/Gemm"),
                  node("Relu", ["h"], ["a"], "act/Relu"),
                  node("Gemm", ["a", "W2", "b2"], ["y"], "fc2/Gemm")],
                 {"W1": W1, "b1": B1, "W2": W2, "b2": B2}, {"x": 4}, {"y": 3})


def mlp_rules(epsilon: float) -> str:
    return f"""\
boundary: inputs
rules:
  - op: Gemm
    rule: epsilon
    params: {{epsilon: {epsilon}}}
  - op: Relu
    rule: identity
"""


def lrp_epsilon_mlp(epsilon: float, target=TARGET) -> dict[str, np.ndarray]:
    """LRP-ε by hand: R_i = x_i Σ_j w_ij R_j / (z_j + ε sign z_j) per linear layer, ReLU passes R on."""
    h = X @ W1 + B1
    a = np.maximum(h, 0)
    y = a @ W2 + B2
    r_y = seed(y, target)
    s2 = r_y / stabilize(y, epsilon)
    r_a = a * (s2 @ W2.T)
    r_h = r_a                                          # identity on the ReLU
    s1 = r_h / stabilize(h, epsilon)
    r_x = X * (s1 @ W1.T)
    return dict(h=h, a=a, y=y, r_y=r_y, s2=s2, r_a=r_a, r_h=r_h, s1=s1, r_x=r_x)


@pytest.mark.parametrize("epsilon", [0.0, 0.25, 3.0])
def test_mlp_epsilon_input_relevance(epsilon):
    ref = lrp_epsilon_mlp(epsilon)
    e = run(mlp(), mlp_rules(epsilon), {"x": X})
    assert e.target == TARGET
    close(e.output_value, ref["y"][np.arange(3), TARGET])
    close(e.boundary["x"].numpy(), ref["r_x"])
    close(e.relevance["x"].numpy(), ref["r_x"])       # a [batch, features] input: scores are the relevance


def test_mlp_epsilon_default_target_is_the_argmax():
    y = np.maximum(X @ W1 + B1, 0) @ W2 + B2
    argmax = y.argmax(1).tolist()
    e = run(mlp(), mlp_rules(0.5), {"x": X}, target=None)
    assert e.target == argmax
    close(e.boundary["x"].numpy(), lrp_epsilon_mlp(0.5, argmax)["r_x"])


def test_larger_epsilon_keeps_less_relevance():
    """ε only absorbs: Σ R(x) shrinks in magnitude towards 0 as ε grows (hand numbers, per item)."""
    totals = [lrp_epsilon_mlp(eps)["r_x"].sum(1) for eps in (0.0, 1.0, 100.0)]
    got = [run(mlp(), mlp_rules(eps), {"x": X}).boundary["x"].numpy().sum(1) for eps in (0.0, 1.0, 100.0)]
    close(np.array(got), np.array(totals))
    assert np.all(np.abs(got[2]) < 0.05 * np.abs(got[0]))


def test_matmul_plus_add_equals_the_gemm():
    """A linear layer exported as MatMul + Add: z-rule on the MatMul and ε on the bias Add gives LRP-ε
    of the whole layer (the split the shipped ``epsilon`` rule set uses on transformers)."""
    split = model([node("MatMul", ["x", "W1"], ["m1"], "fc1/MatMul"), node("Add", ["m1", "b1"], ["h"], "fc1/Add"),
                   node("Relu", ["h"], ["a"], "act/Relu"),
                   node("MatMul", ["a", "W2"], ["m2"], "fc2/MatMul"), node("Add", ["m2", "b2"], ["y"], "fc2/Add")],
                  {"W1": W1, "b1": B1, "W2": W2, "b2": B2}, {"x": 4}, {"y": 3})
    rules = """\
boundary: inputs
rules:
  - op: Add
    rule: epsilon
    params: {epsilon: 0.25}
  - op: MatMul
    rule: zero
  - op: Relu
    rule: identity
"""
    close(run(split, rules, {"x": X}).boundary["x"].numpy(), lrp_epsilon_mlp(0.25)["r_x"])


# -- Gradient×Input and breaks --------------------------------------------------------------

def tanh_net(tanh_name="act/Tanh"):
    """y = tanh(x·W1)·W2 (no biases)."""
    return model([node("MatMul", ["x", "W1"], ["h"], "fc1/MatMul"),
                  node("Tanh", ["h"], ["t"], tanh_name),
                  node("MatMul", ["t", "W2"], ["y"], "fc2/MatMul")],
                 {"W1": W1, "W2": W2}, {"x": 4}, {"y": 3})


def test_gradient_everywhere_is_gradient_times_input():
    """GI in closed form: R(x) = x ⊙ ∂y_k/∂x = x ⊙ (((1 − t²) ⊙ W2[:, k]) W1ᵀ)."""
    t = np.tanh(X @ W1)
    grad = ((1 - t ** 2) * W2[:, TARGET].T) @ W1.T
    e = run(tanh_net(), "boundary: inputs\nrules:\n  - op: '*'\n    rule: gradient\n", {"x": X})
    close(e.boundary["x"].numpy(), X * grad)


def test_identity_on_tanh_is_the_z_rule_through_it():
    """With ``identity`` on the Tanh the relevance at tanh's input is the relevance at its output."""
    h = X @ W1
    t = np.tanh(h)
    y = t @ W2
    r_t = t * ((seed(y, TARGET) / y) @ W2.T)
    r_x = X * ((r_t / h) @ W1.T)
    rules = "boundary: inputs\nrules:\n  - {op: Tanh, rule: identity}\n  - {op: MatMul, rule: zero}\n"
    close(run(tanh_net(), rules, {"x": X}).boundary["x"].numpy(), r_x)


def test_stop_drops_one_branch_and_keeps_the_other():
    """y = (x·W1 + tanh(x)·V)·W2; ``stop`` on the Tanh: only the MatMul branch reaches x."""
    V = RNG.normal(size=(4, 5))
    net = two_branch_net(W1, V, W2)
    rules = "boundary: inputs\nrules:\n  - {op: Tanh, rule: stop}\n  - {op: '*', rule: zero}\n"
    u, v = X @ W1, np.tanh(X) @ V
    z = u + v
    y = z @ W2
    r_z = z * ((seed(y, TARGET) / y) @ W2.T)
    r_u = u * r_z / z
    e = run(net, rules, {"x": X})
    close(e.boundary["x"].numpy(), X * ((r_u / u) @ W1.T))


# -- fan-out: one value, two consumers ------------------------------------------------------

def test_relevance_from_two_consumers_accumulates():
    """h feeds a MatMul and an elementwise Mul whose outputs are added: R(h) is the sum of what
    both consumers hand back, and R(x) follows from that sum."""
    Wa, c = RNG.normal(size=(5, 5)), RNG.normal(size=5)
    net = model([node("MatMul", ["x", "W1"], ["h"], "fc1/MatMul"),
                 node("MatMul", ["h", "Wa"], ["p"], "branch_a/MatMul"),
                 node("Mul", ["h", "c"], ["q"], "branch_b/Mul"),
                 node("Add", ["p", "q"], ["z"], "merge/Add"),
                 node("MatMul", ["z", "W2"], ["y"], "out/MatMul")],
                {"W1": W1, "Wa": Wa, "c": c, "W2": W2}, {"x": 4}, {"y": 3})
    h = X @ W1
    p, q = h @ Wa, h * c
    z = p + q
    y = z @ W2
    r_z = z * ((seed(y, TARGET) / y) @ W2.T)
    r_p, r_q = p * r_z / z, q * r_z / z
    r_h_from_a = h * ((r_p / p) @ Wa.T)
    r_h_from_b = r_q                                   # z-rule through q = h ⊙ c hands R(q) on unchanged
    r_h = r_h_from_a + r_h_from_b
    r_x = X * ((r_h / h) @ W1.T)
    e = run(net, "boundary: inputs\nrules:\n  - {op: '*', rule: zero}\n", {"x": X})
    close(e.boundary["x"].numpy(), r_x)
    # and neither branch alone would give it
    assert not np.allclose(e.boundary["x"].numpy(), X * ((r_h_from_a / h) @ W1.T))
    assert not np.allclose(e.boundary["x"].numpy(), X * ((r_h_from_b / h) @ W1.T))


def test_input_consumed_twice_sums_at_the_boundary():
    """The graph input itself feeds two MatMuls: its relevance is the sum of both."""
    W3 = RNG.normal(size=(4, 5))
    net = model([node("MatMul", ["x", "W1"], ["u"], "a/MatMul"), node("MatMul", ["x", "W3"], ["w"], "b/MatMul"),
                 node("Add", ["u", "w"], ["z"], "merge/Add"), node("MatMul", ["z", "W2"], ["y"], "out/MatMul")],
                {"W1": W1, "W3": W3, "W2": W2}, {"x": 4}, {"y": 3})
    u, w = X @ W1, X @ W3
    z = u + w
    y = z @ W2
    r_z = z * ((seed(y, TARGET) / y) @ W2.T)
    r_u, r_w = u * r_z / z, w * r_z / z
    r_x = X * ((r_u / u) @ W1.T) + X * ((r_w / w) @ W3.T)
    e = run(net, "boundary: inputs\nrules:\n  - {op: '*', rule: zero}\n", {"x": X})
    close(e.boundary["x"].numpy(), r_x)
    close(e.boundary["x"].numpy().sum(1), y[np.arange(3), TARGET])   # no bias, no ε: all of it arrives


# -- on_unmatched: warn ---------------------------------------------------------------------

def test_unmatched_node_strands_relevance_and_nothing_passes_it():
    rules = "boundary: inputs\non_unmatched: warn\nrules:\n  - {op: MatMul, rule: zero}\n"
    rs = RuleSet.from_yaml(rules, source="warn.yaml")
    graph = rulegraph.load(tanh_net())
    binding = rs.bind(graph)
    assert [n.name for n in binding.unmatched] == ["act/Tanh"]
    assert [n.name for n in binding.reached] == ["fc1/MatMul", "act/Tanh", "fc2/MatMul"]   # walked on for `check`
    assert sorted(binding.assignments) == ["fc1/MatMul", "fc2/MatMul"]
    with pytest.warns(UserWarning, match=r"1 node\(s\) have no rule.*'act/Tanh'"):
        e = rulegraph.explain(graph, rs, {"x": torch.from_numpy(X)}, target=TARGET, dtype=F64)
    assert np.all(e.boundary["x"].numpy() == 0.0)              # nothing got past the Tanh
    assert [n.name for n in e.audit.nodes] == ["fc2/MatMul"]  # the walk never reached fc1


def test_on_unmatched_error_refuses_to_run():
    rs = RuleSet.from_yaml("boundary: inputs\nrules:\n  - {op: MatMul, rule: zero}\n", source="err.yaml")
    with pytest.raises(rulegraph.RulegraphError, match="no rule matches node 'act/Tanh'"):
        rulegraph.explain(tanh_net(), rs, {"x": torch.from_numpy(X)}, dtype=F64)


def test_audit_off_gives_the_same_relevance():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        on = run(mlp(), mlp_rules(0.25), {"x": X})
        off = run(mlp(), mlp_rules(0.25), {"x": X}, audit=False)
    assert off.audit is None
    close(off.boundary["x"].numpy(), lrp_epsilon_mlp(0.25)["r_x"])
    close(off.boundary["x"].numpy(), on.boundary["x"].numpy())


def test_the_ledger_sums_a_pair_of_tensors_once():
    """Relevance passed on unchanged (a Cast to the same dtype) sums the same x · g again: one entry,
    read by both edges; a pair whose memory may have been reused since is summed anew."""
    from rulegraph.passes.relevance import Ledger
    from rulegraph.propagation.signal import Contribution
    ledger = Ledger(nan_safe=False, eager=True)
    x, g = torch.randn(6, 4, dtype=F64), torch.randn(6, 4, dtype=F64)
    first = ledger.contribution(Contribution(signal=g), x)
    assert ledger.contribution(Contribution(signal=g), x.to(F64)) == first          # the same tensors
    assert ledger.contribution(Contribution(signal=g.view(24).view(6, 4)), x) == first  # the same memory
    assert ledger.contribution(Contribution(signal=g.view(3, 8)), x.view(3, 8)) == first  # a Reshape's
    assert ledger.contribution(Contribution(signal=g.mT), x.mT) == first             # pairs alike, in memory
    assert ledger.contribution(Contribution(signal=g.mT.contiguous()), x.mT) != first  # other pairs
    assert ledger.contribution(Contribution(signal=g.clone()), x) != first           # other memory
    assert ledger.total(x) != ledger.mass(x)
    ledger.settle()
    assert ledger.values[first] == pytest.approx(float((x * g).sum()), rel=1e-12)
    del g                                    # its memory may be reused: a tensor there is summed anew
    assert ledger.contribution(Contribution(signal=torch.ones(6, 4, dtype=F64)), x) == len(ledger.values)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_the_ledger_reads_the_same_figures_as_it_goes_or_at_the_end(dtype, monkeypatch):
    """On the CPU each entry is read as it is made (``eager``); on other devices the 0-d sums are kept and
    read in one sync at :meth:`settle`: the same floats either way. There the sums of small tensors are
    taken together (``GroupedSums``): the same figures to rounding, and the same floats on every run."""
    from rulegraph.passes import relevance
    from rulegraph.propagation.signal import Contribution
    torch.manual_seed(0)
    pairs = [(torch.randn(7, 5, dtype=dtype), torch.randn(7, 5, dtype=dtype)) for _ in range(4)]
    pairs += [(torch.randn(3, 40, dtype=dtype).mT, torch.randn(40, 3, dtype=dtype)), (torch.randn(()), torch.randn(()))]
    pairs = [(x.to(dtype), g.to(dtype)) for x, g in pairs]

    def figures(eager: bool) -> list[float]:
        ledger = relevance.Ledger(nan_safe=False, eager=eager)
        entries = [ledger.contribution(Contribution(signal=g), x) for x, g in pairs] + \
            [ledger.mass(x) for x, _ in pairs] + [ledger.total(g) for _, g in pairs] + \
            [ledger.product(x, g, absolute=True) for x, g in pairs]
        ledger.settle()
        assert all(type(v) is float for v in ledger.values)
        return [ledger([i]) for i in entries]

    eager = figures(True)
    grouped = figures(False)
    assert grouped == figures(False)                                    # deterministic
    scale = max(abs(v) for v in eager)
    assert max(abs(a - b) for a, b in zip(grouped, eager)) <= (1e-6 if dtype == torch.float32 else 1e-13) * scale
    monkeypatch.setattr(relevance, "GROUP_BELOW", 0)                    # each sum alone: the same floats
    assert figures(False) == eager


def test_grouped_sums_equal_each_sum_alone():
    """``GroupedSums``: Σ t, Σ|t|, Σ x ⊙ g and Σ |x ⊙ g| of tensors of many sizes (padded to powers of two)
    and two dtypes, taken together, against each reduction in float64."""
    from rulegraph.passes.relevance import GroupedSums
    gen = torch.Generator().manual_seed(3)
    shapes = [(), (1,), (2,), (3,), (5, 7), (4, 8), (2, 3, 17), (0,), (1, 12, 9, 9), (9, 33)]
    grouped, expected = GroupedSums(), {}
    for i, shape in enumerate(shapes * 2):
        dtype = F64 if i % 3 else torch.float32
        x, g = torch.randn(shape, generator=gen, dtype=dtype), torch.randn(shape, generator=gen, dtype=dtype)
        kind = GroupedSums.KINDS[i % 4]
        tensors = (x,) if kind in ("total", "mass") else (x, g)
        p = x.double() * g.double() if len(tensors) == 2 else x.double()
        expected[i] = float((p.abs() if kind in ("mass", "absdot") else p).sum())
        grouped.add(i, kind, tensors)
    assert grouped.bytes > 0
    sums = grouped.take()
    assert grouped.waiting == [] and grouped.bytes == 0 and sorted(sums) == sorted(expected)
    for i, value in sums.items():
        assert value.dim() == 0
        assert float(value) == pytest.approx(expected[i], rel=1e-5 if value.dtype == torch.float32 else 1e-12,
                                             abs=1e-6), i


@pytest.mark.parametrize("rules", ["attnlrp", "lrp-ah-ln"])
def test_a_device_ledgers_grouped_sums_audit_alike(bert_onnx, rules, monkeypatch):
    """A whole explanation's audit with a device's ledger (kept as tensors, read at the end), its small sums
    grouped or each alone: every node's figures to 1e-12 relative (float64), the verdict the same."""
    import tiny
    from targets import same
    from rulegraph.passes import relevance

    class DeviceLedger(relevance.Ledger):           # what a CUDA walk makes, on the CPU
        def __init__(self, nan_safe, eager, batched=False):
            super().__init__(nan_safe, False, batched)

    monkeypatch.setattr(relevance, "Ledger", DeviceLedger)
    feeds = tiny.token_inputs(batch=2, length=7)
    grouped = rulegraph.explain(bert_onnx, rules, feeds, dtype=F64)
    monkeypatch.setattr(relevance, "GROUP_BELOW", 0)
    same(grouped, rulegraph.explain(bert_onnx, rules, feeds, dtype=F64), rounding=1e-12)


def test_grouped_sums_are_taken_when_they_hold_enough(monkeypatch):
    """The tensors waiting are bounded (``GROUP_BYTES``): past it the ledger takes their sums."""
    from rulegraph.passes import relevance
    monkeypatch.setattr(relevance, "GROUP_BYTES", 3 * 40 * 8)
    ledger = relevance.Ledger(nan_safe=False, eager=False)
    ts = [torch.full((40,), float(k), dtype=F64) for k in range(7)]
    entries = [ledger.total(t) for t in ts]
    assert [e is None for e in ledger.entries] == [False] * 6 + [True]
    ledger.settle()
    assert [ledger([e]) for e in entries] == [40.0 * k for k in range(7)]


@pytest.mark.parametrize("shape,order", [((6, 4), (1, 0)), ((2, 5, 3, 4), (0, 2, 1, 3)),
                                         ((2, 5, 3, 4), (3, 1, 0, 2)), ((1, 5, 1, 4), (2, 3, 0, 1))])
def test_tensors_lying_alike_sum_as_one_dot_over_their_memory(shape, order):
    """A head view (permuted dims) pairs with a signal lying alike: Σ x ⊙ g is a dot over their memory,
    with no copy; a slice, or two tensors lying differently, are not."""
    from rulegraph.passes.relevance import in_memory_order, product_sum
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(shape, dtype=F64, generator=gen).permute(order)
    g = torch.randn(shape, dtype=F64, generator=gen).permute(order)
    xf, gf = in_memory_order(x, g)
    assert xf.data_ptr() == x.data_ptr() and gf.data_ptr() == g.data_ptr() and xf.is_contiguous()
    assert float(product_sum(x, g)) == pytest.approx(float((x * g).sum()), rel=1e-12)
    assert float(torch.vdot(xf, gf)) == pytest.approx(float((x * g).sum()), rel=1e-12)
    assert in_memory_order(x[..., ::2], g[..., ::2]) is None                       # a strided slice: gaps
    assert in_memory_order(x, g.contiguous()) is None or x.is_contiguous()         # other strides
    assert in_memory_order(x, g.float()) is None


@pytest.mark.parametrize("picks", [[(3, 7)], [(3, 7), (0, 2)], [(3, 7), (0, 2), (5, 1)], [], [(3, 7), (3, 2)],
                                   [(3, 7), (3, 2), (3, 9)], [(3, 7), (3, 2), (0, 4)]])
@pytest.mark.parametrize("batch", [(), (1,)])
def test_the_explained_output_sums_alike_over_a_sparse_seed(picks, batch):
    """Σ output ⊙ seed in float64: over the seed's non-zero entries alone where there are at most two,
    the same bits as the sum over every element."""
    from rulegraph.passes.relevance import CHUNK, _seeded_sum, product_sum
    out = torch.randn(*batch, 6, CHUNK // 4 + 3, generator=torch.Generator().manual_seed(len(picks)))
    seed = torch.zeros_like(out)
    for (i, j), v in zip(picks, (1.0, -1.0, 0.5)):
        seed[..., i, j] = v
    assert _seeded_sum(out, seed).dtype == F64
    assert torch.equal(_seeded_sum(out, seed), product_sum(out, seed, dtype=F64))
