"""The process's C heap kept for the next explanation, not handed back to the system after each one.

An explanation keeps the forward's values until the relevance walk has read them, then frees them all.
glibc's ``malloc`` returns the freed top of its heap to the system once more than its trim threshold lies
free there (about twice the largest block it recently served from a mapping: a megabyte or two), so the
next explanation of a model takes the same memory back page by page, each page faulted in and zeroed by the
kernel. At 94 tokens on the demo model that was about 5,000 page faults per explanation, a seventh of its
time (``benchmarks/results/heap.md``). :func:`keep_freed` asks ``malloc`` to leave :data:`PAD` bytes
untrimmed at the top of its heap (``mallopt(M_TOP_PAD)``, which leaves its adaptive thresholds alone): the
memory one explanation freed serves the next, and the process's resident size stays at most that much
above what it holds. Called once, when the first :class:`~rulegraph.interpreter.Plan` is built; a no-op
off glibc, and where ``RULEGRAPH_KEEP_HEAP=0``.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform

#: bytes left untrimmed at the top of the heap: more than a short explanation's values
PAD = 256 << 20
ENVIRONMENT = "RULEGRAPH_KEEP_HEAP"
_M_TOP_PAD = -2         # glibc's malloc.h


@functools.cache
def keep_freed() -> bool:
    """Leave :data:`PAD` freed bytes at the top of the C heap for the process's next allocations; whether it
    was set (glibc only, once per process; ``RULEGRAPH_KEEP_HEAP=0`` turns it off)."""
    return (os.environ.get(ENVIRONMENT, "1").strip() != "0" and platform.system() == "Linux"
            and platform.libc_ver()[0] == "glibc" and _mallopt(_M_TOP_PAD, PAD))


def _mallopt(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None).mallopt(ctypes.c_int(option), ctypes.c_int(value)) == 1
    except (OSError, AttributeError):
        return False
