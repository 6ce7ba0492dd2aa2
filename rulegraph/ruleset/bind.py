"""A rule set bound to one graph: the boundary, the taint, and a rule per node relevance reaches."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

from ..boundary import walk
from ..errors import RuleMatchError, RulegraphError, UnsupportedOpError
from ..ir import Graph, Node
from ..lifetimes import WalkCache
from ..ops import lookup
from ..propagation import Rule


@dataclass
class Assignment:
    """The rule one node got, and where it came from."""

    rule: Rule
    where: str          # "file:line" or "on_unmatched"


class Binding:
    """A rule set applied to one graph: boundary, taint, and a rule per node relevance reaches.

    ``tainted`` holds the values that depend on the boundary (only those can carry
    relevance). Walking back from the graph outputs, a node is *reached* when
    relevance can arrive at one of its outputs given the rules downstream; only
    reached nodes need a rule. ``unmatched`` lists reached nodes no entry matched.
    """

    def __init__(self, graph: Graph, ruleset):
        self.graph = graph
        self.ruleset = ruleset
        try:
            self.boundary = ruleset.boundary.values(graph)
        except RuleMatchError as exc:
            raise _written_for(ruleset, graph) or exc from None
        self.tainted = _taint(graph, set(self.boundary))
        self.assignments: dict[str, Assignment] = {}
        self.unmatched: list[Node] = []
        self.reached: list[Node] = []           # in topological order
        self.carried: dict[str, list[bool]] = {}
        #: what keeps the rule set from running on this graph, in walk order: a rule that cannot apply
        #: to the node it matched, an op with no implementation (``require_complete`` raises the first)
        self.problems: list[RulegraphError] = []
        #: what a pass prepares once per binding and plan, by id(plan)
        self.walks: dict[int, WalkCache] = {}
        self._walk()

    def _walk(self) -> None:
        graph, rs = self.graph, self.ruleset
        live = {v for v in graph.outputs if v in self.tainted}
        reached = []
        for node in reversed(graph.nodes):
            if not any(v in live for v in node.outputs) or not any(v in self.tainted for v in node.inputs):
                continue
            reached.append(node)
            tainted = [v in self.tainted for v in node.inputs]
            try:
                spec = lookup(node.op, node.domain, node=node.name, opset=graph.opset)
            except UnsupportedOpError as exc:     # listed; the walk goes on as if it passed relevance
                self.problems.append(exc)
                live.update(v for v in node.inputs if v in self.tainted)
                continue
            if spec.sequence:               # listed; no rule reads a list of tensors
                self.problems.append(RuleMatchError(
                    f"node {node.name!r} ({node.op}) passes a tensor sequence on the path relevance takes; no rule "
                    "reads tensor sequences"))
                live.update(v for v in node.inputs if v in self.tainted)
                continue
            entry = rs.match(graph, node)
            if entry is not None:
                assignment = Assignment(*entry.assign(node))
            elif rs.fallback is not None:
                assignment = Assignment(rs.fallback, f"{rs.source}: on_unmatched")
            else:  # keep walking as if it passed relevance on, so `check` lists every node upstream too
                self.unmatched.append(node)
                live.update(v for v in node.inputs if v in self.tainted)
                continue
            why = assignment.rule.check(node, spec, tainted) or assignment.rule.check_graph(graph, node)
            if why is not None:
                self.problems.append(RuleMatchError(f"{assignment.where}: rule {assignment.rule.name!r} cannot apply "
                                                    f"to node {node.name!r} (op {node.op}): {why}"))
                live.update(v for v in node.inputs if v in self.tainted)
                continue
            self.assignments[node.name] = assignment
            carried = assignment.rule.carries(node, spec, tainted)
            self.carried[node.name] = carried
            live.update(v for v, c in zip(node.inputs, carried) if c)
        self.reached = reached[::-1]
        self.unmatched.reverse()

    @cached_property
    def needed_values(self) -> frozenset[str]:
        """What a pass reads from the forward: every value a reached node touches."""
        needed = set(self.boundary) | set(self.graph.outputs) | walk(self.graph).path_values()
        for node in self.reached:
            needed.update(v for v in (*node.inputs, *node.outputs) if v)
        return frozenset(needed)

    def fingerprint(self) -> str:
        """What this binding decides, as a SHA-256 (hex): the pass, the canonizers, the boundary, each reached
        node's rule with its params, the nodes without one and what keeps the rule set from running. Two
        rule files bind a graph alike when they decide the same, whatever else their texts hold (an entry
        for an op the graph lacks, a comment, another order of entries that never compete). Bind the graph
        the rule set's canonizers made (:func:`rulegraph.passes.base.prepared`), as a pass does."""
        rs = self.ruleset
        decided = [rs.pass_name, list(rs.canonize), sorted(self.boundary.items()), rs.on_unmatched, repr(rs.fallback),
                   [(name, repr(a.rule)) for name, a in self.assignments.items()],
                   [n.name for n in self.unmatched], [str(p) for p in self.problems]]
        return hashlib.sha256(json.dumps(decided).encode()).hexdigest()

    def require_complete(self) -> None:
        """Raise the first problem (see :attr:`problems`), or if a reached node has no rule and the
        rule set says ``on_unmatched: error``."""
        if self.problems:
            first = self.problems[0]
            more = (f" (and {len(self.problems) - 1} more problem(s): run `rulegraph check` for the list)"
                    if len(self.problems) > 1 else "")
            raise type(first)(f"{first}{more}")
        if self.unmatched and self.ruleset.on_unmatched == "error":
            first = self.unmatched[0]
            more = f" and {len(self.unmatched) - 1} more" if len(self.unmatched) > 1 else ""
            ops = sorted({n.op for n in self.unmatched})
            raise RuleMatchError(
                f"{self.ruleset.source}: no rule matches node {first.name!r} (op {first.op}){more}; "
                f"unmatched ops: {', '.join(ops)} — add an entry such as `- op: {first.op}` with a rule, "
                f"or set `on_unmatched: warn|<rule>` (run `rulegraph check` for the full list)")


def _taint(graph: Graph, boundary: set[str]) -> set[str]:
    """Values that depend on the boundary's values and are floating point."""
    tainted = set(boundary)
    for node in graph.nodes:
        if any(v in tainted for v in node.inputs):
            tainted.update(v for v, f in zip(node.outputs, _float_outputs(graph, node)) if v and f)
    return tainted


def _float_outputs(graph: Graph, node: Node) -> list[bool]:
    try:
        spec = lookup(node.op, node.domain, node=node.name, opset=graph.opset)
        if spec.shape_only:                                            # EyeLike reads only the shape
            return [False] * len(node.outputs)
        return spec.carriers(node)
    except UnsupportedOpError:      # reported by the walk (and by `rulegraph check`), not here
        return [True] * len(node.outputs)



#: a rule set's ``models:`` → what it is, and the next step where a model of another kind has no boundary for it
WRITTEN_FOR = {"cnns": ("a CNN rule set (`models: cnns`): it reads relevance at float (image) inputs",
                        "for language models use attnlrp")}


def _written_for(ruleset, graph: Graph) -> RuleMatchError | None:
    """The error to give where a rule set finds no boundary on a model of a kind other than the one
    it declares it is written for (``models:``): what it is and what to use instead (``None``: no advice)."""
    if ruleset.models not in WRITTEN_FOR or any(i.is_float for i in graph.inputs):
        return None
    what, instead = WRITTEN_FOR[ruleset.models]
    inputs = ", ".join(i.name for i in graph.inputs) or "none"
    return RuleMatchError(f"no relevance boundary: {ruleset.name or ruleset.source} is {what}, and this model "
                          f"has none (its inputs: {inputs}); {instead}")
