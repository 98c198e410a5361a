"""numba kernels of the binary32 LU factorisation and triangular solves at flop
granularity (:mod:`numvar.instrument.linalg`).

The tensor implementation in :mod:`numvar.instrument.linalg` makes O(n) vectorised
rounding calls (a division, a multiplication and a subtraction per column), each a
tensor op with its own allocation and call overhead: for n = 64 the calls, not the
arithmetic, took 98 % of ``torch.linalg.solve`` (docs/speed.md). These kernels run the
same column loop in one compiled call with the same arithmetic: the keys the tensor
implementation would draw are drawn beforehand, in the same order, and passed in; each
element of a call with key ``k`` and C-order index ``l`` in its (batch, rows, columns)
result is rounded by the same tile functions as :func:`numvar.instrument.pointwise.binary32`
(:func:`numvar.instrument.pointwise._tile`, then ``_slow`` where the fast path declines)
with ``bits64(k, l)``. Hence the same bits for the same seed, which the tests check
against the tensor implementation and the element-by-element references.

They serve binary32 tensors at 24 bits on the CPU with the numba backend (the case where
``Ctx.div``/``mul``/``sub`` call ``pointwise.binary32``); every other case keeps the
tensor implementation.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K

from .pointwise import copy_into, mulsub_rows, round_into

_U1 = np.uint64(1)


@njit(cache=True, error_model="numpy")
def lu32(W, B, m, n, piv, info, kdiv, kmul, ksub, mode):  # pragma: no cover - compiled
    """Right-looking LU with partial pivoting of W (B, m, n) float32 (flat C order), in
    place; ``piv`` (B·k,) int32 (1-based), ``info`` (B,) int32 zeros. Column j uses the
    keys ``kdiv[j]`` (l_i = a_ij / a_jj, index ``b·L + i−j−1``, L = m−j−1),
    ``kmul[j]`` and ``ksub[j]`` (a_ik − l_i·a_jk, index ``(b·L + i−j−1)·N + k−j−1``,
    N = n−j−1)."""
    k = min(m, n)
    w = max(m, n)
    ww = max((m - 1) * (n - 1), w)
    bufa = np.empty(ww, np.float32)
    bufb = np.empty(ww, np.float32)
    bufc = np.empty(ww, np.float32)
    res = np.empty(ww, np.float32)
    bad = np.empty(w, np.bool_)
    scr = np.empty(3 * w, np.float32)  # mulsub_rows' scratch rows
    for b in range(B):
        base = b * m * n
        for j in range(k):
            # pivot: torch.argmax of |a_ij|, i >= j (the first maximum; a NaN wins, the first)
            p = j
            best = abs(W[base + j * n + j])
            if not np.isnan(best):
                for i in range(j + 1, m):
                    v = abs(W[base + i * n + j])
                    if np.isnan(v):
                        p = i
                        break
                    if v > best:
                        best = v
                        p = i
            piv[b * k + j] = p + 1
            if p != j:
                for c in range(n):
                    t = W[base + j * n + c]
                    W[base + j * n + c] = W[base + p * n + c]
                    W[base + p * n + c] = t
            pivot = W[base + j * n + j]
            zero = pivot == 0
            if zero and info[b] == 0:
                info[b] = j + 1
            L = m - j - 1
            if L <= 0:
                continue
            for i in range(L):
                bufa[i] = W[base + (j + 1 + i) * n + j]
                bufb[i] = pivot
            round_into(K.OP_DIV, bufa[:L], bufb[:L], res[:L], np.uint64(kdiv[j]), b * L, mode)
            if not zero:
                for i in range(L):
                    W[base + (j + 1 + i) * n + j] = res[i]
            N = n - j - 1
            if N <= 0:
                continue
            # the trailing (L, N) block: a_ik − RND(l_i·a_jk), rows fused (mulsub_rows) on
            # a contiguous copy of it (a strided block does not vectorise)
            u0 = base + j * n + j + 1
            for i in range(L):
                r0 = base + (j + 1 + i) * n + j + 1
                bufa[i] = W[r0 - 1]
                copy_into(bufc[i * N:(i + 1) * N], W[r0:r0 + N])
            blk = L * N
            mulsub_rows(bufa[:L], W[u0:u0 + N], bufc[:blk].reshape(L, N),
                        res[:blk].reshape(L, N), np.uint64(kmul[j]), np.uint64(ksub[j]),
                        b * blk, mode, bad[:L],
                        scr[:N], scr[w:w + N], scr[2 * w:2 * w + N])
            for i in range(L):
                r0 = base + (j + 1 + i) * n + j + 1
                copy_into(W[r0:r0 + N], res[i * N:(i + 1) * N])


@njit(cache=True, error_model="numpy")
def trsm32(T, Y, B, n, r, upper, unit, kdiv, kmul, ksub, mode):  # pragma: no cover
    """Column-oriented substitution ``T·X = Y`` for triangular T (B, n, n), Y (B, n, r)
    float32 (flat C order), Y overwritten by X. Step s (j = n−1−s when ``upper``, else
    s) uses the keys ``kdiv[s]`` (x_j = y_j / t_jj, index ``b·r + c``; unless ``unit``),
    ``kmul[s]`` and ``ksub[s]`` (y_i − t_ij·x_j over the R rows i below (above) j, index
    ``(b·R + i')·r + c``)."""
    w = max(n - 1, 1) * r
    bufa = np.empty(w, np.float32)
    bufb = np.empty(w, np.float32)
    prod = np.empty(w, np.float32)
    res = np.empty(w, np.float32)
    tcol = np.empty(max(n, 1), np.float32)
    bad = np.empty(max(n, 1), np.bool_)
    for b in range(B):
        tb = b * n * n
        yb = b * n * r
        for s in range(n):
            j = n - 1 - s if upper else s
            yj = Y[yb + j * r:yb + (j + 1) * r]
            if not unit:
                bufa[:r] = T[tb + j * n + j]
                round_into(K.OP_DIV, yj, bufa[:r], res[:r], np.uint64(kdiv[s]), b * r, mode)
                copy_into(yj, res[:r])
            R = j if upper else n - j - 1
            if R == 0:
                continue
            i0 = 0 if upper else j + 1
            # the R rows i0.. of the update (contiguous in Y): y_i − RND(t_ij·x_j), rows
            # fused (mulsub_rows)
            for ii in range(R):
                tcol[ii] = T[tb + (i0 + ii) * n + j]
            w = R * r
            blk = Y[yb + i0 * r:yb + (i0 + R) * r]
            mulsub_rows(tcol[:R], yj, blk.reshape(R, r), res[:w].reshape(R, r),
                        np.uint64(kmul[s]), np.uint64(ksub[s]), b * w, mode, bad[:R], bufa,
                        bufb, prod)
            copy_into(blk, res[:w])


@njit(cache=True, error_model="numpy")
def solve32(W, Y, B, n, r, piv, info, keys, mode):  # pragma: no cover - compiled
    """``torch.linalg.solve`` of square W (B, n, n) and Y (B, n, r), both float32 (flat C
    order), in place, in one call: :func:`lu32` of W (``piv`` (B·n,), ``info`` (B,)), the
    rows of Y swapped as ``piv`` says (j and piv[j] − 1 for j = 0..n−1, as
    :func:`pivot_perm`), then :func:`trsm32` with the unit lower and with the upper
    triangle of the factors. ``keys`` (3, 3n): the three calls' key rows side by side,
    steps 0..n−1 for the LU, n..2n−1 and 2n..3n−1 for the solves (:func:`keys` on their
    flags end to end draws them in the order the three calls draw them)."""
    lu32(W, B, n, n, piv, info, keys[0, :n], keys[1, :n], keys[2, :n], mode)
    for b in range(B):
        yb = b * n * r
        for j in range(n):
            p = piv[b * n + j] - 1
            if p != j:
                for c in range(r):
                    t = Y[yb + j * r + c]
                    Y[yb + j * r + c] = Y[yb + p * r + c]
                    Y[yb + p * r + c] = t
    no = B < 0  # False as a run-time bool: literal flags would compile trsm32 twice more
    trsm32(W, Y, B, n, r, no, not no, keys[0, n:2 * n], keys[1, n:2 * n], keys[2, n:2 * n],
           mode)
    trsm32(W, Y, B, n, r, not no, no, keys[0, 2 * n:], keys[1, 2 * n:], keys[2, 2 * n:], mode)


@njit(cache=True)
def pivot_perm(piv, n, reverse):  # pragma: no cover - compiled
    """The row permutation (B, n) int64 that LAPACK pivots ``piv`` (B, k) int32 (1-based)
    apply: rows j and piv[b, j] − 1 swapped for j = 0..k−1 (k−1..0 when ``reverse``);
    row i of the result is row ``perm[b, i]`` of the input."""
    B, k = piv.shape
    perm = np.empty((B, n), np.int64)
    for b in range(B):
        for i in range(n):
            perm[b, i] = i
        for s in range(k):
            j = k - 1 - s if reverse else s
            p = piv[b, j] - 1
            t = perm[b, j]
            perm[b, j] = perm[b, p]
            perm[b, p] = t
    return perm


def stream_keys(stream, flags: np.ndarray) -> np.ndarray:
    """The keys ``stream.next_key()`` would return for the set entries of ``flags``
    (steps × calls, bool), drawn in C order, as (calls, steps), 0 elsewhere; the stream
    advanced past them (:meth:`numvar.rounding._stream.Stream.keys`). The reference of
    :func:`keys` (its tests, ``benchmarks/bench_keys.py``), which the kernels' callers use."""
    out = np.zeros(flags.shape[::-1], np.uint64)
    out.T[flags] = stream.keys(int(np.count_nonzero(flags)))  # C order over (steps, calls)
    return out


# ------------------------------------------------------------------ callers' helpers
def serves(ctx, *ts: torch.Tensor) -> bool:
    """Whether compiled kernels that round through :mod:`numvar.instrument.pointwise`'s
    elementwise tiles (this module's, :mod:`numvar.instrument.fft_kernels`',
    :mod:`numvar.instrument.grid_kernels`' affine grid, and
    :mod:`numvar.instrument.activation_kernels`') reproduce ``ctx``'s elementwise
    roundings of these operands: binary32 CPU tensors
    whose ``Ctx.add``/``sub``/``mul``/``div`` take ``pointwise.binary32`` (24 bits, numba
    backend, no other target format), none empty."""
    return (ctx._t32 and ctx._numba and ctx.target(torch.float32) is None
            and all(t.dtype is torch.float32 and t.is_cpu and t.numel() for t in ts))


def c_ordered(t: torch.Tensor) -> bool:
    """``t``'s strides, over its dimensions of more than one element, are positive and do
    not grow from the first dimension to the last (a contiguous tensor, or a slice of one
    such as a chunk of an LSTM's gates): an elementwise op of such operands writes a
    contiguous result, as TensorIterator orders dimensions by their strides."""
    last = 0
    for n, s in zip(reversed(t.shape), reversed(t.stride())):
        if n > 1:
            if s <= 0 or s < last:
                return False
            last = s
    return True


def flat32(t: torch.Tensor) -> np.ndarray:
    """The C-order values of a binary32 CPU tensor as a 1-D array (a view when contiguous)."""
    return t.detach().contiguous().view(-1).numpy()


@njit(cache=True)
def _flagged_keys(base, counter, f0, f1, f2):  # pragma: no cover - compiled
    """:func:`keys`' draw: ``(out, counter)`` with ``out[c, s]`` the next key of a stream
    of Weyl base ``base`` at position ``counter`` (``bits64(base, counter)``, then the
    counter advanced) for each set ``f_c[s]``, at step s call 0, 1, 2 in turn (the C order
    of :func:`stream_keys` over (steps, calls)), 0 elsewhere; the counter past them."""
    n = f0.size
    out = np.zeros((3, n), np.uint64)
    c = counter
    for s in range(n):
        if f0[s]:
            out[0, s] = K.bits64(base, c)
            c += _U1
        if f1[s]:
            out[1, s] = K.bits64(base, c)
            c += _U1
        if f2[s]:
            out[2, s] = K.bits64(base, c)
            c += _U1
    return out, c


def keys(ctx, f0: np.ndarray, f1: np.ndarray, f2: np.ndarray) -> np.ndarray:
    """(3, steps) keys of ``ctx.stream`` for three calls per step, drawn in a tensor
    implementation's order: at step s, one key for each call c with ``f_c[s]`` set (0
    elsewhere); the stream advanced past them. The same keys as :func:`stream_keys` on
    the stacked flags, in one compiled call: that took 18–24 µs per FFT or LU (numpy's
    stacking, boolean indexing and uint64 arithmetic), this 6–10 µs, mostly the call's
    argument handling (docs/speed.md, "Stream keys in compiled calls")."""
    st = ctx.stream
    out, c = _flagged_keys(np.uint64(st.base), np.uint64(st.counter), _bools(f0),
                           _bools(f1), _bools(f2))
    st.counter = int(c)
    return out


def _bools(f) -> np.ndarray:
    return np.ascontiguousarray(f, dtype=np.bool_)
