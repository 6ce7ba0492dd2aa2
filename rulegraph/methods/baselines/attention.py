"""``attention``: the raw attention row of the explained position, and the attention probabilities
(the Softmax outputs feeding the probabilities × values product, :mod:`rulegraph.heads`), which
``rollout``, ``lat`` and ``gae`` read too."""
from __future__ import annotations

import torch

from ...errors import InputError
from ...explanation import Explanation
from ...heads import attention_nodes
from ...ir import Graph
from ..base import Option, Request, baseline
from ..sequences import token_input
from .common import explanation, forward

Tensor = torch.Tensor


def attention_values(graph: Graph) -> list[str]:
    """The attention probabilities (Softmax outputs feeding the probabilities × values product), in
    block order, as :func:`rulegraph.heads.attention_nodes` finds them."""
    if graph.cache.attention is None:
        found = list(dict.fromkeys(softmax.outputs[0] for softmax, _ in attention_nodes(graph)))
        if not found:
            raise InputError("no attention found: no MatMul fed by a Softmax (through Where, Cast, Dropout, Identity)")
        graph.cache.attention = found
    return graph.cache.attention


def query_rows(req: Request, row: int, batch: int, length: int, position: int | list[int] | None = None) -> list[int]:
    """The query position per item: for an output with positions (a causal LM), the explained
    ``position``; else ``row``, or for ``row < 0`` counted back from the last real token."""
    if position is not None:
        return list(position) if isinstance(position, list) else [position] * batch
    if row >= 0:
        if row >= length:
            raise InputError(f"attention row {row} is outside the {length} positions")
        return [row] * batch
    mask = req.inputs.get("attention_mask")
    lengths = [int(m.sum()) for m in mask] if mask is not None else [length] * batch
    return [n + row for n in lengths]


def attention_probabilities(req: Request) -> tuple[list[Tensor], Tensor, list[int], int | None]:
    values = attention_values(req.graph)
    env, out, targets, position = forward(req, frozenset(values))
    probs = [env[v].to(torch.float64) for v in values]
    for p in probs:
        if p.dim() != 4:
            raise InputError(f"attention probabilities of shape {tuple(p.shape)}; expected [batch, heads, q, k]")
    return probs, out, targets, position


def one_sequence(maps: list[Tensor], method: str) -> None:
    """``method`` multiplies every block's attention map: each must be [batch, heads, n, n] over the same
    n tokens. An encoder–decoder's are not (self-attention over the source and over the target, and
    cross-attention between them), so it is refused here, naming what explains such a model."""
    shapes = sorted({tuple(m.shape[-2:]) for m in maps})
    if len(shapes) > 1 or any(q != k for q, k in shapes):
        raise InputError(f"{method} multiplies the attention maps of every block over one token sequence; this "
                         f"model's maps are {' and '.join(f'{q}×{k}' for q, k in shapes)} (self- and cross-attention "
                         "of an encoder–decoder): explain it with a rule set (attnlrp) or with ig, gi or attention")


@baseline("attention", "raw attention: the head-averaged attention row of the explained position in one "
          "block (default the last)",
          Option("block", int, -1, "which attention block (0-based; negative counts from the last)"),
          Option("row", int, 0, "query position read: 0 = [CLS] (BERT-style classifiers); negative counts back "
                 "from the last real token (−1 for decoder classifiers); a causal LM reads its explained position"),
          unit="attention weight (heads averaged)", reference=True)
def raw_attention(req: Request, block: int, row: int) -> Explanation:
    probs, out, targets, position = attention_probabilities(req)
    if not -len(probs) <= block < len(probs):
        raise InputError(f"attention block {block} does not exist; the model has {len(probs)} (0…{len(probs) - 1})")
    a = probs[block].mean(1)
    rows = query_rows(req, row, a.shape[0], a.shape[1], position)
    scores = torch.stack([a[b, r] for b, r in enumerate(rows)]).cpu()
    key = token_input(req.graph)
    return explanation(req, out, targets, position, {key: scores}, block=block % len(probs))
