"""``lat``: layerwise attention tracing (Wu & Ong 2021, "On Explaining Your Explanations of BERT:
An Empirical Study with Sequence Classification", arXiv preprint, Sec. 2.4, Eq. 10).

Unit relevance at the explained position is redistributed from the last block to the first
through the self-attention weights only (residual connections, value vectors and FFNs are
ignored): R^{i←j} = Σ_h A^(h)_{ji} R^{j(h)}. Eq. 10 sums over heads the relevance R^{j(h)}
each head h carries of R^j; for the conservation the paper states, each head carries an equal
share, R^{j(h)} = R^j / H, so a block's step is the head-averaged matrix: R_{l−1} = Ā_lᵀ R_l with
Ā_l = mean_h A_l^(h) (per head then summed with weight 1/H is the same by linearity; heads do
not continue from block to block). The scores sum to 1 after every block, since every row of
Ā_l sums to 1; ``extra["block_sums"]`` holds those sums (block L−1 first).
"""
from __future__ import annotations

import torch

from ...explanation import Explanation
from ..base import Option, Request, baseline
from ..sequences import token_input
from .attention import attention_probabilities, one_sequence, query_rows
from .common import explanation

Tensor = torch.Tensor


def trace(probs: list[Tensor], rows: list[int]) -> tuple[Tensor, list[list[float]]]:
    """R = e_rowᵀ Ā_L ⋯ Ā_1 per item, and Σ_i R_i after each block (from the last block down)."""
    batch, length = probs[0].shape[0], probs[0].shape[-1]
    r = torch.zeros(batch, length, dtype=probs[0].dtype, device=probs[0].device)
    r[torch.arange(batch), torch.tensor(rows)] = 1.0
    sums = []
    for p in reversed(probs):
        r = torch.einsum("bj,bji->bi", r, p.mean(1))
        sums.append(r.sum(-1).tolist())
    return r, sums


@baseline("lat", "layerwise attention tracing (Wu & Ong 2021, Sec. 2.4, Eq. 10): unit relevance at the explained "
          "position redistributed from the last block to the first through the head-averaged attention weights "
          "only; conserving (sums to 1 at every block)",
          Option("row", int, 0, "query position traced: 0 = [CLS] (BERT-style classifiers); negative counts back "
                 "from the last real token (−1 for decoder classifiers)"),
          unit="attention share (sums to 1)", reference=True)
def layerwise_attention_tracing(req: Request, row: int) -> Explanation:
    probs, out, targets, position = attention_probabilities(req)
    one_sequence(probs, "lat")
    rows = query_rows(req, row, probs[0].shape[0], probs[0].shape[-1], position)
    r, sums = trace(probs, rows)
    return explanation(req, out, targets, position, {token_input(req.graph): r.cpu()},
                       rows=rows, block_sums=[list(s) for s in zip(*sums)])
