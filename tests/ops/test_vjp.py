"""VJPs against torch autograd and finite differences, in float64.

Ops with an explicit ``vjp`` must agree with autograd on their own forward to 1e-10
(every float input wanted, random cotangents on every float output), also when only
some inputs are wanted or some cotangents are absent. Every sample, explicit or
falling back to :func:`rulegraph.ops.autograd_vjp`, is checked against central
finite differences of ⟨s, f(x)⟩ along a random direction.
"""
from __future__ import annotations

import pytest
import torch

from rulegraph.ops import REGISTRY, vjp

from .samples import SAMPLES, Sample

Tensor = torch.Tensor


def _float(t) -> bool:
    return isinstance(t, Tensor) and t.is_floating_point()


def _differentiable(s: Sample) -> bool:
    return bool(s.float_inputs()) and any(_float(o) for o in s.call())


def _cotangents(outs: list[Tensor], seed: int, drop: int | None = None) -> list[Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(o.shape, generator=g, dtype=o.dtype) if _float(o) else None for o in outs]
    if drop is not None and drop < len(grads):
        grads[drop] = None
    return grads


def _check_equal(got, ref, wants, sample: Sample, what: str):
    assert len(got) == len(sample.inputs), f"{sample.id}: {len(got)} VJPs for {len(sample.inputs)} inputs"
    for i, (g, r, w) in enumerate(zip(got, ref, wants)):
        if not w:
            assert g is None, f"{sample.id} {what}: input {i} was not wanted but got a VJP"
            continue
        x = sample.inputs[i]
        if r is None:  # the forward is not differentiable in torch here; finite differences check it
            continue
        assert g is not None, f"{sample.id} {what}: no VJP for wanted input {i}"
        assert g.shape == x.shape, f"{sample.id} {what}: VJP {i} has shape {tuple(g.shape)}, input {tuple(x.shape)}"
        assert g.dtype == x.dtype, f"{sample.id} {what}: VJP {i} has dtype {g.dtype}, input {x.dtype}"
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10, msg=lambda m: f"{sample.id} {what} input {i}: {m}")


def _autograd(s: Sample, grads: list, wants: list[bool]) -> list:
    """The reference: ``torch.autograd.grad`` through the op's forward (``None`` where an input does not
    reach an output in torch's graph: there finite differences check the VJP)."""
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(True) if w else x for x, w in zip(s.inputs, wants)]
        out = s.spec.forward(*leaves, **s.attrs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        if not pairs:
            return [None] * len(s.inputs)
        got = torch.autograd.grad([o for o, _ in pairs], [x for x, w in zip(leaves, wants) if w],
                                  [g for _, g in pairs], allow_unused=True)
    it = iter(got)
    return [(next(it) if w else None) for w in wants]


EXPLICIT = [pytest.param(s, id=s.id) for s in SAMPLES if s.spec.vjp is not None and _differentiable(s)]
ALL = [pytest.param(s, id=s.id) for s in SAMPLES if _differentiable(s)]


def test_every_explicit_vjp_has_a_sample():
    explicit = {name for (_, name), spec in REGISTRY.items() if spec.vjp is not None}
    sampled = {s.op for s in SAMPLES if _differentiable(s)}
    assert explicit <= sampled, f"explicit VJPs without a sample: {sorted(explicit - sampled)}"


@pytest.mark.parametrize("s", EXPLICIT)
def test_explicit_vjp_matches_autograd(s: Sample):
    outs = s.call()
    wants = [_float(x) for x in s.inputs]
    for seed, drop in ((0, None), (1, None), (2, 1)):  # drop: an absent cotangent on output 1 (Split, LN stats)
        if drop is not None and len(outs) < 2:
            continue
        grads = _cotangents(outs, seed, drop)
        if s.autograd_outputs is not None:
            grads[s.autograd_outputs:] = [None] * (len(grads) - s.autograd_outputs)
        got = vjp(s.spec, grads, s.inputs, outs, wants, s.attrs)
        ref = _autograd(s, grads, wants)
        _check_equal(got, ref, wants, s, f"(seed {seed}, drop {drop})")


@pytest.mark.parametrize("s", EXPLICIT)
def test_explicit_vjp_one_input_at_a_time(s: Sample):
    outs = s.call()
    grads = _cotangents(outs, 3)
    full = vjp(s.spec, grads, s.inputs, outs, [_float(x) for x in s.inputs], s.attrs)
    for i in s.float_inputs():
        wants = [j == i for j in range(len(s.inputs))]
        got = vjp(s.spec, grads, s.inputs, outs, wants, s.attrs)
        _check_equal(got, [f if w else None for f, w in zip(full, wants)], wants, s, f"(only input {i})")


@pytest.mark.parametrize("s", [p for p in ALL if p.values[0].fd])
def test_vjp_matches_finite_differences(s: Sample):
    """⟨VJP(s), v⟩ = d/dε ⟨s, f(x + εv)⟩, central differences, for the op's VJP (explicit or autograd)."""
    outs = s.call()
    grads = _cotangents(outs, 4)
    floats = s.float_inputs()
    wants = [i in floats for i in range(len(s.inputs))]
    got = vjp(s.spec, grads, s.inputs, outs, wants, s.attrs)
    g = torch.Generator().manual_seed(5)
    directions = {i: torch.randn(s.inputs[i].shape, generator=g, dtype=s.inputs[i].dtype) for i in floats}

    def objective(eps: float) -> float:
        moved = [x + eps * directions[i] if i in directions else x for i, x in enumerate(s.inputs)]
        return sum(float((o * gr).sum()) for o, gr in zip(s.call(moved), grads) if gr is not None)

    eps = 1e-6
    numeric = (objective(eps) - objective(-eps)) / (2 * eps)
    analytic = sum(float((got[i] * directions[i]).sum()) for i in floats if got[i] is not None)
    assert abs(numeric - analytic) <= 1e-6 * (1 + abs(analytic)), (
        f"{s.id}: finite differences {numeric}, VJP {analytic}")


@pytest.mark.parametrize("s", ALL)
def test_vjp_batched_over_targets(s: Sample):
    """Every VJP (explicit or autograd's) under ``torch.func.vmap`` over a leading target axis of its
    cotangents, the forward values shared, as the batched relevance walk runs it
    (:func:`rulegraph.passes.relevance.walk_many`): each target's VJP equals the VJP of its cotangents alone."""
    outs = s.call()
    wants = [_float(x) for x in s.inputs]
    stacked = [(k, _cotangents(outs, 6)[k], _cotangents(outs, 7)[k]) for k in range(len(outs))]
    stacked = [(k, torch.stack([a, b])) for k, a, b in stacked if a is not None]

    def one(*gs):
        grads: list[Tensor | None] = [None] * len(outs)
        for (k, _), g in zip(stacked, gs):
            grads[k] = g
        return tuple(g if g is not None else torch.zeros(()) for g in vjp(s.spec, grads, s.inputs, outs, wants, s.attrs))

    batched = torch.func.vmap(one)(*(t for _, t in stacked))
    for target in range(2):
        grads: list[Tensor | None] = [None] * len(outs)
        for k, t in stacked:
            grads[k] = t[target]
        alone = vjp(s.spec, grads, s.inputs, outs, wants, s.attrs)
        for i, (b, a) in enumerate(zip(batched, alone)):
            if a is not None:
                torch.testing.assert_close(b[target], a, rtol=1e-12, atol=1e-12,
                                           msg=lambda m: f"{s.id} target {target} input {i}: {m}")
