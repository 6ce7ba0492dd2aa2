"""``rollout``: attention rollout (Abnar & Zuidema 2020)."""
from __future__ import annotations

import torch

from ...explanation import Explanation
from ..base import Option, Request, baseline
from ..sequences import token_input
from .attention import attention_probabilities, one_sequence, query_rows
from .common import explanation

Tensor = torch.Tensor


def rollout_matrix(probs: list[Tensor], residual: float = 0.5) -> Tensor:
    """Abnar & Zuidema (2020): Â_l = (1 − r)·mean_h A_l + r·I, rows normalised, R = Â_L ⋯ Â_1."""
    result = None
    for p in probs:
        a = p.mean(1)
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = (1 - residual) * a + residual * eye
        a = a / a.sum(-1, keepdim=True)
        result = a if result is None else a @ result
    return result


@baseline("rollout", "attention rollout (Abnar & Zuidema 2020): 0.5·A + 0.5·I per block (heads averaged, rows "
          "normalised), multiplied through the blocks; the row of the explained position",
          Option("row", int, 0, "query position read (as for attention)"),
          Option("residual", float, 0.5, "weight of the identity (the residual connection)"),
          unit="attention weight (rolled out)", reference=True)
def attention_rollout(req: Request, row: int, residual: float) -> Explanation:
    probs, out, targets, position = attention_probabilities(req)
    one_sequence(probs, "rollout")
    r = rollout_matrix(probs, residual)
    rows = query_rows(req, row, r.shape[0], r.shape[1], position)
    scores = torch.stack([r[b, q] for b, q in enumerate(rows)]).cpu()
    return explanation(req, out, targets, position, {token_input(req.graph): scores})
