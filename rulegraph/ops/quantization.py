"""Quantized deployment graphs: the ONNX quantization ops, and two ops of rulegraph's own that the
``quantization`` canonizer (:mod:`rulegraph.canonize.quantization`) writes in their place.

ONNX ops, as onnxruntime's quantization tools emit them:

* ``QuantizeLinear``: ``y = saturate(round(x / scale) + zero_point)`` (round half to even), per
  tensor or per ``axis`` (``DequantizeLinear``, ``y = (x − zero_point) · scale``, is in ``elementwise``).
* ``DynamicQuantizeLinear``: uint8 quantization with the scale and zero point computed from the
  input's range (``[min(0, x), max(0, x)]`` onto 0…255): outputs ``y, scale, zero_point``.
* ``MatMulInteger``, ``ConvInteger``: the product of (x − zero point) and (w − zero point) in int32.
  Integer sums are exact in float64 (|sum| < 2⁵³), where they are computed.

rulegraph's own (domain ``ai.rulegraph``; they never appear in a file, only in a canonized graph):

* ``QuantizationError(x, scale, zero_point)``: ``DequantizeLinear(QuantizeLinear(x)) − x``, the
  rounding a quantize–dequantize round trip adds (``dynamic=1``: with DynamicQuantizeLinear's
  range-based scale). Declared ``held``: it never carries relevance, the rules hold it constant.
* ``QuantizeDequantize(x, error)``: ``x + error``, affine in ``x`` with ``error`` an additive
  input, so every rule that books a constant's share books the error's as absorbed; ``transparent``:
  producer patterns look through it (a quantized Softmax output is still the probabilities).
"""
from __future__ import annotations

import torch

from .elementwise import dequantize_linear
from .spec import always, op, unbroadcast
from .vision import conv

#: the domain of rulegraph's own ops
RULEGRAPH_DOMAIN = "ai.rulegraph"
#: the integer types of quantized tensors, by ONNX TensorProto code, with their ranges
_TYPES = {2: torch.uint8, 3: torch.int8, 4: torch.uint16, 5: torch.int16}


def _range(dtype: torch.dtype) -> tuple[int, int]:
    info = torch.iinfo(dtype)
    return info.min, info.max


def _along(p: torch.Tensor | None, x: torch.Tensor, axis: int) -> torch.Tensor | None:
    """A per-axis parameter (1-D) shaped to broadcast along ``axis`` of ``x``; a scalar as it is."""
    if p is None or p.dim() == 0 or p.numel() == 1 and x.dim() == 0:
        return p
    if p.dim() == 1 and p.numel() == 1:
        return p.reshape(())
    shape = [1] * x.dim()
    shape[axis % x.dim()] = -1
    return p.reshape(shape)


def _output_type(zero_point: torch.Tensor | None, output_dtype: int) -> torch.dtype:
    if zero_point is not None:
        return zero_point.dtype
    if output_dtype and output_dtype not in _TYPES:
        raise ValueError(f"QuantizeLinear to element type {output_dtype} is not supported (uint8, int8, uint16, int16)")
    return _TYPES.get(output_dtype, torch.uint8)


@op("QuantizeLinear", float_output=False)
def quantize_linear(x, scale, zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
    """ONNX QuantizeLinear (opset 10–23, per tensor or per axis; not blocked, not float8)."""
    if block_size:
        raise ValueError("blocked quantization (block_size > 0) is not supported")
    dtype = _output_type(zero_point, output_dtype)
    if dtype.is_floating_point:
        raise ValueError(f"QuantizeLinear to {dtype} (float8) is not supported")
    low, high = _range(dtype)
    q = torch.round(x / _along(scale, x, axis))
    if zero_point is not None:
        q = q + _along(zero_point, x, axis).to(q.dtype)
    return q.clamp(low, high).to(dtype)


def _dynamic_parameters(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DynamicQuantizeLinear's scale and uint8 zero point for ``x`` (the ONNX definition)."""
    low = torch.clamp(x.min(), max=0) if x.numel() else x.new_zeros(())
    high = torch.clamp(x.max(), min=0) if x.numel() else x.new_zeros(())
    scale = (high - low) / 255
    zero = torch.where(scale > 0, torch.round((0 - low) / torch.where(scale > 0, scale, 1)), 0).clamp(0, 255)
    return scale, zero.to(torch.uint8)


@op("DynamicQuantizeLinear", float_output=(False, True, False))
def dynamic_quantize_linear(x):
    """ONNX DynamicQuantizeLinear: uint8 ``y``, the float ``scale`` and the uint8 ``zero_point``."""
    scale, zero = _dynamic_parameters(x)
    safe = torch.where(scale > 0, scale, 1)
    q = torch.where(scale > 0, torch.round(x / safe) + zero.to(x.dtype), 0)
    return q.clamp(0, 255).to(torch.uint8), scale, zero


def _centred(x: torch.Tensor, zero_point: torch.Tensor | None, shape_of: int | None = None) -> torch.Tensor:
    y = x.to(torch.float64)
    if zero_point is not None:
        z = zero_point.to(torch.float64)
        if z.dim() == 1 and z.numel() > 1 and shape_of is not None:   # per row (A) or per column (B)
            shape = [1] * x.dim()
            shape[shape_of] = -1
            z = z.reshape(shape)
        y = y - z
    return y


@op("MatMulInteger", float_output=False)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """ONNX MatMulInteger: ``(a − a_zero_point) @ (b − b_zero_point)`` in int32 (zero points per
    tensor, or per row of ``a`` / column of ``b``)."""
    product = torch.matmul(_centred(a, a_zero_point, -2 if a.dim() > 1 else None), _centred(b, b_zero_point, -1))
    return torch.round(product).to(torch.int32)


@op("ConvInteger", float_output=False)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    """ONNX ConvInteger: the convolution of ``x − x_zero_point`` by ``w − w_zero_point`` (per output
    channel) in int32."""
    out = conv(_centred(x, x_zero_point), _centred(w, w_zero_point, 0), auto_pad=auto_pad, dilations=dilations,
               group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    return torch.round(out).to(torch.int32)


@op("QuantizationError", domain=RULEGRAPH_DOMAIN, held=True)
def quantization_error(x, scale=None, zero_point=None, *, axis=1, output_dtype=0, dynamic=0):
    """``DequantizeLinear(QuantizeLinear(x)) − x`` with the pair's ``scale`` and ``zero_point``; with
    ``dynamic=1`` the round trip of DynamicQuantizeLinear (scale and zero point from ``x``'s range)."""
    if dynamic:
        q, scale, zero_point = dynamic_quantize_linear(x)
        axis = 1
    else:
        q = quantize_linear(x, scale, zero_point, axis=axis, output_dtype=output_dtype)
    return dequantize_linear(q, scale.to(x.dtype), zero_point, axis=axis) - x


def _add_vjp(grads, inputs, outputs, wants, **_):
    return [unbroadcast(grads[0], x.shape) if w else None for x, w in zip(inputs, wants)]


@op("QuantizeDequantize", domain=RULEGRAPH_DOMAIN, affine=always, additive="all", transparent=True, vjp=_add_vjp)
def quantize_dequantize(x, error):
    """``x`` after a quantize–dequantize round trip: ``x + error`` (``error`` from QuantizationError)."""
    return x + error
