"""Shape computation and routing ops: Reshape, Transpose, Slice, Gather, Concat, Expand…

Routing ops move or select elements of their data input without arithmetic, so the
``pass`` rule sends relevance back along the same index mapping: that is exactly
their VJP applied to the relevance. Inputs that carry shapes, axes or pads are
``static`` — host lists of ints, converted once per input shape.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .spec import always, only, op, unbroadcast, zeros_as

Tensor = torch.Tensor
INT64 = torch.int64


def _reshape_back(grads, inputs, outputs, wants, **_):
    return [grads[0].reshape(inputs[0].shape) if wants[0] else None] + [None] * (len(inputs) - 1)


def _axes(axes, rank):
    return sorted(a % rank for a in axes)


# -- shapes -------------------------------------------------------------------------

@op("Shape", float_output=False, shape_only=True)
def shape(x, *, start=0, end=None):
    return torch.tensor(x.shape[start:end], dtype=INT64, device=x.device)


@op("Size", float_output=False, shape_only=True)
def size(x):
    return torch.tensor(x.numel(), dtype=INT64, device=x.device)


@op("ConstantOfShape", static=(0,), size=lambda args, attrs: math.prod(args[0]))
def constant_of_shape(shape, *, value=None):
    if value is None:
        return torch.zeros(shape, dtype=torch.float32)
    return torch.full(shape, value.reshape(()).item(), dtype=value.dtype, device=value.device)


@op("EyeLike", shape_only=True)
def eye_like(x, *, dtype=None, k=0):
    """A 2-D matrix of ``x``'s shape with ones on the ``k``-th diagonal, of ``dtype`` (default ``x``'s);
    it reads only ``x``'s shape (XLNet's relative attention)."""
    rows = torch.arange(x.shape[0], device=x.device).unsqueeze(1)
    cols = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    return (cols - rows == k).to(dtype or x.dtype)


def _range_size(args, attrs) -> int:
    s, l, d = (float(a.reshape(-1)[0]) for a in args)
    return max(math.ceil((l - s) / d), 0) if d and math.isfinite((l - s) / d) else 0


@op("Range", size=_range_size)
def range_(start, limit, delta):
    """``start + i·delta`` for ``i < max(ceil((limit − start) / delta), 0)``: empty, not an error,
    when the bounds and the step disagree."""
    s, l, d = start.item(), limit.item(), delta.item()
    if d == 0:
        raise ValueError("Range delta must not be 0")
    if isinstance(s, int) and isinstance(l, int) and isinstance(d, int):
        n = max(-((s - l) // d), 0)
    else:
        n = max(math.ceil((l - s) / d), 0)
    steps = torch.arange(n, dtype=start.dtype, device=start.device)
    return start + steps * delta


# -- reshaping (routing) ---------------------------------------------------------------

def onnx_reshape_target(in_shape, shape, allowzero=0):
    """ONNX Reshape semantics: 0 copies the input dim (unless ``allowzero``), -1 is inferred."""
    out = list(shape)
    if not allowzero:
        out = [in_shape[i] if d == 0 else d for i, d in enumerate(out)]
    return out


@op("Reshape", static=(1,), affine=always, additive=(0,), routing=True, bijective=True, vjp=_reshape_back)
def reshape(x, shape, *, allowzero=0):
    return x.reshape(onnx_reshape_target(x.shape, shape, allowzero))


@op("Flatten", affine=always, additive=(0,), routing=True, bijective=True, vjp=_reshape_back)
def flatten(x, *, axis=1):
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@op("Squeeze", static=(1,), affine=always, additive=(0,), routing=True, bijective=True, vjp=_reshape_back)
def squeeze(x, axes_in=None, *, axes=None):
    axes = axes_in if axes_in is not None else axes
    if not axes:  # absent or empty: every dim of size 1
        return x.squeeze()
    return x.squeeze(tuple(_axes(axes, x.dim())))


@op("Unsqueeze", static=(1,), affine=always, additive=(0,), routing=True, bijective=True, vjp=_reshape_back)
def unsqueeze(x, axes_in=None, *, axes=None):
    axes = axes_in if axes_in is not None else axes
    rank = x.dim() + len(axes)
    for a in _axes(axes, rank):
        x = x.unsqueeze(a)
    return x


def _transpose_vjp(grads, inputs, outputs, wants, *, perm=None):
    if not wants[0]:
        return [None]
    perm = perm if perm is not None else list(range(inputs[0].dim()))[::-1]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [grads[0].permute(inverse)]


@op("Transpose", affine=always, additive=(0,), routing=True, bijective=True, vjp=_transpose_vjp)
def transpose(x, *, perm=None):
    return x.permute(perm if perm is not None else list(range(x.dim()))[::-1])


# -- joining and splitting ----------------------------------------------------------------

def _concat_vjp(grads, inputs, outputs, wants, *, axis):
    sizes = [x.shape[axis] for x in inputs]
    pieces = torch.split(grads[0], sizes, dim=axis)
    return [p if w else None for p, w in zip(pieces, wants)]


@op("Concat", affine=always, additive="all", routing=True, vjp=_concat_vjp)
def concat(*xs, axis):
    return torch.cat(xs, dim=axis)


def split_sizes(x, axis, split, num_outputs):
    if split is not None:
        return list(split)
    n = x.shape[axis]
    chunk = -(-n // num_outputs)
    return [max(min(chunk, n - i * chunk), 0) for i in range(num_outputs)]


def _split_vjp(grads, inputs, outputs, wants, *, axis=0, split=None, num_outputs=None):
    if not wants[0]:
        return [None] * len(inputs)
    pieces = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outputs)]
    return [torch.cat(pieces, dim=axis)] + [None] * (len(inputs) - 1)


@op("Split", static=(1,), affine=always, additive=(0,), routing=True, vjp=_split_vjp)
def split(x, split_in=None, *, axis=0, split=None, num_outputs=None):
    sizes = split_sizes(x, axis, split_in if split_in is not None else split, num_outputs)
    return tuple(torch.split(x, sizes, dim=axis))


# -- selection ---------------------------------------------------------------------------------

def slice_spec(shape, starts, ends, axes=None, steps=None):
    """Normalised (axis, start, end, step) per sliced axis, clamped as ONNX Slice specifies:
    ``start`` into [0, n] and ``end`` into [0, n] for positive steps, ``start`` into [0, n−1]
    and ``end`` into [−1, n−1] for negative ones (−1 meaning "through index 0")."""
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    spec = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise ValueError("Slice step must not be 0")
        axis %= len(shape)
        n = shape[axis]
        start = start + n if start < 0 else start
        end = end + n if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), n), min(max(end, 0), n)
        else:
            start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
        spec.append((axis, start, end, step))
    return spec


def _apply_slice(x, spec):
    index = [slice(None)] * x.dim()
    for axis, start, end, step in spec:
        if step > 0:
            index[axis] = slice(start, end, step)
        else:
            count = max(-((start - end) // step), 0)  # ceil((end - start) / step)
            picks = start + step * torch.arange(count, device=x.device)
            x = x.index_select(axis, picks)
    return x[tuple(index)]


def _slice_args(inputs, legacy):
    """(starts, ends, axes, steps): inputs from opset 10, attributes before."""
    args = list(inputs[1:]) + [None] * (5 - len(inputs))
    if args[0] is None:
        return legacy["starts"], legacy["ends"], legacy.get("axes"), None
    return tuple(args)


def _slice_vjp(grads, inputs, outputs, wants, **legacy):
    if not wants[0]:
        return [None] * len(inputs)
    x = inputs[0]
    spec = slice_spec(x.shape, *_slice_args(inputs, legacy))
    g = zeros_as(x, grads[0])
    if all(step > 0 for *_, step in spec):
        index = [slice(None)] * x.dim()
        for axis, start, end, step in spec:
            index[axis] = slice(start, end, step)
        g[tuple(index)] = grads[0]
        return [g] + [None] * (len(inputs) - 1)
    with torch.enable_grad():
        _, back = torch.func.vjp(lambda v: _apply_slice(v, spec), x)
        (g,) = back(grads[0])
    return [g] + [None] * (len(inputs) - 1)


@op("Slice", static=(1, 2, 3, 4), affine=always, additive=(0,), routing=True, vjp=_slice_vjp)
def slice_(x, starts=None, ends=None, axes=None, steps=None, **legacy):
    return _apply_slice(x, slice_spec(x.shape, *_slice_args([x, starts, ends, axes, steps], legacy)))


def _positive(indices: Tensor, n: int) -> Tensor:
    return torch.where(indices < 0, indices + n, indices)


def _gather_vjp(grads, inputs, outputs, wants, *, axis=0):
    if not wants[0]:
        return [None, None]
    data, indices = inputs
    axis %= data.dim()
    idx = _positive(indices, data.shape[axis]).reshape(-1)
    g = grads[0].reshape(*data.shape[:axis], idx.numel(), *data.shape[axis + 1:])
    return [zeros_as(data, g).index_add_(axis, idx, g), None]


@op("Gather", affine=lambda t: not t[1], additive=(0,), routing=True, vjp=_gather_vjp,
    size=lambda args, attrs: args[0].numel() // max(args[0].shape[attrs.get("axis", 0)], 1) * args[1].numel())
def gather(data, indices, *, axis=0):
    axis %= data.dim()
    idx = _positive(indices.long(), data.shape[axis])
    if idx.dim() == 0:  # no host sync (int(idx) would wait on the device)
        return data.index_select(axis, idx.reshape(1)).squeeze(axis)
    if axis == 0 and data.dim() == 2:
        return F.embedding(idx, data)
    out = data.index_select(axis, idx.reshape(-1))
    return out.reshape(*data.shape[:axis], *idx.shape, *data.shape[axis + 1:])


def _gather_elements_vjp(grads, inputs, outputs, wants, *, axis=0):
    if not wants[0]:
        return [None, None]
    data, indices = inputs
    idx = _positive(indices.long(), data.shape[axis])
    return [zeros_as(data, grads[0]).scatter_add_(axis, idx, grads[0]), None]


@op("GatherElements", affine=lambda t: not t[1], additive=(0,), routing=True, vjp=_gather_elements_vjp)
def gather_elements(data, indices, *, axis=0):
    return torch.gather(data, axis, _positive(indices, data.shape[axis]))


@op("GatherND", affine=lambda t: not t[1], additive=(0,), routing=True)
def gather_nd(data, indices, *, batch_dims=0):
    k = indices.shape[-1]
    batch = data.shape[:batch_dims]
    flat_data = data.reshape(-1, *data.shape[batch_dims:])
    flat_idx = indices.reshape(-1, *indices.shape[batch_dims:])
    sizes = torch.tensor(data.shape[batch_dims:batch_dims + k], device=indices.device)
    flat_idx = torch.where(flat_idx < 0, flat_idx + sizes, flat_idx)
    b = torch.arange(flat_data.shape[0], device=data.device).reshape(-1, *[1] * (flat_idx.dim() - 2))
    picked = flat_data[(b.expand(flat_idx.shape[:-1]),) + tuple(flat_idx[..., i] for i in range(k))]
    return picked.reshape(*batch, *indices.shape[batch_dims:-1], *data.shape[batch_dims + k:])


def _expand_vjp(grads, inputs, outputs, wants, **_):
    return [unbroadcast(grads[0], inputs[0].shape) if wants[0] else None, None]


@op("Expand", static=(1,), affine=always, additive=(0,), routing=True, vjp=_expand_vjp,
    size=lambda args, attrs: math.prod(torch.broadcast_shapes(args[0].shape, tuple(args[1]))))
def expand(x, shape):
    return x.expand(torch.broadcast_shapes(x.shape, tuple(shape)))


@op("Tile", static=(1,), affine=always, additive=(0,), routing=True,
    size=lambda args, attrs: args[0].numel() * math.prod(args[1]))
def tile(x, repeats):
    return x.repeat(*repeats)


def _pad_amounts(rank, pads, axes):
    """Per-dim (before, after) from ONNX ``pads`` (all befores, then all afters) over ``axes``."""
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    n = len(axes)
    amounts = [(0, 0)] * rank
    for i, a in enumerate(axes):
        amounts[a] = (pads[i], pads[n + i])
    return amounts


def _torch_pads(amounts):
    """F.pad's layout: last dim first, (before, after) per dim."""
    return [p for before, after in reversed(amounts) for p in (before, after)]


def _mode_index(n, before, after, mode, device):
    """Source positions along one dim for ``reflect``, ``edge`` or ``wrap`` padding."""
    idx = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return idx.clamp(0, n - 1)
    if mode == "wrap":
        return idx.remainder(n)
    if n == 1:  # reflect: mirror about the end elements, repeatedly if the pad is long
        return torch.zeros_like(idx)
    period = 2 * (n - 1)
    idx = idx.remainder(period)
    return torch.where(idx >= n, period - idx, idx)


def _pad_value(constant_value, value):
    if constant_value is None:
        return value
    return constant_value.reshape(()).item()


def _pad_vjp(grads, inputs, outputs, wants, *, mode="constant", pads=None, value=0.0):
    x = inputs[0]
    pads = inputs[1] if len(inputs) > 1 and inputs[1] is not None else pads
    axes = inputs[3] if len(inputs) > 3 else None
    g = grads[0]
    out = [None] * len(inputs)
    if mode == "constant":
        amounts = _pad_amounts(x.dim(), pads, axes)
        gx = F.pad(g, [-p for p in _torch_pads(amounts)])  # crop the pad, zero-fill what was cropped
        if wants[0]:
            out[0] = gx
        if len(inputs) > 2 and inputs[2] is not None and wants[2]:
            out[2] = (g.sum() - gx.sum()).reshape(inputs[2].shape).to(inputs[2].dtype)
        return out
    if wants[0]:
        with torch.enable_grad():
            _, back = torch.func.vjp(lambda v: pad(v, pads, None, axes, mode=mode), x)
            (out[0],) = back(g)
    return out


def _pad_size(args, attrs) -> int:
    x = args[0]
    pads = args[1] if len(args) > 1 and args[1] is not None else attrs["pads"]      # an attribute before opset 11
    amounts = _pad_amounts(x.dim(), pads, args[3] if len(args) > 3 else None)
    return math.prod(max(0, n + before + after) for n, (before, after) in zip(x.shape, amounts))


@op("Pad", static=(1, 3), affine=always, additive=(0, 2), routing=True, vjp=_pad_vjp, size=_pad_size)
def pad(x, pads=None, constant_value=None, axes=None, *, mode="constant", value=0.0):
    """ONNX Pad. Before opset 11 ``pads`` and ``value`` are attributes. Negative pads crop;
    ``reflect``/``edge``/``wrap`` pad what is left after cropping."""
    amounts = _pad_amounts(x.dim(), pads, axes)
    if mode == "constant":
        return F.pad(x, _torch_pads(amounts), mode="constant", value=_pad_value(constant_value, value))
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"Pad mode {mode!r} is not one of constant, reflect, edge, wrap")
    for d, (before, after) in enumerate(amounts):
        if before < 0 or after < 0:
            lo, hi = max(-before, 0), max(-after, 0)
            x = x.narrow(d, lo, x.shape[d] - lo - hi)
            before, after = max(before, 0), max(after, 0)
        if before or after:
            x = x.index_select(d, _mode_index(x.shape[d], before, after, mode, x.device))
    return x


@op("Trilu", affine=always, additive=(0,))
def trilu(x, k=None, *, upper=1):
    k = 0 if k is None else int(k)
    return torch.triu(x, k) if upper else torch.tril(x, k)


@op("CumSum", affine=lambda t: not t[1], additive=(0,))
def cumsum(x, axis, *, exclusive=0, reverse=0):
    axis = int(axis)
    if reverse:
        x = x.flip(axis)
    out = torch.cumsum(x, dim=axis)
    if exclusive:
        out = out - x
    return out.flip(axis) if reverse else out


def _arg_reduce(name: str, fn) -> None:
    def forward(x, *, axis=0, keepdims=1, select_last_index=0):
        if select_last_index:
            return x.shape[axis] - 1 - fn(x.flip(axis), dim=axis, keepdim=bool(keepdims))
        return fn(x, dim=axis, keepdim=bool(keepdims))
    op(name, float_output=False)(forward)


_arg_reduce("ArgMax", torch.argmax)
_arg_reduce("ArgMin", torch.argmin)


@op("NonZero", data_dependent_shape=True, float_output=False)
def nonzero(x):
    return torch.nonzero(x).T.contiguous()


@op("OneHot", static=(1,), size=lambda args, attrs: args[0].numel() * int(
    args[1] if not isinstance(args[1], list) else args[1][0]))
def one_hot(indices, depth, values, *, axis=-1):
    """Indices outside [−depth, depth−1] give rows of ``off`` values, as ONNX specifies."""
    depth = int(depth if not isinstance(depth, list) else depth[0])
    idx = indices.long()
    idx = torch.where(idx < 0, idx + depth, idx)
    hot = idx.unsqueeze(-1) == torch.arange(depth, device=idx.device)
    out = torch.where(hot, values[1], values[0])
    return out.movedim(-1, axis) if axis != -1 else out


def _sums(attrs: dict) -> bool:
    """A scatter writes or adds (affine in data and updates); multiplying, max and min do not."""
    return attrs.get("reduction", "none") in ("none", "add")


def _writes(attrs: dict) -> bool:
    """A scatter that writes (each output element is data's or one update's) routes its data."""
    return attrs.get("reduction", "none") == "none"


@op("ScatterND", affine=only(0, 2), additive=(0, 2), affine_if=_sums, routing_if=_writes)
def scatter_nd(data, indices, updates, *, reduction="none"):
    k = indices.shape[-1]
    sizes = torch.tensor(data.shape[:k], dtype=torch.int64, device=indices.device)
    idx = indices.long()
    idx = torch.where(idx < 0, idx + sizes, idx)
    index = tuple(idx[..., i] for i in range(k))
    if reduction == "none":
        out = data.index_put(index, updates)
    elif reduction == "add":
        out = data.index_put(index, updates, accumulate=True)
    elif reduction in ("mul", "max", "min"):
        # reduce into the rows of data viewed as (prod(shape[:k]), *shape[k:])
        strides = [math.prod(data.shape[i + 1:k]) for i in range(k)]
        rows = sum(index[i] * strides[i] for i in range(k)).reshape(-1) if k else idx.new_zeros(1)
        flat = data.reshape(math.prod(data.shape[:k]), *data.shape[k:])
        upd = updates.reshape(-1, *data.shape[k:])
        how = {"mul": "prod", "max": "amax", "min": "amin"}[reduction]
        rows = rows.reshape(-1, *[1] * (upd.dim() - 1)).expand(upd.shape)
        out = flat.scatter_reduce(0, rows, upd, how, include_self=True).reshape(data.shape)
    else:
        raise ValueError(f"ScatterND reduction {reduction!r} is not one of none, add, mul, max, min")
    return out


@op("ScatterElements", affine=only(0, 2), additive=(0, 2), affine_if=_sums, routing_if=_writes)
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    """``data`` with ``updates`` written (or reduced) at ``indices`` along ``axis``; the dynamo
    export of ``shift_tokens_right`` (BART, T5) uses it."""
    idx = _positive(indices.long(), data.shape[axis])
    if reduction == "none":
        return data.scatter(axis, idx, updates)
    how = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}.get(reduction)
    if how is None:
        raise ValueError(f"ScatterElements reduction {reduction!r} is not one of none, add, mul, max, min")
    return data.scatter_reduce(axis, idx, updates, how, include_self=True)


@op("TopK", static=(1,), data_dependent_shape=False, float_output=(True, False))
def topk(x, k, *, axis=-1, largest=1, sorted=1):
    values, indices = torch.topk(x, int(k[0] if isinstance(k, list) else k), dim=axis,
                                 largest=bool(largest), sorted=bool(sorted))
    return values, indices
