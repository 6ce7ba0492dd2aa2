"""What a running dataset job reports (notes, progress), apart from the driver so that the
command line declares its terminal listener without importing torch."""
from __future__ import annotations


class Listener:
    """What a running dataset job (explain-dataset, evaluate) reports, to whoever shows it; this one
    shows nothing. ``rulegraph.cli.evaluate`` draws a progress bar and prints the notes.

    The calls come in one order: ``start`` once, then any number of ``method`` and ``advance``,
    then ``stop`` once (also when the work is interrupted); :meth:`note` may come at any time,
    before ``start`` and after ``stop`` too. A job that runs again (a resumed evaluation) calls
    ``start`` … ``stop`` again."""

    def note(self, text: str, level: str = "info") -> None:
        """A line for the user; ``level``: ``info``, ``warning`` or ``error``."""

    def start(self, total: int, pairs: str) -> None:
        """Work begins: ``total`` tokens to explain; ``pairs``: "done/all explained"."""

    def method(self, name: str) -> None:
        """The method now running (after :meth:`start`)."""

    def advance(self, tokens: int, pairs: str) -> None:
        """``tokens`` more explained (after :meth:`start`)."""

    def stop(self) -> None:
        """Work ended, finished or interrupted (after :meth:`start`)."""
