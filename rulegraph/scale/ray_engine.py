"""The ``ray`` engine: tasks on a pool of Ray actors, one loaded graph each (Moritz et al. 2018,
"Ray: A Distributed Framework for Emerging AI Applications", OSDI).

- **Workers**: ``num_workers`` actors, each with ``cpus_per_worker`` CPUs (its torch threads) and
  ``gpus_per_worker`` GPUs; each builds its worker once from the factory.
- **Backpressure**: at most ``depth`` tasks in flight per actor; the rest wait in the driver.
- **Failures**: a task whose actor died (killed, out of memory, its node lost) is given to a fresh
  actor, up to ``retries`` more times, then reported as failed; a task is never reported twice,
  so no row is lost or duplicated. Errors inside one example are the worker's own (a failed row).
- **Cluster**: ``address`` (``auto``, ``ray://host:10001``, …) joins an existing cluster, whose
  nodes need rulegraph installed; without it a local cluster of ``num_workers × cpus_per_worker``
  CPUs (and the GPUs this machine has, when workers ask for GPUs) is started for this run and shut
  down after. A cluster that cannot hold ``num_workers`` workers is an error before any worker
  starts (Ray would otherwise wait for the resources without a word).
"""
from __future__ import annotations

import math
import os
from collections import deque
from typing import Any

from ..errors import InputError
from .engines import ENGINES, Done, Engine, Factory, Task

INSTALL = "the ray engine needs Ray: pip install 'rulegraph[ray]' (or pip install ray)"


def _ray():
    """Ray, imported when a Ray engine is made (the optional extra: an error saying how to install it)."""
    try:
        import ray
    except ImportError:
        raise InputError(INSTALL) from None
    return ray


class _Actor:
    """One worker: the factory's product, called once per task."""

    def __init__(self, factory: Factory, threads: int):
        import torch
        torch.set_num_threads(threads)
        self.worker = factory()

    def pid(self) -> int:
        return os.getpid()

    def run(self, payload: Any) -> list[dict]:
        return self.worker(payload)


@ENGINES.register("ray")
class RayEngine(Engine):
    def __init__(self, address: str | None = None, num_workers: int = 2, cpus_per_worker: int = 1,
                 gpus_per_worker: float = 0, depth: int = 2, retries: int = 2):
        _ray()
        if num_workers < 1 or cpus_per_worker < 1 or gpus_per_worker < 0 or depth < 1 or retries < 0:
            raise InputError(f"ray engine: num_workers ({num_workers}) and cpus_per_worker ({cpus_per_worker}) "
                             f"must be ≥ 1, gpus_per_worker ({gpus_per_worker}) ≥ 0")
        self.address, self.num_workers, self.cpus = address, num_workers, cpus_per_worker
        self.gpus, self.depth, self.retries = gpus_per_worker, depth, retries
        self.pids: list[int] = []         # the live actors' process ids (what a test may kill)

    def describe(self) -> str:
        where = self.address or "a local cluster"
        return (f"ray ({self.num_workers} workers × {self.cpus} CPU"
                + (f", {self.gpus:g} GPU" if self.gpus else "") + f", on {where})")

    def check(self, device: str) -> None:
        """GPUs and ``device`` agree: Ray hides the GPUs from a worker that asks for none, and a
        GPU reserved for a worker on the CPU sits idle."""
        if device == "cuda" and not self.gpus:
            raise InputError("--device cuda on Ray workers needs --gpus-per-worker (1, or e.g. 0.5 for two workers "
                             "on one GPU): Ray hides the GPUs from a worker that asks for none")
        if self.gpus and device != "cuda":
            raise InputError(f"--gpus-per-worker {self.gpus:g} reserves GPUs that --device {device} leaves idle; "
                             "add --device cuda")

    def run(self, factory: Factory, tasks: list[Task], done: Done) -> None:
        if not tasks:
            return
        ray = _ray()
        started = not ray.is_initialized()
        if started:
            if self.address:
                ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
            else:
                ray.init(num_cpus=self.num_workers * self.cpus, num_gpus=0 if not self.gpus else None,
                         include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            self._check_capacity(f"the Ray cluster at {self.address}" if self.address else
                                 "the local Ray cluster started for this run" if started else "the running Ray instance")
            self._run(factory, tasks, done)
        finally:
            if started:
                ray.shutdown()

    def _check_capacity(self, where: str) -> None:
        """Refuse a cluster whose nodes have room for fewer than ``num_workers`` workers, each on
        one node with ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs."""
        ask = {"CPU": self.cpus, "GPU": self.gpus}
        nodes = [node["Resources"] for node in _ray().nodes() if node.get("Alive")]
        fit = sum(min(math.floor(res.get(kind, 0.0) / need + 1e-9) for kind, need in ask.items() if need)
                  for res in nodes)
        if fit >= self.num_workers:
            return
        total = ", ".join(f"{sum(res.get(kind, 0.0) for res in nodes):g} {kind}" for kind in ask)
        worker = " and ".join(f"{need:g} {kind}" for kind, need in ask.items() if need)
        if fit == 0:
            raise InputError(f"a worker asks for {worker} (--cpus-per-worker, --gpus-per-worker) and no node of "
                             f"{where} has that ({total} in all)")
        raise InputError(f"{where} has room for {fit} workers of {worker} ({total} in all), not "
                         f"{self.num_workers}: lower --num-workers to {fit}")

    def _spawn(self, remote, factory: Factory):
        actor = remote.remote(factory, self.cpus)
        return actor, _ray().get(actor.pid.remote())       # waits until the worker is built

    def _run(self, factory: Factory, tasks: list[Task], done: Done) -> None:
        ray = _ray()
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
        remote = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0)(_Actor)
        actors = [self._spawn(remote, factory) for _ in range(min(self.num_workers, len(tasks)))]
        self.pids = [pid for _, pid in actors]
        waiting = deque((task, 0) for task in tasks)
        flying: dict[Any, tuple[Task, int, int, int]] = {}    # object ref → (task, attempt, slot, actor pid)
        load = [0] * len(actors)
        while waiting or flying:
            for slot, (actor, _) in enumerate(actors):
                while waiting and load[slot] < self.depth:
                    task, attempt = waiting.popleft()
                    flying[actor.run.remote(task.payload)] = (task, attempt, slot, actors[slot][1])
                    load[slot] += 1
            ready, _ = ray.wait(list(flying), num_returns=1)
            task, attempt, slot, pid = flying.pop(ready[0])
            load[slot] -= 1
            try:
                rows = ray.get(ready[0])
            except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                if actors[slot][1] == pid:      # first news of this death: a fresh actor in its slot
                    actors[slot] = self._spawn(remote, factory)
                    self.pids[slot] = actors[slot][1]
                if attempt < self.retries:
                    waiting.appendleft((task, attempt + 1))
                else:
                    done(task, None, f"worker died {attempt + 1} times on this task ({type(exc).__name__})")
                continue
            except RayTaskError as exc:
                done(task, None, str(exc.cause if exc.cause is not None else exc).splitlines()[0])
                continue
            done(task, rows, None)
