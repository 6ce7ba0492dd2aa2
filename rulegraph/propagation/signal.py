"""What a relevance rule sees of one node, and what it hands back.

A relevance rule returns one :class:`Contribution` per input (``None`` = nothing), in
either form

* ``Contribution(signal=g)`` — the relevance is ``x ⊙ g`` for that input ``x``. Rules
  of the gradient family (GI, z, ε, AH, LN) produce this form; keeping the signal
  lets the next rule start from it instead of dividing relevance by activations,
  so GI with detached terms is reproduced to rounding;
* ``Contribution(relevance=r)`` — an explicit relevance tensor.

What a contribution hands to an input that carries no relevance (a bias, the other
summand, an ε) is *absorbed*; the audit records it.

Notation in the rules: a node computes ``z = f(x_1, …, x_n)``; ``R`` is the relevance at
``z``; ``s = R / z`` (or the incoming signal) is the rule's starting "gradient".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..ops import OpSpec, vjp
from .numerics import divide, stabilize

Tensor = torch.Tensor


@dataclass
class Contribution:
    """Relevance handed to one input: ``relevance`` explicitly, or ``x ⊙ signal``. ``moved``: all the relevance
    that arrived, each element moved to one place (a bijective routing op, :attr:`OpSpec.bijective
    <rulegraph.ops.OpSpec.bijective>`), so its sum is the arriving sum whatever order a reduction takes: the
    audit reads that sum rather than taking it again."""

    signal: Tensor | None = None
    relevance: Tensor | None = None
    moved: bool = False

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

    def drop(self) -> Tensor | None:
        """Forget the relevance (the walk is done with it) and return its tensor, the signal or the sum."""
        held = self.signal if self.signal is not None else self.explicit
        self.signal = self.explicit = None
        return held

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
    recycler: Any = None           # the explanation's Recycler (rulegraph.lifetimes), for the VJPs' large outputs

    def vjp(self, grads: list[Tensor | None], wants: list[bool]) -> list[Tensor | None]:
        return vjp(self.spec, grads, self.inputs, self.outputs, wants, self.attrs, self.recycler)

    def ratio(self, k: int, stabilizer: float = 0.0) -> Tensor | None:
        """``s = R / (z + ε·sign z)`` at output ``k``, starting from the signal where there is one.

        With ε = 0 this is ``R / z``, taken as 0 where ``z`` is 0 (LRP's 0/0 := 0).
        """
        inc = self.incoming[k]
        if inc is None:
            return None
        z = self.outputs[k]
        if stabilizer:
            denominator = stabilize(z, stabilizer)
            if inc.signal is not None:
                s = inc.signal * z / denominator
            else:
                s = inc.explicit / denominator
            if self.audit:
                self.absorbed.append(s * (denominator - z))
            return s
        if inc.signal is not None:
            return inc.signal
        return divide(inc.explicit, z)
