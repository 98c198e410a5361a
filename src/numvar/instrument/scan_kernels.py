"""numba kernels of binary32 sums, products and scans over the trailing dim of a few
long rows (:func:`numvar.instrument.flop.reduce` and :func:`~numvar.instrument.flop.scan`),
and of the variance over trailing dims, binary32 and binary64 (:func:`rowvar`).

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

:func:`rowvar` is ``flop.var`` over the trailing dims of a small contiguous tensor
(LayerNorm's and GroupNorm's statistics) in one call instead of six tensor ops: the same
keys, element indices and kernels (tested bit for bit against the tensor steps,
``flop.USE_ROWVAR = False``), binary32 or binary64 (a float64 array: the rows' chains
or blocks and the binary64 tiles of ``pointwise``; ``flop.USE_ROWVAR64``).

:func:`scan_columns` sums down the columns of a (K, M) array by ``kernels.scan``'s own
steps: the compiled norms' sums over leading dims (batch norm's channels, layer norm's
weight and bias gradients) and, after a transposition in cache, rows longer than
``pointwise.ROW_K_MAX`` (:func:`_long_rows`), which ``flop.reduce`` scans as a
transposed copy. It keeps the scan's NaN where NaNs of both signs meet (the accumulated
one), which ``pointwise``'s row blocks do not.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from numvar.rounding import kernels as K

from . import pointwise as PW
from .kernels import _bits, _fast32, _scan_full, _scan_step, chain_add64


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


# --------------------------------------------------------------- two-pass variance
def _rows(x, out, key, mode, Mg, mg0):  # pragma: no cover - replaced by its overload
    """Row sums of x (M, K), K ≥ 2, the rows mg0 .. mg0 + M of a (Mg, K) whole, in
    flop.reduce's order and bits on the whole (element (k, m) of the whole: k·Mg + m).
    binary32: rowscan32 for a whole of few rows (then x is the whole), pointwise's row
    blocks for many (the same bits; a row's value does not depend on its block, so a part
    of the rows is computed as in the whole). binary64 (float64 arrays, 53 bits): the row
    blocks (their binary64 tiles, ``pointwise._tile64``) for many rows, the rows' chains
    (:func:`_row_chains64`) for few. Rows longer than ``pointwise.ROW_K_MAX`` in a whole
    of many: :func:`_long_rows` (``flop.reduce`` scans those as a transposed copy)."""


@overload(_rows)
def _rows_impl(x, out, key, mode, Mg, mg0):
    if x.dtype == types.float64:
        def wide(x, out, key, mode, Mg, mg0):
            if Mg < PW.ROW_M_MIN:
                _row_chains64(x, out, key, mode, Mg, mg0)
            elif x.shape[1] > PW.ROW_K_MAX:
                _long_rows(x, out, key, mode, Mg, mg0)
            else:
                _row_blocks(x, out, key, mode, Mg, mg0)
        return wide

    def narrow(x, out, key, mode, Mg, mg0):
        M = x.shape[0]
        if Mg < PW.ROW_M_MIN:
            # runtime bools, as flop.reduce passes them (constants would compile a copy)
            rowscan32(x, out.reshape(M, 1), key, mode, np.bool_(False), np.bool_(False))
        elif x.shape[1] > PW.ROW_K_MAX:
            _long_rows(x, out, key, mode, Mg, mg0)
        else:
            _row_blocks(x, out, key, mode, Mg, mg0)
    return narrow


@njit(inline="always")
def _long_rows(x, out, key, mode, Mg, mg0):
    """:func:`_rows` of rows longer than ``pointwise.ROW_K_MAX`` (in a whole of
    ``ROW_M_MIN`` rows or more), which ``flop.reduce`` sums as ``kernels.scan`` of a
    transposed copy: the same, by :func:`scan_columns` on x transposed in cache."""
    M, Kd = x.shape
    t = np.empty((Kd, M), x.dtype)
    PW._transpose_rows(x, t, 0, M)
    scan_columns(t, out, key, mode, Mg, mg0)


@njit(cache=True, error_model="numpy")
def scan_columns(t, out, key, mode, Mg, mg0):  # pragma: no cover - compiled
    """Sums down the columns of t (K, M) into ``out`` (M,), t the columns mg0 .. mg0 + M
    of a (K, Mg) whole (int64s), by the scan's own steps: ``kernels._scan_step`` in sr,
    ieee, ud and random, ``kernels._scan_full`` for the elements it declines and for
    every element in the other modes: ``kernels.scan``'s order and bits on the whole
    (element (k, j): ``bits64(key, k·Mg + mg0 + j)``; binary32 at 24 bits or binary64 at
    53), NaN signs included: where NaNs of both signs meet in a sum, the scan keeps the
    accumulated one, ``pointwise._colsums``' tiles (the row blocks') the other."""
    Kd, M = t.shape
    PW.copy_into(out, t[0])
    bad = np.empty(M, np.bool_)
    ukey = np.uint64(key)
    fast = mode <= K.MODE_RANDOM
    mul = np.bool_(Kd < 0)  # (False, as a runtime value, as the scan's callers pass it)
    for k in range(1, Kd):
        q0 = np.uint64(k) * np.uint64(Mg) + np.uint64(mg0)
        x = t[k]
        if fast:
            nbad = _scan_step(out, x, ukey, q0, mode, mul, bad)
        else:
            bad[:] = True
            nbad = M
        if nbad != 0:
            for j in range(M):
                if bad[j]:
                    out[j] = _scan_full(out[j], x[j], mode, mul,
                                        _bits(ukey, q0 + np.uint64(j)))


@njit(inline="always")
def _row_blocks(x, out, key, mode, Mg, mg0):
    """:func:`_rows` by pointwise's blocks of rows (``pointwise._rowblock_at``)."""
    M, Kd = x.shape
    K.wide_vectors()
    R = PW.block_rows(M, Kd)
    ukey = np.uint64(key)
    for r0 in range(0, M, R):
        PW._rowblock_at(x, out, r0, min(R, M - r0), ukey, K.OP_ADD, mode, Mg, mg0)


@njit(cache=True, error_model="numpy")
def _row_chains64(x, out, key, mode, Mg, mg0):  # pragma: no cover - compiled
    """binary64 sums at 53 bits of the rows of x (M, K), the rows mg0 .. mg0 + M of a
    (Mg, K) whole, in ``kernels.scan``'s order and bits on the whole (element (k, m):
    ``bits64(key, k·Mg + mg0 + m)``): the M accumulators stepped together (independent
    chains, their latencies overlapping), each step by ``kernels.chain_add64`` (sr, ieee,
    ud and random on ``rn64_step`` where it takes), as ``kernels._scan_chain64`` steps a
    column. A block of few rows takes per k-step one
    tile call of a few elements (measured, one thread: the variance of two rows of 4096
    took 647 µs that way against 386 for the six tensor steps)."""
    M, Kd = x.shape
    ukey = np.uint64(key)
    fast = mode <= K.MODE_RANDOM
    acc = np.empty(M)
    for m in range(M):
        acc[m] = x[m, 0]
    for k in range(1, Kd):
        q = np.uint64(k) * np.uint64(Mg) + np.uint64(mg0)
        for m in range(M):
            acc[m] = chain_add64(acc[m], x[m, k], _bits(ukey, q + np.uint64(m)), mode, fast)
    for m in range(M):
        out[m] = acc[m]


@njit(cache=True, error_model="numpy")
def rowvar(x, keys, n_mean, n_var, mode, out, Mg, mg0):  # pragma: no cover - compiled
    """``flop.var`` of each row of x (M, K) C-contiguous, K ≥ 2, into ``out`` (M,):
    binary32 at 24 bits for float32 arrays, binary64 at 53 bits for float64 ones (``out``,
    ``n_mean`` and ``n_var`` of x's dtype). x is the rows mg0 .. mg0 + M of a (Mg, K)
    whole (the whole itself: Mg = M, mg0 = 0; a part gives the whole's values for its
    rows): the six stream keys of its six tensor steps, in order, and their element
    indices in the whole: row sums (key 0, element (k, m) ``k·Mg + m``); ``mu = RND(s /
    n_mean)`` (key 1, element m); ``d = RND(x − mu)`` (key 2, element ``m·K + k``);
    ``RND(d·d)`` (key 3, same); their row sums (key 4); ``RND(s2 / n_var)`` (key 5)."""
    M, Kd = x.shape
    dt = x.dtype
    # the ops as int64s, not literals: one compiled round_into_any per dtype
    div, sub, mul = np.int64(K.OP_DIV), np.int64(K.OP_SUB), np.int64(K.OP_MUL)
    s = np.empty(M, dt)
    _rows(x, s, keys[0], mode, Mg, mg0)
    nb = np.empty(M, dt)
    nb[:] = n_mean
    mu = np.empty(M, dt)
    PW.round_into_any(div, s, nb, mu, np.uint64(keys[1]), mg0, mode)
    # whole-array passes (element m·K + k of the C-order arrays): one call per step, not
    # one per row (short rows made the per-call set-up dominate)
    mub = np.empty((M, Kd), dt)
    for m in range(M):
        mub[m, :] = mu[m]
    d = np.empty(M * Kd, dt)
    PW.round_into_any(sub, x.reshape(M * Kd), mub.reshape(M * Kd), d, np.uint64(keys[2]),
                      mg0 * Kd, mode)
    sq = np.empty((M, Kd), dt)
    PW.round_into_any(mul, d, d, sq.reshape(M * Kd), np.uint64(keys[3]), mg0 * Kd, mode)
    _rows(sq, s, keys[4], mode, Mg, mg0)
    nb[:] = n_var
    PW.round_into_any(div, s, nb, out, np.uint64(keys[5]), mg0, mode)
