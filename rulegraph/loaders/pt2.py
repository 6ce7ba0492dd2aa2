"""Reading a ``.pt2`` archive (``torch.export.save``) from someone else without running its code.

``torch.export.load`` unpickles whatever the archive asks for: a weight or constant marked
``use_pickle`` (loaded with ``weights_only=False``), custom and opaque objects (pickle), the
sample inputs when a tensors-only load of them fails (it retries with ``weights_only=False``),
the pre-2.7 layout, and AOTInductor packages (compiled shared libraries it loads). rulegraph
needs none of these: a program it lowers holds tensors and a graph. So, before torch reads a
byte, :func:`check_archive` reads the zip directory and the weight and constant tables (JSON)
and refuses, in one line, an archive that

* would expand beyond :data:`MAX_BYTES` in all, holds more than :data:`MAX_MEMBERS` files, or a
  compressed member larger than :data:`MIN_RATIO_BYTES` that expands more than :data:`MAX_RATIO`
  times (a zip bomb; torch's own writer stores members uncompressed);
* is not the current layout, or holds compiled code, pickled weights or constants, custom or
  opaque objects;

and :func:`tensors_only` makes every ``torch.load`` during the load a tensors-only one
(``weights_only=True``): a load that asks for more is refused, never retried.
"""
from __future__ import annotations

import contextlib
import json
import zipfile
from pathlib import Path, PurePosixPath
from typing import Iterator

from ..errors import LimitError, ModelError

#: the most an archive may expand to, in all (bytes)
MAX_BYTES = 16 * 2**30
#: the most files an archive may hold
MAX_MEMBERS = 200_000
#: the largest expansion of one compressed member (uncompressed / compressed size) …
MAX_RATIO = 100
#: … counted for members that expand beyond this (bytes)
MIN_RATIO_BYTES = 2**20
#: the largest weight or constant table (JSON) read to look for pickled entries (bytes)
MAX_TABLE_BYTES = 256 * 2**20
#: what an archive holds that rulegraph never loads: member prefix (under the archive's folder) → what it is
REFUSED = {"data/aotinductor/": "AOTInductor compiled code", "data/executorch/": "an ExecuTorch program",
           "data/mtia": "MTIA compiled code", "xl_model_weights/": "XL weights loaded by pickle"}


class Refused(ModelError):
    """The archive asks for an unpickling that could run code (a tensors-only load failed)."""


def check_archive(path: Path) -> None:
    """Refuse ``path`` before torch reads it (see the module docstring)."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            _check_sizes(path, members)
            root = _root(path, members)
            names = {m.filename[len(root):]: m for m in members}
            if "archive_version" not in names or not any(n.startswith("models/") and n.endswith(".json") for n in names):
                raise ModelError(f"{path} is not a torch.export archive of the current layout (torch ≥ 2.7: "
                                 "archive_version and models/*.json); export the model again")
            for name in names:
                refused = next((what for prefix, what in REFUSED.items() if name.startswith(prefix)), None)
                if refused:
                    raise ModelError(f"{path} holds {refused} ({root}{name}); rulegraph loads only a program's graph "
                                     "and tensors, never code from a model file")
            for name, member in names.items():
                if name.startswith("data/weights/") and name.endswith(".pt"):
                    raise ModelError(f"{path}: {root}{name} is a pickled state dict (the legacy layout); "
                                     "rulegraph never unpickles a model file: export the model again")
                if name.endswith("_weights_config.json") and name.startswith("data/weights/"):
                    _check_table(path, root + name, _table(path, archive, member), "weight")
                if name.endswith("_constants_config.json") and name.startswith("data/constants/"):
                    _check_table(path, root + name, _table(path, archive, member), "constant")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ModelError(f"{path} is not a readable torch.export program ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'not a zip archive'})") from None


def _check_sizes(path: Path, members: list[zipfile.ZipInfo]) -> None:
    if len(members) > MAX_MEMBERS:
        raise LimitError(f"{path} holds {len(members):,} files; a .pt2 archive may hold at most {MAX_MEMBERS:,}")
    total = sum(m.file_size for m in members)
    if total > MAX_BYTES:
        raise LimitError(f"{path} expands to {total / 2**30:.1f} GiB; rulegraph reads archives of at most "
                         f"{MAX_BYTES / 2**30:.0f} GiB uncompressed")
    for m in members:
        if m.compress_type != zipfile.ZIP_STORED and m.file_size > MIN_RATIO_BYTES and \
                m.file_size > MAX_RATIO * max(m.compress_size, 1):
            raise LimitError(f"{path}: {m.filename} expands {m.file_size / max(m.compress_size, 1):,.0f} times "
                             f"({m.compress_size:,} → {m.file_size:,} bytes); a member may expand at most "
                             f"{MAX_RATIO} times (a zip bomb?)")


def _root(path: Path, members: list[zipfile.ZipInfo]) -> str:
    """The folder every member is in (torch's reader takes the first member's)."""
    if not members:
        raise ModelError(f"{path} is an empty archive, not a torch.export program")
    root = members[0].filename.partition("/")[0] + "/"
    outside = next((m.filename for m in members if not m.filename.startswith(root)
                    or ".." in PurePosixPath(m.filename).parts), None)
    if outside is not None:
        raise ModelError(f"{path}: member {outside!r} lies outside the archive's folder {root!r}; not a "
                         "torch.export archive")
    return root


def _table(path: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> dict:
    if member.file_size > MAX_TABLE_BYTES:
        raise ModelError(f"{path}: {member.filename} is {member.file_size / 2**20:.0f} MiB; a weight table may be at "
                         f"most {MAX_TABLE_BYTES // 2**20} MiB")
    try:
        table = json.loads(archive.read(member))
    except (ValueError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{path}: {member.filename} is not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(table, dict) or not isinstance(table.get("config"), dict):
        raise ModelError(f"{path}: {member.filename} is not a torch.export payload table")
    return table["config"]


def _check_table(path: Path, name: str, config: dict, kind: str) -> None:
    """No entry of a weight or constant table may need pickle."""
    for fqn, entry in config.items():
        entry = entry if isinstance(entry, dict) else {}
        stored = str(entry.get("path_name", ""))
        if entry.get("use_pickle") or stored.startswith(("custom_obj_", "opaque_obj_")):
            what = "a custom object" if stored.startswith("custom_obj_") else \
                "an opaque object" if stored.startswith("opaque_obj_") else "pickled (use_pickle)"
            raise ModelError(f"{path}: {kind} {fqn!r} ({name}) is {what}; rulegraph never unpickles a model file "
                             "(it could run code): save the program with plain tensors")


@contextlib.contextmanager
def tensors_only(path: Path) -> Iterator[None]:
    """Every ``torch.load`` in the block loads tensors only; one asking for more raises :class:`Refused`."""
    import torch
    original = torch.load

    def load(f, *args, weights_only=None, **kwargs):
        if weights_only is False:
            raise Refused(f"{path} holds an object that only a full unpickling could load (e.g. its sample inputs); "
                          "rulegraph loads tensors only from a model file, never code")
        return original(f, *args, weights_only=True, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original
