"""Op registry: each ONNX op type is a torch function plus what the rules need to know.

An op is registered with :func:`op`::

    @op("MatMul", affine=at_most_one_tainted, vjp=matmul_vjp)
    def matmul(a, b):
        return torch.matmul(a, b)

The forward takes the node's inputs positionally (``None`` for an omitted optional
input) and its ONNX attributes as keywords. Inputs listed in ``static`` arrive as
Python lists of ints (shapes, axes, pads), converted once per input shape.

What the relevance rules read from an :class:`OpSpec`:

``vjp``
    ``vjp(grads, inputs, outputs, wants, **attrs) -> list`` — the vector-Jacobian
    product per input (``None`` where not wanted). Ops without one fall back to
    torch autograd on a recomputation (:func:`autograd_vjp`).
``affine(tainted)``
    Whether the op is affine in the inputs flagged ``tainted`` when the others are
    held fixed. On such ops the gradient/z rules conserve relevance exactly.
``additive``
    Inputs that enter the output additively (a bias, the other summand, a Concat
    piece). The share a rule hands to such an input when it is a constant is
    *absorbed*; multiplicative constants (weights) take no share.
``routing``
    The op only moves, copies or selects elements of its data inputs (Reshape,
    Transpose, Slice, Gather with fixed indices…); the ``pass`` rule applies.
``elementwise``
    One data input, output of the same shape, position by position (``identity`` rule).
``float_output``
    ``False`` for ops whose outputs are integers or booleans (Shape, ArgMax, Equal…):
    relevance never flows through them.
``defaults``
    The forward's keyword defaults: the ONNX attribute defaults (a test checks them
    against the ONNX schemas). The interpreter completes every node's attributes with
    them once, so no rule repeats a default.
"""
from __future__ import annotations

import importlib
import inspect
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


@dataclass(frozen=True)
class OpSpec:
    name: str
    forward: Callable[..., Any]
    vjp: Callable[..., list] | None = None
    static: tuple[int, ...] = ()
    affine: Callable[[Sequence[bool]], bool] = never
    additive: tuple[int, ...] | str = ()
    routing: bool = False
    elementwise: bool = False
    data_dependent_shape: bool = False
    float_output: bool = True      # False for shapes, indices, comparisons: they never carry relevance
    domain: str = ""
    doc: str = field(default="", compare=False)
    defaults: dict[str, Any] = field(default_factory=dict, compare=False)

    def is_additive(self, index: int) -> bool:
        return self.additive == "all" or index in self.additive


REGISTRY: dict[tuple[str, str], OpSpec] = {}


def op(name: str, *, domain: str = "", **traits: Any) -> Callable:
    """Register the decorated torch function as the forward of ONNX op ``name``."""
    def register(fn: Callable) -> Callable:
        key = (domain, name)
        if key in REGISTRY:
            raise RuntimeError(f"op {name!r} (domain {domain!r}) is registered twice")
        defaults = {p.name: p.default for p in inspect.signature(fn).parameters.values()
                    if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}
        REGISTRY[key] = OpSpec(name=name, forward=fn, domain=domain, doc=(fn.__doc__ or "").strip(),
                               defaults=defaults, **traits)
        return fn
    return register


def lookup(op_type: str, domain: str = "", *, node: str = "", opset: int | None = None) -> OpSpec:
    """The spec for ``op_type``, or a one-line error naming the node, op and opset."""
    spec = REGISTRY.get((_canonical_domain(domain), op_type))
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


def autograd_vjp(spec: OpSpec, grads: list, inputs: list, outputs: list, wants: list[bool], attrs: dict) -> list:
    """VJP by recomputing the forward under autograd; for ops without an explicit one."""
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(True) if w else x for x, w in zip(inputs, wants)]
        out = spec.forward(*leaves, **attrs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        wanted = [x for x, w in zip(leaves, wants) if w]
        if not pairs:
            return [None] * len(inputs)
        got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
    it = iter(got)
    return [(next(it) if w else None) for w in wants]


def vjp(spec: OpSpec, grads: list, inputs: list, outputs: list, wants: list[bool], attrs: dict) -> list:
    if spec.vjp is not None:
        return spec.vjp(grads, inputs, outputs, wants, **attrs)
    return autograd_vjp(spec, grads, inputs, outputs, wants, attrs)


for _module in ("elementwise", "linalg", "nn", "shape", "reduce", "vision"):
    importlib.import_module(f"{__name__}.{_module}")
