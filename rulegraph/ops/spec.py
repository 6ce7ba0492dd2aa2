"""The op registry: :class:`OpSpec` (an op's forward and its traits), :func:`op` to register one,
:func:`lookup`, and the VJP helpers the families share. See :mod:`rulegraph.ops` for the traits."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..errors import UnsupportedOpError, choices

Tensor = torch.Tensor


def never(tainted: Sequence[bool]) -> bool:
    return False


def always(tainted: Sequence[bool]) -> bool:
    return True


def at_most_one(*indices: int) -> Callable[[Sequence[bool]], bool]:
    """Affine when at most one of ``indices`` is tainted (a product of two tainted inputs is not)."""
    def affine(tainted: Sequence[bool]) -> bool:
        return sum(bool(tainted[i]) for i in indices if i < len(tainted)) <= 1
    return affine


def only(*indices: int) -> Callable[[Sequence[bool]], bool]:
    """Affine when no input outside ``indices`` is tainted (e.g. Div: numerator only)."""
    def affine(tainted: Sequence[bool]) -> bool:
        return not any(t for i, t in enumerate(tainted) if i not in indices)
    return affine


#: the boolean traits a rule file selects ops by (``trait: routing``, ``through: routing``), see :mod:`rulegraph.ops`
#: (``pointwise`` is read by the input boundary, not by rule files)
TRAITS = ("routing", "elementwise", "activation", "sigmoidal", "normalization", "arithmetic")


@dataclass(frozen=True)
class Normalization:
    """What a normalization ``y = (x − mean(x)) · factor · γ + β`` computes from its own input, the
    statistics the LN rule (Ali et al. 2022, "XAI for Transformers", ICML, Sec. 4) and the decomposition's
    coefficient view (Yang et al. 2023, ACL, Eq. 6) hold constant: the dims it normalises over, whether it
    centres (LayerNorm) or not (RMSNorm), the ``factor`` (1/√(Var + ε) or 1/rms), and whether γ and β are
    per channel (``[C]`` on dim 1: InstanceNorm) or broadcast on the trailing dims (LayerNorm)."""

    #: ``dims(x, attrs)``: the dims normalised over (non-negative), ``attrs`` completed with the defaults
    dims: Callable[[Tensor, dict], tuple[int, ...]]
    #: ``factor(x, attrs)``: 1/σ or 1/rms over those dims, kept for broadcasting
    factor: Callable[[Tensor, dict], Tensor]
    centred: bool = True
    per_channel: bool = False

    def weight(self, v: Tensor, x: Tensor) -> Tensor:
        """γ or β shaped to broadcast over ``x``."""
        return v.reshape(-1, *([1] * (x.dim() - 2))) if self.per_channel else v

    def bias_share(self, s: Tensor, bias: Tensor, dims: tuple[int, ...]) -> Tensor:
        """``s`` (a signal on the output) summed to β's shape: over the batch and the normalised dims per
        channel, else over what broadcasting β added."""
        return s.sum(dim=(0, *dims)) if self.per_channel else unbroadcast(s, bias.shape)


#: how a product of two inputs, linear in each, combines them (:attr:`OpSpec.product`)
PRODUCT_KINDS = ("contraction", "elementwise", "affine")


@dataclass(frozen=True)
class OpSpec:
    name: str
    forward: Callable[..., Any]
    vjp: Callable[..., list] | None = None
    static: tuple[int, ...] = ()
    affine: Callable[[Sequence[bool]], bool] = never
    #: ``affine_if(attrs)``: where only some attribute values make the op affine (ScatterND's reduction
    #: ``none`` / ``add``), whether these do; ``attrs`` completed with the defaults
    affine_if: Callable[[dict], bool] | None = None
    additive: tuple[int, ...] | str = ()
    routing: bool = False
    #: ``routing_if(attrs)``: routing for these attribute values only (a scatter that writes, not one that
    #: adds): read by the input boundary; rule files' ``trait: routing`` selects :attr:`routing` ops only
    routing_if: Callable[[dict], bool] | None = None
    #: a routing op that moves each element of its one data input to exactly one place of its output, a
    #: permutation (Reshape, Transpose): what it hands back sums to what arrived, the order aside
    bijective: bool = False
    elementwise: bool = False
    activation: bool = False
    sigmoidal: bool = False
    #: normalises its input by the input's own statistics, which it declares (:class:`Normalization`)
    normalization: Normalization | None = None
    #: a product of two inputs that may both be activations, linear in each (:data:`PRODUCT_KINDS`):
    #: ``contraction`` sums over an index (MatMul, Einsum: Q·Kᵀ, the value product P·V), ``elementwise``
    #: multiplies position by position (Mul: a gated MLP), ``affine`` adds a constant term (Gemm: A·B + C)
    product: str = ""
    arithmetic: bool = False
    pointwise: bool = False
    #: outputs a mask (comparisons, logic): what depends on it depends on where, not on the values
    boolean: bool = False
    shape_only: bool = False
    data_dependent_shape: bool = False
    #: takes or returns tensor sequences (lists), which no relevance rule reads
    sequence: bool = False
    #: ``False`` for shapes, indices, comparisons (they never carry relevance); a function of the node where it
    #: depends on an attribute (Cast's ``to``); one flag per output where they differ (TopK: values, indices)
    float_output: bool | tuple[bool, ...] | Callable[[Any], bool] = True
    #: the output is input 0 up to an additive term the rules hold constant (a quantize–dequantize round
    #: trip): producer patterns look through it
    transparent: bool = False
    #: the output depends on the input values, but the rules hold it constant (a quantization error): it
    #: never carries relevance, whatever its type
    held: bool = False
    #: ``bias(b, output, attrs)``: the additive constant input as the op adds it to its output (broadcastable)
    bias: Callable[..., Any] | None = None
    #: ``size(args, attrs)``: the number of elements of the output, from the arguments, before the op runs —
    #: declared by ops whose output can outgrow their inputs (a shape to fill, a range, broadcasting), so that
    #: the interpreter refuses a tensor over the budget (:mod:`rulegraph.limits`) before allocating it
    size: Callable[[list, dict], int] | None = None
    #: computing the output again costs about what reading it does, and gives it bit for bit (correctly
    #: rounded arithmetic, a softmax, a cast, a select): the relevance pass recomputes it in its walk rather
    #: than keeping it through the forward (:meth:`rulegraph.lifetimes.Lifetimes.recomputable`)
    cheap: bool = False
    #: a product of two activations whose output can be far larger than its inputs (attention scores,
    #: L × L from L × d): the relevance pass drops it in the forward where it outgrew them and computes it
    #: again, bit for bit, when its walk gets there (:meth:`rulegraph.lifetimes.Lifetimes.spillable`)
    outgrows: bool = False
    #: whether the forward (``recycles``) and the VJP (``vjp_recycles``) take a ``recycler``
    #: (:class:`rulegraph.lifetimes.Recycler`) to write a large output into a tensor the explanation has
    #: finished with; read off their signatures
    recycles: bool = False
    vjp_recycles: bool = False
    #: ``into(*args, out=t)``: the op's torch function writing its output into ``t``; an elementwise op whose
    #: input dies at its node (no later reader, no other reference) writes into that input's memory instead
    #: of allocating (:meth:`rulegraph.interpreter.Plan.run`): the same kernel, so the same bits
    into: Callable[..., Any] | None = None
    domain: str = ""
    doc: str = field(default="", compare=False)
    defaults: dict[str, Any] = field(default_factory=dict, compare=False)

    def is_affine(self, node, tainted: Sequence[bool]) -> bool:
        """Whether ``node`` is affine in its ``tainted`` inputs (:attr:`affine`, and :attr:`affine_if` of
        its attributes)."""
        return self.affine(tainted) and (self.affine_if is None or self.affine_if({**self.defaults, **node.attrs}))

    def is_routing(self, node) -> bool:
        """Whether ``node`` only moves or selects elements of its data inputs (:attr:`routing`, or
        :attr:`routing_if` of its attributes)."""
        return self.routing or (self.routing_if is not None and self.routing_if({**self.defaults, **node.attrs}))

    def is_additive(self, index: int) -> bool:
        return self.additive == "all" or index in self.additive

    def data_inputs(self, node) -> list[int]:
        """The inputs whose values flow into the output: the additive ones where the op declares
        them (Where's two branches, Gather's table, Reshape's data), else all."""
        return [i for i in range(len(node.inputs)) if not self.additive or self.is_additive(i)]

    def outputs_float(self, node) -> bool:
        """Whether ``node``'s outputs are floating point (only those can carry relevance): any of them."""
        return any(self.floats(node))

    def carriers(self, node) -> list[bool]:
        """Per output of ``node``, whether it can carry relevance: floating point, and not ``held``."""
        return [False] * len(node.outputs) if self.held else self.floats(node)

    def floats(self, node) -> list[bool]:
        """Per output of ``node``, whether it is floating point."""
        flag = self.float_output(node) if callable(self.float_output) else self.float_output
        return list(flag) + [False] * (len(node.outputs) - len(flag)) if isinstance(flag, tuple) \
            else [flag] * len(node.outputs)


REGISTRY: dict[tuple[str, str], OpSpec] = {}


def op(name: str, *, domain: str = "", **traits: Any) -> Callable:
    """Register the decorated torch function as the forward of ONNX op ``name``."""
    def register(fn: Callable) -> Callable:
        key = (domain, name)
        if key in REGISTRY:
            raise RuntimeError(f"op {name!r} (domain {domain!r}) is registered twice")
        if not isinstance(traits.get("normalization"), (Normalization, type(None))):
            raise TypeError(f"op {name!r}: normalization= takes the Normalization it computes (its held "
                            "statistics), not a flag")
        if traits.get("product", "") not in ("", *PRODUCT_KINDS):
            raise TypeError(f"op {name!r}: product= is one of {', '.join(PRODUCT_KINDS)}")
        traits.setdefault("pointwise", bool(traits.get("elementwise") or traits.get("arithmetic")))
        traits.setdefault("cheap", bool(traits.get("arithmetic")))
        parameters = inspect.signature(fn).parameters
        defaults = {p.name: p.default for p in parameters.values()
                    if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and p.name != "recycler"}
        traits["recycles"] = "recycler" in parameters
        traits["vjp_recycles"] = traits.get("vjp") is not None and "recycler" in inspect.signature(traits["vjp"]).parameters
        REGISTRY[key] = OpSpec(name=name, forward=fn, domain=domain, doc=(fn.__doc__ or "").strip(),
                               defaults=defaults, **traits)
        return fn
    return register


def declaring(trait: str, *values: Any) -> tuple[str, ...]:
    """The op types (of the default domain) whose ``trait`` is set, or is one of ``values``, in
    registration order: the ops a rule applying to that trait names."""
    return tuple(name for (domain, name), spec in REGISTRY.items()
                 if not domain and (getattr(spec, trait) in values if values else getattr(spec, trait)))


def find(op_type: str, domain: str = "") -> OpSpec | None:
    """The spec for ``op_type``, or ``None`` where rulegraph has no implementation."""
    return REGISTRY.get((_canonical_domain(domain), op_type))


def lookup(op_type: str, domain: str = "", *, node: str = "", opset: int | None = None) -> OpSpec:
    """The spec for ``op_type``, or a one-line error naming the node, op and opset."""
    spec = find(op_type, domain)
    if spec is None:
        where = f"node {node!r}: " if node else ""
        dom = f", domain {domain!r}" if domain not in ("", "ai.onnx") else ""
        ops = f"opset {opset}" if opset else "any opset"
        known = [k[1] for k in REGISTRY if k[0] == _canonical_domain(domain)]
        valid = choices(known, op_type) if known else (
            f"rulegraph implements no op of domain {domain!r}; ops of the default ONNX domain: "
            f"{choices(k[1] for k in REGISTRY if not k[0])}")
        raise UnsupportedOpError(f"{where}op {op_type!r}{dom} ({ops}) has no implementation in rulegraph; {valid}")
    return spec


def unsupported(nodes) -> dict[tuple[str, str], list[str]]:
    """(domain, op) → the names of the nodes whose op has no implementation, in graph order."""
    missing: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        if (_canonical_domain(node.domain), node.op) not in REGISTRY:
            missing.setdefault((node.domain, node.op), []).append(node.name)
    return missing


def _canonical_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


# -- output sizes (OpSpec.size) ------------------------------------------------------

def broadcast_size(args: list, attrs: dict) -> int:
    """Elements of the numpy-broadcast of the tensor arguments (elementwise ops of several inputs), in
    plain Python: it runs before every such op."""
    shapes = [a.shape for a in args if isinstance(a, Tensor)]
    if not shapes:
        return 1
    first = shapes[0]
    if all(s == first for s in shapes):
        return math.prod(first)
    longest = max(map(len, shapes))
    dims = [1] * longest            # the broadcast shape, right-aligned: the largest size, or 0 where any is
    for shape in shapes:
        for j, d in enumerate(shape, longest - len(shape)):
            if d == 0 or dims[j] == 0:
                dims[j] = 0
            elif d > dims[j]:
                dims[j] = d
    return math.prod(dims)


# -- shared helpers for VJPs -------------------------------------------------------

def unbroadcast(grad: Tensor, shape: torch.Size | Sequence[int]) -> Tensor:
    """Sum ``grad`` over the dimensions numpy broadcasting added or stretched to reach ``shape``."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = grad.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1]
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.reshape(shape)


def valueless(t: Tensor) -> bool:
    """Whether ``t``'s values cannot steer a VJP: it carries the batched walk's target axis (a tensor
    ``torch.func.vmap`` maps over: :func:`rulegraph.passes.relevance.walk_many`), or it is traced (a fake
    tensor: :mod:`rulegraph.passes.replay`, where a path taken on one input's values would be replayed for
    every other). A VJP whose path depends on the values (which rows are zero:
    :func:`~rulegraph.ops.linalg.rows_matmul`) takes its dense one there."""
    from torch._subclasses.fake_tensor import is_fake
    return torch._C._functorch.is_batchedtensor(t) or is_fake(t)


def zeros_as(x: Tensor, grad: Tensor) -> Tensor:
    """Zeros laid out as ``torch.zeros_like(x)`` would be (its strides, read off a meta tensor: nothing is
    allocated for them) and dtype, for ``grad``'s VJP to be written into; made from ``grad``, so that under
    ``torch.func.vmap`` (the batched walk's target axis) they carry the target axis too."""
    return grad.new_empty_strided(x.shape, torch.empty_like(x, device="meta").stride(), dtype=x.dtype).zero_()


def autograd_vjp(spec: OpSpec, grads: list, inputs: list, outputs: list, wants: list[bool], attrs: dict) -> list:
    """VJP by recomputing the forward under ``torch.func.vjp``, for ops without an explicit one (also under
    ``torch.func.vmap``, where the cotangents carry a target axis: the batched walk); ``None`` for an input
    not wanted, or where no float output has a cotangent."""
    wanted = [i for i, w in enumerate(wants) if w]
    given = [k for k, g in enumerate(grads) if g is not None and k < len(outputs)
             and isinstance(outputs[k], Tensor) and outputs[k].is_floating_point()]
    if not wanted or not given:
        return [None] * len(inputs)

    def forward(*chosen: Tensor) -> tuple[Tensor, ...]:
        args = list(inputs)
        for i, x in zip(wanted, chosen):
            args[i] = x
        out = spec.forward(*args, **attrs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return tuple(outs[k] for k in given)

    with torch.enable_grad():
        _, back = torch.func.vjp(forward, *(inputs[i] for i in wanted))
        got = back(tuple(grads[k] for k in given))
    it = iter(got)
    return [(next(it) if w else None) for w in wants]


def vjp(spec: OpSpec, grads: list, inputs: list, outputs: list, wants: list[bool], attrs: dict,
        recycler=None) -> list:
    """The op's VJP (its own, else autograd's); ``recycler``: where its large outputs may be written."""
    if spec.vjp is not None:
        if recycler is not None and spec.vjp_recycles:
            return spec.vjp(grads, inputs, outputs, wants, recycler=recycler, **attrs)
        return spec.vjp(grads, inputs, outputs, wants, **attrs)
    return autograd_vjp(spec, grads, inputs, outputs, wants, attrs)

