"""One registry pattern for every extension point: passes, rules, canonizers, baselines, metrics.

A :class:`Registry` maps names to what was registered under them, in registration order
(never hash order), refuses a name registered twice, and answers an unknown name with a
one-line error listing the valid choices::

    PASSES = Registry("pass")

    @PASSES.register("relevance")
    class RelevancePass(Pass): ...

    PASSES.get("relevanse")   # RulegraphError: unknown pass 'relevanse'; did you mean 'relevance'? valid: …
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from .errors import RulegraphError, choices

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → item, in registration order."""

    def __init__(self, noun: str, error: type[RulegraphError] = RulegraphError):
        self.noun = noun
        self.error = error
        self._items: dict[str, T] = {}
        #: names renamed, still found (with a warning) for one release: old name → new name
        self.renamed: dict[str, str] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator registering its argument under ``name`` (and setting ``.name`` on classes)."""
        def add(item: T) -> T:
            self.add(name, item)
            return item
        return add

    def add(self, name: str, item: T) -> None:
        if name in self._items:
            raise RuntimeError(f"{self.noun} {name!r} is registered twice")
        if isinstance(item, type):
            item.name = name
        self._items[name] = item

    def rename(self, old: str, new: str) -> None:
        """Keep finding ``new`` under its ``old`` name, with a warning, for one release."""
        self.renamed[old] = new

    def remove(self, name: str) -> None:
        """Unregister ``name`` (for what registers only for a while, such as a test's rule)."""
        del self._items[name]

    def get(self, name: str) -> T:
        if name in self.renamed:
            import warnings
            warnings.warn(f"{self.noun} {name!r} is now {self.renamed[name]!r}; the old name will be removed",
                          stacklevel=2)
            name = self.renamed[name]
        try:
            return self._items[name]
        except KeyError:
            raise self.error(f"unknown {self.noun} {name!r}; {choices(self._items, name)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self.renamed

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self):
        return self._items.items()

    def names(self) -> list[str]:
        return list(self._items)
