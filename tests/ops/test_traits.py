"""The declared traits of every op, checked numerically in float64.

What the relevance rules rely on:

``affine(T)``   the gradient/z rules claim exact conservation on the node when the op is
                affine in the carried inputs T (others fixed). Beyond f(a·x + (1−a)·y) =
                a·f(x) + (1−a)·f(y), conservation needs the constant term to be exactly what
                the *additive* constant inputs contribute:
                Σ_{i ∈ T ∪ additive} ⟨x_i, VJP_i(s)⟩ = ⟨s, f(x)⟩   (Euler's identity)
                — ``_gradient_contributions`` hands ``x ⊙ VJP(s)`` to both kinds.
``additive``    an additive input's absorbed share ``x_k ⊙ VJP_k(s)`` must be the part of the
                output it contributes: ⟨s, f(x) − f(x | x_k = 0)⟩ = ⟨x_k, VJP_k(s)⟩.
``routing``     (and ``routing_if`` for the attributes it holds for: a scatter that writes)
                the ``pass`` rule sends relevance back along the VJP, so it must be a 0/1
                selection: each output element is one input element (or a fill with no
                source), and VJP(e_j) is one-hot on that element.
``elementwise`` the ``identity`` rule: output i depends on input i only (same shape).
``pointwise``   output element o depends only on the input elements at o's (broadcast) position:
                the input boundary follows token ids through these ops.
``activation``, ``sigmoidal``, ``normalization``, ``arithmetic``, ``shape_only``: what rule files
                select by (``trait:``, ``from:``, ``through:``); each checked below for what it claims. A
                normalization's declared statistics must give its forward (the ln and layernorm rules
                hold them constant).
``product``     a product of two factors, linear in each (the ah, uniform and product rules' ops; the
                contractions are an attention block's value product).
``bias``        the additive constant as the op adds it: f(0; W, b) for a linear layer.
``float_output=False``  outputs are never floating point (a function of the node for Cast).
``cheap``       the relevance pass recomputes the output in its walk instead of keeping it: computed
                again on the same inputs it must be the same bits, and cost about what reading it does.
``outgrows``    a product of two activations the pass frees where its output outgrew its inputs: it
                must take two value inputs and be able to outgrow them.
``into``        the op's function writing into ``out=``: written into a copy of any input of the
                output's shape and dtype, it must give the forward's bits.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from rulegraph.ops import REGISTRY, never, vjp
from rulegraph.ops.sequence import TensorSequence

from .samples import SAMPLES, Sample, distinct

Tensor = torch.Tensor


def _float(t) -> bool:
    return isinstance(t, Tensor) and t.is_floating_point()


def _close(a: Tensor, b: Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"{what}: {m}")


def _cotangents(s: Sample, outs: list[Tensor], seed: int) -> list[Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(o.shape, generator=g, dtype=o.dtype) if _float(o) else None for o in outs]
    if s.first_output_only:
        grads[1:] = [None] * (len(grads) - 1)
    return grads


def _dot(a: list, b: list) -> float:
    return sum(float((x * y).sum()) for x, y in zip(a, b) if x is not None and y is not None)


def _patterns(s: Sample):
    """Every non-empty set of float inputs, as a tainted mask over all inputs."""
    floats = s.float_inputs()
    for k in range(1, len(floats) + 1):
        for chosen in itertools.combinations(floats, k):
            yield [i in chosen for i in range(len(s.inputs))]


def _float64(s: Sample) -> bool:
    return all(s.inputs[i].dtype == torch.float64 for i in s.float_inputs())


def _affine_attrs(s: Sample) -> bool:
    """The sample's attributes keep the op affine (``affine_if``: ScatterND's reduction none / add)."""
    return s.spec.affine_if is None or s.spec.affine_if({**s.spec.defaults, **s.attrs})


def _affine_cases():
    out = []
    for s in SAMPLES:
        if s.spec.affine is never or not _float64(s) or not _affine_attrs(s):
            continue
        for t in _patterns(s):
            if s.spec.affine(t):
                out.append(pytest.param(s, t, id=f"{s.id}-T{''.join('1' if x else '0' for x in t)}"))
    return out


AFFINE = _affine_cases()


def test_every_trait_is_sampled():
    sampled_affine = {p.values[0].op for p in AFFINE}
    for (_, name), spec in REGISTRY.items():
        if spec.affine is not never and any(_float(o) for s in SAMPLES if s.op == name for o in s.call()):
            assert name in sampled_affine, f"{name} declares affine patterns but no sample exercises one"
    sampled = {s.op for s in SAMPLES}
    for trait in ("routing", "bijective", "elementwise", "additive", "activation", "sigmoidal", "normalization",
                  "arithmetic", "pointwise", "bias", "cheap", "outgrows", "into", "product"):
        declared = {name for (_, name), spec in REGISTRY.items() if getattr(spec, trait)}
        assert declared <= sampled, f"{trait} ops without a sample: {sorted(declared - sampled)}"


@pytest.mark.parametrize("s, tainted", AFFINE)
def test_declared_affine_is_affine(s: Sample, tainted: list[bool]):
    g = torch.Generator().manual_seed(7)
    other = [torch.randn(x.shape, generator=g, dtype=x.dtype) if t else x for x, t in zip(s.inputs, tainted)]
    f1, f2 = s.call(), s.call(other)
    for a in (0.3, -1.2):
        mixed = [a * x + (1 - a) * y if t else x for x, y, t in zip(s.inputs, other, tainted)]
        for k, (fm, y1, y2) in enumerate(zip(s.call(mixed), f1, f2)):
            if _float(fm):
                _close(fm, a * y1 + (1 - a) * y2, f"{s.id} output {k} is not affine in inputs {tainted} (a={a})")


@pytest.mark.parametrize("s, tainted", AFFINE)
def test_affine_conserves_with_additive_constants(s: Sample, tainted: list[bool]):
    """What the gradient rule hands to carried and absorbing inputs adds up to ⟨s, f(x)⟩."""
    spec = s.spec
    outs = s.call()
    grads = _cotangents(s, outs, 11)
    receiving = [t or (spec.is_additive(i) and _float(x)) for i, (t, x) in enumerate(zip(tainted, s.inputs))]
    got = vjp(spec, grads, s.inputs, outs, receiving, s.attrs)
    handed = sum(float((x * g).sum()) for x, g, w in zip(s.inputs, got, receiving) if w and g is not None)
    total = _dot(grads, outs)
    assert abs(handed - total) <= 1e-9 * (1 + abs(total)), (
        f"{s.id}: carried {tainted} + additive constants receive {handed}, the output holds {total}: "
        "a non-additive input (or an attribute) contributes a constant term")


ADDITIVE = [pytest.param(s, i, id=f"{s.id}-in{i}") for s in SAMPLES if _float64(s)
            for i in s.float_inputs() if s.spec.is_additive(i) and _affine_attrs(s)]


@pytest.mark.parametrize("s, k", ADDITIVE)
def test_additive_input_share_is_its_contribution(s: Sample, k: int):
    spec = s.spec
    outs = s.call()
    grads = _cotangents(s, outs, 13)
    zeroed = list(s.inputs)
    zeroed[k] = torch.zeros_like(s.inputs[k])
    contribution = _dot(grads, [o - z if _float(o) else None for o, z in zip(outs, s.call(zeroed))])
    wants = [i == k for i in range(len(s.inputs))]
    share = float((s.inputs[k] * vjp(spec, grads, s.inputs, outs, wants, s.attrs)[k]).sum())
    assert abs(share - contribution) <= 1e-9 * (1 + abs(contribution)), (
        f"{s.id}: input {k} is declared additive; its absorbed share is {share} but it contributes {contribution}")
    # and it enters affinely, whatever the other inputs are
    g = torch.Generator().manual_seed(17)
    other = list(s.inputs)
    other[k] = torch.randn(s.inputs[k].shape, generator=g, dtype=s.inputs[k].dtype)
    mixed = list(s.inputs)
    mixed[k] = 0.3 * s.inputs[k] + 0.7 * other[k]
    for j, (fm, y1, y2) in enumerate(zip(s.call(mixed), outs, s.call(other))):
        if _float(fm):
            _close(fm, 0.3 * y1 + 0.7 * y2, f"{s.id} output {j} is not affine in additive input {k}")


def _with_distinct_values(s: Sample) -> list:
    """The sample's inputs with every float value replaced by a distinct, non-zero one."""
    floats = s.float_inputs()
    n = sum(s.inputs[i].numel() for i in floats)
    values = distinct(n) + 0.5 * n  # all positive, so a fill of 0 is told apart
    out, at = list(s.inputs), 0
    for i in floats:
        x = s.inputs[i]
        out[i] = values[at:at + x.numel()].reshape(x.shape).to(x.dtype)
        at += x.numel()
    return out


ROUTING = [pytest.param(s, id=s.id) for s in SAMPLES
           if s.spec.routing or (s.spec.routing_if is not None and s.spec.routing_if({**s.spec.defaults, **s.attrs}))]


@pytest.mark.parametrize("s", ROUTING)
def test_routing_selects_input_elements(s: Sample):
    spec = s.spec
    inputs = _with_distinct_values(s)
    outs = s.call(inputs)
    floats = [i for i in s.float_inputs()]
    wants = [i in floats for i in range(len(inputs))]
    fills = 0
    for k, out in enumerate(outs):
        if not _float(out):
            continue
        for j in range(out.numel()):
            grads = [torch.zeros(o.shape, dtype=o.dtype) if _float(o) else None for o in outs]
            grads[k].view(-1)[j] = 1.0
            back = vjp(spec, grads, inputs, outs, wants, s.attrs)
            picks = []
            for i in floats:
                if back[i] is None:  # an input the output does not depend on (Dropout's ratio, CastLike's like)
                    continue
                gi = back[i].reshape(-1)
                assert torch.all((gi == 0) | (gi == 1)), f"{s.id}: VJP of output {k}[{j}] is not 0/1 on input {i}"
                picks += [(i, int(p)) for p in torch.nonzero(gi).reshape(-1)]
            value = out.reshape(-1)[j]
            if not picks:  # a fill (Pad's default 0): no source, so relevance there has nowhere to go
                assert value == 0, f"{s.id}: output {k}[{j}] = {value} has no source element"
                fills += 1
                continue
            assert len(picks) == 1, f"{s.id}: output {k}[{j}] draws on {len(picks)} input elements"
            i, p = picks[0]
            assert inputs[i].reshape(-1)[p] == value, f"{s.id}: output {k}[{j}] is not the element its VJP selects"
    if s.op != "Pad":
        assert fills == 0


BIJECTIVE = [pytest.param(s, id=s.id) for s in SAMPLES if s.spec.bijective]


@pytest.mark.parametrize("s", BIJECTIVE)
def test_a_bijective_op_moves_each_element_of_its_input_once(s: Sample):
    """Its one float input's elements, each in exactly one place of its one output (a permutation), so that
    the relevance it hands back sums to what arrived (the audit reads that sum: ``Contribution.moved``)."""
    assert s.spec.routing, f"{s.id}: a bijective op is a routing op"
    inputs = _with_distinct_values(s)
    floats = s.float_inputs()
    outs = [o for o in s.call(inputs) if _float(o)]
    assert len(floats) == 1 and len(outs) == 1, f"{s.id}: one float input and one float output"
    moved, given = outs[0].reshape(-1).sort().values, inputs[floats[0]].reshape(-1).sort().values
    assert torch.equal(moved, given), f"{s.id}: the output is not its input's elements, each once"


ELEMENTWISE = [pytest.param(s, id=s.id) for s in SAMPLES if s.spec.elementwise]


@pytest.mark.parametrize("s", ELEMENTWISE)
def test_elementwise_is_position_by_position(s: Sample):
    x = s.inputs[0]
    out = s.call()[0]
    assert out.shape == x.shape, f"{s.id}: elementwise output shape {tuple(out.shape)} != input {tuple(x.shape)}"
    # the other inputs are scalars here (Clip's bounds, Dropout's ratio): permuting x permutes f(x)
    assert all(not isinstance(y, Tensor) or y.numel() == 1 for y in s.inputs[1:])
    perm = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(3))
    permuted = [x.reshape(-1)[perm].reshape(x.shape)] + list(s.inputs[1:])
    # a few ulp apart at most: vectorised kernels round the tail of a vector differently (Softplus)
    torch.testing.assert_close(s.call(permuted)[0].reshape(-1), out.reshape(-1)[perm], rtol=4 * 2.0**-52, atol=0)


NON_FLOAT = [
    ("Shape", [torch.randn(2, 3)], {}), ("Size", [torch.randn(2, 3)], {}),
    ("ArgMax", [torch.randn(2, 3)], {"axis": 1}), ("ArgMin", [torch.randn(2, 3)], {"axis": 0}),
    *[(op, [torch.randn(2, 3), torch.randn(3)], {})
      for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")],
    *[(op, [torch.rand(2, 3) < 0.5, torch.rand(3) < 0.5], {}) for op in ("And", "Or", "Xor")],
    *[(op, [torch.arange(6).reshape(2, 3), torch.arange(3)], {}) for op in ("BitwiseAnd", "BitwiseOr")],
    ("Not", [torch.rand(2, 3) < 0.5], {}), ("IsNaN", [torch.randn(2, 3)], {}), ("IsInf", [torch.randn(2, 3)], {}),
    ("NonZero", [torch.randn(2, 3)], {}),
    ("QuantizeLinear", [torch.randn(2, 3), torch.tensor(0.05), torch.tensor(3, dtype=torch.uint8)], {}),
    ("MatMulInteger", [torch.randint(0, 255, (2, 3), dtype=torch.uint8), torch.randint(-9, 9, (3, 2), dtype=torch.int8)],
     {}),
    ("ConvInteger", [torch.randint(0, 255, (1, 1, 4, 4), dtype=torch.uint8),
                     torch.randint(0, 255, (2, 1, 2, 2), dtype=torch.uint8)], {}),
    ("SequenceLength", [TensorSequence([torch.randn(2), torch.randn(3)])], {}),
]


def test_boolean_ops_output_masks():
    declared = {name for (_, name), spec in REGISTRY.items() if spec.boolean}
    assert declared == {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not",
                        "IsNaN", "IsInf"}
    for op, inputs, attrs in NON_FLOAT:
        if op in declared:
            out = REGISTRY[("", op)].forward(*inputs, **attrs)
            assert out.dtype == torch.bool, f"{op} is declared boolean but returns {out.dtype}"


def test_float_output_false_ops_never_output_floats():
    declared = {name for (_, name), spec in REGISTRY.items() if not spec.float_output}
    assert declared == {op for op, _, _ in NON_FLOAT}, f"update NON_FLOAT: {declared ^ {op for op, _, _ in NON_FLOAT}}"
    for op, inputs, attrs in NON_FLOAT:
        out = REGISTRY[("", op)].forward(*inputs, **attrs)
        for o in (out if isinstance(out, (tuple, list)) else [out]):
            assert not o.is_floating_point(), f"{op} is declared float_output=False but returns {o.dtype}"


@pytest.mark.parametrize("s", [pytest.param(s, id=s.id) for s in SAMPLES if s.float_inputs()])
def test_float_ops_keep_float_outputs(s: Sample):
    """Ops left at float_output=True give a float output 0 on float inputs (relevance can flow)."""
    assert s.spec.float_output
    assert s.call()[0].is_floating_point(), f"{s.id}: float inputs but a {s.call()[0].dtype} output"


def _declared(trait: str) -> list:
    return [pytest.param(s, id=s.id) for s in SAMPLES if getattr(s.spec, trait)]


@pytest.mark.parametrize("op", sorted({s.op for s in SAMPLES if s.spec.activation}))
def test_an_activation_is_an_elementwise_nonlinearity(op: str):
    """Elementwise, and bent somewhere on [-4, 4] in at least one sample (Clip without bounds is the identity)."""
    bends = []
    for s in (s for s in SAMPLES if s.op == op):
        assert s.spec.elementwise, f"{s.id}: an activation must be elementwise"
        x = torch.linspace(-4, 4, 81, dtype=torch.float64)
        y = s.call([x, *s.inputs[1:]])[0]
        line = y[0] + (y[-1] - y[0]) * (x - x[0]) / (x[-1] - x[0])
        bends.append(float((y - line).abs().max()))
    assert max(bends) > 1e-3, f"{op} is declared an activation but is linear on [-4, 4] in every sample"


@pytest.mark.parametrize("s", _declared("sigmoidal"))
def test_a_sigmoidal_op_is_bounded_and_monotone(s: Sample):
    x = torch.linspace(-50, 50, 2001, dtype=torch.float64)
    y = s.call([x, *s.inputs[1:]])[0]
    assert bool((y[1:] >= y[:-1]).all()), f"{s.id} is declared sigmoidal but is not monotone"
    assert float(y.abs().max()) <= 1.0, f"{s.id} is declared sigmoidal but leaves [-1, 1]"
    assert float(y[-1] - y[0]) >= 0.99, f"{s.id} is declared sigmoidal but does not squash onto a range"


@pytest.mark.parametrize("s", _declared("normalization"))
def test_a_normalization_is_invariant_to_the_scale_of_its_input(s: Sample):
    attrs = {**s.attrs, "epsilon": 0.0}
    out = s.spec.forward(*s.inputs, **attrs)
    scaled = s.spec.forward(7.5 * s.inputs[0], *s.inputs[1:], **attrs)
    first = (lambda o: o[0] if isinstance(o, (tuple, list)) else o)
    _close(first(scaled), first(out), f"{s.id}: declared a normalization, but scaling its input changes its output")


@pytest.mark.parametrize("s", _declared("normalization"))
def test_a_normalization_computes_the_statistics_it_declares(s: Sample):
    """``(x − mean) · factor · γ + β`` from the op's declaration (dims, centring, factor, γ and β per channel
    or broadcast) is its forward: what the ln and layernorm rules hold constant is what the op computed."""
    norm, attrs = s.spec.normalization, {**s.spec.defaults, **s.attrs}
    x, gamma = s.inputs[0], s.inputs[1]
    dims = norm.dims(x, attrs)
    centred = x - x.mean(dim=dims, keepdim=True) if norm.centred else x
    expected = centred * norm.factor(x, attrs) * norm.weight(gamma, x)
    if len(s.inputs) > 2 and s.inputs[2] is not None:
        expected = expected + norm.weight(s.inputs[2], x)
    _close(s.call()[0], expected, f"{s.id}: the declared statistics do not give the forward")


def test_a_normalization_declares_its_statistics_not_a_flag():
    from rulegraph.ops import op
    with pytest.raises(TypeError, match="normalization= takes the Normalization it computes"):
        op("NotAnOp", normalization=True)(lambda x: x)
    assert ("", "NotAnOp") not in REGISTRY


@pytest.mark.parametrize("s", [p for p in _declared("product") if len(p.values[0].inputs) >= 2])
def test_a_product_is_linear_in_each_factor(s: Sample):
    """With its additive inputs at zero (Gemm's C), scaling either factor scales the output: a product
    of two inputs that may both carry relevance (what the ah, uniform and product rules split)."""
    inputs = [torch.zeros_like(x) if s.spec.is_additive(i) and _float(x) else x for i, x in enumerate(s.inputs)]
    base = s.call(inputs)[0]
    factors = [i for i in range(len(inputs)) if not s.spec.is_additive(i)]
    assert len(factors) == 2, f"{s.id}: a product has two factors"
    for i in factors:
        scaled = [2.5 * x if k == i else x for k, x in enumerate(inputs)]
        _close(s.call(scaled)[0], 2.5 * base, f"{s.id}: not linear in input {i}")


def test_the_value_product_and_the_product_rules_read_the_trait():
    from rulegraph.heads import PRODUCTS
    from rulegraph.propagation import RULES
    kinds = {name: spec.product for (domain, name), spec in REGISTRY.items() if not domain and spec.product}
    assert kinds == {"Mul": "elementwise", "MatMul": "contraction", "Gemm": "affine", "Einsum": "contraction"}
    assert set(PRODUCTS) == {"MatMul", "Einsum"}
    for rule in (RULES["relevance"].get("ah"), RULES["relevance"].get("uniform")):
        assert set(rule.ops) == {"Mul", "MatMul", "Einsum"}
    assert set(RULES["decomposition"].get("product").ops) == set(kinds)
    normalizations = {name for (domain, name), spec in REGISTRY.items() if not domain and spec.normalization}
    assert set(RULES["relevance"].get("ln").ops) == normalizations | {"Div"}
    assert set(RULES["decomposition"].get("layernorm").ops) == normalizations


@pytest.mark.parametrize("s", _declared("arithmetic"))
def test_arithmetic_is_the_four_operations(s: Sample):
    a, b = s.inputs[:2]
    expected = {"Add": a + b, "Sub": a - b, "Mul": a * b, "Div": a / b}[s.op]
    _close(s.call()[0], expected, f"{s.id}")


@pytest.mark.parametrize("s", _declared("cheap"))
def test_a_cheap_op_computed_again_gives_the_same_bits(s: Sample):
    """The walk recomputes a cheap op's output (Lifetimes.recomputable): a pointwise op, or one reducing along
    one axis (Softmax), whose second run on the same tensors equals the first bit for bit."""
    assert s.spec.pointwise or s.op == "Softmax", f"{s.id}: declared cheap but neither pointwise nor a softmax"
    first, again = s.call(), s.call()
    assert all(torch.equal(a, b) for a, b in zip(first, again)), f"{s.id}: declared cheap, but a second run differs"


def _donors(s: Sample) -> list[int]:
    """The inputs of ``s`` with its output's shape and dtype: those the forward may write into."""
    out = s.call()[0]
    return [i for i, x in enumerate(s.inputs) if _float(x) and x.shape == out.shape and x.dtype == out.dtype]


INTO = [pytest.param(s, id=s.id) for s in SAMPLES if s.spec.into is not None and _donors(s)]


def test_every_op_written_into_has_a_sample_to_write_into():
    declared = {name for (_, name), spec in REGISTRY.items() if spec.into is not None}
    assert declared == {p.values[0].op for p in INTO}


@pytest.mark.parametrize("s", INTO)
def test_writing_into_a_dying_input_gives_the_same_bits(s: Sample):
    """The forward writes an elementwise op's output into an input that dies there (lifetimes.donor):
    into any input of the output's shape and dtype, the same bits as the forward's own result."""
    expected = s.call()[0]
    for i in _donors(s):
        inputs = [x.clone() if isinstance(x, Tensor) else x for x in s.inputs]
        out = s.spec.into(*inputs, out=inputs[i])
        assert out.data_ptr() == inputs[i].data_ptr() and torch.equal(out, expected), f"{s.id} into input {i}"


@pytest.mark.parametrize("op", sorted(name for (_, name), spec in REGISTRY.items() if spec.outgrows))
def test_an_outgrowing_product_can_outgrow_its_two_inputs(op: str):
    """Q·Kᵀ from Q and K (12 × 4 each): 12 × 12, more elements than both."""
    q, k = torch.randn(2, 12, 4, dtype=torch.float64), torch.randn(2, 12, 4, dtype=torch.float64)
    spec = REGISTRY[("", op)]
    out = spec.forward(q, k.mT) if op == "MatMul" else spec.forward(q, k, equation="bid,bjd->bij")
    assert out.numel() > q.numel() + k.numel()
    torch.testing.assert_close(out, q @ k.mT, rtol=0, atol=1e-12)


@pytest.mark.parametrize("op", [name for (_, name), spec in REGISTRY.items() if spec.shape_only])
def test_a_shape_only_op_ignores_the_values(op: str):
    forward = REGISTRY[("", op)].forward
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    assert torch.equal(forward(x), forward(torch.randn_like(x))), f"{op} is declared shape_only but reads values"


@pytest.mark.parametrize("s", [p for p in _declared("bias") if len(p.values[0].inputs) > 2
                               and p.values[0].inputs[2] is not None])
def test_the_declared_bias_is_what_the_bias_adds(s: Sample):
    inputs = list(s.inputs)
    inputs[0] = torch.zeros_like(inputs[0])
    out = s.call(inputs)[0]
    _close(torch.broadcast_to(s.spec.bias(s.inputs[2], out, {**s.spec.defaults, **s.attrs}), out.shape), out, f"{s.id}: f(0; W, b)")


def test_cast_outputs_float_exactly_when_its_target_is():
    from rulegraph.ir import Node
    spec = REGISTRY[("", "Cast")]
    for to in (torch.float32, torch.float64, torch.int64, torch.bool):
        node = Node("c", "Cast", ("x",), ("y",), {"to": to})
        assert spec.outputs_float(node) == spec.forward(torch.randn(3), to=to).is_floating_point()


@pytest.mark.parametrize("s", [pytest.param(s, id=s.id) for s in SAMPLES if s.spec.pointwise and s.float_inputs()])
def test_pointwise_ops_read_only_their_own_position(s: Sample):
    """Changing one element of one input changes the outputs at most where that element broadcasts to."""
    outs = s.call()
    g = torch.Generator().manual_seed(3)
    for i in s.float_inputs():
        x = s.inputs[i]
        if x.numel() == 0:
            continue
        k = int(torch.randint(x.numel(), (1,), generator=g))
        hot = torch.zeros(x.numel(), dtype=torch.bool)
        hot[k] = True
        moved = list(s.inputs)
        moved[i] = x + 0.37 * hot.reshape(x.shape).to(x.dtype)
        for out, new in zip(outs, s.call(moved)):
            if not isinstance(out, Tensor) or out.shape != new.shape:
                continue
            reach = hot.reshape(x.shape).expand(out.shape) if x.dim() <= out.dim() else None
            assert reach is not None, f"{s.id}: input {i} has more dims than the output"
            changed = ~torch.isclose(out, new, equal_nan=True) if out.is_floating_point() else out != new
            assert not (changed & ~reach).any(), f"{s.id}: input {i} element {k} changed outputs at other positions"
