"""Search spaces: which rules and which param ranges a tuning may choose, per rule-file entry.

A search space is a YAML file beside the rule files. Each item of ``space:`` selects nodes with
the vocabulary of a rule-file entry (``op``, ``trait``, ``name``, ``scope``, ``inputs``) and says
what may be chosen for them: ``choose`` maps each candidate rule to its params, each a fixed value
or a range; ``per_layer`` items (``blocks``, ``name`` or ``scope``) give params of their own to
some of those nodes, e.g. a composite by depth (Montavon et al. 2019, "Layer-wise relevance
propagation: an overview", in *Explainable AI*, LNCS 11700, Sec. 10.2: γ in the lower layers, ε
in the middle, ε → 0 at the top)::

    name: transformers
    space:
      - id: linear                      # names the trial's params (linear.rule, linear.epsilon.epsilon)
        op: Add
        inputs: {1: {from: constant}}
        choose:
          epsilon: {epsilon: {log: [1.0e-9, 1.0]}}      # ε log-uniform
          gradient: {}
      - op: Conv
        choose:
          gamma: {gamma: {uniform: [0.0, 1.0]}}
          alphabeta: {alpha: {choice: [1.0, 2.0]}, beta: {choice: [0.0, 1.0]}}
        per_layer:
          - {blocks: "0-1", params: {gamma: {uniform: [0.25, 1.0]}}}
          - {depth: "50-100%", params: {gamma: {uniform: [0.0, 0.25]}}}

A ``depth`` range names blocks by where they sit in the model, whatever its depth: block ``i`` of ``n``
is in ``"a-b%"`` when its middle, ``100·(i + ½)/n``, is at least ``a`` and below ``b`` (``"0-50%"`` and
``"50-100%"`` are the halves of any model, the upper one holding the middle block of an odd count). The
tuning writes it into the tuned file as the block numbers of the model it tunes
(:meth:`Space.at_depth`).

Ranges: ``{log: [low, high]}`` (log-uniform), ``{uniform: [low, high]}``, ``{int: [low, high]}``,
``{choice: [a, b, …]}``, ``{zero-or-log: [low, high]}`` (0, or log-uniform: LRP-γ with γ = 0 is LRP-0,
so one part of a composite keeps the z-rule while another samples a γ); any other value is fixed. A
trial's choice becomes a rule file derived from the starting one (:meth:`Space.rule_text`): an entry of
the starting file with the same selectors is overridden in place (so the entries before it still match
first); a space entry whose selectors no entry has goes first (the first matching entry gives a node its
rule). The result loads like any rule file (:meth:`rulegraph.ruleset.RuleSet.load`). Before a search,
:meth:`Space.inert` names what the space samples that changes no rule of the model.

The file is read as rule files are (:mod:`rulegraph.ruleset.parse`): composed safely, every
mistake reported as ``file:line: what was wrong; valid: …``.
"""
from __future__ import annotations

import hashlib
import json
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import InputError, RuleFileError, choices, read_text
from ..propagation import RULES, Rule
from ..rules import shipped_spaces
from ..ruleset.parse import MODELS, Parser, compose

SELECTORS = ("op", "trait", "name", "scope", "inputs")
ITEM_KEYS = ("id", *SELECTORS, "choose", "per_layer", "note")
TOP_KEYS = ("name", "description", "models", "pass", "space")
LAYER_KEYS = ("blocks", "depth", "name", "scope", "params")
WHERE = ("blocks", "depth", "name", "scope")
#: significant digits a sampled number is rounded to (a tuned file a person reads; the file is what is scored)
DIGITS = 4


def rounded(x: float) -> float:
    """``x`` to :data:`DIGITS` significant digits."""
    return float(f"{x:.{DIGITS}g}") if x else 0.0


#: range kind (``{kind: [...]}``) → how a trial samples it (``s``: a :class:`Sampler`, ``v``: the list given).
#: ``zero-or-log``: 0 or log-uniform in [low, high], a choice sampled first (``KEY.zero``): LRP-γ with γ = 0 is
#: LRP-0, so a part of a composite may keep the z-rule while another takes a γ
KINDS: dict[str, Callable[["Sampler", str, tuple], Any]] = {
    "log": lambda s, key, v: rounded(s.float(key, *v, log=True)),
    "uniform": lambda s, key, v: rounded(s.float(key, *v)),
    "int": lambda s, key, v: s.int(key, *v),
    "choice": lambda s, key, v: s.categorical(key, list(v)),
    "zero-or-log": lambda s, key, v: 0.0 if s.categorical(f"{key}.zero", [True, False]) else
    rounded(s.float(key, *v, log=True)),
}


@dataclass(frozen=True)
class Param:
    """One param of one candidate rule: a fixed value, or a range to sample."""

    name: str
    kind: str                   # fixed | log | uniform | int | choice
    value: Any = None           # fixed: the value; ranges: [low, high] or the choices

    def sample(self, sampler: "Sampler", key: str) -> Any:
        return self.value if self.kind == "fixed" else KINDS[self.kind](sampler, key, self.value)

    def names(self, key: str) -> list[str]:
        """What a trial samples for it under ``key``, as Optuna names it."""
        return [] if self.kind == "fixed" else [f"{key}.zero", key] if self.kind == "zero-or-log" else [key]

    def probes(self, key: str) -> list[dict[str, Any]]:
        """Picks (sampled name → value) trying each of its values: each choice, or the ends of the range
        (and 0 for ``zero-or-log``)."""
        if self.kind == "zero-or-log":
            return [{f"{key}.zero": True}, *({f"{key}.zero": False, key: v} for v in self.value)]
        return [{key: v} for v in self.value]


@dataclass
class Layer:
    """A ``per_layer`` item of a space entry: where (``blocks`` / ``depth`` / ``name`` / ``scope``, as written)
    and its params."""

    where: dict[str, Any]
    params: dict[str, Param]
    line: int


def depth_range(text: str) -> tuple[float, float] | None:
    """``"a-b%"`` as ``(a, b)``, 0 ≤ a < b ≤ 100; ``None`` where the text is not such a range."""
    lo, sep, hi = text.strip().removesuffix("%").partition("-")
    try:
        a, b = float(lo), float(hi)
    except ValueError:
        return None
    return (a, b) if sep and text.strip().endswith("%") and 0 <= a < b <= 100 else None


def depth_blocks(text: str, blocks: int) -> list[int]:
    """The blocks of an ``n``-block model (``blocks``) a ``depth`` range holds: those whose middle,
    ``100·(i + ½)/n``, is in ``[a, b)``."""
    a, b = depth_range(text)
    return [i for i in range(blocks) if a <= 100 * (i + 0.5) / blocks < b]


@dataclass
class Item:
    """One space entry: the selectors (as the rule file writes them), the candidate rules and their params."""

    id: str
    selectors: dict[str, Any]
    choose: dict[str, dict[str, Param]]
    layers: list[Layer] = field(default_factory=list)
    line: int = 0


class Suggest(typing.Protocol):
    """What samples a choice (an Optuna trial has these three)."""

    def suggest_categorical(self, name: str, choices: list) -> Any: ...
    def suggest_int(self, name: str, low: int, high: int) -> int: ...
    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...


@dataclass
class Sampler:
    """A :class:`Suggest` (an Optuna trial) seen through the three calls :class:`Param` makes."""

    trial: Any

    def categorical(self, key: str, values: list) -> Any:
        return self.trial.suggest_categorical(key, values)

    def int(self, key: str, low: int, high: int) -> int:
        return self.trial.suggest_int(key, low, high)

    def float(self, key: str, low: float, high: float, log: bool = False) -> float:
        return self.trial.suggest_float(key, low, high, log=log)


@dataclass
class Space:
    """A parsed search space (:func:`parse`)."""

    items: list[Item]
    name: str = ""
    description: str = ""
    models: str = "transformers"
    pass_name: str = "relevance"
    source: str = ""

    def digest(self) -> str:
        """SHA-256 of what the space samples and where (its models, pass, entries, candidate rules, params and
        layers), not of how its file reads: a comment, a description or a line moved leaves it as it was."""
        def params(ps: dict[str, Param]) -> dict:
            return {k: [p.kind, p.value] for k, p in ps.items()}
        content = [self.models, self.pass_name,
                   [[i.id, i.selectors, {rule: params(ps) for rule, ps in i.choose.items()},
                     [[layer.where, params(layer.params)] for layer in i.layers]] for i in self.items]]
        return hashlib.sha256(json.dumps(content, sort_keys=True, default=repr).encode()).hexdigest()

    def at_depth(self, blocks: int) -> "Space":
        """The space for a model of ``blocks`` transformer blocks: each ``depth`` range of a ``per_layer`` item
        written as the block numbers it holds there (:func:`depth_blocks`); an error, naming the space's line,
        where one holds none or the model numbers no blocks."""
        items = []
        for item in self.items:
            layers = []
            for layer in item.layers:
                if "depth" in layer.where:
                    held = depth_blocks(layer.where["depth"], blocks)
                    if not held:
                        what = "numbers no transformer blocks" if not blocks else f"has {blocks} block(s)"
                        raise InputError(f"{self.source}:{layer.line}: depth {layer.where['depth']!r} holds no block: "
                                         f"the model {what}; widen the range or give blocks")
                    where = {k: v for k, v in layer.where.items() if k != "depth"}
                    layer = replace(layer, where={"blocks": f"{held[0]}-{held[-1]}", **where})
                layers.append(layer)
            items.append(replace(item, layers=layers))
        return replace(self, items=items)

    def conserving(self) -> "Space":
        """The space restricted to rules that can conserve (``--conserving``): a rule that never
        conserves on any node (``softmax``, ``stop``) is dropped; an entry left with none is an error."""
        items = []
        for item in self.items:
            kept = {r: p for r, p in item.choose.items() if can_conserve(RULES[self.pass_name].get(r))}
            if not kept:
                raise RuleFileError(f"{self.source}:{item.line}: entry {item.id!r} offers no rule that conserves "
                                    f"({', '.join(item.choose)}); drop --conserving or add one")
            items.append(replace(item, choose=kept))
        return replace(self, items=items)

    def sample(self, trial: Suggest) -> dict[str, dict[str, Any]]:
        """A trial's choice: entry id → {rule, params, layers} (an Optuna trial samples it)."""
        s = Sampler(trial)
        out = {}
        for item in self.items:
            rule = s.categorical(f"{item.id}.rule", list(item.choose)) if len(item.choose) > 1 else next(iter(item.choose))
            params = {p.name: p.sample(s, f"{item.id}.{rule}.{p.name}") for p in item.choose[rule].values()}
            declared = RULES[self.pass_name].get(rule).params()
            layers = [{**layer.where, "params": {p.name: p.sample(s, f"{item.id}.layer{k}.{p.name}")
                                                 for p in layer.params.values() if p.name in declared}}
                      for k, layer in enumerate(item.layers)]
            out[item.id] = {"rule": rule, "params": params, "layers": [l for l in layers if l["params"]]}
        return out

    def rule_text(self, start: str, chosen: dict[str, dict[str, Any]], *, name: str, description: str,
                  header: str = "") -> str:
        """The rule file of a choice (:meth:`sample`), derived from the starting rule file's text
        ``start`` (see the module docstring): its settings kept, ``name`` and ``description`` its
        own. ``header``: comment lines on top."""
        doc = yaml.safe_load(start)
        entries = {}
        for item in self.items:
            c = chosen[item.id]
            entry = {**item.selectors, "rule": c["rule"]}
            if c["params"]:
                entry["params"] = c["params"]
            if c["layers"]:
                entry["per_layer"] = c["layers"]
            entries[selector_key(item.selectors)] = entry
        rules, placed = [], set()
        for e in doc["rules"]:
            key = selector_key({k: e[k] for k in SELECTORS if k in e})
            if key in entries and key not in placed:
                rules.append(entries[key])      # the starting file's entry for these nodes, overridden in place
                placed.add(key)
            elif key not in entries:
                rules.append(e)
        rules = [e for k, e in entries.items() if k not in placed] + rules      # new selectors: matched first
        out = {"name": name, "description": description,
               **{k: v for k, v in doc.items() if k not in ("name", "description", "rules")},
               "rules": rules}
        text = yaml.dump(out, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110, default_flow_style=None)
        lines = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
        return lines + text

    def inert(self, graph, start: str) -> list[tuple[str, int]]:
        """What a trial samples (:meth:`names`: an entry's rule, a param, a ``per_layer`` item's param) that
        changes no rule of ``graph``'s nodes, with its line: each of its choices, or each end of its range,
        binds the same rules to the same nodes (:class:`~rulegraph.ruleset.Binding`), the rest held at their
        first choice and low end, or with one other entry moved to each other rule it offers (an attention
        treatment decides whether the softmax is reached at all). Such a sample selects no node of this model
        (the entry's op is not there, an earlier entry of the starting rule set takes its nodes, its
        ``per_layer`` items cover them all): it cannot move a score. ``start``: the starting rule file's text."""
        from ..ruleset import RuleSet
        contexts = [{}] + [{f"{item.id}.rule": rule} for item in self.items for rule in list(item.choose)[1:]]
        bindings: dict[str, tuple] = {}

        def bound(picks: dict[str, Any]) -> tuple:
            text = self.rule_text(start, self.sample(_Picks(picks)), name="probe", description="")
            if text not in bindings:
                binding = RuleSet.from_yaml(text).bind(graph)
                bindings[text] = tuple((name, repr(a.rule)) for name, a in binding.assignments.items())
            return bindings[text]
        out = []
        for name, line, variants in self._probes():
            item = name.partition(".")[0]
            if not any(len({bound({**context, **variant}) for variant in variants}) > 1
                       for context in contexts if f"{item}.rule" not in context):
                out.append((name, line))
        return out

    def _probes(self) -> list[tuple[str, int, list[dict[str, Any]]]]:
        """Each sampled name of :meth:`names`, its line, and the picks that try each of its values (a range:
        its two ends)."""
        out = []
        for item in self.items:
            rule = f"{item.id}.rule"
            if len(item.choose) > 1:
                out.append((rule, item.line, [{rule: r} for r in item.choose]))
            for r, params in item.choose.items():
                out += [(f"{item.id}.{r}.{p.name}", item.line, [{rule: r, **picks}
                                                                 for picks in p.probes(f"{item.id}.{r}.{p.name}")])
                        for p in params.values() if p.kind != "fixed"]
            for k, layer in enumerate(item.layers):
                for p in (p for p in layer.params.values() if p.kind != "fixed"):
                    name = f"{item.id}.layer{k}.{p.name}"
                    owners = [r for r in item.choose if p.name in RULES[self.pass_name].get(r).params()]
                    out.append((name, layer.line, [{rule: r, **picks} for r in owners for picks in p.probes(name)]))
        return out

    def names(self) -> list[str]:
        """The params a trial may sample, as Optuna names them (``linear.epsilon.epsilon``)."""
        out = []
        for item in self.items:
            if len(item.choose) > 1:
                out.append(f"{item.id}.rule")
            out += [n for r, ps in item.choose.items() for p in ps.values() for n in p.names(f"{item.id}.{r}.{p.name}")]
            out += [n for k, layer in enumerate(item.layers) for p in layer.params.values()
                    for n in p.names(f"{item.id}.layer{k}.{p.name}")]
        return out


@dataclass
class _Picks:
    """A :class:`Suggest` taking the given values (``picks``: sampled name → value) and otherwise the first of
    every choice and the low end of every range: :meth:`Space.inert`'s probes."""

    picks: dict[str, Any]

    def suggest_categorical(self, name: str, choices: list) -> Any:
        return self.picks.get(name, choices[0])

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return self.picks.get(name, low)

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        return self.picks.get(name, low)


def can_conserve(cls: type[Rule]) -> bool:
    """Whether a rule conserves on some node: by its class, or by a node-dependent test of its own."""
    return cls.conserving or cls.conserves is not Rule.conserves


def selector_key(selectors: dict[str, Any]) -> str:
    """The selectors in one canonical form (a single op and a one-item list are the same)."""
    def norm(v):
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
        if isinstance(v, (list, tuple)):
            return sorted(str(x) for x in v)
        return [str(v)]
    return repr({k: norm(v) for k, v in sorted(selectors.items())})


class _Dumper(yaml.SafeDumper):
    """Floats written so that YAML reads them back as floats (``1.0e-06``, never ``1e-06``, a string to YAML 1.1)."""


def _float(dumper: yaml.SafeDumper, value: float) -> yaml.Node:
    text = repr(value)
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exp = text.split("e")
        text = f"{mantissa}.0e{exp}"
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


_Dumper.add_representer(float, _float)


def load(path) -> Space:
    """The search space in a YAML file (``file:line`` errors)."""
    from pathlib import Path
    path = Path(path)
    return parse(read_text(path, "search space", RuleFileError), str(path))


def parse(text: str, source: str = "<string>") -> Space:
    """The search space of a YAML text; ``source`` labels its errors."""
    return SpaceParser(source).space(compose(text, source))


class SpaceParser(Parser):
    """A rule-file parser reading a search space: the same checks of op names, traits, patterns, blocks."""

    def space(self, root) -> Space:
        if root is None:
            raise RuleFileError(f"{self.source}:1: the search space is empty; it needs `space:`")
        self.check_tree(root)
        top = self.mapping(root, "the search space", TOP_KEYS)
        if "space" not in top:
            raise self.fail(root, "missing `space:` (a list of entries, each with `choose:`)")
        if "pass" in top:
            self._pass(top["pass"][1])
        out = Space([], source=self.source, pass_name=self.pass_name)
        if "name" in top:
            out.name = str(self.scalar(top["name"][1], "name"))
        if "description" in top:
            out.description = str(self.scalar(top["description"][1], "description"))
        if "models" in top:
            node = top["models"][1]
            out.models = str(self.scalar(node, "models"))
            if out.models not in MODELS:
                raise self.fail(node, f"unknown models {out.models!r}; {choices(MODELS, out.models)}")
        seq = top["space"][1]
        if not isinstance(seq, yaml.SequenceNode) or not seq.value:
            raise self.fail(seq, "`space:` must be a non-empty list of entries (each a mapping with `choose:`)")
        for k, node in enumerate(seq.value):
            out.items.append(self.item(node, k))
        seen: dict[str, int] = {}
        for item in out.items:
            if item.id in seen:
                raise RuleFileError(f"{self.source}:{item.line}: id {item.id!r} is already the id of the entry on "
                                    f"line {seen[item.id]}; give each entry its own")
            seen[item.id] = item.line
        return out

    def item(self, node, k: int) -> Item:
        fields = self.mapping(node, "a search-space entry", ITEM_KEYS)
        if "choose" not in fields:
            raise self.fail(node, f"a search-space entry needs `choose:` (candidate rule → params); {choices(self.rules)}")
        if not set(SELECTORS) & set(fields):
            raise self.fail(node, f"a search-space entry needs a selector ({', '.join(SELECTORS)}) saying which nodes "
                                  "it tunes")
        item_id = str(self.scalar(fields["id"][1], "id")) if "id" in fields else f"e{k}"
        if not item_id or any(c in item_id for c in ". \t"):
            raise self.fail(fields["id"][1], f"id {item_id!r} must be a word without dots or spaces")
        selectors = self.selectors(fields)
        choose_node = fields["choose"][1]
        if not isinstance(choose_node, yaml.MappingNode) or not choose_node.value:
            raise self.fail(choose_node, f"choose: must map each candidate rule to its params, e.g. "
                                         f"`epsilon: {{epsilon: {{log: [1.0e-9, 1.0]}}}}`; {choices(self.rules)}")
        choose: dict[str, dict[str, Param]] = {}
        for key, value in choose_node.value:
            rule = self.current(key, str(self.scalar(key, "a rule name")))
            if rule not in self.rules:
                raise self.fail(key, f"unknown rule {rule!r}; {choices(self.rules, rule)}")
            if rule in choose:
                raise self.fail(key, f"rule {rule!r} is offered twice in this entry")
            cls = self.rules.get(rule)
            choose[rule] = self.ranges(cls, value)
        layers = self.layers(fields["per_layer"][1], choose) if "per_layer" in fields else []
        return Item(item_id, selectors, choose, layers, node.start_mark.line + 1)

    def selectors(self, fields) -> dict[str, Any]:
        """The entry's selectors, checked as a rule file's are, as plain values to write into a rule file."""
        if "op" in fields:
            self.ops(fields["op"][1], "op", ("*",))
        if "trait" in fields:
            from ..ops import TRAITS
            self.known(fields["trait"][1], "trait", "op trait", TRAITS)
        for key in ("name", "scope"):
            if key in fields:
                self.strings(fields[key][1], key)
        if "inputs" in fields:
            self.inputs(fields["inputs"][1])
        return {k: self.value(fields[k][1]) for k in SELECTORS if k in fields}

    def layers(self, node, choose: dict[str, dict[str, Param]]) -> list[Layer]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, "per_layer must be a non-empty list of {blocks|depth|name|scope: …, params: {…}}")
        out = []
        offered = {n: self.rules.get(r) for r in choose for n in self.rules.get(r).params()}
        for item in node.value:
            fields = self.mapping(item, "a per_layer item", LAYER_KEYS)
            if "params" not in fields:
                raise self.fail(item, "a per_layer item needs `params:` (the params it samples)")
            if not set(WHERE) & set(fields):
                raise self.fail(item, "a per_layer item needs `blocks:`, `depth:`, `name:` or `scope:` to say where "
                                      "it applies")
            if "blocks" in fields and "depth" in fields:
                raise self.fail(fields["depth"][1], "give `blocks:` or `depth:`, not both")
            if "blocks" in fields:
                self.blocks(fields["blocks"][1])
            if "depth" in fields:
                text = self.scalar(fields["depth"][1], "a depth range")
                if depth_range(str(text)) is None:
                    raise self.fail(fields["depth"][1], f"depth must be a range of percent like \"0-50%\" "
                                                        f"(0 ≤ first < last ≤ 100), got {text!r}")
            where = {k: self.value(fields[k][1]) for k in WHERE if k in fields}
            params = self.ranges(None, fields["params"][1], offered)
            out.append(Layer(where, params, item.start_mark.line + 1))
        return out

    def ranges(self, cls: type[Rule] | None, node, offered: dict[str, type[Rule]] | None = None) -> dict[str, Param]:
        """Param name → :class:`Param` for rule ``cls`` (or, in a per_layer item, for whichever candidate rule
        declares it: ``offered``); every value and range end checked against the param's type and domain."""
        if not isinstance(node, yaml.MappingNode):
            what = f"rule {cls.name!r} takes: {', '.join(cls.params()) or 'no params'}" if cls else "a mapping"
            raise self.fail(node, f"params must be a mapping; {what}")
        out = {}
        for k, v in node.value:
            key = k.value
            owner = cls if cls is not None else (offered or {}).get(key)
            if owner is None or key not in owner.params():
                valid = list(cls.params()) if cls is not None else list(offered or {})
                whose = f"rule {cls.name!r}" if cls is not None else "no candidate rule of this entry"
                raise self.fail(k, f"{whose} has no param {key!r}; "
                                   f"{choices(valid, key) if valid else 'it takes no params'}")
            out[key] = self.param(owner, key, v)
        return out

    def param(self, cls: type[Rule], key: str, node) -> Param:
        hint = typing.get_type_hints(cls).get(key)
        if isinstance(node, yaml.MappingNode) and len(node.value) == 1 and \
                isinstance(node.value[0][0], yaml.ScalarNode) and node.value[0][0].value in KINDS:
            kind_node, values = node.value[0]
            kind = kind_node.value
            if not isinstance(values, yaml.SequenceNode) or not values.value:
                raise self.fail(values, f"{kind}: needs a list ({'[low, high]' if kind != 'choice' else '[a, b, …]'})")
            items = [self.checked(cls, key, item, hint) for item in values.value]
            if kind == "choice":
                return Param(key, kind, tuple(items))
            if len(items) != 2:
                raise self.fail(values, f"{kind}: needs [low, high], got {len(items)} values")
            low, high = items
            numeric = (int,) if kind == "int" else (int, float)
            if not all(isinstance(x, numeric) and not isinstance(x, bool) for x in items):
                raise self.fail(values, f"{kind}: needs {'integers' if kind == 'int' else 'numbers'}, got {items}")
            if not low < high:
                raise self.fail(values, f"{kind}: [{low}, {high}] is empty; low must be under high")
            if kind in ("log", "zero-or-log") and low <= 0:
                raise self.fail(values, f"{kind}: [{low}, {high}] needs low > 0 (log-uniform)")
            return Param(key, kind, (low, high) if kind == "int" else (float(low), float(high)))
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            raise self.fail(node, f"a param range is one of {{kind: [...]}} with kind in {', '.join(KINDS)}; got "
                                  f"{', '.join(map(repr, keys)) or 'an empty mapping'}")
        return Param(key, "fixed", self.checked(cls, key, node, hint))

    def checked(self, cls: type[Rule], key: str, node, hint) -> Any:
        value = self.coerce(node, key, self.value(node), hint)
        domain = cls.params()[key].metadata.get("domain")
        why = domain.check(value) if domain is not None else None
        if why is not None:
            raise self.fail(node, f"param {key!r} of rule {cls.name!r} {why}")
        return value


def default_space(models: str) -> str:
    """The path of the shipped search space for ``models`` (``transformers``, ``cnns``)."""
    if models not in MODELS:
        raise RuleFileError(f"no search space for models {models!r}; {choices(MODELS, models)}")
    return str(shipped_spaces()[models])


def space_path(given: str) -> str:
    """A search space as ``--space`` takes it: a YAML file, or the name of a shipped one
    (:func:`rulegraph.rules.shipped_spaces`); anything else is refused naming both."""
    if Path(given).is_dir():
        raise InputError(f"--space {given} is a directory; give a file or a shipped space's name")
    if Path(given).is_file():
        return given
    shipped = shipped_spaces()
    if given in shipped:
        return str(shipped[given])
    raise InputError(f"--space file not found: {given}; shipped spaces: {', '.join(shipped)}")
