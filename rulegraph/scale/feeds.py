"""A batch of encoded texts as graph inputs, and an explanation's per-token scores."""
from __future__ import annotations

import torch

from ..errors import InputError
from .data import Example
from ..explanation import Explanation
from ..methods.sequences import token_input
from ..passes.base import position_scores


def batch_feeds(graph, examples: list[Example], pad: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The graph's inputs for ``examples`` padded to the longest with ``pad`` (``input_ids``, and
    ``attention_mask`` / ``token_type_ids`` where the graph has them), and the ``[batch, tokens]``
    mask of positions never perturbed (special tokens and padding)."""
    width = max(e.length for e in examples)
    names = [i.name for i in graph.inputs]
    ids = torch.full((len(examples), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(examples), width), dtype=torch.int64)
    types = torch.zeros((len(examples), width), dtype=torch.int64)
    special = torch.ones((len(examples), width), dtype=torch.bool)
    for b, e in enumerate(examples):
        n = e.length
        ids[b, :n] = e.encoded.inputs["input_ids"][0]
        mask[b, :n] = 1
        types[b, :n] = e.encoded.inputs["token_type_ids"][0]
        special[b, :n] = torch.tensor(e.encoded.special)
    feeds = {token_input(graph): ids}
    if "attention_mask" in names:
        feeds["attention_mask"] = mask
    if "token_type_ids" in names:
        feeds["token_type_ids"] = types
    return feeds, special


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
