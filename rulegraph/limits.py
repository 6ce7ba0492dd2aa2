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
import re
from dataclasses import dataclass
from typing import Iterable

import torch

from .errors import InputError, LimitError, ModelError

#: the largest tensor one op may make, in bytes (``RULEGRAPH_MAX_TENSOR_BYTES`` overrides it)
MAX_TENSOR_BYTES = 8 * 2**30
ENVIRONMENT = "RULEGRAPH_MAX_TENSOR_BYTES"
Tensor = torch.Tensor
_POSITION_TABLE = re.compile(r"position|wpe|pos_emb", re.IGNORECASE)


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


@dataclass
class InputLimits:
    """What the inputs' values and sizes may be, read off the graph once: token ids index an
    embedding table where a lookup reads the ids themselves, not a hash of them (``ids``: input →
    (rows, table)); the sequence length is bounded by the export's ``rulegraph.max_length``, else by the rows of a position table (a table named like one, indexed
    by values that depend only on the input shapes)."""

    ids: dict[str, tuple[int, str]]
    positions: tuple[int, str] | None

    @classmethod
    def of(cls, graph, shaped: frozenset[str], max_length: int | None = None) -> "InputLimits":
        """The limits of ``graph``'s inputs; ``shaped``: the values fixed by the input shapes alone;
        ``max_length``: the export's ``rulegraph.max_length``, where it states one."""
        from .boundary import constant_value, lookups
        ids: dict[str, tuple[int, str]] = {}
        for lk in lookups(graph):          # ids moved, not computed: the table's rows bound them
            if lk.bounds_ids:
                rows = int(constant_value(graph, lk.table).shape[0])
                if lk.source not in ids or rows < ids[lk.source][0]:
                    ids[lk.source] = (rows, lk.table)
        positions = None
        if max_length is not None:
            positions = (max_length, "the export's rulegraph.max_length")
        else:
            for node in graph.nodes:
                table = node.inputs[0] if node.op == "Gather" and len(node.inputs) > 1 else ""
                if table in graph.constants and graph.constants[table].is_floating_point() \
                        and node.inputs[1] in shaped and _POSITION_TABLE.search(table):
                    rows = int(graph.constants[table].shape[0])
                    if positions is None or rows < positions[0]:
                        positions = (rows, f"the position table {table!r}")
        return cls(ids, positions)

    def check(self, feeds: dict[str, Tensor], infos: dict) -> None:
        """Refuse ids outside their embedding table, sequences longer than the position table, and
        inputs that disagree on a dimension they share by name (``batch``, ``sequence``…)."""
        seen: dict[str, tuple[str, int]] = {}
        for name, value in feeds.items():
            shape = infos[name].shape or ()
            for d, symbol in enumerate(shape):
                if isinstance(symbol, str) and d < value.dim():
                    first = seen.setdefault(symbol, (name, value.shape[d]))
                    if first[1] != value.shape[d]:
                        raise InputError(f"input {name} has {value.shape[d]} along {symbol!r} (dim {d}) but "
                                         f"{first[0]} has {first[1]}; they must agree (shape {tuple(value.shape)})")
        for name, (rows, table) in self.ids.items():
            ids = feeds[name]
            if ids.numel() == 0:
                raise InputError(f"input {name} is empty")
            low, high = int(ids.min()), int(ids.max())
            if low < 0:
                raise InputError(f"input {name} holds the id {low}; token ids are ≥ 0")
            if high >= rows:
                raise InputError(f"input {name} holds the id {high}, outside the vocabulary: the embedding table "
                                 f"{table!r} has {rows} rows (ids 0…{rows - 1})")
            if self.positions is not None and ids.dim() >= 2 and ids.shape[1] > self.positions[0]:
                raise InputError(f"input {name} has {ids.shape[1]} positions; the model takes at most "
                                 f"{self.positions[0]} ({self.positions[1]})")
