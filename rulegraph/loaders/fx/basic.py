"""Lowerings that compute nothing or only sizes: asserts and shape guards (dropped),
dropout, copies and dtype conversions (``Identity`` / ``Cast``), ``view_as``-style
reshapes, ``getitem`` on tuple results, and SymInt arithmetic (``sym_size``,
``operator.add``, ``floordiv``, ``sym_max``…) on 1-element int64 tensors.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ...errors import UnsupportedOpError
from .builder import Builder, Sym, _axis, fx_dtype, lowers, out_dtype, rank


# -- dropped and pass-through ---------------------------------------------------------------------------

@lowers("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.default",
        "aten._assert_async.msg", "aten.sym_constrain_range.default", "aten.sym_constrain_range_for_size.default",
        "aten._functional_sym_constrain_range.default", "aten._functional_sym_constrain_range_for_size.default",
        "aten._functional_assert_async.msg", "aten._functional_assert_scalar.default",
        "aten._check_is_size.default", "torch._check", "torch._check_is_size",
        "torch.sym_constrain_range_for_size", "torch._assert", "torch._assert_async")
def _drop(b: Builder, n: fx.Node, a: dict) -> None:
    return None


@lowers("aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default",
        "aten.feature_alpha_dropout.default", "aten.contiguous.default", "aten.clone.default",
        "aten.alias.default", "aten.detach.default", "aten.detach_.default", "aten.lift_fresh_copy.default",
        "aten.lift_fresh.default")
def _identity(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Identity", [b.value(n.args[0])])


@lowers("aten.view_as.default", "aten.reshape_as.default", "aten.expand_as.default")
def _like_shape(b: Builder, n: fx.Node, a: dict) -> str:
    op = "Expand" if "expand" in str(n.target) else "Reshape"
    return b.emit(op, [b.value(a["self"]), b.dims(a["other"], 0, rank(a["other"]), "shape")])


@lowers("aten.to.dtype", "aten.to.device", "aten.to.dtype_layout", "aten.to.other", "aten._to_copy.default",
        "aten.type_as.default", "aten._to_dim_order_copy.default")
def _to(b: Builder, n: fx.Node, a: dict) -> str:
    x = n.args[0]
    want, have = out_dtype(n), fx_dtype(x)
    if want == have:
        return b.emit("Identity", [b.value(x)])
    return b.emit("Cast", [b.value(x)], to=want)


@lowers("operator.getitem")
def _getitem(b: Builder, n: fx.Node, a: dict) -> Any:
    seq, i = n.args
    v = b.value(seq)
    if not isinstance(v, list):
        raise UnsupportedOpError(f"fx node {n.name!r}: getitem on {seq.name!r}, which is not a tuple result")
    return v[i]


# -- symbolic sizes ---------------------------------------------------------------------------------------

@lowers("aten.sym_size.int")
def _sym_size(b: Builder, n: fx.Node, a: dict) -> Sym:
    x, d = a["self"], _axis(a["dim"], rank(a["self"]))
    return Sym(b.emit("Shape", [b.value(x)], start=d, end=d + 1))


@lowers("aten.sym_numel.default")
def _sym_numel(b: Builder, n: fx.Node, a: dict) -> Sym:
    size = b.emit("Size", [b.value(a["self"])], "size")
    return Sym(b.emit("Reshape", [size, b.ints([1], "shape")]))


def _sym_operand(b: Builder, v: Any, role: str) -> str:
    if isinstance(v, fx.Node):
        return b.int1(v, role)
    if isinstance(v, bool):
        return b.const(torch.tensor([v]), role)
    if isinstance(v, int):
        return b.ints([v], role)
    raise UnsupportedOpError(f"fx node {b.fx.name!r}: symbolic arithmetic on {v!r} (only ints) is not supported")


def _sym_binary(op: str, negate: bool = False):
    def lower(b: Builder, n: fx.Node, a: dict) -> Sym:
        x, y = (_sym_operand(b, v, f"arg{i}") for i, v in enumerate(n.args))
        if negate:
            return Sym(b.emit("Not", [b.emit(op, [x, y], "eq")]))
        return Sym(b.emit(op, [x, y]))
    return lower


for _name, _op in {"add": "Add", "sub": "Sub", "mul": "Mul", "mod": "Mod", "eq": "Equal", "lt": "Less",
                   "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}.items():
    lowers(f"operator.{_name}")(_sym_binary(_op))
lowers("operator.ne")(_sym_binary("Equal", negate=True))
lowers("torch.sym_max")(_sym_binary("Max"))
lowers("torch.sym_min")(_sym_binary("Min"))


@lowers("operator.floordiv")
def _sym_floordiv(b: Builder, n: fx.Node, a: dict) -> Sym:
    x, y = (_sym_operand(b, v, f"arg{i}") for i, v in enumerate(n.args))
    exact = b.emit("Sub", [x, b.emit("Mod", [x, y], "mod")], "sub")   # x - x mod y: exactly divisible
    return Sym(b.emit("Div", [exact, y]))


@lowers("operator.neg")
def _sym_neg(b: Builder, n: fx.Node, a: dict) -> Sym:
    return Sym(b.emit("Neg", [_sym_operand(b, n.args[0], "arg0")]))


@lowers("torch.sym_not", "operator.not_")
def _sym_not(b: Builder, n: fx.Node, a: dict) -> Sym:
    return Sym(b.emit("Not", [_sym_operand(b, n.args[0], "arg0")]))
