"""Errors a user can act on.

Every error rulegraph raises on bad input is a :class:`RulegraphError` whose message
is one line that names what was wrong and, where there is a choice, the valid
choices. The CLI prints that line and exits non-zero; it never shows a traceback
for these.
"""
from __future__ import annotations

from difflib import get_close_matches
from pathlib import Path
from typing import Iterable


class RulegraphError(Exception):
    """Base class: a problem with the user's model, rule file, inputs or options. The message
    speaks Python's terms (``tokenizer=``); ``cli``, where it differs, the command line's
    (``--tokenizer``), which the command line prints instead."""

    def __init__(self, *args, cli: str | None = None):
        super().__init__(*args)
        self.cli = cli


class ModelError(RulegraphError):
    """The model file is missing, unreadable, or uses something rulegraph cannot run."""


class UnsupportedOpError(ModelError):
    """A node's op has no implementation."""


class LimitError(ModelError):
    """The model (or an input through it) asks for more than a limit allows: a tensor over the
    one-tensor budget, an archive that expands too far (:mod:`rulegraph.limits`)."""


class RuleFileError(RulegraphError):
    """A rule file is malformed; the message starts with ``file:line``."""


class RuleMatchError(RulegraphError):
    """A node has no rule, or its rule cannot apply to it."""


class InputError(RulegraphError):
    """The inputs given do not fit the model (names, dtypes, shapes, values)."""


class ExportError(RulegraphError):
    """No exporter gives a graph that computes what the module computes."""


class NumericalError(RulegraphError):
    """NaN or inf where a finite value is needed."""


#: the largest text file rulegraph reads whole (a rule file, a tokenizer is read by its own library)
MAX_TEXT_BYTES = 16 * 2**20


def read_text(path: Path, what: str, error: type[RulegraphError], *, encoding: str = "utf-8",
              limit: int | None = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of ``path`` (``encoding``: ``utf-8-sig`` drops a byte-order mark), or a
    one-line ``error`` saying why it cannot be read; ``limit``: the most bytes it may hold."""
    if not path.exists():
        raise error(f"{what} not found: {path}")
    if path.is_dir():
        raise error(f"{path} is a directory, not a {what}")
    size = path.stat().st_size
    if limit is not None and size > limit:
        raise error(f"{path} is {size / 2**20:.0f} MiB; a {what} may be at most {limit // 2**20} MiB")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise error(f"{path}:{line}: the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                    f"{exc.start})") from None


def choices(valid: Iterable[str], given: str | None = None) -> str:
    """Format valid choices, leading with the closest matches to ``given``."""
    valid = sorted(set(valid))
    close = get_close_matches(given, valid, n=3, cutoff=0.6) if given else []
    listed = ", ".join(valid) if len(valid) <= 24 else ", ".join(valid[:24]) + f", … ({len(valid)} in all)"
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}valid: {listed}"


#: optional package (top-level module) → the extra of ``pip install "rulegraph[EXTRA]"`` that brings it
EXTRAS = {"transformers": "hf", "safetensors": "hf", "ray": "ray", "spacy": "heads", "en_core_web_sm": "heads",
          "optuna": "tune"}


class MissingDependency(RulegraphError):
    """An optional package a command needs is not installed; the message names the install command."""

    @classmethod
    def of(cls, exc: ImportError) -> "MissingDependency | None":
        """The error for ``exc`` where it is an optional package rulegraph names in :data:`EXTRAS`, else None."""
        top = (getattr(exc, "name", None) or "").split(".")[0]
        if top not in EXTRAS:
            return None
        return cls(f"this needs the optional package {top!r}, which is not installed: "
                   f"pip install \"rulegraph[{EXTRAS[top]}]\" (in a checkout: make setup, which installs every extra)")
