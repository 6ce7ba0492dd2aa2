"""A language model's vocabulary projection computed only at the positions an explanation reads.

A causal LM's output is ``[batch, positions, vocabulary]``, yet an explanation reads one position (or a
continuation's few, or a span's): at 1,024 tokens on GPT-2 small the head's product is about a quarter of
the forward's multiply-adds, and its logits (and the seed laid over them) 200 MB in float32.
:func:`head_rows` gives the graph a ``Gather`` of those positions just before the head, so the head and
what follows it (a bias, Gemma's soft-capping) run on those rows only. The ``Gather`` is a routing node
like any other: the rules pass relevance through it unchanged (it scatters back to the positions it
read), so conservation and every other node's arithmetic are untouched. The logits at the positions computed
equal the whole head's up to the rounding of a product over fewer rows (one row takes a matrix–vector
kernel: float64 within 1e-15 relative on the tests' models).

The head is found on the graph alone: the output made by a ``MatMul`` of a ``[batch, positions, hidden]``
activation with a matrix fixed by the weights, followed by nothing but pointwise ops whose other inputs
are fixed vectors or scalars. Anything else (a head behind a reshape, a ``Gemm`` on flattened rows) keeps
the whole head.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from ..ir import Graph, Node
from ..ops.spec import find

#: the row sets a graph keeps rewritten (a continuation's positions, a span's): the least recently used go
KEPT = 8
#: the Gather's name ends in this (the audit lists it as the node that read those positions)
SUFFIX = "::rows"


def head(graph: Graph, output: str) -> Node | None:
    """The MatMul that projects ``output``'s hidden states onto the vocabulary (see the module docstring),
    or ``None`` where the graph does not show one this way."""
    fixed = graph.constant_values
    value = output
    for _ in range(8):                      # a bias, a cast, soft-capping's Div · Tanh · Mul
        node = graph.producer.get(value)
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op == "MatMul":
            return node if node.inputs[0] not in fixed and node.inputs[1] in fixed and \
                _rank(graph, node.inputs[1]) in (2, None) else None
        spec = find(node.op)
        moving = [v for v in node.inputs if v and v not in fixed]
        if spec is None or not spec.pointwise or len(moving) != 1 or \
                any(_rank(graph, v) not in (0, 1) for v in node.inputs if v and v != moving[0]):
            return None
        value = moving[0]
    return None


def head_rows(graph: Graph, output: str, rows: Sequence[int]) -> Graph | None:
    """``graph`` (whose only output is ``output``, ``[batch, positions, vocabulary]``) computing its
    head at the positions ``rows`` only (in that order; negative counts from the end): the output is then
    ``[batch, len(rows), vocabulary]``. ``None`` where :func:`head` finds no head. Kept per row set
    (:data:`KEPT`)."""
    node = head(graph, output)
    if node is None:
        return None
    key = (output, tuple(rows))
    cache = graph.cache.canonized.setdefault("rows", OrderedDict())     # its own, least recently used last
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    hidden = node.inputs[0]
    picked, index = f"{hidden}{SUFFIX}", f"{node.name}{SUFFIX}::positions"
    nodes = [Node(n.name, n.op, tuple(picked if n is node and k == 0 else v for k, v in enumerate(n.inputs)),
                  n.outputs, dict(n.attrs), n.domain, n.scope) for n in graph.nodes]
    # the positions axis is the hidden states' second to last, with a batch axis before it or without one
    nodes.append(Node(f"{node.name}{SUFFIX}", "Gather", (hidden, index), (picked,), {"axis": -2}, "", node.scope))
    constants = {**graph.constants, index: torch.tensor(list(rows), dtype=torch.int64)}
    cache[key] = Graph(nodes, graph.inputs, list(graph.outputs), constants, opset=graph.opset, name=graph.name,
                       metadata=graph.metadata, source=graph.source)
    while len(cache) > KEPT:
        cache.popitem(last=False)
    return cache[key]


def _rank(graph: Graph, value: str) -> int | None:
    """The rank of a constant (``None`` for a value the weights compute: not known without running them)."""
    tensor = graph.constants.get(value)
    return None if tensor is None else tensor.dim()
