"""Reductions. ``axes`` is an attribute before opset 18 (13 for ReduceSum) and an input after."""
from __future__ import annotations

import torch

from .spec import always, op

Tensor = torch.Tensor


def _dims(x: Tensor, axes_in, axes, noop_with_empty_axes):
    axes = axes_in if axes_in is not None else axes
    if not axes:
        return None if noop_with_empty_axes else tuple(range(x.dim()))
    return tuple(a % x.dim() for a in axes)


def _reduction_vjp(scale_by_count: bool):
    def vjp(grads, inputs, outputs, wants, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        if not wants[0]:
            return [None] * len(inputs)
        x = inputs[0]
        dims = _dims(x, inputs[1] if len(inputs) > 1 else None, axes, noop_with_empty_axes)
        g = grads[0]
        if dims is None:
            return [g] + [None] * (len(inputs) - 1)
        if not keepdims:
            for d in sorted(dims):
                g = g.unsqueeze(d)
        if scale_by_count:
            count = 1
            for d in dims:
                count *= x.shape[d]
            g = g / count
        return [g.expand(x.shape)] + [None] * (len(inputs) - 1)
    return vjp


def _reducer(name, fn, **traits):
    def forward(x, axes_in=None, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        dims = _dims(x, axes_in, axes, noop_with_empty_axes)
        if dims is None:  # reduce over no axes: each element alone (x² for ReduceSumSquare, |x| for L1/L2)
            return fn(x.unsqueeze(-1), (x.dim(),), False)
        return fn(x, dims, bool(keepdims))
    forward.__name__ = name
    forward.__doc__ = f"ONNX {name}."
    op(name, static=(1,), **traits)(forward)


def _max(x, dims, keep):
    return torch.amax(x, dim=dims, keepdim=keep)


def _min(x, dims, keep):
    return torch.amin(x, dim=dims, keepdim=keep)


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keep)
    return x


_reducer("ReduceSum", lambda x, d, k: torch.sum(x, dim=d, keepdim=k),
         affine=always, additive=(0,), vjp=_reduction_vjp(False))
_reducer("ReduceMean", lambda x, d, k: torch.mean(x, dim=d, keepdim=k),
         affine=always, additive=(0,), vjp=_reduction_vjp(True))
_reducer("ReduceMax", _max)
_reducer("ReduceMin", _min)
_reducer("ReduceProd", _prod)
_reducer("ReduceSumSquare", lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k))
_reducer("ReduceL2", lambda x, d, k: torch.sqrt(torch.sum(x * x, dim=d, keepdim=k)))
_reducer("ReduceL1", lambda x, d, k: torch.sum(torch.abs(x), dim=d, keepdim=k))
_reducer("ReduceLogSumExp", lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k))
