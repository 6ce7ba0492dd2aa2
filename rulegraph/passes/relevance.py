"""The relevance pass: a reverse topological walk from the explained output.

Each reached node's rule turns the relevance at its outputs into contributions to
its inputs (:mod:`rulegraph.propagation`, :meth:`propagate`). Contributions to relevance-carrying values are
accumulated for their producers; contributions to the rest (biases, masks, other
constants) are absorbed. The walk stops at the boundary values, where the
explanation is read.

With the audit on, every contribution is also reduced to its sum — one reduction of
the actual tensor, kept in a :class:`Ledger` — and the nodes and edges record which
ledger entries are theirs. On the CPU each sum is read as it is made; elsewhere it is
kept as a 0-d tensor, and :func:`finish` turns the whole ledger into numbers with a
single device sync.
"""
from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable

import torch

from ..audit import Audit, Conservation, LayerAudit, NodeAudit
from ..boundary import walk as boundary_walk
from ..errors import InputError, NumericalError
from ..experts import expert_audits, find_experts
from ..explanation import Explanation
from ..interpreter import Plan, Step, Values
from ..lifetimes import Needs, Recycler, Release, StepLife, WalkCache, Walker, deaths
from ..ops.linalg import SPARSE_ROWS_FROM, nonzero_rows
from ..ir import Node
from ..propagation import RULES, Rule
from ..propagation.numerics import layout
from ..propagation.signal import Contribution, Incoming, Site
from ..ruleset import Binding
from ..tolerances import MASS_SCREEN, relative, tolerance
from .base import PASSES, Forward, Pass, position_scores, rule_failed
from .replay import refuse

Tensor = torch.Tensor


#: elements multiplied at once where a product is only summed (a language model's [positions, vocabulary]
#: logits times their seed: summed chunk by chunk, the product is never held whole)
CHUNK = 1 << 22


def memory_order(x: Tensor, g: Tensor) -> tuple[int, ...] | None:
    """The order of dimensions in which ``x`` and ``g`` lie in memory (``()``: as they are, contiguous), where
    both are one dtype and shape and lie alike and densely (the same strides, no gaps, no overlap): a
    contiguous tensor, or a permuted one (a head view of queries, transposed keys). ``None`` otherwise
    (a slice, a broadcast). Nothing is reshaped: a ledger that has this pair's sum already reads it."""
    if x.shape != g.shape or x.dtype != g.dtype or x.stride() != g.stride():
        return None
    if x.is_contiguous():
        return ()
    order = tuple(sorted(range(x.dim()), key=lambda d: -x.stride(d)))
    return order if x.permute(order).is_contiguous() else None


def in_memory_order(x: Tensor, g: Tensor, order: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor] | None:
    """``x`` and ``g`` flattened in the order their elements lie in memory, without a copy, where they lie
    alike (:func:`memory_order`, or the ``order`` it gave); ``None`` otherwise. ``x[i]`` pairs with ``g[i]``
    either way, so ``Σ x ⊙ g`` is their dot."""
    order = memory_order(x, g) if order is None else order
    if order is None:
        return None
    if order:
        x, g = x.permute(order), g.permute(order)
    return x.reshape(-1), g.reshape(-1)


def product_sum(x: Tensor, g: Tensor, *, dtype: torch.dtype | None = None, absolute: bool = False,
                nan_safe: bool = False) -> Tensor:
    """``Σ x ⊙ g`` (``Σ |x ⊙ g|`` with ``absolute``) as a 0-d tensor, in ``dtype`` (default ``x``'s),
    a chunk of :data:`CHUNK` elements at a time above that size (the product is never held whole); a
    plain sum of two tensors of one shape is one fused dot: over their memory where they lie alike
    (:func:`in_memory_order`), else over flattened copies up to that size."""
    flat = in_memory_order(x, g)
    if not absolute and not nan_safe and dtype is None:
        if flat is not None:
            return torch.vdot(*flat)
        if x.shape == g.shape and x.dtype == g.dtype and x.numel() <= CHUNK:
            return torch.vdot(x.reshape(-1), g.reshape(-1))
    if x.shape != g.shape or x.numel() <= CHUNK:      # one product: broadcast, or small enough
        p = x * g
        p = p.to(dtype) if dtype is not None else p
        p = p.abs() if absolute else p
        return torch.nansum(p) if nan_safe else p.sum()
    # chunks of the flattened tensors (copies where they lie differently), the product never whole
    xf, gf = flat if flat is not None else (x.reshape(-1), g.reshape(-1))
    total = torch.zeros((), dtype=dtype or x.dtype, device=x.device)
    for i in range(0, xf.numel(), CHUNK):
        p = xf[i:i + CHUNK] * gf[i:i + CHUNK]
        p = p.to(dtype) if dtype is not None else p
        p = p.abs() if absolute else p
        total = total + (torch.nansum(p) if nan_safe else p.sum())
    return total


def _batched_dot(x: Tensor, g: Tensor, absolute: bool, nan_safe: bool) -> Tensor:
    """``Σ x ⊙ g`` (``absolute``: ``Σ |x| ⊙ |g|``) under :func:`walk_many`'s vmap, ``g`` carrying the target
    axis and ``x`` (a forward value) not: one matrix–vector product for all targets where the shapes agree;
    where they broadcast, or ``nan_safe`` (0·inf taken as 0), the product summed."""
    if x.shape == g.shape and not nan_safe:
        x, g = (x.abs(), g.abs()) if absolute else (x, g)
        return torch.matmul(g.reshape(-1), x.reshape(-1))
    p = x * g
    p = p.abs() if absolute else p
    return torch.nansum(p) if nan_safe else p.sum()


#: a device ledger's sums over tensors of fewer elements than this wait in :class:`GroupedSums`, taken together
GROUP_BELOW = 1 << 20
#: the waiting sums are taken once the tensors they hold reach this many bytes (and when the ledger settles)
GROUP_BYTES = 64 << 20


class GroupedSums:
    """Sums of many small tensors in a few kernels. On a GPU a kernel's launch costs more than the sum of a
    sentence-sized tensor (a classifier's audit at 128 tokens: 1,250 launches, 27 ms of a 47 ms explanation,
    for 4 ms of kernels), so a device ledger's sums wait here and :meth:`take` reduces them together: the
    products ``x ⊙ g`` in one ``_foreach_mul``, the absolute values in one ``_foreach_abs``, then per dtype and
    power-of-two length one concatenation of the flattened tensors, each zero-padded to that length, and
    one row sum. Zeros change no sum; the rows are summed in a fixed order, so the figures are deterministic,
    though rounded otherwise than one reduction per tensor. The tensors are held until taken (at most
    :data:`GROUP_BYTES`); nothing writes into a tensor the walk has handed on."""

    KINDS = ("total", "mass", "dot", "absdot")      # Σ t, Σ|t|, Σ x ⊙ g, Σ |x ⊙ g|

    def __init__(self) -> None:
        self.waiting: list[tuple[int, str, tuple[Tensor, ...]]] = []
        self.bytes = 0

    def add(self, entry: int, kind: str, tensors: tuple[Tensor, ...]) -> bool:
        """Hold ``entry``'s sum until :meth:`take`; whether the held tensors reached :data:`GROUP_BYTES`."""
        self.waiting.append((entry, kind, tensors))
        self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return self.bytes >= GROUP_BYTES

    def take(self) -> dict[int, Tensor]:
        """Every waiting sum as a 0-d tensor, by ledger entry."""
        items, self.waiting, self.bytes = self.waiting, [], 0
        # flat and dense, so that a device's foreach kernels take every tensor of a list in one launch
        pairs = {i: in_memory_order(*ts) for i, (_, kind, ts) in enumerate(items) if kind in ("dot", "absdot")}
        flat: list[Tensor] = [ts[0] if i in pairs else ts[0].reshape(-1) for i, (_, _, ts) in enumerate(items)]
        alike = [i for i, p in pairs.items() if p is not None]
        if alike:
            for i, p in zip(alike, torch._foreach_mul([pairs[i][0] for i in alike], [pairs[i][1] for i in alike])):
                flat[i] = p
        for i in (i for i, p in pairs.items() if p is None):
            product = items[i][2][0] * items[i][2][1]           # dense, laid out like one of them
            lying = in_memory_order(product, product)
            flat[i] = lying[0] if lying is not None else product.reshape(-1)
        absolute = [i for i, (_, kind, _) in enumerate(items) if kind in ("mass", "absdot")]
        if absolute:
            for i, a in zip(absolute, torch._foreach_abs([flat[i] for i in absolute])):
                flat[i] = a
        classes: dict[tuple[torch.dtype, int], list[int]] = {}
        for i, t in enumerate(flat):
            classes.setdefault((t.dtype, 1 << max(t.numel() - 1, 0).bit_length()), []).append(i)
        widths: dict[torch.dtype, int] = {}
        for dtype, width in classes:
            widths[dtype] = max(widths.get(dtype, 0), width)
        zeros = {dtype: flat[0].new_zeros(width, dtype=dtype) for dtype, width in widths.items()}
        sums: dict[int, Tensor] = {}
        for (dtype, width), members in classes.items():
            pieces = [piece for i in members for piece in (flat[i], zeros[dtype][:width - flat[i].numel()])]
            rows = torch.cat(pieces).view(len(members), width).sum(1)
            for k, i in enumerate(members):
                sums[items[i][0]] = rows[k]
        return sums


class Ledger:
    """Sums of relevance tensors, as 0-d tensors until :meth:`settle`.

    A contribution in signal form sums as one fused dot ``x · g``. Graphs holding
    infinite constants (−inf attention masks) use a NaN-safe sum instead, taking
    0·(−inf) as 0, the LRP convention. A sum is taken once per pair of tensors: where
    relevance passes a node unchanged (a Cast, an Identity, a Reshape of contiguous values),
    the next edge's ``x · g`` is a dot over the same memory and reads the same entry.
    Off the CPU, the sums of small tensors are taken together (:class:`GroupedSums`).
    """

    def __init__(self, nan_safe: bool, eager: bool, batched: bool = False):
        self.nan_safe = nan_safe
        self.eager = eager          # entries are read as they are made (CPU: no device sync to fear)
        self.batched = batched      # under :func:`walk_many`'s vmap (sums per target) or a trace (replay): no memory
        #                             to key on
        self.entries: list[Tensor | float | None] = []  # floats where ``eager``, else 0-d tensors (None: waiting)
        self.values: list[float] = []
        self._taken: dict[tuple, tuple[tuple, int]] = {}     # key → (weak references, entry)
        # (NaN-safe sums keep their own reduction: 0·inf as 0, an infinite mass as the largest float)
        self.grouped = GroupedSums() if not (eager or batched or nan_safe) else None

    def now(self, indices: list[int]) -> float:
        """The sum of some entries, read immediately (only where ``eager``)."""
        entries = self.entries
        return sum([entries[i] for i in indices])

    def _entry(self, key: tuple | None, tensors: tuple[Tensor, ...], compute: Callable[[], Tensor],
               kind: str | None = None) -> int:
        """The entry ``key`` names: an earlier one while the tensors it was taken from are alive (so their
        memory was not reused), else ``compute()``'s, a new one; always a new one where ``key`` is ``None``
        (:attr:`batched`: a vmapped tensor has no memory of its own to key on). A ``kind`` of
        :attr:`GroupedSums.KINDS` over small ``tensors`` waits in :attr:`grouped` where there is one."""
        if key is not None:
            taken = self._taken.get(key)
            if taken is not None and all(ref() is not None for ref in taken[0]):
                return taken[1]
        index = len(self.entries)
        if kind is not None and self.grouped is not None and all(t.numel() < GROUP_BELOW for t in tensors):
            self.entries.append(None)
            if self.grouped.add(index, kind, tensors):
                self._take_grouped()
        else:
            value = compute()
            self.entries.append(value.item() if self.eager else value)
        if key is not None:
            self._taken[key] = (tuple(map(weakref.ref, tensors)), index)
        return index

    def _take_grouped(self) -> None:
        for index, value in self.grouped.take().items():
            self.entries[index] = value

    def total(self, t: Tensor) -> int:
        return self._entry(None if self.batched else ("total", layout(t)), (t,),
                           lambda: torch.nansum(t) if self.nan_safe else t.sum(), "total")

    def mass(self, t: Tensor) -> int:
        """Σ|t|, the scale a conservation error is judged against."""
        return self._entry(None if self.batched else ("mass", layout(t)), (t,), lambda: torch.linalg.vector_norm(
            torch.nan_to_num(t) if self.nan_safe else t, ord=1), "mass")

    def product(self, x: Tensor, g: Tensor, absolute: bool = False) -> int:
        """Σ x ⊙ g (``absolute``: Σ|x ⊙ g|), :func:`product_sum`. Two tensors lying alike in memory
        (:func:`in_memory_order`) sum as one dot over it, whatever their shape: keyed by the memory alone."""
        if self.batched:            # a matrix–vector product over the targets (vmapped), the product never held
            return self._entry(None, (), lambda: _batched_dot(x, g, absolute, self.nan_safe))
        kind = "absdot" if absolute else "dot"
        kind = kind if x.shape == g.shape and x.dtype == g.dtype else None     # (a broadcast: summed alone)
        order = None if absolute or self.nan_safe else memory_order(x, g)
        if order is not None:
            return self._entry(("dot", x.device, x.dtype, x.data_ptr(), g.data_ptr(), x.numel()), (x, g),
                               lambda: torch.vdot(*in_memory_order(x, g, order)), kind)
        return self._entry(("product", absolute, layout(x), layout(g)), (x, g),
                           lambda: product_sum(x, g, absolute=absolute, nan_safe=self.nan_safe), kind)

    def arriving(self, a: Incoming, mass: bool = False) -> int:
        """Σ R (``mass``: Σ|R|) of the relevance arriving at a value, without multiplying a signal out."""
        if a.explicit is not None:
            return self.mass(a.explicit) if mass else self.total(a.explicit)
        return self.product(a.value, a.signal, absolute=mass)

    def contribution(self, c: Contribution, x: Tensor) -> int:
        if c.relevance is not None:
            return self.total(c.relevance)
        return self.product(x, c.signal)

    def settle(self) -> None:
        if self.grouped is not None and self.grouped.waiting:
            self._take_grouped()
        if self.eager:
            self.values = list(self.entries)
        elif self.entries:
            self.values = torch.stack(self.entries).tolist()

    def __call__(self, indices: list[int]) -> float:
        values = self.values
        return sum([values[i] for i in indices])


@dataclass
class NodeFlow:
    """Relevance through one node, as ledger entries (read once :func:`finish` settled the ledger: one
    walk's records serve every target of :func:`walk_many`, each with its own row of numbers)."""

    name: str
    rule: str
    where: str
    conserving: bool
    entries_in: list[int] = field(default_factory=list)
    entries_out: list[int] = field(default_factory=list)
    entries_absorbed: list[int] = field(default_factory=list)
    entries_mass: list[int] = field(default_factory=list)      # Σ|R| arriving, where measured


@dataclass
class Edge:
    """Relevance a node's rule handed to a value: ``producer`` made the value (``None``
    for a boundary value), ``consumer`` is the node whose rule gave it (``None`` for
    the seed at the explained output)."""

    producer: str | None
    consumer: str | None
    entry: int


@dataclass
class Flow:
    """Everything the pass produced."""

    boundary: dict[str, Tensor]                 # boundary value → relevance tensor
    start: Incoming                             # the seed at the explained output (value ⊙ seed, not multiplied out)
    ledger: Ledger
    nodes: list[NodeFlow] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    stranded: dict[str, float] = field(default_factory=dict)  # relevance left where no rule took it
    stranded_entries: dict[str, list[int]] = field(default_factory=dict)
    # boundary value → g where its relevance arrived in signal form (R = x ⊙ g); under the
    # gradient rules g is ∂f/∂x, which the gradient baselines (GS, IG) read
    signals: dict[str, Tensor] = field(default_factory=dict)
    # value → the relevance that arrived at it, for the values asked for (``walk(record_at=…)``)
    recorded: dict[str, Tensor] = field(default_factory=dict)
    masked: list[int] = field(default_factory=list)     # ledger entries of what conditions masked out

    @property
    def output_relevance(self) -> Tensor:
        """The relevance at the explained output, multiplied out when asked (a language model's logits
        are [positions, vocabulary]: the product is not held through the walk)."""
        return self.start.tensor


@dataclass
class _Visit:
    """What the walk knows about a reached node before any tensor exists, resolved once per binding and plan
    so a visit reads slots, not the node, the step and the rule."""

    node: Node
    step: Step | None                 # None: no rule (on_unmatched: warn)
    rule: Rule | None
    where: str
    tainted: list[bool]
    conserving: bool
    sources: list[str | None]         # per input: the producing node for the audit's edges (None: boundary)
    outputs: tuple[str, ...] = ()
    reads: frozenset[str] = frozenset()     # the named values the visit reads (a missing one is computed again)
    #: per input: (name, tainted, audit edge's source), the loop over the rule's contributions
    edges: tuple[tuple[str, bool, str | None], ...] = ()

    def __post_init__(self):
        node = self.node
        self.outputs = tuple(node.outputs)
        self.reads = frozenset(v for v in (*node.inputs, *node.outputs) if v)
        self.edges = tuple(zip(node.inputs, self.tainted, self.sources, strict=True))


def _visits(binding: Binding, plan: Plan) -> list[_Visit]:
    """The reached nodes in walk order (reverse topological), prepared once per binding and plan."""
    cache = WalkCache.of(binding.walks, plan)
    if cache.visits is None:
        graph = binding.graph
        visits = []
        for node in reversed(binding.reached):
            a = binding.assignments.get(node.name)
            step = plan.step_by_name.get(node.name)
            tainted = [v in binding.tainted for v in node.inputs]
            visits.append(_Visit(
                node, step if a else None, a.rule if a else None, a.where if a else "", tainted,
                bool(a and step and a.rule.conserves(node, step.spec, tainted)),
                [None if v in binding.boundary else _producer(graph, v) for v in node.inputs]))
        cache.visits = visits
    return cache.visits


def releases(visits: list[_Visit], spare: frozenset[str], constants: frozenset[str]) -> Release:
    """The values some visit reads (as an input or output of its node), and per visit those no later
    visit reads and neither ``spare`` nor ``constants`` holds: :func:`walk` drops them from ``env`` after
    that visit, so a value's memory is freed once its last reader has run (relevance held in signal form
    keeps its own reference to the value until it is multiplied out); the values no visit reads go first."""
    reads = [(*visit.node.inputs, *visit.node.outputs) for visit in visits]
    return Release(frozenset(v for names in reads for v in names) | spare,
                   [StepLife(dead, (), ()) for dead in deaths(reads, spare | constants)])


def walk(binding: Binding, plan: Plan, env: Values, output: str, seed: Tensor,
         *, audit: bool = True, tolerance: float = 1e-4, record_at: frozenset[str] = frozenset(),
         release: frozenset[str] | None = None, recycler: Recycler | None = None, conditions: Any = None) -> Flow:
    """Run the rules backward from ``output``, whose relevance is ``output ⊙ seed`` (:class:`RelevanceWalk`).

    A conserving node's error is judged against the largest of |in|, |out| and
    |absorbed|; where those cancel (GI after a LayerNorm sums to ~0 from large terms),
    against Σ|R| arriving, the mass. On CPU the mass is measured only for the nodes
    that need it; on other devices, to avoid a sync per node, for every conserving one.

    With ``release`` (a set of value names), the walk owns ``env``: each forward value is deleted
    from it after its last reader (:func:`releases`), except the constants, ``output``, the
    boundary, ``record_at`` and the values ``release`` names, which the caller reads afterwards.
    ``recycler``: the explanation's (:class:`~rulegraph.lifetimes.Recycler`), where it keeps large tensors.
    ``conditions``: masks at chosen values (:class:`rulegraph.inside.Conditions`, conditional relevance).
    """
    walker = RelevanceWalk(binding, plan, env, output, seed, audit, tolerance, record_at, recycler, conditions)
    visits = _visits(binding, plan)
    lives = None
    if release is not None:
        spare = frozenset(binding.boundary) | record_at | release | {output}
        cache = WalkCache.of(binding.walks, plan)
        if spare not in cache.releases:
            cache.releases[spare] = releases(visits, spare, frozenset(plan.constants))
        read, lives = cache.releases[spare].read, cache.releases[spare].lives
        for v in [v for v in env if v not in read and v not in plan.constants]:
            del env[v]
    walker.run(visits, lives)
    return walker.collected()


#: the most elements a batched walk's relevance holds per value (targets × the largest relevance a visit holds);
#: more targets than that allows are walked in groups (:func:`walk_many`)
GROUP = 1 << 25
#: an output this large (elements: a language model's [positions, vocabulary] logits), or with this many
#: classes (a vocabulary: the head computed at a few positions only, :mod:`rulegraph.canonize.rows`), is
#: explained one target at a time, each seeded as its walk starts (:meth:`RelevancePass.run_many`)
ONE_BY_ONE_FROM, VOCABULARY_FROM = SPARSE_ROWS_FROM, 1 << 14


def walk_many(binding: Binding, plan: Plan, env: Values, output: str, seeds: list[Tensor], *, audit: bool = True,
              tolerance: float = 1e-4, record_at: frozenset[str] = frozenset(), conditions: Any = None,
              masks: dict[str, Tensor] | None = None) -> list[Flow]:
    """:func:`walk` for many seeds (``seeds``: K tensors of the output's shape) as one walk: every rule's
    arithmetic batched over a leading target axis by ``torch.func.vmap``, the forward values shared (read by
    every target, never copied per target), a :class:`Flow` per seed. The audit's sums are taken per target
    in the same walk: a row of ledger entries per target, the entries in one order for all. ``env`` is left
    whole. Where K times the largest relevance a visit holds (:func:`_carrying`) exceeds :data:`GROUP`
    elements, the targets are walked in groups. ``conditions`` (:class:`rulegraph.inside.Conditions`) with
    ``masks`` (value → ``[K, …]``, a mask per seed): each seed's walk conditioned by its own masks — several
    conditional maps in one walk. The flows equal :func:`walk`'s one seed at a time up to the order of
    batched sums (float64 to ~1e-16 relative).

    Batching pays where the per-node work is small (a classifier at a sentence's length: one walk for 20
    classes takes 0.65–0.93× the time of 20 walks); where it does not (:func:`one_at_a_time`),
    :class:`RelevancePass` walks one target at a time on the same forward values instead."""
    visits = _visits(binding, plan)
    width = max(1, GROUP // _largest(visits, env))
    flows: list[Flow] = []
    for i in range(0, len(seeds), width):
        given = None if masks is None else {v: m[i:i + width] for v, m in masks.items()}
        flows += _walk_group(binding, plan, env, output, seeds[i:i + width], visits, given, audit=audit,
                             tolerance=tolerance, record_at=record_at, conditions=conditions)
    return flows


def one_at_a_time(binding: Binding, plan: Plan, env: Values, output: str) -> bool:
    """Whether targets are better walked one at a time than batched (:func:`walk_many`): a language model's
    logits (an output of :data:`ONE_BY_ONE_FROM` elements or :data:`VOCABULARY_FROM` classes or more, whose
    VJP multiplies only the rows a seed reaches; on GPT-2 small at 64–480 tokens a batched walk was no faster,
    and larger), or relevance too large to hold for two targets within :data:`GROUP`."""
    out = env[output]
    return out.numel() >= ONE_BY_ONE_FROM or out.dim() > 1 and out.shape[-1] >= VOCABULARY_FROM or \
        2 * _largest(_visits(binding, plan), env) > GROUP


def _largest(visits: list[_Visit], env: Values) -> int:
    """The most elements of relevance one visit holds (:func:`_carrying`)."""
    return max((env[v].numel() for visit in visits for v in _carrying(visit) if isinstance(env.get(v), Tensor)),
               default=1)


def _carrying(visit: _Visit) -> list[str]:
    """The values whose relevance a visit holds (its outputs and the inputs its rule hands relevance to): what
    the batched walk holds once per target (a weight it reads, it holds once)."""
    return [*visit.outputs, *(v for v, tainted, _ in visit.edges if tainted)]


def _walk_group(binding: Binding, plan: Plan, env: Values, output: str, seeds: list[Tensor], visits: list[_Visit],
                masks: dict[str, Tensor] | None, *, audit: bool, tolerance: float, record_at: frozenset[str],
                conditions: Any) -> list[Flow]:
    """:func:`walk_many` for one group of seeds, under vmap."""
    traced: list[Flow] = []          # the walk's structure (nodes, edges, entry indices), one for every target

    def one(seed: Tensor, given: dict[str, Tensor] | None):
        flow, entries = _keyless(RelevanceWalk(binding, plan, env, output, seed, audit, tolerance, record_at, None,
                                               conditions if given is None else conditions.fixed(given),
                                               batched=True), visits, traced)
        return flow.boundary, flow.signals, flow.recorded, entries

    boundary, signals, recorded, entries = torch.func.vmap(one, in_dims=(0, None if masks is None else 0))(
        torch.stack(seeds), masks)
    shape, rows = traced[0], entries.tolist()
    return [_filled(shape, {v: t[k] for v, t in boundary.items()}, {v: t[k] for v, t in signals.items()},
                    {v: t[k] for v, t in recorded.items()}, rows[k], env[output], seed) for k, seed in enumerate(seeds)]


def _keyless(walker: RelevanceWalk, visits: list[_Visit], shapes: list[Flow]) -> tuple[Flow, Tensor]:
    """Run a walk whose ledger keeps its sums as tensors, keyed by nothing (``batched``: vmapped or traced):
    its flow, put in ``shapes`` too (its structure serves every target or input), and its sums stacked."""
    walker.run(visits, None)
    flow = walker.collected()
    shapes.append(flow)
    entries = flow.ledger.entries
    return flow, torch.stack(entries) if entries else walker.start.signal.new_zeros(0)


def _filled(shape: Flow, boundary: dict[str, Tensor], signals: dict[str, Tensor], recorded: dict[str, Tensor],
            entries: list[float], output: Tensor, seed: Tensor) -> Flow:
    """A walk's :class:`Flow` from its structure (``shape``: the nodes, edges and ledger entries a walk traced
    once, for every target or input it serves) and one seed's tensors and sums."""
    ledger = Ledger(shape.ledger.nan_safe, eager=True)
    ledger.entries = entries
    return Flow(boundary=boundary, start=_seeded(output, seed), ledger=ledger, nodes=shape.nodes, edges=shape.edges,
                stranded_entries=shape.stranded_entries, signals=signals, recorded=recorded, masked=shape.masked)


def traced_walk(binding: Binding, plan: Plan, values: Values, kept: tuple[str, ...], output: str, audit: bool,
                tolerance: float) -> tuple[Callable[..., tuple[Tensor, ...]], list[Flow]]:
    """The walk as a function of the seed and the forward's values ``kept`` (the rest of ``values`` is the same
    for every input of their shape), returning the boundary's relevance, its signals and the ledger's sums as
    tensors, for :mod:`rulegraph.passes.replay` to trace; the list it returns receives the walk's structure
    (:func:`replayed` reads it). The ledger keeps its sums as tensors, keyed by nothing (a traced tensor
    has no memory of its own), as under :func:`walk_many`'s vmap."""
    visits, shape = _visits(binding, plan), []
    plan.has_infinite_constants         # (read off the constants once, before the trace: it reads their data)

    def run(seed: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        env = Values(values, statics=values.statics)
        env.update(zip(kept, tensors))
        flow, entries = _keyless(RelevanceWalk(binding, plan, env, output, seed, audit, tolerance, frozenset(), None,
                                               batched=True), visits, shape)
        return *flow.boundary.values(), *flow.signals.values(), entries

    return run, shape


def replayed(forward: Forward, audit: bool) -> Flow:
    """The walk of a replayed forward (:mod:`rulegraph.passes.replay`): its trace's outputs for this seed
    (:func:`traced_walk`, the first time) put back into a :class:`Flow`; the tensors copied out of the buffers
    the next replay writes."""
    values, kept = forward.values, forward.replay.kept
    out, shape = forward.replay.walk(
        (forward.output, audit), [forward.seed, *(values[v] for v in kept)],
        lambda: traced_walk(forward.binding, forward.plan, values, kept, forward.output, audit,
                            tolerance(forward.plan.dtype)))
    boundary = {v: t.clone() for v, t in zip(shape.boundary, out)}
    signals = {v: t.clone() for v, t in zip(shape.signals, out[len(boundary):])}
    return _filled(shape, boundary, signals, {}, out[-1].tolist(), values[forward.output], forward.seed)


def _seeded(value: Tensor, seed: Tensor) -> Incoming:
    """The relevance at the explained output: ``value ⊙ seed``, held in signal form."""
    start = Incoming(value)
    start.add(Contribution(signal=seed))
    return start


class RelevanceWalk(Walker):
    """The relevance pass as a :class:`~rulegraph.lifetimes.Walker` over the reached nodes, last first: each
    visit hands the relevance arriving at a node's outputs to its rule, and the contributions to its
    inputs; the relevance that arrived is recycled once the visit has handed it on."""

    def __init__(self, binding: Binding, plan: Plan, env: Values, output: str, seed: Tensor, audit: bool,
                 tolerance: float, record_at: frozenset[str], recycler: Recycler | None, conditions: Any = None,
                 batched: bool = False):
        super().__init__(env, recycler)
        self.conditions = conditions
        self.binding, self.plan, self.audit, self.tolerance, self.record_at = binding, plan, audit, tolerance, record_at
        ledger = Ledger(plan.has_infinite_constants, eager=plan.device.type == "cpu" and not batched, batched=batched)
        self.incoming: dict[str, Incoming] = {}
        self.inflow: dict[str, list[int]] = {}           # value → ledger entries of the relevance handed to it
        self.start = self.incoming[output] = _seeded(env[output], seed)
        self.flow = Flow(boundary={}, start=self.start, ledger=ledger)
        self.arriving: list[Incoming | None] = []
        if audit:
            entry = ledger.arriving(self.start)
            self.inflow[output] = [entry]
            self.flow.edges.append(Edge(_producer(binding.graph, output), None, entry))

    def collected(self) -> Flow:
        """The flow once the walk has run: the relevance that reached the boundary (and its signal, where it
        arrived in signal form), and what reached a value no walked node produces, stranded."""
        flow, incoming, inflow = self.flow, self.incoming, self.inflow
        for v in self.binding.boundary:
            if v in incoming:
                arrived = incoming.pop(v)
                flow.boundary[v] = arrived.tensor
                if arrived.signal is not None:
                    flow.signals[v] = arrived.signal
        for v in incoming:  # relevance that reached a value no walked node produces
            flow.stranded_entries[v] = inflow.get(v, [])
        return flow

    def free(self, names: tuple[str, ...], recycle: bool) -> None:
        if recycle and self.recycler is not None:
            for a in self.arriving:                 # its relevance, handed on (or summed) by now
                if a is not None and a is not self.start:       # (the flow keeps the seed)
                    self.recycler.give(a.drop())
        super().free(names, recycle)

    def visit(self, visit: _Visit, life: StepLife | None) -> None:
        env, incoming, inflow = self.env, self.incoming, self.inflow
        arriving = self.arriving = [incoming.pop(v, None) for v in visit.outputs]
        if not any(arriving):
            return
        flow = self.flow
        masked: list[int] = []          # ledger entries of what a condition masked out here: absorbed at this node
        if self.conditions is not None:         # conditional relevance: the chosen units' share goes on
            arriving, masked = self.conditions.apply(visit.outputs, arriving, flow.ledger if self.audit else None)
            self.arriving = arriving
            flow.masked += masked
        if self.record_at:
            flow.recorded.update((v, a.tensor) for v, a in zip(visit.outputs, arriving)
                                 if a is not None and v in self.record_at)
        arrived = [i for v in visit.outputs for i in inflow.pop(v, ())]
        node = visit.node
        if visit.rule is None:  # unmatched under on_unmatched: warn — relevance is stranded here
            flow.stranded_entries[node.name] = arrived
            return
        step = visit.step
        if not env.keys() >= visit.reads:
            for v in (*node.inputs, *node.outputs):
                if v and v not in env:              # freed by the forward (RelevancePass.spills)
                    self.plan.recompute(env, v, self.recycler)
        inputs = env.arguments(step)
        site = Site(node=node, spec=step.spec, attrs=step.attrs, inputs=inputs,
                    outputs=[env[v] if v else None for v in visit.outputs],
                    tainted=visit.tainted, incoming=arriving, audit=self.audit, recycler=self.recycler)
        contributions = rule_failed(visit.rule.propagate, site, node, visit.where)
        if not self.audit:
            for (v, t, _), c in zip(visit.edges, contributions, strict=True):
                if c is not None and t:
                    a = incoming.get(v)
                    if a is None:
                        a = incoming[v] = Incoming(env[v])
                    a.add(c)
            return
        ledger = flow.ledger
        record = NodeFlow(node.name, visit.rule.name, visit.where, visit.conserving, entries_in=arrived,
                          entries_absorbed=[ledger.total(t) for t in site.absorbed] + masked)
        out, absorbed, edges = record.entries_out, record.entries_absorbed, flow.edges
        for (v, t, source), c, x in zip(visit.edges, contributions, inputs, strict=True):
            if c is None:
                continue
            # relevance moved whole, element by element, from one arrival (none masked here): that arrival's sum
            entry = arrived[0] if c.moved and len(arrived) == 1 and not masked else ledger.contribution(c, x)
            if t:
                a = incoming.get(v)
                if a is None:
                    a = incoming[v] = Incoming(env[v])
                a.add(c)
                entries = inflow.get(v)
                if entries is None:
                    inflow[v] = [entry]
                else:
                    entries.append(entry)
                out.append(entry)
                edges.append(Edge(source, node.name, entry))
            else:
                absorbed.append(entry)
        if visit.conserving and _needs_mass(ledger, record, self.tolerance):
            record.entries_mass = [ledger.arriving(a, mass=True) for a in arriving if a is not None]
        flow.nodes.append(record)


def _needs_mass(ledger: Ledger, record: NodeFlow, tolerance: float) -> bool:
    if not ledger.eager:
        return True
    r_in, r_out, r_abs = ledger.now(record.entries_in), ledger.now(record.entries_out), ledger.now(record.entries_absorbed)
    return abs(r_in - r_out - r_abs) > MASS_SCREEN * tolerance * max(abs(r_in), abs(r_out), abs(r_abs))


def finish(flow: Flow) -> Flow:
    """Turn the ledger into numbers (one device sync); the nodes and edges read them (:func:`audit_of`)."""
    ledger = flow.ledger
    ledger.settle()
    flow.stranded = {k: ledger(v) for k, v in flow.stranded_entries.items()}
    return flow


def _producer(graph, value: str) -> str | None:
    node = graph.producer.get(value)
    return node.name if node is not None else None


def audit_of(flow: Flow, binding: Binding, dtype: torch.dtype, unmapped: dict[str, float] | None = None) -> Audit:
    """Aggregate a finished :class:`Flow` per node, per layer and for the graph. ``unmapped``: per
    boundary value, the relevance that reached lookup elements of no input position (a constant the
    model inserts, :mod:`rulegraph.boundary`), booked as absorbed at the lookup."""
    graph = binding.graph
    layer_of = graph.layers
    nodes = []
    ledger = flow.ledger
    for rec in flow.nodes:
        node = graph.node(rec.name)
        r_in, r_out, r_abs = ledger(rec.entries_in), ledger(rec.entries_out), ledger(rec.entries_absorbed)
        gap = r_in - r_out - r_abs
        nodes.append(NodeAudit(
            name=rec.name, op=node.op, layer=layer_of[rec.name], rule=rec.rule, where=rec.where,
            conserving=rec.conserving, relevance_in=r_in, relevance_out=r_out,
            absorbed=r_abs, breaks=0.0 if rec.conserving else gap, error=gap if rec.conserving else 0.0,
            relative_error=relative(gap, ledger(rec.entries_mass), r_in, r_out, r_abs) if rec.conserving else 0.0,
            semantics=RULES["relevance"].get(rec.rule).breaking if rec.rule in RULES["relevance"] else ""))

    for value, amount in (unmapped or {}).items():
        if amount:
            node = graph.producer[value]
            nodes.append(NodeAudit(
                name=node.name, op=node.op, layer=layer_of[node.name], rule="boundary", where="boundary",
                conserving=True, relevance_in=amount, relevance_out=0.0, absorbed=amount, breaks=0.0, error=0.0,
                relative_error=0.0, semantics="a lookup at a constant index: no input position"))

    layers: dict[str, LayerAudit] = {}
    for n in sorted(nodes, key=lambda n: graph.node(n.name).index):
        layer = layers.setdefault(n.layer, LayerAudit(n.layer))
        layer.absorbed += n.absorbed
        layer.breaks += n.breaks
        layer.nodes += 1
    for e in flow.edges:
        src = layer_of[e.producer] if e.producer is not None else "input"
        dst = layer_of[e.consumer] if e.consumer is not None else "output"
        if src == dst:
            continue
        if src in layers:
            layers[src].relevance_in += ledger.values[e.entry]
        if dst in layers:
            layers[dst].relevance_out += ledger.values[e.entry]

    start = flow.start
    output_value = float(_seeded_sum(start.value, start.signal) if start.explicit is None
                         else start.explicit.sum(dtype=torch.float64))
    input_total = float(sum(torch.nansum(t.double()) for t in flow.boundary.values())) if flow.boundary else 0.0
    input_total -= sum((unmapped or {}).values())
    absorbed = sum(n.absorbed for n in nodes)
    breaks = sum(n.breaks for n in nodes)
    residual = output_value - input_total - absorbed - breaks
    conservation = Conservation(
        output_value=output_value, input_total=input_total, absorbed=absorbed, breaks=breaks,
        residual=residual, relative_error=relative(residual, output_value),
        stranded={k: float(v) for k, v in flow.stranded.items()})
    return Audit(conservation, list(layers.values()), nodes, tolerance(dtype))


def _seeded_sum(output: Tensor, seed: Tensor) -> Tensor:
    """``Σ output ⊙ seed`` in float64. A seed with at most two non-zero entries (a one-hot target, or a
    target and its contrast, of one item) multiplies those alone: the same bits as the sum over every
    element (the rest add exact zeros, the output being finite; two terms add in one rounding), without
    a pass over a language model's [positions, vocabulary] logits in float64. The entries are found in
    one pass over the seed (its rows' extremes; then the few rows that hold any)."""
    if output.shape == seed.shape and output.numel() > CHUNK:
        rows_of = seed.reshape(-1, seed.shape[-1])
        rows = nonzero_rows(rows_of)
        if rows.numel() <= 2:
            picked = rows_of[rows]
            if int(torch.count_nonzero(picked)) <= 2:
                row, column = picked.nonzero().T
                return (output.reshape(rows_of.shape)[rows[row], column] * picked[row, column]).to(torch.float64).sum()
    return product_sum(output, seed, dtype=torch.float64)


def _spare(binding: Binding) -> frozenset[str]:
    """What the forward keeps whatever it costs: the boundary, the outputs, the lookups' index values and the
    experts' routing weights."""
    graph = binding.graph
    return frozenset(binding.boundary) | frozenset(graph.outputs) | boundary_walk(graph).path_values() | \
        frozenset(b.weights for b in find_experts(graph))


@PASSES.register("relevance")
class RelevancePass(Pass):
    """Relevance from the explained output back to the boundary, by the rule set's relevance rules."""

    @classmethod
    def spills(cls, binding: Binding, plan: Plan) -> frozenset[str]:
        """The values the forward frees where they are large, because the walk computes them again when it
        reaches them, bit for bit: cheap arithmetic on kept values (an attention's scale, mask, softmax
        and casts: :meth:`~rulegraph.lifetimes.Lifetimes.recomputable`) and the products of two activations
        that outgrew their inputs (its scores: :meth:`~rulegraph.lifetimes.Lifetimes.spillable`); the
        boundary, the outputs, the lookups' index values and the experts' routing weights are kept."""
        cache = WalkCache.of(binding.walks, plan)
        if cache.spills is None:
            needs = Needs(binding.needed_values, frozenset(n.name for n in binding.reached), _spare(binding))
            cache.spills = plan.lifetimes.recomputable(needs) | plan.lifetimes.spillable(needs)
        return cache.spills

    def run(self, forward: Forward, *, audit: bool, record=(), at=None, condition=None, graph=False) -> Explanation:
        asked = _Asked.of(forward, audit, record, at, condition, graph)
        if len(asked.maps) > 1:
            raise InputError(f"the conditions make {len(asked.maps)} maps; rulegraph.explain returns them as a list")
        return self._walked(forward, asked, asked.maps[0] if asked.maps else None)

    def run_many(self, forwards: Iterable[Forward], *, audit: bool, record=(), at=None, condition=None,
                 graph=False) -> list[Explanation]:
        """Every forward (one input's, seeded for other targets) and every map the conditions make
        (:meth:`rulegraph.inside.Request.maps`), target by target, from one walk (:func:`walk_many`, each map's
        masks stacked beside the seeds); where that does not pay (:func:`one_at_a_time`: a language model's
        logits) a walk each, the forwards seeded one at a time (a seed is the logits' size)."""
        forwards = iter(forwards)
        first = next(forwards)
        asked = _Asked.of(first, audit, record, at, condition, graph)
        maps = asked.maps or [None]
        if one_at_a_time(first.binding, first.plan, first.values, first.output):
            return [self._walked(f, asked, c) for f in itertools.chain([first], forwards) for c in maps]
        pairs = [(f, c) for f in itertools.chain([first], forwards) for c in maps]
        masks = None
        if asked.maps:                  # each map's masks, made once, stacked per (target, map)
            made = [{v: c.mask(v, first.value(v)) for v in c.masks} for c in asked.maps]
            masks = {v: torch.stack([made[k % len(made)][v] for k in range(len(pairs))]) for v in made[0]}
        flows = walk_many(first.binding, first.plan, first.values, first.output, [f.seed for f, _ in pairs],
                          audit=audit, tolerance=tolerance(first.plan.dtype), record_at=asked.record_at,
                          conditions=asked.maps[0] if asked.maps else None, masks=masks)
        return [asked.explanation(f, flow, c) for (f, c), flow in zip(pairs, flows, strict=True)]

    @staticmethod
    def _walked(forward: Forward, asked: _Asked, conditions: Any) -> Explanation:
        """One walk of ``forward`` (freeing its values as it goes unless ``forward.shared``) and its explanation;
        a replayed forward's from its replay (:mod:`rulegraph.passes.replay`)."""
        if forward.replay is not None:           # (the options it does not replay were refused before the forward)
            refuse({"the audit of a mixture of experts": asked.moe})
            return asked.explanation(forward, replayed(forward, asked.audit), conditions)
        flow = walk(forward.binding, forward.plan, forward.values, forward.output, forward.seed, audit=asked.audit,
                    tolerance=tolerance(forward.plan.dtype), record_at=asked.record_at,
                    release=None if forward.shared else asked.kept, recycler=forward.recycler, conditions=conditions)
        return asked.explanation(forward, flow, conditions)


@dataclass
class _Asked:
    """What a relevance explanation asks beyond the input map: values recorded (``record``, ``--at``, the
    experts' outputs, the relevance graph's sites) and the conditions' maps; :meth:`explanation` reads a
    walk's flow."""

    audit: bool
    record: frozenset[str]
    inside: Any                     # rulegraph.inside.Request
    maps: list                      # rulegraph.inside.Conditions, one per map (none without conditions)
    moe: list
    layered: Any                    # rulegraph.layergraph.Sites
    graph: bool

    @classmethod
    def of(cls, forward: Forward, audit: bool, record, at, condition, graph: bool) -> _Asked:
        from ..inside import request
        from ..layergraph import Sites, sites
        unknown = [v for v in record if v not in forward.values and v not in forward.graph.producer]
        if unknown:
            raise InputError(f"record: the graph has no value {unknown[0]!r}")
        inside = request(forward.graph, forward.binding, at, condition)      # --at / --condition (rulegraph.inside)
        return cls(audit, frozenset(record), inside, inside.maps(forward.value),
                   find_experts(forward.graph) if audit else [],       # the audit shows relevance per expert
                   sites(forward.graph) if graph else Sites([], [], []),     # the relevance graph (rulegraph.layergraph)
                   graph)

    @property
    def record_at(self) -> frozenset[str]:
        return self.record | self.inside.values | {b.output for b in self.moe} | self.layered.recorded

    @property
    def kept(self) -> frozenset[str]:
        """What a walk that owns the forward's values must leave in them for :meth:`explanation`."""
        return frozenset(b.weights for b in self.moe) | self.layered.kept

    def explanation(self, forward: Forward, flow: Flow, conditions: Any = None) -> Explanation:
        from ..layergraph import build
        binding, values, dtype, audit, inside = forward.binding, forward.values, forward.plan.dtype, self.audit, self.inside
        if audit:
            finish(flow)
        arrived = {v: flow.boundary[v] if v in flow.boundary else torch.zeros_like(values[v]) for v in binding.boundary}
        boundary = forward.mapping.by_key(arrived)
        unmapped = {v: float(forward.mapping.unmapped(v, r)) for v, r in flow.boundary.items()} if audit else {}
        for key, r in boundary.items():
            if not torch.isfinite(r).all():
                raise NumericalError(f"relevance at {key!r} contains NaN or inf; a rule divided by a zero activation "
                                     "or an input was infinite — try the epsilon rule")
        e = forward.explanation(relevance={k: position_scores(v).detach().cpu() for k, v in boundary.items()},
                                boundary={k: v.detach().cpu() for k, v in boundary.items()},
                                audit=audit_of(flow, binding, dtype, unmapped) if audit else None)
        if self.moe:
            e.audit.experts = expert_audits(self.moe, flow.recorded, values)
        e.recorded = {v: r.detach().cpu() for v, r in flow.recorded.items() if v in self.record}
        e.inside = inside.read(flow.recorded, values)
        if self.graph:
            e.graph = build(self.layered, {**flow.boundary, **flow.recorded}, values, forward.plan, e.audit,
                            e.output_value)
        if conditions is not None:
            e.extra["condition"] = conditions.describe(flow.ledger(flow.masked) if audit else None)
        return e
