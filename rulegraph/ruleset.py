"""Rule files: YAML → :class:`RuleSet`, and a rule set bound to a graph → :class:`Binding`.

A rule file is an ordered list of entries; for each node that relevance reaches,
the first entry that matches gives its rule::

    name: lrp-ah-ln
    boundary: embeddings          # embeddings | inputs | {nodes: [glob, …]}
    on_unmatched: error           # error | warn | <rule name>
    rules:
      - op: MatMul                # op type(s); "*" matches any
        inputs:                   # producer patterns, by input position
          0: {from: Softmax, through: [Where, Cast, Dropout]}
        rule: ah
      - op: LayerNormalization
        rule: ln
      - op: "*"
        rule: gradient

Entries may also match on ``name`` (glob on the node name) and ``scope`` (glob on
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

import dataclasses
import typing
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import RuleFileError, RuleMatchError, choices
from .ir import Graph, Node, block_index
from .ops import lookup
from .rules import RULES, Rule

ENTRY_KEYS = ("op", "name", "scope", "inputs", "rule", "params", "per_layer", "note")
OVERRIDE_KEYS = ("blocks", "name", "scope", "params")
TOP_KEYS = ("name", "description", "pass", "models", "boundary", "on_unmatched", "canonize", "rules")
MODELS = ("transformers", "cnns")   # what a rule set is written for (`models:`, default transformers)
PASSES = ("relevance", "decomposition")   # `pass: decomposition` names rules of rulegraph.decomposition
PATTERN_KEYS = ("from", "through")
BOUNDARY_KINDS = ("embeddings", "inputs")
# index-preserving ops that may sit between an integer input and the embedding Gather
_ID_ROUTES = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten"}


@dataclass(frozen=True)
class Pattern:
    """``from``: op types (or ``input`` / ``constant``) of the producer, looking through ``through`` ops."""

    sources: tuple[str, ...]
    through: tuple[str, ...] = ()

    def matches(self, graph: Graph, value: str) -> bool:
        for _ in range(64):
            if value in graph.constant_values:
                return "constant" in self.sources
            if value in graph.input_names:
                return "input" in self.sources
            producer = graph.producer.get(value)
            if producer is None:
                return False
            if producer.op in self.sources or "*" in self.sources:
                return True
            if producer.op not in self.through:
                return False
            value = _data_input(graph, producer)
            if value is None:
                return False
        return False


def _data_input(graph: Graph, node: Node) -> str | None:
    """The input a pattern looks through to: the first data input that is not a constant."""
    candidates = node.inputs[1:] if node.op == "Where" else node.inputs
    return next((v for v in candidates if v and v not in graph.constant_values), None)


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
            b = block_index(node.scope) if node.scope else None
            b = block_index(node.name) if b is None else b
            if b is None or b not in self.blocks:
                return False
        if self.names and not any(fnmatchcase(node.name, g) for g in self.names):
            return False
        return not self.scopes or any(fnmatchcase(node.scope, g) for g in self.scopes)


@dataclass
class Entry:
    """One rule-file entry: what it matches and the rule it assigns."""

    rule: Rule
    line: int
    ops: tuple[str, ...] = ("*",)
    names: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    inputs: dict[int, Pattern] = field(default_factory=dict)
    source: str = ""
    overrides: list[Override] = field(default_factory=list)

    def assign(self, node: Node) -> tuple[Rule, str]:
        """The rule for a node this entry matched, and where it came from (``file:line``)."""
        for o in self.overrides:
            if o.matches(node):
                return o.rule, f"{self.source}:{o.line}"
        return self.rule, self.where

    def matches(self, graph: Graph, node: Node) -> bool:
        if "*" not in self.ops and node.op not in self.ops:
            return False
        if self.names and not any(fnmatchcase(node.name, g) for g in self.names):
            return False
        if self.scopes and not any(fnmatchcase(node.scope, g) for g in self.scopes):
            return False
        for k, pattern in self.inputs.items():
            if k >= len(node.inputs) or not node.inputs[k] or not pattern.matches(graph, node.inputs[k]):
                return False
        return True

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


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
            for n in graph.nodes:
                if n.op == "Gather" and len(n.inputs) > 1:
                    source = _integer_input(graph, n.inputs[1])
                    if source is not None and n.inputs[0] in graph.constants \
                            and graph.constants[n.inputs[0]].is_floating_point():
                        found[n.outputs[0]] = source
        if not found:
            raise RuleMatchError(
                "no relevance boundary: the model has no float inputs and no embedding Gather fed by an integer "
                "input; set `boundary: {nodes: [<node name glob>]}` in the rule file")
        return found


def _integer_input(graph: Graph, value: str) -> str | None:
    """The integer graph input ``value`` is (through index-preserving ops), if any."""
    for _ in range(16):
        if value in graph.input_names:
            info = next(i for i in graph.inputs if i.name == value)
            return None if info.is_float else value
        producer = graph.producer.get(value)
        if producer is None or producer.op not in _ID_ROUTES:
            return None
        value = producer.inputs[0]
    return None


#: (file, source label, text) → the RuleSet parsed from it (see RuleSet.load)
_LOADED: dict[tuple[str, str, str], "RuleSet"] = {}


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
    pass_name: str = "relevance"        # "relevance" (backward, rules.py) or "decomposition" (forward)
    canonize: tuple[str, ...] = ()      # graph rewrites before binding (rulegraph.canonize), e.g. batchnorm
    models: str = "transformers"        # what the rule set is written for: transformers | cnns

    # -- loading ---------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | Path) -> "RuleSet":
        """A shipped rule set by name (``lrp-ah-ln``) or a YAML file path.

        Loading the same file with the same text again returns the same object, so the
        graph's binding to it (:func:`rulegraph.explain.bind`) is computed once, not per call.
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
        return cls._cached(shipped[str(name_or_path)], f"rules/{name_or_path}.yaml")

    @classmethod
    def _cached(cls, path: Path, source: str) -> "RuleSet":
        text = path.read_text()
        key = (str(path.resolve()), source, text)
        if key not in _LOADED:
            _LOADED[key] = cls.from_yaml(text, source=source)
        return _LOADED[key]

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "<string>") -> "RuleSet":
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f"{source}:{mark.line + 1}" if mark else source
            raise RuleFileError(f"{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
        return _Parser(source).ruleset(root)

    # -- binding -----------------------------------------------------------------------
    def match(self, graph: Graph, node: Node) -> Entry | None:
        return next((e for e in self.entries if e.matches(graph, node)), None)

    def bind(self, graph: Graph) -> "Binding":
        return Binding(graph, self)


def shipped_rule_sets(models: str | None = "transformers") -> dict[str, Path]:
    """Name → path of the rule sets shipped in ``rules/`` written for ``models``
    (``transformers``, ``cnns``; ``None``: all) — a rule file's ``models:`` key."""
    folder = resources.files("rulegraph.rulesets")
    found = {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}
    return {k: v for k, v in found.items() if models is None or _models(v) == models}


def _models(path: Path) -> str:
    doc = yaml.safe_load(path.read_text())
    return str(doc.get("models", "transformers")) if isinstance(doc, dict) else "transformers"


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

    def __init__(self, graph: Graph, ruleset: RuleSet):
        self.graph = graph
        self.ruleset = ruleset
        self.boundary = ruleset.boundary.values(graph)
        self.tainted = _taint(graph, set(self.boundary))
        self.assignments: dict[str, Assignment] = {}
        self.unmatched: list[Node] = []
        self.reached: list[Node] = []           # in topological order
        self.carried: dict[str, list[bool]] = {}
        self._walk()

    def _walk(self) -> None:
        graph, rs = self.graph, self.ruleset
        live = {v for v in graph.outputs if v in self.tainted}
        reached = []
        for node in reversed(graph.nodes):
            if not any(v in live for v in node.outputs) or not any(v in self.tainted for v in node.inputs):
                continue
            reached.append(node)
            spec = lookup(node.op, node.domain, node=node.name, opset=graph.opset)
            tainted = [v in self.tainted for v in node.inputs]
            entry = rs.match(graph, node)
            if entry is not None:
                assignment = Assignment(*entry.assign(node))
            elif rs.fallback is not None:
                assignment = Assignment(rs.fallback, f"{rs.source}: on_unmatched")
            else:  # keep walking as if it passed relevance on, so `check` lists every node upstream too
                self.unmatched.append(node)
                live.update(v for v in node.inputs if v in self.tainted)
                continue
            why = assignment.rule.check(node, spec, tainted)
            if why is not None:
                raise RuleMatchError(f"{assignment.where}: rule {assignment.rule.name!r} cannot apply to node "
                                     f"{node.name!r} (op {node.op}): {why}")
            self.assignments[node.name] = assignment
            carried = assignment.rule.carries(node, spec, tainted)
            self.carried[node.name] = carried
            live.update(v for v, c in zip(node.inputs, carried) if c)
        self.reached = reached[::-1]
        self.unmatched.reverse()

    @property
    def needed_values(self) -> frozenset[str]:
        """What the relevance pass reads from the forward: every value a reached node touches."""
        if "_needed" not in self.__dict__:
            needed = set(self.boundary) | set(self.graph.outputs)
            for node in self.reached:
                needed.update(v for v in (*node.inputs, *node.outputs) if v)
            self._needed = frozenset(needed)
        return self._needed

    def require_complete(self) -> None:
        """Raise if a reached node has no rule and the rule set says ``on_unmatched: error``."""
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
        if any(v in tainted for v in node.inputs) and _float_output(graph, node):
            tainted.update(v for v in node.outputs if v)
    return tainted


def _float_output(graph: Graph, node: Node) -> bool:
    if node.op in ("Cast", "CastLike"):
        to = node.attrs.get("to")
        return to is None or to.is_floating_point
    return lookup(node.op, node.domain, node=node.name, opset=graph.opset).float_output


# -- parsing with line numbers ---------------------------------------------------------------

class _Parser:
    def __init__(self, source: str):
        self.source = source
        self.rules = RULES

    def _pass(self, node) -> str:
        value = str(self.scalar(node, "pass"))
        if value not in PASSES:
            raise self.fail(node, f"unknown pass {value!r}; {choices(PASSES, value)}")
        if value == "decomposition":
            from .decomposition.rules import DECOMPOSITION_RULES
            self.rules = DECOMPOSITION_RULES
        return value

    def fail(self, node: yaml.Node | None, message: str) -> RuleFileError:
        line = node.start_mark.line + 1 if node is not None else 1
        return RuleFileError(f"{self.source}:{line}: {message}")

    def mapping(self, node, what: str, keys: tuple[str, ...]) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping ({', '.join(keys)})")
        out = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key not in keys:
                raise self.fail(k, f"unknown key {key!r} in {what}; {choices(keys, key)}")
            if key in out:
                raise self.fail(k, f"key {key!r} appears twice in {what}")
            out[key] = (k, v)
        return out

    def scalar(self, node, what: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{what} must be a single value")
        return yaml.safe_load(yaml.serialize(node)) if node.tag != "tag:yaml.org,2002:str" else node.value

    def strings(self, node, what: str) -> tuple[str, ...]:
        if isinstance(node, yaml.ScalarNode):
            return (str(node.value),)
        if isinstance(node, yaml.SequenceNode) and all(isinstance(i, yaml.ScalarNode) for i in node.value):
            return tuple(str(i.value) for i in node.value)
        raise self.fail(node, f"{what} must be a string or a list of strings")

    def ruleset(self, root) -> RuleSet:
        if root is None:
            raise RuleFileError(f"{self.source}:1: the rule file is empty; it needs at least `rules:`")
        top = self.mapping(root, "the rule file", TOP_KEYS)
        if "rules" not in top:
            raise self.fail(root, "missing `rules:` (an ordered list of entries)")
        rs = RuleSet(entries=[], source=self.source)
        if "pass" in top:
            rs.pass_name = self._pass(top["pass"][1])
        RULES = self.rules
        if "name" in top:
            rs.name = str(self.scalar(top["name"][1], "name"))
        if "models" in top:
            value = str(self.scalar(top["models"][1], "models"))
            if value not in MODELS:
                raise self.fail(top["models"][1], f"unknown models {value!r}; {choices(MODELS, value)}")
            rs.models = value
        if "description" in top:
            rs.description = str(self.scalar(top["description"][1], "description"))
        if "boundary" in top:
            rs.boundary = self.boundary(top["boundary"][1])
        if "canonize" in top:
            from .canonize import CANONIZERS
            rs.canonize = self.strings(top["canonize"][1], "canonize")
            for name in rs.canonize:
                if name not in CANONIZERS:
                    raise self.fail(top["canonize"][1], f"unknown canonizer {name!r}; {choices(CANONIZERS, name)}")
        if "on_unmatched" in top:
            node = top["on_unmatched"][1]
            value = str(self.scalar(node, "on_unmatched"))
            if value not in ("error", "warn") and value not in RULES:
                raise self.fail(node, f"on_unmatched must be error, warn or a rule name; "
                                      f"{choices(['error', 'warn', *RULES], value)}")
            rs.on_unmatched = value
            if value in RULES:
                rs.fallback = RULES[value]()
        seq = top["rules"][1]
        if not isinstance(seq, yaml.SequenceNode) or not seq.value:
            raise self.fail(seq, "`rules:` must be a non-empty list of entries (each a mapping with `rule:`)")
        rs.entries = [self.entry(item) for item in seq.value]
        return rs

    def boundary(self, node) -> Boundary:
        if isinstance(node, yaml.ScalarNode):
            if node.value not in BOUNDARY_KINDS:
                raise self.fail(node, f"unknown boundary {node.value!r}; {choices([*BOUNDARY_KINDS, '{nodes: [...]}'], node.value)}")
            return Boundary(node.value)
        fields = self.mapping(node, "boundary", ("nodes",))
        if "nodes" not in fields:
            raise self.fail(node, "boundary mapping needs `nodes:` (a list of node name globs)")
        return Boundary("nodes", self.strings(fields["nodes"][1], "boundary nodes"))

    def entry(self, node) -> Entry:
        fields = self.mapping(node, "a rule entry", ENTRY_KEYS)
        RULES = self.rules
        if "rule" not in fields:
            raise self.fail(node, f"rule entry has no `rule:`; {choices(RULES)}")
        rule_node = fields["rule"][1]
        rule_name = str(self.scalar(rule_node, "rule"))
        if rule_name not in RULES:
            raise self.fail(rule_node, f"unknown rule {rule_name!r}; {choices(RULES, rule_name)}")
        cls = RULES[rule_name]
        params = self.params(cls, fields["params"][1]) if "params" in fields else {}
        rule = self.make(cls, params, fields.get("params", fields["rule"])[1])
        entry = Entry(rule=rule, line=node.start_mark.line + 1, source=self.source)
        if "per_layer" in fields:
            entry.overrides = self.per_layer(cls, params, fields["per_layer"][1])
        if "op" in fields:
            entry.ops = self.strings(fields["op"][1], "op")
        if "name" in fields:
            entry.names = self.strings(fields["name"][1], "name")
        if "scope" in fields:
            entry.scopes = self.strings(fields["scope"][1], "scope")
        if "inputs" in fields:
            entry.inputs = self.inputs(fields["inputs"][1])
        return entry

    def make(self, cls: type[Rule], params: dict[str, Any], node) -> Rule:
        try:
            return cls(**params)
        except (TypeError, ValueError) as exc:
            raise self.fail(node, f"bad params for rule {cls.name!r}: {exc}") from None

    def per_layer(self, cls: type[Rule], base: dict[str, Any], node) -> list[Override]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, "per_layer must be a non-empty list of {blocks|name|scope: …, params: {…}}")
        out = []
        for item in node.value:
            fields = self.mapping(item, "a per_layer item", OVERRIDE_KEYS)
            if "params" not in fields:
                raise self.fail(item, "a per_layer item needs `params:` (the params it changes)")
            if not ({"blocks", "name", "scope"} & set(fields)):
                raise self.fail(item, "a per_layer item needs `blocks:`, `name:` or `scope:` to say where it applies")
            params = {**base, **self.params(cls, fields["params"][1])}
            o = Override(self.make(cls, params, fields["params"][1]), item.start_mark.line + 1)
            if "blocks" in fields:
                o.blocks = self.blocks(fields["blocks"][1])
            if "name" in fields:
                o.names = self.strings(fields["name"][1], "name")
            if "scope" in fields:
                o.scopes = self.strings(fields["scope"][1], "scope")
            out.append(o)
        return out

    def blocks(self, node) -> frozenset[int]:
        """``3``, ``"0-3"`` (inclusive) or a list of those."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        out: set[int] = set()
        for item in items:
            text = str(item.value).strip() if isinstance(item, yaml.ScalarNode) else ""
            lo, sep, hi = text.partition("-")
            try:
                first, last = (int(lo), int(hi)) if sep else (int(text), int(text))
            except ValueError:
                raise self.fail(item, f"blocks must be block numbers or ranges like \"0-3\", got {text or item!r}") from None
            if first > last:
                raise self.fail(item, f"empty block range {text!r} (the first number must not exceed the last)")
            out.update(range(first, last + 1))
        return frozenset(out)

    def inputs(self, node) -> dict[int, Pattern]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, "inputs must map an input position to a pattern, e.g. `0: {from: Softmax}`")
        out = {}
        for k, v in node.value:
            try:
                index = int(k.value)
            except (TypeError, ValueError):
                raise self.fail(k, f"input position must be an integer, got {k.value!r}") from None
            fields = self.mapping(v, f"the pattern for input {index}", PATTERN_KEYS)
            if "from" not in fields:
                raise self.fail(v, "a pattern needs `from:` (op types, or `input` / `constant`)")
            out[index] = Pattern(self.strings(fields["from"][1], "from"),
                                 self.strings(fields["through"][1], "through") if "through" in fields else ())
        return out

    def params(self, cls: type[Rule], node) -> dict[str, Any]:
        declared = cls.params()
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"params must be a mapping; rule {cls.name!r} takes: "
                                  f"{', '.join(declared) or 'no params'}")
        hints = typing.get_type_hints(cls)
        out = {}
        for k, v in node.value:
            key = k.value
            if key not in declared:
                raise self.fail(k, f"rule {cls.name!r} has no param {key!r}; "
                                   f"{choices(declared, key) if declared else 'it takes no params'}")
            value = yaml.safe_load(yaml.serialize(v))
            out[key] = self.coerce(v, key, value, hints.get(key))
        return out

    def coerce(self, node, key: str, value: Any, hint) -> Any:
        origin = typing.get_origin(hint)
        if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if hint is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if hint is bool and isinstance(value, bool):
            return value
        if hint is str and isinstance(value, str):
            return value
        if origin is list:
            (item,) = typing.get_args(hint) or (Any,)
            items = value if isinstance(value, list) else [value]
            if item is float and all(isinstance(i, (int, float)) and not isinstance(i, bool) for i in items):
                return [float(i) for i in items]
            if item is Any or all(isinstance(i, item) and not isinstance(i, bool) for i in items):
                return list(items)
        if hint is None or hint is Any:
            return value
        name = getattr(hint, "__name__", str(hint))
        raise self.fail(node, f"param {key!r} must be {name}, got {value!r}")
