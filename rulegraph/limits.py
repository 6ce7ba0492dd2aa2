"""Limits on the work a model file or an input may ask for, checked before the work starts.

A model file states sizes (a shape to expand to, a range to build, a table to densify) and so
does a user (a number of tokens to generate, position ranges); each is checked against a limit
before anything is allocated or run, so that a 300-byte model cannot ask for a 100 GiB tensor
or an hour of arithmetic on a broadcast view. The one-tensor budget is :data:`MAX_TENSOR_BYTES`
(8 GiB), or the environment's ``RULEGRAPH_MAX_TENSOR_BYTES`` where a larger model needs more.
"""
from __future__ import annotations

import math
import os
from typing import Iterable

from .errors import LimitError, ModelError

#: the largest tensor one op may make, in bytes (``RULEGRAPH_MAX_TENSOR_BYTES`` overrides it)
MAX_TENSOR_BYTES = 8 * 2**30
ENVIRONMENT = "RULEGRAPH_MAX_TENSOR_BYTES"


def tensor_budget() -> int:
    """The one-tensor budget in bytes: :data:`MAX_TENSOR_BYTES` or the environment's value."""
    raw = os.environ.get(ENVIRONMENT, "").strip()
    if not raw:
        return MAX_TENSOR_BYTES
    try:
        value = int(float(raw))
    except ValueError:
        raise ModelError(f"{ENVIRONMENT}={raw!r} is not a number of bytes") from None
    if value < 1:
        raise ModelError(f"{ENVIRONMENT}={raw!r} must be ≥ 1 (bytes)")
    return value


def elements(shape: Iterable[int]) -> int:
    return math.prod(max(0, int(d)) for d in shape)


def check_tensor(count: int, itemsize: int, what: str) -> None:
    """Refuse a tensor of ``count`` elements of ``itemsize`` bytes over the budget, naming ``what`` makes it."""
    budget = tensor_budget()
    if count * itemsize > budget:
        raise LimitError(f"{what} would make a tensor of {count:,} elements ({_bytes(count * itemsize)}); the limit "
                         f"for one tensor is {_bytes(budget)} (set {ENVIRONMENT} to raise it)")


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} bytes"
