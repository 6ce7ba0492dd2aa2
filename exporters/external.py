"""ONNX external data on the writing side: lay an exported model out as ``model.onnx`` (the graph)
plus one ``model.onnx.data`` file (the weights), streaming tensor by tensor.

Protobuf cannot serialise a message of 2 GiB or more, so a model whose weights reach that size
cannot be one ``.onnx`` file; the ONNX format then keeps each large initializer's bytes in a file
beside the model (``TensorProto.data_location = EXTERNAL`` with ``location``, ``offset`` and
``length`` entries). :func:`finalize` takes what an exporter wrote (inline, one file per tensor as
the TorchScript exporter writes over 2 GB, or one data file as the dynamo exporter writes) and
writes the layout rulegraph ships: inline up to the threshold, else every initializer of at least
:data:`INLINE_BELOW` bytes in one data file, each at an offset aligned to :data:`ALIGN` bytes. The
weights are copied in chunks of :data:`CHUNK` bytes from the exporter's files, never loaded whole.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import onnx
from onnx import numpy_helper

#: bytes of initializers above which an export keeps its weights in a data file beside the model
EXTERNAL_DATA_THRESHOLD = 2**30
#: the most bytes of initializers an ONNX file may hold inline: protobuf's 2 GiB less room for the graph
PROTOBUF_LIMIT = 2**31 - 2**26
#: initializers smaller than this stay in the model file (shapes, scalars, small vectors)
INLINE_BELOW = 1024
#: each tensor in the data file starts at a multiple of this (any element type, and SIMD loads, are aligned)
ALIGN = 64
#: the most bytes copied at once
CHUNK = 64 * 2**20


def data_file(model_path: Path) -> Path:
    """The data file beside ``model_path`` (``model.onnx`` → ``model.onnx.data``)."""
    return model_path.with_name(model_path.name + ".data")


def initializer_bytes(model: onnx.ModelProto) -> int:
    """The bytes the model's initializers hold, inline or external (from the protos: no data is read)."""
    return sum(tensor_bytes(t) for t in model.graph.initializer)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of one tensor's values, from its dims and element type (0 for strings)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return 0
    count = 1
    for d in tensor.dims:
        count *= d
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def uses_external(model: onnx.ModelProto, threshold: int) -> bool:
    """Whether a model with these initializers is written with external data: above ``threshold``
    bytes (``0``: always), and always above :data:`PROTOBUF_LIMIT`."""
    return initializer_bytes(model) > min(threshold, PROTOBUF_LIMIT)


def finalize(model: onnx.ModelProto, source_dir: Path, staged: Path, threshold: int) -> Path | None:
    """Write ``model`` (read with ``load_external_data=False`` from ``source_dir``) to ``staged``, with
    its weights inline or in ``data_file(staged)`` (see :func:`uses_external`); return the data file
    written, or ``None``."""
    if not uses_external(model, threshold):
        if any(_is_external(t) for t in model.graph.initializer):
            onnx.external_data_helper.load_external_data_for_model(model, str(source_dir))
        onnx.save(model, str(staged))
        return None
    data = data_file(staged)
    offset = 0
    with open(data, "wb") as sink:
        for tensor in model.graph.initializer:
            if tensor_bytes(tensor) < INLINE_BELOW and not _is_external(tensor):
                continue
            pad = -offset % ALIGN
            sink.write(b"\0" * pad)
            offset += pad
            length = 0
            for chunk in _chunks(tensor, source_dir):
                sink.write(chunk)
                length += len(chunk)
            _set_external(tensor, data.name, offset, length)
            offset += length
    onnx.save(model, str(staged))
    return data


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL


def _chunks(tensor: onnx.TensorProto, source_dir: Path) -> Iterator[bytes]:
    """The tensor's little-endian bytes in chunks: from the exporter's data file, else from its
    ``raw_data`` or typed fields (which are then cleared)."""
    if _is_external(tensor):
        info = {e.key: e.value for e in tensor.external_data}
        offset = int(info.get("offset") or 0)
        with open(source_dir / info["location"], "rb") as f:
            left = int(info["length"]) if info.get("length") else os.fstat(f.fileno()).st_size - offset
            f.seek(offset)
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise OSError(f"the exporter's data file {info['location']} ends inside tensor {tensor.name!r}")
                left -= len(chunk)
                yield chunk
        return
    if tensor.HasField("raw_data"):
        raw = tensor.raw_data
        tensor.ClearField("raw_data")
    else:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).newbyteorder("<")
        raw = numpy_helper.to_array(tensor).astype(dtype).tobytes()
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            tensor.ClearField(field)
    for start in range(0, len(raw), CHUNK):
        yield raw[start:start + CHUNK]


def _set_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
