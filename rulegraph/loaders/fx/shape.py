"""Lowerings of shape computation, routing and tensor factories: ``view`` / ``reshape``,
``flatten``, ``transpose`` / ``permute``, ``(un)squeeze``, ``slice``, ``select``,
``gather``, advanced ``index``, ``expand``, ``repeat``, ``cat`` / ``stack``, splits,
``tril`` / ``triu``; and ``zeros`` / ``ones`` / ``full`` (and their ``_like`` and ``new_``
forms), ``scalar_tensor`` and ``arange`` as constants, or ``ConstantOfShape`` / ``Range``
where a size is symbolic.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx as fx

from ...errors import ModelError, UnsupportedOpError
from .builder import INT64, INT64_MAX, Builder, Tensor, _axis, _static, fx_dtype, fx_val, lowers, out_dtype, rank


# -- shapes and routing ---------------------------------------------------------------------------------

@lowers("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.view_copy.default")
def _reshape(b: Builder, n: fx.Node, a: dict) -> str:
    size = a.get("size", a.get("shape"))
    allowzero = int(any(not isinstance(d, fx.Node) and d == 0 for d in size))
    return b.emit("Reshape", [b.value(a["self"]), b.shape(size)], allowzero=allowzero)


@lowers("aten.flatten.using_ints")
def _flatten(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    r = rank(x)
    if r == 0:
        return b.emit("Reshape", [b.value(x), b.ints([1], "shape")])
    start, end = _axis(a["start_dim"], r), _axis(a["end_dim"], r)
    pieces = [b.dims(x, 0, start, "lead"), b.ints([-1], "flat"), b.dims(x, end + 1, r, "trail")]
    return b.emit("Reshape", [b.value(x), b.emit("Concat", pieces, "shape", axis=0)])


@lowers("aten.unflatten.int")
def _unflatten(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    r = rank(x)
    d = _axis(a["dim"], r)
    pieces = [b.dims(x, 0, d, "lead"), b.shape(a["sizes"], "sizes"), b.dims(x, d + 1, r, "trail")]
    return b.emit("Reshape", [b.value(x), b.emit("Concat", pieces, "shape", axis=0)])


@lowers("aten.transpose.int")
def _transpose(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    r = rank(x)
    perm = list(range(r))
    d0, d1 = _axis(a["dim0"], r), _axis(a["dim1"], r)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return b.emit("Transpose", [b.value(x)], perm=perm)


@lowers("aten.permute.default")
def _permute(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Transpose", [b.value(x)], perm=[_axis(d, rank(x)) for d in a["dims"]])


@lowers("aten.t.default", "aten.numpy_T.default")
def _t(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    if rank(x) < 2:
        return b.emit("Identity", [b.value(x)])
    return b.emit("Transpose", [b.value(x)], perm=list(range(rank(x)))[::-1])


@lowers("aten.unsqueeze.default")
def _unsqueeze(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Unsqueeze", [b.value(x), b.ints([_axis(a["dim"], rank(x) + 1)], "axes")])


@lowers("aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims")
def _squeeze(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    shape = list(fx_val(x).shape)
    dims = a.get("dim")
    candidates = list(range(len(shape))) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
    axes = sorted({_axis(d, len(shape)) for d in candidates if shape[_axis(d, len(shape))] == 1})
    if not axes:   # torch squeezes only size-1 dims; the others stay
        return b.emit("Identity", [b.value(x)])
    return b.emit("Squeeze", [b.value(x), b.ints(axes, "axes")])


@lowers("aten.slice.Tensor")
def _slice(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    start = 0 if a["start"] is None else a["start"]
    end = INT64_MAX if a["end"] is None else a["end"]
    return b.emit("Slice", [b.value(x), b.int1(start, "starts"), b.int1(end, "ends"),
                            b.ints([_axis(a["dim"], rank(x))], "axes"), b.int1(a["step"], "steps")])


@lowers("aten.select.int")
def _select(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Gather", [b.value(x), b.int0(a["index"], "index")], axis=_axis(a["dim"], rank(x)))


@lowers("aten.index_select.default")
def _index_select(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Gather", [b.value(x), b.tensor(a["index"], INT64, "index")], axis=_axis(a["dim"], rank(x)))


@lowers("aten.gather.default")
def _gather(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("GatherElements", [b.value(x), b.tensor(a["index"], INT64, "index")],
                  axis=_axis(a["dim"], rank(x)))


@lowers("aten.topk.default")
def _topk(b: Builder, n: fx.Node, a: dict) -> list[str]:
    """``torch.topk`` → ``TopK`` (values, int64 indices): a mixture of experts' router."""
    x = a["self"]
    return b.emit("TopK", [b.value(x), b.int1(a["k"], "k")], outputs=2, axis=_axis(a["dim"], rank(x)),
                  largest=int(bool(a["largest"])), sorted=int(bool(a["sorted"])))


@lowers("aten.scatter.src")
def _scatter(b: Builder, n: fx.Node, a: dict) -> str:
    """``x.scatter(dim, index, src)`` → ``ScatterElements`` (a router's dense weight matrix)."""
    x = a["self"]
    return b.emit("ScatterElements", [b.value(x), b.tensor(a["index"], INT64, "index"),
                                      b.tensor(a["src"], fx_dtype(x), "src")], axis=_axis(a["dim"], rank(x)))


@lowers("aten.index.Tensor")
def _index(b: Builder, n: fx.Node, a: dict) -> str:
    """``x[i0, i1, …]`` with integer index tensors: ``Gather`` for one, ``GatherND`` for several."""
    x, indices = a["self"], list(a["indices"])
    r = rank(x)
    picked = [(p, i) for p, i in enumerate(indices) if i is not None]
    for _, i in picked:
        if fx_dtype(i) in (torch.bool, torch.uint8):
            raise UnsupportedOpError(f"fx node {n.name!r}: indexing with a boolean mask (data-dependent shape) "
                                     "is not supported")
    positions = [p for p, _ in picked]
    if len(picked) == 1:
        p, i = picked[0]
        return b.emit("Gather", [b.value(x), b.tensor(i, INT64, "index")], axis=p)
    # broadcast the index tensors to one shape, stack them on a last axis, GatherND
    idx = [b.tensor(i, INT64, f"index{k}") for k, (_, i) in enumerate(picked)]
    shapes = {tuple(str(d) for d in fx_val(i).shape) for _, i in picked}
    if len(shapes) > 1:
        common = b.emit("Shape", [idx[0]], "bshape")
        for k in range(1, len(idx)):
            common = b.emit("Shape", [b.emit("Expand", [idx[k], common], f"bcast{k}")], f"bshape{k}")
        idx = [b.emit("Expand", [t, common], f"index{k}_b") for k, t in enumerate(idx)]
    stacked = b.emit("Concat", [b.emit("Unsqueeze", [t, b.ints([-1], f"axes{k}")], f"index{k}_u")
                                for k, t in enumerate(idx)], "indices", axis=-1)
    rest = [d for d in range(r) if d not in positions]
    data = b.value(x)
    if positions != list(range(len(positions))):
        data = b.emit("Transpose", [data], "data_t", perm=positions + rest)
    consecutive = positions == list(range(positions[0], positions[-1] + 1))
    if not consecutive or positions[0] == 0:   # torch puts the index dims first
        return b.emit("GatherND", [data, stacked], batch_dims=0)
    gathered = b.emit("GatherND", [data, stacked], "gather_nd", batch_dims=0)
    k = rank(n) - len(rest)   # rank of the broadcast index shape
    lead = positions[0]
    perm = list(range(k, k + lead)) + list(range(k)) + list(range(k + lead, rank(n)))
    return b.emit("Transpose", [gathered], perm=perm)


@lowers("aten.expand.default")
def _expand(b: Builder, n: fx.Node, a: dict) -> str:
    # torch's -1 keeps a dim; ONNX Expand broadcasts both ways, so 1 does the same
    return b.emit("Expand", [b.value(a["self"]), b.shape(a["size"], minus_one_as=1)])


@lowers("aten.repeat.default")
def _repeat(b: Builder, n: fx.Node, a: dict) -> str:
    x, repeats = a["self"], list(a["repeats"])
    v = b.value(x)
    extra = len(repeats) - rank(x)
    if extra > 0:
        v = b.emit("Unsqueeze", [v, b.ints(list(range(extra)), "axes")], "lead")
    return b.emit("Tile", [v, b.shape(repeats, "repeats")])


@lowers("aten.cat.default")
def _cat(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    parts = [b.tensor(t, dtype, f"input{k}") for k, t in enumerate(a["tensors"])]
    return b.emit("Concat", parts, axis=_axis(a["dim"], rank(n)))


@lowers("aten.stack.default")
def _stack(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    d = _axis(a["dim"], rank(n))
    parts = [b.emit("Unsqueeze", [b.tensor(t, dtype, f"input{k}"), b.ints([d], f"axes{k}")], f"input{k}_u")
             for k, t in enumerate(a["tensors"])]
    return b.emit("Concat", parts, axis=d)


def _split_sizes(b: Builder, n: fx.Node, d: int) -> list[int]:
    outs = fx_val(n)
    sizes = [o.shape[d] for o in outs]
    if not all(isinstance(s, int) for s in sizes):
        raise UnsupportedOpError(f"fx node {n.name!r}: split of a symbolic dimension into equal chunks "
                                 "is not supported; use split_with_sizes")
    return sizes


@lowers("aten.split.Tensor", "aten.chunk.default", "aten.tensor_split.sections", "aten.unsafe_split.Tensor")
def _split(b: Builder, n: fx.Node, a: dict) -> list[str]:
    x = a["self"]
    d = _axis(a["dim"], rank(x))
    sizes = _split_sizes(b, n, d)
    return b.emit("Split", [b.value(x), b.ints(sizes, "split")], outputs=len(sizes), axis=d)


@lowers("aten.split_with_sizes.default", "aten.split.sizes")
def _split_with_sizes(b: Builder, n: fx.Node, a: dict) -> list[str]:
    x = a["self"]
    d = _axis(a["dim"], rank(x))
    sizes = a.get("split_sizes", a.get("split_size"))
    return b.emit("Split", [b.value(x), b.shape(sizes, "split")], outputs=len(sizes), axis=d)


@lowers("aten.unbind.int")
def _unbind(b: Builder, n: fx.Node, a: dict) -> list[str]:
    x = a["self"]
    d = _axis(a["dim"], rank(x))
    count = len(fx_val(n))
    pieces = b.emit("Split", [b.value(x), b.ints([1] * count, "split")], "split", outputs=count, axis=d)
    return [b.emit("Squeeze", [p, b.ints([d], f"axes{k}")], f"{k}") for k, p in enumerate(pieces)]


@lowers("aten.tril.default", "aten.triu.default")
def _trilu(b: Builder, n: fx.Node, a: dict) -> str:
    upper = int("triu" in str(n.target))
    return b.emit("Trilu", [b.value(a["self"]), b.int0(a["diagonal"], "k")], upper=upper)


# -- tensor factories -------------------------------------------------------------------------------------

def _fill(b: Builder, n: fx.Node, size: Sequence[Any] | str, value: Any) -> str:
    """A tensor of ``size`` filled with ``value`` in ``n``'s dtype: a constant, or ConstantOfShape."""
    dtype = out_dtype(n)
    store = torch.float64 if dtype.is_floating_point else dtype
    if isinstance(value, fx.Node):
        raise UnsupportedOpError(f"fx node {n.name!r}: a fill value computed in the graph is not supported")
    if not isinstance(size, str) and all(not isinstance(d, fx.Node) for d in size):
        return _named_const(b, torch.full([int(d) for d in size], value, dtype=store))
    shape = size if isinstance(size, str) else b.shape(size)
    return b.emit("ConstantOfShape", [shape], value=torch.tensor([value], dtype=store))


def _named_const(b: Builder, value: Tensor) -> str:
    """A constant standing for the fx node's whole result, under its name."""
    name = b.fresh(None)
    b.constants[name] = value
    return name


@lowers("aten.zeros.default", "aten.ones.default", "aten.empty.memory_format", "aten.full.default",
        "aten.new_zeros.default", "aten.new_ones.default", "aten.new_empty.default", "aten.new_full.default")
def _factory(b: Builder, n: fx.Node, a: dict) -> str:
    name = str(n.target)
    value = a.get("fill_value", 1 if "ones" in name else 0)
    return _fill(b, n, a["size"], value)


@lowers("aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default", "aten.full_like.default")
def _factory_like(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    value = a.get("fill_value", 1 if "ones" in str(n.target) else 0)
    shape = list(fx_val(x).shape)
    if all(isinstance(d, int) for d in shape):
        return _fill(b, n, shape, value)
    return _fill(b, n, b.emit("Shape", [b.value(x)], "shape"), value)


@lowers("aten.scalar_tensor.default")
def _scalar_tensor(b: Builder, n: fx.Node, a: dict) -> str:
    if isinstance(a["s"], fx.Node):
        return b.emit("Identity", [b.tensor(a["s"], out_dtype(n), "value")])
    return _fill(b, n, [], a["s"])


@lowers("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    start, end, step = a.get("start", 0), a["end"], a.get("step", 1)
    if not any(isinstance(v, fx.Node) for v in (start, end, step)):
        return _named_const(b, torch.arange(start, end, step, dtype=dtype))
    return b.emit("Range", [b.int0(start, "start", dtype), b.int0(end, "limit", dtype), b.int0(step, "delta", dtype)])


#: torch's padding modes → ONNX Pad's
PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@lowers("aten.pad.default", "aten.constant_pad_nd.default")
def _pad(b: Builder, n: fx.Node, a: dict) -> str:
    """``Pad``: torch lists (begin, end) pairs from the last axis backwards; ONNX all begins, then all ends."""
    x = a.get("input", a.get("self"))
    r, pad = rank(x), [_static(b, p, "pad") for p in a["pad"]]
    mode = a.get("mode", "constant")
    if mode not in PAD_MODES:
        raise ModelError(f"fx node {n.name!r}: unknown padding mode {mode!r}")
    pads = [0] * (2 * r)
    for i in range(len(pad) // 2):
        pads[r - 1 - i], pads[2 * r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    inputs = [b.value(x), b.ints(pads, "pads")]
    if mode == "constant":      # the fill value as an input, as the exporters write it: it absorbs what lands on the pad
        inputs.append(b.tensor(float(a.get("value") or 0.0), fx_dtype(x), "value"))
    return b.emit("Pad", inputs, mode=PAD_MODES[mode])
