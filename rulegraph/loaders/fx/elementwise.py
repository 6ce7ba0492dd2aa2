"""Elementwise lowerings: unary math and activations (``tanh``, ``relu``, ``rsqrt``, ``silu``,
``cos``/``sin`` of rotary embeddings…), arithmetic with torch's type promotion and ``alpha`` (``add``, ``sub``,
``rsub``, ``mul``, ``div`` with rounding modes, ``remainder``, ``pow``), ``maximum`` /
``minimum`` / ``clamp``, comparisons, logical and bitwise ops, ``where`` and
``masked_fill``.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ...errors import UnsupportedOpError
from .builder import Builder, common_dtype, fx_dtype, lowers, out_dtype


# -- elementwise ------------------------------------------------------------------------------------

def _unary(op: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        return b.emit(op, [b.tensor(n.args[0], out_dtype(n), "input")])
    return lower


for _target, _op in {"tanh": "Tanh", "relu": "Relu", "sigmoid": "Sigmoid", "exp": "Exp", "log": "Log",
                     "sqrt": "Sqrt", "neg": "Neg", "abs": "Abs", "erf": "Erf", "floor": "Floor", "ceil": "Ceil",
                     "reciprocal": "Reciprocal", "sign": "Sign", "cos": "Cos", "sin": "Sin"}.items():
    lowers(f"aten.{_target}.default")(_unary(_op))


@lowers("aten.rsqrt.default")
def _rsqrt(b: Builder, n: fx.Node, a: dict) -> str:
    root = b.emit("Sqrt", [b.tensor(a["self"], out_dtype(n), "input")], "sqrt")
    return b.emit("Div", [b.const(torch.tensor(1.0, dtype=torch.float64), "one"), root])


@lowers("aten.silu.default")
def _silu(b: Builder, n: fx.Node, a: dict) -> str:
    x = b.value(a["self"])
    return b.emit("Mul", [x, b.emit("Sigmoid", [x], "sigmoid")])


@lowers("aten.softplus.default")
def _softplus(b: Builder, n: fx.Node, a: dict) -> str:
    """softplus(βx)/β, torch's threshold (x where βx > 20) being the Softplus op's own."""
    beta, threshold = float(a.get("beta", 1.0)), float(a.get("threshold", 20.0))
    if threshold != 20.0:
        raise UnsupportedOpError(f"fx node {n.name!r}: softplus with threshold {threshold:g} (only torch's default, "
                                 "20, is lowered)")
    x = b.tensor(a["self"], out_dtype(n), "input")
    if beta == 1.0:
        return b.emit("Softplus", [x])
    scale = b.tensor(beta, out_dtype(n), "beta")
    return b.emit("Div", [b.emit("Softplus", [b.emit("Mul", [x, scale], "scaled")], "softplus"), scale])


@lowers("aten.leaky_relu.default")
def _leaky_relu(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("LeakyRelu", [b.value(a["self"])], alpha=float(a["negative_slope"]))


def _operands(b: Builder, n: fx.Node, x: Any, y: Any, dtype: torch.dtype) -> tuple[str, str]:
    return b.tensor(x, dtype, "a"), b.tensor(y, dtype, "b")


def _scaled(b: Builder, y: Any, alpha: Any, dtype: torch.dtype) -> str:
    """``alpha · y`` (just ``y`` for alpha 1)."""
    t = b.tensor(y, dtype, "b")
    if alpha is None or alpha == 1:
        return t
    return b.emit("Mul", [t, b.tensor(alpha, dtype, "alpha")], "alpha_b")


@lowers("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar")
def _add_sub(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    op = "Add" if "add" in str(n.target) else "Sub"
    return b.emit(op, [b.tensor(a["self"], dtype, "a"), _scaled(b, a["other"], a.get("alpha"), dtype)])


@lowers("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("Sub", [b.tensor(a["other"], dtype, "b"), _scaled(b, a["self"], a.get("alpha"), dtype)])


@lowers("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Mul", list(_operands(b, n, a["self"], a["other"], out_dtype(n))))


@lowers("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode",
        "aten.floor_divide.default", "aten.floor_divide.Scalar",
        "aten.div_.Tensor", "aten.div_.Scalar")     # in place (a router's `top /= top.sum()`): its result is used
def _div(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    mode = "floor" if "floor_divide" in str(n.target) else a.get("rounding_mode")
    x, y = _operands(b, n, a["self"], a["other"], dtype)
    if mode is None:
        return b.emit("Div", [x, y])
    if mode == "floor":
        if dtype.is_floating_point:
            return b.emit("Floor", [b.emit("Div", [x, y], "div")])
        exact = b.emit("Sub", [x, b.emit("Mod", [x, y], "mod")], "sub")   # x - x mod y, exactly divisible
        return b.emit("Div", [exact, y])
    if not dtype.is_floating_point:      # trunc on integers: ONNX Div
        return b.emit("Div", [x, y])
    raise UnsupportedOpError(f"fx node {n.name!r}: div with rounding_mode='trunc' on floats is not supported")


@lowers("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar")
def _remainder(b: Builder, n: fx.Node, a: dict) -> str:
    fmod = int("fmod" in str(n.target))
    return b.emit("Mod", list(_operands(b, n, a["self"], a["other"], out_dtype(n))), fmod=fmod)


@lowers("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Pow", list(_operands(b, n, a["self"], a["exponent"], out_dtype(n))))


@lowers("aten.maximum.default", "aten.minimum.default", "aten.max.other", "aten.min.other")
def _max_min(b: Builder, n: fx.Node, a: dict) -> str:
    """Elementwise max / min of two tensors (``torch.max(a, b)`` is ``aten.max.other``: T5's position buckets)."""
    op = "Max" if str(n.target).startswith(("aten.max", "aten.maximum")) else "Min"
    return b.emit(op, list(_operands(b, n, a["self"], a["other"], out_dtype(n))))


@lowers("aten.clamp.default", "aten.clamp.Tensor", "aten.clamp_min.default", "aten.clamp_max.default")
def _clamp(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    lo = a.get("min") if "clamp_max" not in str(n.target) else None
    hi = a.get("max") if "clamp_min" not in str(n.target) else None
    return b.emit("Clip", [b.tensor(a["self"], dtype, "input"),
                           b.tensor(lo, dtype, "min") if lo is not None else None,
                           b.tensor(hi, dtype, "max") if hi is not None else None])


_COMPARE = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}


def _compare(name: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        x, y = a["self"], a["other"]
        dtype = common_dtype(x, y)
        xs, ys = b.tensor(x, dtype, "a"), b.tensor(y, dtype, "b")
        if name == "ne":
            return b.emit("Not", [b.emit("Equal", [xs, ys], "eq")])
        return b.emit(_COMPARE[name], [xs, ys])
    return lower


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    lowers(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_compare(_name))


def _logical(kind: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        dtype = out_dtype(n)
        logical = dtype == torch.bool
        op = {"and": "And", "or": "Or"}[kind] if logical else {"and": "BitwiseAnd", "or": "BitwiseOr"}[kind]
        return b.emit(op, list(_operands(b, n, a["self"], a["other"], dtype)))
    return lower


lowers("aten.__and__.Tensor", "aten.__and__.Scalar", "aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar",
       "aten.logical_and.default")(_logical("and"))
lowers("aten.__or__.Tensor", "aten.__or__.Scalar", "aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar",
       "aten.logical_or.default")(_logical("or"))


@lowers("aten.logical_not.default", "aten.bitwise_not.default")
def _not(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    if "bitwise_not" in str(n.target) and fx_dtype(x) != torch.bool:
        raise UnsupportedOpError(f"fx node {n.name!r}: bitwise_not on {fx_dtype(x)} (only bool) is not supported")
    return b.emit("Not", [b.tensor(x, torch.bool, "input")])


@lowers("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def _where(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("Where", [b.tensor(a["condition"], torch.bool, "condition"),
                            b.tensor(a["self"], dtype, "a"), b.tensor(a["other"], dtype, "b")])


@lowers("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("Where", [b.tensor(a["mask"], torch.bool, "mask"), b.tensor(a["value"], dtype, "value"),
                            b.tensor(a["self"], dtype, "input")])
