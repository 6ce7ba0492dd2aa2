"""Quantized deployment graphs: the ``quantization`` canonizer.

onnxruntime's quantization tools rewrite a float model in two ways (Jacob et al. 2018, "Quantization
and training of neural networks for efficient integer-arithmetic-only inference", CVPR: real value =
scale · (integer − zero point)):

* ``quantize_static`` with ``QuantFormat.QDQ``: weights stored as int8 and read through
  ``DequantizeLinear``; each activation goes through a ``QuantizeLinear → DequantizeLinear`` pair.
* ``quantize_dynamic``: a ``MatMul`` (``Conv``) becomes ``DynamicQuantizeLinear`` of the activation,
  ``MatMulInteger`` (``ConvInteger``) with the int8 weights, a ``Cast`` and a ``Mul`` by the product
  of the two scales; an embedding ``Gather`` reads the int8 table and dequantizes the rows it picks.

Relevance cannot pass an integer tensor, so :func:`dequantize` rewrites the graph into the float
computation it stands for, exactly up to float rounding:

* a ``DequantizeLinear`` of constants is folded into a float constant: the dequantized weights *are*
  the layer's weights for every rule (and a table read through it is an embedding table, so the
  input boundary is found);
* a ``Gather`` of an int8 table followed by a per-tensor ``DequantizeLinear`` becomes a ``Gather``
  of the dequantized table (dequantizing commutes with picking rows);
* a pair ``QuantizeLinear → DequantizeLinear`` on an activation ``x`` becomes
  ``QuantizeDequantize(x, QuantizationError(x))`` = ``x + δ``: ``δ`` is the rounding the pair adds,
  held constant by every rule, so the share of relevance it takes is *absorbed* and the audit books
  it as the quantization error (:data:`rulegraph.audit.QUANTIZATION`);
* ``DynamicQuantizeLinear → MatMulInteger → Cast → Mul(scale_x · scale_w)`` becomes
  ``MatMul(x + δ, (W_q − z_w) · s_w)`` (``ConvInteger`` likewise ``Conv``), since
  ``(q − z)·s_x @ (W_q − z_w)·s_w`` is that product.

A graph without quantization ops is returned unchanged, so every rule file applies this canonizer by
default (``no_canonize: [quantization]`` turns it off), and the round trips it writes get the
``quantization`` rule (:class:`rulegraph.propagation.quantized.Quantization`) in the relevance pass,
unless the rule file has an entry naming ``QuantizeDequantize`` itself.
Chains it does not recognise are left as they are (their integer tensors then stop relevance, and
``rulegraph check`` shows where).
"""
from __future__ import annotations

import torch

from ..audit import QUANTIZATION
from ..boundary import constant_value
from ..ir import Graph, Node
from ..ops import find
from ..ops.elementwise import dequantize_linear
from ..ops.quantization import RULEGRAPH_DOMAIN
from .base import canonizer

#: the ops whose presence makes a graph a quantized one
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                           "ConvInteger"})


class _Rewrite:
    """The graph being rewritten: new constants, nodes replaced (by name → replacement nodes) and dropped."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.constants = dict(graph.constants)
        self.replaced: dict[str, list[Node]] = {}
        self.dropped: set[str] = set()

    def const(self, value: str) -> torch.Tensor | None:
        """The tensor a constant value holds (an initializer, or computed from initializers only), else ``None``."""
        return constant_value(self.graph, value) if value and value in self.graph.constant_values else None

    def sole_consumer(self, value: str) -> Node | None:
        users = self.graph.consumers.get(value, [])
        if len(users) != 1 or value in self.graph.outputs:
            return None
        return users[0][0]

    def done(self, node: Node) -> bool:
        return node.name in self.replaced or node.name in self.dropped

    def graph_out(self) -> Graph:
        g = self.graph
        nodes: list[Node] = []
        for n in g.nodes:
            if n.name in self.replaced:
                nodes.extend(self.replaced[n.name])
            elif n.name not in self.dropped:
                nodes.append(n)
        while True:     # a QuantizeLinear of a constant whose DequantizeLinear was folded: dead now
            used = {v for n in nodes for v in n.inputs} | set(g.outputs)
            live = [n for n in nodes if any(v in used for v in n.outputs if v)]
            if len(live) == len(nodes):
                break
            nodes = live
        constants = {k: v for k, v in self.constants.items() if k in used}
        return Graph(nodes, g.inputs, g.outputs, constants, opset=g.opset, name=g.name, metadata=g.metadata,
                     source=g.source)


def _dequantized(rw: _Rewrite, node: Node) -> torch.Tensor | None:
    """The float tensor a ``DequantizeLinear`` of constants computes (in float64: exact), else ``None``."""
    x, scale = rw.const(node.inputs[0]), rw.const(node.inputs[1])
    zero = rw.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if x is None or scale is None or (len(node.inputs) > 2 and node.inputs[2] and zero is None):
        return None
    return dequantize_linear(x, scale.double(), zero, axis=node.attrs.get("axis", 1))


def _fold_constant_dequantize(rw: _Rewrite) -> None:
    for node in rw.graph.nodes:
        if node.op == "DequantizeLinear" and not rw.done(node) and node.attrs.get("block_size", 0) == 0:
            value = _dequantized(rw, node)
            if value is not None:
                rw.constants[node.outputs[0]] = value
                rw.dropped.add(node.name)


def _fold_gathered_tables(rw: _Rewrite) -> None:
    """``Gather(int table, ids) → DequantizeLinear(per tensor)``: a ``Gather`` of the dequantized table.
    The gathered integers may also reach a DequantizeLinear of the same scale and zero point through one
    routing op (onnxruntime's quantize_dynamic of a batch-first recurrent cell: ``Transpose`` before its
    dequantization): the routing op then moves the dequantized rows, which is the same numbers."""
    g = rw.graph
    for node in g.nodes:
        if node.op != "Gather" or rw.done(node) or rw.const(node.inputs[0]) is None \
                or rw.const(node.inputs[0]).is_floating_point():
            continue
        routes = _dequantizing_consumers(rw, node.outputs[0])
        if routes is None:
            continue
        dq = routes[0][1]
        table = _dequantized(rw, Node(dq.name, dq.op, (node.inputs[0], *dq.inputs[1:]), dq.outputs, dq.attrs))
        name = f"{node.inputs[0]}::dequantized"
        rw.constants[name] = table
        rows = dq.outputs[0] if routes[0][0] is None else f"{node.outputs[0]}::dequantized"
        rw.replaced[node.name] = [Node(node.name, "Gather", (name, node.inputs[1]), (rows,), dict(node.attrs),
                                       node.domain, node.scope)]
        for route, dequantize in routes:
            if route is None:
                if dequantize.outputs[0] != rows:
                    rw.replaced[dequantize.name] = [Node(dequantize.name, "Identity", (rows,), dequantize.outputs,
                                                         {}, "", dequantize.scope)]
                else:
                    rw.dropped.add(dequantize.name)
            else:
                rw.replaced[route.name] = [Node(route.name, route.op, (rows, *route.inputs[1:]), dequantize.outputs,
                                                dict(route.attrs), route.domain, route.scope)]
                rw.dropped.add(dequantize.name)


def _dequantizing_consumers(rw: _Rewrite, value: str) -> list[tuple[Node | None, Node]] | None:
    """Every reader of ``value`` as ``(routing op or None, the per-tensor DequantizeLinear after it)``, all
    with the same scale and zero point; ``None`` where any reader is something else."""
    users = rw.graph.consumers.get(value, [])
    if not users or value in rw.graph.outputs:
        return None
    routes = []
    for user, _ in users:
        route = None
        if user.op != "DequantizeLinear":
            spec = find(user.op, user.domain)
            if spec is None or not spec.routing or user.inputs[0] != value or value in user.inputs[1:]:
                return None
            route, user = user, rw.sole_consumer(user.outputs[0])
            if user is None or user.op != "DequantizeLinear":
                return None
        if user.inputs[0] != (value if route is None else route.outputs[0]) or rw.done(user):
            return None
        if any(p is None or p.numel() != 1 for p in (rw.const(v) for v in user.inputs[1:] if v)):
            return None
        routes.append((route, user))
    if len({tuple(d.inputs[1:]) for _, d in routes}) != 1 or len({id(r) for r, _ in routes if r}) != \
            len([r for r, _ in routes if r]):
        return None
    return routes


def _round_trip(x: str, error_inputs: tuple[str, ...], attrs: dict, out: str, name: str, scope: str) -> list[Node]:
    """``out = QuantizeDequantize(x, QuantizationError(x, …))``: the node named ``name + QUANTIZATION``."""
    error = f"{out}::quantization_error"
    return [Node(f"{name}::error", "QuantizationError", (x, *error_inputs), (error,), attrs, RULEGRAPH_DOMAIN, scope),
            Node(f"{name}{QUANTIZATION}", "QuantizeDequantize", (x, error), (out,), {}, RULEGRAPH_DOMAIN, scope)]


def _same(rw: _Rewrite, a: str, b: str) -> bool:
    if a == b:
        return True
    ta, tb = rw.const(a), rw.const(b)
    return ta is not None and tb is not None and ta.dtype == tb.dtype and torch.equal(ta, tb)


def _fold_pairs(rw: _Rewrite) -> None:
    """``QuantizeLinear(x) → DequantizeLinear`` with the same scale and zero point: ``x + δ``."""
    g = rw.graph
    for dq in g.nodes:
        if dq.op != "DequantizeLinear" or rw.done(dq):
            continue
        q = g.producer.get(dq.inputs[0])
        if q is None or q.op != "QuantizeLinear" or q.attrs.get("block_size", 0) or dq.attrs.get("block_size", 0):
            continue
        q_params = list(q.inputs[1:]) + [""] * (3 - len(q.inputs))
        dq_params = list(dq.inputs[1:]) + [""] * (3 - len(dq.inputs))
        if not all(_same(rw, a, b) for a, b in zip(q_params, dq_params)) or \
                q.attrs.get("axis", 1) != dq.attrs.get("axis", 1):
            continue
        attrs = {"axis": q.attrs.get("axis", 1), "output_dtype": q.attrs.get("output_dtype", 0)}
        rw.replaced[dq.name] = _round_trip(q.inputs[0], (dq_params[0], dq_params[1]), attrs, dq.outputs[0], dq.name,
                                           dq.scope)
        if all(c.op == "DequantizeLinear" and c.name in rw.replaced for c, _ in g.consumers.get(q.outputs[0], [])):
            rw.dropped.add(q.name)


def _scale_product(rw: _Rewrite, value: str, scale: str) -> torch.Tensor | None:
    """The weight scale ``s_w`` when ``value`` is ``Mul(scale, s_w)`` (either order) with ``s_w`` constant."""
    node = rw.graph.producer.get(value)
    if node is None or node.op != "Mul" or scale not in node.inputs:
        return None
    other = node.inputs[1] if node.inputs[0] == scale else node.inputs[0]
    return rw.const(other)


def _fold_dynamic(rw: _Rewrite) -> None:
    """``DynamicQuantizeLinear → MatMulInteger | ConvInteger → Cast → Mul(s_x · s_w)``: a float product."""
    g = rw.graph
    for dql in g.nodes:
        if dql.op != "DynamicQuantizeLinear" or rw.done(dql):
            continue
        x, (q, scale, zero) = dql.inputs[0], dql.outputs
        quantized = f"{x}::quantized"
        chains = []
        for user, _ in g.consumers.get(q, []):
            chain = _integer_chain(rw, user, q, scale, zero)
            if chain is None:
                break
            chains.append(chain)
        else:
            if not chains:
                continue
            replacement = _round_trip(x, (), {"dynamic": 1}, quantized, dql.name, dql.scope)
            rw.replaced[dql.name] = replacement
            for product, cast, mul, weights in chains:
                w_name = f"{product.inputs[1]}::dequantized"
                rw.constants[w_name] = weights
                op = "MatMul" if product.op == "MatMulInteger" else "Conv"
                attrs = dict(product.attrs) if op == "Conv" else {}
                rw.replaced[product.name] = [Node(product.name, op, (quantized, w_name), mul.outputs, attrs,
                                                  product.domain, product.scope)]
                rw.dropped.update({cast.name, mul.name})
            for user, _ in g.consumers.get(scale, []):
                if user.op == "Mul" and user.name not in rw.replaced and all(
                        rw.done(c) for c, _ in g.consumers.get(user.outputs[0], [])):
                    rw.dropped.add(user.name)


def _integer_chain(rw: _Rewrite, product: Node, q: str, scale: str, zero: str):
    """``(product, cast, mul, float weights)`` for ``product(q, W_q, zero, z_w) → Cast → Mul(·, s_x·s_w)``."""
    if product.op not in ("MatMulInteger", "ConvInteger") or product.inputs[0] != q or rw.done(product):
        return None
    if len(product.inputs) < 3 or product.inputs[2] != zero:
        return None
    w = rw.const(product.inputs[1])
    w_zero = rw.const(product.inputs[3]) if len(product.inputs) > 3 and product.inputs[3] else None
    if w is None or (len(product.inputs) > 3 and product.inputs[3] and w_zero is None):
        return None
    cast = rw.sole_consumer(product.outputs[0])
    if cast is None or cast.op != "Cast":
        return None
    mul = rw.sole_consumer(cast.outputs[0])
    if mul is None or mul.op != "Mul":
        return None
    other = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
    s_w = _scale_product(rw, other, scale)
    if s_w is None:
        return None
    centred = w.double() - (0 if w_zero is None else _per_channel(w_zero.double(), w, product.op))
    return product, cast, mul, centred * _per_channel(s_w.double(), w, product.op)


def _per_channel(p: torch.Tensor, w: torch.Tensor, op: str) -> torch.Tensor:
    """A weight zero point or scale shaped to broadcast on ``w``: per column of a MatMul's ``[K, N]``
    weights, per output channel (axis 0) of a Conv's."""
    if p.numel() == 1:
        return p.reshape(())
    return p.reshape(-1) if op == "MatMulInteger" else p.reshape(-1, *([1] * (w.dim() - 1)))


@canonizer("quantization", default=True, rules={"relevance": {"QuantizeDequantize": "quantization"}})
def dequantize(graph: Graph) -> Graph:
    """``graph`` with its quantization rewritten into the float computation it stands for (see the
    module docstring); a graph without quantization ops, unchanged."""
    if not any(n.op in QUANTIZED_OPS for n in graph.nodes):
        return graph
    rw = _Rewrite(graph)
    _fold_gathered_tables(rw)
    _fold_constant_dequantize(rw)
    _fold_pairs(rw)
    _fold_dynamic(rw)
    return rw.graph_out()
