"""The rule for a quantized graph's quantize–dequantize round trip (the ``quantization`` canonizer,
:mod:`rulegraph.canonize.quantization`): ``x̃ = x + δ``, the rounding ``δ`` held constant."""
from __future__ import annotations

from typing import ClassVar

import torch

from .base import Rule, relevance_rule
from .signal import Contribution


@relevance_rule("quantization")
class Quantization(Rule):
    """``x̃ = QuantizeDequantize(x, δ) = x + δ`` with the rounding ``δ`` a constant: ``R(x) = x ⊙ R(x̃) / x̃``
    and ``δ`` absorbs the rest, ``R(x̃) − R(x)`` — its share ``δ ⊙ R(x̃) / x̃`` where ``x̃ ≠ 0``, and all
    of ``R(x̃)`` where the rounding made ``x̃ = 0`` while ``x ≠ 0`` (there the z-rule's 0/0 := 0 would drop
    it; the quantization error, not ``x``, made that value). The audit books the absorbed amount as the
    quantization error. In signal form (``R(x̃) = x̃ ⊙ g``) this is Gradient×Input with ``δ`` detached,
    ``R(x) = x ⊙ g`` — the view of Jacob et al. 2018 (CVPR) that a quantized value is the real one
    plus a rounding error.
    """

    ops: ClassVar[tuple[str, ...]] = ("QuantizeDequantize",)
    breaking: ClassVar[str] = "the quantization error absorbs its share"

    def carries(self, node, spec, tainted):
        return [bool(tainted[0])] + [False] * (len(node.inputs) - 1)

    def propagate(self, site):
        arriving = site.incoming[0]
        if arriving is None:
            return [None] * len(site.inputs)
        x, error = site.inputs[0], site.inputs[1]
        if arriving.signal is not None:              # R(x̃) = x̃ ⊙ g: x gets x ⊙ g, δ absorbs δ ⊙ g
            absorbed = Contribution(signal=arriving.signal) if site.audit else None
            return [Contribution(signal=arriving.signal), absorbed]
        r = arriving.tensor
        y = site.outputs[0]
        share = torch.where(y == 0, torch.zeros((), dtype=y.dtype, device=y.device),
                            x / torch.where(y == 0, torch.ones((), dtype=y.dtype, device=y.device), y))
        kept = r * share
        if site.audit:
            site.absorbed.append(r - kept)
        return [Contribution(relevance=kept), None]
