"""Large tensors an explanation has finished with, kept for the next op that makes one of the same size.

A fresh large tensor costs page faults: the kernel maps and zeroes each page at its first touch, which
takes about as long as the op that fills it (an attention map of 12 × 1,024 × 1,024 floats: 21 ms of
a 32 ms Add). A relevance walk makes such tensors over and over, one layer after another: the
attention scores, probabilities and their signals. Within :func:`recycling`, the interpreter and the
walk hand the tensors they drop to a :class:`Recycler` (:func:`give`), and the ops that make large
tensors write into one of them (:func:`out`, ``out=``): the same kernel, so the same bits.

Only a tensor nothing else holds is kept (no other reference, view or storage owner), at most
:data:`HELD` per size and :data:`HELD_BYTES` in all, and only during the explanation; only on the CPU
(on a GPU, torch's caching allocator already hands freed memory out again).
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch

Tensor = torch.Tensor

#: tensors smaller than this (bytes) are left to the allocator, which reuses them itself
RECYCLE_FROM = 1 << 22
#: tensors kept per size (elements, dtype, device)
HELD = 3
#: bytes kept in all
HELD_BYTES = 1 << 30

_active: ContextVar["Recycler | None"] = ContextVar("rulegraph_recycler", default=None)


def large(numel: int, itemsize: int) -> bool:
    """Whether a tensor of ``numel`` elements of ``itemsize`` bytes is one this module recycles."""
    return numel * itemsize >= RECYCLE_FROM


class Recycler:
    """Dropped tensors by size, handed out again whole (a tensor of the same number of elements)."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[Tensor]] = {}
        self.held = 0           # bytes
        self.given = self.taken = 0

    def give(self, t: Tensor) -> None:
        key = (t.numel(), t.dtype, t.device)
        size = t.numel() * t.element_size()
        kept = self._free.setdefault(key, [])
        if len(kept) < HELD and self.held + size <= HELD_BYTES:
            kept.append(t)
            self.held += size
            self.given += 1

    def take(self, shape: tuple[int, ...], numel: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        kept = self._free.get((numel, dtype, device))
        if not kept:
            return None
        storage = kept.pop().untyped_storage()
        self.held -= storage.nbytes()
        self.taken += 1
        # a new tensor on the old storage: the old one is gone, so a sum memoized while it lived (keyed by
        # its memory, held by a weak reference: the relevance ledger, the group sums) is not read again
        return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape)


@contextmanager
def recycling() -> Iterator[Recycler]:
    """Recycle large tensors within the block (nested blocks share the outer one's)."""
    outer = _active.get()
    if outer is not None:
        yield outer
        return
    recycler = Recycler()
    token = _active.set(recycler)
    try:
        yield recycler
    finally:
        _active.reset(token)


def give(t: object) -> None:
    """Keep ``t`` for reuse if it is a large tensor that nothing else holds. The argument must be the only
    reference the caller has: ``give(values.pop(name))``, ``give(incoming.drop())``."""
    recycler = _active.get()
    if recycler is None or not isinstance(t, Tensor) or t.device.type != "cpu" or \
            not large(t.numel(), t.element_size()):
        return
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None or t.requires_grad or t._is_view() or not t.is_contiguous() or t.storage_offset() or \
            t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return
    # the argument and getrefcount's; the storage: this tensor and the untyped_storage() object
    if sys.getrefcount(t) == 2 and count(t.untyped_storage()._cdata) == 2:
        recycler.give(t)


def _transformed(t: Tensor) -> bool:
    """Whether ``t`` is a tensor of a torch.func transform (a vmap batch: ops there take no ``out=``)."""
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return wrapped is None or wrapped(t)


def out(shape: tuple[int, ...] | torch.Size, *operands: Tensor) -> dict[str, Tensor]:
    """``{"out": t}`` with a kept tensor of ``shape`` for an op of ``operands`` (one floating dtype and
    device, none recorded by autograd), or ``{}``: the op then allocates as usual."""
    recycler = _active.get()
    if recycler is None:
        return {}
    first = operands[0]
    numel = 1
    for n in shape:
        numel *= n
    if not large(numel, first.element_size()) or not first.is_floating_point():
        return {}
    if any(o.dtype != first.dtype or o.device != first.device or _transformed(o) for o in operands) or \
            torch.is_grad_enabled() and any(o.requires_grad for o in operands):
        return {}
    t = recycler.take(tuple(shape), numel, first.dtype, first.device)
    return {} if t is None else {"out": t}


def broadcast_out(*operands: Tensor) -> dict[str, Tensor]:
    """:func:`out` for an elementwise op of ``operands``: their broadcast shape."""
    if _active.get() is None or not operands:
        return {}
    return out(torch.broadcast_shapes(*(o.shape for o in operands)), *operands)
