"""A batch of encoded texts as graph inputs, and an explanation's per-token scores."""
from __future__ import annotations

import torch

from ..errors import InputError
from .data import Example
from ..explanation import Explanation
from ..methods.sequences import batch
from ..passes.base import position_scores


def batch_feeds(graph, examples: list[Example], pad: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The examples' texts as one padded batch (:func:`rulegraph.methods.sequences.batch`)."""
    return batch(graph, [e.encoded for e in examples], pad)


def token_scores(explanation: Explanation, shape: torch.Size, method: str) -> torch.Tensor:
    """``[batch, tokens]`` float64 scores: the relevance of every boundary key that is per token
    (summed over hidden units where it is per unit), added up."""
    scores = None
    for r in explanation.relevance.values():
        r = position_scores(r) if r.dim() > 2 else r
        if r.shape == shape:
            scores = r.double() if scores is None else scores + r.double()
    if scores is None:
        raise InputError(f"method {method!r} gave no per-token scores")
    return scores
