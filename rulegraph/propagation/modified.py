"""Modified-weight rules on linear layers (Zennit's BasicHook form): γ, αβ, z⁺, flat, w², zB.

Each is a sum of modified forwards of one linear layer ``z = f(x; W, b)`` (Gemm, MatMul,
Conv, ConvTranspose with constant W and b), so one implementation serves every such op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..errors import RuleMatchError
from .base import NON_NEGATIVE, Rule, param, relevance_rule
from .numerics import divide, stabilize
from .signal import Contribution, Site

Tensor = torch.Tensor


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

    stabilizer: float = param(1e-6, NON_NEGATIVE)
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
            stabilized = stabilize(z, self.stabilizer)
            seed = r if group.mask is None else r * group.mask
            s = divide(seed, stabilized)
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
    if site.spec.bias is not None:
        return site.spec.bias(term.bias(site.inputs[biases[0]]), site.outputs[0], site.attrs)
    return forward(torch.zeros_like(term.x), term)


def _same(t: Tensor) -> Tensor:
    return t


@relevance_rule("gamma")
class Gamma(_ModifiedWeights):
    """LRP-γ (Montavon et al. 2019, "Layer-wise relevance propagation: an overview", Eq. 7),
    generalised to signed inputs as in Zennit (Andéol et al. 2021): where ``z_j > 0``,
    ``R_i = Σ_j (x_i⁺ (w_ij + γ w_ij⁺) + x_i⁻ (w_ij + γ w_ij⁻)) / (z_j⁺⁺ + z_j⁻⁻ + ε) · R_j``
    with ``b + γ b⁺`` in the denominator; where ``z_j < 0`` the same with ``w⁺``/``w⁻`` and
    ``x⁺``/``x⁻`` crossed (bias ``b + γ b⁻``). Relevance at outputs with ``z_j = 0`` is dropped
    (the audit books it as absorbed). ``gamma: 0`` is LRP-0 up to the stabiliser.
    """

    gamma: float = param(0.25, NON_NEGATIVE)
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


@relevance_rule("alphabeta")
class AlphaBeta(_ModifiedWeights):
    """LRP-αβ (Bach et al. 2015, Eq. 60; Montavon et al. 2019, Eq. 8 for α1β0):
    ``R_i = Σ_j (α (x_i w_ij)⁺ / (Σ_i' (x_i' w_i'j)⁺ + b_j⁺) − β (x_i w_ij)⁻ / (Σ_i' (x_i' w_i'j)⁻ + b_j⁻)) R_j``
    where ``(x w)⁺ = x⁺w⁺ + x⁻w⁻`` are the positive *contributions* (not merely ``w⁺``).
    ``α − β = 1`` keeps the total; α, β ≥ 0.
    """

    alpha: float = param(2.0, NON_NEGATIVE)
    beta: float = param(1.0, NON_NEGATIVE)

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


@relevance_rule("zplus")
class ZPlus(_ModifiedWeights):
    """LRP-z⁺ (Montavon et al. 2017, "Explaining nonlinear classification decisions with deep
    Taylor decomposition", Eq. 12): αβ with α = 1, β = 0 on positive contributions
    ``(x_i w_ij)⁺ = x_i⁺ w_ij⁺ + x_i⁻ w_ij⁻``; ``b⁺`` absorbs its share."""

    def groups(self, x, z):
        return [_Group([_Term(_pos(x), _pos, _pos), _Term(_neg(x), _neg)])]


@relevance_rule("flat")
class Flat(_ModifiedWeights):
    """LRP-flat (Lapuschkin et al. 2019, "Unmasking Clever Hans predictors", Sec. Methods): every
    input the output connects to gets an equal share, ``R_i = Σ_j 1 / Σ_i' 1 · R_j`` — the
    z-rule with ``x = 1``, ``w = 1`` and no bias (over a Conv's receptive field)."""

    def groups(self, x, z):
        return [_Group([_Term(torch.ones_like(x), torch.ones_like)])]


@relevance_rule("wsquare")
class WSquare(_ModifiedWeights):
    """LRP-w² (Montavon et al. 2017, Eq. 14): ``R_i = Σ_j w_ij² / (Σ_i' w_i'j² + b_j²) · R_j``,
    the z-rule with ``x = 1`` and squared weights (Zennit squares the bias too)."""

    def groups(self, x, z):
        return [_Group([_Term(torch.ones_like(x), torch.square, torch.square)])]


@relevance_rule("zbox")
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

    def check_graph(self, graph, node):
        """One bound per channel must match the layer's input channels (a Conv's weight ``[out, in/group, …]``)."""
        weight = graph.constants.get(node.inputs[1]) if node.op == "Conv" and len(node.inputs) > 1 else None
        if len(self.low) == 1 or weight is None:
            return None
        channels = weight.shape[1] * int(node.attrs.get("group", 1))
        if channels != len(self.low):
            return f"{len(self.low)} bounds per channel (low/high) but the convolution takes {channels} input channels"
        return None

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
