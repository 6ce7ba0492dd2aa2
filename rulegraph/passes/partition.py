"""Partitions of the input positions into groups (Yang et al. 2023, Sec. 2.1: a group is an
element of a partition P of the inputs).

A partition is given as

``token``        one group per position (default);
``word``         subword tokens merged by the tokenizer's word ids; special tokens
                 ([CLS], [SEP]) stay groups of their own;
``0-3,4-9,12``   explicit groups of positions (inclusive ranges, commas between
                 groups, ``+`` to join pieces: ``0-2+5``); positions not named form
                 one last group, ``rest``;
``source:K``     two groups: positions ``0…K−1`` (the source) and ``K…`` (the
                 target prefix) — for decoder-only models;
a list of lists  explicit groups of positions, from Python.

:func:`assign` turns one into a group index per position, for one batch item.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from ..errors import InputError

KINDS = ("token", "word", "source:K", "0-3,4-9")


@dataclass
class Partition:
    """Group index per position, and a label per group."""

    index: list[int]
    labels: list[str]

    @property
    def size(self) -> int:
        return len(self.labels)

    def members(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.labels]
        for position, g in enumerate(self.index):
            out[g].append(position)
        return out


def assign(spec: str | Sequence[Sequence[int]], length: int, word_ids: Sequence[int | None] | None = None,
           tokens: Sequence[str] | None = None) -> Partition:
    """The partition of ``length`` positions that ``spec`` describes (see the module docstring)."""
    if not isinstance(spec, str):     # groups cannot overlap: read at most `length` of each, then check
        try:
            groups = [list(itertools.islice(g, length + 1)) for g in itertools.islice(spec, length + 1)]
        except TypeError:
            raise InputError(f"groups must be token, word, source:K, ranges like 0-3,4-9, or lists of positions; "
                             f"got {spec!r:.80}") from None
        if len(groups) > length or any(len(g) > length for g in groups):
            raise InputError(f"groups: give at most {length} groups of at most {length} positions each (lists of "
                             f"positions 0…{length - 1})")
        return _explicit(groups, length)
    spec = spec.strip()
    if spec == "token":
        labels = list(tokens) if tokens is not None and len(tokens) == length else [str(i) for i in range(length)]
        return Partition(list(range(length)), labels)
    if spec == "word":
        if word_ids is None:
            raise InputError("--groups word needs the tokenizer's word ids: give --text with a tokenizer "
                             "(or word_ids= from Python)")
        if len(word_ids) != length:
            raise InputError(f"got {len(word_ids)} word ids for {length} positions")
        index, labels, seen = [], [], {}
        for position, w in enumerate(word_ids):
            key = ("word", w) if w is not None else ("special", position)
            if key not in seen:
                seen[key] = len(labels)
                labels.append(tokens[position] if tokens is not None else str(position))
            elif tokens is not None:
                labels[seen[key]] += tokens[position].removeprefix("##")
            index.append(seen[key])
        return Partition(index, labels)
    if spec.startswith(("source:", "prefix:")):
        try:
            k = int(spec.partition(":")[2])
        except ValueError:
            raise InputError(f"--groups {spec!r}: expected source:K with K an integer") from None
        if not 0 < k < length:
            raise InputError(f"--groups {spec!r}: K must be between 1 and {length - 1} for {length} positions")
        return Partition([0] * k + [1] * (length - k), ["source", "prefix"])
    groups = []
    for piece in spec.split(","):
        positions: list[int] = []
        for part in piece.split("+"):
            lo, dash, hi = part.strip().partition("-")
            try:
                a, b = int(lo), int(hi) if dash else int(lo)
            except ValueError:
                raise InputError(f"--groups {spec!r}: cannot read {part.strip()!r}; valid: token, word, source:K, "
                                 "or position ranges like 0-3,4-9") from None
            if a > b:
                raise InputError(f"--groups {spec!r}: range {a}-{b} is empty")
            if a < 0 or b >= length:        # checked before the range is built (0-300000000 is no list to make)
                raise InputError(f"--groups {spec!r}: position {a if a < 0 else b} is outside the input's {length} "
                                 f"positions (0…{length - 1})")
            positions.extend(range(a, b + 1))
        groups.append(positions)
    return _explicit(groups, length)


def _explicit(groups: list[list[int]], length: int) -> Partition:
    index = [-1] * length
    labels = []
    for g, positions in enumerate(groups):
        if not positions:
            raise InputError(f"group {g} is empty")
        for p in positions:
            if not 0 <= p < length:
                raise InputError(f"group {g} names position {p}, but the input has {length} positions (0…{length - 1})")
            if index[p] != -1:
                raise InputError(f"position {p} is in groups {index[p]} and {g}; groups must not overlap")
            index[p] = g
        labels.append(_label(positions))
    if -1 in index:
        index = [len(groups) if g == -1 else g for g in index]
        labels.append("rest")
    return Partition(index, labels)


def _label(positions: list[int]) -> str:
    """``0-3`` for a run of positions, ``3+5`` otherwise."""
    if len(positions) > 1 and positions == list(range(positions[0], positions[-1] + 1)):
        return f"{positions[0]}-{positions[-1]}"
    return "+".join(map(str, positions))
