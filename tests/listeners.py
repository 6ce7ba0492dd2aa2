"""A listener that holds a dataset job to the call order :class:`rulegraph.scale.listener.Listener`
defines — ``start``, then ``method`` / ``advance``, then ``stop``; ``note`` at any time — and
records what it was told."""
from __future__ import annotations

from rulegraph.scale.listener import Listener


class StrictListener(Listener):
    """Every call out of order is an ``AssertionError`` where it is made, and is kept in
    :attr:`errors` too (an engine may swallow the first), so :meth:`check` still fails."""

    def __init__(self):
        self.state = "new"                      # new → started → stopped (→ started again: a second run)
        self.calls: list[tuple] = []
        self.errors: list[str] = []

    def _expect(self, call: str, *states: str) -> None:
        if self.state not in states:
            self.errors.append(f"{call} while {self.state} (calls so far: {[c[0] for c in self.calls]})")
            raise AssertionError(self.errors[-1])

    def note(self, text: str, level: str = "info") -> None:
        assert level in ("info", "error"), level
        self.calls.append(("note", text, level))

    def start(self, total: int, pairs: str) -> None:
        self._expect("start", "new", "stopped")
        assert isinstance(total, int) and total >= 1, total
        self.state = "started"
        self.calls.append(("start", total, pairs))

    def method(self, name: str) -> None:
        self._expect("method", "started")
        self.calls.append(("method", name))

    def advance(self, tokens: int, pairs: str) -> None:
        self._expect("advance", "started")
        assert tokens >= 0, tokens
        self.calls.append(("advance", tokens, pairs))

    def stop(self) -> None:
        self._expect("stop", "started")
        self.state = "stopped"
        self.calls.append(("stop",))

    def check(self, runs: int = 1) -> None:
        """The job ran ``runs`` times, each start … stop in order, and every call was in order."""
        assert not self.errors, self.errors
        assert self.state == "stopped", self.state
        starts = [c for c in self.calls if c[0] == "start"]
        assert len(starts) == runs == sum(c[0] == "stop" for c in self.calls), self.calls

    def named(self, kind: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == kind]
