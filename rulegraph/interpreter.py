"""Forward interpreter: runs the IR with torch ops on CPU or CUDA, in any of :data:`DTYPES` (float32, float64;
bfloat16 and float16 where the device computes in them).

A :class:`Plan` is the graph prepared for one device and dtype. Preparing it sorts
every value into the :class:`Stage` at which it is computed:

``CONST``  fixed by the model (initializers and what is computed from them only) —
           folded once, here;
``SHAPE``  fixed by the *shapes* of the inputs (``Shape`` and the arithmetic on it,
           position ids, the static arguments of Reshape…) — computed on the first
           run with a given input shape and then reused from a small cache;
``VALUE``  depends on the input values — computed on every run.

So a steady-state forward executes only the value-dependent nodes. All floating
tensors are computed in the plan's dtype (a ``Cast`` to float32 in float64 mode casts
to float64), so one exported model serves both precisions.

Each node's attributes are completed with its op's defaults when the plan binds it
(:attr:`~rulegraph.ops.OpSpec.defaults`, the ONNX defaults), so the rules read
``attrs["epsilon"]`` without repeating a default. A run returns its :class:`Values`:
every value by name, and the static arguments (shapes, axes) it handed to the ops.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import torch

from . import heap
from .errors import InputError, ModelError, NumericalError
from .ir import Graph, Node
from .limits import InputLimits, check_tensor, tensor_budget
from .loaders.metadata import export_info
from .options import DTYPE_NAMES
from .lifetimes import Lifetimes, Recycler, StepLife, Walker, donor, large, spilled
from .ops import OpSpec, lookup
from .ops.sequence import TensorSequence

Tensor = torch.Tensor

SHAPE_CACHE_SIZE = 32
#: the largest constant (elements) :attr:`Plan.has_infinite_constants` reads: masks and position tables
#: are below it, a language model's embedding table and LM head above
FINITE_CHECK_LIMIT = 1 << 24
#: the precisions a plan computes in (bfloat16 and float16 where the device supports them)
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def as_tensor(name: str, value: Any) -> Tensor:
    """An input's value as a tensor (arrays and nested lists of numbers convert), or an error naming it."""
    if isinstance(value, Tensor):
        return value
    try:
        value = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"input {name} must be a tensor or an array of numbers, got a {type(value).__name__}") from None
    return value


class Values(dict):
    """The values of one run by name, with ``statics``: (node index, input position) → the
    host list that input was handed to the op as (shapes, axes), for the rules to reuse."""

    __slots__ = ("statics",)

    def __init__(self, *args, statics: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.statics: dict[tuple[int, int], list] = statics if statics is not None else {}

    def arguments(self, step: "Step") -> list:
        """The node's forward arguments as the run passed them (static inputs as host lists)."""
        node = step.node
        args = [self[v] if v else None for v in node.inputs]
        for i in step.static:
            cached = self.statics.get((node.index, i))
            args[i] = cached if cached is not None else args[i].tolist()
        return args


class Stage(IntEnum):
    """When a value is computed (see the module docstring); a node's stage is its latest input's."""

    CONST = 0
    SHAPE = 1
    VALUE = 2


@dataclass
class Step:
    """One node bound to its implementation, with attributes converted for the plan."""

    node: Node
    spec: OpSpec
    attrs: dict[str, Any]
    stage: Stage
    static: tuple[int, ...]            # input positions that are passed as host lists
    static_stages: tuple[Stage, ...]   # the stage of each of those inputs


class Instruction:
    """One value-dependent step of a forward, resolved once per plan and schedule (:meth:`Plan.program`): its
    op's functions and converted attributes, the names it reads and writes, and what dies after it, so
    the forward's loop reads locals and slots, not the step's node, spec and life, at every step."""

    __slots__ = ("step", "name", "op", "forward", "into", "size", "recycles", "attrs", "inputs", "outputs",
                 "static", "donors", "dead", "made")

    def __init__(self, step: Step, life: StepLife | None):
        node, spec = step.node, step.spec
        self.step, self.name, self.op = step, node.name, node.op
        self.forward, self.into, self.size, self.recycles = spec.forward, spec.into, spec.size, spec.recycles
        self.attrs = step.attrs
        self.inputs, self.outputs = tuple(node.inputs), tuple(node.outputs)
        self.static = tuple(zip(step.static, step.static_stages))
        self.donors = life.donors if life is not None else ()
        self.dead = life.dead if life is not None else ()
        self.made = life.made if life is not None else ()


class ForwardWalk(Walker):
    """The forward as a :class:`~rulegraph.lifetimes.Walker`: each step runs (writing into a dying input
    where it can, :func:`~rulegraph.lifetimes.donor`), then what dies there is freed, less the values of
    ``spill`` held because they are small (:func:`~rulegraph.lifetimes.spilled`). Its :meth:`run` is the
    visit and the free of every step in one loop over the plan's :class:`Instruction` list (the forward of
    a short input is mostly this loop's own cost: a few microseconds a step, against kernels of tens)."""

    final = False

    def __init__(self, plan: "Plan", env: dict[str, Any], statics: dict, recycler: Recycler | None):
        super().__init__(env, recycler)
        self.plan, self.statics = plan, statics
        self.budget = tensor_budget()
        self.held: set[str] = set()          # values of ``spill`` kept: small, or not outgrowing their inputs

    def run(self, steps: list, lives: list[StepLife] | None) -> None:
        env, statics, budget, recycler, held = self.env, self.statics, self.budget, self.recycler, self.held
        itemsize = self.plan._itemsize
        for ins in self.plan.program(steps, lives):
            args = [env[v] if v else None for v in ins.inputs]
            into = None
            if ins.donors:
                donors = tuple(i for i in ins.donors if ins.inputs[i] not in held) if held else ins.donors
                if donors:
                    into = donor(ins.step, args, env, donors)
            execute(ins, args, env, statics, budget, itemsize, recycler, into)
            args = into = None          # no reference but env's: what dies is recycled, a later step may write into
            #                             its output (both ask sole_owner)
            if ins.made:
                held.update(v for v in ins.made if not spilled(env, ins.step, v))
            for v in ins.dead:
                if v not in held:           # (a donor, :func:`~rulegraph.lifetimes.donor`, is gone already)
                    if recycler is not None:
                        recycler.give(env.pop(v, None))
                    else:
                        env.pop(v, None)


def failed(step: Step, args: list, exc: Exception) -> ModelError:
    """The error naming the node whose op failed on ``args``, their shapes and dtypes."""
    node = step.node
    shapes = ", ".join("-" if a is None else (f"{tuple(a.shape)}:{str(a.dtype).removeprefix('torch.')}"
                                               if isinstance(a, Tensor) else repr(a)) for a in args)
    return ModelError(f"node {node.name!r} ({node.op}) failed on inputs [{shapes}]: "
                      f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def store(step: Step, out: Any, env: dict[str, Any], budget: int) -> None:
    """Put a step's output(s) in ``env``, refusing a tensor over the one-tensor ``budget``."""
    node = step.node
    for name, value in ((node.outputs[0], out),) if isinstance(out, (Tensor, TensorSequence)) else zip(node.outputs, out):
        if isinstance(value, Tensor) and value.numel() * value.element_size() > budget:
            # views too (Expand): their size is work for the ops after
            check_tensor(value.numel(), value.element_size(), f"node {node.name!r} ({node.op})")
        if name:
            env[name] = value


def execute(ins: Instruction, args: list, env: dict[str, Any], statics: dict, budget: int, itemsize: int,
            recycler: Recycler | None, into: Tensor | None) -> None:
    """Run one step on ``env``, the one way every step runs (the forward's loop, constant folding,
    recomputation): static arguments read once (``statics``), an output that can outgrow its inputs
    checked against the one-tensor ``budget`` before it runs, written into ``into`` (a dying input,
    :func:`~rulegraph.lifetimes.donor`) or into a tensor the ``recycler`` kept where it is large, and a
    failing op named with its node. ``args``: the step's inputs, read from ``env`` before a donor left it."""
    for i, k in ins.static:
        key = (ins.step.node.index, i)
        if key in statics:
            args[i] = statics[key]
        else:
            args[i] = args[i].tolist()
            if k != Stage.VALUE:
                statics[key] = args[i]
    count = -1                          # the output's elements, where the op declares them
    if ins.size is not None:             # an op whose output can outgrow its inputs: checked before it runs
        try:
            count = ins.size(args, ins.attrs)
        except Exception:      # noqa: BLE001 — arguments the op itself will refuse, naming them below
            count = 0
        if count * itemsize > budget:
            check_tensor(count, itemsize, f"node {ins.name!r} ({ins.op})")
    if into is None and recycler is not None and ins.into is not None and \
            large(count if count >= 0 else args[0].numel(), itemsize):
        # (no size declared: one input, of the output's size); a tensor the recycler kept, where there is one
        into = recycler.broadcast_out(*(a for a in args if isinstance(a, Tensor))).get("out")
    try:
        if into is not None:
            out = ins.into(*args, out=into)
        elif recycler is not None and ins.recycles:
            out = ins.forward(*args, recycler=recycler, **ins.attrs)
        else:
            out = ins.forward(*args, **ins.attrs)
    except Exception as exc:  # an op failing on these inputs: name the node
        raise failed(ins.step, args, exc) from exc
    if isinstance(out, (Tensor, TensorSequence)) and ins.outputs[0]:       # one output: stored here
        if isinstance(out, Tensor) and out.numel() * out.element_size() > budget:
            check_tensor(out.numel(), out.element_size(), f"node {ins.name!r} ({ins.op})")
        env[ins.outputs[0]] = out
    else:
        store(ins.step, out, env, budget)


def stages(graph: Graph) -> dict[str, Stage]:
    """The stage of every value: CONST, SHAPE or VALUE (see the module docstring)."""
    stage: dict[str, Stage] = {name: Stage.CONST for name in graph.constants}
    stage.update({name: Stage.VALUE for name in graph.input_names})
    stage[""] = Stage.CONST
    dynamic_shape: set[str] = set()  # values whose shape depends on input values
    for node in graph.nodes:
        spec = lookup(node.op, node.domain, node=node.name, opset=graph.opset)
        ins = [stage[v] for v in node.inputs]
        if spec.shape_only and ins and ins[0] != Stage.CONST:
            k = Stage.VALUE if node.inputs[0] in dynamic_shape else Stage.SHAPE
        else:
            k = max(ins, default=Stage.CONST)
        if spec.data_dependent_shape or any(v in dynamic_shape for v in node.inputs):
            dynamic_shape.update(node.outputs)
        for v in node.outputs:
            stage[v] = k
    return stage


class Plan:
    """A graph prepared for one device and dtype. Build it with :func:`prepare`."""

    def __init__(self, graph: Graph, device: torch.device, dtype: torch.dtype):
        heap.keep_freed()           # one explanation's freed values serve the next (rulegraph.heap)
        self.graph = graph
        self.device = device
        self.dtype = dtype
        self._itemsize = torch.empty((), dtype=dtype).element_size()
        self.stage = stages(graph)
        self.constants = {name: self._convert(t) for name, t in graph.constants.items()}
        steps = [self._bind(node) for node in graph.nodes]
        self._fold([s for s in steps if s.stage == Stage.CONST])
        self.steps = [s for s in steps if s.stage != Stage.CONST]
        self.value_steps = [s for s in self.steps if s.stage == Stage.VALUE]
        self.step_by_name = {s.node.name: s for s in self.steps}
        self._shape_cache: OrderedDict[tuple, tuple[dict, dict]] = OrderedDict()
        self.limits = InputLimits.of(graph, frozenset(v for v, k in self.stage.items() if k == Stage.SHAPE),
                                     export_info(graph).max_length)
        self.lifetimes = Lifetimes(frozenset(v for v, k in self.stage.items() if k == Stage.VALUE), self.value_steps,
                                   frozenset(graph.input_names), frozenset(graph.outputs))
        self._skipping: dict[tuple, list[Step]] = {}
        self._programs: dict[int, tuple[list, list[Instruction]]] = {}

    @functools.cached_property
    def has_infinite_constants(self) -> bool:
        """Whether a float constant or attribute holds ±inf or NaN (masks do; the audit's ledger asks).
        Weight tables above :data:`FINITE_CHECK_LIMIT` elements are not read for it: a memory-mapped
        embedding table would be paged in whole (an infinite weight shows in the output, which the
        prologue checks)."""
        return any(isinstance(v, Tensor) and v.is_floating_point() and v.numel() <= FINITE_CHECK_LIMIT
                   and not all_finite(v)
                   for v in (*self.constants.values(), *(a for s in self.steps for a in s.attrs.values())))

    # -- preparation -------------------------------------------------------------------
    def _convert(self, value: Any) -> Any:
        if isinstance(value, Tensor):
            if value.is_floating_point():
                value = value.to(self.dtype)
            return value.to(self.device)
        if isinstance(value, torch.dtype) and value.is_floating_point:
            return self.dtype
        return value

    def _bind(self, node: Node) -> Step:
        spec = lookup(node.op, node.domain, node=node.name, opset=self.graph.opset)
        attrs = {k: self._convert(v) for k, v in {**spec.defaults, **node.attrs}.items()}
        static = tuple(i for i in spec.static if i < len(node.inputs) and node.inputs[i])
        inputs = tuple(self.stage[node.inputs[i]] for i in static)
        k = max((self.stage[v] for v in node.outputs), default=Stage.CONST)
        return Step(node, spec, attrs, k, static, inputs)

    def _fold(self, steps: list[Step]) -> None:
        env = self.constants
        for step in steps:
            self._execute(step, env, {})

    # -- running ---------------------------------------------------------------------------
    def _execute(self, step: Step, env: dict[str, Any], statics: dict[int, list], budget: int | None = None,
                 donors: tuple[int, ...] = (), recycler: Recycler | None = None) -> None:
        """Run one step on ``env`` (folding constants, recomputing a freed value): :func:`execute` of its
        :class:`Instruction`; ``donors``: the positions of inputs no later step reads, whose memory the step
        may write its output into (:func:`~rulegraph.lifetimes.donor`)."""
        args = [env[v] if v else None for v in step.node.inputs]
        into = donor(step, args, env, donors) if donors else None
        execute(Instruction(step, None), args, env, statics, tensor_budget() if budget is None else budget,
                self._itemsize, recycler, into)

    def run(self, inputs: dict[str, Tensor], keep: frozenset[str] | None = None,
            overrides: dict[str, Tensor] | None = None, spill: frozenset[str] = frozenset(),
            recycler: Recycler | None = None) -> Values:
        """Run the graph; returns the :class:`Values` by name — all of them, or with ``keep`` only
        those plus the outputs (the rest is freed after its last use, which lets memory be
        reused while the forward runs; an elementwise op writes its output into an input that dies there,
        :func:`~rulegraph.lifetimes.donor`). Of ``keep``, the values of ``spill`` (:meth:`Lifetimes.recomputable
        <rulegraph.lifetimes.Lifetimes.recomputable>`, :meth:`~rulegraph.lifetimes.Lifetimes.spillable`) are freed too where they are large (:func:`~rulegraph.lifetimes.spilled`); a pass
        computes them again (:meth:`recompute`). ``recycler``: the explanation's, where it keeps large tensors.

        ``overrides`` maps value names to tensors used in place of what the graph would
        compute (e.g. embedding vectors replaced by interpolations, for integrated
        gradients): the nodes producing them are skipped. Only value-dependent values
        can be overridden, and each override must have the shape the graph would give it.
        """
        return self.run_feeds(self.feeds(inputs), keep, overrides, spill, recycler)

    def run_feeds(self, feeds: dict[str, Tensor], keep: frozenset[str] | None = None,
                  overrides: dict[str, Tensor] | None = None, spill: frozenset[str] = frozenset(),
                  recycler: Recycler | None = None) -> Values:
        """:meth:`run` on inputs already checked and converted (:meth:`feeds`): the shape steps run once per
        input shape, their results and static arguments kept; the value steps run every time."""
        signature = tuple((k, tuple(v.shape), v.dtype) for k, v in feeds.items())
        cached = self._shape_cache.get(signature)
        env = Values(self.constants)
        env.update(feeds)
        skipped: frozenset[str] = frozenset()
        if overrides:
            env.update(self._overrides(overrides))
            skipped = frozenset(overrides)
        if cached is not None:
            self._shape_cache.move_to_end(signature)
            shape_values, statics = cached
            env.update(shape_values)
            self._run_steps(self._without(self.value_steps, skipped), env, statics, keep, spill, recycler)
            env.statics = statics
            return env
        statics: dict = {}
        self._run_steps(self._without(self.steps, skipped), env, statics, keep, spill, recycler)
        shape_values = {v: env[v] for s in self.steps if s.stage == Stage.SHAPE for v in s.node.outputs if v}
        self._shape_cache[signature] = (shape_values, statics)
        env.statics = statics
        if len(self._shape_cache) > SHAPE_CACHE_SIZE:
            self._shape_cache.popitem(last=False)
        return env

    def _overrides(self, overrides: dict[str, Tensor]) -> dict[str, Tensor]:
        """Check the overridden values' names and convert the tensors to the plan's device and dtype."""
        out = {}
        for name, value in overrides.items():
            if self.stage.get(name) != Stage.VALUE or name in self.graph.input_names:
                what = "no such value" if name not in self.stage else (
                    "it is a graph input (pass it as an input)" if name in self.graph.input_names else
                    "it does not depend on the input values")
                raise InputError(f"cannot override {name!r}: {what}")
            if not isinstance(value, Tensor):
                value = torch.as_tensor(value)
            out[name] = self._convert(value)
        return out

    def _without(self, steps: list[Step], skipped: frozenset[str]) -> list[Step]:
        """``steps`` less those whose outputs are all overridden (the list is cached: the
        free schedule is keyed by it)."""
        if not skipped:
            return steps
        key = (id(steps), skipped)
        if key not in self._skipping:
            self._skipping[key] = [s for s in steps if not all(v in skipped for v in s.node.outputs if v)]
        return self._skipping[key]

    def program(self, steps: list[Step], lives: list[StepLife] | None) -> list[Instruction]:
        """``steps`` with their schedule ``lives`` (:meth:`Lifetimes.schedule
        <rulegraph.lifetimes.Lifetimes.schedule>`, ``None``: every value kept) as :class:`Instruction` s, made
        once per schedule (keyed by the list's identity: the plan's step lists and the schedules are kept)."""
        owner = lives if lives is not None else steps
        cached = self._programs.get(id(owner))
        if cached is None or cached[0] is not owner:
            cached = self._programs[id(owner)] = (owner, [
                Instruction(s, lives[i] if lives is not None else None) for i, s in enumerate(steps)])
        return cached[1]

    def _run_steps(self, steps: list[Step], env: dict, statics: dict, keep: frozenset[str] | None,
                   spill: frozenset[str], recycler: Recycler | None) -> None:
        lives = self.lifetimes.schedule(steps, keep, spill) if keep is not None else None
        ForwardWalk(self, env, statics, recycler).run(steps, lives)

    def recompute(self, env: "Values", name: str, recycler: Recycler | None = None) -> Tensor:
        """The value ``name``, computed again by its producer from ``env`` (its inputs first, where they
        are missing too) and put back in ``env``; see :meth:`Lifetimes.recomputable
        <rulegraph.lifetimes.Lifetimes.recomputable>`."""
        node = self.graph.producer[name]
        for v in node.inputs:
            if v and v not in env:
                self.recompute(env, v, recycler)
        self._execute(self.step_by_name[node.name], env, env.statics, recycler=recycler)
        return env[name]

    def feeds(self, inputs: dict[str, Any]) -> dict[str, Tensor]:
        """Check the user's inputs against the graph's and convert them to the plan's device and dtype."""
        expected = {i.name: i for i in self.graph.inputs}
        missing = [n for n in expected if n not in inputs]
        extra = [n for n in inputs if n not in expected]
        if missing or extra:
            want = ", ".join(i.describe() for i in self.graph.inputs)
            what = (f"missing input(s) {', '.join(missing)}" if missing else "") + \
                   ("; " if missing and extra else "") + \
                   (f"unknown input(s) {', '.join(extra)}" if extra else "")
            raise InputError(f"{what}; the model takes: {want}")
        feeds = {}
        for name, info in expected.items():
            value = as_tensor(name, inputs[name])
            if info.is_float != value.is_floating_point() or (value.dtype == torch.bool) != (info.dtype == torch.bool):
                raise InputError(f"input {name} must be {str(info.dtype).removeprefix('torch.')}, "
                                 f"got {str(value.dtype).removeprefix('torch.')}")
            if info.shape is not None:
                if value.dim() != len(info.shape):
                    raise InputError(f"input {name} must have {len(info.shape)} dims ({info.describe()}), "
                                     f"got shape {tuple(value.shape)}")
                for d, (want, got) in enumerate(zip(info.shape, value.shape)):
                    if isinstance(want, int) and want > 0 and want != got:
                        raise InputError(f"input {name} dim {d} must be {want}, got {got} (shape {tuple(value.shape)})")
            if value.is_floating_point():
                if not torch.isfinite(value).all():
                    raise NumericalError(f"input {name} contains NaN or inf")
                value = value.to(self.dtype)
            elif value.dtype != info.dtype:
                value = value.to(info.dtype)
            feeds[name] = value.to(self.device)
        self.limits.check(feeds, expected)
        return feeds

    def outputs(self, env: dict[str, Tensor]) -> dict[str, Tensor]:
        return {name: env[name] for name in self.graph.outputs}


@functools.lru_cache(maxsize=None)
def supports(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``device`` computes in ``dtype``: a matrix product and a softmax run (bfloat16 needs
    compute capability 8 on CUDA; float16 matrix products on CPU need a recent torch)."""
    if dtype in (torch.float32, torch.float64):
        return True
    try:
        x = torch.ones(2, 2, dtype=dtype, device=device)
        torch.softmax(x @ x, -1)
        return True
    except RuntimeError:
        return False


def all_finite(t: Tensor) -> bool:
    """``torch.isfinite(t).all()`` without its temporaries (a mask the size of ``t``: a whole embedding
    table's or a language model's logits' worth): the smallest and largest element, in one pass, are
    finite exactly when every element is (a NaN makes both NaN)."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def prepare(graph: Graph, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32) -> Plan:
    """The graph's :class:`Plan` for ``device`` and ``dtype`` (built once, then reused)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"unknown device {device!r}; valid: cpu, cuda, cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"device {device.type!r} is not supported; valid: cpu, cuda, cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for, but torch sees no CUDA device here")
    if isinstance(dtype, str):              # a name, as the command line takes it: "float64", "torch.float64"
        dtype = DTYPES.get(dtype.removeprefix("torch."), dtype)
    if dtype not in DTYPES.values():
        raise InputError(f"dtype must be one of {', '.join(DTYPES)} (a torch.dtype or its name), got {dtype!r}")
    if not supports(device, dtype):
        raise InputError(f"--dtype {str(dtype).removeprefix('torch.')} is not supported on {device} by this torch "
                         "build (a matrix product and a softmax in it fail); use float32")
    plans = graph.cache.plans
    key = (str(device), dtype)
    if key not in plans:
        plans[key] = Plan(graph, device, dtype)
    return plans[key]


def run(graph: Graph, inputs: dict[str, Any], *, device="cpu", dtype=torch.float32) -> dict[str, Tensor]:
    """Forward only: the graph's outputs by name."""
    plan = prepare(graph, device, dtype)
    return plan.outputs(plan.run(inputs, keep=frozenset()))
