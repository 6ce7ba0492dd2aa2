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
  down after; its processes die with the driver however it ends (:mod:`.reaper`: ``kill -9`` too).
  A cluster that cannot hold ``num_workers`` workers is an error before any worker starts (Ray
  would otherwise wait for the resources without a word); so are an address where no cluster
  answers, and a local cluster larger than this machine (:meth:`RayEngine.check`).
"""
from __future__ import annotations

import importlib.util
import math
import os
import socket
import subprocess
import sys
from collections import deque
from typing import Any

from ..errors import InputError
from .engines import ENGINES, Done, Engine, Factory, Task
from .reaper import Reaper

INSTALL = "the ray engine needs Ray: pip install 'rulegraph[ray]' (or pip install ray)"
#: how long the engine waits for a cluster's address to answer before it gives up
CONNECT_SECONDS = 5.0
#: how long a child process may take to get an answer from the cluster's control store (Ray's import included)
PROBE_SECONDS = 20.0


def _gcs_answers(address: str) -> str | None:
    """Why the Ray cluster's control store (GCS) at ``address`` does not answer, or ``None`` when
    it does: asked for its cluster id by a child process given :data:`PROBE_SECONDS` (Ray's own
    client retries for minutes, printing each try)."""
    code = "import sys\nfrom ray._raylet import GcsClient\nGcsClient(address=sys.argv[1]).cluster_id\n"
    try:
        done = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                              timeout=PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        return f"no answer in {PROBE_SECONDS:g} s"
    if done.returncode == 0 or "AuthenticationError" in done.stderr:     # a Ray cluster, asking for its token
        return None
    last = [line for line in done.stderr.splitlines() if line.strip()]
    return last[-1].strip()[:160] if last else f"exit status {done.returncode}"


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
        """Before any file is written: GPUs and ``device`` agree (Ray hides the GPUs from a worker
        that asks for none, and a GPU reserved for a worker on the CPU sits idle); a local cluster
        fits this machine's CPUs; an ``address`` is one, and a Ray cluster answers there (a few
        seconds at most, never a hang)."""
        if device == "cuda" and not self.gpus:
            raise InputError("--device cuda on Ray workers needs --gpus-per-worker (1, or e.g. 0.5 for two workers "
                             "on one GPU): Ray hides the GPUs from a worker that asks for none")
        if self.gpus and device != "cuda":
            raise InputError(f"--gpus-per-worker {self.gpus:g} reserves GPUs that --device {device} leaves idle; "
                             "add --device cuda")
        if self.address is None:
            if not _ray().is_initialized():
                self._check_local_cpus()
            return
        host, port = self._endpoint()
        try:
            socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
            reason = None if self.address.startswith("ray://") else _gcs_answers(f"{host}:{port}")
        except OSError as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc) or type(exc).__name__)
        if reason is not None:
            raise InputError(f"--address {self.address}: no Ray cluster answers at {host}:{port} ({reason}); start "
                             "one (ray start --head), or leave --address out for a local cluster")

    def _check_local_cpus(self) -> None:
        """A local cluster of ``num_workers × cpus_per_worker`` CPUs must fit this machine's."""
        have = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        need = self.num_workers * self.cpus
        if need > have:
            fit = have // self.cpus
            raise InputError(f"--num-workers {self.num_workers} × --cpus-per-worker {self.cpus} = {need} CPUs, and this "
                             f"machine has {have} for a local Ray cluster: "
                             + (f"lower --num-workers to {fit}" if fit else f"lower --cpus-per-worker to {have}"))

    def _endpoint(self) -> tuple[str, int]:
        """``address`` as (host, port): ``auto`` (the cluster ``ray start`` left here), ``HOST:PORT``
        or ``ray://HOST[:PORT]`` (Ray's client, which needs the ``ray[client]`` extra)."""
        address = self.address.strip()
        if address == "auto":
            try:
                from ray._private.services import canonicalize_bootstrap_address_or_die
                address = canonicalize_bootstrap_address_or_die("auto")
            except Exception:  # noqa: BLE001 — ConnectionError, ValueError… all mean: no cluster found
                raise InputError("--address auto: no running Ray cluster was found on this machine (start one with "
                                 "ray start --head), or leave --address out for a local cluster") from None
        elif address.startswith("ray://"):
            if importlib.util.find_spec("grpc") is None:
                raise InputError(f"--address {self.address}: Ray's client (ray://) needs its extra: "
                                 "pip install 'ray[client]'")
            address = address[len("ray://"):]
            address = address if ":" in address.rsplit("]", 1)[-1] else f"{address}:10001"
        host, sep, port = address.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
            raise InputError(f"--address {self.address!r} is not a Ray address; valid: auto, HOST:PORT, "
                             "ray://HOST:PORT")
        return host, int(port)

    def run(self, factory: Factory, tasks: list[Task], done: Done) -> None:
        if not tasks:
            return
        ray = _ray()
        started = not ray.is_initialized()
        reaper = Reaper.start() if started and not self.address else None    # a local cluster dies with us
        try:
            if started:
                self._init()
            if reaper is not None:
                reaper.watch()
            self._check_capacity(f"the Ray cluster at {self.address}" if self.address else
                                 "the local Ray cluster started for this run" if started else "the running Ray instance")
            self._run(factory, tasks, done, reaper)
        finally:
            if started:
                ray.shutdown()
            if reaper is not None:
                reaper.stop()

    def _init(self) -> None:
        """Join the cluster at ``address``, or start a local one of ``num_workers × cpus_per_worker`` CPUs."""
        ray = _ray()
        try:
            if self.address:
                ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
            else:
                ray.init(num_cpus=self.num_workers * self.cpus, num_gpus=0 if not self.gpus else None,
                         include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        except Exception as exc:  # noqa: BLE001 — Ray raises ConnectionError, ValueError, RuntimeError…
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            where = f"join the Ray cluster at {self.address}" if self.address else "start a local Ray cluster"
            raise InputError(f"cannot {where} ({type(exc).__name__}: {first})") from None

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

    def _run(self, factory: Factory, tasks: list[Task], done: Done, reaper: Reaper | None = None) -> None:
        ray = _ray()
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
        remote = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0)(_Actor)
        actors = [self._spawn(remote, factory) for _ in range(min(self.num_workers, len(tasks)))]
        self.pids = [pid for _, pid in actors]
        if reaper is not None:
            reaper.watch()
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
