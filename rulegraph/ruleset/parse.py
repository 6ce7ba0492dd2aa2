"""Rule files: YAML text → the fields of a :class:`~rulegraph.ruleset.RuleSet`, with line numbers.

The text is composed (not constructed) with PyYAML's safe loader, so every node keeps its
line, and a rule file can never execute code: only the standard tags are accepted, and
the tree a file expands to through anchors and aliases is bounded (:data:`MAX_NODES`)
before anything is built from it. Mistakes are reported as ``file:line: what was wrong;
valid: …``.
"""
from __future__ import annotations

import typing
import warnings
from types import SimpleNamespace
from typing import Any

import yaml

from .. import experts  # noqa: F401  (registers the moe-routing pattern)
from ..canonize import CANONIZERS, defaults
from ..errors import RuleFileError, choices
from ..propagation import RULES, Rule
from ..ops import REGISTRY, TRAITS
from ..patterns import PATTERNS, SPECIAL_SOURCES, Pattern
from .match import ANY, Boundary, Entry, Override

ENTRY_KEYS = ("op", "trait", "name", "scope", "inputs", "rule", "params", "per_layer", "note")
OVERRIDE_KEYS = ("blocks", "name", "scope", "params")
TOP_KEYS = ("name", "description", "pass", "models", "boundary", "on_unmatched", "canonize", "no_canonize",
            "rules")
MODELS = ("transformers", "cnns")   # what a rule set is written for (`models:`, default transformers)
PATTERN_KEYS = ("from", "through")
BOUNDARY_KINDS = ("embeddings", "inputs")
#: the most YAML nodes a rule file may expand to, aliases counted at every use
MAX_NODES = 100_000
#: tags a rule file may carry (PyYAML's safe ones)
SAFE_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq",
                                                        "timestamp", "binary", "set", "omap", "pairs"))


def parse(text: str, source: str) -> dict[str, Any]:
    """The rule set fields of a rule file's ``text``; ``source`` labels its errors."""
    return Parser(source).fields(compose(text, source))


def compose(text: str, source: str) -> Any:
    """The YAML node tree of ``text`` (safe tags only, line numbers kept); invalid YAML is an error at
    ``source:line``."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{source}:{mark.line + 1}" if mark else source
        raise RuleFileError(f"{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None


class Parser:
    """Reads one rule file's composed YAML tree; every error names ``file:line``."""

    def __init__(self, source: str):
        self.source = source
        self.pass_name = "relevance"
        self.rules = RULES[self.pass_name]

    def _pass(self, node) -> str:
        value = str(self.scalar(node, "pass"))
        if value not in RULES:
            raise self.fail(node, f"unknown pass {value!r}; {choices(RULES, value)}")
        self.rules = RULES[value]
        self.pass_name = value
        return value

    def check_tree(self, root) -> None:
        """Refuse unsafe tags and trees that expand past :data:`MAX_NODES` (alias bombs)."""
        sizes: dict[int, int] = {}

        def size(node) -> int:
            if id(node) in sizes:
                return sizes[id(node)]
            if node.tag not in SAFE_TAGS:
                raise self.fail(node, f"tag {node.tag!r} is not allowed in a rule file (only plain YAML values)")
            sizes[id(node)] = 1        # a recursive alias counts once while it is being sized
            if isinstance(node, yaml.MappingNode):
                n = 1 + sum(size(k) + size(v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                n = 1 + sum(size(v) for v in node.value)
            else:
                n = 1
            if n > MAX_NODES:
                raise self.fail(node, f"the rule file expands to more than {MAX_NODES:,} YAML nodes "
                                      "(anchors and aliases counted at every use)")
            sizes[id(node)] = n
            return n
        size(root)

    def value(self, node) -> Any:
        """A composed node as a Python value (safe tags only, already checked)."""
        return yaml.safe_load(yaml.serialize(node))

    def current(self, node, name: str) -> str:
        """A rule's name now: a renamed one is taken, with a warning naming the rule file's line."""
        new = self.rules.renamed.get(name)
        if new is None:
            return name
        warnings.warn(f"{self.source}:{node.start_mark.line + 1}: rule {name!r} is now {new!r}; the old name will be "
                      "removed", stacklevel=2)
        return new

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
        return self.value(node) if node.tag != "tag:yaml.org,2002:str" else node.value

    def strings(self, node, what: str) -> tuple[str, ...]:
        if isinstance(node, yaml.ScalarNode):
            return (str(node.value),)
        if isinstance(node, yaml.SequenceNode) and all(isinstance(i, yaml.ScalarNode) for i in node.value):
            return tuple(str(i.value) for i in node.value)
        raise self.fail(node, f"{what} must be a string or a list of strings")

    def fields(self, root) -> dict[str, Any]:
        """The :class:`~rulegraph.ruleset.RuleSet` fields a rule file sets."""
        if root is None:
            raise RuleFileError(f"{self.source}:1: the rule file is empty; it needs at least `rules:`")
        self.check_tree(root)
        top = self.mapping(root, "the rule file", TOP_KEYS)
        if "rules" not in top:
            raise self.fail(root, "missing `rules:` (an ordered list of entries)")
        rs = SimpleNamespace(source=self.source)
        if "pass" in top:
            rs.pass_name = self._pass(top["pass"][1])
        rules = self.rules
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
        rs.canonize = self.canonize(top)
        if "on_unmatched" in top:
            node = top["on_unmatched"][1]
            value = self.current(node, str(self.scalar(node, "on_unmatched")))
            if value not in ("error", "warn") and value not in rules:
                raise self.fail(node, f"on_unmatched must be error, warn or a rule name; "
                                      f"{choices(['error', 'warn', *rules], value)}")
            rs.on_unmatched = value
            if value in rules:
                rs.fallback = rules.get(value)()
        seq = top["rules"][1]
        if not isinstance(seq, yaml.SequenceNode) or not seq.value:
            raise self.fail(seq, "`rules:` must be a non-empty list of entries (each a mapping with `rule:`)")
        rs.entries = self.entries(seq.value)
        rs.canonizer_entries = self.canonizer_entries(rs.canonize, rs.entries)
        return vars(rs)

    def canonize(self, top) -> tuple[str, ...]:
        """The canonizers applied, in order: the default ones (:func:`rulegraph.canonize.defaults`) the
        file neither lists nor turns off (``no_canonize:``), then those ``canonize:`` lists."""
        listed = self.known(top["canonize"][1], "canonize", "canonizer", CANONIZERS) if "canonize" in top else ()
        off: tuple[str, ...] = ()
        if "no_canonize" in top:
            node = top["no_canonize"][1]
            off = self.strings(node, "no_canonize")
            for name in off:
                if name not in defaults():
                    raise self.fail(node, f"no_canonize: {name!r} is not a canonizer applied by default (only those "
                                          f"can be turned off; the others apply only where `canonize:` lists them); "
                                          f"{choices(defaults(), name)}")
                if name in listed:
                    raise self.fail(node, f"canonizer {name!r} is both in `canonize:` and in `no_canonize:`")
        return tuple(n for n in defaults() if n not in listed and n not in off) + listed

    def canonizer_entries(self, names: tuple[str, ...], entries: list[Entry]) -> list[Entry]:
        """The entries the applied canonizers give the ops they write (:attr:`Canonizer.rules
        <rulegraph.canonize.Canonizer.rules>`) in this pass, matched before the file's, for the ops no
        entry of the file names (an entry naming one is the file's own choice)."""
        named = {op for e in entries for op in e.ops}
        out = []
        for name in names:
            for op_type, rule in CANONIZERS.get(name).rules.get(self.pass_name, {}).items():
                if op_type not in named:
                    out.append(Entry(rule=self.rules.get(rule)(), line=0, source=self.source, ops=(op_type,),
                                     label=f"canonizer {name}"))
        return out

    def entries(self, items) -> list[Entry]:
        """Every entry, or one error naming each entry that is wrong (entries are read independently,
        so one run of ``rulegraph check`` lists every bad rule name, param or pattern)."""
        entries, errors = [], []
        for item in items:
            try:
                entries.append(self.entry(item))
            except RuleFileError as exc:
                errors.append(str(exc))
        if errors:
            more = f" (and {len(errors) - 1} more: {'; '.join(errors[1:])})" if len(errors) > 1 else ""
            raise RuleFileError(errors[0] + more)
        return entries

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
        rules = self.rules
        if "rule" not in fields:
            raise self.fail(node, f"rule entry has no `rule:`; {choices(rules)}")
        rule_node = fields["rule"][1]
        rule_name = self.current(rule_node, str(self.scalar(rule_node, "rule")))
        if rule_name not in rules:
            raise self.fail(rule_node, f"unknown rule {rule_name!r}; {choices(rules, rule_name)}")
        cls = rules.get(rule_name)
        params = self.params(cls, fields["params"][1]) if "params" in fields else {}
        rule = self.make(cls, params, fields.get("params", fields["rule"])[1])
        entry = Entry(rule=rule, line=node.start_mark.line + 1, source=self.source)
        if "per_layer" in fields:
            entry.overrides = self.per_layer(cls, params, fields["per_layer"][1])
        if "op" in fields:
            entry.ops = self.ops(fields["op"][1], "op", ("*",))
        if "trait" in fields:
            entry.traits = self.known(fields["trait"][1], "trait", "op trait", TRAITS)
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

    def inputs(self, node) -> dict[int | str, Pattern]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, "inputs must map an input position (or `any`) to a pattern, e.g. "
                                  "`0: {from: Softmax}`")
        out = {}
        for k, v in node.value:
            try:
                index = ANY if k.value == ANY else int(k.value)
            except (TypeError, ValueError):
                raise self.fail(k, f"input position must be an integer or `{ANY}` (some input), "
                                   f"got {k.value!r}") from None
            fields = self.mapping(v, f"the pattern for input {index}", PATTERN_KEYS)
            if "from" not in fields:
                raise self.fail(v, "a pattern needs `from:` (op types, or `input` / `constant`, or a named pattern)")
            sources = self.ops(fields["from"][1], "from", (*SPECIAL_SOURCES, *TRAITS, *PATTERNS))
            if any(name in PATTERNS for name in sources):
                if len(sources) > 1 or "through" in fields:
                    raise self.fail(fields["from"][1], f"from: a named pattern ({', '.join(PATTERNS)}) stands alone: "
                                                       "it says what it looks through; no other names, no `through:`")
                out[index] = PATTERNS.get(sources[0])
                continue
            out[index] = Pattern(sources, self.ops(fields["through"][1], "through", TRAITS) if "through" in fields else ())
        return out

    def known(self, node, what: str, noun: str, valid) -> tuple[str, ...]:
        """Names from a closed set (``valid``): an unknown one is an error naming the valid ones."""
        names = self.strings(node, what)
        for name in names:
            if name not in valid:
                raise self.fail(node, f"unknown {noun} {name!r}; {choices(valid, name)}")
        return names

    def ops(self, node, what: str, words: tuple[str, ...]) -> tuple[str, ...]:
        """Op types (as registered, e.g. ``Softmax``), or the lowercase ``words`` this key also takes
        (op traits, ``input``, ``constant``, ``*``): a misspelt op is an error, not a silent non-match."""
        names = self.strings(node, what)
        known = {op for _, op in REGISTRY}
        for name in names:
            if name not in known and name not in words:
                raise self.fail(node, f"{what}: {name!r} is neither an op rulegraph implements nor one of "
                                      f"{', '.join(words)}; {choices([*known, *words], name)}")
        return names

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
            value = self.coerce(v, key, self.value(v), hints.get(key))
            domain = declared[key].metadata.get("domain")
            why = domain.check(value) if domain is not None else None
            if why is not None:
                raise self.fail(v, f"param {key!r} of rule {cls.name!r} {why}")
            out[key] = value
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
