"""Reduction lowerings: ``mean`` / ``sum`` / ``amax`` / ``amin`` → ``Reduce*``, ``any`` /
``all`` via int64 ``ReduceMax`` / ``ReduceMin``, ``max.dim`` / ``min.dim`` (values and
indices), ``argmax`` / ``argmin`` and ``cumsum``.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .builder import INT64, Builder, _axis, lowers, out_dtype, rank


# -- reductions ----------------------------------------------------------------------------------------

def _reduce(op: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        x = a["self"]
        dims = a.get("dim")
        dims = [dims] if isinstance(dims, int) else (list(dims) if dims else [])
        keep = int(bool(a.get("keepdim", False)))
        xs = b.tensor(x, out_dtype(n), "input")
        if not dims:
            return b.emit(op, [xs], keepdims=keep)
        axes = [_axis(d, rank(x)) for d in dims]
        return b.emit(op, [xs, b.ints(axes, "axes")], keepdims=keep)
    return lower


lowers("aten.mean.dim", "aten.mean.default")(_reduce("ReduceMean"))
lowers("aten.sum.dim_IntList", "aten.sum.default")(_reduce("ReduceSum"))
lowers("aten.amax.default", "aten.max.default")(_reduce("ReduceMax"))
lowers("aten.amin.default", "aten.min.default")(_reduce("ReduceMin"))


@lowers("aten.any.default", "aten.any.dim", "aten.any.dims", "aten.all.default", "aten.all.dim", "aten.all.dims")
def _any_all(b: Builder, n: fx.Node, a: dict) -> str:
    """``any`` / ``all`` as ReduceMax / ReduceMin over the input cast to int64, cast back to bool."""
    x = a["self"]
    dims = a.get("dim")
    dims = [dims] if isinstance(dims, int) else (list(dims) if dims else [])
    keep = int(bool(a.get("keepdim", False)))
    op = "ReduceMax" if "any" in str(n.target) else "ReduceMin"
    xs = b.emit("Cast", [b.tensor(x, torch.bool, "input")], "int", to=INT64)
    inputs = [xs, b.ints([_axis(d, rank(x)) for d in dims], "axes")] if dims else [xs]
    return b.emit("Cast", [b.emit(op, inputs, "reduce", keepdims=keep)], to=torch.bool)


@lowers("aten.max.dim", "aten.min.dim")
def _max_dim(b: Builder, n: fx.Node, a: dict) -> list[str]:
    big = "max" in str(n.target)
    x, d, keep = a["self"], _axis(a["dim"], rank(a["self"])), int(bool(a["keepdim"]))
    values = b.emit("ReduceMax" if big else "ReduceMin", [b.value(x), b.ints([d], "axes")], "values",
                    keepdims=keep)
    indices = b.emit("ArgMax" if big else "ArgMin", [b.value(x)], "indices", axis=d, keepdims=keep)
    return [values, indices]


@lowers("aten.argmax.default", "aten.argmin.default")
def _argmax(b: Builder, n: fx.Node, a: dict) -> str:
    op = "ArgMax" if "argmax" in str(n.target) else "ArgMin"
    x, d = a["self"], a["dim"]
    if d is None:
        flat = b.emit("Reshape", [b.value(x), b.ints([-1], "flat_shape")], "flat")
        out = b.emit(op, [flat], "flat_index" if a["keepdim"] else None, axis=0, keepdims=0)
        if a["keepdim"]:
            return b.emit("Reshape", [out, b.ints([1] * rank(x), "shape")])
        return out
    return b.emit(op, [b.value(x)], axis=_axis(d, rank(x)), keepdims=int(bool(a["keepdim"])))


@lowers("aten.cumsum.default")
def _cumsum(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    axis = b.const(torch.tensor(_axis(a["dim"], max(rank(x), 1)), dtype=INT64), "axis")
    return b.emit("CumSum", [b.tensor(x, out_dtype(n), "input"), axis])
