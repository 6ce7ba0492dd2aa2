"""The one graph IR both loaders produce.

A :class:`Graph` is a list of :class:`Node` s in topological order over named values,
plus the constants (initializers) and the graph's inputs and outputs. Op types are
ONNX op names whatever the source (the fx loader translates aten targets), so one
rule file serves ONNX and fx exports alike. Attributes are plain Python values
(ints, floats, lists, strings, torch dtypes, tensors) under their ONNX names.

What is derived from a graph and worth keeping (its plans per device and dtype, its
bindings to rule sets, its canonized forms…) lives in one declared :class:`GraphCache`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator

import networkx as nx
import torch

from .errors import ModelError


@dataclass
class Node:
    """One operation: ``outputs = op(*inputs, **attrs)``.

    ``inputs`` holds value names, ``""`` for an omitted optional input. ``scope`` is
    the dotted module path the exporter recorded (``bert.encoder.layer.0.attention``),
    or ``""`` when unknown; the audit groups nodes into layers with it.
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    scope: str = ""
    index: int = -1

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.op})"


@dataclass
class GraphCache:
    """What is computed from a graph once and reused, by the module that computes it."""

    plans: dict = field(default_factory=dict)            # (device, dtype) → interpreter.Plan
    bindings: dict = field(default_factory=dict)         # id(rule set) → (rule set, ruleset.Binding)
    canonized: dict = field(default_factory=dict)        # canonizer names → canonized Graph
    attention: list | None = None                        # the attention probabilities' values, in block order
    heads: list | None = None                            # heads.AttentionBlock per attention block
    sessions: dict = field(default_factory=dict)         # onnxruntime sessions by (output, thread count); methods.sequences
    boundary: Any = None                                 # boundary.Walk: the embedding lookups and their index paths
    folded: dict = field(default_factory=dict)           # constant values computed from initializers (boundary.constant_value)
    dependent: dict | None = None                        # values depending on a lookup's input (boundary.dependent)
    products: dict | None = None                         # attention value product → its block number (heads)
    roles: Any = None                                    # facts.Roles: the inputs' roles and the token table
    outputs: dict = field(default_factory=dict)          # output → facts.OutputKind (None: the probe could not run)
    info: tuple | None = None                            # (the rulegraph.* entries, loaders.metadata.ExportInfo of them)


@dataclass(frozen=True)
class ValueInfo:
    """A graph input: name, dtype and shape (ints for fixed dims, strings or None for free ones)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int | str | None, ...] | None = None

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    def describe(self) -> str:
        dims = "?" if self.shape is None else "×".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name} ({str(self.dtype).removeprefix('torch.')}, {dims})"


class Graph:
    """A topologically sorted computation graph with ONNX op names."""

    def __init__(
        self,
        nodes: list[Node],
        inputs: list[ValueInfo],
        outputs: list[str],
        constants: dict[str, torch.Tensor],
        *,
        opset: int,
        name: str = "",
        metadata: dict[str, str] | None = None,
        source: str = "",
    ):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.constants = dict(constants)
        self.opset = opset
        self.name = name
        self.metadata = dict(metadata or {})
        self.source = source
        self.nodes = _topological(nodes, self.constants, self.inputs)
        for i, node in enumerate(self.nodes):
            node.index = i
        self.producer: dict[str, Node] = {v: n for n in self.nodes for v in n.outputs if v}
        self.consumers: dict[str, list[tuple[Node, int]]] = {}
        for n in self.nodes:
            for k, v in enumerate(n.inputs):
                if v:
                    self.consumers.setdefault(v, []).append((n, k))
        self._by_name = {n.name: n for n in self.nodes}
        self.cache = GraphCache()
        missing = [o for o in self.outputs if o not in self.producer and o not in self.constants
                   and o not in self.input_names]
        if missing:
            raise ModelError(f"graph output(s) {', '.join(missing)} are produced by no node")

    # -- lookups -----------------------------------------------------------------
    @cached_property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no node named {name!r}") from None

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def op_types(self) -> set[str]:
        return {n.op for n in self.nodes}

    @cached_property
    def constant_values(self) -> frozenset[str]:
        """Values fixed by the model alone: initializers and what nodes compute from them only
        (exporters share identical initializers through ``Identity`` nodes, for instance)."""
        known = set(self.constants)
        for n in self.nodes:
            if n.inputs and all(v in known for v in n.inputs if v):
                known.update(v for v in n.outputs if v)
        return frozenset(known)

    def block_of(self, node: Node) -> int | None:
        """The transformer block number of ``node`` (see :func:`block_of`)."""
        return block_of(node)

    @cached_property
    def block_count(self) -> int:
        """How many transformer blocks the nodes' numbers name (one more than the highest; 0: none numbered)."""
        return 1 + max((b for b in map(block_of, self.nodes) if b is not None), default=-1)

    @cached_property
    def layers(self) -> dict[str, str]:
        """Node name → layer (``embeddings`` / ``block i`` / ``head``); see :func:`layer_names`."""
        return layer_names(self)

    @property
    def path(self) -> str | None:
        """The file the graph was loaded from (:attr:`source` after its kind, ``onnx:/models/m.onnx``), or ``None``
        (a module captured in memory): where the files beside it (a tokenizer, a feature extractor) are looked for."""
        return self.source.partition(":")[2] or None

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes, opset {self.opset}, from {self.source or '?'})"


def _topological(nodes: list[Node], constants: dict, inputs: list[ValueInfo]) -> list[Node]:
    """Order nodes so every input is produced before use; keeps the given order where it is valid."""
    available = set(constants) | {i.name for i in inputs} | {""}
    if all(_ready(n, available) and not available.update(n.outputs) for n in nodes):
        return list(nodes)
    producer = {v: i for i, n in enumerate(nodes) for v in n.outputs if v}
    g = nx.DiGraph()
    g.add_nodes_from(range(len(nodes)))
    for i, n in enumerate(nodes):
        for v in n.inputs:
            if v in producer:
                g.add_edge(producer[v], i)
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        raise ModelError(f"the graph has a cycle through node {nodes[cycle[0][0]].name!r}")
    order = [nodes[i] for i in nx.lexicographical_topological_sort(g)]
    known = set(constants) | {i.name for i in inputs} | {""} | set(producer)
    for n in order:
        for v in n.inputs:
            if v not in known:
                raise ModelError(f"node {n.name!r} ({n.op}) reads {v!r}, which no node, input or initializer provides")
    return order


def _ready(node: Node, available: set[str]) -> bool:
    return all(v in available for v in node.inputs)


_BLOCK = re.compile(r"(?:^|[./_])(?:layers?|h|blocks?|encoder_layers?|decoder_layers?|transformer_blocks?)[._](\d+)(?=$|[./_])")
_EMBED = re.compile(r"embed|wte|wpe|patch", re.IGNORECASE)


def block_index(label: str) -> int | None:
    """The transformer block number in a scope or node name (``layer.3``, ``h.3``, ``layers_3``), if any."""
    m = _BLOCK.search(label)
    return int(m.group(1)) if m else None


def block_of(node: Node) -> int | None:
    """The transformer block number of ``node``: the one its scope carries, else its name (``None``: neither
    does). The one definition: the audit's layers, rule files' ``per_layer: {blocks: …}``, the attention
    blocks of :mod:`rulegraph.heads` and the head masks keyed by them all read it."""
    b = block_index(node.scope) if node.scope else None
    return b if b is not None else block_index(node.name)


def layer_names(graph: Graph) -> dict[str, str]:
    """Group nodes into ``embeddings`` / ``block i`` / ``head`` from the export's scopes and names.

    A node whose scope or name carries a block number belongs to that block. Other
    nodes go to ``embeddings`` when they come before the first block (or their scope
    says embedding) and to ``head`` after the last one. Unnumbered nodes between
    blocks join the block before them.
    """
    numbered: dict[str, int] = {}
    for n in graph.nodes:
        b = block_of(n)
        if b is not None:
            numbered[n.name] = b
    if not numbered:
        return {n.name: ("embeddings" if _EMBED.search(n.scope or n.name) else "model") for n in graph.nodes}
    first = min(graph.node(k).index for k in numbered)
    last = max(graph.node(k).index for k in numbered)
    out: dict[str, str] = {}
    current = None
    for n in graph.nodes:
        if n.name in numbered:
            current = numbered[n.name]
            out[n.name] = f"block {current}"
        elif _EMBED.search(n.scope or n.name) or n.index < first:
            out[n.name] = "embeddings"
        elif n.index > last:
            out[n.name] = "head"
        else:
            out[n.name] = f"block {current}" if current is not None else "embeddings"
    return out
