"""Decomposition rules: how a node maps the components of its inputs to those of its outputs.

The decomposition pass (Yang et al. 2023, "Local interpretation of transformer based on linear
decomposition", ACL, Sec. 2) carries, for every value it reaches, G
group components and one bias component ``B``, with Σ_g D_g + B = the value. A rule
gets the forward values and the :class:`Parts` of the inputs that carry components,
and returns the :class:`Parts` of the outputs. Rules are registered by name with
:func:`~rulegraph.propagation.base.decomposition_rule` in the decomposition pass's registry, and
rule files with ``pass: decomposition`` name them; a rule's dataclass fields are its
YAML ``params``.

* ``linear`` — the op is affine in the inputs that carry components (Eq. 15–16):
  each group component goes through the op with additive constants zeroed, the bias
  component through the op as it is, so constants and biases land in ``B``
  (Lemma 2, linear layer). ``coefficients`` lists inputs held at their forward
  value: the attention probabilities (Eq. 5), a LayerNorm's √(Var+ε) (Eq. 6), a
  GELU gate Φ(x).
* ``layernorm`` — LayerNorm / RMSNorm with the std held as a coefficient (Eq. 6).
* ``activation`` — an elementwise activation f; D̂ by Eq. 9–11 (generalised
  below), or D̄ (Eq. 7–8) with ``variant: bar``.
* ``product`` — the product of two decomposed tensors, split symmetrically.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..ops import OpSpec, declaring
from .base import UNIT, Rule, decomposition_rule, param
from .numerics import layout

Tensor = torch.Tensor

ALPHAS = ("signed", "abs", "hybrid")
VARIANTS = ("hat", "bar")


@dataclass
class Parts:
    """A value split into ``groups`` (``[G, *shape]``) and the ``bias`` component (``shape``)."""

    groups: Tensor
    bias: Tensor

    def total(self, sums: "GroupSums | None" = None) -> Tensor:
        return (sums(self.groups) if sums is not None else self.groups.sum(0)) + self.bias


class GroupSums:
    """``Σ_g D_g`` of group tensors, each taken once: where a rule hands the groups on unchanged (a bias or
    another constant added, :func:`_direct`), the next node's sum over the same memory is the earlier one.
    Keyed by memory and layout, and kept only while the tensor it was taken from lives (so memory freed
    and reused is summed anew); a rule that writes into an input's groups forgets it
    (:meth:`ComponentSite.into`)."""

    def __init__(self):
        self._taken: dict[tuple, tuple[weakref.ref, Tensor]] = {}

    def forget(self, groups: Tensor) -> None:
        """Drop the sum of ``groups``, whose memory a rule wrote its output into (:meth:`ComponentSite.into`)."""
        self._taken.pop(layout(groups), None)

    def __call__(self, groups: Tensor) -> Tensor:
        key = layout(groups)
        taken = self._taken.get(key)
        if taken is not None and taken[0]() is not None:
            return taken[1]
        total = groups.sum(0)
        self._taken[key] = (weakref.ref(groups, lambda _, key=key: self._taken.pop(key, None)), total)
        return total


@dataclass
class ComponentSite:
    """What a decomposition rule sees of one node."""

    node: Any                       # ir.Node
    spec: OpSpec
    attrs: dict[str, Any]
    inputs: list[Any]               # forward values (host lists for static inputs, None if omitted)
    outputs: list[Any]              # forward values of the outputs
    parts: list[Parts | None]       # components of the inputs that carry them
    chunk: int                      # group components processed at once by elementwise rules
    linearized: bool = False        # one group, differentiated afterwards: activation factors are held fixed
    sums: GroupSums = field(default_factory=GroupSums)   # Σ_g D_g, shared with the pass's audit
    owned: list[bool] = field(default_factory=list)      # inputs whose groups the rule may write into

    def call(self, *args: Any) -> Any:
        return self.spec.forward(*args, **self.attrs)

    def into(self, k: int) -> Tensor | None:
        """Input ``k``'s groups where an elementwise rule may write its output into them (nothing else holds
        them and no later node reads them: the pass says so, :attr:`owned`), else ``None``. Their Σ_g is
        forgotten (:meth:`GroupSums.forget`): a rule reads it before it asks."""
        if k >= len(self.owned) or not self.owned[k]:
            return None
        self.sums.forget(self.parts[k].groups)
        return self.parts[k].groups


def _is_float_tensor(x: Any) -> bool:
    return isinstance(x, Tensor) and x.is_floating_point()


def _through_op(site: ComponentSite, parts: list[Parts | None], zero_additive: bool) -> tuple:
    """The op applied to every group component (vmapped over the leading dim) and to the
    bias component. For groups, non-carried additive float inputs (biases, constant
    summands, Concat pieces) are zeroed, so they reach the bias component only."""
    spec = site.spec
    group_args, in_dims, bias_args = [], [], []
    for i, (x, p) in enumerate(zip(site.inputs, parts)):
        if p is not None:
            group_args.append(p.groups)
            in_dims.append(0)
            bias_args.append(p.bias)
        else:
            zeroed = zero_additive and _is_float_tensor(x) and spec.is_additive(i)
            group_args.append(torch.zeros((), dtype=x.dtype, device=x.device).expand(x.shape) if zeroed else x)
            in_dims.append(None)
            bias_args.append(x)
    # vmap's chunking concatenates its pieces (a copy of the whole result): only where it bounds memory
    count = next(p.groups.shape[0] for p in parts if p is not None)
    chunk = site.chunk if site.chunk < count else None
    groups = torch.vmap(site.call, in_dims=tuple(in_dims), chunk_size=chunk)(*group_args)
    bias = site.call(*bias_args)
    return groups, bias


def _as_outputs(site: ComponentSite, groups: Any, bias: Any) -> list[Parts | None]:
    if isinstance(groups, (tuple, list)):
        return [Parts(g, b) if _is_float_tensor(b) else None for g, b in zip(groups, bias)]
    return [Parts(groups, bias)] + [None] * (len(site.node.outputs) - 1)


@decomposition_rule("linear")
class Linear(Rule):
    """An op affine in its decomposed inputs: Eq. 15–16 of Yang et al. (2023) (Lemma 2, linear
    layer, residual connection, attention with the probabilities as coefficients, Eq. 5).

    ``D_g(f(x)) = L(D_g x)`` with f's additive constants zeroed; ``B(f(x)) = f(B x)``
    with them, so biases, position embeddings, mask offsets and other constants add
    to the bias component. Inputs in ``coefficients`` are held at their forward value
    (they carry no components: the attention probabilities, a LayerNorm's √(Var+ε)
    in an exported Sub/Div chain, a GELU gate Φ(x)).
    """

    coefficients: list[int] = field(default_factory=list)

    def carries(self, node, spec, tainted):
        return [t and i not in self.coefficients for i, t in enumerate(tainted)]

    def check(self, node, spec, tainted):
        carried = self.carries(node, spec, tainted)
        if any(carried) and not spec.is_affine(node, carried):
            which = ", ".join(str(i) for i, c in enumerate(carried) if c)
            return (f"op {node.op} is not linear in its decomposed input(s) {which}; use `activation` for an "
                    f"elementwise nonlinearity, `product` for a product of two decomposed tensors, or hold an "
                    f"input as a coefficient (params: {{coefficients: [k]}})")
        return None

    def decompose(self, site: ComponentSite) -> list[Parts | None]:
        fast = _direct(site)
        if fast is not None:
            return fast
        groups, bias = _through_op(site, site.parts, zero_additive=True)
        return _as_outputs(site, groups, bias)


def _direct(site: ComponentSite) -> list[Parts | None] | None:
    """The hot linear ops without ``vmap`` (same result, fewer copies), or ``None``."""
    op, parts, x, y = site.node.op, site.parts, site.inputs, site.outputs[0]
    carried = [p is not None for p in parts]
    if not isinstance(y, Tensor) or len(site.node.outputs) != 1:
        return None
    if op in ("Add", "Sub") and sum(carried) == 1 and x[carried.index(True)].shape == y.shape:
        k = carried.index(True)      # a constant summand: the groups pass unchanged, B takes it
        groups = -parts[k].groups if (op == "Sub" and k == 1) else parts[k].groups
        return [Parts(groups, site.call(*[parts[n].bias if n == k else v for n, v in enumerate(x)]))]
    if op in ("Mul", "Div") and carried in ([True, False], [False, True]) and (op == "Mul" or carried[0]):
        k = carried.index(True)      # scaled by a constant or a coefficient (a GELU gate, a LayerNorm's 1/std)
        other = x[1 - k]
        if x[k].shape == y.shape and isinstance(other, Tensor):
            fn = torch.mul if op == "Mul" else torch.div
            return [Parts(fn(parts[k].groups, other), fn(parts[k].bias, other))]
    if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity") and carried[0] and not any(carried[1:]):
        p = parts[0]
        return [Parts(p.groups.reshape(p.groups.shape[0], *y.shape), p.bias.reshape(y.shape))]
    if op == "Transpose" and carried == [True]:
        perm = site.attrs.get("perm") or list(range(y.dim()))[::-1]
        p = parts[0]
        return [Parts(p.groups.permute(0, *[q + 1 for q in perm]), p.bias.permute(*perm))]
    if op == "MatMul" and carried == [True, False] and x[1].dim() == 2 and x[0].dim() >= 2:
        # one product over every group's rows: matmul folds contiguous groups into one matrix (strided ones
        # it would multiply otherwise, other bits: they are laid out first) and its result owns its memory
        return [Parts(torch.matmul(parts[0].groups.contiguous(), x[1]), parts[0].bias @ x[1])]
    if op == "MatMul" and carried == [False, True] and x[0].dim() >= 2 and x[0].shape[:-2] == x[1].shape[:-2]:
        # probabilities × values: the groups side by side in the columns, one matmul, no broadcast copy of P
        g = parts[1].groups                                   # [G, …, S, d]
        size, d = g.shape[0], g.shape[-1]
        stacked = g.movedim(0, -2).reshape(*g.shape[1:-1], size * d)
        out = (x[0] @ stacked).reshape(*y.shape[:-1], size, d).movedim(-2, 0)
        return [Parts(out, x[0] @ parts[1].bias)]
    return None


@decomposition_rule("layernorm")
class LayerNormComponents(Rule):
    """LayerNorm (or RMSNorm) with 1/√(Var+ε) as a coefficient, Eq. 6 of Yang et al. (2023):
    ``D_g = (D_g x − mean(D_g x)) · s · γ`` per group, ``B = (B x − mean(B x)) · s · γ + β``,
    with ``s`` computed from the forward input as the op declares it (:class:`rulegraph.ops.Normalization`;
    no centering for RMSNorm). InstanceNormalization (GroupNorm's export) is the same over the spatial
    dims, γ and β per channel — not in the paper, which has only LayerNorm; the same coefficient view."""

    ops: ClassVar[tuple[str, ...]] = declaring("normalization")

    def carries(self, node, spec, tainted):
        return [bool(tainted[0])] + [False] * (len(tainted) - 1)

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        if why is None and any(tainted[1:]):
            return "its scale or bias depends on the input; only the normalised input may carry components"
        return why

    def decompose(self, site: ComponentSite) -> list[Parts | None]:
        x, p, norm = site.inputs[0], site.parts[0], site.spec.normalization
        scale = site.inputs[1]
        beta = site.inputs[2] if len(site.inputs) > 2 else None
        dims = tuple(d - x.dim() for d in norm.dims(x, site.attrs))   # negative: valid with the leading G dim
        factor = norm.factor(x, site.attrs) * norm.weight(scale, x)
        if norm.centred:
            def normed(t, out=None):
                return torch.mul(t - t.mean(dim=dims, keepdim=True), factor, out=out)
        else:
            def normed(t, out=None):
                return torch.mul(t, factor, out=out)
        groups = _chunked(p.groups, site.chunk, normed, site.into(0))
        bias = normed(p.bias)
        if beta is not None:
            bias = bias + norm.weight(beta, x)
        return [Parts(groups, bias)] + [None] * (len(site.node.outputs) - 1)


@decomposition_rule("activation")
class Activation(Rule):
    """An elementwise activation ``y = f(h)``, ``h = Σ_g D_g + B``.

    With ``s = (f(h) − f(0)) / h`` the activation's linear part (for ReLU the gate
    W' of Eq. 7, for GELU Φ(h)):

    * ``variant: bar`` (D̄, Eq. 7–8): every component is gated, ``D_g = s·D_g h``,
      ``B = s·B h + f(0)`` — the bias keeps its own component, nothing is reallocated.
    * ``variant: hat`` (D̂, Eq. 9–11): ``B = f(B h)`` (Eq. 9); the remainder
      ``Θ = f(h) − f(B h) − s·Σ_g D_g h`` (Eq. 10, second term; Eq. 33) is split over
      the groups, ``D_g = s·D_g h + α_g Θ`` (Eq. 11), with α_g
      ``signed`` — D_g h / Σ_g D_g h (Eq. 13); then ``D_g = D_g h · (f(h) − f(B h)) / Σ_g D_g h``;
      ``abs``    — |D_g h| / Σ_g |D_g h| (Eq. 12);
      ``hybrid`` — abs where r = |Σ_g D_g h| / Σ_g |D_g h| < ``threshold`` (λ of Eq. 17), signed elsewhere.

    For ReLU this is the paper's rule exactly; for other activations it is the same
    construction with f in place of ReLU (f(B h) as the bias component). Where α is
    undefined (Σ_g D_g h = 0, or all D_g h = 0) Θ is added to the bias component, so the
    components still sum to ``f(h)``. The signed variant is the unique one with Group
    Additivity (App. C–D); ``abs`` and ``hybrid`` do not have it.
    """

    variant: str = "hat"
    alpha: str = "hybrid"
    threshold: float = param(0.1, UNIT)

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.alpha not in ALPHAS:
            raise ValueError(f"alpha must be one of {', '.join(ALPHAS)}, got {self.alpha!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold (λ) must be in [0, 1], got {self.threshold}")

    def check(self, node, spec, tainted):
        if not spec.elementwise:
            return f"op {node.op} is not elementwise (one input, same shape out)"
        if sum(map(bool, tainted)) != 1:
            return "it needs exactly one decomposed input"
        return None

    def decompose(self, site: ComponentSite) -> list[Parts | None]:
        k = next(i for i, p in enumerate(site.parts) if p is not None)
        h, y, p = site.inputs[k], site.outputs[0], site.parts[k]
        args = list(site.inputs)

        def f(t):
            args[k] = t
            out = site.call(*args)
            return out[0] if isinstance(out, (tuple, list)) else out

        zero = torch.zeros((), dtype=h.dtype, device=h.device)
        f0 = f(zero.expand(h.shape))
        s = torch.where(h != 0, (y - f0) / torch.where(h != 0, h, 1), zero)
        if self.variant == "bar":
            groups = _chunked(p.groups, site.chunk, lambda g, out: torch.mul(g, s, out=out), site.into(k))
            return [Parts(groups, p.bias * s + f0)]
        if site.linearized and self.alpha != "signed":
            raise ValueError("the linearized pass applies to signed α and D̄ only")
        with torch.no_grad():
            f_bias = f(p.bias)
            total = site.sums(p.groups)
            theta = y - f_bias - s * total
        if self.alpha == "signed":
            # D_g = D_g h · (s + Θ/Σ D_g h): the factor is held fixed, so this is linear in the groups
            defined = total != 0
            factor = s + torch.where(defined, theta / torch.where(defined, total, 1), zero)
            groups = _chunked(p.groups, site.chunk, lambda g, out: torch.mul(g, factor, out=out), site.into(k))
            return [Parts(groups, f_bias + torch.where(defined, zero, theta))]
        size = _chunked_sum(p.groups, site.chunk, torch.abs)
        defined = size != 0
        t = theta / torch.where(defined, size, 1)
        if self.alpha == "abs":
            t_abs, m = torch.where(defined, t, zero), zero
        else:
            stable = defined & (total.abs() >= self.threshold * size) & (total != 0)
            t_abs = torch.where(defined & ~stable, t, zero)
            m = torch.where(stable, theta / torch.where(stable, total, 1), zero)
        sm = s + m
        groups = _chunked(p.groups, site.chunk, lambda g, out: torch.add(g * sm, g.abs() * t_abs, out=out),
                          site.into(k))
        return [Parts(groups, f_bias + torch.where(defined, zero, theta))]


@decomposition_rule("product")
class Product(Rule):
    """A product of two decomposed tensors (Mul, MatMul, Einsum, Gemm A·B), split
    symmetrically: with y = x ⊙ z, ``D_g y = ½ (D_g x ⊙ z + x ⊙ D_g z)`` and
    ``B y = ½ (B x ⊙ z + x ⊙ B z)`` plus the op's constant terms — Σ = x ⊙ z exactly, and
    linear in the components (Group Additivity holds). To hold one factor fixed
    instead, use ``linear`` with ``coefficients: [k]``. With one decomposed input it
    is ``linear``."""

    ops: ClassVar[tuple[str, ...]] = declaring("product")

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        factors = [t for i, t in enumerate(tainted) if not spec.is_additive(i)]
        if why is None and sum(map(bool, factors)) > 2:
            return "it splits a product of at most two decomposed tensors"
        return why

    def decompose(self, site: ComponentSite) -> list[Parts | None]:
        carried = [i for i, p in enumerate(site.parts) if p is not None]
        factors = [i for i in carried if not site.spec.is_additive(i)]
        if len(factors) < 2:
            return Linear().decompose(site)
        i, j = factors[:2]
        # each factor in turn decomposed, the other held at its value; constant terms once, in B
        first = [p if n == i else None for n, p in enumerate(site.parts)]
        second = [p if n == j else None for n, p in enumerate(site.parts)]
        gi, bi = _through_op(site, first, zero_additive=True)
        gj, bj = _through_op(site, second, zero_additive=True)
        # bi and bj each hold the op's constant terms once: their half-sum holds them once
        return [Parts((gi + gj) * 0.5, (bi + bj) * 0.5)] + [None] * (len(site.node.outputs) - 1)


def _chunked(groups: Tensor, chunk: int, fn, into: Tensor | None = None) -> Tensor:
    """``fn(g, out)`` applied to the group components ``chunk`` at a time (bounds the temporaries), its
    last op writing each chunk's result into the output (no copy of a temporary; the same kernel, so
    the same bits): ``into`` (the groups themselves, :meth:`ComponentSite.into`: each element is read
    before it is written), else a new tensor."""
    if groups.shape[0] <= chunk:
        return fn(groups, into)
    out = torch.empty_like(groups) if into is None else into
    for start in range(0, groups.shape[0], chunk):
        fn(groups[start:start + chunk], out[start:start + chunk])
    return out


def _chunked_sum(groups: Tensor, chunk: int, fn) -> Tensor:
    total = None
    for start in range(0, groups.shape[0], chunk):
        part = fn(groups[start:start + chunk]).sum(0)
        total = part if total is None else total + part
    return total
