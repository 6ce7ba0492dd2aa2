"""The gradient family: Gradient×Input, LRP-0 / ε, and the AH and LN rules of Ali et al. (2022).

Each propagates ``x_i ⊙ ∂z/∂x_i · s`` for the inputs it carries, ``s`` the relevance over
the output (possibly stabilised), and hands it on in signal form (:mod:`.signal`), so a
chain of these rules reproduces Gradient×Input with some terms detached to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..ops import declaring, unbroadcast, vjp
from .base import NON_NEGATIVE, Rule, param, relevance_rule
from .numerics import divide, stabilize
from .signal import Contribution, Site

Tensor = torch.Tensor


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

    detach: list[int] = param([], NON_NEGATIVE)
    conserving: ClassVar[bool] = False
    breaking: ClassVar[str] = "breaks on ops not affine in the carried inputs"

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        beyond = [i for i in self.detach if i >= len(node.inputs)]
        if why is None and beyond:
            return f"detach lists input {beyond[0]}, but the node has {len(node.inputs)} inputs (0…{len(node.inputs) - 1})"
        return why

    def carries(self, node, spec, tainted):
        return [t and i not in self.detach for i, t in enumerate(tainted)]

    def conserves(self, node, spec, tainted):
        carried = self.carries(node, spec, tainted)
        return any(carried) and spec.is_affine(node, carried)


@relevance_rule("gradient")
class Gradient(_GradientFamily):
    """Gradient×Input in its LRP form (Ali et al. 2022, "XAI for Transformers: better explanations through conservative propagation", ICML, Sec. 3, Eq. 4): ``R_i = x_i ⊙ ∂z/∂x_i · s``.

    ``detach`` lists inputs held constant — the paper's implementation trick (Ali et al.
    2022, Sec. 4): detaching the attention probabilities gives the AH rule, detaching
    LayerNorm's std the LN rule.
    """

    def propagate(self, site):
        seeds = [site.ratio(k) for k in range(len(site.outputs))]
        return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), seeds)


@relevance_rule("epsilon")
class Epsilon(_GradientFamily):
    """LRP-ε (Bach et al. 2015, "On pixel-wise explanations for non-linear classifier decisions by
    layer-wise relevance propagation", PLoS ONE, Eq. 58): ``R_i = x_i ⊙ ∂z/∂x_i · R / (z + ε·sign z)``.

    The share ``R·ε·sign z / (z + ε·sign z)`` is absorbed by the stabiliser; biases
    absorb theirs. With ``bias: false`` the additive constant inputs (a Gemm's or
    Conv's bias, the constant of an Add) are left out of ``z`` and absorb nothing:
    ``z' = z − b``. With ``epsilon: 0`` this is LRP-0 (the z-rule).
    """

    epsilon: float = param(1e-6, NON_NEGATIVE)
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
        stabilized = stabilize(z, self.epsilon)
        s = divide(site.incoming[0].tensor, stabilized)
        if site.audit:
            site.absorbed.append(s * (stabilized - z))
        wants = [c and i not in constants for i, c in enumerate(carried)]
        if not any(wants):
            return [None] * len(site.inputs)
        grads = vjp(site.spec, [s] + [None] * (len(site.outputs) - 1), args, [z], wants, site.attrs)
        return [Contribution(signal=g) if w and g is not None else None for g, w in zip(grads, wants)]


@relevance_rule("zero")
class Zero(Epsilon):
    """LRP-0, the z-rule (Bach et al. 2015, Eq. 56): ``R_i = Σ_j x_i w_ij / z_j · R_j`` — ε-rule with ε = 0."""

    epsilon: float = param(0.0, NON_NEGATIVE)



@dataclass
class _HeldFactor(Rule):
    """A product with one factor held constant (the input the param :attr:`held` names): the
    z-rule through the other factor, which conserves; the held factor gets none."""

    held: ClassVar[str] = ""

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        index = getattr(self, self.held)
        if why is None and index >= len(node.inputs):
            return f"{self.held}={index} but the node has {len(node.inputs)} inputs"
        return why

    def carries(self, node, spec, tainted):
        return [t and i != getattr(self, self.held) for i, t in enumerate(tainted)]

    def propagate(self, site):
        return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), [site.ratio(0)])


@relevance_rule("ah")
class AttentionHead(_HeldFactor):
    """AH rule (Ali et al. 2022, "XAI for Transformers: better explanations through conservative propagation", ICML, Sec. 4): in ``y_j = Σ_i x_i p_ij`` the attention probabilities
    ``p`` are constants, so ``R(x_i) = Σ_j x_i p_ij / Σ_i' x_i' p_i'j · R(y_j)`` and the
    queries and keys get none. Applies to the probabilities×values product; ``probs``
    is the input holding the probabilities (default 0, as in ``softmax(QKᵀ)·V``).
    """

    probs: int = param(0, NON_NEGATIVE)
    held: ClassVar[str] = "probs"
    ops: ClassVar[tuple[str, ...]] = declaring("product", "contraction", "elementwise")


@relevance_rule("gate")
class Gate(_HeldFactor):
    """Signal-take-all for a gated product ``z = x ⊙ g``: the rule of Arras et al. for the multiplicative
    gates of an LSTM, ``R(gate) = 0``, ``R(signal) = R(z)`` (Arras et al. 2017, "Explaining recurrent neural
    network predictions in sentiment analysis", WASSA workshop at EMNLP; named signal-take-all in Arras et
    al. 2019, "Evaluating recurrent neural network explanations", BlackboxNLP workshop at ACL). The gate
    ``g`` is held constant, a weight on the signal ``x``: ``R(x_i) = x_i g_i / z_i · R_i = R_i`` (summed over
    broadcast positions, ``0/0 := 0`` where ``z`` vanishes), and the gate gets none.

    In CNNs this covers SiLU / Swish written as ``x · σ(x)`` (Elfwing et al. 2018, "Sigmoid-weighted linear
    units…", Neural Networks; Ramachandran et al. 2018, "Searching for activation functions", ICLR
    workshop) and squeeze-and-excitation, ``x · σ(conv(relu(conv(pool x))))`` (Hu et al. 2018, CVPR; with a
    hard sigmoid in MobileNetV3, Howard et al. 2019, ICCV). It is the choice the ``identity`` rule makes
    on a fused SiLU / HardSwish (the gate held constant, as AttnLRP does for SiLU and GELU, Achtibat et
    al. 2024, ICML), and equals Gradient×Input with the gate detached.
    ``gate`` is the input holding the gate; the other input must carry relevance.
    """

    gate: int = param(1, NON_NEGATIVE)
    held: ClassVar[str] = "gate"
    ops: ClassVar[tuple[str, ...]] = ("Mul",)

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        if why is None and not any(self.carries(node, spec, tainted)):
            return f"the signal (the input other than gate={self.gate}) must depend on the model's input"
        return why


@relevance_rule("ln")
class LayerNormRule(Rule):
    """LN rule (Ali et al. 2022, Sec. 4): hold ``α = 1/√(ε + Var[x])`` constant, so LayerNorm is
    the linear map ``αC`` (``C`` the centering matrix) and the z-rule gives
    ``R(x_i) = Σ_j x_i (δ_ij − 1/N) / Σ_i' x_i' (δ_i'j − 1/N) · R(y_j)``; the scale γ is an
    elementwise weight and the shift β absorbs its share.

    On a normalization op it holds the statistics the op declares (:class:`rulegraph.ops.Normalization`):
    LayerNorm's 1/σ over its trailing dims; an RMS norm's root mean square, with no centering;
    InstanceNorm's (GroupNorm exports as it) 1/σ over the spatial dims, with γ and β per channel. On a
    decomposed LayerNorm it applies to the ``Div`` by the standard deviation, holding the denominator
    constant.
    """

    ops: ClassVar[tuple[str, ...]] = (*declaring("normalization"), "Div")
    breaking: ClassVar[str] = "β absorbs"

    def carries(self, node, spec, tainted):
        return [bool(tainted[0])] + [False] * (len(tainted) - 1)

    def check(self, node, spec, tainted):
        why = super().check(node, spec, tainted)
        if why is None and spec.normalization is not None and any(tainted[1:]):
            return "its scale and shift must be constants"
        return why

    def propagate(self, site):
        norm = site.spec.normalization
        s = site.ratio(0)
        if norm is None:                # the Div of a decomposed LayerNorm: the denominator held
            return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), [s])
        x, scale = site.inputs[0], site.inputs[1]
        out: list[Contribution | None] = [None] * len(site.inputs)
        dims = norm.dims(x, site.attrs)
        factor = norm.factor(x, site.attrs)
        gs = s * norm.weight(scale, x)
        if norm.centred:
            gs.sub_(gs.mean(dim=dims, keepdim=True))
        out[0] = Contribution(signal=gs.mul_(factor))
        if site.audit and len(site.inputs) > 2 and site.inputs[2] is not None:
            out[2] = Contribution(signal=norm.bias_share(s, site.inputs[2], dims))
        return out
