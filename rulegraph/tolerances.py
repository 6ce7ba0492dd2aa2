"""Named tolerances: when a figure counts as conserved, and the floors of denominators."""
from __future__ import annotations

import torch

#: a conserving node (or the graph) whose relative error exceeds this is flagged, per dtype; the half
#: precisions' are about 3× the largest errors measured on tiny random Llama and GPT-2 checkpoints saved
#: in bfloat16 and float16, every shipped rule set (bfloat16: 1.4e-2, float16: 8.9e-3; see
#: ``benchmarks/results/dtype_precision.md`` and ``docs/precision.md``)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9, torch.bfloat16: 5e-2, torch.float16: 3e-2}
#: the smallest stabiliser ε a rule divides with, per dtype: float16's smallest normal number
#: (6.1e-5), since the default ε = 1e-6 is subnormal there (imprecise, and flushed to 0 where the
#: hardware flushes subnormals); bfloat16 has float32's exponent range, so ε = 1e-6 is normal in it
STABILISER_FLOOR = {torch.float16: torch.finfo(torch.float16).tiny}
#: the smallest denominator of a relative error (an explained value of exactly 0 stays finite)
TINY = 1e-30
#: the relevance pass measures a node's Σ|R| only when its error exceeds this share of the tolerance
MASS_SCREEN = 0.1


def tolerance(dtype: torch.dtype) -> float:
    """The conservation tolerance for a run in ``dtype``."""
    return TOLERANCE.get(dtype, TOLERANCE[torch.float32])


def stabiliser(epsilon: float, dtype: torch.dtype) -> float:
    """The ε a rule divides with in ``dtype``: its own, raised to :data:`STABILISER_FLOOR` (``0``, the
    z-rule's, stays 0)."""
    return max(epsilon, STABILISER_FLOOR.get(dtype, 0.0)) if epsilon else 0.0


def relative(gap: float, *scales: float) -> float:
    """``|gap|`` over the largest of ``|scales|`` (at least :data:`TINY`)."""
    return abs(gap) / max(max((abs(s) for s in scales), default=0.0), TINY)
