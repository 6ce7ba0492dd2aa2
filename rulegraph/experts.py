"""Mixture-of-experts blocks in an exported graph, and the relevance each expert receives.

An MoE block exported by rulegraph's exporters (``exporters/moe.py``) weights every expert's output
``[experts, tokens, hidden]`` by the router's top-k weights, scattered into a dense matrix that is
zero where an expert was not picked, in one ``Mul`` (:data:`ROUTING` finds its weights; rule files name it ``moe-routing``), then sums
over the experts. The relevance arriving at that product, summed over tokens and hidden units, is
what each expert received; the audit lists it per block (:class:`ExpertAudit`) with the number of
token positions that picked the expert. Under the rule sets that hold the routing weights constant
(the AH view), an expert no token picked receives exactly none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .ir import Graph
from .patterns import Pattern, named

#: the routing weights: a ScatterElements' output (the dense [tokens, experts] matrix), moved by routing ops
ROUTING = named("moe-routing", Pattern(("ScatterElements",), ("routing",)))


@dataclass(frozen=True)
class ExpertBlock:
    """One MoE block: the ``Mul`` weighting the experts' outputs, its output and its weights' values."""

    layer: str          # the audit's layer (``block i``)
    node: str
    output: str         # [experts, tokens, hidden]
    weights: str        # [experts, tokens, 1]


@dataclass
class ExpertAudit:
    """Relevance per expert in one MoE block (the batch summed)."""

    layer: str
    node: str
    relevance: list[float]      # Σ relevance at each expert's weighted output
    tokens: list[int]           # how many token positions picked each expert

    @property
    def unpicked(self) -> list[int]:
        """The experts no token picked."""
        return [e for e, n in enumerate(self.tokens) if n == 0]


def find_experts(graph: Graph) -> list[ExpertBlock]:
    """The MoE blocks of ``graph`` in graph order (none for a dense model)."""
    return [ExpertBlock(graph.layers[n.name], n.name, n.outputs[0], n.inputs[1]) for n in graph.nodes
            if n.op == "Mul" and len(n.inputs) == 2 and ROUTING.matches(graph, n.inputs[1])]


def expert_audits(blocks: list[ExpertBlock], relevance: dict[str, torch.Tensor],
                  values: dict[str, torch.Tensor]) -> list[ExpertAudit]:
    """Per block, the relevance that arrived at each expert's weighted output (``relevance``: the walk's
    recorded tensors) and how many positions picked each expert (its weight is non-zero)."""
    out = []
    for b in blocks:
        weights = values[b.weights]
        experts = weights.shape[0]
        r = relevance.get(b.output)
        per_expert = [0.0] * experts if r is None else r.double().reshape(experts, -1).sum(1).tolist()
        picked = (weights != 0).reshape(experts, -1).sum(1).tolist()
        out.append(ExpertAudit(b.layer, b.node, per_expert, [int(k) for k in picked]))
    return out
