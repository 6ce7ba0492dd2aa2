"""The two numerical conventions every LRP rule shares: the stabilised denominator and the
division that takes 0/0 as 0; and the name of a tensor's memory, by which the passes take a sum
once (:func:`layout`)."""
from __future__ import annotations

import torch

from ..tolerances import stabiliser

Tensor = torch.Tensor


def stabilize(z: Tensor, epsilon: float) -> Tensor:
    """``z + ε·sign z`` with sign 0 := +1, as Zennit's stabiliser (Bach et al. 2015, Eq. 58); ε is floored
    per dtype (:func:`rulegraph.tolerances.stabiliser`: float16's smallest normal number)."""
    epsilon = stabiliser(epsilon, z.dtype)
    return z + epsilon * (2 * (z >= 0).to(z.dtype) - 1) if epsilon else z


def divide(r: Tensor, z: Tensor) -> Tensor:
    """``r / z`` with 0/0 := 0 (LRP's convention where a denominator vanishes)."""
    return torch.where(z == 0, torch.zeros((), dtype=z.dtype, device=z.device), r / torch.where(z == 0, 1.0, z))


def layout(t: Tensor) -> tuple:
    """Where and how ``t``'s elements lie: equal for two tensors exactly when they read the same memory
    in the same order as the same dtype (a sum of one is the sum of the other, while both are alive)."""
    return (t.device, t.dtype, t.data_ptr(), tuple(t.shape), t.stride())
