"""Normalisation and softmax."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import op, unbroadcast

Tensor = torch.Tensor


def _softmax_axis(x: Tensor, axis: int, coerce_2d: int):
    """Opset < 13 softmax flattens dims ``axis:`` into one; the loader sets ``coerce_2d`` there."""
    if not coerce_2d:
        return x, axis, None
    axis = axis % x.dim()
    return x.reshape(*x.shape[:axis], -1), axis, x.shape


def _softmax_vjp(grads, inputs, outputs, wants, *, axis=-1, coerce_2d=0):
    if not wants[0]:
        return [None]
    s, ax, shape = _softmax_axis(outputs[0], axis, coerce_2d)
    g, _, _ = _softmax_axis(grads[0], axis, coerce_2d)
    gx = s * (g - (g * s).sum(dim=ax, keepdim=True))
    return [gx if shape is None else gx.reshape(shape)]


@op("Softmax", vjp=_softmax_vjp)
def softmax(x, *, axis=-1, coerce_2d=0):
    y, ax, shape = _softmax_axis(x, axis, coerce_2d)
    y = torch.softmax(y, dim=ax)
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


def _layer_norm_vjp(grads, inputs, outputs, wants, *, axis=-1, epsilon=1e-5, stash_type=1):
    x, scale = inputs[0], inputs[1]
    g = grads[0]
    mean, rstd = layer_norm_stats(x, axis, epsilon)
    xhat = (x - mean) * rstd
    dims = norm_dims(x, axis)
    out = [None] * len(inputs)
    if wants[0]:
        gs = g * scale
        out[0] = rstd * (gs - gs.mean(dim=dims, keepdim=True) - xhat * (gs * xhat).mean(dim=dims, keepdim=True))
    if wants[1]:
        out[1] = unbroadcast(g * xhat, scale.shape)
    if len(inputs) > 2 and inputs[2] is not None and wants[2]:
        out[2] = unbroadcast(g, inputs[2].shape)
    return out


@op("LayerNormalization", affine=lambda t: not t[0], additive=(2,), vjp=_layer_norm_vjp)
def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    dims = norm_dims(x, axis)
    shape = x.shape[dims[0]:]
    if scale.shape == shape and (bias is None or bias.shape == shape):
        y, mean, rstd = torch.native_layer_norm(x, shape, scale, bias, epsilon)
        return y, mean, rstd
    mean, rstd = layer_norm_stats(x, axis, epsilon)
    y = (x - mean) * rstd * scale
    return (y if bias is None else y + bias), mean, rstd


@op("RMSNormalization")
def rms_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    dims = norm_dims(x, axis)
    rms = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return x * rms * scale


@op("SimplifiedLayerNormalization")
def simplified_layer_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    return rms_normalization(x, scale, axis=axis, epsilon=epsilon)


@op("InstanceNormalization")
def instance_normalization(x, scale, bias, *, epsilon=1e-5):
    return F.instance_norm(x, weight=scale, bias=bias, eps=epsilon)
