"""The one rule base class, and a rule registry per pass.

A rule is a small dataclass registered by name; its fields are its YAML ``params``
(checked against the declared types and domains where the rule file is read). What a
rule does to tensors depends on the pass it belongs to: a relevance rule implements
``propagate(site)`` (:mod:`rulegraph.passes.relevance`), a decomposition rule
``decompose(site)`` (:mod:`rulegraph.passes.decomposition`). What the rule-file parser
and the binding need is common to both and lives here: the ops a rule applies to
(:meth:`Rule.check`, and :meth:`Rule.check_graph` for params against the node's constants), which inputs it hands something to (:meth:`Rule.carries`), and
whether it conserves on a node (:meth:`Rule.conserves`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

from ..errors import RuleFileError
from ..ops import OpSpec
from ..registry import Registry

#: pass name → its rule registry; a rule file's ``pass:`` picks one (default ``relevance``)
RULES: dict[str, Registry[type["Rule"]]] = {
    "relevance": Registry("rule", RuleFileError),
    "decomposition": Registry("decomposition rule", RuleFileError),
}


def _registrar(registry: Registry) -> Callable[[str], Callable[[type], type]]:
    def named(name: str):
        def register(cls):
            cls = dataclass(cls)
            registry.add(name, cls)
            return cls
        return register
    return named


#: ``@relevance_rule(name)``: a rule of the relevance pass, under the name rule files use
relevance_rule = _registrar(RULES["relevance"])
#: ``@decomposition_rule(name)``: a rule of the decomposition pass
decomposition_rule = _registrar(RULES["decomposition"])


@dataclass(frozen=True)
class Domain:
    """The valid values of a numeric param: ``low ≤ x`` (or ``<`` with ``open_low``), ``x ≤ high``."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False

    def check(self, value: Any) -> str | None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if self.low is not None and (v < self.low or (self.open_low and v == self.low)):
                return f"must be {'>' if self.open_low else '≥'} {self.low:g}, got {v!r}"
            if self.high is not None and v > self.high:
                return f"must be ≤ {self.high:g}, got {v!r}"
        return None


NON_NEGATIVE = Domain(low=0.0)
UNIT = Domain(low=0.0, high=1.0)


def param(default: Any, domain: Domain | None = None, **kwargs: Any) -> Any:
    """A rule param with its default and valid domain (read by the rule-file parser)."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"domain": domain}, **kwargs)
    return dataclasses.field(default=default, metadata={"domain": domain}, **kwargs)


class Rule:
    """Base class of every rule, of every pass."""

    name: ClassVar[str] = ""
    #: op types the rule can apply to (``None``: any)
    ops: ClassVar[tuple[str, ...] | None] = None
    #: conserves on every node it applies to (``False``: see :meth:`conserves`)
    conserving: ClassVar[bool] = True
    #: how the rule departs from conservation, for the audit: what absorbs, or why it breaks
    breaking: ClassVar[str] = "conserves"

    @classmethod
    def params(cls) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(cls)}

    def check(self, node, spec: OpSpec, tainted: Sequence[bool]) -> str | None:
        """Why the rule cannot apply to this node, or ``None`` if it can."""
        if self.ops is not None and node.op not in self.ops:
            return f"it applies to {', '.join(self.ops)}"
        return None

    def check_graph(self, graph, node) -> str | None:
        """Why the rule's params do not fit this node's constants (e.g. one bound per input channel,
        read off a weight's shape), or ``None``; the binding asks it after :meth:`check`, so
        ``rulegraph check`` reports it without running the model."""
        return None

    def carries(self, node, spec: OpSpec, tainted: Sequence[bool]) -> list[bool]:
        """Which inputs receive relevance (or components): default every tainted input."""
        return list(tainted)

    def conserves(self, node, spec: OpSpec, tainted: Sequence[bool]) -> bool:
        return self.conserving

    def with_options(self, options: dict[str, Any]) -> "Rule":
        """This rule with the declared params among ``options`` replaced (the CLI's --alpha…)."""
        mine = {k: v for k, v in options.items() if k in self.params() and v is not None}
        return dataclasses.replace(self, **mine) if mine else self

    def describe(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items())
        return f"{self.name}({inner})" if inner else self.name
