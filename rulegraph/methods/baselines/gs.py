"""``gs``: gradient sensitivity, the L2 norm of ∂f/∂x per token."""
from __future__ import annotations

from ...explanation import Explanation
from ..base import Request, baseline
from ..sequences import token_input
from .common import by_key, explanation, forward, gradients


@baseline("gs", "gradient sensitivity: the L2 norm over the hidden dimension of ∂f/∂x at the embeddings "
          "(Li et al. 2016; Wu & Ong 2021 Eq. 1); unsigned",
          unit="gradient norm ‖∂f/∂x‖₂")
def gradient_sensitivity(req: Request) -> Explanation:
    _, out, targets, position = forward(req, frozenset())
    grads, _, out, mapping = gradients(req, req.inputs, targets)
    grads = by_key(mapping, grads)
    key = token_input(req.graph)    # only the token embeddings: ∂f/∂x is the same for every summand of x
    grads = {key: grads[key]} if key in grads else grads
    relevance = {k: (g.norm(dim=-1) if g.dim() == 3 else g.abs()).detach().cpu() for k, g in grads.items()}
    return explanation(req, out, targets, position, grads, relevance)
