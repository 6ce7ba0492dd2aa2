"""Tensor sequences (ONNX ``seq(tensor)``): SplitToSequence, SequenceAt, SequenceConstruct,
SequenceLength, SequenceInsert, SequenceErase, SequenceEmpty, ConcatFromSequence.

The exporters emit them for ``torch.unbind``, ``nonzero(as_tuple=True)`` and lists of tensors
(Longformer's global-attention indices). A sequence value is a :class:`TensorSequence` (a list of
tensors). These ops move tensors in and out of lists; no relevance rule reads a list, so the
binding refuses a sequence op that relevance reaches (their ``sequence`` trait).
"""
from __future__ import annotations

import torch

from .spec import op

Tensor = torch.Tensor


class TensorSequence(list):
    """The value of an ONNX sequence: a list of tensors."""


def _position(position, length: int, *, insert: bool = False) -> int:
    """A position in ``[-n, n - 1]`` (``[-n, n]`` for an insertion) as a non-negative index."""
    p = int(position if isinstance(position, int) else position[0] if isinstance(position, list) else position)
    high = length if insert else length - 1
    if not -length <= p <= high:
        raise ValueError(f"sequence position {p} is out of range for a sequence of {length} tensors")
    return p + length if p < 0 else p


@op("SplitToSequence", static=(1,), sequence=True)
def split_to_sequence(x, split=None, *, axis=0, keepdims=1):
    """Pieces of ``x`` along ``axis``: of ``split`` elements each (a scalar; the last piece may be
    shorter), of the sizes ``split`` lists, or (no ``split``) of one element each, dropping the axis
    unless ``keepdims``."""
    if split is None:
        pieces = torch.split(x, 1, dim=axis)
        if not keepdims:
            pieces = [p.squeeze(axis) for p in pieces]
    else:
        pieces = torch.split(x, split if isinstance(split, list) else int(split), dim=axis)
    return TensorSequence(pieces)


@op("SequenceAt", static=(1,), sequence=True)
def sequence_at(seq, position):
    return seq[_position(position, len(seq))]


@op("SequenceConstruct", sequence=True)
def sequence_construct(*xs):
    return TensorSequence(xs)


@op("SequenceEmpty", sequence=True)
def sequence_empty(*, dtype=torch.float32):
    return TensorSequence()


@op("SequenceLength", sequence=True, float_output=False)
def sequence_length(seq):
    return torch.tensor(len(seq), dtype=torch.int64)


@op("SequenceInsert", static=(2,), sequence=True)
def sequence_insert(seq, tensor, position=None):
    out = TensorSequence(seq)
    out.insert(len(seq) if position is None else _position(position, len(seq), insert=True), tensor)
    return out


@op("SequenceErase", static=(1,), sequence=True)
def sequence_erase(seq, position=None):
    out = TensorSequence(seq)
    del out[len(seq) - 1 if position is None else _position(position, len(seq))]
    return out


@op("ConcatFromSequence", sequence=True)
def concat_from_sequence(seq, *, axis, new_axis=0):
    return torch.stack(list(seq), dim=axis) if new_axis else torch.cat(list(seq), dim=axis)
