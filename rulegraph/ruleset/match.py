"""What a rule-file entry matches: op types, op traits, node names, module scopes, producer
patterns (:mod:`rulegraph.patterns`); and where the relevance boundary lies.

An :class:`Entry` matches a node when every key it sets matches (``op``, ``trait``, ``name``,
``scope``, ``inputs``); the first matching entry of a rule set gives the node its rule, and
its ``per_layer`` items (:class:`Override`) may swap the params for some nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from ..boundary import lookups, unreached
from ..errors import RuleMatchError
from ..ir import Graph, Node, block_of
from ..ops import lookup
from ..patterns import Pattern
from ..propagation import Rule


@dataclass
class Override:
    """A ``per_layer`` item: the entry's rule with other params, for nodes in ``blocks``
    (transformer block numbers) or matching ``names`` / ``scopes`` globs."""

    rule: Rule
    line: int
    blocks: frozenset[int] | None = None
    names: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()

    def matches(self, node: Node) -> bool:
        if self.blocks is not None:
            b = block_of(node)
            if b is None or b not in self.blocks:
                return False
        if self.names and not any(fnmatchcase(node.name, g) for g in self.names):
            return False
        return not self.scopes or any(fnmatchcase(node.scope, g) for g in self.scopes)




#: the ``inputs:`` key of a pattern any one input may match (an Add whose bias is its first or its second input)
ANY = "any"


@dataclass
class Entry:
    """One rule-file entry: what it matches and the rule it assigns."""

    rule: Rule
    line: int
    ops: tuple[str, ...] = ("*",)
    traits: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    inputs: dict[int | str, Pattern] = field(default_factory=dict)     # by position, or ANY input
    source: str = ""
    overrides: list[Override] = field(default_factory=list)
    #: what put the entry there when no line of the file did (``canonizer quantization``)
    label: str = ""

    def assign(self, node: Node) -> tuple[Rule, str]:
        """The rule for a node this entry matched, and where it came from (``file:line``)."""
        for o in self.overrides:
            if o.matches(node):
                return o.rule, f"{self.source}:{o.line}"
        return self.rule, self.where

    def matches(self, graph: Graph, node: Node) -> bool:
        if "*" not in self.ops and node.op not in self.ops:
            return False
        if self.traits:
            spec = lookup(node.op, node.domain, node=node.name, opset=graph.opset)
            if not all(getattr(spec, t) for t in self.traits):
                return False
        if self.names and not any(fnmatchcase(node.name, g) for g in self.names):
            return False
        if self.scopes and not any(fnmatchcase(node.scope, g) for g in self.scopes):
            return False
        for k, pattern in self.inputs.items():
            if k == ANY:
                if not any(v and pattern.matches(graph, v) for v in node.inputs):
                    return False
            elif k >= len(node.inputs) or not node.inputs[k] or not pattern.matches(graph, node.inputs[k]):
                return False
        return True

    @property
    def where(self) -> str:
        return f"{self.source}: {self.label}" if self.label else f"{self.source}:{self.line}"


@dataclass(frozen=True)
class Boundary:
    """Where relevance is read: ``embeddings`` (Gather outputs fed by integer inputs, and
    float inputs), ``inputs`` (float graph inputs), or the outputs of ``nodes`` (globs)."""

    kind: str = "embeddings"
    nodes: tuple[str, ...] = ()

    def values(self, graph: Graph) -> dict[str, str]:
        """Boundary value → the key its scores are reported under (an input or node name)."""
        found: dict[str, str] = {}
        if self.kind == "nodes":
            for n in graph.nodes:
                if any(fnmatchcase(n.name, g) for g in self.nodes):
                    found.update({v: n.name for v in n.outputs[:1]})
            if not found:
                raise RuleMatchError(f"boundary nodes {list(self.nodes)} match no node in the graph")
            return found
        found.update({i.name: i.name for i in graph.inputs if i.is_float})
        if self.kind == "embeddings":
            found.update({lk.node.outputs[0]: lk.source for lk in lookups(graph)})
        if not found:
            why = unreached(graph) if any(not i.is_float for i in graph.inputs) else "the model has no inputs"
            raise RuleMatchError(
                f"no relevance boundary: the model has no float inputs and {why}; an embedding lookup is a Gather of "
                "a constant float table at indices computed from an integer input by index arithmetic; set "
                "`boundary: {nodes: [<node name glob>]}` in the rule file to read relevance elsewhere")
        return found


