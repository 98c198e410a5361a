"""Scalar rounding for the slow references of the FFT and linear-algebra tests.

A reference replays the calls of a fast implementation one element at a time: call
``key()`` where the fast code makes one vectorised rounding call, then round element
``j`` of that call's C-order output with ``add(a, b, k, j)`` & co. The scalar functions
are the rounding core's own (numvar.rounding.kernels, tested against exact rational
arithmetic in test_rounding_core), the bits ``bits64(key, j)`` those of every call.
"""

import numpy as np
import torch

import numvar.rounding as R
from numvar.instrument._core import Ctx
from numvar.rounding import kernels as RK


class ScalarRounding:
    """The random stream of ``Ctx(mode, "flop", precision, Stream(seed))`` element by element."""

    def __init__(self, seed: int, mode: str, dtype: torch.dtype, precision=None):
        self.stream = R.Stream(seed)
        self.code = RK.mode_code(mode)
        self.ctx = Ctx(mode, "flop", precision, R.Stream(seed))  # for bits(): same t
        self.t = self.ctx.bits(dtype)
        self.is32 = dtype == torch.float32
        self.ft = np.float32 if self.is32 else np.float64
        s = "_f32" if self.is32 else "_f64"
        self._add, self._sub = getattr(RK, "add" + s), getattr(RK, "sub" + s)
        self._mul, self._div = getattr(RK, "mul" + s), getattr(RK, "div" + s)
        self._sqrt = getattr(RK, "sqrt" + s)

    def key(self) -> int:
        return self.stream.next_key()

    def _r(self, key: int, j: int):
        return np.uint64(RK.bits64(np.uint64(key), np.uint64(j)))

    def add(self, a, b, key, j):
        return self._add(self.ft(a), self.ft(b), self.code, self.t, self._r(key, j))

    def sub(self, a, b, key, j):
        return self._sub(self.ft(a), self.ft(b), self.code, self.t, self._r(key, j))

    def mul(self, a, b, key, j):
        return self._mul(self.ft(a), self.ft(b), self.code, self.t, self._r(key, j))

    def div(self, a, b, key, j):
        return self._div(self.ft(a), self.ft(b), self.code, self.t, self._r(key, j))

    def sqrt(self, a, key, j):
        return self._sqrt(self.ft(a), self.code, self.t, self._r(key, j))

    def row_sums(self, x: np.ndarray) -> np.ndarray:
        """numvar.instrument.flop.reduce of x (K, M) over axis 0: ``acc = x[0, m]``, then
        ``acc = RND(acc + x[k, m])`` with bits ``bits64(key, k·M + m)``; one key unless
        K == 1 (no rounding, no key)."""
        K, M = x.shape
        if K == 1:
            return x[0].copy()
        key = self.key()
        out = np.empty(M, dtype=x.dtype)
        for m in range(M):
            acc = x[0, m]
            for k in range(1, K):
                acc = self.add(acc, x[k, m], key, k * M + m)
            out[m] = acc
        return out
