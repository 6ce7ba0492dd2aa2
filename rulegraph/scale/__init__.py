"""Dataset scale: run many examples through a method, on one process or on a Ray cluster.

The work is cut into **tasks** (a batch of examples of similar length × one method,
:func:`batches`); an **engine** (:data:`ENGINES`: ``local``, ``ray``) runs each task on a
**worker** (one loaded graph per worker, built once by a picklable factory) and hands every
task's rows back to the driver, which alone writes them: to an append-only journal first
(:class:`Journal`, resumable), to Parquet at the end. The rows do not depend on the engine:
the tasks are the same, and the driver orders the rows by example before anything is
aggregated or written.

``rulegraph explain-dataset`` (:mod:`.explain`) and ``rulegraph evaluate``
(:mod:`rulegraph.evaluate.runner`) are two jobs on one driver (:mod:`.job`); the data files
they read are :mod:`.data`. Importing this package loads neither torch nor Ray.
"""
from __future__ import annotations

from . import ray_engine  # noqa: F401  (registers the ray engine; Ray itself is imported when one is made)
from .batches import batches
from .engines import ENGINES, Engine, Task, engine
from .journal import Journal

__all__ = ["ENGINES", "Engine", "Journal", "Task", "batches", "engine"]
