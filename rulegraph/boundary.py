"""The input boundary of token models: the embedding lookups an integer input reaches, and how
the relevance read there maps back to the input's positions.

Integer graph inputs (token ids, token types, character code points) cannot hold relevance. It is
read at the *embedding lookups* their values reach: a ``Gather`` (axis 0), ``GatherElements`` or
``GatherND`` of a constant float table — an initializer, or a value computed from initializers
only, such as a dequantized table — whose indices are computed from the input by *index
arithmetic*:

* the ``routing`` ops, through their data inputs (Reshape, Transpose, Slice, Concat, Squeeze,
  Expand, Pad, Tile, Gather with fixed indices, Where's branches, a scatter that writes…): each
  output element is one input element, or a fill with no source;
* the ``pointwise`` ops (Cast, Add, Sub, Mul, Div, Mod, Neg, Min, Max…): each output element is
  a number computed from the elements at its own (broadcast) position;
* a ``Gather`` of a constant *integer* table by the data (a vocabulary remapping).

So the ids transposed to ``[positions, batch]`` (XLNet), hashed into several tables by
``((id + 1)·p_k) mod B`` (CANINE), shifted right with a start token in front (the decoder of a
BART sequence classifier) or padded to a multiple of a window (Longformer) all reach their
lookups. Comparisons end the walk (their outputs are masks, not numbers), and so does every other
op (CumSum, MatMul…). :func:`lookups` finds them once per graph.

**The mapping.** Every element ``o`` of a lookup's indices comes from one element of the input,
its *origin* ``origin[o]`` (a row-major flat position of the input), or from none (``−1``: a
constant the model inserts, such as a decoder start token or padding). :func:`origins` computes
them for one run by sending ``arange(numel).reshape(shape)`` through the same index arithmetic:
routing ops move origins as they move ids; a pointwise op keeps the origin of its one input that
derives from the ids (two such inputs must agree position by position). A lookup's output is
``[*I, *F]`` (``I`` the indices' positions, ``F`` a table row: ``Gather`` axis 0 ``F =
table.shape[1:]``; ``GatherND`` with ``k`` index components ``I = indices.shape[:-1]``, ``F =
table.shape[k:]``; ``GatherElements`` ``F = ()``), and relevance ``R`` there maps to the input's
layout as

    R_in[p, f] = Σ_{o : origin[o] = p} R[o, f],     shape [*input.shape, *F].

Relevance at elements of origin ``−1`` maps to no position: :meth:`BoundaryMap.unmapped` is
what the audit books as absorbed there (like a position embedding's share). The lookups of one
input are summed in that layout when their rows ``F`` agree, else laid side by side along one
feature axis. Float graph inputs and ``boundary: {nodes: …}`` values map as they are.

**Guard.** Relevance must never be absorbed on a path that depends on the input: a float value
computed from an input's ids but not through a lookup (a table indexed along another axis, ids
cast to float and used as a feature, a lookup at indices the walk could not follow) would take
relevance the explanation cannot show. :func:`absorbing` finds such values among what a pass
reads; dependence through a mask (``ids == pad``) does not count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import torch

from .errors import InputError, ModelError
from .ir import Graph, Node
from .ops import find, lookup as lookup_spec

Tensor = torch.Tensor

#: the ops that read a table at computed indices: op → the input holding the indices
LOOKUP_OPS = {"Gather": 1, "GatherElements": 1, "GatherND": 1}
NO_ORIGIN = -1


@dataclass(frozen=True)
class Lookup:
    """One embedding lookup: ``node``'s output holds rows of the constant ``table`` read at indices
    computed from the integer graph input ``source``. Usually ``node`` is the Gather of a float table;
    for a quantized table it is the ``DequantizeLinear`` (or float ``Cast``) of the rows a Gather read
    from the integer table. ``reads``: the value whose elements' origins give the output's (the
    indices; the integer rows for a dequantized lookup, whose last ``features`` dims are the row);
    ``features``: the trailing dims of the output that are a table row. ``bounds_ids``: the indices
    are the ids themselves, moved but not computed (routing ops and casts only), and index the
    table's rows, so the table's row count bounds the ids' values."""

    node: Node
    source: str
    table: str
    reads: str
    features: int
    bounds_ids: bool
    drop: int = 0       # trailing dims of ``reads``'s origins that are the row (a dequantized lookup)


@dataclass(frozen=True)
class Walk:
    """What :func:`lookups` found for a graph: the lookups; per integer input the values derived
    from it by index arithmetic (in graph order), and where the walk from it ended."""

    lookups: tuple[Lookup, ...]
    derived: dict[str, tuple[str, ...]]
    ends: dict[str, tuple[Node, ...]]

    def path_values(self) -> frozenset[str]:
        """Every value the origins of the lookups are computed from."""
        return frozenset(v for values in self.derived.values() for v in values)


def lookups(graph: Graph) -> tuple[Lookup, ...]:
    """The graph's embedding lookups, in graph order (see the module docstring)."""
    return walk(graph).lookups


def walk(graph: Graph) -> Walk:
    """The boundary walk of ``graph`` (kept in ``graph.cache.boundary``)."""
    if graph.cache.boundary is None:
        graph.cache.boundary = _walk(graph)
    return graph.cache.boundary


def _walk(graph: Graph) -> Walk:
    found: list[Lookup] = []
    derived: dict[str, tuple[str, ...]] = {}
    ends: dict[str, tuple[Node, ...]] = {}
    sources = [i.name for i in graph.inputs if not i.is_float and i.dtype != torch.bool]
    owner: dict[str, str] = {}                     # lookup node → its source, to refuse two sources
    for source in sources:
        known = {source}
        preserved = {source}                       # derived values that are the ids themselves
        order: list[str] = [source]
        stopped: list[Node] = []
        rows: dict[str, tuple[str, int, bool]] = {}    # rows read from an integer table → (table, row dims, bounds)

        for node in graph.nodes:
            reads = [i for i, v in enumerate(node.inputs) if v in known]
            if not reads:
                continue
            spec = find(node.op, node.domain)
            if spec is None:
                stopped.append(node)
                continue
            if reads == [0] and node.inputs[0] in rows and _dequantizes(node, graph):
                table, features, bounds = rows[node.inputs[0]]       # a quantized table's rows made float
                _claim(owner, found, Lookup(node, source, table, node.inputs[0], features, bounds, drop=features))
                continue
            if node.op in LOOKUP_OPS and reads == [LOOKUP_OPS[node.op]]:
                table = node.inputs[0]
                if table not in graph.constant_values:
                    stopped.append(node)
                    continue
                if node.op == "Gather" and node.attrs.get("axis", 0) != 0:
                    stopped.append(node)              # a table indexed along another axis: not a lookup
                    continue
                rank = constant_value(graph, table).dim()
                indices = node.inputs[LOOKUP_OPS[node.op]]
                features = {"Gather": rank - 1, "GatherElements": 0}.get(node.op, -1)
                bounds = node.op == "Gather" and indices in preserved
                if _is_float_constant(graph, table):
                    _claim(owner, found, Lookup(node, source, table, indices, features, bounds))
                    continue
                _extend(node, known, order)           # an integer table: a remapping of the ids, or quantized rows
                rows.update({v: (table, features, bounds) for v in node.outputs if v and features >= 0})
                continue
            if spec.is_routing(node) and set(reads) <= set(spec.data_inputs(node)):
                _extend(node, known, order)
                if any(node.inputs[i] in preserved for i in reads):      # moved, not computed
                    preserved.update(v for v in node.outputs if v)
                continue
            if spec.pointwise:
                _extend(node, known, order)
                continue
            stopped.append(node)
        derived[source] = tuple(order)
        ends[source] = tuple(stopped)
    found.sort(key=lambda lk: lk.node.index)
    return Walk(tuple(found), derived, ends)


def _claim(owner: dict[str, str], found: list[Lookup], lookup: Lookup) -> None:
    """Record ``lookup``; one whose indices are computed from two inputs is refused (``owner``: lookup node →
    the input that reached it first)."""
    node, source = lookup.node, lookup.source
    if node.name in owner and owner[node.name] != source:
        raise ModelError(f"the embedding lookup {node.name!r} ({node.op}) reads indices computed from two "
                         f"inputs, {owner[node.name]} and {source}; rulegraph cannot say which input its "
                         "relevance belongs to")
    owner[node.name] = source
    found.append(lookup)


#: ops that turn a quantized table's integer rows into floats (onnxruntime's ``quantize_dynamic`` puts a
#: DequantizeLinear after the Gather of the int8 table)
DEQUANTIZING = ("DequantizeLinear", "Cast", "CastLike")


def _dequantizes(node: Node, graph: Graph) -> bool:
    if node.op not in DEQUANTIZING or any(v and v not in graph.constant_values for v in node.inputs[1:]):
        return False
    return node.op != "Cast" or bool(node.attrs.get("to") is not None and node.attrs["to"].is_floating_point)


def _extend(node: Node, known: set[str], order: list[str]) -> None:
    for v in node.outputs:
        if v and v not in known:
            known.add(v)
            order.append(v)


def _is_float_constant(graph: Graph, name: str) -> bool:
    """Whether a constant value (an initializer, or computed from initializers only) is floating point."""
    if name in graph.constants:
        return graph.constants[name].is_floating_point()
    return constant_value(graph, name).is_floating_point()


def constant_value(graph: Graph, name: str) -> Tensor:
    """The value of ``name``, computed on the CPU from the initializers it depends on only (a
    dequantized table, a folded weight)."""
    if name in graph.constants:
        return graph.constants[name]
    cache = graph.cache.folded
    if name not in cache:
        if name not in graph.constant_values:
            raise ModelError(f"{name!r} is not a constant of the model")
        node = graph.producer[name]
        spec = lookup_spec(node.op, node.domain, node=node.name, opset=graph.opset)
        args = [constant_value(graph, v) if v else None for v in node.inputs]
        for i in spec.static:
            if i < len(args) and args[i] is not None:
                args[i] = args[i].tolist()
        out = spec.forward(*args, **{**spec.defaults, **node.attrs})
        outs = [out] if isinstance(out, Tensor) else list(out)
        for v, t in zip(node.outputs, outs):
            if v:
                cache[v] = t
    return cache[name]


def unreached(graph: Graph) -> str:
    """Why no integer input reached an embedding lookup: each input and where its walk ended."""
    w = walk(graph)
    parts = []
    for source, stopped in w.ends.items():
        if stopped:
            shown = ", ".join(f"{n.name!r} ({n.op})" for n in stopped[:3])
            more = f" and {len(stopped) - 3} more" if len(stopped) > 3 else ""
            parts.append(f"{source} reaches no embedding lookup (its values stop at {shown}{more}, which is not index "
                         "arithmetic)")
        else:
            parts.append(f"{source} reaches no embedding lookup (no node reads its values)")
    return "; ".join(parts)


# -- origins and the mapping --------------------------------------------------------------------------

@dataclass
class Mapped:
    """How one boundary value maps to its key's layout: ``origins`` over the value's leading dims
    (``None``: the value already has the key's layout), ``features`` the trailing dims, ``shape``
    the source input's shape (``None`` for a float input or a node boundary)."""

    key: str
    origins: Tensor | None = None
    shape: tuple[int, ...] | None = None
    features: int = 0

    def to_input(self, r: Tensor) -> Tensor:
        """``r`` (the value's shape) in the source input's layout ``[*input.shape, *F]``."""
        if self.origins is None:
            return r
        lead = self.origins.numel()
        rows = r.reshape(lead, -1)
        keep = self.origins.reshape(-1) >= 0
        idx = self.origins.reshape(-1)[keep]
        out = torch.zeros(math.prod(self.shape), rows.shape[1], dtype=r.dtype, device=r.device)
        out.index_add_(0, idx, rows[keep])
        return out.reshape(*self.shape, *r.shape[r.dim() - self.features:])

    def unmapped(self, r: Tensor) -> Tensor:
        """Σ of ``r`` at elements of no origin (a 0-d tensor)."""
        if self.origins is None:
            return r.new_zeros(())
        lead = self.origins.numel()
        lost = (self.origins.reshape(-1) < 0).to(r.dtype)
        return torch.nansum(r.reshape(lead, -1).sum(1) * lost)

    def positions(self) -> tuple[Tensor, Tensor] | None:
        """(batch, position) of the input per element of the value's leading dims (−1 where none),
        for a source of at least two dims; ``None`` where the value has the input's own layout."""
        if self.origins is None or self.shape is None or len(self.shape) < 2:
            return None
        inner = math.prod(self.shape[2:])
        o = self.origins
        batch = torch.where(o >= 0, o // (self.shape[1] * inner), NO_ORIGIN)
        pos = torch.where(o >= 0, (o // inner) % self.shape[1], NO_ORIGIN)
        return batch, pos


@dataclass
class BoundaryMap:
    """Every boundary value's :class:`Mapped` for one run."""

    values: dict[str, Mapped] = field(default_factory=dict)

    def to_input(self, value: str, r: Tensor) -> Tensor:
        return self.values[value].to_input(r)

    def unmapped(self, value: str, r: Tensor) -> Tensor:
        return self.values[value].unmapped(r)

    def by_key(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """Boundary value → tensor, mapped to the inputs' positions and combined per key: summed when
        the lookups' rows agree in shape, else laid side by side along one feature axis."""
        grouped: dict[str, list[Tensor]] = {}
        for v, t in tensors.items():
            mapped = self.values[v]
            grouped.setdefault(mapped.key, []).append(mapped.to_input(t))
        out = {}
        for key, parts in grouped.items():
            if all(p.shape == parts[0].shape for p in parts):
                out[key] = reduce(torch.add, parts)
            else:
                lead = self._lead(key, parts)
                out[key] = torch.cat([p.reshape(*lead, -1) for p in parts], dim=-1)
        return out

    def _lead(self, key: str, parts: list[Tensor]) -> tuple[int, ...]:
        shapes = {m.shape for m in self.values.values() if m.key == key and m.shape is not None}
        if len(shapes) == 1:
            return next(iter(shapes))
        raise InputError(f"the boundary values of {key!r} disagree in shape: {sorted(tuple(p.shape) for p in parts)}")

    def batch_first(self, value: str) -> bool:
        """Whether the value's dim 0 is its source's batch (dim 0), element for element."""
        m = self.values[value]
        if m.origins is None:
            return True
        if m.shape is None or not m.shape:
            return False
        inner = math.prod(m.shape[1:])
        o = m.origins
        batch = torch.arange(o.shape[0], device=o.device).reshape(-1, *[1] * (o.dim() - 1))
        return bool(((o < 0) | (o // max(inner, 1) == batch)).all()) and o.shape[0] == m.shape[0]


def origins(binding, plan: Any, values: Any) -> BoundaryMap:
    """The :class:`BoundaryMap` of one run (``values`` must hold the lookups' index paths:
    :attr:`Binding.needed_values` includes them)."""
    graph = binding.graph
    w = walk(graph)
    by_node = {lk.node.name: lk for lk in w.lookups}
    out = BoundaryMap()
    computed: dict[str, dict[str, Tensor]] = {}
    for value, key in binding.boundary.items():
        producer = graph.producer.get(value)
        lk = by_node.get(producer.name) if producer is not None else None
        if lk is None or value != producer.outputs[0]:
            out.values[value] = Mapped(key)
            continue
        if lk.source not in computed:
            computed[lk.source] = _origins_of(graph, plan, values, lk.source, w.derived[lk.source])
        known = computed[lk.source]
        src = values[lk.source]
        idx_origin = known[lk.reads]
        features = lk.features
        if lk.node.op == "GatherND":
            table = values[lk.table] if lk.table in values else plan.constants[lk.table]
            k = int(values[lk.reads].shape[-1])
            lead = _agree(idx_origin, -1, lk.node)
            features = table.dim() - k - int(lk.node.attrs.get("batch_dims", 0))
        else:
            lead = idx_origin[(..., *[0] * lk.drop)] if lk.drop else idx_origin
        identity = lead.shape == src.shape and bool(
            (lead.reshape(-1) == torch.arange(lead.numel(), device=lead.device)).all())
        out.values[value] = Mapped(key, None if identity else lead, tuple(src.shape), features)
    return out


def _origins_of(graph: Graph, plan: Any, values: Any, source: str, order: tuple[str, ...]) -> dict[str, Tensor]:
    """Origin of every element of every value derived from ``source`` (see the module docstring)."""
    src = values[source]
    known: dict[str, Tensor] = {source: torch.arange(src.numel(), device=src.device).reshape(src.shape)}
    wanted = set(order)
    for node in graph.nodes:
        if not any(v in known for v in node.inputs) or not any(v in wanted for v in node.outputs):
            continue
        step = plan.step_by_name.get(node.name)
        if step is None:
            continue
        outs = [values.get(v) if v else None for v in node.outputs]
        if any(o is None for v, o in zip(node.outputs, outs) if v in wanted):
            raise ModelError(f"node {node.name!r} ({node.op}): its output was not kept for the boundary's origins")
        spec = step.spec
        derived = [v in known for v in node.inputs]
        if node.op in LOOKUP_OPS and not derived[0]:           # an integer table read at derived indices
            result = [_read_origins(node, known[node.inputs[LOOKUP_OPS[node.op]]], values, outs[0])]
        elif spec.pointwise:
            result = [_broadcast_origins(node, [known[v] for v, d in zip(node.inputs, derived) if d], o)
                      for o in outs]
        else:                                                   # a routing op, through its data inputs
            args = values.arguments(step)
            for i in spec.data_inputs(node):
                if i < len(args) and args[i] is not None and isinstance(args[i], Tensor):
                    args[i] = known[node.inputs[i]] if derived[i] else torch.full(
                        args[i].shape, NO_ORIGIN, dtype=torch.int64, device=args[i].device)
            got = spec.forward(*args, **step.attrs)
            result = [got] if isinstance(got, Tensor) else list(got)
        for v, o in zip(node.outputs, result):
            if v and isinstance(o, Tensor):
                known[v] = o
    return known


def _broadcast_origins(node: Node, parts: list[Tensor], out: Tensor | None) -> Tensor:
    shape = out.shape if isinstance(out, Tensor) else torch.broadcast_shapes(*(p.shape for p in parts))
    merged = parts[0].expand(shape)
    for p in parts[1:]:
        p = p.expand(shape)
        clash = (merged >= 0) & (p >= 0) & (merged != p)
        if bool(clash.any()):
            raise ModelError(f"node {node.name!r} ({node.op}) combines token ids from different positions of the "
                             "input; the boundary cannot map the lookup it feeds back to one position")
        merged = torch.where(merged >= 0, merged, p)
    return merged.contiguous()


def _read_origins(node: Node, index_origin: Tensor, values: Any, out: Tensor) -> Tensor:
    """Origins of a Gather-family read of a table at derived indices: each output element takes its
    index element's origin."""
    if node.op == "GatherElements":
        return index_origin
    if node.op == "GatherND":
        lead = _agree(index_origin, -1, node)
        return lead.reshape(*lead.shape, *[1] * (out.dim() - lead.dim())).expand(out.shape).contiguous()
    table = values[node.inputs[0]]
    axis = node.attrs.get("axis", 0) % table.dim()
    shape = [1] * axis + list(index_origin.shape) + [1] * (table.dim() - axis - 1)
    return index_origin.reshape(shape).expand(out.shape).contiguous()


def _agree(origin: Tensor, dim: int, node: Node) -> Tensor:
    """One origin along ``dim`` (a GatherND index tuple must come from one position)."""
    first = origin.select(dim, 0)
    for i in range(1, origin.shape[dim]):
        other = origin.select(dim, i)
        if bool(((first >= 0) & (other >= 0) & (first != other)).any()):
            raise ModelError(f"node {node.name!r} ({node.op}) builds index tuples from different positions of the input")
        first = torch.where(first >= 0, first, other)
    return first


def dependent(graph: Graph) -> dict[str, str]:
    """Values that depend on the *values* of an input an embedding lookup reads (value → that input):
    through any op but those reading only shapes, and not through a mask (a ``boolean`` op: what is
    computed from ``ids == eos`` depends on where the eos is, not on the ids). The lookups' outputs are
    the boundary itself and are not listed."""
    w = walk(graph)
    terminal = {lk.node.name for lk in w.lookups}
    found: dict[str, str] = {}
    for source in dict.fromkeys(lk.source for lk in w.lookups):
        reached = {source}
        for node in graph.nodes:
            if node.name in terminal or not any(v in reached for v in node.inputs):
                continue
            spec = find(node.op, node.domain)
            if spec is None or spec.shape_only or spec.boolean or (
                    node.op == "Cast" and node.attrs.get("to") == torch.bool):
                continue
            for v in node.outputs:
                if v:
                    reached.add(v)
                    found.setdefault(v, source)
    return found


def absorbing(binding, values: Any) -> list[str]:
    """Float values that depend on a lookup's input (:func:`dependent`) and that a reached node reads but
    that carry no relevance (they do not depend on the boundary): relevance reaching them would be
    absorbed on a path that depends on the input. One line per value."""
    if binding.graph.cache.dependent is None:
        binding.graph.cache.dependent = dependent(binding.graph)
    depends = binding.graph.cache.dependent
    lines = []
    for node in binding.reached:
        for v in node.inputs:
            if v in depends and v not in binding.tainted and isinstance(values.get(v), Tensor) \
                    and values[v].is_floating_point():
                lines.append(f"node {node.name!r} ({node.op}) reads {v!r}, a float computed from input "
                             f"{depends[v]} but not through an embedding lookup: relevance would be absorbed on a "
                             "path that depends on the input")
    return lines
