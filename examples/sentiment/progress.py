"""Progress of the demo's long steps, readable both on a terminal and in a log file.

On a terminal, :class:`Steps` is a rich progress bar. When the output goes to a file or a pipe
(``make demo > demo.log``), a bar would be printed once, at the end; :class:`Steps` prints a line
instead each time another ``every_percent`` % of the steps is done or ``every_seconds`` have
passed since the last line (whichever comes first), and one at the end, each with the elapsed
time. :func:`phase` times a step that has no sub-steps (exporting, explaining): a line when it
starts and one, with its duration, when it ends.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def clock_text(seconds: float) -> str:
    """Seconds as ``m:ss`` (``h:mm:ss`` from an hour)."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Steps:
    """``total`` steps of ``description`` (``with Steps(...) as steps: … steps.advance(loss="0.41")``):
    a bar on a terminal, else progress lines (see the module). ``fields`` (e.g. ``loss``) are shown
    after the count; ``advance`` updates them."""

    def __init__(self, console: Console, description: str, total: int, *, unit: str = "steps",
                 every_percent: float = 10.0, every_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, **fields: str):
        self.console, self.description, self.total, self.unit = console, description, total, unit
        self.every_percent, self.every_seconds, self.clock = every_percent, every_seconds, clock
        self.fields = dict(fields)
        self.done = 0
        self.bar: Progress | None = None
        if console.is_terminal:
            columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TimeRemainingColumn()]
            columns += [TextColumn(f"{name} {{task.fields[{name}]}}") for name in fields]
            self.bar = Progress(*columns, console=console)

    def __enter__(self) -> "Steps":
        self.started = self.last_time = self.clock()
        self.last_done = 0
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task(self.description, total=self.total, **self.fields)
        else:
            self._line()
        return self

    def advance(self, steps: int = 1, **fields: str) -> None:
        self.done += steps
        self.fields.update(fields)
        if self.bar is not None:
            self.bar.update(self.task, advance=steps, **fields)
            return
        now = self.clock()
        percent = 100.0 * (self.done - self.last_done) / max(1, self.total)
        if self.done < self.total and (percent >= self.every_percent or now - self.last_time >= self.every_seconds):
            self._line(now)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif self.done != self.last_done or self.done == 0:
            self._line()

    def _line(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        percent = 100.0 * self.done / max(1, self.total)
        shown = "".join(f", {name} {value}" for name, value in self.fields.items() if self.done)
        self.console.print(f"{self.description}: {self.done:,}/{self.total:,} {self.unit} ({percent:.0f} %), "
                           f"{clock_text(now - self.started)} elapsed{shown}", highlight=False)
        self.last_time, self.last_done = now, self.done


@contextmanager
def phase(console: Console, doing: str, done: str, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """A step without sub-steps: ``doing…`` when it starts, ``done in m:ss`` when it ends."""
    console.print(f"{doing}…", highlight=False)
    started = clock()
    yield
    console.print(f"{done} in {clock_text(clock() - started)}.", highlight=False)
