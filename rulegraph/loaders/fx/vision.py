"""Vision lowerings, as ``ops/vision.py``: ``conv1d/2d/3d`` → ``Conv``, ``batch_norm`` (inference) →
``BatchNormalization``, ``max_pool2d`` / ``avg_pool2d`` → ``MaxPool`` / ``AveragePool``,
``adaptive_avg_pool2d`` to 1×1 → ``GlobalAveragePool``, ``hardswish`` / ``hardsigmoid`` →
``HardSwish`` / ``HardSigmoid``, ``hardtanh`` / ``relu6`` → ``Clip``: what torch's ONNX exporters emit.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ...errors import ModelError
from .builder import Builder, _static, lowers, rank


def _ints(b: Builder, values, n: int, what: str) -> list[int]:
    """A torch size argument (an int or a list, one entry repeated) as ``n`` fixed ints."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    values = [_static(b, v, what) for v in values]
    return values * n if len(values) == 1 else values


@lowers("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
        "aten.conv1d.padding", "aten.conv2d.padding", "aten.conv3d.padding")
def _conv(b: Builder, n: fx.Node, a: dict) -> str:
    x, w, bias = a["input"], a["weight"], a["bias"]
    spatial = rank(x) - 2
    attrs = dict(strides=_ints(b, a["stride"], spatial, "stride"), dilations=_ints(b, a["dilation"], spatial, "dilation"),
                 group=_static(b, a["groups"], "groups"))
    padding = a["padding"]
    if isinstance(padding, str):                 # torch's "same" pads the extra element at the end, as SAME_UPPER
        if padding not in ("same", "valid"):
            raise ModelError(f"fx node {n.name!r}: unknown convolution padding {padding!r}")
        attrs["auto_pad"] = {"same": "SAME_UPPER", "valid": "VALID"}[padding]
    else:
        pads = _ints(b, padding, spatial, "padding")
        attrs["pads"] = pads + pads
    inputs = [b.value(x), b.value(w)] + ([b.value(bias)] if bias is not None else [])
    return b.emit("Conv", inputs, **attrs)


@lowers("aten.batch_norm.default")
def _batch_norm(b: Builder, n: fx.Node, a: dict) -> str:
    if a["training"]:
        raise ModelError(f"fx node {n.name!r}: batch_norm in training mode; export the model in eval mode")
    channels = a["input"].meta["val"].shape[1]
    one = lambda v, role: b.const(torch.full((int(channels),), v, dtype=torch.float64), role)  # noqa: E731
    scale = b.value(a["weight"]) if a["weight"] is not None else one(1.0, "scale")
    shift = b.value(a["bias"]) if a["bias"] is not None else one(0.0, "bias")
    return b.emit("BatchNormalization", [b.value(a["input"]), scale, shift, b.value(a["running_mean"]),
                                         b.value(a["running_var"])], epsilon=float(a["eps"]))


@lowers("aten.max_pool2d.default", "aten.avg_pool2d.default")
def _pool(b: Builder, n: fx.Node, a: dict) -> str:
    kernel = _ints(b, a["kernel_size"], 2, "kernel_size")
    strides = _ints(b, a["stride"], 2, "stride") if a["stride"] else kernel
    pads = _ints(b, a["padding"], 2, "padding")
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads + pads, ceil_mode=int(bool(a["ceil_mode"])))
    if "max_pool" in str(n.target):
        dilations = _ints(b, a["dilation"], 2, "dilation")
        return b.emit("MaxPool", [b.value(a["self"])], dilations=dilations, **attrs)
    if a.get("divisor_override") is not None:
        raise ModelError(f"fx node {n.name!r}: avg_pool2d with divisor_override has no ONNX AveragePool")
    return b.emit("AveragePool", [b.value(a["self"])], count_include_pad=int(bool(a["count_include_pad"])), **attrs)


@lowers("aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool(b: Builder, n: fx.Node, a: dict) -> str:
    if _ints(b, a["output_size"], 2, "output_size") != [1, 1]:
        raise ModelError(f"fx node {n.name!r}: adaptive_avg_pool2d is lowered only to a 1×1 output "
                         f"(GlobalAveragePool), got {a['output_size']}")
    return b.emit("GlobalAveragePool", [b.value(a["self"])])


@lowers("aten.hardswish.default")
def _hardswish(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("HardSwish", [b.value(a["self"])])


@lowers("aten.hardsigmoid.default")
def _hardsigmoid(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("HardSigmoid", [b.value(a["self"])], alpha=1.0 / 6.0, beta=0.5)


@lowers("aten.hardtanh.default", "aten.relu6.default")
def _hardtanh(b: Builder, n: fx.Node, a: dict) -> str:
    c = lambda v, role: b.const(torch.tensor(float(v), dtype=torch.float64), role)  # noqa: E731
    low, high = (a["min_val"], a["max_val"]) if "hardtanh" in str(n.target) else (0.0, 6.0)
    return b.emit("Clip", [b.value(a["self"]), c(low, "min"), c(high, "max")])
