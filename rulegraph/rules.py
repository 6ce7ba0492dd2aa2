"""Propagation rules: how relevance at a node's output is handed to its inputs.

A rule is a small class registered by name with :func:`rule`. Its parameters are
dataclass fields, so a rule file's ``params`` are checked against them. A rule
returns one :class:`Contribution` per input (``None`` = nothing), in either form

* ``Contribution(signal=g)`` — the relevance is ``x ⊙ g`` for that input ``x``. Rules
  of the gradient family (GI, z, ε, AH, LN) produce this form; keeping the signal
  lets the next rule start from it instead of dividing relevance by activations,
  so GI with detached terms is reproduced to rounding;
* ``Contribution(relevance=r)`` — an explicit relevance tensor.

What a contribution hands to an input that carries no relevance (a bias, the other
summand, an ε) is *absorbed*; the audit records it. A rule also says whether it
conserves on a given node (:meth:`Rule.conserves`); where it does not (GI through
GELU, ``stop``), the audit books the difference as a *break*.

Notation below: a node computes ``z = f(x_1, …, x_n)``; ``R`` is the relevance at
``z``; ``s = R / z`` (or the incoming signal) is the rule's starting "gradient".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from .errors import RuleMatchError
from .ops import OpSpec, unbroadcast, vjp
from .ops.nn import _softmax_axis, held_layer_norm_stats, norm_dims

Tensor = torch.Tensor


@dataclass
class Contribution:
    """Relevance handed to one input: ``relevance`` explicitly, or ``x ⊙ signal``."""

    signal: Tensor | None = None
    relevance: Tensor | None = None

    def tensor(self, x: Tensor) -> Tensor:
        return self.relevance if self.relevance is not None else x * self.signal


class Incoming:
    """Relevance arriving at one value, accumulated over its consumers.

    Keeps the signal form while every contribution has it (``R = x ⊙ Σ g``), and
    falls back to an explicit sum as soon as one does not.
    """

    __slots__ = ("value", "signal", "explicit")

    def __init__(self, value: Tensor):
        self.value = value
        self.signal: Tensor | None = None
        self.explicit: Tensor | None = None

    def add(self, c: Contribution) -> None:
        if c.signal is not None and self.explicit is None:
            self.signal = c.signal if self.signal is None else self.signal + c.signal
            return
        r = c.tensor(self.value)
        if self.signal is not None:
            r = r + self.value * self.signal
            self.signal = None
        self.explicit = r if self.explicit is None else self.explicit + r

    @property
    def tensor(self) -> Tensor:
        """The relevance R at this value."""
        return self.explicit if self.explicit is not None else self.value * self.signal


@dataclass
class Site:
    """What a rule sees of one node during the relevance pass."""

    node: Any                      # ir.Node
    spec: OpSpec
    attrs: dict[str, Any]
    inputs: list[Any]              # tensors (or host lists for static inputs, None for omitted)
    outputs: list[Tensor]
    tainted: list[bool]            # which inputs carry relevance
    incoming: list[Incoming | None]  # relevance at each output
    audit: bool = True
    absorbed: list[Tensor] = field(default_factory=list)  # extra absorbed amounts (ε…), summed by the audit

    def vjp(self, grads: list[Tensor | None], wants: list[bool]) -> list[Tensor | None]:
        return vjp(self.spec, grads, self.inputs, self.outputs, wants, self.attrs)

    def ratio(self, k: int, stabilizer: float = 0.0) -> Tensor | None:
        """``s = R / (z + ε·sign z)`` at output ``k``, starting from the signal where there is one.

        With ε = 0 this is ``R / z``, taken as 0 where ``z`` is 0 (LRP's 0/0 := 0).
        """
        inc = self.incoming[k]
        if inc is None:
            return None
        z = self.outputs[k]
        if stabilizer:
            denominator = z + stabilizer * (2 * (z >= 0).to(z.dtype) - 1)
            if inc.signal is not None:
                s = inc.signal * z / denominator
            else:
                s = inc.explicit / denominator
            if self.audit:
                self.absorbed.append(s * (denominator - z))
            return s
        if inc.signal is not None:
            return inc.signal
        return torch.where(z == 0, torch.zeros((), dtype=z.dtype, device=z.device), inc.explicit / z)


# -- registry -------------------------------------------------------------------------------

def registrar(table: dict[str, type], kind: str):
    """A class decorator factory ``@<kind>(name)`` that registers a dataclass in ``table``."""
    def named(name: str):
        def register(cls):
            if name in table:
                raise RuntimeError(f"{kind} {name!r} is registered twice")
            cls.name = name
            table[name] = dataclass(cls)
            return table[name]
        return register
    return named


RULES: dict[str, type["Rule"]] = {}
#: ``@rule(name)``: register a rule class under the name rule files use
rule = registrar(RULES, "rule")


class Rule:
    """Base class. Subclasses set ``conserving`` and implement :meth:`propagate`."""

    name: ClassVar[str] = ""
    #: conserves relevance on every node it applies to (``False``: see :meth:`conserves`)
    conserving: ClassVar[bool] = True
    #: op types the rule can apply to (``None``: any)
    ops: ClassVar[tuple[str, ...] | None] = None
    #: how the rule departs from conservation, for the audit: what absorbs, or why it breaks
    breaking: ClassVar[str] = "conserves"

    @classmethod
    def params(cls) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(cls)}

    def check(self, node, spec: OpSpec, tainted: Sequence[bool]) -> str | None:
        """Why the rule cannot apply to this node, or ``None`` if it can."""
        if self.ops is not None and node.op not in self.ops:
            return f"it applies to {', '.join(self.ops)}"
        return None

    def carries(self, node, spec: OpSpec, tainted: Sequence[bool]) -> list[bool]:
        """Which inputs receive relevance (default: every tainted input)."""
        return list(tainted)

    def conserves(self, node, spec: OpSpec, tainted: Sequence[bool]) -> bool:
        return self.conserving

    def propagate(self, site: Site) -> list[Contribution | None]:
        raise NotImplementedError

    def describe(self) -> str:
        set_params = {k: v for k, v in dataclasses.asdict(self).items()}
        inner = ", ".join(f"{k}={v}" for k, v in set_params.items())
        return f"{self.name}({inner})" if inner else self.name


def _gradient_contributions(site: Site, carried: list[bool], seeds: list[Tensor | None]) -> list[Contribution | None]:
    """``x_i ⊙ VJP_i(seeds)`` for carried inputs, plus the absorbed share of constant additive inputs."""
    spec = site.spec
    absorbing = [site.audit and not t and spec.is_additive(i) and isinstance(x, Tensor) and x.is_floating_point()
                 for i, (t, x) in enumerate(zip(site.tainted, site.inputs))]
    wants = [c or a for c, a in zip(carried, absorbing)]
    if not any(wants):
        return [None] * len(site.inputs)
    grads = site.vjp(seeds, wants)
    return [Contribution(signal=g) if w and g is not None else None for g, w in zip(grads, wants)]


@dataclass
class _GradientFamily(Rule):
    """Shared by :class:`Gradient` and :class:`Epsilon`: ``detach`` lists inputs held constant,
    as ``.detach()`` does in the forward. The rule conserves exactly on ops affine in the
    inputs it propagates to (linear layers, sums, routing); elsewhere (GELU, softmax,
    products of two activations) the audit books the difference as a break."""

    detach: list[int] = field(default_factory=list)
    conserving: ClassVar[bool] = False
    breaking: ClassVar[str] = "breaks on ops not affine in the carried inputs"

    def carries(self, node, spec, tainted):
        return [t and i not in self.detach for i, t in enumerate(tainted)]

    def conserves(self, node, spec, tainted):
        carried = self.carries(node, spec, tainted)
        return any(carried) and spec.affine(carried)


@rule("gradient")
class Gradient(_GradientFamily):
    """Gradient×Input in its LRP form (seeds/002, Sec. 3, Eq. 4): ``R_i = x_i ⊙ ∂z/∂x_i · s``.

    ``detach`` lists inputs held constant — the paper's implementation trick (seeds/002,
    Sec. 4): detaching the attention probabilities gives the AH rule, detaching
    LayerNorm's std the LN rule.
    """

    def propagate(self, site):
        seeds = [site.ratio(k) for k in range(len(site.outputs))]
        return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), seeds)


@rule("epsilon")
class Epsilon(_GradientFamily):
    """LRP-ε (Bach et al. 2015, Eq. 58; DESIGN.md): ``R_i = x_i ⊙ ∂z/∂x_i · R / (z + ε·sign z)``.

    The share ``R·ε·sign z / (z + ε·sign z)`` is absorbed by the stabiliser; biases
    absorb theirs. With ``bias: false`` the additive constant inputs (a Gemm's or
    Conv's bias, the constant of an Add) are left out of ``z`` and absorb nothing:
    ``z' = z − b``. With ``epsilon: 0`` this is LRP-0 (the z-rule).
    """

    epsilon: float = 1e-6
    bias: bool = True
    breaking: ClassVar[str] = "ε and biases absorb; breaks on ops not affine in the carried inputs"

    def propagate(self, site):
        if self.bias:
            seeds = [site.ratio(k, self.epsilon) for k in range(len(site.outputs))]
            return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), seeds)
        carried = self.carries(site.node, site.spec, site.tainted)
        constants = [i for i, (t, x) in enumerate(zip(site.tainted, site.inputs))
                     if not t and site.spec.is_additive(i) and isinstance(x, Tensor) and x.is_floating_point()]
        args = [torch.zeros_like(x) if i in constants else x for i, x in enumerate(site.inputs)]
        out = site.spec.forward(*args, **site.attrs)
        z = out[0] if isinstance(out, (tuple, list)) else out
        stabilized = _stabilize(z, self.epsilon)
        s = _divide(site.incoming[0].tensor, stabilized)
        if site.audit:
            site.absorbed.append(s * (stabilized - z))
        wants = [c and i not in constants for i, c in enumerate(carried)]
        if not any(wants):
            return [None] * len(site.inputs)
        grads = vjp(site.spec, [s] + [None] * (len(site.outputs) - 1), args, [z], wants, site.attrs)
        return [Contribution(signal=g) if w and g is not None else None for g, w in zip(grads, wants)]


@rule("zero")
class Zero(Epsilon):
    """LRP-0, the z-rule (DESIGN.md): ``R_i = Σ_j x_i w_ij / z_j · R_j`` — ε-rule with ε = 0."""

    epsilon: float = 0.0


def _stabilize(z: Tensor, epsilon: float) -> Tensor:
    """``z + ε·sign z`` with sign 0 := +1, as Zennit's stabiliser."""
    return z + epsilon * (2 * (z >= 0).to(z.dtype) - 1) if epsilon else z


def _divide(r: Tensor, z: Tensor) -> Tensor:
    """``r / z`` with 0/0 := 0 (LRP's convention where a denominator vanishes)."""
    return torch.where(z == 0, torch.zeros((), dtype=z.dtype, device=z.device), r / torch.where(z == 0, 1.0, z))


# -- modified-weight rules on linear layers (Zennit's BasicHook form) ------------------------------

#: ops the modified-weight rules apply to: affine in one carried input, weights and bias constant
LINEAR_OPS = ("Gemm", "MatMul", "Conv", "ConvTranspose")


def _pos(t: Tensor) -> Tensor:
    return t.clamp(min=0)


def _neg(t: Tensor) -> Tensor:
    return t.clamp(max=0)


@dataclass
class _Term:
    """One modified forward ``sign · f(x', W', b')`` of a rule: ``weight`` and ``bias`` map the
    constant inputs (``bias=None``: zeroed); the term hands ``sign · x' ⊙ VJP_x'(s)`` to ``x``."""

    x: Tensor
    weight: Any
    bias: Any = None
    sign: float = 1.0


@dataclass
class _Group:
    """Terms sharing one denominator ``z = Σ terms`` and seed ``s = mask · R / stab(z)``; the
    group's relevance is scaled by ``coefficient`` (α, −β)."""

    terms: list[_Term]
    coefficient: float = 1.0
    mask: Tensor | None = None


@dataclass
class _ModifiedWeights(Rule):
    """Base of γ, αβ, z⁺, flat, w², zB: each a sum of modified forwards of one linear layer
    ``z = f(x; W, b)`` (Gemm, MatMul, Conv, ConvTranspose with constant W and b).

    Every group's share is ``coefficient · Σ_terms sign · x' ⊙ ∂f(x'; W', b')/∂x' · s``. What
    the bias terms and the stabiliser take, and the relevance a mask drops, is absorbed:
    relevance is conserved up to those.
    """

    stabilizer: float = 1e-6
    ops: ClassVar[tuple[str, ...]] = LINEAR_OPS
    breaking: ClassVar[str] = "biases and the stabiliser absorb"

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        if why is None and sum(map(bool, tainted)) != 1:
            return "it needs exactly one relevance-carrying input (the weights and bias must be constants)"
        return why

    def groups(self, x: Tensor, z: Tensor) -> list[_Group]:
        """The rule's groups for input ``x`` and the layer's actual output ``z``."""
        raise NotImplementedError

    def propagate(self, site):
        k = site.tainted.index(True)
        x = site.inputs[k]
        floats = [i for i, v in enumerate(site.inputs) if i != k and isinstance(v, Tensor) and v.is_floating_point()]
        biases = [i for i in floats if site.spec.is_additive(i)]
        weights = [i for i in floats if i not in biases]

        def forward(x_mod, term: _Term) -> Tensor:
            args = list(site.inputs)
            args[k] = x_mod
            for i in weights:
                args[i] = term.weight(args[i])
            for i in biases:
                args[i] = term.bias(args[i]) if term.bias is not None else torch.zeros_like(args[i])
            return site.spec.forward(*args, **site.attrs)

        r = site.incoming[0].tensor
        relevance = torch.zeros_like(x)
        kept = torch.zeros_like(r) if site.audit else None
        for group in self.groups(x, site.outputs[0]):
            parts = []
            for term in group.terms:
                with torch.enable_grad():
                    z, back = torch.func.vjp(lambda v, term=term: forward(v, term), term.x)
                parts.append((term, z, back))
            z = sum(term.sign * z for term, z, _ in parts)
            stabilized = _stabilize(z, self.stabilizer)
            seed = r if group.mask is None else r * group.mask
            s = _divide(seed, stabilized)
            for term, _, back in parts:
                relevance = relevance + (group.coefficient * term.sign) * term.x * back(s)[0]
            if site.audit:
                with_bias = [term.sign * _bias_term(site, biases, term, forward) for term, _, _ in parts
                             if term.bias is not None and biases]
                site.absorbed.append(group.coefficient * s * (stabilized - z + sum(with_bias, torch.zeros_like(z))))
                kept = kept + group.coefficient * seed
        if site.audit:
            site.absorbed.append(r - kept)     # what a mask dropped (z = 0 for γ); zero otherwise
        out: list[Contribution | None] = [None] * len(site.inputs)
        out[k] = Contribution(relevance=relevance)
        return out


def _bias_term(site: Site, biases: list[int], term: _Term, forward) -> Tensor:
    """``f(0; W', b')``, the part of a term's output its (modified) bias makes."""
    b = term.bias(site.inputs[biases[0]])
    if site.node.op in ("Conv", "ConvTranspose"):
        return b.reshape(1, -1, *([1] * (site.outputs[0].dim() - 2)))
    if site.node.op == "Gemm":
        return site.attrs.get("beta", 1.0) * b
    return forward(torch.zeros_like(term.x), term)


def _same(t: Tensor) -> Tensor:
    return t


@rule("gamma")
class Gamma(_ModifiedWeights):
    """LRP-γ (Montavon et al. 2019, "Layer-wise relevance propagation: an overview", Eq. 7),
    generalised to signed inputs as in Zennit (Andéol et al. 2021): where ``z_j > 0``,
    ``R_i = Σ_j (x_i⁺ (w_ij + γ w_ij⁺) + x_i⁻ (w_ij + γ w_ij⁻)) / (z_j⁺⁺ + z_j⁻⁻ + ε) · R_j``
    with ``b + γ b⁺`` in the denominator; where ``z_j < 0`` the same with ``w⁺``/``w⁻`` and
    ``x⁺``/``x⁻`` crossed (bias ``b + γ b⁻``). Relevance at outputs with ``z_j = 0`` is dropped
    (the audit books it as absorbed). ``gamma: 0`` is LRP-0 up to the stabiliser.
    """

    gamma: float = 0.25
    breaking: ClassVar[str] = "biases and the stabiliser absorb; relevance at z = 0 is dropped (booked as absorbed)"

    def groups(self, x, z):
        g = self.gamma

        def plus(t):
            return t + g * _pos(t)

        def minus(t):
            return t + g * _neg(t)
        return [
            _Group([_Term(_pos(x), plus, plus), _Term(_neg(x), minus)], mask=(z > 0).to(z.dtype)),
            _Group([_Term(_pos(x), minus, minus), _Term(_neg(x), plus)], mask=(z < 0).to(z.dtype)),
        ]


@rule("alphabeta")
class AlphaBeta(_ModifiedWeights):
    """LRP-αβ (Bach et al. 2015, Eq. 60; Montavon et al. 2019, Eq. 8 for α1β0):
    ``R_i = Σ_j (α (x_i w_ij)⁺ / (Σ_i' (x_i' w_i'j)⁺ + b_j⁺) − β (x_i w_ij)⁻ / (Σ_i' (x_i' w_i'j)⁻ + b_j⁻)) R_j``
    where ``(x w)⁺ = x⁺w⁺ + x⁻w⁻`` are the positive *contributions* (not merely ``w⁺``).
    ``α − β = 1`` keeps the total; α, β ≥ 0.
    """

    alpha: float = 2.0
    beta: float = 1.0

    def __post_init__(self):
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"alpha and beta must be ≥ 0, got alpha={self.alpha}, beta={self.beta}")
        if abs(self.alpha - self.beta - 1.0) > 1e-12:
            raise ValueError(f"alpha − beta must be 1, got alpha={self.alpha}, beta={self.beta}")

    def groups(self, x, z):
        groups = [_Group([_Term(_pos(x), _pos, _pos), _Term(_neg(x), _neg)], coefficient=self.alpha)]
        if self.beta:
            groups.append(_Group([_Term(_pos(x), _neg, _neg), _Term(_neg(x), _pos)], coefficient=-self.beta))
        return groups


@rule("zplus")
class ZPlus(_ModifiedWeights):
    """LRP-z⁺ (Montavon et al. 2017, "Explaining nonlinear classification decisions with deep
    Taylor decomposition", Eq. 12): αβ with α = 1, β = 0 on positive contributions
    ``(x_i w_ij)⁺ = x_i⁺ w_ij⁺ + x_i⁻ w_ij⁻``; ``b⁺`` absorbs its share."""

    def groups(self, x, z):
        return [_Group([_Term(_pos(x), _pos, _pos), _Term(_neg(x), _neg)])]


@rule("flat")
class Flat(_ModifiedWeights):
    """LRP-flat (Lapuschkin et al. 2019, "Unmasking Clever Hans predictors", Sec. Methods): every
    input the output connects to gets an equal share, ``R_i = Σ_j 1 / Σ_i' 1 · R_j`` — the
    z-rule with ``x = 1``, ``w = 1`` and no bias (over a Conv's receptive field)."""

    def groups(self, x, z):
        return [_Group([_Term(torch.ones_like(x), torch.ones_like)])]


@rule("wsquare")
class WSquare(_ModifiedWeights):
    """LRP-w² (Montavon et al. 2017, Eq. 14): ``R_i = Σ_j w_ij² / (Σ_i' w_i'j² + b_j²) · R_j``,
    the z-rule with ``x = 1`` and squared weights (Zennit squares the bias too)."""

    def groups(self, x, z):
        return [_Group([_Term(torch.ones_like(x), torch.square, torch.square)])]


@rule("zbox")
class ZBox(_ModifiedWeights):
    """LRP-z^B (Montavon et al. 2017, Eq. 15) for a first layer on inputs bounded by
    ``low ≤ x ≤ high``: ``R_i = Σ_j (x_i w_ij − l_i w_ij⁺ − h_i w_ij⁻) / Σ_i' (…) · R_j``, with
    ``b − b⁺ − b⁻ = 0`` in the denominator as in Zennit. ``low`` / ``high``: one value, or one
    per channel (axis 1, e.g. the normalised bounds of each image channel).
    """

    low: list[float] = field(default_factory=lambda: [0.0])
    high: list[float] = field(default_factory=lambda: [1.0])

    def __post_init__(self):
        if len(self.low) != len(self.high):
            raise ValueError(f"low and high need as many values, got {len(self.low)} and {len(self.high)}")
        if any(lo > hi for lo, hi in zip(self.low, self.high)):
            raise ValueError(f"low must not exceed high, got low={self.low}, high={self.high}")

    def _bound(self, values: list[float], x: Tensor) -> Tensor:
        t = torch.tensor(values, dtype=x.dtype, device=x.device)
        if len(values) > 1:
            if x.dim() < 2 or x.shape[1] != len(values):
                raise RuleMatchError(f"rule 'zbox' has {len(values)} bounds per channel but the input has shape "
                                     f"{tuple(x.shape)} (channels on axis 1)")
            t = t.reshape(1, -1, *([1] * (x.dim() - 2)))
        return t.expand_as(x)

    def groups(self, x, z):
        return [_Group([_Term(x, _same, _same), _Term(self._bound(self.low, x), _pos, _pos, -1.0),
                        _Term(self._bound(self.high, x), _neg, _neg, -1.0)])]


# -- AttnLRP (Achtibat et al. 2024) -----------------------------------------------------------------

@rule("softmax")
class Softmax(Rule):
    """AttnLRP softmax rule (Achtibat et al. 2024, Prop. 3.1): ``R_in = x ⊙ (R − s ⊙ Σ R)``, the
    sum over the softmax axis, ``s`` its output — equal to Gradient×Input through the softmax.
    It does not conserve (the paper keeps the bias term it drops): the audit books a break.

    Where ``R`` arrives as ``s ⊙ g`` (signal form), ``R − s ⊙ ΣR = s ⊙ (g − Σ s ⊙ g)`` is the
    softmax's own VJP of ``g``, so the rule hands on that signal and no division is needed.
    """

    ops: ClassVar[tuple[str, ...]] = ("Softmax",)
    conserving: ClassVar[bool] = False
    breaking: ClassVar[str] = "breaks by design (Prop. 3.1 drops the softmax's bias term)"

    def propagate(self, site):
        if site.incoming[0].signal is not None:
            return [Contribution(signal=site.vjp([site.incoming[0].signal], [True])[0])]
        axis, coerce_2d = site.attrs.get("axis", -1), site.attrs.get("coerce_2d", 0)
        x, ax, shape = _softmax_axis(site.inputs[0], axis, coerce_2d)
        s, _, _ = _softmax_axis(site.outputs[0], axis, coerce_2d)
        r, _, _ = _softmax_axis(site.incoming[0].tensor, axis, coerce_2d)
        inner = r - s * r.sum(dim=ax, keepdim=True)
        rel = torch.where(inner == 0, torch.zeros((), dtype=x.dtype, device=x.device), x * inner)
        return [Contribution(relevance=rel if shape is None else rel.reshape(shape))]


@rule("uniform")
class Uniform(Rule):
    """AttnLRP uniform rule for a product of activations (Achtibat et al. 2024, Eq. 7): the
    ε-rule, then an equal split between the ``n`` relevance-carrying factors, ``R_i = x_i ⊙ ∂z/∂x_i · R / (n (z + ε·sign z))`` — for ``A·B`` both halves get ``R/2`` of
    the z-rule's share. With one carried factor it is the ε-rule.
    """

    epsilon: float = 0.0
    ops: ClassVar[tuple[str, ...]] = ("MatMul", "Mul", "Einsum")
    breaking: ClassVar[str] = "ε absorbs"

    def propagate(self, site):
        n = sum(map(bool, site.tainted))
        s = site.ratio(0, self.epsilon)
        return _gradient_contributions(site, list(site.tainted), [s / n if n > 1 else s])


@rule("ah")
class AttentionHead(Rule):
    """AH rule (seeds/002, Sec. 4): in ``y_j = Σ_i x_i p_ij`` the attention probabilities
    ``p`` are constants, so ``R(x_i) = Σ_j x_i p_ij / Σ_i' x_i' p_i'j · R(y_j)`` and the
    queries and keys get none. Applies to the probabilities×values product; ``probs``
    is the input holding the probabilities (default 0, as in ``softmax(QKᵀ)·V``).
    """

    probs: int = 0
    ops: ClassVar[tuple[str, ...]] = ("MatMul", "Einsum", "Mul")

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        if why is None and self.probs >= len(node.inputs):
            return f"probs={self.probs} but the node has {len(node.inputs)} inputs"
        return why

    def carries(self, node, spec, tainted):
        return [t and i != self.probs for i, t in enumerate(tainted)]

    def propagate(self, site):
        return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), [site.ratio(0)])


@rule("ln")
class LayerNorm(Rule):
    """LN rule (seeds/002, Sec. 4): hold ``α = 1/√(ε + Var[x])`` constant, so LayerNorm is
    the linear map ``αC`` (``C`` the centering matrix) and the z-rule gives
    ``R(x_i) = Σ_j x_i (δ_ij − 1/N) / Σ_i' x_i' (δ_i'j − 1/N) · R(y_j)``; the scale γ is an
    elementwise weight and the shift β absorbs its share.

    On a fused ``LayerNormalization`` it computes that directly; on RMS norms it holds
    the root mean square constant; on a decomposed LayerNorm it applies to the
    ``Div`` by the standard deviation, holding the denominator constant.
    """

    ops: ClassVar[tuple[str, ...]] = ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "Div")
    breaking: ClassVar[str] = "β absorbs"

    def carries(self, node, spec, tainted):
        return [bool(tainted[0])] + [False] * (len(tainted) - 1)

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        if why is None and node.op != "Div" and any(tainted[1:]):
            return "its scale and shift must be constants"
        return why

    def propagate(self, site):
        op = site.node.op
        s = site.ratio(0)
        x = site.inputs[0]
        out: list[Contribution | None] = [None] * len(site.inputs)
        if op == "Div":
            return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), [s])
        scale = site.inputs[1]
        axis, eps = site.attrs.get("axis", -1), site.attrs.get("epsilon", 1e-5)
        dims = norm_dims(x, axis)
        if op == "LayerNormalization":
            _, rstd = held_layer_norm_stats(x, axis, eps)
            gs = s * scale
            out[0] = Contribution(signal=gs.sub_(gs.mean(dim=dims, keepdim=True)).mul_(rstd))
            if site.audit and len(site.inputs) > 2 and site.inputs[2] is not None:
                out[2] = Contribution(signal=unbroadcast(s, site.inputs[2].shape))
        else:
            rms = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps)
            out[0] = Contribution(signal=s * scale * rms)
        return out


@rule("pass")
class Pass(Rule):
    """Routing ops (Reshape, Transpose, Slice, Concat, Gather with fixed indices, Expand…):
    relevance follows the op's own index mapping, ``R_in = Jᵀ R_out`` with ``J`` a 0/1
    selection. Pieces a Concat or Where takes from constants absorb their share.
    """

    def check(self, node, spec, tainted):
        if not spec.routing:
            return "it applies only to routing ops (Reshape, Transpose, Slice, Concat, Gather, Expand, Where…)"
        return None

    def propagate(self, site):
        wants = [isinstance(x, Tensor) and x.is_floating_point() and (t or (site.audit and site.spec.is_additive(i)))
                 for i, (t, x) in enumerate(zip(site.tainted, site.inputs))]
        if all(inc is None or inc.signal is not None for inc in site.incoming):
            grads = site.vjp([inc.signal if inc else None for inc in site.incoming], wants)
            return [Contribution(signal=g) if g is not None else None for g in grads]
        grads = site.vjp([inc.tensor if inc else None for inc in site.incoming], wants)
        return [Contribution(relevance=g) if g is not None else None for g in grads]


@rule("identity")
class Identity(Rule):
    """``R_in = R_out`` through an op with one relevance-carrying input of the output's
    shape — e.g. GELU or SiLU with the gate held constant (AttnLRP, Achtibat et al. 2024)."""

    def check(self, node, spec, tainted):
        if sum(map(bool, tainted)) != 1:
            return f"it needs exactly one relevance-carrying input, the node has {sum(map(bool, tainted))}"
        return None

    def propagate(self, site):
        i = site.tainted.index(True)
        r = site.incoming[0].tensor
        if tuple(r.shape) != tuple(site.inputs[i].shape):
            raise RuleMatchError(f"node {site.node.name!r} ({site.node.op}): rule 'identity' needs the output shape "
                                 f"{tuple(r.shape)} to equal the input's {tuple(site.inputs[i].shape)}")
        out: list[Contribution | None] = [None] * len(site.inputs)
        out[i] = Contribution(relevance=r)
        return out


@rule("stop")
class Stop(Rule):
    """``R_in = 0``: relevance ends here. Whatever arrives is booked as a break."""

    conserving: ClassVar[bool] = False
    breaking: ClassVar[str] = "breaks by design: drops all relevance arriving"

    def carries(self, node, spec, tainted):
        return [False] * len(tainted)

    def propagate(self, site):
        return [None] * len(site.inputs)
