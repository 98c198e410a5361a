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
come from the heap, and up to 2 GiB of free memory at its top is kept for the next
allocation instead of being returned. glibc maps a block of 32 MB or more on its own
whatever its mmap threshold (32 MB is the largest threshold it accepts) and unmaps it
when freed, so that every op whose buffers are that large (a float64 re-run of a
convolution over a 256 × 256 image: its im2col buffer alone is 75 MB a sample) faulted
all of them in, page by page, on every call: a U-Net on two 192 × 192 images at op
granularity took 120 000 minor faults and 549–551 ms a forward with such blocks mapped,
2 and 293 ms from the heap (docs/speed.md, "Large blocks from the heap"). So while a
fuzzy block is active (:func:`block_entered`, :func:`block_exited`; with
:data:`LARGE_BLOCKS_FROM_HEAP`), glibc maps no block on its own (its count of mapped
blocks set to 0): blocks of every size come from the heap, and stay there when freed,
for the next block's. Outside fuzzy blocks its count is what it was (65 536, or
``MALLOC_MMAP_MAX_`` where set), so that large blocks the program allocates itself (a
dataset, say) are still mapped and returned to the system when freed.

The cost is memory. The process keeps what its blocks freed: its resident memory stays
near the peak of its heap, which large blocks freed in the middle of it (not only at
the top) can raise above the peak of what was in use at once. Measured on that U-Net over 80
forwards: the heap's peak settled after a dozen forwards at 848 MB (op granularity,
613 MB with large blocks mapped) and 766 MB (flop, 656 MB), and did not grow after.
Results do not depend on it (no value changes, only where memory comes from). Other C
libraries, and ``NUMVAR_KEEP_FREED_MEMORY=0`` in the environment, leave malloc as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

logger = logging.getLogger("numvar")

#: environment variable: ``0`` leaves malloc's settings alone
ENV = "NUMVAR_KEEP_FREED_MEMORY"
#: glibc's mmap threshold: blocks at least this large are mapped (and unmapped when freed)
#: on their own, unless :data:`LARGE_BLOCKS_FROM_HEAP`; 32 MB is the largest value every
#: 64-bit glibc accepts (``DEFAULT_MMAP_THRESHOLD_MAX``)
MMAP_THRESHOLD = 32 << 20
#: free memory at the top of the heap beyond this is returned to the system (the largest
#: value ``mallopt`` takes: an ``int``)
TRIM_THRESHOLD = (1 << 31) - 1
#: whether blocks of every size come from the heap while a fuzzy block is active
#: (``mallopt(M_MMAP_MAX, 0)``) rather than blocks of :data:`MMAP_THRESHOLD` and more each
#: mapped and unmapped on its own (the setting before 2026-12-07:
#: ``benchmarks/bench_heap.py --large`` compares the two)
LARGE_BLOCKS_FROM_HEAP = True
#: glibc's own count of blocks it may map (``DEFAULT_MMAP_MAX``), restored when the last
#: active fuzzy block exits unless ``MALLOC_MMAP_MAX_`` says otherwise
MMAP_MAX_DEFAULT = 65536
# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4

_applied: bool | None = None  # None: not tried yet in this process
_libc = None  # glibc's handle once keep_freed_memory has applied its settings
_active = 0  # fuzzy blocks active now (threads may run blocks side by side)
_lock = threading.Lock()


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
    global _applied, _libc
    if _applied is None:
        _applied = False
        if os.environ.get(ENV, "1").strip() != "0":
            libc = _glibc()
            if libc is not None:
                _applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
                _libc = libc if _applied else None
                logger.debug("numvar: malloc keeps freed memory (mmap threshold %d, trim "
                             "threshold %d): %s", MMAP_THRESHOLD, TRIM_THRESHOLD, _applied)
    return _applied


def _mmap_max_outside() -> int:
    """glibc's count of mapped blocks outside fuzzy blocks: ``MALLOC_MMAP_MAX_`` where it
    holds an integer, else :data:`MMAP_MAX_DEFAULT`."""
    try:
        return int(os.environ["MALLOC_MMAP_MAX_"])
    except (KeyError, ValueError):
        return MMAP_MAX_DEFAULT


def block_entered() -> None:
    """A fuzzy block starts: the first of the active ones has glibc map no block on its
    own (:data:`LARGE_BLOCKS_FROM_HEAP`; nothing where :func:`keep_freed_memory` did not
    apply its settings)."""
    global _active
    with _lock:
        _active += 1
        if _active == 1 and _libc is not None and LARGE_BLOCKS_FROM_HEAP:
            _libc.mallopt(_M_MMAP_MAX, 0)


def block_exited() -> None:
    """A fuzzy block ends: the last of the active ones gives glibc back its count of
    mapped blocks (:func:`_mmap_max_outside`)."""
    global _active
    with _lock:
        _active = max(0, _active - 1)
        if _active == 0 and _libc is not None and LARGE_BLOCKS_FROM_HEAP:
            _libc.mallopt(_M_MMAP_MAX, _mmap_max_outside())
