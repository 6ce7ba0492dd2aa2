"""AttnLRP (Achtibat et al. 2024, "AttnLRP: attention-aware layer-wise relevance propagation for
transformers", ICML): the softmax rule and the uniform rule for products of activations."""
from __future__ import annotations

from typing import ClassVar

import torch

from ..ops import declaring
from ..ops.nn import _softmax_axis
from .base import NON_NEGATIVE, Rule, param, relevance_rule
from .gradient import _gradient_contributions
from .signal import Contribution


@relevance_rule("softmax")
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
        axis, coerce_2d = site.attrs["axis"], site.attrs.get("coerce_2d", 0)
        x, ax, shape = _softmax_axis(site.inputs[0], axis, coerce_2d)
        s, _, _ = _softmax_axis(site.outputs[0], axis, coerce_2d)
        r, _, _ = _softmax_axis(site.incoming[0].tensor, axis, coerce_2d)
        inner = r - s * r.sum(dim=ax, keepdim=True)
        rel = torch.where(inner == 0, torch.zeros((), dtype=x.dtype, device=x.device), x * inner)
        return [Contribution(relevance=rel if shape is None else rel.reshape(shape))]


@relevance_rule("uniform")
class Uniform(Rule):
    """AttnLRP uniform rule for a product of activations (Achtibat et al. 2024, Eq. 7): the
    ε-rule, then an equal split between the ``n`` relevance-carrying factors, ``R_i = x_i ⊙ ∂z/∂x_i · R / (n (z + ε·sign z))`` — for ``A·B`` both halves get ``R/2`` of
    the z-rule's share. With one carried factor it is the ε-rule.
    """

    epsilon: float = param(0.0, NON_NEGATIVE)
    ops: ClassVar[tuple[str, ...]] = declaring("product", "contraction", "elementwise")
    breaking: ClassVar[str] = "ε absorbs"

    def propagate(self, site):
        n = sum(map(bool, site.tainted))
        s = site.ratio(0, self.epsilon)
        if n == 1 or s is None:
            return _gradient_contributions(site, list(site.tainted), [s])
        if n & (n - 1) or s.numel() <= sum(x.numel() for x, t in zip(site.inputs, site.tainted) if t):
            return _gradient_contributions(site, list(site.tainted), [s / n])
        # the split after the VJP, on the smaller side (Q and K, not their L × L scores): dividing by a
        # power of two is exact, so the signals have the same bits either way
        return [c if c is None or c.signal is None else Contribution(signal=c.signal / n)
                for c in _gradient_contributions(site, list(site.tainted), [s])]
