"""numba kernel of the binary32 radix-2 FFT at flop granularity
(:func:`numvar.instrument.fft._radix2`).

The tensor implementation makes three rounding calls per stage and some fifteen tensor
ops around them (bit reversal, stacks, concatenations). :func:`radix2_fused32` runs the
bit reversal and every stage of a batch of rows in one compiled call, each butterfly's
ten roundings in registers: a stage reads one buffer and writes the other (ping-pong, no
gathered operand arrays), the twiddles of a stage laid out contiguously. The keys are the
ones the tensor implementation draws from its stream, in the same order (per stage
``kp``, ``ka`` for the twiddle products when h > 1, then ``kb`` for the butterflies),
computed inside (``bits64(base, counter + i)``, as ``Stream.next_key``), and every
rounding uses the same key and the same C-order index as in the stacked tensor calls,
for stage m = 2h, G = B·n/m blocks, block g, butterfly k:

* products ``(vr·wr, vi·wi, vr·wi, vi·wr)`` at ``q·S + e``, ``S = G·(h−1)``,
  ``e = g·(h−1) + k−1`` (k ≥ 1); sums ``vr·wr + (−vi·wi)`` at ``e`` and
  ``vr·wi + vi·wr`` at ``S + e``;
* butterflies ``(ur + tr, ui + ti, ur + (−tr), ui + (−ti))`` at ``q·S₂ + e₂``,
  ``S₂ = B·n/2``, ``e₂ = g·h + k``.

Each rounding takes pointwise.binary32's fast path (:func:`numvar.instrument.kernels._fast32`);
a group of butterflies in which the fast path declined a rounding (outside the binary32
normal range, an inexact float64 sum, the directed modes) is redone with the rounding
core's scalar function (:func:`_rnd_scalar`), as ``pointwise._slow`` redoes a tile: the
fast values stand where it does not decline. Stages with h < :data:`BLOCK_INNER_H` loop
over blocks innermost (vectors across blocks), the others along a block's contiguous
halves. Hence the same bits for the same seed (tested against the tensor implementation
and :func:`numvar.instrument.fft.c2c_reference`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from numvar.rounding import kernels as K

from .kernels import _bits, _fast32

_ADD, _MUL = K.OP_ADD, K.OP_MUL


# ------------------------------------------------------------------ fused butterflies
_SR, _IEEE, _UD, _RANDOM = K.MODE_SR, K.MODE_IEEE, K.MODE_UD, K.MODE_RANDOM
#: stages with h below this run their butterflies block-inner (vectors across blocks),
#: the others k-inner (vectors along a block's contiguous halves)
BLOCK_INNER_H = 8


@njit(inline="always", error_model="numpy")
def _rnd(op, x, y, key, idx, mode):
    """``RND(x op y)`` of binary32 ``x``, ``y`` (op add or mul) with ``bits64(key, idx)``
    on pointwise.binary32's fast path: (value, ok); ok False where the fast path
    declines (the caller then redoes the butterflies with :func:`_rnd_scalar`)."""
    r = _bits(key, np.uint64(idx))
    xd = np.float64(x)
    yd = np.float64(y)
    if op == _MUL:
        return _fast32(xd * yd, r, mode)
    s = xd + yd
    bv = s - xd
    e = (xd - (s - bv)) + (yd - bv)
    v, ok = _fast32(s, r, mode)
    return v, ok and e == 0.0


@njit(cache=True, error_model="numpy")
def _rnd_scalar(op, x, y, key, idx, mode):  # pragma: no cover - compiled
    """:func:`_rnd`, and the rounding core's scalar function where the fast path declines
    (pointwise._slow's arithmetic): the value."""
    v, ok = _rnd(op, x, y, key, idx, mode)
    if not ok:
        v = np.float32(K.narrow_binary(op, x, y, mode, 24, 24, -126, 127,
                                       _bits(key, np.uint64(idx))))
    return v


@njit(inline="always", error_model="numpy")
def _butterfly(xr, xi, yr, yi, g, k, h, m, twr, twi, kp, ka, kb, S, S2, mode, twiddled):
    """Butterfly k of block g of a stage (x read, y written) on the fast path; the number
    of roundings it declined. Indices as in the module docstring."""
    base = g * m
    ur = xr[base + k]
    ui = xi[base + k]
    tr = xr[base + h + k]
    ti = xi[base + h + k]
    bad = 0
    if twiddled:
        e = g * (h - 1) + k - 1
        wr = twr[h + k]
        wi = twi[h + k]
        p0, o0 = _rnd(_MUL, tr, wr, kp, e, mode)
        p1, o1 = _rnd(_MUL, ti, wi, kp, S + e, mode)
        p2, o2 = _rnd(_MUL, tr, wi, kp, 2 * S + e, mode)
        p3, o3 = _rnd(_MUL, ti, wr, kp, 3 * S + e, mode)
        tr, o4 = _rnd(_ADD, p0, -p1, ka, e, mode)
        ti, o5 = _rnd(_ADD, p2, p3, ka, S + e, mode)
        bad += (0 if o0 else 1) + (0 if o1 else 1) + (0 if o2 else 1) + (0 if o3 else 1)
        bad += (0 if o4 else 1) + (0 if o5 else 1)
    e2 = g * h + k
    a0, q0 = _rnd(_ADD, ur, tr, kb, e2, mode)
    a1, q1 = _rnd(_ADD, ui, ti, kb, S2 + e2, mode)
    a2, q2 = _rnd(_ADD, ur, -tr, kb, 2 * S2 + e2, mode)
    a3, q3 = _rnd(_ADD, ui, -ti, kb, 3 * S2 + e2, mode)
    yr[base + k] = a0
    yi[base + k] = a1
    yr[base + h + k] = a2
    yi[base + h + k] = a3
    return bad + (0 if q0 else 1) + (0 if q1 else 1) + (0 if q2 else 1) + (0 if q3 else 1)


@njit(cache=True, error_model="numpy")
def _butterflies_scalar(xr, xi, yr, yi, g0, g1, k0, k1, h, m, twr, twi, kp, ka, kb, S, S2,
                        mode):  # pragma: no cover - compiled
    """Butterflies k0..k1−1 of blocks g0..g1−1 of a stage, every rounding through
    :func:`_rnd_scalar` (the redo of a group the fast path declined in part)."""
    for g in range(g0, g1):
        base = g * m
        for k in range(k0, k1):
            ur = xr[base + k]
            ui = xi[base + k]
            tr = xr[base + h + k]
            ti = xi[base + h + k]
            if k > 0:
                e = g * (h - 1) + k - 1
                wr = twr[h + k]
                wi = twi[h + k]
                p0 = _rnd_scalar(_MUL, tr, wr, kp, e, mode)
                p1 = _rnd_scalar(_MUL, ti, wi, kp, S + e, mode)
                p2 = _rnd_scalar(_MUL, tr, wi, kp, 2 * S + e, mode)
                p3 = _rnd_scalar(_MUL, ti, wr, kp, 3 * S + e, mode)
                tr = _rnd_scalar(_ADD, p0, -p1, ka, e, mode)
                ti = _rnd_scalar(_ADD, p2, p3, ka, S + e, mode)
            e2 = g * h + k
            yr[base + k] = _rnd_scalar(_ADD, ur, tr, kb, e2, mode)
            yi[base + k] = _rnd_scalar(_ADD, ui, ti, kb, S2 + e2, mode)
            yr[base + h + k] = _rnd_scalar(_ADD, ur, -tr, kb, 2 * S2 + e2, mode)
            yi[base + h + k] = _rnd_scalar(_ADD, ui, -ti, kb, 3 * S2 + e2, mode)


@njit(inline="always", error_model="numpy")
def _across(xr, xi, yr, yi, G, k, h, m, twr, twi, kp, ka, kb, S, S2, mode, twiddled):
    """Butterfly k of every block (vectors across blocks); a declined rounding redoes
    them on the scalar path."""
    bad = 0
    for g in range(G):
        bad += _butterfly(xr, xi, yr, yi, g, k, h, m, twr, twi, kp, ka, kb, S, S2, mode,
                          twiddled)
    if bad:
        _butterflies_scalar(xr, xi, yr, yi, 0, G, k, k + 1, h, m, twr, twi, kp, ka, kb, S,
                            S2, mode)


@njit(inline="always", error_model="numpy")
def _along(xr, xi, yr, yi, g, h, m, twr, twi, kp, ka, kb, S, S2, mode):
    """Butterflies 1..h−1 of block g (vectors along the block); a declined rounding
    redoes them on the scalar path."""
    bad = 0
    for k in range(1, h):
        bad += _butterfly(xr, xi, yr, yi, g, k, h, m, twr, twi, kp, ka, kb, S, S2, mode, True)
    if bad:
        _butterflies_scalar(xr, xi, yr, yi, g, g + 1, 1, h, h, m, twr, twi, kp, ka, kb, S,
                            S2, mode)


@njit(cache=True, error_model="numpy")
def _fused(re, im, B, n, cw, sw, base, counter, mode):
    bits = 0
    while (1 << bits) < n:
        bits += 1
    xr = np.empty(B * n, np.float32)
    xi = np.empty(B * n, np.float32)
    yr = np.empty(B * n, np.float32)
    yi = np.empty(B * n, np.float32)
    for i in range(n):  # bit-reversal permutation (exact)
        rv = 0
        for t in range(bits):
            rv |= ((i >> t) & 1) << (bits - 1 - t)
        for b in range(B):
            xr[b * n + i] = re[b * n + rv]
            xi[b * n + i] = im[b * n + rv]
    # twiddles of stage h at [h, 2h): w_k = (cw, sw)[k·n/(2h)], contiguous per stage
    twr = np.empty(max(n, 2), np.float32)
    twi = np.empty(max(n, 2), np.float32)
    h = 1
    while h < n:
        for k in range(h):
            twr[h + k] = cw[k * (n // (2 * h))]
            twi[h + k] = sw[k * (n // (2 * h))]
        h *= 2
    ubase = np.uint64(base)
    c = counter
    S2 = B * n // 2
    m = 2
    while m <= n:
        h = m // 2
        G = B * (n // m)
        S = G * (h - 1)
        kp = np.uint64(0)
        ka = np.uint64(0)
        if h > 1:
            kp = _bits(ubase, np.uint64(c))
            ka = _bits(ubase, np.uint64(c + 1))
            c += 2
        kb = _bits(ubase, np.uint64(c))
        c += 1
        _across(xr, xi, yr, yi, G, 0, h, m, twr, twi, kp, ka, kb, S, S2, mode, False)
        if h >= BLOCK_INNER_H:
            for g in range(G):
                _along(xr, xi, yr, yi, g, h, m, twr, twi, kp, ka, kb, S, S2, mode)
        else:
            for k in range(1, h):
                _across(xr, xi, yr, yi, G, k, h, m, twr, twi, kp, ka, kb, S, S2, mode, True)
        xr, yr = yr, xr
        xi, yi = yi, xi
        m *= 2
    return xr, xi


@njit(cache=True, error_model="numpy")
def radix2_fused32(re, im, B, n, cw, sw, base, counter, mode):  # pragma: no cover
    """Radix-2 DIT of the rows of re, im ((B·n,) float32, C order; n a power of two ≥ 2)
    with twiddles (cw, sw) (n,) float32 (:func:`numvar.instrument.fft.twiddles`), each
    butterfly's roundings fused in registers: every stage reads one buffer and writes
    the other (no gathered operands), the keys drawn inside
    (``bits64(base, counter + i)``, the i-th key ``Stream.next_key`` would return from
    ``counter``: per stage kp, ka when h > 1, then kb). Returns (re, im); the caller
    advances its stream by :func:`radix2_keys` (n)."""
    return _fused(re, im, B, n, cw, sw, base, counter, mode)


def radix2_keys(n: int) -> int:
    """Stream keys a radix-2 transform of length n (a power of two ≥ 2) draws: one per
    stage, two more per stage with h > 1."""
    stages = n.bit_length() - 1
    return 3 * stages - 2
