"""numba kernel of binary32 sums, products and scans over the trailing dim of a few
long rows (:func:`numvar.instrument.flop.reduce` and :func:`~numvar.instrument.flop.scan`).

The flop reductions run on a (K, M) view, a tile of M columns per k-step
(``kernels.scan``) or, for M ≥ ``pointwise.ROW_M_MIN`` contiguous rows, on blocks of rows
(``pointwise.rowsum32``). Both spend their time per k-step, not per element, when M is
small: a LayerNorm over 4096 features of a batch of 2 is K = 4096 steps of 2 elements
(300 µs on this machine for 8192 roundings). :func:`rowscan32` walks each row instead,
the M accumulators in registers, with the same order and random bits as ``kernels.scan``
on the transposed rows: element (k, m) uses ``bits64(key, k·M + m)``, the fast path of
``kernels._fast32`` where it accepts (exact float64 sum, normal range, modes
ieee/sr/ud/random), else the rounding core's ``add_f32``/``mul_f32`` (the scan's own
fallback). Tested bit for bit against ``kernels.scan``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from numvar.rounding import kernels as K

from .kernels import _bits, _fast32


@njit(inline="always", error_model="numpy")
def _step(acc, x, r, mode, use_mul):
    a = np.float64(acc)
    xv = np.float64(x)
    if use_mul:
        s = a * xv
        e = 0.0
    else:
        s = a + xv
        bv = s - a
        e = (a - (s - bv)) + (xv - bv)
    v, ok = _fast32(s, r, mode)
    if ok and e == 0.0:
        return v
    if use_mul:
        return np.float32(K.mul_f32(a, xv, mode, 24, r))
    return np.float32(K.add_f32(a, xv, mode, 24, r))


@njit(cache=True, error_model="numpy")
def rowscan32(x, out, key, mode, use_mul, cumulative):  # pragma: no cover - compiled
    """Sum (product, ``use_mul``) along each row of x (M, K) float32 C-contiguous, K ≥ 1,
    binary32 at 24 bits: ``kernels.scan(x.T, key, mode, 24)`` (same order, same bits).
    ``out``: (M, 1), or (M, K) every partial result with ``cumulative``."""
    M, Kd = x.shape
    ukey = np.uint64(key)
    acc = np.empty(M, np.float32)
    for m in range(M):
        acc[m] = x[m, 0]
        if cumulative:
            out[m, 0] = acc[m]
    for k in range(1, Kd):
        q = np.uint64(k) * np.uint64(M)
        for m in range(M):
            acc[m] = _step(acc[m], x[m, k], _bits(ukey, q + np.uint64(m)), mode, use_mul)
            if cumulative:
                out[m, k] = acc[m]
    if not cumulative:
        for m in range(M):
            out[m, 0] = acc[m]
