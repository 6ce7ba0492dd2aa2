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
    """The rank of a value the weights fix: an initializer, or one an exporter shares through ``Identity``
    nodes (``None`` for any other: not known without running the graph)."""
    for _ in range(8):
        if value in graph.constants:
            return graph.constants[value].dim()
        node = graph.producer.get(value)
        if node is None or node.op != "Identity":
            return None
        value = node.inputs[0]
    return None


# -- a classifier's last layers at the position its head reads -----------------------------------------------
def pooled(graph: Graph) -> Graph | None:
    """``graph`` with the position its head reads picked before the row-wise ops that lead to it, not after:
    a BERT-style classifier's pooler reads one position of the last layer's output (``Gather`` of a fixed
    index), so that layer's feed-forward block, its output projection, residual additions and LayerNorms are
    computed, and walked, for that position only (a short explanation of the demo MiniLM takes 0.92–0.94×
    the time, ``benchmarks/results/short_inputs_ab.md``); ``None`` where nothing moves. Each fixed-index
    ``Gather`` whose data every reader picks alike moves above the node making it, where that node works row
    by row: a pointwise op (its other inputs fixed vectors or scalars), a ``LayerNormalization`` over the last
    axis, a ``MatMul`` by a fixed matrix; the node then reads the picked rows of each of its varying inputs,
    and the picking moves on from there. It stops at anything else (an attention's reshapes: the picking
    stays there) and at a value another node reads whole. The ``Gather`` nodes it leaves are routing nodes, as
    :func:`head_rows`'s; the rows it drops receive no relevance from the head in the first place, so every
    rule gives the kept rows what it gave them before (the callers check that each node keeps its rule and
    that the output is the same, :func:`rulegraph.passes.base.pooled_rows`)."""
    cache = graph.cache.canonized
    if "pooled" not in cache:
        cache["pooled"] = _pooled(graph)
    return cache["pooled"]


def _pooled(graph: Graph) -> Graph | None:
    nodes = list(graph.nodes)
    outputs = set(graph.outputs)
    moved = False
    for _ in range(256):                      # one node moved per round; a last block has some 20
        step = _movable(graph, nodes, outputs)
        if step is None:
            break
        nodes = step
        moved = True
    if not moved:
        return None
    return Graph(nodes, graph.inputs, list(graph.outputs), graph.constants, opset=graph.opset, name=graph.name,
                 metadata=graph.metadata, source=graph.source)


def _picks(node: Node, constants: dict) -> tuple | None:
    """``(index value name, axis)`` of a ``Gather`` of fixed indices along a non-negative axis, else ``None``."""
    if node.op != "Gather" or node.domain not in ("", "ai.onnx") or node.inputs[1] not in constants:
        return None
    axis = node.attrs.get("axis", 0)
    return (node.inputs[1], axis) if axis >= 0 and constants[node.inputs[1]].dim() <= 1 else None


def _row_wise(graph: Graph, node: Node) -> list[int] | None:
    """The inputs of ``node`` that carry the positions, where it works row by row (see :func:`pooled`)."""
    if node.domain not in ("", "ai.onnx") or not node.outputs[0] or any(node.outputs[1:]):
        return None
    moving = [k for k, v in enumerate(node.inputs) if v and v not in graph.constant_values]
    fixed = [v for v in node.inputs if v and v in graph.constant_values]
    if not moving:
        return None
    if node.op == "MatMul":
        return [0] if moving == [0] and _rank(graph, node.inputs[1]) == 2 else None
    if node.op == "LayerNormalization":
        return [0] if moving == [0] and node.attrs.get("axis", -1) == -1 else None
    spec = find(node.op)
    if spec is None or not spec.pointwise or any(_rank(graph, v) not in (0, 1) for v in fixed):
        return None
    return moving


def _movable(graph: Graph, nodes: list[Node], outputs: set[str]) -> list[Node] | None:
    """``nodes`` with one picking moved above the node making its data (see :func:`pooled`), or ``None``."""
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for v in n.inputs:
            if v:
                readers.setdefault(v, []).append(n)
    producer = {v: n for n in nodes for v in n.outputs if v}
    for gather in nodes:
        picks = _picks(gather, graph.constants)
        data = gather.inputs[0]
        maker = producer.get(data)
        if picks is None or maker is None or data in outputs:
            continue
        if any(_picks(r, graph.constants) != picks for r in readers[data]):        # someone reads it whole
            continue
        carrying = _row_wise(graph, maker)
        if carrying is None:
            continue
        pickers = {r.name for r in readers[data]}
        picked = {k: f"{maker.inputs[k]}{SUFFIX}" for k in carrying}
        index, axis = picks
        made = {picked[k]: producer.get(picked[k]) for k in carrying}          # a picking made by an earlier move
        if any(n is not None and (n.inputs[1], n.attrs.get("axis", 0)) != picks for n in made.values()):
            continue                                # (the same value picked otherwise elsewhere: left as it is)
        new = {picked[k]: Node(f"{maker.name}{SUFFIX}::{k}", "Gather", (maker.inputs[k], index), (picked[k],),
                               {"axis": axis}, "", maker.scope)
               for k in reversed(carrying) if made[picked[k]] is None}       # (x · x: one picking, the first's name)
        moved = Node(maker.name, maker.op, tuple(picked.get(k, v) for k, v in enumerate(maker.inputs)),
                     (gather.outputs[0],), dict(maker.attrs), maker.domain, maker.scope)
        rest = [n for n in nodes if n is not maker and n.name not in pickers]
        # the other pickers' outputs are this one's: their readers read it instead
        same = {r.outputs[0]: gather.outputs[0] for r in readers[data] if r is not gather}
        rest = [Node(n.name, n.op, tuple(same.get(v, v) for v in n.inputs), n.outputs, n.attrs, n.domain, n.scope)
                if any(v in same for v in n.inputs) else n for n in rest]
        return [*rest, *new.values(), moved]
    return None
