"""Elementwise ops (numpy broadcasting), comparisons and logic, casts."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..lifetimes import large
from .spec import always, at_most_one, broadcast_size, only, op, unbroadcast

Tensor = torch.Tensor


def f32(value: float) -> float:
    """``value`` rounded to float32: ONNX float attributes are float32, so an attribute's
    default must equal what the model would hold had the exporter written it out."""
    return float(torch.tensor(value, dtype=torch.float32))


# -- arithmetic --------------------------------------------------------------------

def _add_vjp(grads, inputs, outputs, wants, **_):
    g = grads[0]
    return [unbroadcast(g, x.shape) if w else None for x, w in zip(inputs, wants)]


@op("Add", affine=always, additive="all", arithmetic=True, vjp=_add_vjp, size=broadcast_size, into=torch.add)
def add(a, b):
    return a + b


def _sub_vjp(grads, inputs, outputs, wants, **_):
    g = grads[0]
    return [unbroadcast(g, inputs[0].shape) if wants[0] else None,
            unbroadcast(-g, inputs[1].shape) if wants[1] else None]


@op("Sub", affine=always, additive="all", arithmetic=True, vjp=_sub_vjp, size=broadcast_size, into=torch.sub)
def sub(a, b):
    return a - b


def _mul_vjp(grads, inputs, outputs, wants, recycler=None, **_):
    g = grads[0]
    a, b = inputs
    return [unbroadcast(_times(g, b, recycler), a.shape) if wants[0] else None,
            unbroadcast(_times(g, a, recycler), b.shape) if wants[1] else None]


def _times(g: Tensor, x: Tensor, recycler) -> Tensor:
    """``g * x``, into a large tensor the explanation has finished with where ``g`` is one of that size and
    ``recycler`` has one (:class:`rulegraph.lifetimes.Recycler`)."""
    if recycler is None or not large(g.numel(), g.element_size()) or not isinstance(x, Tensor):
        return g * x
    return torch.mul(g, x, **recycler.broadcast_out(g, x))


@op("Mul", affine=at_most_one(0, 1), arithmetic=True, product="elementwise", vjp=_mul_vjp, size=broadcast_size, into=torch.mul)
def mul(a, b):
    return a * b


def _div_vjp(grads, inputs, outputs, wants, **_):
    g = grads[0]
    a, b = inputs
    return [unbroadcast(g / b, a.shape) if wants[0] else None,
            unbroadcast(-g * outputs[0] / b, b.shape) if wants[1] else None]


@op("Div", affine=only(0), arithmetic=True, vjp=_div_vjp, size=broadcast_size, into=torch.div)
def div(a, b):
    if not a.is_floating_point() and not b.is_floating_point():
        return torch.div(a, b, rounding_mode="trunc")
    return a / b


def _pow_vjp(grads, inputs, outputs, wants, **_):
    g = grads[0]
    x, y = inputs
    gx = gy = None
    if wants[0]:
        gx = unbroadcast(g * y * torch.pow(x, y - 1), x.shape)
    if wants[1]:
        gy = unbroadcast(g * outputs[0] * torch.log(x), y.shape)
    return [gx, gy]


@op("Pow", pointwise=True, vjp=_pow_vjp, size=broadcast_size)
def pow_(x, y):
    out = torch.pow(x, y)
    return out.to(x.dtype) if out.dtype != x.dtype else out


def _variadic(fn):
    def apply(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return apply


@op("Sum", affine=always, additive="all", pointwise=True, size=broadcast_size,
    vjp=lambda grads, inputs, outputs, wants, **_: [unbroadcast(grads[0], x.shape) if w else None
                                               for x, w in zip(inputs, wants)])
def sum_(*xs):
    return _variadic(torch.add)(*xs)


@op("Mean", affine=always, additive="all", pointwise=True, size=broadcast_size)
def mean_(*xs):
    return _variadic(torch.add)(*xs) / len(xs)


@op("Max", pointwise=True, size=broadcast_size)
def max_(*xs):
    return _variadic(torch.maximum)(*xs)


@op("Min", pointwise=True, size=broadcast_size)
def min_(*xs):
    return _variadic(torch.minimum)(*xs)


@op("Neg", affine=always, elementwise=True,
    vjp=lambda grads, inputs, outputs, wants, **_: [-grads[0] if wants[0] else None])
def neg(x):
    return -x


# -- unary math: one torch function each (their VJP where autograd on a recomputation would be slower) --

def _unary(name, fn, vjp=None):
    op(name, elementwise=True, vjp=vjp)(lambda x: fn(x))


for _name, _fn, _vjp in (
    ("Abs", torch.abs, None),
    ("Sign", torch.sign, None),
    ("Reciprocal", torch.reciprocal, None),
    ("Sqrt", torch.sqrt, lambda grads, inputs, outputs, wants, **_: [grads[0] / (2 * outputs[0]) if wants[0] else None]),
    ("Exp", torch.exp, lambda grads, inputs, outputs, wants, **_: [grads[0] * outputs[0] if wants[0] else None]),
    ("Log", torch.log, None),
    # rotary position embeddings (Llama, Qwen, Mistral exports) take the Cos/Sin of position × frequency
    ("Cos", torch.cos, lambda grads, inputs, outputs, wants, **_: [-grads[0] * torch.sin(inputs[0]) if wants[0] else None]),
    ("Sin", torch.sin, lambda grads, inputs, outputs, wants, **_: [grads[0] * torch.cos(inputs[0]) if wants[0] else None]),
    ("Floor", torch.floor, None),
    ("Ceil", torch.ceil, None),
    ("Round", torch.round, None),
):
    _unary(_name, _fn, _vjp)


@op("Mod", pointwise=True, size=broadcast_size)
def mod(a, b, *, fmod=0):
    return torch.fmod(a, b) if fmod else torch.remainder(a, b)


# -- activations ---------------------------------------------------------------------

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _erf_vjp(grads, inputs, outputs, wants, **_):
    if not wants[0] or grads[0] is None:
        return [None]
    d = inputs[0].square().neg_().exp_()
    return [(grads[0] * d).mul_(_TWO_OVER_SQRT_PI)]     # grads[0] first: it may carry a target axis (vmap)


@op("Erf", elementwise=True, activation=True, sigmoidal=True, vjp=_erf_vjp, into=torch.erf)
def erf(x):
    return torch.erf(x)


@op("Tanh", elementwise=True, activation=True, sigmoidal=True, into=torch.tanh,
    vjp=lambda grads, inputs, outputs, wants, **_: [grads[0] * (1 - outputs[0] * outputs[0]) if wants[0] else None])
def tanh(x):
    return torch.tanh(x)


@op("Sigmoid", elementwise=True, activation=True, sigmoidal=True, into=torch.sigmoid,
    vjp=lambda grads, inputs, outputs, wants, **_: [grads[0] * outputs[0] * (1 - outputs[0]) if wants[0] else None])
def sigmoid(x):
    return torch.sigmoid(x)


@op("Relu", elementwise=True, activation=True,
    vjp=lambda grads, inputs, outputs, wants, **_: [grads[0] * (inputs[0] > 0) if wants[0] else None])
def relu(x):
    return torch.relu(x)


@op("LeakyRelu", elementwise=True, activation=True)
def leaky_relu(x, *, alpha=f32(0.01)):
    return F.leaky_relu(x, alpha)


@op("Elu", elementwise=True, activation=True)
def elu(x, *, alpha=1.0):
    return F.elu(x, alpha)


@op("Softplus", elementwise=True, activation=True)
def softplus(x):
    return F.softplus(x)


@op("Gelu", elementwise=True, activation=True)
def gelu(x, *, approximate="none"):
    return F.gelu(x, approximate=approximate)


@op("Clip", elementwise=True, activation=True)
def clip(x, lo=None, hi=None, *, min=None, max=None):
    """Bounds are inputs from opset 11, attributes before; either may be absent."""
    lo = min if lo is None else lo
    hi = max if hi is None else hi
    if lo is None and hi is None:
        return x
    return torch.clamp(x, lo, hi)


# -- comparisons and logic (never relevance-carrying) ---------------------------------

def _compare(name, fn):
    op(name, float_output=False, boolean=name not in ("BitwiseAnd", "BitwiseOr"), size=broadcast_size)(lambda a, b: fn(a, b))


for _name, _fn in {
    "Equal": torch.eq, "Less": torch.lt, "LessOrEqual": torch.le, "Greater": torch.gt,
    "GreaterOrEqual": torch.ge, "And": torch.logical_and, "Or": torch.logical_or,
    "Xor": torch.logical_xor, "BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
}.items():
    _compare(_name, _fn)


@op("Not", float_output=False, boolean=True)
def not_(x):
    return torch.logical_not(x)


@op("IsNaN", float_output=False, boolean=True)
def isnan(x):
    return torch.isnan(x)


@op("IsInf", float_output=False, boolean=True)
def isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_negative:
        return torch.isneginf(x)
    if detect_positive:
        return torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


def _where_vjp(grads, inputs, outputs, wants, **_):
    cond, a, b = inputs
    g = grads[0]
    zero = torch.zeros((), dtype=g.dtype, device=g.device)
    return [None,
            unbroadcast(torch.where(cond, g, zero), a.shape) if wants[1] else None,
            unbroadcast(torch.where(cond, zero, g), b.shape) if wants[2] else None]


@op("Where", affine=only(1, 2), additive=(1, 2), routing=True, pointwise=True, vjp=_where_vjp, size=broadcast_size,
    cheap=True)
def where(cond, a, b):
    return torch.where(cond, a, b)


# -- identity-like ---------------------------------------------------------------------

def _same(grads, inputs, outputs, wants, **_):
    return [grads[0] if wants[0] else None] + [None] * (len(inputs) - 1)


@op("Identity", affine=always, additive=(0,), routing=True, bijective=True, elementwise=True, vjp=_same)
def identity(x):
    return x


@op("Dropout", affine=always, additive=(0,), routing=True, elementwise=True, vjp=_same)
def dropout(x, ratio=None, training_mode=None, *, seed=None):
    """Inference: the identity; the optional second output is an all-true mask (a broadcast view)."""
    return x, torch.ones((), dtype=torch.bool, device=x.device).expand(x.shape)


def _cast_vjp(grads, inputs, outputs, wants, **_):
    return [grads[0].to(inputs[0].dtype) if wants[0] and grads[0] is not None else None]


def _casts_to_float(node) -> bool:
    """Cast's output is floating point when its ``to`` is (CastLike's: taken as floating point)."""
    to = node.attrs.get("to")
    return to is None or to.is_floating_point


@op("Cast", affine=always, additive=(0,), routing=True, elementwise=True, vjp=_cast_vjp, float_output=_casts_to_float,
    cheap=True)
def cast(x, *, to, saturate=1):
    return x.to(to)


@op("CastLike", affine=always, additive=(0,), routing=True, elementwise=True, float_output=_casts_to_float,
    vjp=lambda grads, inputs, outputs, wants, **_: [
        grads[0].to(inputs[0].dtype) if wants[0] and grads[0] is not None else None, None])
def cast_like(x, like, *, saturate=1):
    return x.to(like.dtype)


# -- quantization ------------------------------------------------------------------------------

@op("DequantizeLinear")
def dequantize_linear(x, scale, zero_point=None, *, axis=1, block_size=0):
    """``(x − zero_point) · scale``, per tensor (a scalar scale) or per slice along ``axis`` (a 1-D
    scale); onnxruntime's ``quantize_dynamic`` stores an embedding table so. Blocked scales
    (``block_size``) repeat each scale over ``block_size`` elements of ``axis``."""
    axis %= max(x.dim(), 1)
    if scale.dim() == 1 and x.dim() > 0:
        if block_size:
            scale = scale.repeat_interleave(block_size)[: x.shape[axis]]
            zero_point = None if zero_point is None else zero_point.repeat_interleave(block_size)[: x.shape[axis]]
        shape = [1] * x.dim()
        shape[axis] = -1
        scale = scale.reshape(shape)
        zero_point = None if zero_point is None else zero_point.reshape(shape)
    shifted = x.to(scale.dtype) if zero_point is None else x.to(scale.dtype) - zero_point.to(scale.dtype)
    return shifted * scale
