"""Explanations replayed (``explain(…, replay=True)``): the host's work per node done once per input shape.

On a GPU an explanation is bound by the host, not the device: at 128 tokens a classifier's explanation holds
a few milliseconds of kernels and costs several times that in Python (the interpreter's loop, the rules, the
audit's bookkeeping). With ``replay``, the first explanation of an input shape traces the forward's value
steps and the relevance walk into two graphs of ATen ops (:func:`torch.fx.experimental.proxy_tensor.make_fx`
over fake tensors), and on a CUDA device captures them as CUDA graphs sharing one memory pool, the walk
reading the forward's outputs where they lie (:class:`Captured`). Later explanations of that shape copy their
inputs in and replay the two graphs; the prologue between them (the output's checks, the target, the seed)
runs as always.

What makes a trace valid for every input of its shape is that nothing in it read a tensor's data: over fake
tensors such a read (a rule deciding by a value, a check) fails the trace, and ``replay`` is refused for that
graph and rule set, never baked in. The walk is traced with the audit's sums kept as tensors (as on a GPU):
every conserving node's mass is measured, and a pair of tensors is summed once per edge, not once per memory;
the figures equal the walk's within rounding. The CPU runs the traced graphs op by op: the same relevance, bit
for bit, and no faster (``benchmarks/results/replay-cpu.md``); it is there so that the traces are tested where
CUDA is not. With ``compiled=True`` the CPU's traces are compiled by TorchInductor (:func:`_compiled`):
faster (AttnLRP with the audit at 128 tokens 0.78× / 0.71× the interpreter's time at one / two threads), after
a compile of tens of seconds per input shape (``benchmarks/peers_speed.py --compiled``,
``benchmarks/replay_compiled.py``).

Not replayed (refused, naming the option): several targets walked at once (``targets=``), values recorded or
conditioned (``record``, ``at``, ``condition``, ``graph``), mixtures of experts (their audit records), and
the decomposition pass.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import InputError
from ..interpreter import Plan, Stage, Values
from ..lifetimes import WalkCache
from ..options import READS_INSIDE
from ..ruleset import Binding

Tensor = torch.Tensor

#: input shapes whose traces are kept per binding and plan (the oldest dropped first)
KEPT = 4


def run_forward(binding: Binding, plan: Plan, inputs: dict[str, Any], keep: frozenset[str],
                spill: frozenset[str], compiled: bool = False) -> tuple[Values, "Replay"]:
    """The forward's values for ``inputs`` (what :meth:`Plan.run` returns), from the replay of their input
    shape; the first time, the plan runs as always and its value steps are traced for the next (``compiled``:
    and compiled, :func:`_compiled`)."""
    feeds = plan.feeds(inputs)
    key = (tuple((k, tuple(v.shape), v.dtype) for k, v in feeds.items()), keep, spill, compiled)
    replays = WalkCache.of(binding.walks, plan).replays
    replay = replays.get(key)
    if replay is not None:
        replays.move_to_end(key)
        return replay.forward(feeds), replay
    values = plan.run_feeds(feeds, keep=keep, spill=spill)       # the shape steps' results kept, then traced
    replay = replays[key] = Replay.traced(plan, feeds, values, keep, spill, compiled)
    if len(replays) > KEPT:
        replays.popitem(last=False)
    return replay.forward(feeds), replay        # (a walk captured on these reads the forward's outputs in place)


@dataclass
class Replay:
    """One input shape's traced forward and (once walked) relevance walks, by explained output and audit."""

    plan: Plan
    feeds: tuple[str, ...]              # the forward's inputs, in the traced graph's order
    kept: tuple[str, ...]               # the values it computes and returns, in order
    fixed: dict[str, Any]               # what it returns that is the same for every input of the shape
    statics: dict
    graph: Callable[..., tuple[Tensor, ...]]
    compiled: bool = False              # the traces compiled (:func:`_compiled`)
    walks: dict[tuple, "_Walk"] = field(default_factory=dict)

    @classmethod
    def traced(cls, plan: Plan, feeds: dict[str, Tensor], values: Values, keep: frozenset[str],
               spill: frozenset[str], compiled: bool = False) -> Replay:
        """The forward of ``feeds``' shape traced (``values``: the plan's run on them, whose shape steps'
        results and static arguments hold for every input of that shape); ``compiled``: and compiled."""
        names = tuple(feeds)
        computed = [v for v in values if v not in plan.constants and v not in feeds]
        kept = tuple(v for v in computed if plan.stage.get(v) == Stage.VALUE)
        sequences = [v for v in kept if not isinstance(values[v], Tensor)]
        if sequences:
            raise InputError(f"replay: the value {sequences[0]!r} is a sequence of tensors, which is not replayed; "
                             "explain without replay")
        fixed = {v: values[v] for v in computed if v not in kept}

        def forward(*tensors: Tensor) -> tuple[Tensor, ...]:
            env = plan.run_feeds(dict(zip(names, tensors)), keep=keep, spill=spill)
            return tuple(env[v] for v in kept)

        graph = _trace(forward, [feeds[n] for n in names], "the forward")
        return cls(plan, names, kept, fixed, values.statics,
                   _captured(graph, [feeds[n] for n in names], compiled=compiled), compiled)

    def forward(self, feeds: dict[str, Tensor]) -> Values:
        out = self.graph(*(feeds[n] for n in self.feeds))
        values = Values(self.plan.constants, statics=self.statics)
        values.update(feeds)
        values.update(self.fixed)
        values.update(zip(self.kept, out))
        return values

    def walk(self, key: tuple, args: list[Tensor], traced: Callable[[], tuple[Callable, list]]) -> tuple[tuple, Any]:
        """A walk's outputs for ``args`` (its seed, then the values :attr:`kept`) and its structure (the walk's
        :class:`~rulegraph.passes.relevance.Flow` as traced), from the replay ``key`` (explained output, audit)
        names; the first time, ``traced()`` gives the walk as a function of ``args`` and the list its trace puts
        the structure in (:func:`rulegraph.passes.relevance.traced_walk`)."""
        walk = self.walks.get(key)
        if walk is None:
            function, shapes = traced()
            graph = _captured(_trace(function, args, "the relevance walk"), args,
                              pool=getattr(self.graph, "pool", None), shared=1, compiled=self.compiled)
            walk = self.walks[key] = _Walk(graph, shapes[0])
        return walk.graph(*args), walk.shape


@dataclass
class _Walk:
    graph: Callable[..., tuple[Tensor, ...]]
    shape: Any             # the walk's structure: its Flow as traced (nodes, edges, ledger entries)


def _trace(function: Callable, args: list[Tensor], what: str):
    """``function`` traced over fake tensors into a graph of ATen ops; a read of a tensor's data refuses it."""
    from torch.fx.experimental.proxy_tensor import make_fx
    try:
        return make_fx(function, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
    except Exception as e:      # noqa: BLE001 — a read of the data (perhaps behind a rule's error naming its node)
        cause = next((c for c in _causes(e) if _reads_data(c)), None)
        if cause is None:
            raise
        raise InputError(f"replay: {what} cannot be traced for replay (a step reads a tensor's data to decide what "
                         f"to compute: {str(cause).splitlines()[0][:200]}); explain without replay") from None


def _causes(e: BaseException | None):
    while e is not None:
        yield e
        e = e.__cause__


def _reads_data(e: BaseException) -> bool:
    """Whether ``e`` is a fake tensor's refusal to give its data (a value, a decision on it, its memory)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    return isinstance(e, (DataDependentOutputException, GuardOnDataDependentSymNode)) or \
        "Cannot access data pointer" in str(e)


def _captured(graph, args: list[Tensor], pool=None, shared: int | None = None, compiled: bool = False):
    """``graph`` as it replays on ``args``' device: captured as a CUDA graph there (:class:`Captured`), else
    the traced graph itself, or compiled (:func:`_compiled`)."""
    if args[0].is_cuda:
        return Captured(graph, args, pool, shared)
    return _compiled(graph, args) if compiled else graph


def _compiled(graph, args: list[Tensor]):
    """A traced graph compiled by TorchInductor for ``args``' shapes (``torch.compile``: C++ kernels, the
    elementwise work fused), compiled now, on ``args``. On a CPU it runs a short input's walk in about 0.6× the
    traced graph's time, after a compile of tens of seconds (``benchmarks/replay_compiled.py``); its sums are
    taken in other orders (float32 results within about 1e-6 of the interpreter's). Compiled and run with
    :func:`_scatters_in_aten`."""
    function = torch.compile(graph, fullgraph=True, dynamic=False)

    def run(*tensors: Tensor):
        with _scatters_in_aten():
            return function(*tensors)
    try:
        run(*args)
    except Exception as e:      # noqa: BLE001 — no C++ compiler, a kernel it cannot build
        raise InputError(f"compiled: TorchInductor could not compile the replay ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200] if str(e) else ''}); explain without compiled") from None
    return run


@contextmanager
def _scatters_in_aten():
    """torch's deterministic mode, in which TorchInductor leaves scatters (``index_add``, ``index_put``,
    ``scatter_add``: the walk's way back through a Gather) to ATen's kernels instead of generating them: its
    generated scatter adds atomically, in an order that varies with the threads, and wrote out of its buffer's
    bounds on a Bloom's walk (a transposed tile of a Gather's relevance added with the wrong stride: the heap
    corrupted, the process aborted; ``tests/passes/test_replay.py``). Compiled and run alike, as TorchDynamo's
    guards see the mode; the caller's setting restored after."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


class Captured:
    """A traced graph captured as a CUDA graph: its inputs copied into the buffers it was captured on, then
    one launch. Its outputs are buffers the next replay writes again: the callers copy what they keep (the
    explanation holds host copies, the ledger its numbers). ``pool``: another capture's memory pool, shared
    where this graph reads that one's outputs (replayed in the order they were captured); ``shared``: the
    inputs from that position on are those outputs, read where they lie, not copied."""

    def __init__(self, graph, args: list[Tensor], pool=None, shared: int | None = None):
        shared = len(args) if shared is None else shared
        self.inputs = [a.clone() if i < shared else a for i, a in enumerate(args)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):         # a warm-up off the capture (allocator, handles)
            graph(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.cuda = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.cuda, pool=pool):
            self.outputs = graph(*self.inputs)
        self.pool = self.cuda.pool()

    def __call__(self, *args: Tensor):
        for buffer, a in zip(self.inputs, args, strict=True):
            if buffer.data_ptr() != a.data_ptr():
                buffer.copy_(a)
        self.cuda.replay()
        return self.outputs


#: the relevance pass's options a replay does not carry out (it records and conditions nothing)
NOT_REPLAYED = READS_INSIDE


def refuse(asked: dict[str, Any]) -> None:
    """Refuse ``replay`` with the first thing asked that it does not replay (by name: a value that is set)."""
    given = [name for name, value in asked.items() if value]
    if given:
        raise InputError(f"replay: {given[0]} is not replayed (replay=True explains one target at a time, "
                         "without recorded or conditioned values); drop one of the two")
