"""Named tolerances: when a figure counts as conserved, and the floors of denominators."""
from __future__ import annotations

import torch

#: a conserving node (or the graph) whose relative error exceeds this is flagged, per dtype
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}
#: the smallest denominator of a relative error (an explained value of exactly 0 stays finite)
TINY = 1e-30
#: the relevance pass measures a node's Σ|R| only when its error exceeds this share of the tolerance
MASS_SCREEN = 0.1


def tolerance(dtype: torch.dtype) -> float:
    """The conservation tolerance for a run in ``dtype``."""
    return TOLERANCE.get(dtype, TOLERANCE[torch.float32])


def relative(gap: float, *scales: float) -> float:
    """``|gap|`` over the largest of ``|scales|`` (at least :data:`TINY`)."""
    return abs(gap) / max(max((abs(s) for s in scales), default=0.0), TINY)
