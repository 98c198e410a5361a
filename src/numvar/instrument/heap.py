"""Freed memory kept for reuse while numvar runs (glibc's malloc).

Under a fuzzy block every float op allocates and frees buffers of the size of its
activations: op granularity re-runs the op on float64 copies of its inputs, flop
granularity builds the compiled kernels' operands and results. With glibc's default
settings such a pattern keeps returning memory to the system and faulting it back in,
page by page: glibc raises its mmap threshold to the largest block freed so far and
trims the top of the heap whenever more than twice that threshold is free there, so a
layer that frees several blocks of the largest size at once gives their memory back,
and the next layer touches it afresh. Measured on the zoo (one thread, minor page faults
per forward): U-Net at op granularity 2 520 faults and 5 ms of system time per 51 ms
forward, at flop 654 faults and 7 ms; EfficientNet at op granularity 900–2 000 faults,
3 ms of 38 ms, depending on what the process ran before (docs/speed.md, "Freed memory
kept for reuse"). Native forwards fault almost never: their float32 buffers are half the
size and fewer.

:func:`keep_freed_memory` (called by every fuzzy block's entry; once per process) sets
glibc's mmap threshold to :data:`MMAP_THRESHOLD` and its trim threshold to
:data:`TRIM_THRESHOLD`, which also turns the dynamic adjustment off: blocks below 32 MB
come from the heap, and up to 256 MB of free memory at its top is kept for the next
allocation instead of being returned. The process's peak memory does not grow; memory
freed after a peak is returned to the system only beyond those 256 MB. Results do not
depend on it (no value changes, only where memory comes from). Other C libraries, and
``NUMVAR_KEEP_FREED_MEMORY=0`` in the environment, leave malloc as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger("numvar")

#: environment variable: ``0`` leaves malloc's settings alone
ENV = "NUMVAR_KEEP_FREED_MEMORY"
#: blocks at least this large are mapped (and unmapped when freed) on their own; 32 MB is
#: the largest value every 64-bit glibc accepts (``DEFAULT_MMAP_THRESHOLD_MAX``)
MMAP_THRESHOLD = 32 << 20
#: free memory at the top of the heap beyond this is returned to the system
TRIM_THRESHOLD = 256 << 20
# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_applied: bool | None = None  # None: not tried yet in this process


def _glibc():
    """The C library as a ctypes handle when it is glibc (it has ``mallopt`` with these
    parameters), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse (module docstring), once per
    process; whether it is set. False under another C library, when ``mallopt`` refuses,
    or with ``NUMVAR_KEEP_FREED_MEMORY=0``."""
    global _applied
    if _applied is None:
        _applied = False
        if os.environ.get(ENV, "1").strip() != "0":
            libc = _glibc()
            if libc is not None:
                _applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
                logger.debug("numvar: malloc keeps freed memory (mmap threshold %d, trim "
                             "threshold %d): %s", MMAP_THRESHOLD, TRIM_THRESHOLD, _applied)
    return _applied
