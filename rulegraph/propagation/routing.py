"""Rules that move relevance without weighing it: ``route``, ``identity`` and ``stop``."""
from __future__ import annotations

from typing import ClassVar

import torch

from ..errors import RuleMatchError
from .base import RULES, Rule, relevance_rule
from .signal import Contribution

Tensor = torch.Tensor


@relevance_rule("route")
class Route(Rule):
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
        moved = site.spec.bijective         # every element to one place: the sum handed on is the sum that arrived
        if all(inc is None or inc.signal is not None for inc in site.incoming):
            grads = site.vjp([inc.signal if inc else None for inc in site.incoming], wants)
            return [Contribution(signal=g, moved=moved) if g is not None else None for g in grads]
        grads = site.vjp([inc.tensor if inc else None for inc in site.incoming], wants)
        return [Contribution(relevance=g, moved=moved) if g is not None else None for g in grads]


@relevance_rule("identity")
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


@relevance_rule("stop")
class Stop(Rule):
    """``R_in = 0``: relevance ends here. Whatever arrives is booked as a break."""

    conserving: ClassVar[bool] = False
    breaking: ClassVar[str] = "breaks by design: drops all relevance arriving"

    def carries(self, node, spec, tainted):
        return [False] * len(tainted)

    def propagate(self, site):
        return [None] * len(site.inputs)


#: renamed, since "pass" names the relevance and decomposition passes (a rule file's ``pass:``)
RULES["relevance"].rename("pass", "route")
