"""Writing the user's files: whole or not at all, never through a link, never over an input.

Every file rulegraph writes goes through this module:

* :func:`check_output` refuses, before any work, an output path that cannot or must not be
  written: a symbolic link (rulegraph never writes through one: the link's target would be
  replaced, truncated or created elsewhere), a directory, a device, an existing file without
  ``force``, a file this run reads (``inputs``: the model, the data, the tokenizer… — refused
  even with ``force``), a folder without write permission; :func:`check_outputs` checks all the
  outputs of one run together, and refuses two of them on one file, so that a run writes all its
  outputs or none;
* :func:`write_file` and :func:`replacing` write a whole file beside the destination (a fresh
  temporary file, created exclusively) and rename it over the destination: a reader sees the old
  file or the new one, never half of one, and a stop leaves at worst a hidden ``.NAME.*.partial*``;
* :func:`write_output` is the Python API's write (``to_html(path, overwrite=…)``): an existing
  file only with ``overwrite``, then as :func:`write_file`;
* :func:`append_lines` appends to a journal opened with ``O_NOFOLLOW``;
* :class:`FolderLock` is the advisory lock (``flock``) of an output folder: a second writer is
  refused with the first one's pid; the lock dies with the process that holds it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from .errors import InputError

#: the lock file of an output folder
LOCK = ".rulegraph.lock"


def is_link(path: Path) -> bool:
    return os.path.islink(path)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` are one file (hard links, symbolic links and ``..`` seen through)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_link(path: Path, option: str = "") -> None:
    """Refuse a symbolic link where a file is to be written (``option``: the flag that named it)."""
    if is_link(path):
        raise InputError(f"{option + ' ' if option else ''}{path} is a symbolic link; rulegraph never writes "
                         "through a link (its target would be replaced): remove the link or choose another name")


def refuse_input(path: Path, option: str, inputs: Iterable[str | os.PathLike | None]) -> None:
    """Refuse ``path`` when it is one of the files this run reads (even with ``--force``)."""
    if not os.path.lexists(path):
        return
    for given in inputs:
        if given is not None and str(given) not in ("", "-") and same_file(path, given):
            alias = "" if os.path.abspath(path) == os.path.abspath(given) else f" (the same file as {given})"
            raise InputError(f"{option + ' ' if option else ''}{path} is a file this run reads{alias}; write the "
                             "output elsewhere (--force never replaces an input)")


def check_output(path: Path | None, force: bool, option: str, inputs: Iterable = ()) -> None:
    """Refuse, before any work, an output path that cannot or must not be written (see the module
    docstring); ``-`` (standard output) and ``None`` pass."""
    if path is None or str(path) == "-":
        return
    path = Path(path)
    if not str(path).strip():
        raise InputError(f"{option} is an empty path; give a file name, or '-' for standard output")
    refuse_link(path, option)
    refuse_input(path, option, inputs)
    if path.is_dir():
        raise InputError(f"{option} {path} is a directory; give a file name inside it")
    if path.exists() and not path.is_file():
        raise InputError(f"{option} {path} is not a regular file (a device or a pipe); give a file name")
    if path.exists() and not force:
        raise InputError(f"{option} {path} exists; pass --force to overwrite it")
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or \
            (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{option} {path}: cannot write there (permission denied in {folder})")


def check_outputs(outputs: Iterable[tuple[Path | None, str]], force: bool, inputs: Iterable = ()) -> None:
    """Refuse, before any is written, the outputs of one run (``(path, option)`` pairs; ``None``
    and ``-`` pass): each as :func:`check_output`, and two on one file (the same path, or one
    file reached by two names)."""
    inputs = list(inputs)
    seen: list[tuple[Path, str]] = []
    for path, option in outputs:
        if path is None or str(path) == "-":
            continue
        check_output(path, force, option, inputs)
        for earlier, first in seen:
            if os.path.abspath(earlier) == os.path.abspath(path) or same_file(earlier, path):
                raise InputError(f"{first} and {option} both name {path}; give each output its own file")
        seen.append((Path(path), option))


def write_output(path: Path, content: str | bytes, overwrite: bool, what: str = "the output") -> None:
    """Write ``content`` to ``path`` from the Python API (``to_html(path, overwrite=…)``): an existing
    file only with ``overwrite``, then as :func:`write_file`."""
    path = Path(path)
    if os.path.lexists(path) and not is_link(path) and path.is_file() and not overwrite:
        raise InputError(f"{path} exists; pass overwrite=True to replace it")
    check_output(path, True, what)
    write_file(path, content, what)


@contextlib.contextmanager
def replacing(path: Path, what: str = "the output") -> Iterator[Path]:
    """A fresh temporary path beside ``path`` to write the new file to; on leaving without an
    error it is renamed over ``path`` (the rename replaces a directory entry: it never follows a
    link). ``path`` must not be a symbolic link."""
    path = Path(path)
    refuse_link(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".partial{path.suffix}")
        os.close(handle)
    except OSError as exc:
        raise InputError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    staged = Path(staged)
    try:
        yield staged
        refuse_link(path, what)
        os.chmod(staged, 0o666 & ~_umask())
        os.replace(staged, path)
    except OSError as exc:
        raise InputError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()


def write_file(path: Path, content: str | bytes, what: str = "the output") -> None:
    """Write ``content`` (text as UTF-8) to ``path`` whole or not at all (see :func:`replacing`)."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    with replacing(path, what) as staged:
        with open(staged, "wb") as sink:
            sink.write(data)
            sink.flush()
            os.fsync(sink.fileno())


def save_figure(fig, path: Path, what: str = "the picture", **options) -> Path:
    """A matplotlib figure as a PNG at exactly ``path`` (no suffix added), whole or not at all."""
    with replacing(path, what) as staged:
        fig.savefig(staged, format="png", **options)
    return Path(path)


def append_lines(path: Path, lines: Iterable[str], what: str = "the journal") -> None:
    """Append ``lines`` to ``path`` (created if missing), then flush them to disk; a symbolic link
    at ``path`` is refused, never followed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                     0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP or is_link(path):
            refuse_link(Path(path), what)
        raise InputError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "a", encoding="utf-8") as sink:
        for line in lines:
            sink.write(line)
        sink.flush()
        os.fsync(sink.fileno())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class FolderLock:
    """An advisory lock on an output folder (``flock`` on :data:`LOCK` inside it): held from
    :meth:`acquire` until :meth:`release` or the end of the process, however it ends. A second
    holder is refused with the pid the first one wrote into the lock file. The holder removes the
    file when it releases it (so a refused or finished run leaves the folder as it found it); a
    lock taken on a file that was meanwhile removed is taken again on the new one."""

    def __init__(self, folder: Path, holds: str = "results"):
        self.path = Path(folder) / LOCK
        self.holds = holds
        self.fd: int | None = None

    def acquire(self) -> None:
        import fcntl
        while self.fd is None:
            refuse_link(self.path, "the lock file")
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o666)
            except OSError as exc:
                raise InputError(f"cannot lock {self.path.parent}: {exc.strerror or exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise InputError(f"{self.path.parent} is in use by another run (pid {holder}) writing {self.holds} "
                                 "there; wait for it to finish, or choose another --out") from None
            try:
                current = os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                current = None
            if current != os.fstat(fd).st_ino:      # removed by its last holder meanwhile: lock the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            import fcntl
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
