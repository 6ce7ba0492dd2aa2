"""``attention``: the raw attention row of the explained position, and how the attention
probabilities are found (the Softmax outputs feeding the attention MatMul, with the ``ah``
pattern of ``rulesets/lrp-ah.yaml``), which ``rollout`` reads too."""
from __future__ import annotations

import torch

from ...errors import InputError
from ...explanation import Explanation
from ...ir import Graph
from ...ruleset import Pattern, RuleSet
from ..base import Option, Request, baseline
from ..sequences import token_input
from .common import explanation, forward

Tensor = torch.Tensor
_ATTENTION_THROUGH = ("Where", "Cast", "Dropout", "Identity")


def attention_values(graph: Graph) -> list[str]:
    """The attention probabilities (Softmax outputs feeding an attention MatMul), in block order.

    Found with the pattern of the ``ah`` entry of ``rulesets/lrp-ah.yaml`` (probabilities ×
    values: a MatMul whose input 0 comes from a Softmax, possibly through Where/Cast/Dropout).
    """
    if graph.cache.attention is not None:
        return graph.cache.attention
    rules = RuleSet.load("lrp-ah")
    entries = [e for e in rules.entries if e.rule.name == "ah" and e.inputs]
    found: list[str] = []
    for node in graph.nodes:
        entry = next((e for e in entries if e.matches(graph, node)), None)
        if entry is None:
            continue
        k, pattern = next(iter(entry.inputs.items()))
        value = _trace(graph, node.inputs[k], pattern)
        if value is not None and value not in found:
            found.append(value)
    if not found:
        raise InputError("no attention found: no MatMul fed by a Softmax (the `ah` pattern of rulesets/lrp-ah.yaml)")
    graph.cache.attention = found
    return found


def _trace(graph: Graph, value: str, pattern: Pattern) -> str | None:
    """The output of the producer ``pattern`` matched, walking back through its ``through`` ops."""
    for _ in range(64):
        producer = graph.producer.get(value)
        if producer is None:
            return None
        if producer.op in pattern.sources:
            return producer.outputs[0]
        if producer.op not in (pattern.through or _ATTENTION_THROUGH):
            return None
        candidates = producer.inputs[1:] if producer.op == "Where" else producer.inputs
        value = next((v for v in candidates if v and v not in graph.constant_values), None)
        if value is None:
            return None
    return None


def query_rows(req: Request, row: int, batch: int, length: int) -> list[int]:
    """The query position per item: ``row``, or for ``row < 0`` counted back from the last real token."""
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


@baseline("attention", "raw attention: the head-averaged attention row of the explained position in one "
          "block (default the last)",
          Option("block", int, -1, "which attention block (0-based; negative counts from the last)"),
          Option("row", int, 0, "query position read: 0 = [CLS] (BERT-style classifiers); negative counts back "
                 "from the last real token (−1 for decoder classifiers)"),
          score="attention weight (heads averaged)", reference=True)
def raw_attention(req: Request, block: int, row: int) -> Explanation:
    probs, out, targets, position = attention_probabilities(req)
    if not -len(probs) <= block < len(probs):
        raise InputError(f"attention block {block} does not exist; the model has {len(probs)} (0…{len(probs) - 1})")
    a = probs[block].mean(1)
    rows = query_rows(req, row, a.shape[0], a.shape[1])
    scores = torch.stack([a[b, r] for b, r in enumerate(rows)]).cpu()
    key = token_input(req.graph)
    return explanation(req, out, targets, position, {key: scores}, block=block % len(probs))
