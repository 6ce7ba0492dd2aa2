"""ONNX external data on the reading side: initializers whose bytes live in a file beside the model,
memory-mapped rather than read.

A tensor stored externally names a ``location`` (a path relative to the model's folder), an
``offset`` and a ``length``. Each is checked before any byte is read, with one error each: the
location must be a relative path without ``..`` that stays inside the model's folder once symbolic
links are resolved, the file must exist, and ``offset + length`` must lie within it and ``length``
match the tensor's shape and element type. A file is mapped once, copy-on-write (``np.memmap``
mode ``"c"``): the tensors are views of the mapping, so pages are read from disk when a tensor is
first used, held once whatever the number of tensors, and never written back.
"""
from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
import torch

from ..errors import ModelError


class ExternalData:
    """The external data of one model file: validated, memory-mapped tensors (see the module docstring).

    ``model_path`` is the ``.onnx`` file (``None`` for a ModelProto given without its file: any
    external tensor is then an error).
    """

    def __init__(self, model_path: Path | None):
        self.model_path = model_path
        self.folder = model_path.parent.resolve() if model_path is not None else None
        self._maps: dict[Path, np.memmap] = {}

    def tensor(self, proto: onnx.TensorProto, dtype: torch.dtype, itemsize: int) -> torch.Tensor:
        """The tensor ``proto`` describes, of element type ``dtype`` (``itemsize`` bytes), as a view of its
        mapped file (a copy where the offset is not a multiple of the element size)."""
        where = f"{self.model_path or 'the model'}: initializer {proto.name!r}"
        info = {e.key: e.value for e in proto.external_data}
        if self.folder is None:
            raise ModelError(f"{where} is stored as external data ({info.get('location', '?')}); load the model "
                             "from its .onnx file so the data file beside it can be found")
        file = self._file(info.get("location", ""), where)
        size = file.stat().st_size
        count = 1
        for d in proto.dims:
            count *= d
        expected = count * itemsize
        offset = _integer(info.get("offset", "0"), "offset", where)
        length = _integer(info["length"], "length", where) if info.get("length") else size - offset
        if offset + length > size:
            raise ModelError(f"{where}: its external data runs to byte {offset + length} of {file.name}, "
                             f"which has {size} bytes (offset {offset}, length {length})")
        if length != expected:
            raise ModelError(f"{where}: its external data holds {length} bytes where its shape "
                             f"{list(proto.dims)} of {str(dtype).removeprefix('torch.')} needs {expected}")
        if expected == 0:
            return torch.empty(tuple(proto.dims), dtype=dtype)
        if sys.byteorder != "little" and itemsize > 1:
            raise ModelError(f"{where}: ONNX data is little-endian, and this host is not")
        raw = self._map(file)[offset:offset + length]
        if offset % itemsize:
            raw = np.array(raw)                     # an unaligned tensor: a copy
        return torch.from_numpy(raw).view(dtype).reshape(tuple(proto.dims))

    def _file(self, location: str, where: str) -> Path:
        """The data file ``location`` names, refused unless it is a regular file inside the model's folder."""
        if not location:
            raise ModelError(f"{where} is stored as external data but names no location")
        if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() \
                or PureWindowsPath(location).drive:
            raise ModelError(f"{where}: its external data location {location!r} is an absolute path; it must "
                             f"name a file inside the model's folder {self.folder}")
        if ".." in PurePosixPath(location.replace("\\", "/")).parts:
            raise ModelError(f"{where}: its external data location {location!r} climbs out with '..'; it must "
                             f"name a file inside the model's folder {self.folder}")
        file = (self.folder / location).resolve()
        if not file.is_relative_to(self.folder):
            raise ModelError(f"{where}: its external data location {location!r} resolves to {file}, outside the "
                             f"model's folder {self.folder} (a symbolic link leaving it)")
        if not file.exists():
            raise ModelError(f"{where}: its external data file {location!r} is missing from {self.folder}")
        if not file.is_file():
            raise ModelError(f"{where}: its external data location {location!r} is not a regular file")
        return file

    def _map(self, file: Path) -> np.memmap:
        if file not in self._maps:
            try:
                self._maps[file] = np.memmap(file, dtype=np.uint8, mode="c")
            except (OSError, ValueError) as exc:
                raise ModelError(f"cannot map the external data file {file}: {exc}") from None
        return self._maps[file]


def _integer(text: str, key: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelError(f"{where}: its external data {key} {text!r} is not a number of bytes ≥ 0")
    return value
