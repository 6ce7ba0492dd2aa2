"""Value lifetimes: when a value dies, whose memory an op may take, and what a pass computes again.

One module decides how long every tensor of an explanation lives, for the forward
(:mod:`rulegraph.interpreter`) and the walks (:mod:`rulegraph.passes`):

* **liveness** (:func:`deaths`): a value dies after its last reader; a walk frees it there;
* **donors** (:func:`donor`): an elementwise op (trait ``into``) writes its output into an input that dies
  there and that nothing else holds — the same kernel and bits, without a fresh allocation;
* **recompute on a miss** (:meth:`Lifetimes.recomputable`, :meth:`Lifetimes.spillable`, :func:`spilled`):
  the forward frees a large value that a pass can compute again, bit for bit, when it reaches it;
* **recycling** (:class:`Recycler`): within an explanation, large CPU tensors a walk drops are kept and
  written into by the next op making one of that size (``out=``);
* **ownership** (:func:`sole_owner`): the one test of "nothing else holds this tensor" those three ask.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable

import torch

Tensor = torch.Tensor

#: the smallest value (bytes) the forward frees because a pass computes it again (:meth:`Lifetimes.recomputable`,
#: :meth:`Lifetimes.spillable`): below it, holding the value costs little memory, while computing it again
#: costs a fresh allocation and the op (8–12% of a 128-token AttnLRP explanation of a 6-layer BERT)
SPILL_FROM = 1 << 20
#: the smallest input (bytes) an elementwise op writes its output into (:func:`donor`): below it a fresh
#: tensor comes from the allocator's free lists, cheaper than the checks (glibc's default mmap threshold)
DONATE_FROM = 1 << 17
#: tensors smaller than this (bytes) are left to the allocator, which reuses them itself (:class:`Recycler`)
RECYCLE_FROM = 1 << 22
#: tensors a :class:`Recycler` keeps per size (elements, dtype, device)
HELD = 3
#: bytes a :class:`Recycler` keeps in all
HELD_BYTES = 1 << 30
#: how many cheap ops deep a value is recomputed rather than kept (:meth:`Lifetimes.recomputable`): attention's
#: scale, mask, softmax and casts after its scores (five in a Llama export)
RECOMPUTE_DEPTH = 6


# -- ownership ---------------------------------------------------------------------------------------
def sole_owner(t: Tensor, references: int) -> bool:
    """Whether nothing holds ``t`` but the ``references`` its caller counts (its names, list entries,
    dict values, attributes), and nothing its memory but ``t``: it is no view (a view holds its base),
    has no view, and no other tensor lies on its storage. The one place rulegraph counts references
    (:func:`sys.getrefcount`, torch's storage use count): memory that passes this test can be written
    into without any other holder seeing it change."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    # the references, this function's argument and getrefcount's; the storage: t and untyped_storage()'s
    return count is not None and not t._is_view() and sys.getrefcount(t) == references + 2 and \
        count(t.untyped_storage()._cdata) == 2


# -- liveness -------------------------------------------------------------------------------------------
def deaths(reads: Iterable[Iterable[str]], spare: frozenset[str] | set[str]) -> list[tuple[str, ...]]:
    """Per step of a walk (``reads``: per step, the values it reads or makes), the values no later step
    reads and ``spare`` does not hold: the walk frees them after that step."""
    last: dict[str, int] = {}
    n = 0
    for i, names in enumerate(reads):
        n = i + 1
        for v in names:
            last[v] = i
    dead: list[list[str]] = [[] for _ in range(n)]
    for v, i in last.items():
        if v and v not in spare:
            dead[i].append(v)
    return [tuple(d) for d in dead]


# -- the forward's schedule --------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepLife:
    """What the forward frees around one step: ``dead``, the values no later step reads (freed after it,
    unless held); ``made``, the values the step makes that a pass may compute again (freed where large,
    :func:`spilled`); ``donors``, the positions of its inputs among ``dead`` that it may write into."""

    dead: tuple[str, ...]
    made: tuple[str, ...]
    donors: tuple[int, ...]


@dataclass(frozen=True)
class Run:
    """A forward's schedule key: which steps it runs (by identity: a plan's step lists are fixed), what it
    keeps and, of that, what a pass computes again."""

    steps: int
    keep: frozenset[str]
    spill: frozenset[str]


@dataclass(frozen=True)
class Needs:
    """What a pass reads of a forward: ``keep`` the values, ``producers`` the nodes it visits (whose inputs
    it reads later than their outputs), ``spare`` the values kept whatever they cost."""

    keep: frozenset[str]
    producers: frozenset[str]
    spare: frozenset[str]


class Lifetimes:
    """The lifetimes of one plan's values (built by :class:`~rulegraph.interpreter.Plan`): ``varying``, the
    values computed on every run; ``steps``, the plan's value-dependent steps; ``spare``, the graph's
    inputs and outputs, which every forward keeps."""

    def __init__(self, varying: frozenset[str], steps: list, inputs: frozenset[str], outputs: frozenset[str]):
        self.varying = varying
        self.steps = steps
        self.inputs = inputs
        self.outputs = outputs
        self._runs: dict[Run, list[StepLife]] = {}
        self._spillable: dict[Needs, frozenset[str]] = {}
        self._recomputable: dict[tuple[Needs, int], frozenset[str]] = {}

    def schedule(self, steps: list, keep: frozenset[str], spill: frozenset[str]) -> list[StepLife]:
        """Per step, its :class:`StepLife`: the varying values no later step reads and ``keep`` does not hold
        (or holds in ``spill``: freed unless kept when made), the values of ``spill`` the step makes, and,
        for an op that can write into an input (:attr:`~rulegraph.ops.OpSpec.into`), the positions of its
        inputs among the first (:func:`donor`)."""
        key = Run(id(steps), keep, spill)
        if key not in self._runs:
            dead = deaths(((v for v in (*s.node.inputs, *s.node.outputs) if v in self.varying) for s in steps),
                          (set(keep) - spill) | self.outputs | self.inputs)
            self._runs[key] = [
                StepLife(d, tuple(v for v in s.node.outputs if v in spill),
                         tuple(i for i, v in enumerate(s.node.inputs) if v in d and v not in s.node.outputs)
                         if s.spec.into is not None else ())
                for d, s in zip(dead, steps)]
        return self._runs[key]

    def spillable(self, needs: Needs) -> frozenset[str]:
        """The values of ``needs.keep`` a pass may recompute when they outgrow their inputs: each the output
        of an :attr:`~rulegraph.ops.OpSpec.outgrows` op (a product of two activations: attention scores)
        named in ``needs.producers``, from two or more varying inputs, all in ``keep`` (a product with a
        weight matrix is not one; ``keep`` here counts what :meth:`recomputable` recomputes: rotated
        queries); never a value of ``needs.spare``. The forward frees such a value where it is large and
        has more elements than those inputs together (:func:`spilled`): Q·Kᵀ at L × L from Q and K at
        L × d is freed, P·V at L × d is kept. The recomputation runs the same kernel on the same tensors,
        so it equals the forward's value bit for bit."""
        if needs not in self._spillable:
            found = set()
            for step in self.steps:
                node = step.node
                if not step.spec.outgrows or node.name not in needs.producers or len(node.outputs) != 1:
                    continue
                out = node.outputs[0]
                ins = [v for v in node.inputs if v and v in self.varying]
                if out in needs.keep and out not in needs.spare and len(ins) > 1 and all(v in needs.keep for v in ins):
                    found.add(out)
            self._spillable[needs] = frozenset(found)
        return self._spillable[needs]

    def recomputable(self, needs: Needs, depth: int = RECOMPUTE_DEPTH) -> frozenset[str]:
        """The values of ``needs.keep`` a pass can recompute instead of keeping them through the forward:
        each the output of a :attr:`~rulegraph.ops.OpSpec.cheap` op (Add, Sub, Mul, Div: correctly rounded
        IEEE operations; Softmax, Cast, Where: the same kernel on the same tensor; so the recomputed
        tensor equals the forward's bit for bit) named in ``needs.producers`` (so its inputs are still
        there), from inputs kept or themselves recomputable, at most ``depth`` ops deep; never a value of
        ``needs.spare``. An attention's probabilities are one: the scale, mask, softmax and cast after its
        scores are recomputed from them, and the scores from the queries and keys where they outgrew them
        (:meth:`spillable`). The forward frees them where they are large (:func:`spilled`)."""
        key = (needs, depth)
        if key not in self._recomputable:
            levels: dict[str, int] = {}
            for step in self.steps:
                node = step.node
                if not step.spec.cheap or node.name not in needs.producers or len(node.outputs) != 1:
                    continue
                out = node.outputs[0]
                if out not in needs.keep or out in needs.spare or out in self.inputs:
                    continue
                ins = [v for v in node.inputs if v and v in self.varying]
                if not all(v in needs.keep for v in ins):
                    continue
                level = 1 + max((levels.get(v, 0) for v in ins), default=0)
                if level <= depth:
                    levels[out] = level
            self._recomputable[key] = frozenset(levels)
        return self._recomputable[key]


class Walker:
    """One loop over a walk's steps that owns its values' lifetimes: :meth:`run` visits each step in order
    (:meth:`visit`, which the forward and each pass override, as torch.fx's ``Interpreter.run`` calls
    ``run_node``), then frees the values that die there (:meth:`free`: out of ``env``, to ``recycler`` while
    ops remain to take them)."""

    #: whether no op of the explanation runs after this walk: what dies at its last step is then freed, not
    #: kept for reuse (the forward is not final: the pass's walk takes what it drops)
    final: ClassVar[bool] = True

    def __init__(self, env: dict[str, Any], recycler: Recycler | None = None):
        self.env = env
        self.recycler = recycler

    def run(self, steps: list, lives: list[StepLife] | None) -> None:
        """Visit ``steps`` with their :class:`StepLife` (``None``: every value is kept)."""
        last = len(steps) - 1 if self.final else len(steps)
        for i, step in enumerate(steps):
            life = lives[i] if lives is not None else None
            self.visit(step, life)
            self.free(life.dead if life is not None else (), recycle=i < last)

    def visit(self, step, life: StepLife | None) -> None:
        """What a walk does at one step (``life``: what dies there, or ``None``)."""
        raise NotImplementedError

    def free(self, names: tuple[str, ...], recycle: bool) -> None:
        env, recycler = self.env, self.recycler if recycle else None
        for v in names:
            if recycler is not None:
                recycler.give(env.pop(v, None))
            else:
                env.pop(v, None)


def spilled(env: dict[str, Any], step, name: str) -> bool:
    """Whether the forward frees value ``name``, which ``step`` just made and a pass can compute again: where
    it has at least :data:`SPILL_FROM` bytes and, made by a product of two activations
    (:attr:`~rulegraph.ops.OpSpec.outgrows`), more elements than its value inputs together."""
    out = env[name]
    if not isinstance(out, Tensor) or out.numel() * out.element_size() < SPILL_FROM:
        return False
    return not step.spec.outgrows or out.numel() > sum(
        env[v].numel() for v in step.node.inputs if v and isinstance(env.get(v), Tensor))


def donor(step, args: list, env: dict[str, Any], positions: tuple[int, ...]) -> Tensor | None:
    """An input of ``step`` whose memory its output can take, of those at ``positions`` (inputs no later
    step reads, :meth:`Lifetimes.schedule`): one of at least :data:`DONATE_FROM` bytes that can hold the
    output (:func:`_fits`) and that nothing else holds — no other name, view or caller, nor autograd
    (:func:`sole_owner`). It is taken out of ``env``; writing into it runs the op's own kernel
    (:attr:`~rulegraph.ops.OpSpec.into`), so the output has the same bits, without allocating (a fresh
    large tensor costs page faults, more than the op)."""
    if len(args) > 2 or torch.is_grad_enabled() and \
            any(isinstance(a, Tensor) and a.requires_grad for a in args):   # autograd records this op
        return None
    for i in positions:     # (no local name for args[i]: sole_owner counts its references)
        name = step.node.inputs[i]
        if _large(args[i]) and _fits(args, i) and env.get(name) is args[i] and \
                sole_owner(args[i], 1 + sum(a is args[i] for a in args)):       # env's and args' references
            return env.pop(name)
    return None


def _large(t: Any) -> bool:
    """Whether ``t`` is a tensor of at least :data:`DONATE_FROM` bytes."""
    return isinstance(t, Tensor) and t.numel() * t.element_size() >= DONATE_FROM


def _fits(args: list, i: int) -> bool:
    """Whether ``args[i]`` can hold the result of an elementwise op of ``args``: a floating tensor, and
    the other operand broadcasts to its shape without enlarging it and keeps its dtype (plain Python for
    the shapes: it runs before every such op)."""
    t = args[i]
    if not isinstance(t, Tensor) or not t.is_floating_point():
        return False
    if len(args) == 1:
        return True
    other = args[1 - i]
    return isinstance(other, Tensor) and other.dim() <= t.dim() and \
        all(a == b or a == 1 for a, b in zip(reversed(other.shape), reversed(t.shape))) and \
        torch.result_type(t, other) == t.dtype


# -- recycling ------------------------------------------------------------------------------------------
def large(numel: int, itemsize: int) -> bool:
    """Whether a tensor of ``numel`` elements of ``itemsize`` bytes is one a :class:`Recycler` keeps."""
    return numel * itemsize >= RECYCLE_FROM


class Recycler:
    """Large tensors an explanation has finished with, kept for the next op that makes one of the same size.

    A fresh large tensor costs page faults: the kernel maps and zeroes each page at its first touch, which
    takes about as long as the op that fills it (an attention map of 12 × 1,024 × 1,024 floats: 21 ms of
    a 32 ms Add). A relevance walk makes such tensors over and over, one layer after another: the
    attention scores, probabilities and their signals. One recycler lives for one explanation
    (:func:`rulegraph.passes.base.apply` makes it); the walkers hand it the tensors they drop (:meth:`give`)
    and hand it to the ops that make large tensors (their ``recycler`` argument,
    :attr:`~rulegraph.ops.OpSpec.recycles`), which write into one of them (:meth:`out`, ``out=``): the same
    kernel, so the same bits. Only a tensor nothing else holds is kept (:func:`sole_owner`), at most
    :data:`HELD` per size and :data:`HELD_BYTES` in all, and only on the CPU (on a GPU, torch's caching
    allocator already hands freed memory out again); it is handed out again whole, as a new tensor of the
    same number of elements."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[Tensor]] = {}
        self.held = 0           # bytes
        self.given = self.taken = 0

    def give(self, t: object) -> None:
        """Keep ``t`` for reuse if it is a large tensor that nothing else holds. The argument must be the only
        reference the caller has: ``give(values.pop(name))``, ``give(incoming.drop())``."""
        if not isinstance(t, Tensor) or not large(t.numel(), t.element_size()) or t.device.type != "cpu":
            return          # (the size first: most tensors a walk drops are small, and reading it costs least)
        if t.requires_grad or not t.is_contiguous() or t.storage_offset() or \
                t.untyped_storage().nbytes() != t.numel() * t.element_size() or not sole_owner(t, 1):
            return          # (sole_owner's 1: this method's argument)
        key = (t.numel(), t.dtype, t.device)
        size = t.numel() * t.element_size()
        kept = self._free.setdefault(key, [])
        if len(kept) < HELD and self.held + size <= HELD_BYTES:
            kept.append(t)
            self.held += size
            self.given += 1

    def out(self, shape: tuple[int, ...] | torch.Size, *operands: Tensor) -> dict[str, Tensor]:
        """``{"out": t}`` with a kept tensor of ``shape`` for an op of ``operands`` (one floating dtype and
        device, none recorded by autograd), or ``{}``: the op then allocates as usual. (No recycler is handed
        to an op under a torch.func transform, where ``out=`` is refused: the decomposition's vmapped rules
        call their ops without one.)"""
        first = operands[0]
        numel = 1
        for n in shape:
            numel *= n
        if not large(numel, first.element_size()) or not first.is_floating_point():
            return {}
        if any(o.dtype != first.dtype or o.device != first.device for o in operands) or \
                torch.is_grad_enabled() and any(o.requires_grad for o in operands):
            return {}
        kept = self._free.get((numel, first.dtype, first.device))
        if not kept:
            return {}
        storage = kept.pop().untyped_storage()
        self.held -= storage.nbytes()
        self.taken += 1
        # a new tensor on the old storage: the old one is gone, so a sum memoized while it lived (keyed by
        # its memory, held by a weak reference: the relevance ledger, the group sums) is not read again
        return {"out": torch.empty(0, dtype=first.dtype, device=first.device).set_(storage, 0, tuple(shape))}

    def broadcast_out(self, *operands: Tensor) -> dict[str, Tensor]:
        """:meth:`out` for an elementwise op of ``operands``: their broadcast shape."""
        if not operands:
            return {}
        return self.out(torch.broadcast_shapes(*(o.shape for o in operands)), *operands)


# -- what a walk prepares once per binding and plan --------------------------------------------------------
@dataclass(frozen=True)
class Release:
    """A walk's schedule for freeing the forward's values: ``read``, what some step reads or the walk spares
    (the rest is freed before the walk starts); ``lives``, per step, what is freed after it (:func:`deaths`)."""

    read: frozenset[str]
    lives: list[StepLife]


@dataclass
class WalkCache:
    """What a pass prepares once per binding and plan (:attr:`Binding.walks <rulegraph.ruleset.Binding>`, by
    ``id(plan)``): the relevance walk's visits, the values its forward frees (``spills``) and its release
    schedules by the values it spares."""

    plan: Any
    visits: list | None = None
    spills: frozenset[str] | None = None
    releases: dict[frozenset[str], Release] = field(default_factory=dict)
    #: the forward and walks traced per input shape (:mod:`rulegraph.passes.replay`), the oldest first
    replays: OrderedDict = field(default_factory=OrderedDict)

    @classmethod
    def of(cls, walks: dict[int, "WalkCache"], plan: Any) -> "WalkCache":
        """The cache for ``plan`` in ``walks`` (a new one where ``id(plan)`` names another, freed, plan)."""
        cache = walks.get(id(plan))
        if cache is None or cache.plan is not plan:
            cache = walks[id(plan)] = cls(plan)
        return cache
