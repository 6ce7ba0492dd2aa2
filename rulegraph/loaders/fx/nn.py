"""Lowerings of normalisation, activations and attention: ``layer_norm`` →
``LayerNormalization``, ``group_norm`` → ``InstanceNormalization`` over the groups (as torch.onnx writes it),
``_weight_norm`` → ``g · v / ‖v‖``, ``gelu`` → its erf / tanh expansion (``Gelu`` from opset 20),
``softmax`` / ``log_softmax``, and ``scaled_dot_product_attention`` → the eager-attention
pattern ``MatMul → Mul → mask → Softmax → MatMul``.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from ...errors import ModelError, UnsupportedOpError
from .builder import Builder, _static, fx_dtype, fx_val, lowers, out_dtype, rank


# -- normalisation, activations, attention ---------------------------------------------------------------

def _layer_norm_inputs(b: Builder, a: dict, x: Any) -> tuple[list[str], int]:
    shape = [_static(b, d, "normalized_shape") for d in a["normalized_shape"]]
    w = a["weight"]
    scale = b.value(w) if w is not None else b.const(torch.ones(shape, dtype=fx_dtype(x)), "scale")
    bias = b.value(a["bias"]) if a["bias"] is not None else None
    return [b.value(x), scale, bias], -len(shape)


@lowers("aten.layer_norm.default")
def _layer_norm(b: Builder, n: fx.Node, a: dict) -> str:
    inputs, axis = _layer_norm_inputs(b, a, a["input"])
    return b.emit("LayerNormalization", inputs, axis=axis, epsilon=float(a["eps"]))


@lowers("aten.native_layer_norm.default")
def _native_layer_norm(b: Builder, n: fx.Node, a: dict) -> list[str]:
    inputs, axis = _layer_norm_inputs(b, a, a["input"])
    return b.emit("LayerNormalization", inputs, outputs=3, axis=axis, epsilon=float(a["eps"]))


@lowers("aten.group_norm.default")
def _group_norm(b: Builder, n: fx.Node, a: dict) -> str:
    """``x`` ``[N, C, …]`` normalised per item and group of ``C / G`` channels, then scaled and shifted per
    channel: reshaped to ``[N, G, −1]``, ``InstanceNormalization`` with unit scale and zero shift, reshaped back,
    ``· weight + bias`` broadcast over the trailing dims (what torch.onnx exports)."""
    x, groups = a["input"], _static(b, a["num_groups"], "num_groups")
    dtype, r = fx_dtype(x), rank(x)
    grouped = b.emit("Reshape", [b.value(x), b.ints([0, groups, -1], "groups_shape")], "grouped")
    normed = b.emit("InstanceNormalization", [grouped, b.const(torch.ones(groups, dtype=dtype), "unit"),
                                              b.const(torch.zeros(groups, dtype=dtype), "zero")], "normed",
                    epsilon=float(a["eps"]))
    y = b.emit("Reshape", [normed, b.emit("Shape", [b.value(x)], "shape")], "ungrouped")
    trailing = b.ints([-1] + [1] * (r - 2), "channel_shape")
    if a["weight"] is not None:
        y = b.emit("Mul", [y, b.emit("Reshape", [b.value(a["weight"]), trailing], "weight")], "scaled")
    if a["bias"] is not None:
        y = b.emit("Add", [y, b.emit("Reshape", [b.value(a["bias"]), trailing], "bias")])
    return y


@lowers("aten._weight_norm.default")
def _weight_norm(b: Builder, n: fx.Node, a: dict) -> str:
    """A weight-normed weight ``g · v / ‖v‖``, the norm over every dim but ``dim`` (Salimans and Kingma, NeurIPS
    2016), as torch.onnx writes it: ``ReduceL2``, ``Div``, ``Mul``."""
    v, g = a["v"], a["g"]
    r, dim = rank(v), _static(b, a["dim"], "dim")
    dim = dim % r if r else 0
    norm = b.emit("ReduceL2", [b.value(v), b.ints([d for d in range(r) if d != dim], "axes")], "norm", keepdims=1)
    return b.emit("Mul", [b.value(v), b.emit("Div", [b.value(g), norm], "ratio")])


@lowers("aten.gelu.default")
def _gelu(b: Builder, n: fx.Node, a: dict) -> str:
    x, approximate = b.value(a["self"]), a["approximate"]
    if b.opset >= 20:
        return b.emit("Gelu", [x], approximate=approximate)
    c = lambda v, role: b.const(torch.tensor(v, dtype=torch.float64), role)  # noqa: E731
    if approximate == "tanh":  # torch.onnx (opset 9-19): ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
        cube = b.emit("Mul", [x, b.emit("Mul", [x, x], "square")], "cube")
        inner = b.emit("Add", [x, b.emit("Mul", [c(0.044715, "kappa"), cube], "kappa_cube")], "add")
        scaled = b.emit("Mul", [c(math.sqrt(2 / math.pi), "beta"), inner], "inner")
        gate = b.emit("Add", [c(1.0, "one"), b.emit("Tanh", [scaled], "tanh")], "gate")
        return b.emit("Mul", [c(0.5, "half"), b.emit("Mul", [x, gate], "mul")])
    erf = b.emit("Erf", [b.emit("Div", [x, c(1.4142135623730951, "sqrt2")], "div")], "erf")
    gate = b.emit("Add", [erf, c(1.0, "one")], "gate")
    return b.emit("Mul", [b.emit("Mul", [x, gate], "mul"), c(0.5, "half")])


@lowers("aten.softmax.int", "aten._softmax.default", "aten.log_softmax.int", "aten._log_softmax.default")
def _softmax(b: Builder, n: fx.Node, a: dict) -> str:
    op = "LogSoftmax" if "log_softmax" in str(n.target) else "Softmax"
    x = b.tensor(a["self"], out_dtype(n), "input")
    return b.emit(op, [x], axis=int(a["dim"]))


@lowers("aten.scaled_dot_product_attention.default")
def _sdpa(b: Builder, n: fx.Node, a: dict) -> str:
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if a.get("enable_gqa"):
        raise UnsupportedOpError(f"fx node {n.name!r}: scaled_dot_product_attention with enable_gqa=True "
                                 "is not supported; repeat the key/value heads before exporting")
    r = rank(q)
    scale = a["scale"]
    if scale is None:
        e = fx_val(q).shape[-1]
        if not isinstance(e, int):
            raise ModelError(f"fx node {n.name!r}: attention head size is symbolic; pass scale= explicitly")
        scale = 1.0 / math.sqrt(e)
    perm = list(range(rank(k)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    key_t = b.emit("Transpose", [b.value(k)], "key_t", perm=perm)
    scores = b.emit("MatMul", [b.value(q), key_t], "scores")
    scores = b.emit("Mul", [scores, b.const(torch.tensor(float(scale), dtype=torch.float64), "scale")], "scaled")
    minus_inf = None
    if mask is not None:
        if fx_dtype(mask) == torch.bool:
            minus_inf = b.const(torch.tensor(-math.inf, dtype=torch.float64), "minus_inf")
            scores = b.emit("Where", [b.value(mask), scores, minus_inf], "masked")
        else:
            scores = b.emit("Add", [scores, b.tensor(mask, fx_dtype(q), "mask")], "masked")
    if a["is_causal"]:
        size = b.emit("Concat", [b.dims(q, r - 2, r - 1, "q_len"), b.dims(k, r - 2, r - 1, "k_len")],
                      "causal_shape", axis=0)
        ones = b.emit("ConstantOfShape", [size], "causal_ones", value=torch.ones(1, dtype=torch.bool))
        causal = b.emit("Trilu", [ones], "causal_mask", upper=0)
        minus_inf = minus_inf or b.const(torch.tensor(-math.inf, dtype=torch.float64), "minus_inf")
        scores = b.emit("Where", [causal, scores, minus_inf], "causal")
    probs = b.emit("Softmax", [scores], "softmax", axis=-1)
    return b.emit("MatMul", [probs, b.value(v)])
