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
from .ops.nn import layer_norm_stats, norm_dims

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

RULES: dict[str, type["Rule"]] = {}


def rule(name: str):
    """Register a rule class under ``name`` (the name rule files use)."""
    def register(cls):
        if name in RULES:
            raise RuntimeError(f"rule {name!r} is registered twice")
        cls.name = name
        RULES[name] = dataclass(cls)
        return RULES[name]
    return register


class Rule:
    """Base class. Subclasses set ``conserving`` and implement :meth:`propagate`."""

    name: ClassVar[str] = ""
    #: conserves relevance on every node it applies to (``False``: see :meth:`conserves`)
    conserving: ClassVar[bool] = True
    #: op types the rule can apply to (``None``: any)
    ops: ClassVar[tuple[str, ...] | None] = None

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


@rule("gradient")
class Gradient(Rule):
    """Gradient×Input in its LRP form (seeds/002, Sec. 3, Eq. 4): ``R_i = x_i ⊙ ∂z/∂x_i · s``.

    ``detach`` lists inputs held constant, as ``.detach()`` does in the forward — the
    paper's implementation trick (seeds/002, Sec. 4): detaching the attention
    probabilities gives the AH rule, detaching LayerNorm's std the LN rule. The rule
    conserves exactly on ops affine in the inputs it propagates to (linear layers,
    sums, routing); elsewhere (GELU, softmax, products of two activations) the
    audit books the difference as a break.
    """

    detach: list[int] = field(default_factory=list)
    conserving: ClassVar[bool] = False

    def carries(self, node, spec, tainted):
        return [t and i not in self.detach for i, t in enumerate(tainted)]

    def conserves(self, node, spec, tainted):
        carried = self.carries(node, spec, tainted)
        return any(carried) and spec.affine(carried)

    def propagate(self, site):
        seeds = [site.ratio(k) for k in range(len(site.outputs))]
        return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), seeds)


@rule("epsilon")
class Epsilon(Rule):
    """LRP-ε (Bach et al. 2015; DESIGN.md): ``R_i = x_i ⊙ ∂z/∂x_i · R / (z + ε·sign z)``.

    The share ``R·ε·sign z / (z + ε·sign z)`` is absorbed by the stabiliser; biases
    absorb theirs. With ``epsilon: 0`` this is LRP-0 (the z-rule).
    """

    epsilon: float = 1e-6
    detach: list[int] = field(default_factory=list)
    conserving: ClassVar[bool] = False

    def carries(self, node, spec, tainted):
        return [t and i not in self.detach for i, t in enumerate(tainted)]

    def conserves(self, node, spec, tainted):
        carried = self.carries(node, spec, tainted)
        return any(carried) and spec.affine(carried)

    def propagate(self, site):
        seeds = [site.ratio(k, self.epsilon) for k in range(len(site.outputs))]
        return _gradient_contributions(site, self.carries(site.node, site.spec, site.tainted), seeds)


@rule("zero")
class Zero(Epsilon):
    """LRP-0, the z-rule (DESIGN.md): ``R_i = Σ_j x_i w_ij / z_j · R_j`` — ε-rule with ε = 0."""

    epsilon: float = 0.0


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
            _, rstd = layer_norm_stats(x, axis, eps)
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

    def carries(self, node, spec, tainted):
        return [False] * len(tainted)

    def propagate(self, site):
        return [None] * len(site.inputs)
