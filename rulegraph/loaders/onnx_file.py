"""Reading an ONNX file with its weights held once.

``onnx.load`` parses the whole file into protobuf messages (a copy of every weight's bytes),
``onnx.checker.check_model(path)`` reads and parses the file again, and turning each initializer
into a tensor copies it once more: loading peaked at about twice the weights. Here the file is read
once, into one buffer, and the weights stay there:

1. :func:`scan` walks the protobuf wire format of the buffer (``ModelProto.graph`` → each
   ``GraphProto.initializer`` → its ``raw_data``) without decoding the weights, and writes the model
   without the initializers' ``raw_data`` (a few kilobytes to megabytes: the nodes, names and shapes);
   protobuf parses that, and the checker checks it (:func:`check`), with every initializer whose data
   is not in the message (``raw_data`` taken out here, or external data checked by
   :class:`~rulegraph.loaders.external.ExternalData`) made an empty tensor of its element type for the
   check only: the checker's tests of names, element types, the graph's order and the ops' schemas
   all run, its test of each weight's payload is :func:`weights`' (the byte count must match the shape).
2. :func:`weights` moves each initializer's bytes, in file order, towards the buffer's start, to the
   first 64-byte boundary after the tensor moved before it (over the nodes and the protobuf framing,
   which are no longer needed: a file's nodes come before its initializers, so there is room for
   every boundary), and returns tensors that are views of the buffer: one copy of the weights in all.

A file the scanner cannot read as protobuf (a truncated or corrupt one, groups, a text format) is
read as before by ``onnx.load``, whose error is the one the user sees.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch

from ..errors import ModelError

#: ``ModelProto.graph``, ``GraphProto.initializer``, ``TensorProto.raw_data`` (onnx.proto field numbers)
MODEL_GRAPH, GRAPH_INITIALIZER, TENSOR_RAW_DATA = 7, 5, 9
#: each weight moved to an address that is a multiple of this (as torch's allocator aligns its tensors)
ALIGN = 64
#: the largest file read this way: protobuf parses no message of 2 GiB or more (larger models keep
#: their weights as external data, which is memory-mapped)
MAX_FILE_BYTES = 2**31 - 1


class Malformed(Exception):
    """The bytes are not protobuf wire format the scanner reads (``onnx.load`` then says why)."""


@dataclass
class OnnxFile:
    """An ONNX file read once: the model without its initializers' ``raw_data``, the buffer holding the
    file's bytes, and for each initializer (in ``model.graph.initializer`` order) where its ``raw_data``
    lies in the buffer — ``(offset, length)`` — or ``None`` when it has none."""
    model: onnx.ModelProto
    buffer: torch.Tensor
    raw: list[tuple[int, int] | None]


def read(path: Path) -> OnnxFile | None:
    """``path`` read once and scanned; ``None`` when it is to be read by ``onnx.load`` instead (a text
    format by its extension, a big-endian host, a file over :data:`MAX_FILE_BYTES`, bytes the scanner
    cannot read). A file that cannot be opened raises ``OSError``."""
    if sys.byteorder != "little" or _format(path) != "protobuf":
        return None
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size > MAX_FILE_BYTES:
            return None
        f.seek(0)
        buffer = torch.empty(size, dtype=torch.uint8)
        if size and f.readinto(memoryview(buffer.numpy())) != size:
            return None
    try:
        stripped, raw = scan(memoryview(buffer.numpy()))
    except Malformed:
        return None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(stripped)
    except Exception:  # protobuf raises several unrelated types; onnx.load reports it
        return None
    if len(raw) != len(model.graph.initializer):
        return None
    return OnnxFile(model, buffer, raw)


def _format(path: Path) -> str:
    """The serialization format onnx.load would use for ``path`` (by its extension; protobuf otherwise)."""
    from onnx import serialization
    return serialization.registry.get_format_from_file_extension(path.suffix) or "protobuf"


# -- the wire format ---------------------------------------------------------------------------------------------

def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview, start: int, end: int):
    """Each field of the message in ``buf[start:end]``: (number, wire type, key start, payload start, end)."""
    pos = start
    while pos < end:
        key_start = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed
        payload = pos
        if wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, payload = _varint(buf, pos, end)
            pos = payload + length
        elif wire == 5:
            pos += 4
        else:                                   # groups (3, 4) and the unused 6, 7
            raise Malformed
        if pos > end:
            raise Malformed
        yield number, wire, key_start, payload, pos


def _encode(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _message(number: int, body: bytes | bytearray) -> bytes:
    return _encode(number << 3 | 2) + _encode(len(body)) + bytes(body)


def scan(buf: memoryview) -> tuple[bytes, list[tuple[int, int] | None]]:
    """The model in ``buf`` without its initializers' ``raw_data``, and where each initializer's
    ``raw_data`` lies in ``buf`` (its last occurrence, as protobuf keeps the last; ``None`` if none).
    Every other byte is copied as it is, so protobuf parses the result as it would the file, less the
    weights (a message field given twice is merged by protobuf, and the initializers counted in order)."""
    out = bytearray()
    raw: list[tuple[int, int] | None] = []
    for number, wire, key, payload, end in _fields(buf, 0, len(buf)):
        if number != MODEL_GRAPH or wire != 2:
            out += buf[key:end]
            continue
        graph = bytearray()
        for number2, wire2, key2, payload2, end2 in _fields(buf, payload, end):
            if number2 != GRAPH_INITIALIZER or wire2 != 2:
                graph += buf[key2:end2]
                continue
            tensor, found = bytearray(), None
            for number3, wire3, key3, payload3, end3 in _fields(buf, payload2, end2):
                if number3 == TENSOR_RAW_DATA and wire3 == 2:
                    found = (payload3, end3 - payload3)
                else:
                    tensor += buf[key3:end3]
            raw.append(found)
            graph += buf[key2:end2] if found is None else _message(GRAPH_INITIALIZER, tensor)
        out += _message(MODEL_GRAPH, graph)
    return bytes(out), raw


# -- checking and the weights ------------------------------------------------------------------------------------

def check(model: onnx.ModelProto, without_data: set[int]) -> None:
    """``onnx.checker.check_model`` on a copy of ``model`` in which each initializer whose index is in
    ``without_data`` is an empty tensor of its element type (its data is checked elsewhere)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for k in without_data:
        init = copy.graph.initializer[k]
        del init.dims[:]
        init.dims.append(0)
        init.ClearField("data_location")
        del init.external_data[:]
    onnx.checker.check_model(copy)


def weights(file: OnnxFile, elements: dict[int, tuple[torch.dtype, int]], where: str) -> dict[int, torch.Tensor]:
    """The initializers with ``raw_data`` (index → tensor of the dtype and item size ``elements`` gives),
    as views of ``file.buffer`` moved to aligned addresses (see the module docstring; where there is no
    room for a 64-byte boundary, the element size's; where there is none for that either, a copy); one
    whose byte count does not match its shape is an error naming it. The buffer's other bytes are
    overwritten."""
    inits = file.model.graph.initializer
    placed: list[tuple[int, int, int]] = []             # (index, start after the move, length)
    for k, found in enumerate(file.raw):
        if found is None:
            continue
        dtype, itemsize = elements[k]
        count = 1
        for d in inits[k].dims:
            count *= d
        if found[1] != count * itemsize:
            raise ModelError(f"{where}: initializer {inits[k].name!r} holds {found[1]} bytes where its shape "
                             f"{list(inits[k].dims)} of {str(dtype).removeprefix('torch.')} needs {count * itemsize}")
        placed.append((k, *found))
    base = file.buffer.data_ptr()
    out: dict[int, torch.Tensor] = {}
    free = 0                                            # the first byte no moved tensor holds
    for k, start, length in sorted(placed, key=lambda p: p[1]):
        dtype, itemsize = elements[k]
        shape = tuple(inits[k].dims)
        target = next((t for t in (-(-free // ALIGN) * ALIGN, -(-free // itemsize) * itemsize) if t <= start), None)
        if target is None:                              # no room before it to align it: a copy
            out[k] = file.buffer[start:start + length].clone().view(dtype).reshape(shape)
            continue
        if target != start and length:
            ctypes.memmove(base + target, base + start, length)
        out[k] = file.buffer[target:target + length].view(dtype).reshape(shape)
        free = target + length
    return out
