"""The canonizer registry: :class:`Canonizer` records, the :func:`canonizer` decorator, :func:`canonize`.

A canonizer rewrites a graph into an equivalent one the rules treat as intended. It is one function
``Graph -> Graph`` registered by name with ``@canonizer(name)``; a rule file's ``canonize:`` lists the
ones it wants, applied in order before binding. A canonizer registered ``default=True`` is applied by
every rule file (first, unless the file lists it elsewhere in ``canonize:``) and a file turns it off
with ``no_canonize: [name]``. The ops a canonizer writes may need a rule of their own: ``rules`` maps
a pass to ``{op: rule name}``, the entries a rule file gets first where it names no such op itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import RuleFileError
from ..ir import Graph
from ..registry import Registry


@dataclass(frozen=True)
class Canonizer:
    """A graph rewrite, whether every rule file applies it, and the rules of the ops it writes."""

    rewrite: Callable[[Graph], Graph]
    default: bool = False
    #: pass name → {op the rewrite writes: the rule name it gets there}
    rules: dict[str, dict[str, str]] = field(default_factory=dict)


#: name → :class:`Canonizer`; a rule file's ``canonize:`` lists names
CANONIZERS: Registry[Canonizer] = Registry("canonizer", RuleFileError)


def canonizer(name: str, *, default: bool = False,
              rules: dict[str, dict[str, str]] | None = None) -> Callable[[Callable[[Graph], Graph]], Callable]:
    """Register the decorated ``Graph -> Graph`` function as the canonizer ``name`` (see the module docstring)."""
    def register(rewrite: Callable[[Graph], Graph]) -> Callable[[Graph], Graph]:
        CANONIZERS.add(name, Canonizer(rewrite, default, dict(rules or {})))
        return rewrite
    return register


def defaults() -> tuple[str, ...]:
    """The canonizers every rule file applies unless it opts out (``no_canonize:``), in registration order."""
    return tuple(name for name, c in CANONIZERS.items() if c.default)


def canonize(graph: Graph, names: tuple[str, ...] | list[str]) -> Graph:
    """``graph`` with the named canonizers applied, in order (cached on the graph)."""
    if not names:
        return graph
    key = tuple(names)
    cache = graph.cache.canonized
    if key not in cache:
        out = graph
        for name in names:
            out = CANONIZERS.get(name).rewrite(out)
        cache[key] = out
    return cache[key]
