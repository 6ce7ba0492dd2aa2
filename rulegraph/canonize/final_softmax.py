"""The explained value made explicit: one value of the graph as its only output, and a final Softmax
or LogSoftmax explained as its logits.

A classifier exported for deployment often ends in ``Softmax`` (or ``LogSoftmax``): its output is a
probability, which is not linear in the logits and is flat where the model is confident, so LRP's
rules book most of a confident prediction as a break at that node. Zennit's and LXT's users explain
the logits before it by hand (Anders et al. 2021, arXiv:2106.13200; Achtibat et al. 2024, ICML):
:func:`final_softmax` does it on the graph, and :func:`only` makes any value of the graph (the logits
before a final Softmax, a hidden state) the one output, with the nodes it does not need dropped.
"""
from __future__ import annotations

import torch

from ..ir import Graph, Node
from .base import canonizer

#: the ops a graph output may end in that the explanation moves before by default
FINAL = ("Softmax", "LogSoftmax")


def final_node(graph: Graph, output: str) -> Node | None:
    """The Softmax or LogSoftmax that produces ``output``, if one does."""
    node = graph.producer.get(output)
    return node if node is not None and node.op in FINAL and node.domain in ("", "ai.onnx") else None


@canonizer("final-softmax")
def final_softmax(graph: Graph) -> Graph:
    """Canonizer: every graph output a Softmax or LogSoftmax produces replaced by that node's input,
    the logits (nodes no output needs any more dropped)."""
    outputs = [n.inputs[0] if (n := final_node(graph, o)) is not None else o for o in graph.outputs]
    return graph if outputs == graph.outputs else _pruned(graph, list(dict.fromkeys(outputs)))


def only(graph: Graph, output: str) -> Graph:
    """``graph`` with ``output`` (any value it computes) as its only output, and only the nodes it needs."""
    if graph.outputs == [output]:
        return graph
    key = ("only", output)
    cache = graph.cache.canonized
    if key not in cache:
        cache[key] = _pruned(graph, [output])
    return cache[key]


def with_batch_axis(graph: Graph, output: str) -> Graph:
    """``graph`` (whose only output is ``output``) with a leading batch axis of 1 added to ``output`` by an
    Unsqueeze: the value it computed is renamed ``output::item``, so the output keeps its name."""
    key = ("batch", output)
    cache = graph.cache.canonized
    if key not in cache:
        item, axes = f"{output}::item", f"{output}::axes"
        rename = {output: item}
        nodes = [Node(n.name, n.op, tuple(rename.get(v, v) for v in n.inputs), tuple(rename.get(v, v) for v in n.outputs),
                      dict(n.attrs), n.domain, n.scope) for n in graph.nodes]
        constants = dict(graph.constants)
        if graph.opset >= 13:               # the axes an input since opset 13, an attribute before
            nodes.append(Node(f"{output}::batch", "Unsqueeze", (item, axes), (output,)))
            constants[axes] = torch.tensor([0], dtype=torch.int64)
        else:
            nodes.append(Node(f"{output}::batch", "Unsqueeze", (item,), (output,), {"axes": [0]}))
        cache[key] = Graph(nodes, graph.inputs, [output], constants, opset=graph.opset, name=graph.name,
                           metadata=graph.metadata, source=graph.source)
    return cache[key]


def _pruned(graph: Graph, outputs: list[str]) -> Graph:
    needed, kept = set(outputs), []
    for node in reversed(graph.nodes):
        if any(v in needed for v in node.outputs if v):
            kept.append(node)
            needed.update(v for v in node.inputs if v)
    nodes = [Node(n.name, n.op, n.inputs, n.outputs, dict(n.attrs), n.domain, n.scope) for n in reversed(kept)]
    constants = {k: v for k, v in graph.constants.items() if k in needed}
    return Graph(nodes, graph.inputs, outputs, constants, opset=graph.opset, name=graph.name,
                 metadata=graph.metadata, source=graph.source)
