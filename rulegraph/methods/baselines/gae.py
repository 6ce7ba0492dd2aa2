"""``gae``: generic attention-model explainability (Chefer, Gur & Wolf 2021, "Generic
Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers",
ICCV, Eqs. 5–6, the self-attention rule).

Per block, Ē = E_h[(∇A ⊙ A)⁺] (Eq. 5) with ∇A = ∂y_t/∂A the gradient of the explained logit
with respect to the block's attention probabilities; from R = I, R ← R + Ē·R block by block
from the first to the last (Eq. 6); the scores are R's row of the explained position. That row
keeps the identity's 1 at the explained position itself, as Eq. 6 gives it.

∇A is the total derivative (every path from A to the logit, including through later blocks'
softmaxes): ∇A ⊙ A is the ``gi`` relevance pass's relevance at the Softmax outputs once all
their consumers have handed theirs (:func:`~.common.gradient_times_value`), the same quantity
the authors' code forms from a hook on the attention probabilities in the unmodified model.
"""
from __future__ import annotations

import torch

from ...errors import InputError
from ...explanation import Explanation
from ..base import Option, Request, baseline
from ..sequences import token_input
from .attention import attention_values, one_sequence, query_rows
from .common import explanation, gradient_times_value

Tensor = torch.Tensor


def relevance_map(weighted: list[Tensor]) -> Tensor:
    """R = (I + Ē_L) ⋯ (I + Ē_1), Ē_l = mean_h (∇A_l ⊙ A_l)⁺ from ``weighted`` = [∇A_l ⊙ A_l]: [batch, q, k]."""
    result = None
    for ga in weighted:
        e = ga.clamp(min=0).mean(1)
        if result is None:
            result = torch.eye(e.shape[-1], dtype=e.dtype, device=e.device).expand_as(e).clone()
        result = result + e @ result
    return result


@baseline("gae", "generic attention-model explainability (Chefer, Gur & Wolf 2021, ICCV, Eqs. 5–6): per block "
          "Ē = mean over heads of (∂y/∂A ⊙ A)⁺, R ← R + Ē·R from R = I through the blocks; the row of the "
          "explained position (its own entry keeps the identity's 1)",
          Option("row", int, 0, "query position read: 0 = [CLS] (BERT-style classifiers); negative counts back "
                 "from the last real token (−1 for decoder classifiers)"),
          unit="gradient-weighted attention relevance (Chefer Eq. 6)")
def generic_attention_explainability(req: Request, row: int) -> Explanation:
    values = attention_values(req.graph)
    weighted, env, out, targets, position = gradient_times_value(req, values)
    for v in values:
        if env[v].dim() != 4:
            raise InputError(f"attention probabilities of shape {tuple(env[v].shape)}; expected [batch, heads, q, k]")
    one_sequence([env[v] for v in values], "gae")
    r = relevance_map([weighted[v].to(torch.float64) for v in values])
    rows = query_rows(req, row, r.shape[0], r.shape[1], position)
    scores = torch.stack([r[b, q] for b, q in enumerate(rows)]).cpu()
    return explanation(req, out, targets, position, {token_input(req.graph): scores}, rows=rows)
