"""Rule sets: a rule file read (:mod:`.parse`), its entries (:mod:`.match`), and bound to a graph (:mod:`.bind`).

A rule file is an ordered list of entries; for each node that relevance reaches,
the first entry that matches gives its rule::

    name: lrp-ah-ln
    boundary: embeddings          # embeddings | inputs | {nodes: [glob, …]}
    on_unmatched: error           # error | warn | <rule name>
    rules:
      - op: MatMul                # op type(s); "*" matches any
        inputs:                   # producer patterns, by input position
          0: {from: Softmax, through: routing}   # op types or op traits
        rule: ah
      - op: LayerNormalization
        rule: ln
      - op: "*"
        rule: gradient

Entries may also match on ``trait`` (an op trait: ``routing`` selects every op that only
moves elements, see :mod:`rulegraph.ops`), ``name`` (glob on the node name) and ``scope`` (glob on
the module path), and set ``params`` checked against the rule's declared fields.
``per_layer`` overrides params for some of the nodes an entry matches, first match
wins, by transformer block number (``blocks: 3``, ``"0-3"``, or a list) or by node
name / scope glob::

      - op: Conv
        rule: gamma
        params: {gamma: 0.25}
        per_layer:
          - {blocks: "0-3", params: {gamma: 0.5}}
          - {name: "*layer4*", params: {gamma: 0.1}}

Mistakes are reported as ``file:line: what was wrong; valid: …``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RuleFileError, choices, read_text
from ..ir import Graph, Node
from ..propagation import Rule
from ..rules import shipped_rule_sets
from .bind import Assignment, Binding
from ..patterns import Pattern
from .match import Boundary, Entry, Override
from .parse import parse

__all__ = ["Assignment", "Binding", "Boundary", "Entry", "Override", "Pattern", "RuleSet", "shipped_rule_sets"]

#: (file, source label, text) → the RuleSet parsed from it (see RuleSet.load)
_LOADED: dict[tuple[str, str, str], "RuleSet"] = {}
#: the folder of shipped rule sets, as the source label of their errors
SHIPPED_FOLDER = "rules"


@dataclass
class RuleSet:
    """An ordered list of :class:`Entry` plus the boundary and the unmatched-node policy."""

    entries: list[Entry]
    name: str = ""
    description: str = ""
    boundary: Boundary = field(default_factory=Boundary)
    on_unmatched: str = "error"         # "error", "warn", or a rule name
    fallback: Rule | None = None        # the rule when on_unmatched names one
    source: str = ""
    pass_name: str = "relevance"        # the pass that runs it (rulegraph.passes): relevance | decomposition
    canonize: tuple[str, ...] = ()      # graph rewrites before binding (rulegraph.canonize): quantization, batchnorm
    models: str = "transformers"        # what the rule set is written for: transformers | cnns
    #: the rules of the ops the canonizers write (a quantized graph's round trips), matched before ``entries``
    canonizer_entries: list[Entry] = field(default_factory=list)

    @classmethod
    def load(cls, name_or_path: str | Path) -> "RuleSet":
        """A shipped rule set by name (``lrp-ah-ln``) or a YAML file path.

        Loading the same file with the same text again returns the same object, so the
        graph's binding to it (:meth:`bind`) is computed once, not per call.
        """
        path = Path(name_or_path)
        if path.suffix in (".yaml", ".yml") or path.exists():
            if not path.exists():
                raise RuleFileError(f"rule file not found: {path}")
            return cls._cached(path, str(path))
        shipped = shipped_rule_sets(None)
        if str(name_or_path) not in shipped:
            raise RuleFileError(f"no rule set named {str(name_or_path)!r}; {choices(shipped, str(name_or_path))}, "
                                "or a path to a .yaml file")
        return cls._cached(shipped[str(name_or_path)], f"{SHIPPED_FOLDER}/{name_or_path}.yaml")

    @classmethod
    def _cached(cls, path: Path, source: str) -> "RuleSet":
        text = read_text(path, "rule file", RuleFileError)
        key = (str(path.resolve()), source, text)
        if key not in _LOADED:
            _LOADED[key] = cls.from_yaml(text, source=source)
        return _LOADED[key]

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "<string>") -> "RuleSet":
        fields = parse(text, source)
        return cls(**fields)

    def match(self, graph: Graph, node: Node) -> Entry | None:
        """The first entry matching ``node``."""
        return next((e for e in (*self.canonizer_entries, *self.entries) if e.matches(graph, node)), None)

    def bind(self, graph: Graph) -> Binding:
        """This rule set bound to ``graph`` (computed once per graph and rule set object)."""
        cache = graph.cache.bindings
        held = cache.get(id(self))
        if held is None or held[0] is not self:
            held = cache[id(self)] = (self, Binding(graph, self))
        return held[1]
