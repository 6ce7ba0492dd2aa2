"""Normalisation and softmax."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .spec import Normalization, op, unbroadcast

Tensor = torch.Tensor


def _softmax_axis(x: Tensor, axis: int, coerce_2d: int):
    """Opset < 13 softmax flattens dims ``axis:`` into one; the loader sets ``coerce_2d`` there."""
    if not coerce_2d:
        return x, axis, None
    axis = axis % x.dim()
    return x.reshape(*x.shape[:axis], -1), axis, x.shape


def _softmax_vjp(grads, inputs, outputs, wants, *, axis=-1, coerce_2d=0, recycler=None):
    if not wants[0]:
        return [None]
    s, ax, shape = _softmax_axis(outputs[0], axis, coerce_2d)
    g, _, _ = _softmax_axis(grads[0], axis, coerce_2d)
    # s ⊙ (g − Σ g ⊙ s) by torch's fused kernel, the one autograd runs for softmax. It is private API,
    # kept because it is 1.6–3× faster than the plain expression on attention maps
    # (benchmarks/softmax_backward.py, results/softmax_backward.md); tests/ops check it against autograd.
    buffer = recycler.out(s.shape, g, s).get("out") if recycler is not None else None
    gx = torch._softmax_backward_data(g, s, ax % s.dim(), s.dtype) if buffer is None else \
        torch.ops.aten._softmax_backward_data.out(g, s, ax % s.dim(), s.dtype, grad_input=buffer)
    return [gx if shape is None else gx.reshape(shape)]


@op("Softmax", vjp=_softmax_vjp, cheap=True)
def softmax(x, *, axis=-1, coerce_2d=0, recycler=None):
    y, ax, shape = _softmax_axis(x, axis, coerce_2d)
    y = torch.softmax(y, dim=ax, **(recycler.out(y.shape, y) if recycler is not None else {}))
    return y if shape is None else y.reshape(shape)


@op("LogSoftmax")
def log_softmax(x, *, axis=-1, coerce_2d=0):
    y, ax, shape = _softmax_axis(x, axis, coerce_2d)
    y = torch.log_softmax(y, dim=ax)
    return y if shape is None else y.reshape(shape)


def norm_dims(x: Tensor, axis: int) -> tuple[int, ...]:
    """The trailing dims normalised by ONNX LayerNormalization with ``axis``."""
    axis = axis % x.dim()
    return tuple(range(axis, x.dim()))


def layer_norm_stats(x: Tensor, axis: int, epsilon: float) -> tuple[Tensor, Tensor]:
    """Mean and 1/√(Var+ε) over the normalised dims, kept for broadcasting."""
    dims = norm_dims(x, axis)
    var, mean = torch.var_mean(x, dim=dims, keepdim=True, correction=0)
    return mean, torch.rsqrt(var + epsilon)


def held_layer_norm_stats(x: Tensor, axis: int, epsilon: float) -> tuple[Tensor, Tensor]:
    """:func:`layer_norm_stats` as the fused kernel computes them: several times faster than
    ``var_mean``, but not differentiable (for VJPs and rules that hold them as values)."""
    dims = norm_dims(x, axis)
    _, mean, rstd = torch.native_layer_norm(x, x.shape[dims[0]:], None, None, epsilon)
    return mean, rstd


# ONNX's default epsilon. Kept at the exact 1e-5 (not the float32 attribute value) because the
# LN rule in rules.py falls back to the same literal; exporters always write the attribute.
_EPS = 1e-5


def _layer_norm_vjp(grads, inputs, outputs, wants, *, axis=-1, epsilon=_EPS, stash_type=1):
    """VJP of (Y, Mean, InvStdDev); the statistics' cotangents are usually absent."""
    x, scale = inputs[0], inputs[1]
    g = grads[0]
    mean, rstd = held_layer_norm_stats(x, axis, epsilon)
    xhat = (x - mean) * rstd
    dims = norm_dims(x, axis)
    out = [None] * len(inputs)
    g_mean = grads[1] if len(grads) > 1 else None
    g_rstd = grads[2] if len(grads) > 2 else None
    if wants[0]:
        gx = torch.zeros_like(x)
        if g is not None:
            gs = g * scale
            gx = rstd * (gs - gs.mean(dim=dims, keepdim=True) - xhat * (gs * xhat).mean(dim=dims, keepdim=True))
        count = math.prod(x.shape[d] for d in dims)
        if g_mean is not None:
            gx = gx + g_mean / count
        if g_rstd is not None:  # d rstd / dx = −rstd³ (x − mean) / N = −rstd² x̂ / N
            gx = gx - g_rstd * rstd * rstd * xhat / count
        out[0] = gx
    if g is None:
        return out
    if wants[1]:
        out[1] = unbroadcast(g * xhat, scale.shape)
    if len(inputs) > 2 and inputs[2] is not None and wants[2]:
        out[2] = unbroadcast(g, inputs[2].shape)
    return out


def _layer_norm_affine(tainted):
    """Affine in (scale, bias) with x fixed; the scale must be carried, since with the bias
    alone ``x̂·scale`` is a constant that no additive input absorbs."""
    return not tainted[0] and len(tainted) > 1 and bool(tainted[1])


def _rms(x: Tensor, axis: int, epsilon: float) -> Tensor:
    """1/√(mean x² + ε) over the normalised dims, kept for broadcasting."""
    return torch.rsqrt(x.pow(2).mean(dim=norm_dims(x, axis), keepdim=True) + epsilon)


#: LayerNorm's held statistics: centred over the trailing dims from ``axis``, 1/√(Var + ε) as the fused kernel
#: computes it, γ and β broadcast on those dims
LAYER_NORM = Normalization(dims=lambda x, attrs: norm_dims(x, int(attrs["axis"])),
                           factor=lambda x, attrs: held_layer_norm_stats(x, int(attrs["axis"]),
                                                                         float(attrs["epsilon"]))[1])
#: RMSNorm's: not centred, 1/√(mean x² + ε) over the trailing dims from ``axis``
RMS_NORM = Normalization(dims=lambda x, attrs: norm_dims(x, int(attrs["axis"])),
                         factor=lambda x, attrs: _rms(x, int(attrs["axis"]), float(attrs["epsilon"])), centred=False)
#: InstanceNorm's (GroupNorm's export): centred over the spatial dims of ``[N, C, …]``, γ and β per channel
INSTANCE_NORM = Normalization(dims=lambda x, attrs: tuple(range(2, x.dim())),
                              factor=lambda x, attrs: instance_norm_stats(x, float(attrs["epsilon"]))[1],
                              per_channel=True)


@op("LayerNormalization", affine=_layer_norm_affine, normalization=LAYER_NORM, additive=(2,), vjp=_layer_norm_vjp)
def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=_EPS, stash_type=1):
    dims = norm_dims(x, axis)
    shape = x.shape[dims[0]:]
    if scale.shape == shape and (bias is None or bias.shape == shape):
        y, mean, rstd = torch.native_layer_norm(x, shape, scale, bias, epsilon)
        return y, mean, rstd
    mean, rstd = layer_norm_stats(x, axis, epsilon)
    y = (x - mean) * rstd * scale
    return (y if bias is None else y + bias), mean, rstd


@op("RMSNormalization", affine=_layer_norm_affine, normalization=RMS_NORM)
def rms_normalization(x, scale, *, axis=-1, epsilon=_EPS, stash_type=1):
    return x * _rms(x, axis, epsilon) * scale


@op("SimplifiedLayerNormalization", affine=_layer_norm_affine, normalization=RMS_NORM)
def simplified_layer_normalization(x, scale, *, axis=-1, epsilon=_EPS, stash_type=1):
    return rms_normalization(x, scale, axis=axis, epsilon=epsilon)


@op("InstanceNormalization", affine=_layer_norm_affine, normalization=INSTANCE_NORM, additive=(2,))
def instance_normalization(x, scale, bias, *, epsilon=_EPS):
    """Per item and channel over the spatial dims (GroupNorm exports as this between Reshapes:
    PoolFormer), then ``scale`` and ``bias`` per channel."""
    return F.instance_norm(x, weight=scale, bias=bias, eps=epsilon)


def instance_norm_stats(x: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Mean and 1/√(Var+ε) over the spatial dims (2…) of ``[N, C, …]``, kept for broadcasting."""
    var, mean = torch.var_mean(x, dim=tuple(range(2, x.dim())), keepdim=True, correction=0)
    return mean, torch.rsqrt(var + epsilon)


def per_channel(v: Tensor, x: Tensor) -> Tensor:
    """A ``[C]`` vector shaped to broadcast over ``[…, C, spatial…]`` (the channel dim is x.dim() − spatial)."""
    return v.reshape(-1, *([1] * (x.dim() - 2)))
