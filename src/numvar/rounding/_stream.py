"""Counter-based random bits, identical in pure Python, numba and torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .kernels import GAMMA, MIX1, MIX2, keys64

_M64 = (1 << 64) - 1
_SHORT = 1  # Stream.keys draws up to this many keys one by one (timed: 2 keys took 2.5 µs
#            in Python, 2.0 in the compiled call)
_SEED_SALT = 0x243F6A8885A308D3  # digits of pi: separates seed space from key space


def mix64(z: int) -> int:
    """splitmix64 finalizer on a Python int (mod 2**64)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * MIX1) & _M64
    z = ((z ^ (z >> 27)) * MIX2) & _M64
    return z ^ (z >> 31)


def bits(key: int, j: int) -> int:
    """64 random bits for element ``j`` of the call with ``key``:
    ``mix64(key + (j + 1) * 0x9E3779B97F4A7C15 mod 2**64)`` (splitmix64)."""
    return mix64((key + (j + 1) * GAMMA) & _M64)


@dataclass
class Stream:
    """A seeded, counter-based stream of call keys; never touches torch's RNG.

    ``next_key()`` returns ``bits(mix64(seed ^ salt), counter)`` and increments the
    counter, so a stream is reproduced exactly by its seed and position.
    """

    seed: int
    counter: int = 0
    _base: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.seed = int(self.seed)
        self._base = mix64(self.seed ^ _SEED_SALT)

    @property
    def base(self) -> int:
        """``mix64(seed ^ salt)``: key ``i`` of the stream (counting from 0) is
        ``bits(base, i)``, for compiled callers that draw many keys in one call
        (``numvar.instrument.linalg_kernels.keys``)."""
        return self._base

    def next_key(self) -> int:
        """A fresh 64-bit key (Python int in [0, 2**64)) for one rounding call:
        ``bits(base, counter)``, written out (it is called once per rounding call)."""
        z = (self._base + (self.counter + 1) * GAMMA) & _M64
        self.counter += 1
        z = ((z ^ (z >> 30)) * MIX1) & _M64
        z = ((z ^ (z >> 27)) * MIX2) & _M64
        return z ^ (z >> 31)

    def keys(self, n: int) -> np.ndarray:
        """The next ``n`` keys, as ``[next_key() for _ in range(n)]`` would return them,
        as a uint64 array: one compiled call (:func:`numvar.rounding.kernels.keys64`,
        about 2 µs whatever n) from two keys on; numpy's wrapping uint64 arithmetic,
        which this replaced, took 10–11 µs from 12 keys on, and a Python loop 1 µs a key."""
        if n <= _SHORT:
            return np.array([self.next_key() for _ in range(n)], dtype=np.uint64)
        out = keys64(np.uint64(self._base), np.uint64(self.counter), n)
        self.counter += n
        return out
