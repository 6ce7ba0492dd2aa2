"""Engines: what runs the tasks. ``local`` runs them in this process, in order; ``ray`` on a
pool of Ray actors (:mod:`rulegraph.scale.ray_engine`, the optional ``rulegraph[ray]`` extra).

Engines register themselves in :data:`ENGINES`; :func:`engine` builds one by name.
An engine is given a **factory** (picklable, called once per worker: loads the graph, builds
what the tasks share) and the tasks; the worker the factory returns maps a task's payload to
its rows. Each finished task reaches ``done(task, rows, error)`` in the driver, exactly once:
with its rows, or with ``error`` when it could not be run (the driver records its examples as
failed rows). A worker catches what one example does wrong itself; ``error`` is what is left
(a worker that died every time it tried the task, a worker that could not start).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

from ..errors import InputError
from ..registry import Registry

Worker = Callable[[Any], list[dict]]
Factory = Callable[[], Worker]
Done = Callable[["Task", "list[dict] | None", "str | None"], None]


@dataclass(frozen=True)
class Task:
    key: Hashable       # what the driver knows the task by (e.g. (batch, method))
    payload: Any        # what the worker gets (picklable)
    cost: int = 1       # its share of the progress bar (e.g. its tokens)


class Engine:
    """Runs tasks on workers; see the module docstring."""

    name = ""

    def run(self, factory: Factory, tasks: list[Task], done: Done) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """One line for the summary: the engine and its workers."""
        return self.name

    def check(self, device: str) -> None:
        """Refuse, before any work, a ``device`` this engine's workers cannot use or leave idle."""


ENGINES: Registry[type[Engine]] = Registry("engine", InputError)


@ENGINES.register("local")
class LocalEngine(Engine):
    """One worker in this process; tasks in the order given."""

    def __init__(self, **_: Any):
        pass

    def run(self, factory: Factory, tasks: list[Task], done: Done) -> None:
        if not tasks:
            return
        worker = factory()
        for task in tasks:
            done(task, worker(task.payload), None)


def engine(name: str, **options: Any) -> Engine:
    """The engine called ``name`` with its options (``ray``: ``address``, ``num_workers``,
    ``gpus_per_worker``, ``cpus_per_worker``); ``ray`` without the extra installed is an error
    saying how to install it."""
    return ENGINES.get(name)(**options)
