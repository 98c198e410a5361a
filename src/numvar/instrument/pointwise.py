"""binary32 kernels of the instrumentation's short paths: elementwise arithmetic with
broadcasting, rounding of float64 results, and sums over the trailing dims.

* :func:`binary32`, :func:`sqrt32`, :func:`round32`: the same arithmetic and random bits
  as numvar.rounding's ``add``, ``sub``, ``mul``, ``div``, ``sqrt`` and ``round`` on
  binary32 at 24 bits (element ``l`` of the result, in C order, uses ``bits64(key, l)``),
  without materialising broadcast operands: an operand is read through three strides
  over the result seen as (M1, M2, N) (:func:`plan` folds the broadcast into that form
  when it can).
* :func:`rowsum32`: the row sums of an (M, K) matrix with the order and bits of
  :func:`numvar.instrument.kernels.scan` on its transpose, without the transposed copy.

Each element takes a vectorised fast path (:func:`_lo32`,
:func:`numvar.instrument.kernels._fast32`) and, where that declines (results outside
the binary32 normal range, inexact float64 sums, the cases listed at :func:`_lo32`), the
rounding core's scalar function. Every kernel has a serial twin used below
``kernels.PARALLEL_MIN_WORK`` elements. Tests compare each with the rounding core (or
the scan) bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import carray, njit, prange, types
from numba.extending import intrinsic, overload

from numvar.rounding import kernels as K

from . import kernels as KN
from .kernels import _G, _bits, _bits_weyl, _fast32, _weyl

TILE = 1024
#: a step of 1 and the sum's op code as run-time int64s (a literal would compile the
#: callee once more)
_ONE = np.int64(1)
_ADD64 = np.int64(K.OP_ADD)
#: elements per parallel chunk (buffers for broadcast rows are allocated once per chunk)
CHUNK = 16384

_f64_bits = K._f64_bits
_bits_f64 = K._bits_f64
_SR, _IEEE, _UD, _RANDOM = K.MODE_SR, K.MODE_IEEE, K.MODE_UD, K.MODE_RANDOM
OP_ADD, OP_SUB, OP_MUL, OP_DIV = K.OP_ADD, K.OP_SUB, K.OP_MUL, K.OP_DIV


# binary32 rounding of h + lo on the fast path (shared with the rounding core's division)
_lo32 = K.lo32_fast


@njit(inline="always", error_model="numpy")
def _sum_at(a, b, jj, neg):
    """The float64 sum ``s`` of ``a[jj]`` and ``b[jj]`` (``-b[jj]`` when ``neg``) and its
    TwoSum residual ``e`` (``s + e`` is the exact sum)."""
    x = np.float64(a[jj])
    y = np.float64(b[jj])
    if neg:
        y = -y
    s = x + y
    bv = s - x
    return s, (x - (s - bv)) + (y - bv)


@njit(inline="always", error_model="numpy")
def _addloop(a, b, o, ukey, l0, neg, mode):
    nbad = 0
    z = _weyl(ukey, np.uint64(l0))  # element l0's Weyl value, stepped by γ (KN._weyl)
    for jj in range(o.size):
        s, e = _sum_at(a, b, jj, neg)
        v, ok = _fast32(s, _bits_weyl(z), mode)
        z += _G
        o[jj] = v
        # an exact sum, or an infinite or NaN one (an operand was: binary32 values do not
        # overflow float64), which every mode keeps (the TwoSum residual is then NaN)
        # (flags combined bitwise: KN._fast32)
        nbad += 0 if (ok & ((e == 0.0) | (not (abs(s) < np.inf)))) else 1
    return nbad


@njit(inline="always", error_model="numpy")
def _addloop_lo(a, b, o, ukey, l0, neg, mode):
    """:func:`_addloop` with an inexact float64 sum accepted where its residual cannot
    change the rounding (:func:`numvar.instrument.kernels.residual_moot`: all but about
    two in 2**29 of them for sr, all but ties for ieee and ud), instead of declined. In
    random mode, where every inexact sum whose float64 value lies on the binary32 grid
    would decline (a tiny part added to a large one), it is rounded by the residual fast
    path (``lo32_fast(s, e)``, vectorised as the division's). The extra tests cost about
    15 % per element against :func:`_addloop` (``lo32_fast`` about 85 %), so this loop
    runs only on tiles that one declined (:func:`_redo`), on the later tiles of a call
    once one declined :data:`LO_SWITCH` elements, and on every tile of
    :func:`round_sum_into` (an FFT's sums of twiddle products). Where two loops accept an
    element they give the same value (each equals the core)."""
    nbad = 0
    z = _weyl(ukey, np.uint64(l0))  # element l0's Weyl value, stepped by γ (KN._weyl)
    for jj in range(o.size):
        s, e = _sum_at(a, b, jj, neg)
        r = _bits_weyl(z)
        if mode == _RANDOM:
            v, ok = _lo32(s, e, r, mode)
        else:
            v, ok = _fast32(s, r, mode)
            # (flags combined bitwise: KN._fast32)
            ok = ok & ((e == 0.0) | (not (abs(s) < np.inf)) | KN.residual_moot(s, r, mode))
        z += _G
        o[jj] = v
        nbad += 0 if ok else 1
    return nbad


@njit(cache=True, error_model="numpy")
def _tile_lo(op, a, b, o, ukey, l0, mode):  # pragma: no cover - compiled
    """:func:`_addloop_lo` on one tile of a sum or difference, the loop specialised by
    mode (sr, ieee, ud, random); the number of declined elements."""
    K.wide_vectors()
    neg = op == OP_SUB
    if mode == _SR:
        return _addloop_lo(a, b, o, ukey, l0, neg, _SR)
    if mode == _IEEE:
        return _addloop_lo(a, b, o, ukey, l0, neg, _IEEE)
    if mode == _UD:
        return _addloop_lo(a, b, o, ukey, l0, neg, _UD)
    return _addloop_lo(a, b, o, ukey, l0, neg, _RANDOM)


@njit(inline="always", error_model="numpy")
def _mulloop(a, b, o, ukey, l0, mode):
    nbad = 0
    z = _weyl(ukey, np.uint64(l0))  # element l0's Weyl value, stepped by γ (KN._weyl)
    for jj in range(o.size):
        v, ok = _fast32(np.float64(a[jj]) * np.float64(b[jj]), _bits_weyl(z), mode)
        z += _G
        o[jj] = v
        nbad += 0 if ok else 1
    return nbad


@njit(inline="always", error_model="numpy")
def _prod_err(a, b, p):
    """The exact error ``a·b − p`` of the float64 product ``p = RN(a·b)``, by one hardware
    FMA: the value of the rounding core's Dekker TwoProduct (``K.two_prod``, ten flops)
    wherever that is exact, which holds for every binary32 quotient and square root
    (factors below 2**995, errors above the underflow threshold). The quotient tile ran
    1.25×, the square root tile 1.16× faster with it (Zen 3; docs/speed.md)."""
    return K.fma64(a, b, -p)


@njit(inline="always", error_model="numpy")
def _quot_at(a, b, jj):
    """The float64 quotient ``q`` of ``a[jj]`` and ``b[jj]`` and the residual the rounding
    core's division rounds it with (``K._div_parts``: ``x/y − q`` for a finite non-zero
    quotient of finite operands, else 0), flags combined bitwise (``_fast32``)."""
    x = np.float64(a[jj])
    y = np.float64(b[jj])
    q = x / y
    ph = q * y
    e = ((x - ph) - _prod_err(q, y, ph)) / y
    fin = (q != 0.0) & (abs(q) < np.inf) & (abs(x) < np.inf) & (abs(y) < np.inf)
    return q, e if fin else 0.0


@njit(inline="always", error_model="numpy")
def _divloop(a, b, o, ukey, l0, mode):
    nbad = 0
    z = _weyl(ukey, np.uint64(l0))  # element l0's Weyl value, stepped by γ (KN._weyl)
    for jj in range(o.size):
        q, e = _quot_at(a, b, jj)
        v, ok = _lo32(q, e, _bits_weyl(z), mode)
        z += _G
        o[jj] = v
        nbad += 0 if ok else 1
    return nbad


@njit(cache=True, error_model="numpy")
def _tile(op, a, b, o, ukey, l0, mode):  # pragma: no cover - compiled
    """One tile, the loop specialised by op and mode; the number of declined elements."""
    K.wide_vectors()
    if op == OP_MUL:
        if mode == _SR:
            return _mulloop(a, b, o, ukey, l0, _SR)
        if mode == _IEEE:
            return _mulloop(a, b, o, ukey, l0, _IEEE)
        if mode == _UD:
            return _mulloop(a, b, o, ukey, l0, _UD)
        if mode == _RANDOM:
            return _mulloop(a, b, o, ukey, l0, _RANDOM)
        return o.size  # up, down, zero, farthest: the scalar path (_slow)
    if op == OP_DIV:
        if mode == _SR:
            return _divloop(a, b, o, ukey, l0, _SR)
        if mode == _IEEE:
            return _divloop(a, b, o, ukey, l0, _IEEE)
        if mode == _UD:
            return _divloop(a, b, o, ukey, l0, _UD)
        if mode == _RANDOM:
            return _divloop(a, b, o, ukey, l0, _RANDOM)
        return o.size  # up, down, zero, farthest: the scalar path (_slow)
    neg = op == OP_SUB
    if mode == _SR:
        return _addloop(a, b, o, ukey, l0, neg, _SR)
    if mode == _IEEE:
        return _addloop(a, b, o, ukey, l0, neg, _IEEE)
    if mode == _UD:
        return _addloop(a, b, o, ukey, l0, neg, _UD)
    if mode == _RANDOM:
        return _addloop(a, b, o, ukey, l0, neg, _RANDOM)
    return o.size  # up, down, zero, farthest: the scalar path (_slow)


@njit(cache=True, error_model="numpy")
def _slow(op, a, b, o, ukey, l0, mode):  # pragma: no cover - compiled
    """Recompute a tile with declined elements: the rounding core's scalar function where
    the fast path declines, the fast path's value elsewhere. An inexact float64 sum
    (TwoSum residual ``e`` != 0, which the vectorised loops decline) is rounded by the
    core's residual fast path (``lo32_fast(s, e)``, as the quotient is; identical to the
    core where it accepts) before falling back to the core's general function."""
    for jj in range(o.size):
        x = np.float64(a[jj])
        y = np.float64(b[jj])
        r = _bits(ukey, np.uint64(l0 + jj))
        if op == OP_MUL:
            v, ok = _fast32(x * y, r, mode)
        elif op == OP_DIV:
            q, e = _quot_at(a, b, jj)
            v, ok = _lo32(q, e, r, mode)
        else:
            s, e = _sum_at(a, b, jj, op == OP_SUB)
            v, ok = _fast32(s, r, mode)
            if e != 0.0:  # an inexact float64 sum: the core's residual fast path
                v, ok = _lo32(s, e, r, mode)
        # written also where the fast path accepts: in the modes _tile leaves to this loop
        # (up, down, zero, farthest) an exact zero quotient is accepted and written nowhere else
        o[jj] = v if ok else np.float32(
            K.narrow_binary(op, a[jj], b[jj], mode, 24, 24, -126, 127, r))


#: elements per tile of :func:`round_into` (a tile with an element the vectorised path
#: declines, such as an inexact float64 sum, is redone by :func:`_redo`). 1024 rather
#: than 256: a 256-point FFT of 32 rows (round_into on ~4K elements, ten calls a stage)
#: ran 605 -> 534 µs, ``torch.linalg.solve`` of 64×64 with 64 right-hand sides 1.29 ->
#: 1.20 ms (one thread; fewer tile calls, the same bits)
ROUND_TILE = 1024
#: elements per sub-tile of :func:`_redo`
REDO_TILE = 32


@njit(cache=True, error_model="numpy")
def _redo(op, a, b, o, ukey, l0, mode, declined):  # pragma: no cover - compiled
    """A tile of which :func:`_tile` declined ``declined`` elements, redone. A sum or
    difference in sr, ieee, ud or random first goes through :func:`_tile_lo` (its inexact
    float64 sums rounded by the residual fast path, vectorised); what still declines, and
    every other op, is redone in sub-tiles of :data:`REDO_TILE` elements through the same
    vectorised loop again and :func:`_slow` only for those with a declined element (the
    whole tile when every element was declined: the modes :func:`_tile` leaves to
    :func:`_slow`). Each element's value depends only on its operands and index, and
    :func:`_slow` returns the fast path's value where it accepts, so the bits are those
    of :func:`_slow` on the whole tile; inexact sums (a float64 sum off by more than 29
    bits of exponent, such as an FFT's product by cos(π/2) = 6.1e-17 added to an O(1)
    part, or the parts of complex products) no longer go through the scalar loop."""
    n = o.size
    lo = (op == OP_ADD or op == OP_SUB) and mode <= _RANDOM
    if lo:
        declined = _tile_lo(op, a, b, o, ukey, l0, mode)
        if declined == 0:
            return
    if declined == n or n <= REDO_TILE:
        _slow(op, a, b, o, ukey, l0, mode)
        return
    for s0 in range(0, n, REDO_TILE):
        s1 = min(n, s0 + REDO_TILE)
        if lo:
            bad = _tile_lo(op, a[s0:s1], b[s0:s1], o[s0:s1], ukey, l0 + s0, mode)
        else:
            bad = _tile(op, a[s0:s1], b[s0:s1], o[s0:s1], ukey, l0 + s0, mode)
        if bad:
            _slow(op, a[s0:s1], b[s0:s1], o[s0:s1], ukey, l0 + s0, mode)


#: declined elements in one tile of a sum or difference from which :func:`round_into`
#: starts the call's later tiles on the residual path (:func:`_tile_lo`) instead of
#: :func:`_tile`: data whose float64 sums are often inexact (an FFT's butterflies on a
#: real signal: 14 % of a 256-point r2c's real parts; the sums of its twiddle products in
#: a c2r: 15 %) paid for every tile twice (:func:`_tile`, then :func:`_redo`'s
#: :func:`_tile_lo`). One element in 64: rare declines keep the cheaper first try.
LO_SWITCH = 16


@njit(inline="always", error_model="numpy")
def _round_tiles(op, a, b, o, ukey, l0, mode, lo):
    # a constant op (round_into(K.OP_MUL, ...)) or mode is a literal type: passed on as
    # it is, numba would compile _tile, _tile_lo and _redo once more for each value
    # (measured: four _tile compiles, 55 s, in one process) where one copy serves all
    op = np.int64(op)
    mode = np.int64(mode)
    n = o.size
    lo = lo and (op == OP_ADD or op == OP_SUB) and mode <= _RANDOM
    for t0 in range(0, n, ROUND_TILE):
        t1 = min(n, t0 + ROUND_TILE)
        if lo:
            bad = _tile_lo(op, a[t0:t1], b[t0:t1], o[t0:t1], ukey, l0 + t0, mode)
        else:
            bad = _tile(op, a[t0:t1], b[t0:t1], o[t0:t1], ukey, l0 + t0, mode)
            lo = (bad >= LO_SWITCH and (op == OP_ADD or op == OP_SUB) and mode <= _RANDOM)
        if bad:
            _redo(op, a[t0:t1], b[t0:t1], o[t0:t1], ukey, l0 + t0, mode, bad)


@njit(inline="always", error_model="numpy")
def round_into(op, a, b, o, ukey, l0, mode):
    """``o[j] = RND(a[j] op b[j])`` with ``bits64(key, l0 + j)``: :func:`binary32`'s
    arithmetic (:func:`_tile`, then :func:`_slow` where the fast path declines), tile by
    tile, for compiled callers (``o`` must not alias ``a`` or ``b``). A sum or difference
    whose tile declined :data:`LO_SWITCH` elements or more runs its later tiles on the
    residual path first (:func:`_redo`: same values)."""
    _round_tiles(op, a, b, o, ukey, l0, mode, False)


@njit(inline="always", error_model="numpy")
def round_sum_into(op, a, b, o, ukey, l0, mode):
    """:func:`round_into` for a sum or difference whose float64 results are expected to
    be inexact (an FFT's sums of twiddle products): every tile on the residual path
    first (:func:`_tile_lo`, then :func:`_redo`); same values."""
    _round_tiles(op, a, b, o, ukey, l0, mode, True)


@njit(inline="always", error_model="numpy")
def sub_term(xc, pc, r, mode):
    """``RND(xc − pc)`` of two binary32 values on the fast path with the bits ``r``:
    (value, ok), ok False where it declines (the rounding, or an inexact finite float64
    difference). The second rounding of :func:`mulsub_rows`' update."""
    xx = np.float64(xc)
    y = -np.float64(pc)
    t = xx + y
    bv = t - xx
    e = (xx - (t - bv)) + (y - bv)
    q, ok = _fast32(t, r, mode)
    # bitwise, not `and`/`or`: short-circuits returned from an inlined helper are branches
    # that kept the loop from vectorising as well (0.25 -> 0.17 G terms/s, measured)
    return q, ok & ((e == 0.0) | (not (abs(t) < np.inf)))


@njit(inline="always", error_model="numpy")
def _mulsubloop(s, v, X, O, kmul, ksub, l0, mode, bad, p):
    """:func:`mulsub_rows`' loops with the mode a constant. Each row in two passes that
    vectorise over columns: the products (key ``kmul``) into the scratch row ``p``, then
    the differences (key ``ksub``), each pass with one hash per element. One pass doing
    both (``benchmarks/bench_elementwise.py``'s ``_mulsub_term``) needs more constants
    than AVX2's sixteen vector registers hold and re-materialised them every pass:
    1.15-1.2x slower (docs/speed.md)."""
    R, N = O.shape
    nbad = 0
    pr = p[:N]
    for i in range(R):
        sf = np.float64(s[i])
        x = X[i]
        o = O[i]
        li = np.uint64(l0 + i * N)
        z = _weyl(kmul, li)  # stepped by γ: KN._weyl
        nb = 0
        for c in range(N):
            q, ok = _fast32(sf * np.float64(v[c]), _bits_weyl(z), mode)
            z += _G
            pr[c] = q
            nb += 0 if ok else 1
        z = _weyl(ksub, li)
        for c in range(N):
            q, ok = sub_term(x[c], pr[c], _bits_weyl(z), mode)
            z += _G
            o[c] = q
            nb += 0 if ok else 1
        bad[i] = nb != 0
        nbad += nb
    return nbad


@njit(cache=True, error_model="numpy")
def _mulsub(s, v, X, O, kmul, ksub, l0, mode, bad, p):  # pragma: no cover - compiled
    """:func:`_mulsubloop` specialised by mode (sr, ieee, ud, random; the other modes
    decline every row); the number of declined elements."""
    K.wide_vectors()
    if mode == _SR:
        return _mulsubloop(s, v, X, O, kmul, ksub, l0, _SR, bad, p)
    if mode == _IEEE:
        return _mulsubloop(s, v, X, O, kmul, ksub, l0, _IEEE, bad, p)
    if mode == _UD:
        return _mulsubloop(s, v, X, O, kmul, ksub, l0, _UD, bad, p)
    if mode == _RANDOM:
        return _mulsubloop(s, v, X, O, kmul, ksub, l0, _RANDOM, bad, p)
    bad[:] = True
    return O.size


@njit(inline="always", error_model="numpy")
def mulsub_rows(s, v, X, O, kmul, ksub, l0, mode, bad, pa, pb, prod):
    """``O[i, c] = RND(X[i, c] − RND(s[i]·v[c]))`` for the (R, N) block ``X`` (any
    strides; ``O`` C order, not aliasing ``X``): the products with key ``kmul`` and the
    differences with key ``ksub``, both at index ``l0 + i·N + c``. The same values as
    :func:`round_into` on the broadcast operands (``OP_MUL`` of the row scalars and ``v``
    into a buffer, then ``OP_SUB``), which it replaces in the LU and triangular-solve
    kernels' trailing updates: one fused pass per row without the broadcast copies; a
    row with a declined element is redone through those two calls (``pa``, ``pb``,
    ``prod``: scratch of N elements, ``bad``: of R)."""
    R, N = O.shape
    if _mulsub(s, v, X, O, kmul, ksub, l0, mode, bad, prod) == 0:
        return
    for i in range(R):
        if bad[i]:
            pa[:N] = s[i]
            copy_into(pb[:N], X[i])
            round_into(OP_MUL, pa[:N], v, prod[:N], kmul, l0 + i * N, mode)
            round_into(OP_SUB, pb[:N], prod[:N], O[i], ksub, l0 + i * N, mode)


@njit(inline="always", error_model="numpy")
def _accumulate(x, acc, tmp, ukey, l0, mode):
    """:func:`accumulate_rows32`'s rows with the mode a constant."""
    d = acc.size
    for r in range(x.shape[0]):
        li = l0 + r * d
        bad = _addloop(acc, x[r], tmp, ukey, li, False, mode)
        if bad:  # (run-time int64s: literals would compile _redo, _tile, _tile_lo and
            # _slow once more per value, as the test of round_into checks)
            _redo(_ADD64, acc, x[r], tmp, ukey, li, np.int64(mode), np.int64(bad))
        copy_into(acc, tmp)


@njit(cache=True, error_model="numpy")
def accumulate_rows32(x, acc, ukey, l0, mode):  # pragma: no cover - compiled
    """``acc[j] = RND(acc[j] + x[r, j])`` for the rows r of ``x`` ((R, d) float32, C
    order; ``acc`` (d,) float32) in order, with ``bits64(key, l0 + r·d + j)``: the values
    of :func:`round_into` (``OP_ADD``, ``acc``, ``x[r]``) row after row (the vectorised
    loop of :func:`_tile`, :func:`_redo` where it declines), in one call. A compiled
    caller summing rows one at a time through :func:`round_into` paid about 90 ns per
    call on top of the row's own work (one thread, AVX-512 Xeon: 64-element rows 2.1 ns
    an element against 0.8 in bulk): the loop here is inlined once per mode."""
    K.wide_vectors()
    ukey = np.uint64(ukey)
    tmp = np.empty(acc.size, np.float32)
    if mode == _SR:
        _accumulate(x, acc, tmp, ukey, l0, _SR)
    elif mode == _IEEE:
        _accumulate(x, acc, tmp, ukey, l0, _IEEE)
    elif mode == _UD:
        _accumulate(x, acc, tmp, ukey, l0, _UD)
    elif mode == _RANDOM:
        _accumulate(x, acc, tmp, ukey, l0, _RANDOM)
    else:  # up, down, zero, farthest: the scalar path, as _tile leaves them to _slow
        for r in range(x.shape[0]):
            _slow(_ADD64, acc, x[r], tmp, ukey, l0 + r * acc.size, mode)
            copy_into(acc, tmp)


@njit(cache=True, error_model="numpy")
def cmul32(A, B, kp, ka, mode):  # pragma: no cover - compiled
    """The complex product of interleaved binary32 pairs ``A`` and ``B`` ((2·S,) each,
    (re, im) per element, same length) as :func:`numvar.instrument.cplx.mul_parts`
    computes it: the products ``(ar·br, ai·bi, ar·bi, ai·br)`` with key ``kp`` at
    ``q·S + e``, then ``ar·br − ai·bi`` at ``e`` and ``ar·bi + ai·br`` at ``S + e`` with
    key ``ka`` (a difference rounded as such is the tensor path's sum with the negated
    product: the same value). Returns the interleaved result (2·S,). One serial call
    instead of five stacks, a negation and a join around two tensor calls."""
    S = A.size // 2
    ar = np.empty(S, np.float32)
    ai = np.empty(S, np.float32)
    br = np.empty(S, np.float32)
    bi = np.empty(S, np.float32)
    for e in range(S):
        ar[e] = A[2 * e]
        ai[e] = A[2 * e + 1]
        br[e] = B[2 * e]
        bi[e] = B[2 * e + 1]
    p = np.empty(4 * S, np.float32)
    round_into(OP_MUL, ar, br, p[0:S], kp, 0, mode)
    round_into(OP_MUL, ai, bi, p[S:2 * S], kp, S, mode)
    round_into(OP_MUL, ar, bi, p[2 * S:3 * S], kp, 2 * S, mode)
    round_into(OP_MUL, ai, br, p[3 * S:4 * S], kp, 3 * S, mode)
    re = np.empty(S, np.float32)
    im = np.empty(S, np.float32)
    round_sum_into(OP_SUB, p[0:S], p[S:2 * S], re, ka, 0, mode)
    round_sum_into(OP_ADD, p[2 * S:3 * S], p[3 * S:4 * S], im, ka, S, mode)
    out = np.empty(2 * S, np.float32)
    for e in range(S):
        out[2 * e] = re[e]
        out[2 * e + 1] = im[e]
    return out


@njit(cache=True, error_model="numpy")
def polar32(r, c, s, kr, km, mode):  # pragma: no cover - compiled
    """``torch.polar(r, θ)`` of binary32 ``r`` (S,) from the float64 ``c = cos θ`` and
    ``s = sin θ`` (S,) as :func:`numvar.instrument.cplx.polar` computes it: the stacked
    ``(c, s)`` rounded to binary32 with key ``kr`` (``c`` at ``e``, ``s`` at ``S + e``, as
    :func:`round32`), then ``(r·c, r·s)`` with key ``km`` at the same indices. Returns the
    interleaved complex64 pairs (2·S,)."""
    S = r.size
    cs = np.empty(2 * S, np.float32)
    for t in range((S + TILE - 1) // TILE):  # the tiles of _round_ser on the stacked (c, s)
        j0 = t * TILE
        j1 = min(S, j0 + TILE)
        _roundtile(c[j0:j1], cs[j0:j1], kr, j0, _ONE, mode)
        _roundtile(s[j0:j1], cs[S + j0:S + j1], kr, S + j0, _ONE, mode)
    p = np.empty(2 * S, np.float32)
    round_into(OP_MUL, r, cs[0:S], p[0:S], km, 0, mode)
    round_into(OP_MUL, r, cs[S:2 * S], p[S:2 * S], km, S, mode)
    out = np.empty(2 * S, np.float32)
    for e in range(S):
        out[2 * e] = p[e]
        out[2 * e + 1] = p[S + e]
    return out


@njit(inline="always")
def fill(buf, v):
    """Every element of ``buf`` set to ``v``."""
    for j in range(buf.size):
        buf[j] = v


@njit(inline="always")
def copy_into(dst, src):
    """``dst[:] = src`` for 1-D arrays of one size that do not overlap, as a loop over
    views indexed from 0, which LLVM vectorises: numba's slice assignment between arrays
    takes an overlap-safe element loop (0.6 ns an element against 0.07, Zen 3), and so
    does a loop indexed as ``dst[k + j] = src[b + j]``."""
    for j in range(dst.size):
        dst[j] = src[j]


@njit(inline="always")
def _block(src, s0, s1, s2, M2, r0, rows, j0, ncols, buf, held):
    """The values of rows r0..r0+rows-1 (row r = (r // M2, r % M2) over the two outer
    dims), columns j0..j0+ncols-1 of an operand with strides (s0, s1, s2), in C order: a
    slice when they lie contiguously in ``src``, else copied into ``buf`` (unless
    ``held``: buf already holds them)."""
    i1 = r0 // M2
    i2 = r0 - i1 * M2
    base = i1 * s0 + i2 * s1 + j0 * s2
    if s2 == 1 and (rows == 1 or (s1 == ncols and (s0 == M2 * ncols
                                                   or (r0 + rows - 1) // M2 == i1))):
        return src[base:base + rows * ncols]
    if held:
        return buf[:rows * ncols]
    k = 0
    for r in range(rows):
        b = i1 * s0 + i2 * s1 + j0 * s2
        # (copies between views indexed from 0, as copy_into: an index such as buf[k + j]
        # kept LLVM from vectorising these loops)
        dst = buf[k:k + ncols]
        if s2 == 1:
            copy_into(dst, src[b:b + ncols])
        else:
            fill(dst, src[b])
        k += ncols
        i2 += 1
        if i2 == M2:
            i2 = 0
            i1 += 1
    return buf[:k]


@njit(inline="always", error_model="numpy")
def _bchunk(c, per, total, op, a, sa, b, sb, out, M1, M2, N, ukey, mode):
    """Tiles c*per .. (c+1)*per-1: parts of one row (N >= TILE) or whole rows (N < TILE);
    binary32 or binary64 (the dtype of ``a``, ``b`` and ``out``: :func:`_tile_rounded`)."""
    bufa = np.empty(TILE, out.dtype)
    bufb = np.empty(TILE, out.dtype)
    M = M1 * M2
    ntr = (N + TILE - 1) // TILE
    rpt = max(1, TILE // N)
    prev = -1  # rows of the previous tile (whole-row tiles of an operand with equal rows repeat)
    # a constant operand (all strides 0: a number, or one element broadcast) fills its
    # buffer once per chunk, not once per tile (a tile's operand fits in TILE elements)
    const_a = sa[0] == 0 and sa[1] == 0 and sa[2] == 0
    const_b = sb[0] == 0 and sb[1] == 0 and sb[2] == 0
    if const_a:
        fill(bufa, a[0])
    if const_b:
        fill(bufb, b[0])
    for t in range(c * per, min(total, (c + 1) * per)):
        if N >= TILE:
            r0 = t // ntr
            rows = 1
            j0 = (t - r0 * ntr) * TILE
            ncols = min(N - j0, TILE)
        else:
            r0 = t * rpt
            rows = min(rpt, M - r0)
            j0 = 0
            ncols = N
        same = N < TILE and rows == prev
        aa = _block(a, sa[0], sa[1], sa[2], M2, r0, rows, j0, ncols, bufa,
                    const_a or (same and sa[0] == 0 and sa[1] == 0))
        bb = _block(b, sb[0], sb[1], sb[2], M2, r0, rows, j0, ncols, bufb,
                    const_b or (same and sb[0] == 0 and sb[1] == 0))
        prev = rows
        l0 = r0 * N + j0
        _tile_rounded(op, aa, bb, out[l0:l0 + rows * ncols], ukey, l0, mode)


def _tile_rounded(op, a, b, o, ukey, l0, mode):  # pragma: no cover - replaced by its overload
    """``o[jj] = RND(a[jj] op b[jj])`` with element ``l0 + jj``'s bits: binary32 at 24
    bits by :func:`_tile` and :func:`_redo`, binary64 at 53 by :func:`_tile64`."""


@overload(_tile_rounded, inline="always")
def _tile_rounded_impl(op, a, b, o, ukey, l0, mode):
    if o.dtype == types.float64:
        def wide(op, a, b, o, ukey, l0, mode):
            _tile64(op, a, b, o, ukey, l0, mode)
        return wide

    def narrow(op, a, b, o, ukey, l0, mode):
        bad = _tile(op, a, b, o, ukey, l0, mode)
        if bad:
            _redo(op, a, b, o, ukey, l0, mode, bad)
    return narrow


@njit(cache=True, error_model="numpy")
def _tile64(op, a, b, o, ukey, l0, mode):  # pragma: no cover - compiled
    """One binary64 tile at 53 bits as ``numvar.rounding.kernels.k_binary`` rounds its
    elements: the rounding core's vectorised pass (``_wide_block``; sr, ieee, ud, random),
    then the elements it declines, and every element in the other modes, by the scalar
    ``call_wide_binary``, element ``l0 + jj`` with ``bits64(key, l0 + jj)``."""
    fast = mode <= _RANDOM
    if fast and K._wide_block(op, a, b, o, ukey, l0, mode) == 0:
        return
    for jj in range(o.size):
        x = a[jj]
        y = b[jj]
        if not fast or not K._wide_takes(x, y, K._wide_result(op, x, y), op >= OP_MUL):
            # (t as an int64, not the literal 53: the signature every caller compiles)
            o[jj] = K.call_wide_binary(op, x, y, mode, np.int64(53),
                                       _bits(ukey, np.uint64(l0 + jj)))


def round_into_any(op, a, b, o, ukey, l0, mode):  # pragma: no cover - replaced by its overload
    """:func:`round_into` for binary32 or binary64 arrays, by ``o``'s dtype: ``o[j] =
    RND(a[j] op b[j])`` with ``bits64(key, l0 + j)``; float32 arrays at 24 bits
    (:func:`round_into`), float64 arrays at 53 bits as ``numvar.rounding.kernels.k_binary``
    rounds them (:func:`_tile64`, tile by tile). Compiled as a function of its own, not
    inlined: inlined into the variance kernel (``scan_kernels.rowvar``), numba's SSA pass
    warned about :func:`_round_tiles`' phi nodes ("variable … is not in scope", once per
    compile). Callers pass ``op`` as an int64, not a literal (one compiled copy per
    dtype)."""


@overload(round_into_any)
def _round_into_any_impl(op, a, b, o, ukey, l0, mode):
    if o.dtype == types.float64:
        def wide(op, a, b, o, ukey, l0, mode):
            n = o.size
            for t0 in range(0, n, ROUND_TILE):
                t1 = min(n, t0 + ROUND_TILE)
                # int64s, not literals: the signature the other callers compile
                _tile64(np.int64(op), a[t0:t1], b[t0:t1], o[t0:t1], ukey, np.int64(l0 + t0),
                        np.int64(mode))
        return wide

    def narrow(op, a, b, o, ukey, l0, mode):
        round_into(op, a, b, o, ukey, l0, mode)
    return narrow


@njit(inline="always")
def _ntiles(M, N):
    if N >= TILE:
        return M * ((N + TILE - 1) // TILE)
    rpt = TILE // N
    return (M + rpt - 1) // rpt


@njit(parallel=True, cache=True, error_model="numpy")
def _binary_par(op, a, sa, b, sb, out, M1, M2, N, key, mode):  # pragma: no cover
    ukey = np.uint64(key)
    total = _ntiles(M1 * M2, N)
    per = max(1, CHUNK // TILE)
    for c in prange((total + per - 1) // per):
        _bchunk(c, per, total, op, a, sa, b, sb, out, M1, M2, N, ukey, mode)


@njit(cache=True, error_model="numpy")
def _binary_ser(op, a, sa, b, sb, out, M1, M2, N, key, mode):  # pragma: no cover
    ukey = np.uint64(key)
    total = _ntiles(M1 * M2, N)
    per = max(1, CHUNK // TILE)
    for c in range((total + per - 1) // per):
        _bchunk(c, per, total, op, a, sa, b, sb, out, M1, M2, N, ukey, mode)


def binary32(op, a, sa, b, sb, out, dims, key, mode) -> None:
    """``out[l] = RND(a[.] op b[.])`` over the result seen as ``dims = (M1, M2, N)`` (C
    order, ``l = (i1*M2 + i2)*N + j``), operand element ``i1*s0 + i2*s1 + j*s2`` for its
    strides ``(s0, s1, s2)`` (``s2`` 0 or 1); binary32 at 24 bits, element l with
    ``bits64(key, l)``: numvar.rounding's ``add`` / ``sub`` / ``mul`` / ``div`` of the
    broadcast operands. Serial below :data:`numvar.instrument.kernels.PARALLEL_MIN_WORK`
    elements (the ``launch`` rule, without its thread-count calls), parallel above.
    float64 arrays: binary64 at 53 bits (:func:`binary64_tensors`)."""
    k = _binary_ser if out.size < KN.PARALLEL_MIN_WORK else _binary_par
    M1, M2, N = dims
    k(op, a, sa, b, sb, out, M1, M2, N, np.uint64(key), mode)


@njit(inline="always", error_model="numpy")
def _sqrt_at(a, jj):
    """``a[jj]`` as float64 ``x``, its float64 square root ``s`` and the residual the
    rounding core's square root rounds it with (``K.sqrt32_parts``), flags combined
    bitwise (``_fast32``)."""
    x = np.float64(a[jj])
    s, e = K.sqrt32_parts(x)
    return x, s, e


@njit(inline="always", error_model="numpy")
def _sqrtloop(a, o, ukey, l0, mode):
    nbad = 0
    z = _weyl(ukey, np.uint64(l0))  # element l0's Weyl value, stepped by γ (KN._weyl)
    for jj in range(o.size):
        x, s, e = _sqrt_at(a, jj)
        v, ok = _lo32(s, e, _bits_weyl(z), mode)
        z += _G
        o[jj] = v
        nbad += 0 if (ok & (x >= 0.0)) else 1  # (flags combined bitwise: KN._fast32)
    return nbad


@njit(cache=True, error_model="numpy")
def _sqrttile(a, o, ukey, l0, mode):  # pragma: no cover - compiled
    K.wide_vectors()
    if mode == _SR:
        n = _sqrtloop(a, o, ukey, l0, _SR)
    elif mode == _IEEE:
        n = _sqrtloop(a, o, ukey, l0, _IEEE)
    elif mode == _UD:
        n = _sqrtloop(a, o, ukey, l0, _UD)
    elif mode == _RANDOM:
        n = _sqrtloop(a, o, ukey, l0, _RANDOM)
    else:
        n = o.size  # up, down, zero, farthest: every element on the scalar path
    if n:
        for jj in range(o.size):
            r = _bits(ukey, np.uint64(l0 + jj))
            x, s, e = _sqrt_at(a, jj)
            v, ok = _lo32(s, e, r, mode)
            # (written also where the fast path accepts: in the modes the vectorised loop
            # leaves to this one, an exact zero is accepted here and written nowhere else)
            o[jj] = v if (ok and x >= 0.0) else np.float32(
                K.narrow_sqrt(a[jj], mode, 24, 24, -126, 127, r))


@njit(inline="always", error_model="numpy")
def _roundloop(h, o, ukey, l0, g, mode):
    nbad = 0
    z = _weyl(ukey, np.uint64(l0))  # element l0's Weyl value, stepped by g (KN._weyl)
    for jj in range(o.size):
        v, ok = _fast32(h[jj], _bits_weyl(z), mode)
        z += g
        o[jj] = v
        nbad += 0 if ok else 1
    return nbad


@njit(cache=True, error_model="numpy")
def _roundtile(h, o, ukey, l0, step, mode):  # pragma: no cover - compiled
    """``o[j] = RND(h[j])`` with the bits of index ``l0 + j·step`` (``step`` 1: a run of
    consecutive indices; n: a column of a row-major (·, n) result stored column by
    column)."""
    K.wide_vectors()
    g = _G * np.uint64(step)
    if mode == _SR:
        n = _roundloop(h, o, ukey, l0, g, _SR)
    elif mode == _IEEE:
        n = _roundloop(h, o, ukey, l0, g, _IEEE)
    elif mode == _UD:
        n = _roundloop(h, o, ukey, l0, g, _UD)
    elif mode == _RANDOM:
        n = _roundloop(h, o, ukey, l0, g, _RANDOM)
    else:
        n = o.size  # up, down, zero, farthest: every element on the scalar path
    if n:
        for jj in range(o.size):
            r = _bits(ukey, np.uint64(l0 + jj * step))
            v, ok = _fast32(h[jj], r, mode)
            if not ok:
                o[jj] = K.round_f32(h[jj], 0.0, mode, 24, r)


@njit(parallel=True, cache=True, error_model="numpy")
def _sqrt_par(a, out, key, mode):  # pragma: no cover - compiled
    for t in prange((out.size + TILE - 1) // TILE):
        j0 = t * TILE
        j1 = min(out.size, j0 + TILE)
        _sqrttile(a[j0:j1], out[j0:j1], key, j0, mode)


@njit(cache=True, error_model="numpy")
def _sqrt_ser(a, out, key, mode):  # pragma: no cover - compiled
    for t in range((out.size + TILE - 1) // TILE):
        j0 = t * TILE
        j1 = min(out.size, j0 + TILE)
        _sqrttile(a[j0:j1], out[j0:j1], key, j0, mode)


@njit(parallel=True, cache=True, error_model="numpy")
def _round_par(h, out, key, mode):  # pragma: no cover - compiled
    for t in prange((out.size + TILE - 1) // TILE):
        j0 = t * TILE
        j1 = min(out.size, j0 + TILE)
        _roundtile(h[j0:j1], out[j0:j1], key, j0, _ONE, mode)


@njit(cache=True, error_model="numpy")
def _round_ser(h, out, key, mode):  # pragma: no cover - compiled
    for t in range((out.size + TILE - 1) // TILE):
        j0 = t * TILE
        j1 = min(out.size, j0 + TILE)
        _roundtile(h[j0:j1], out[j0:j1], key, j0, _ONE, mode)


def sqrt32(a: np.ndarray, out: np.ndarray, key, mode: int) -> None:
    """``out[l] = RND(sqrt(a[l]))``, binary32 at 24 bits, ``bits64(key, l)``: numvar.rounding's
    ``sqrt`` (1-D contiguous float32 arrays)."""
    k = _sqrt_ser if out.size < KN.PARALLEL_MIN_WORK else _sqrt_par
    k(a, out, np.uint64(key), mode)


#: 2**63 and 2**64: a stream key (a Python int in [0, 2**64)) passed as the int64 of the
#: same bits (:func:`signed_key`), which numba takes without a numpy scalar
_2_63, _2_64 = 1 << 63, 1 << 64


def signed_key(key: int) -> int:
    """``key`` as the int64 with its bits (the kernels reinterpret it as uint64)."""
    return key - _2_64 if key >= _2_63 else key


def _pointer_to(dtype):
    @intrinsic
    def at(typingctx, addr):
        """The address ``addr`` (an int64: ``Tensor.data_ptr()``) as a typed pointer."""
        if not isinstance(addr, types.Integer):
            return None
        ptr = types.CPointer(dtype)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(ptr))

        return ptr(addr), codegen

    return at


_f64_at = _pointer_to(types.float64)
_f32_at = _pointer_to(types.float32)


@njit(cache=True, error_model="numpy")
def _round_at(hp, op, n, key, mode):  # pragma: no cover - compiled
    """:func:`_round_ser` on the ``n`` float64 at address ``hp`` into the ``n`` float32 at
    ``op`` (``key`` the int64 of the stream key's bits)."""
    _round_ser(carray(_f64_at(hp), n), carray(_f32_at(op), n), np.uint64(key), mode)


@njit(cache=True, error_model="numpy")
def _round_narrow_at(hp, wide, op, n, p, emin, emax, mode, t, key):  # pragma: no cover
    """The rounding core's ``_k_round_narrow`` (numvar.rounding's ``round`` to a format of
    p ≤ 24 bits, values into a binary32 carrier) of the ``n`` float64 (``wide``) or
    float32 at ``hp`` into the ``n`` float32 at ``op``."""
    out = carray(_f32_at(op), n)
    ukey = np.uint64(key)
    no_lo = np.bool_(False)  # a plain bool: a literal False compiled _k_round_narrow (and
    # _round_block) a second time beside the rounding core's k_round variant (has_lo is
    # read outside their vectorised loop: one copy serves both)
    if wide:
        h64 = carray(_f64_at(hp), n)
        K._k_round_narrow(h64, h64, out, no_lo, p, emin, emax, mode, t, ukey)
    else:
        h32 = carray(_f32_at(hp), n)
        K._k_round_narrow(h32, h32, out, no_lo, p, emin, emax, mode, t, ukey)


@njit(cache=True, error_model="numpy")
def _binary_narrow_at(op, ap, bp, outp, n, p, emin, emax, mode, t, key):  # pragma: no cover
    """The rounding core's ``_k_binary_narrow`` (``add`` & co to a format of p ≤ 24 bits)
    of the ``n`` float32 at ``ap`` and ``bp`` into the ``n`` float32 at ``outp``."""
    K._k_binary_narrow(op, carray(_f32_at(ap), n), carray(_f32_at(bp), n),
                       carray(_f32_at(outp), n), p, emin, emax, mode, t, np.uint64(key))


def round_narrow_tensor(h: torch.Tensor, out: torch.Tensor, p: int, emin: int, emax: int,
                        mode: int, t: int, key: int) -> None:
    """numvar.rounding's ``round`` of ``h`` (float64 or float32) to the format (p, emin,
    emax) at t bits into the float32 carrier ``out`` (contiguous CPU tensors of one size
    ≥ 1), through the tensors' addresses; numba's thread count as ``kernels.launch``
    sets it."""
    h = _plain(h)
    KN.launch(out.numel(), _round_narrow_at, h.data_ptr(), h.dtype is torch.float64,
              out.data_ptr(), out.numel(), p, emin, emax, mode, t, signed_key(key))


def binary_narrow_tensor(op: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                         p: int, emin: int, emax: int, mode: int, t: int, key: int) -> None:
    """numvar.rounding's ``add`` & co of float32 tensors ``a`` and ``b`` (contiguous,
    ``out``'s size ≥ 1) to the format (p, emin, emax) at t bits into the float32 carrier
    ``out``, through their addresses (see :func:`round_narrow_tensor`)."""
    a, b = _plain(a), _plain(b)
    KN.launch(out.numel(), _binary_narrow_at, op, a.data_ptr(), b.data_ptr(), out.data_ptr(),
              out.numel(), p, emin, emax, mode, t, signed_key(key))


def round32_tensor(h: torch.Tensor, out: torch.Tensor, key: int, mode: int) -> None:
    """:func:`round32` on tensors: ``h`` float64 and ``out`` float32, contiguous CPU
    tensors of one size ≥ 1 that stay alive during the call. Below
    ``kernels.PARALLEL_MIN_WORK`` elements the serial kernel gets their addresses (about
    1 µs less per call than two ``Tensor.numpy()`` views, the most frequent call of op
    granularity); above, :func:`round32` on their arrays."""
    h = _plain(h)  # (an address reads the storage, not a negative-bit view's values)
    n = out.numel()
    if n < KN.PARALLEL_MIN_WORK:
        _round_at(h.data_ptr(), out.data_ptr(), n, signed_key(key), mode)
    else:
        _round_par(array(h), array(out), np.uint64(key), mode)


@njit(cache=True, error_model="numpy")
def _round_cols_at(hp, op, B, m, n, key, mode):  # pragma: no cover - compiled
    """:func:`round32_columns` on the addresses of the B·m·n float64 at ``hp`` and float32
    at ``op``, each matrix stored column by column."""
    h = carray(_f64_at(hp), B * m * n)
    o = carray(_f32_at(op), B * m * n)
    ukey = np.uint64(key)
    for b in range(B):
        for j in range(n):
            p0 = (b * n + j) * m
            _roundtile(h[p0:p0 + m], o[p0:p0 + m], ukey, b * m * n + j, n, mode)


def round32_columns(h: torch.Tensor, out: torch.Tensor, key: int, mode: int) -> None:
    """:func:`round32_tensor` of a float64 tensor ``h`` whose last two dims are stored
    transposed (``h.mT`` contiguous: LAPACK's column-major results) into ``out``, float32
    of the same shape and strides: element (…, i, j) gets the bits of its row-major
    index, as after ``h.contiguous()``, read and written in place, column by column (a
    run of indices n apart per column: the same vectorised loop, its Weyl step n·γ).
    Same size ≥ 1, CPU, alive during the call, ``h`` not a negative-bit view."""
    m, n = h.shape[-2], h.shape[-1]
    _round_cols_at(h.data_ptr(), out.data_ptr(), h.numel() // (m * n), m, n, signed_key(key),
                   mode)


def round32(h: np.ndarray, out: np.ndarray, key, mode: int) -> None:
    """``out[l] = round_f32(h[l], 0, mode, 24, bits64(key, l))``: numvar.rounding's ``round``
    of float64 values to binary32 (1-D contiguous arrays); serial below
    ``kernels.PARALLEL_MIN_WORK`` elements, parallel above (same bits)."""
    k = _round_ser if out.size < KN.PARALLEL_MIN_WORK else _round_par
    k(h, out, np.uint64(key), mode)


# ------------------------------------------------------------- trailing reductions
#: rows per block of :func:`rowsum32` at most, and the most elements of a block, unless
#: that leaves fewer than ``RBLOCK_MIN`` rows (:func:`block_rows`)
RBLOCK = 512
RBLOCK_ELEMS = 1 << 15
#: the fewest rows of a block where the rows have them: each step of the sums is one tile
#: of a block's rows, and tiles of a few elements cost more in their calls than in their
#: arithmetic (one thread, sr, Zen 4, ns per element of 64 rows of 8192, the rows per
#: block of 4 / 16 / 32 / 64: 7.7 / 3.5 / 3.0 / 2.8 before the tiled transposition below)
RBLOCK_MIN = 64
#: the longest reduction, and the fewest rows, :func:`rowsum32` is used for (the (K, M)
#: scan serves the rest)
ROW_K_MAX = 4096
ROW_M_MIN = 16


@njit(inline="always")
def block_rows(M, Kd):
    """Rows per block of the row sums of M rows of Kd elements: as many as
    ``RBLOCK_ELEMS`` elements hold, at most ``RBLOCK``, at least ``RBLOCK_MIN`` (or M).
    The sums do not depend on it."""
    return max(1, min(RBLOCK, M, max(RBLOCK_ELEMS // Kd, RBLOCK_MIN)))


@njit(inline="always", error_model="numpy")
def _rowblock(x, out, b, R, ukey, op, mode):
    """Rows b*R .. of x (M, K): :func:`_rowblock_at` on the whole of x."""
    M = x.shape[0]
    m0 = b * R
    _rowblock_at(x, out, m0, min(R, M - m0), ukey, op, mode, M, 0)


@njit(inline="always", error_model="numpy")
def _rowblock_at(x, out, r0, rows, ukey, op, mode, Mg, mg0):
    """Rows r0 .. r0 + rows of x (R, K), the rows mg0 .. mg0 + R of a (Mg, K) whole: transpose
    the block into (K, rows), then accumulate along K in the whole's (K, Mg) scan order with
    its bits (element (k, m) of the whole: bits64(key, k*Mg + m)), each step one binary
    tile (acc op row, the same arithmetic as the scan's); ``out[r0 .. r0 + rows]``. A row's
    value does not depend on the block it is computed in, nor on the part of the whole
    that x is."""
    Kd = x.shape[1]
    t = np.empty((Kd, rows), x.dtype)
    _transpose_rows(x, t, r0, rows)
    _colsums(t, out, r0, rows, ukey, op, mode, Mg, mg0)


@njit(inline="always", error_model="numpy")
def _transpose_rows(x, t, r0, rows):
    """``t[k, r] = x[r0 + r, k]`` for the block's rows, by 8 × 8 tiles through a small
    buffer (rows read along k, t written along r), the edges element by element. One
    thread, Zen 4, ns per element: 0.6 against 0.7–1.4 for the element-by-element loop
    over 16 rows at a time (64 × 8192: 1.43)."""
    Kd = x.shape[1]
    buf = np.empty((8, 8), x.dtype)
    r8 = rows - rows % 8
    k8 = Kd - Kd % 8
    for q in range(0, r8, 8):
        for kb in range(0, k8, 8):
            for i in range(8):
                for j in range(8):
                    buf[j, i] = x[r0 + q + i, kb + j]
            for j in range(8):
                for i in range(8):
                    t[kb + j, q + i] = buf[j, i]
        for k in range(k8, Kd):
            for i in range(8):
                t[k, q + i] = x[r0 + q + i, k]
    for r in range(r8, rows):
        for k in range(Kd):
            t[k, r] = x[r0 + r, k]


@njit(inline="always", error_model="numpy")
def _colsums(t, out, r0, rows, ukey, op, mode, Mg, mg0):
    """The rows r0 .. r0 + rows of a (Mg, K) whole (its rows mg0 ..), transposed into
    ``t`` (K, rows): accumulated along K in the whole's (K, Mg) scan order with its bits
    (element (k, m): bits64(key, k*Mg + m)), each step one binary tile (acc op row, the
    scan's arithmetic; binary32, or binary64 for float64 arrays: :func:`_tile_rounded`),
    into ``out[r0 .. r0 + rows]``."""
    prev = t[0].copy()
    cur = np.empty(rows, t.dtype)
    for k in range(1, t.shape[0]):
        _tile_rounded(op, prev, t[k], cur, ukey, k * Mg + mg0 + r0, mode)
        prev, cur = cur, prev
    copy_into(out[r0:r0 + rows], prev)


@njit(parallel=True, cache=True, error_model="numpy")
def _rowsum_par(x, out, R, key, op, mode):  # pragma: no cover - compiled
    ukey = np.uint64(key)
    for b in prange((x.shape[0] + R - 1) // R):
        K.wide_vectors()
        _rowblock(x, out, b, R, ukey, op, mode)


@njit(cache=True, error_model="numpy")
def _rowsum_ser(x, out, R, key, op, mode):  # pragma: no cover - compiled
    K.wide_vectors()
    ukey = np.uint64(key)
    for b in range((x.shape[0] + R - 1) // R):
        _rowblock(x, out, b, R, ukey, op, mode)


def rowsum32(x: np.ndarray, key, mode: int, *, mul: bool = False) -> np.ndarray:
    """Sum (or product) of each row of ``x`` (M, K), binary32 at 24 bits, ``K >= 1``:
    ``numvar.instrument.kernels.scan(x.T, key, mode, 24)`` (same order, same bits), without
    the transposed copy of ``x`` (each block of rows is transposed in cache). A float64
    ``x``: binary64 at 53 bits, ``scan(x.T, key, mode, 53)``'s bits."""
    M, Kd = x.shape
    out = np.empty(M, x.dtype)
    if M:
        R = block_rows.py_func(M, Kd)
        k = _rowsum_ser if x.size < KN.PARALLEL_MIN_WORK else _rowsum_par
        k(x, out, R, np.uint64(key), OP_MUL if mul else OP_ADD, mode)
    return out


@njit(parallel=True, cache=True, error_model="numpy")
def _winsum_par(flat, n0, n1, n2, s0, s1, s2, k1, k2, t1, t2, out, R, key, op,
                mode):  # pragma: no cover - compiled
    """:func:`window_sum32`'s blocks of R windows (one task each)."""
    ukey = np.uint64(key)
    M = out.size
    Kd = k1 * k2
    koff = np.empty(Kd, np.int64)
    for i in range(k1):
        for j in range(k2):
            koff[i * k2 + j] = i * t1 + j * t2
    for b in prange((M + R - 1) // R):
        K.wide_vectors()
        r0 = b * R
        rows = min(R, M - r0)
        base = np.empty(rows, np.int64)
        i0 = r0 // (n1 * n2)  # the block's first window, then counters (no division)
        i1 = (r0 - i0 * n1 * n2) // n2
        i2 = r0 - (i0 * n1 + i1) * n2
        for r in range(rows):
            base[r] = i0 * s0 + i1 * s1 + i2 * s2
            i2 += 1
            if i2 == n2:
                i2 = 0
                i1 += 1
                if i1 == n1:
                    i1 = 0
                    i0 += 1
        t = np.empty((Kd, rows), np.float32)
        for q in range(0, rows, 16):  # as _rowblock_at: 16 windows' lines stay in L1
            q1 = min(rows, q + 16)
            for k in range(Kd):
                o = koff[k]
                for r in range(q, q1):
                    t[k, r] = flat[base[r] + o]
        _colsums(t, out, r0, rows, ukey, op, mode, M, 0)


def window_sum32(flat: np.ndarray, mshape, mstrides, kshape, kstrides, key,
                 mode: int) -> np.ndarray:
    """The sums of the windows of a strided view, binary32 at 24 bits: window m (C order
    over ``mshape``, three sizes) holds the elements ``flat[Σ i_d·mstrides[d] + Σ j_e·
    kstrides[e]]`` for (j_1, j_2) in C order over ``kshape`` (two sizes, product K ≥ 1).
    Returns (M,): :func:`rowsum32` of the windows materialised as the rows of an (M, K)
    array (same order, same bits: the same transposed blocks and tiles), without that
    copy: PyTorch copied a pooling's 2×2 windows at about 5 ns an element, 2.6 times the
    time of the sums. ``flat`` is 1-D float32 covering every element the view reads."""
    M = mshape[0] * mshape[1] * mshape[2]
    Kd = kshape[0] * kshape[1]
    out = np.empty(M, np.float32)
    if M:
        R = block_rows.py_func(M, Kd)
        # (the op a run-time argument, as rowsum32's: a literal compiles the tiles again)
        KN.launch(M * Kd, _winsum_par, flat, *mshape, *mstrides, *kshape, *kstrides, out, R,
                  np.uint64(key), OP_ADD, mode)
    return out


# ------------------------------------------------------------------------- layouts
def broadcast_shape(sa, sb) -> tuple[int, ...]:
    """``torch.broadcast_shapes`` of two shapes (RuntimeError when they do not broadcast)."""
    if len(sa) < len(sb):
        sa, sb = sb, sa
    k = len(sa) - len(sb)
    out = list(sa)
    for d, m in enumerate(sb):
        n = sa[k + d]
        if n != m:
            if n == 1:
                out[k + d] = m
            elif m != 1:
                raise RuntimeError(f"shapes {tuple(sa)} and {tuple(sb)} do not broadcast")
    return tuple(out)


def array(t: torch.Tensor) -> np.ndarray:
    """The 1-D numpy view of a contiguous CPU tensor (no copy)."""
    if t.requires_grad:
        t = t.detach()
    return t.numpy().ravel()


def _flat(t: torch.Tensor, M1: int, M2: int, N: int, st) -> np.ndarray:
    """The 1-D float32 array over ``t``'s storage that (i1, i2, j) -> i1*s0 + i2*s1 + j*s2
    indexes."""
    extent = 1 + (M1 - 1) * st[0] + (M2 - 1) * st[1] + (N - 1) * st[2]
    if t.is_contiguous() and t.numel() == extent:
        return array(t)
    if t.requires_grad:
        t = t.detach()
    return t.as_strided((extent,), (1,)).numpy()


def _suffix(shape, t: torch.Tensor) -> int:
    """numel of ``t`` when it is contiguous and broadcasts to ``shape`` along leading dims
    only (``shape[-k:] == t.shape`` up to leading ones of t); else 0."""
    ts = tuple(t.shape)
    while ts and ts[0] == 1:
        ts = ts[1:]
    if len(ts) <= len(shape) and tuple(shape[len(shape) - len(ts):]) == ts and t.is_contiguous():
        return t.numel()
    return 0


_FULL = (0, 0, 1)  # the strides of a contiguous operand of the result's shape
_SINGLE = (0, 0, 0)  # the strides of a single value
#: layouts of :func:`plan` by (shape, a's shape and strides, b's shape and strides):
#: what :func:`plan_uncached` derives depends on nothing else
_LAYOUTS: dict = {}
#: the most layouts kept (the cache is emptied when it is full)
MAX_LAYOUTS = 4096


def plan(shape, a: torch.Tensor, b: torch.Tensor):
    """:func:`plan_uncached`, its layout (dims, strides, how each operand's array is
    taken) cached per (shape, shapes and strides of ``a`` and ``b``): the same result,
    without re-deriving the fold for every op of a model."""
    a, b = _plain(a), _plain(b)
    if a.shape == shape and b.shape == shape and a.is_contiguous() and b.is_contiguous():
        return (1, 1, a.numel()), (array(a), _FULL), (array(b), _FULL)
    lay = _cached_layout(shape, a, b)
    if lay is False:
        return None
    dims, (sa, ea), (sb, eb) = lay
    return dims, (_operand(a, ea), sa), (_operand(b, eb), sb)


def _cached_layout(shape, a: torch.Tensor, b: torch.Tensor):
    """:func:`_layout`, cached per (shape, shapes and strides of ``a`` and ``b``)."""
    key = (shape, a.shape, a.stride(), b.shape, b.stride())
    lay = _LAYOUTS.get(key)
    if lay is None:
        if len(_LAYOUTS) >= MAX_LAYOUTS:
            _LAYOUTS.clear()
        lay = _LAYOUTS[key] = _layout(shape, a, b)
    return lay


@njit(cache=True, error_model="numpy")
def _binary32_at(op, ap, na, sa, bp, nb, sb, outp, M1, M2, N, key, mode):  # pragma: no cover
    """:func:`_binary_ser` on the ``na`` / ``nb`` float32 at addresses ``ap`` / ``bp``
    (strides ``sa`` / ``sb``) into the M1·M2·N float32 at ``outp`` (``key``: the int64 of
    the stream key's bits)."""
    _binary_ser(op, carray(_f32_at(ap), na), sa, carray(_f32_at(bp), nb), sb,
                carray(_f32_at(outp), M1 * M2 * N), M1, M2, N, np.uint64(key), mode)


@njit(cache=True, error_model="numpy")
def _scalar32_at(op, tp, x, left, outp, n, key, mode):  # pragma: no cover - compiled
    """``t op x`` (``left``) or ``x op t`` of the ``n`` float32 at ``tp`` and the number x
    (float64, rounded to binary32 as ``torch.tensor(x, dtype=torch.float32)`` rounds it)
    into the ``n`` float32 at ``outp``: :func:`_binary_ser` with x a single value."""
    xv = np.empty(1, np.float32)
    xv[0] = np.float32(x)
    t = carray(_f32_at(tp), n)
    out = carray(_f32_at(outp), n)
    # runtime int64s, not constants (literal types): the signature the other callers
    # compile, one copy of _binary_ser instead of one per constant pattern
    zero, one = np.int64(0), np.int64(1)
    if left:
        _binary_ser(op, t, (zero, zero, one), xv, (zero, zero, zero), out, one, one, n,
                    np.uint64(key), mode)
    else:
        _binary_ser(op, xv, (zero, zero, zero), t, (zero, zero, one), out, one, one, n,
                    np.uint64(key), mode)


def _planned(op: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, key: int,
             mode: int) -> bool:
    """:func:`binary32` (binary32 or binary64: the tensors' dtype) of ``a`` and ``b`` read
    in place as :func:`plan` reads them; False (nothing written) where the broadcast does
    not fold."""
    p = plan(out.shape, a, b)
    if p is None:
        return False
    dims, (an, sa), (bn, sb) = p
    binary32(op, an, sa, bn, sb, array(out), dims, key, mode)
    return True


def binary64_tensors(op: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, key: int,
                     mode: int) -> bool:
    """:func:`binary32_tensors` for float64 CPU tensors at 53 bits: ``a`` and ``b`` read in
    place as :func:`plan` reads them (a bias or a per-row statistic is not materialised),
    each element rounded as ``numvar.rounding.kernels.k_binary`` rounds it on the
    broadcast operands (:func:`_tile64`: same value and bits for element l, key ``key``);
    False (nothing written) where the broadcast does not fold."""
    return _planned(op, a, b, out, key, mode)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its values in its storage (a negative-bit view resolved)."""
    return t.resolve_neg() if t.is_neg() else t


def binary32_tensors(op: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, key: int,
                     mode: int) -> bool:
    """:func:`binary32` of float32 CPU tensors ``a`` and ``b`` broadcast to ``out``'s shape
    (``out`` contiguous, at least one element), read in place as :func:`plan` reads them;
    False (nothing written) where the broadcast does not fold (:func:`plan` is None).
    Below ``kernels.PARALLEL_MIN_WORK`` elements the serial kernel gets the tensors'
    addresses (about 1.5 µs less per call than ``Tensor.numpy()`` views)."""
    n = out.numel()
    if n >= KN.PARALLEL_MIN_WORK or a.is_neg() or b.is_neg():
        return _planned(op, a, b, out, key, mode)
    shape = out.shape
    if a.shape == shape and b.shape == shape and a.is_contiguous() and b.is_contiguous():
        _binary32_at(op, a.data_ptr(), n, _FULL, b.data_ptr(), n, _FULL, out.data_ptr(), 1,
                     1, n, signed_key(key), mode)
        return True
    lay = _cached_layout(shape, a, b)
    if lay is False:
        return False
    (M1, M2, N), (sa, ea), (sb, eb) = lay
    _binary32_at(op, a.data_ptr(), ea or a.numel(), sa, b.data_ptr(), eb or b.numel(), sb,
                 out.data_ptr(), M1, M2, N, signed_key(key), mode)
    return True


def scalar32_tensor(op: int, t: torch.Tensor, x: float, left: bool, out: torch.Tensor,
                    key: int, mode: int) -> None:
    """``out = RND(t op x)`` (``left``) or ``RND(x op t)``: :func:`binary32` of a
    contiguous float32 CPU tensor ``t`` and a Python number ``x`` that binary32 holds as
    ``torch.tensor(x, dtype=torch.float32)`` would, ``out`` contiguous of t's size ≥ 1."""
    n = out.numel()
    t = _plain(t)
    if n < KN.PARALLEL_MIN_WORK:
        _scalar32_at(op, t.data_ptr(), float(x), left, out.data_ptr(), n, signed_key(key), mode)
        return
    ta, xa = array(t), np.array((x,), np.float32)
    a, sa, b, sb = (ta, _FULL, xa, _SINGLE) if left else (xa, _SINGLE, ta, _FULL)
    binary32(op, a, sa, b, sb, array(out), (1, 1, n), key, mode)


def _operand(t: torch.Tensor, extent: int) -> np.ndarray:
    """The 1-D array of a planned operand: the tensor itself (``extent`` 0: contiguous,
    all of it read) or ``extent`` elements of its storage from its first element."""
    if not extent:
        return array(t)
    if t.requires_grad:
        t = t.detach()
    return t.as_strided((extent,), (1,)).numpy()


def _layout(shape, a: torch.Tensor, b: torch.Tensor):
    """What :func:`plan` caches: ``(dims, (strides, extent), (strides, extent))`` with
    ``extent`` as :func:`_operand` takes it, or False (no plan)."""
    p = plan_uncached(shape, a, b)
    if p is None:
        return False
    dims, (an, sa), (bn, sb) = p
    return dims, (sa, _extent(a, an)), (sb, _extent(b, bn))


def _extent(t: torch.Tensor, arr: np.ndarray) -> int:
    """0 when the plan reads ``t`` as :func:`array` does, else the extent it reads."""
    if t.is_contiguous() and arr.size == t.numel():
        return 0
    return arr.size


def plan_uncached(shape, a: torch.Tensor, b: torch.Tensor):
    """Fold the broadcast of ``a`` and ``b`` (CPU tensors, strides >= 0) to ``shape`` into
    (M1, M2, N): ``((M1, M2, N), (array, strides), (array, strides))``, element (i1, i2, j)
    of an operand at ``array[i1*s0 + i2*s1 + j*s2]`` with ``s2`` 0 or 1; None when it does
    not fold so. Contiguous operands of the result's shape, single values and contiguous
    trailing blocks (a bias) take short paths."""
    a, b = _plain(a), _plain(b)
    if a.shape == shape and b.shape == shape and a.is_contiguous() and b.is_contiguous():
        return (1, 1, a.numel()), (array(a), _FULL), (array(b), _FULL)
    n = 1
    for m in shape:
        n *= m
    na, nb = _suffix(shape, a), _suffix(shape, b)
    if na == n and nb:
        if nb == n or nb == 1:
            return (1, 1, n), (array(a), (0, 0, 1)), (array(b), (0, 0, 1 if nb > 1 else 0))
        return (1, n // nb, nb), (array(a), (0, nb, 1)), (array(b), (0, 0, 1))
    if nb == n and na:
        if na == 1:
            return (1, 1, n), (array(a), (0, 0, 0)), (array(b), (0, 0, 1))
        return (1, n // na, na), (array(a), (0, 0, 1)), (array(b), (0, na, 1))
    return _plan_general(shape, a, b)


def _plan_general(shape, *ts: torch.Tensor):
    nd = len(shape)
    sizes = []
    strides: list[list[int]] = [[] for _ in ts]
    for d in range(nd):
        n = shape[d]
        if n == 1:
            continue
        sizes.append(n)
        for k, t in enumerate(ts):
            dd = d - (nd - t.dim())
            strides[k].append(0 if dd < 0 or t.shape[dd] == 1 else t.stride(dd))
    # coalesce from the innermost dim outwards, into at most three groups
    gs: list[int] = []
    gst: list[list[int]] = [[] for _ in ts]
    for d in range(len(sizes) - 1, -1, -1):
        n = sizes[d]
        if gs and all(strides[k][d] == gst[k][-1] * gs[-1] for k in range(len(ts))):
            gs[-1] *= n
            continue
        if len(gs) == 3:
            return None
        gs.append(n)
        for k in range(len(ts)):
            gst[k].append(strides[k][d])
    while len(gs) < 3:
        gs.append(1)
        for g in gst:
            g.append(0)
    N, M2, M1 = gs
    if any(g[0] not in (0, 1) for g in gst):
        return None
    return ((M1, M2, N),
            *[(_flat(t, M1, M2, N, (g[2], g[1], g[0])), (g[2], g[1], g[0]))
              for t, g in zip(ts, gst)])
