"""Convolution, pooling and batch normalisation: the ops of CNN and ViT exports."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .spec import always, only, op
from .elementwise import f32

Tensor = torch.Tensor

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _one_factor(tainted) -> bool:
    """Exactly one of X, W carried (the bias may be too): as Gemm."""
    return bool(tainted[0]) != bool(tainted[1])


def _spatial(x: Tensor) -> int:
    n = x.dim() - 2
    if n not in (1, 2, 3):
        raise ValueError(f"expected a 3-, 4- or 5-d input (N, C, spatial…), got {x.dim()}-d")
    return n


def _pads(x: Tensor, kernel, strides, dilations, pads, auto_pad: str) -> list[int]:
    """ONNX ``pads`` ([begin…, end…]) with ``auto_pad`` resolved."""
    n = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(n):
            size = x.shape[2 + i]
            target = math.ceil(size / strides[i])
            total = max((target - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size, 0)
            small, large = total // 2, total - total // 2
            out.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
        return [b for b, _ in out] + [e for _, e in out]
    if auto_pad == "VALID" or pads is None:
        return [0] * (2 * n)
    return list(pads)


def _pad_input(x: Tensor, pads: list[int], value: float = 0.0) -> tuple[Tensor, list[int]]:
    """Symmetric padding as torch's ``padding=``; asymmetric padding applied to ``x`` here."""
    n = len(pads) // 2
    begin, end = pads[:n], pads[n:]
    if begin == end:
        return x, begin
    flat = []
    for b, e in zip(reversed(begin), reversed(end)):
        flat += [b, e]
    return F.pad(x, flat, value=value), [0] * n


def _channel_bias(b, output, attrs):
    """A convolution's bias, one per output channel (axis 1)."""
    return b.reshape(1, -1, *([1] * (output.dim() - 2)))


@op("Conv", affine=_one_factor, additive=(2,), bias=_channel_bias)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ONNX Conv (1d/2d/3d, groups, strides, pads, dilations, auto_pad)."""
    n = _spatial(x)
    kernel = list(kernel_shape or w.shape[2:])
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    x, padding = _pad_input(x, _pads(x, kernel, strides, dilations, pads, auto_pad))
    return _CONV[n](x, w, b, stride=strides, padding=padding, dilation=dilations, groups=group)


@op("ConvTranspose", affine=_one_factor, additive=(2,), bias=_channel_bias)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    """ONNX ConvTranspose (explicit ``pads``; ``output_shape`` / ``auto_pad`` are not supported)."""
    n = _spatial(x)
    if output_shape is not None or auto_pad not in ("NOTSET", "VALID"):
        raise ValueError("ConvTranspose with output_shape or auto_pad SAME_* is not supported; export with explicit pads")
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    pads = list(pads or [0] * (2 * n))
    begin, end = pads[:n], pads[n:]
    y = _CONV_T[n](x, w, None, stride=strides, padding=0, output_padding=list(output_padding or [0] * n),
                   groups=group, dilation=dilations)
    index = [slice(None), slice(None)] + [slice(bg, y.shape[2 + i] - e) for i, (bg, e) in enumerate(zip(begin, end))]
    y = y[tuple(index)]
    if b is not None:
        y = y + b.reshape(1, -1, *([1] * n))
    return y


@op("AveragePool", affine=always)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                 pads=None, strides=None):
    """ONNX AveragePool (dilations must be 1)."""
    n = _spatial(x)
    if dilations and any(d != 1 for d in dilations):
        raise ValueError("AveragePool with dilations ≠ 1 is not supported")
    strides = list(strides or [1] * n)
    pads = _pads(x, kernel_shape, strides, [1] * n, pads, auto_pad)
    if pads[:n] != pads[n:] or any(2 * p > k for p, k in zip(pads[:n], kernel_shape)):
        if not count_include_pad:
            raise ValueError("AveragePool with asymmetric pads and count_include_pad=0 is not supported")
        x, padding = _pad_input(x, pads)
    else:
        padding = pads[:n]
    return _AVG[n](x, list(kernel_shape), strides, padding, ceil_mode=bool(ceil_mode),
                   count_include_pad=bool(count_include_pad))


@op("MaxPool", routing=True)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None, storage_order=0,
             strides=None):
    """ONNX MaxPool (first output only). Relevance routes to each window's maximum."""
    n = _spatial(x)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    pads = _pads(x, kernel_shape, strides, dilations, pads, auto_pad)
    if pads[:n] != pads[n:] or any(2 * p > k for p, k in zip(pads[:n], kernel_shape)):
        x, padding = _pad_input(x, pads, value=-math.inf)
    else:
        padding = pads[:n]
    return _MAX[n](x, list(kernel_shape), strides, padding, dilation=dilations, ceil_mode=bool(ceil_mode))


@op("GlobalAveragePool", affine=always)
def global_average_pool(x):
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@op("GlobalMaxPool", routing=True)
def global_max_pool(x):
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


def _channel(v: Tensor, x: Tensor) -> Tensor:
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def batch_norm_affine(scale, bias, mean, var, epsilon):
    """BatchNormalization as ``y = a·x + c`` per channel: ``a = scale/√(var+ε)``, ``c = bias − a·mean``."""
    a = scale / torch.sqrt(var + epsilon)
    return a, bias - a * mean


@op("BatchNormalization", affine=only(0), additive=(2, 3))
def batch_normalization(x, scale, bias, mean, var, *, epsilon=f32(1e-5), momentum=0.9, training_mode=0):
    """ONNX BatchNormalization in inference mode: ``(x − mean)/√(var+ε)·scale + bias``, affine in x
    (a BatchNorm the canonizer cannot fold, LeViT's before its classifier); the bias and the mean
    enter additively."""
    if training_mode:
        raise ValueError("BatchNormalization with training_mode=1 is not supported (export in eval mode)")
    return (x - _channel(mean, x)) / torch.sqrt(_channel(var, x) + epsilon) * _channel(scale, x) + _channel(bias, x)


@op("HardSigmoid", elementwise=True, activation=True, sigmoidal=True)
def hard_sigmoid(x, *, alpha=f32(0.2), beta=f32(0.5)):
    return (alpha * x + beta).clamp(0, 1)


@op("HardSwish", elementwise=True, activation=True)
def hard_swish(x):
    return x * (f32(1 / 6) * x + 0.5).clamp(0, 1)


def _source_coords(out: int, size: int, scale: float, mode: str, dtype, device) -> Tensor:
    """Input coordinate of each output position along one axis (ONNX Resize's
    ``coordinate_transformation_mode``)."""
    o = torch.arange(out, dtype=dtype, device=device)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out > 1 else torch.zeros_like(o)
    if mode == "align_corners":
        return o * ((size - 1) / (out - 1)) if out > 1 else torch.zeros_like(o)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    raise ValueError(f"Resize coordinate_transformation_mode {mode!r} is not supported; valid: align_corners, "
                     "asymmetric, half_pixel, pytorch_half_pixel, tf_half_pixel_for_nn")


_NEAREST = {"round_prefer_floor": lambda c: torch.ceil(c - 0.5), "round_prefer_ceil": lambda c: torch.floor(c + 0.5),
            "floor": torch.floor, "ceil": torch.ceil}


def _cubic_weights(t: Tensor, a: float) -> Tensor:
    """Keys' cubic convolution weights of the neighbours at offsets −1, 0, 1, 2 from ``floor(c)``, for
    ``t = c − floor(c)`` (ONNX Resize ``cubic`` with ``cubic_coeff_a`` = a; Keys 1981, IEEE TASSP)."""
    def near(d):      # |d| ≤ 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):       # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return torch.stack([far(t + 1), near(t), near(1 - t), far(2 - t)])


def _full_axes(values, axes, rank, fill):
    """``scales`` / ``sizes`` given for ``axes`` only, completed to every axis with ``fill``."""
    if axes is None:
        return list(values)
    out = list(fill)
    for a, v in zip(axes, values):
        out[a % rank] = v
    return out


def _output_sizes(shape: tuple[int, ...], scales, sizes, axes, keep_aspect_ratio_policy: str):
    """Resize's output sizes and per-axis factors from ``scales`` or ``sizes`` (ONNX opset 18)."""
    rank = len(shape)
    if sizes:
        out_sizes = [int(s) for s in _full_axes(sizes, axes, rank, shape)]
        factors = [o / i for o, i in zip(out_sizes, shape)]
        if keep_aspect_ratio_policy != "stretch":
            if keep_aspect_ratio_policy not in ("not_larger", "not_smaller"):
                raise ValueError(f"Resize keep_aspect_ratio_policy {keep_aspect_ratio_policy!r} is not one of "
                                 "stretch, not_larger, not_smaller")
            chosen = [a % rank for a in axes] if axes is not None else list(range(rank))
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            scale = pick(factors[a] for a in chosen)
            factors = [scale if d in chosen else 1.0 for d in range(rank)]
            out_sizes = [int(math.floor(i * f + 0.5)) if d in chosen else i
                         for d, (i, f) in enumerate(zip(shape, factors))]
    elif scales:
        factors = [float(s) for s in _full_axes(scales, axes, rank, [1.0] * rank)]
        out_sizes = [int(math.floor(i * f)) for i, f in zip(shape, factors)]
    else:
        raise ValueError("Resize needs scales or sizes")
    return out_sizes, factors


def _resize_size(args, attrs) -> int:
    """Resize's output size, before it runs."""
    x = args[0]
    sizes = args[3] if len(args) > 3 else None
    scales = args[2] if len(args) > 2 else None
    out, _ = _output_sizes(tuple(x.shape), scales, sizes, attrs.get("axes"), attrs.get("keep_aspect_ratio_policy", "stretch"))
    return math.prod(out)


@op("Resize", static=(1, 2, 3), affine=always, additive=(0,), size=_resize_size)
def resize(x, roi=None, scales=None, sizes=None, *, mode="nearest", coordinate_transformation_mode="half_pixel",
           nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0,
           antialias=0, axes=None, keep_aspect_ratio_policy="stretch"):
    """ONNX Resize (opset ≥ 11), modes ``nearest``, ``linear`` and ``cubic`` (DINOv2's interpolation of
    its position embeddings), one axis at a time: nearest selects, linear blends two neighbours,
    cubic four (edge values repeated beyond the border; ``exclude_outside`` drops them and
    renormalises). ``axes`` and ``keep_aspect_ratio_policy`` as ONNX specifies (opset 18);
    ``antialias`` and ``tf_crop_and_resize`` are not supported."""
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"Resize mode {mode!r} is not one of nearest, linear, cubic")
    if antialias:
        raise ValueError("Resize with antialias is not supported")
    if nearest_mode not in _NEAREST:
        raise ValueError(f"Resize nearest_mode {nearest_mode!r} is not one of {', '.join(_NEAREST)}")
    out_sizes, factors = _output_sizes(tuple(x.shape), scales, sizes, axes, keep_aspect_ratio_policy)
    rank = x.dim()
    coord_dtype = x.dtype if x.is_floating_point() else torch.float64
    for d, (size, out, factor) in enumerate(zip(x.shape, out_sizes, factors)):
        if out == size and factor == 1.0:
            continue
        c = _source_coords(out, size, factor, coordinate_transformation_mode, coord_dtype, x.device)
        if mode == "nearest":
            x = x.index_select(d, _NEAREST[nearest_mode](c).clamp(0, size - 1).long())
            continue
        shape = (-1, *([1] * (x.dim() - d - 1)))
        if mode == "cubic":
            lo = torch.floor(c)
            w = _cubic_weights(c - lo, cubic_coeff_a)
            idx = lo.long().unsqueeze(0) + torch.arange(-1, 3, device=x.device).unsqueeze(1)
            if exclude_outside:
                w = w * ((idx >= 0) & (idx < size))
                w = w / w.sum(0, keepdim=True)
            idx = idx.clamp(0, size - 1)
            w = w.to(x.dtype)
            x = sum(x.index_select(d, idx[k]) * w[k].reshape(shape) for k in range(4))
            continue
        c = c.clamp(0, size - 1)
        lo = torch.floor(c).long()
        hi = (lo + 1).clamp(max=size - 1)
        w = (c - lo).to(x.dtype).reshape(shape)
        x = x.index_select(d, lo) * (1 - w) + x.index_select(d, hi) * w
    return x
