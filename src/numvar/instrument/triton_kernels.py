"""Triton kernels of the ``flop`` granularity: :func:`contract` and :func:`scan` on device
tensors, with the arithmetic order and the random stream of the numba kernels of
:mod:`numvar.instrument.kernels`, so that a seed gives the same bits on either backend.

Imported lazily, only when a CUDA tensor (or ``NUMVAR_FLOP_BACKEND=triton``) needs it: a
CPU-only install never imports triton. Under ``TRITON_INTERPRET=1`` (set before this
module is imported) the kernels run on CPU tensors in Triton's interpreter; the tests use
that to compare them bit for bit with the numba kernels and the pure-Python references.

Order and random bits (as :mod:`numvar.instrument.kernels`)
----------------------------------------------------------
* :func:`contract`: a program owns a ``BLOCK_M × BLOCK_N`` tile of one output matrix and
  does one rank-1 update per k, in increasing k: ``acc = RND(a[i,0]·b[0,j])``, then
  ``acc = RND(acc + RND(a[i,k]·b[k,j]))``. Term (bo, i, k, j) draws
  ``r = term_bits(key, (bo·M + i)·K + k, j)``; the product is rounded with ``r``, the add
  with ``r`` rotated left by 29 bits.
* ``contraction="fma"`` (binary32 carriers: binary32, bf16, fp16): ``acc = RND(a[i,0]·b[0,j])``,
  then ``acc = RND(acc + a[i,k]·b[k,j])`` with the exact product, every rounding with
  ``r`` (one draw per term). binary64 with ``"fma"`` is not a Triton kernel:
  :func:`numvar.instrument.flop.flop_backend`'s callers send it to the numba kernel
  (same bits).
* :func:`scan`: ``acc = x[0, m]``, then ``acc = RND(acc ∘ x[k, m])`` for k = 1..K-1 with
  ``bits64(key, k·M + m)``; ``cumulative`` writes every partial result.

Arithmetic
----------
Every value is carried in float64. binary32 (and bf16/fp16, which the callers pass as
binary32 at 8 and 11 bits): a product of two binary32 values is exact in float64, a sum
carries its TwoSum residual; the exact value is rounded by :func:`_round_narrow`, the
rounding core's integer fast path (``numvar.rounding.kernels._fast_bits``) where it
applies (residual 0, exponent in binary32's normal range) and the general algorithm
(``round_core``, vectorised as ``numvar.rounding._torch.round_core``) elsewhere; the
general path runs only in blocks that hold such an element (a block-uniform branch).
binary64 follows ``wide_binary``: TwoSum, Dekker's TwoProduct (Veltkamp splitting, no
FMA), power-of-two scaling near under/overflow, then the general algorithm.

The kernels are compiled with ``enable_fp_fusion=False``: a fused multiply-add would
change the error-free transformations' residuals. NaN payloads: a device's float64 →
binary32 conversion may return the canonical NaN, so NaN results are NaN on both
backends but their payload bits may differ on hardware.

Rounding modes are one ``@triton.jit`` function each (``_up_<mode>`` decides whether
the magnitude moves up one grid step; UD's extra step is ``_ud_step``); adding a mode is
one function and one entry of :func:`_decide`. The modes up, down, zero and farthest
are not compiled here: :mod:`numvar.instrument.flop` gives them to the numba kernels.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from numvar.rounding.kernels import GAMMA, MIX1, MIX2, MODE_IEEE, MODE_RANDOM, MODE_SR, \
    MODE_UD

_G = tl.constexpr(GAMMA)
_M1 = tl.constexpr(MIX1)
_M2 = tl.constexpr(MIX2)
_SR = tl.constexpr(MODE_SR)
_IEEE = tl.constexpr(MODE_IEEE)
_UD = tl.constexpr(MODE_UD)
_RANDOM = tl.constexpr(MODE_RANDOM)
_TWO53 = tl.constexpr(9007199254740992.0)
_TWO64 = tl.constexpr(18446744073709551616.0)
_MANT = tl.constexpr((1 << 52) - 1)
_SPLIT = tl.constexpr(134217729.0)  # 2**27 + 1 (Veltkamp)
_SAFE_LO = tl.constexpr(2.0 ** -480)
_SAFE_HI = tl.constexpr(2.0 ** 480)
_INF = tl.constexpr(float("inf"))

#: tile of :func:`contract` (output rows × columns per program) and of :func:`scan`
BLOCK_M, BLOCK_N, BLOCK_SCAN = 32, 32, 128

#: launch options: no contraction of a*b+c into an FMA (see the module docstring)
_OPTS = {"enable_fp_fusion": False}


def interpreted() -> bool:
    """True when Triton runs its interpreter (``TRITON_INTERPRET=1``): kernels then run on
    CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ------------------------------------------------------------------------ random bits
@triton.jit
def _mix64(z):
    z = (z ^ (z >> 30)) * _M1
    z = (z ^ (z >> 27)) * _M2
    return z ^ (z >> 31)


@triton.jit
def _bits64(ukey, index):
    """``numvar.rounding.kernels.bits64`` on uint64 tensors."""
    return _mix64(ukey + (index + 1) * _G)


@triton.jit
def _term(h, j):
    """The random bits of term ``j`` of a contraction line whose hash is ``h``
    (``numvar.instrument.kernels._term``)."""
    z = h + j * _G
    z = (z ^ (z >> 32)) * _M1
    return z ^ (z >> 29)


@triton.jit
def _rot(r):
    return (r << 29) | (r >> 35)


# ------------------------------------------------------------------ float64 bit tools
@triton.jit
def _b(x):
    return x.to(tl.int64, bitcast=True)


@triton.jit
def _f(bits):
    return bits.to(tl.float64, bitcast=True)


@triton.jit
def _pow2(k):
    """2.0**k for an int64 tensor k (clamped to [-1074, 1023]); exact."""
    k = tl.minimum(tl.maximum(k, -1074), 1023)
    normal = _f(tl.maximum(k + 1023, 1) << 52)
    subn = _f((k * 0 + 1) << tl.minimum(tl.maximum(k + 1074, 0), 51))
    return tl.where(k >= -1022, normal, subn)


@triton.jit
def _exponent(h):
    """floor(log2(h)) for finite h > 0 (subnormals included); garbage elsewhere."""
    be = (_b(h) >> 52) & 0x7FF
    bs = (_b(h * _TWO64) >> 52) & 0x7FF
    return tl.where(be == 0, bs - 1023 - 64, be - 1023)


@triton.jit
def _scale2(x, n):
    """x * 2**n, exact whenever representable (n an int64 tensor, |n| <= 3000)."""
    for _ in tl.static_range(3):
        big = n > 1000
        small = n < -1000
        x = tl.where(big, x * 2.0 ** 1000, tl.where(small, x * 2.0 ** -1000, x))
        n = tl.where(big, n - 1000, tl.where(small, n + 1000, n))
    return x * _pow2(n)


@triton.jit
def _two_sum(a, b):
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@triton.jit
def _split(a):
    c = _SPLIT * a
    ah = c - (c - a)
    return ah, a - ah


@triton.jit
def _two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


@triton.jit
def _sexp(e_true, T: tl.constexpr, SUB: tl.constexpr):
    return tl.maximum(e_true - T + 1, SUB)


# ------------------------------------------------------- rounding modes (one function each)
@triton.jit
def _up_sr(s, ee, u, A, exact, neg, r):
    """SR: up with probability floor(d·2**53)/2**53, d = s/u (53 random bits)."""
    rnd = (r >> 11).to(tl.float64) + 1.0
    return (not_(exact)) & (rnd <= (s / u) * _TWO53)


@triton.jit
def _up_random(s, ee, u, A, exact, neg, r):
    """random: up or down with probability 1/2 (the top random bit); exact stays."""
    return (not_(exact)) & ((r >> 63) == 1)


@triton.jit
def _up_nearest(s, ee, u, A, exact, neg, r):
    """Round to nearest, ties to even on the grid (ieee, and UD's first step)."""
    s2 = 2.0 * s
    q = A / u
    odd = (q - 2.0 * tl.floor(0.5 * q)) == 1.0
    return (s2 > u) | ((s2 == u) & ((ee > 0) | ((ee == 0) & odd)))


@triton.jit
def not_(x):
    return x == 0


@triton.jit
def _decide(s, ee, u, A, exact, neg, r, MODE: tl.constexpr):
    """Whether the magnitude ``A`` moves up one grid step ``u`` (the table of modes)."""
    if MODE == _SR:
        up = _up_sr(s, ee, u, A, exact, neg, r)
    elif MODE == _RANDOM:
        up = _up_random(s, ee, u, A, exact, neg, r)
    else:  # ieee, ud
        up = _up_nearest(s, ee, u, A, exact, neg, r)
    return up


@triton.jit
def _ud_step(R, k, r, T: tl.constexpr, SUB: tl.constexpr, EMAX: tl.constexpr):
    """UD's second step: a nonzero finite round-to-nearest result moves one grid step
    up or down in magnitude (the top random bit)."""
    nz = R != 0
    Rp = tl.where(nz, R, 1.0)
    eR = _exponent(Rp)
    move = nz & (eR - k <= EMAX)
    u_here = _pow2(_sexp(eR - k, T, SUB) + k)
    u_below = tl.where(Rp == _pow2(eR), _pow2(_sexp(eR - k - 1, T, SUB) + k), u_here)
    Rm = tl.where((r >> 63) == 1, R + u_here, R - u_below)
    return tl.where(move, Rm, R)


# ---------------------------------------------------------------- the rounding core
@triton.jit
def _round_core(hi, lo, k, r, MODE: tl.constexpr, T: tl.constexpr, P: tl.constexpr,
                EMIN: tl.constexpr, EMAX: tl.constexpr):
    """Round x = (hi + lo)·2**-k to the T-bit grid of the format (P, EMIN, EMAX):
    ``numvar.rounding.kernels.round_core`` (lo2 = 0), vectorised as
    ``numvar.rounding._torch.round_core`` (k: int64 tensor; r: uint64 bits)."""
    SUB: tl.constexpr = EMIN - P + 1
    ok = (tl.abs(hi) < _INF) & (hi != 0)
    neg = hi < 0
    H = tl.where(ok, tl.abs(hi), 1.0)
    L = tl.where(ok, tl.where(neg, -lo, lo), 0.0)
    e = _exponent(H)
    ue_s = _sexp(e - k, T, SUB) + k
    deep = ue_s > 1023
    u = _pow2(tl.where(deep, e, ue_s))
    A = tl.floor(H / u) * u
    D = H - A
    s, ee = _two_sum(D, L)
    down = (A > 0) & ((s < 0) | ((s == 0) & (ee < 0)))
    upadj = not_(down) & ((s > u) | ((s == u) & (ee >= 0)))
    Ap = tl.where(A > 0, A, 1.0)
    ea = _exponent(Ap)
    u_dn = tl.where(Ap == _pow2(ea), _pow2(_sexp(ea - k - 1, T, SUB) + k), u)
    A_up = A + u
    u_up = _pow2(_sexp(_exponent(A_up) - k, T, SUB) + k)
    A = tl.where(down, A - u_dn, tl.where(upadj, A_up, A))
    u = tl.where(down, u_dn, tl.where(upadj, u_up, u))
    s2, ee2 = _two_sum(H - A, L)
    adj = down | upadj
    s = tl.where(adj, s2, s)
    ee = tl.where(adj, ee2, ee)
    exact = (s == 0) & (ee == 0)
    up = _decide(s, ee, u, A, exact, neg, r, MODE)
    R = tl.where(up, A + u, A)
    if MODE == _UD:
        R = _ud_step(R, k, r, T, SUB, EMAX)
        # UD at zero (numvar.rounding.kernels.round_gen): an inexact x whose nearest
        # value is 0 steps up to the smallest grid value with the top random bit
        R = tl.where((R == 0) & not_(exact) & ((r >> 63) == 1), u, R)
    Rp = tl.where(R != 0, R, 1.0)
    ovf = (R != 0) & (R < _INF) & (_exponent(Rp) - k > EMAX)
    R = tl.where(ovf, _INF, _scale2(R, -k))
    if MODE == _RANDOM or MODE == _UD:
        v = tl.where((r >> 63) == 1, 2.0 ** SUB, 0.0)
    else:
        v = R * 0.0
    R = tl.where(deep, v, R)
    R = tl.where(neg, -R, R)
    return tl.where(ok, R, hi)


@triton.jit
def _fast_bits(b, r, MODE: tl.constexpr, T: tl.constexpr, P: tl.constexpr,
               EMIN: tl.constexpr, EMAX: tl.constexpr):
    """``numvar.rounding.kernels._fast_bits`` on int64 bit patterns (lo = 0, k = 0,
    T <= 24, exponent of b in [EMIN, EMAX])."""
    NB: tl.constexpr = 53 - T
    ONE: tl.constexpr = 1 << NB
    MASK: tl.constexpr = ONE - 1
    if MODE == _SR:
        res = (b + ((~r) >> (11 + T)).to(tl.int64, bitcast=True)) & ~MASK
    elif MODE == _RANDOM:
        up = ((r >> 63) << NB).to(tl.int64, bitcast=True)
        res = tl.where((b & MASK) != 0, (b & ~MASK) + up, b)
    else:
        if T == 1:
            lsb = 1
        else:
            lsb = (b >> NB) & 1
        res = (b + ((ONE >> 1) - 1) + lsb) & ~MASK
        if MODE == _UD:
            be = (res >> 52) & 0x7FF
            if T == P:
                low = ((res & _MANT) == 0) & (be == 1023 + EMIN)
                dn = tl.where(low, res - 2 * ONE, res - ONE)
            else:
                dn = res - ONE
            res = tl.where(be <= 1023 + EMAX, tl.where((r >> 63) == 1, res + ONE, dn), res)
    return res


@triton.jit
def _narrow_fast(hi, lo, r, MODE: tl.constexpr, T: tl.constexpr):
    """The integer fast path of ``numvar.rounding.kernels.round_narrow`` (binary32 at T
    bits of the exact value hi + lo, hi = RN64(hi + lo)): (value, ok); ``ok`` is False
    where the general algorithm is needed (lo != 0, exponent outside binary32's normal
    range). ±0, ±inf and NaN are returned as they are (ok)."""
    b = _b(hi)
    be = (b >> 52) & 0x7FF
    special = (hi == 0) | (be == 0x7FF)
    ok = special | ((lo == 0) & (be >= 1023 - 126) & (be <= 1023 + 127))
    fb = _fast_bits(b, r, MODE, T, 24, -126, 127)
    ovf = ((fb >> 52) & 0x7FF) > 1023 + 127
    res = tl.where(special, hi, tl.where(ovf, tl.where(hi < 0, -_INF, _INF), _f(fb)))
    return res, ok


@triton.jit
def _narrow_full(hi, lo, r, MODE: tl.constexpr, T: tl.constexpr):
    """``numvar.rounding.kernels.round_narrow`` with (p, emin, emax) = (24, -126, 127),
    every element (the fast path where it applies, else the general algorithm)."""
    res, ok = _narrow_fast(hi, lo, r, MODE, T)
    return tl.where(ok, res, _round_core(hi, lo, _b(hi) * 0, r, MODE, T, 24, -126, 127))


@triton.jit
def _any_bad(ok):
    """Whether some element of the block has ``ok`` False (one block-uniform value)."""
    return tl.max(not_(ok).to(tl.int32)) != 0


@triton.jit
def _round_narrow(hi, lo, r, MODE: tl.constexpr, T: tl.constexpr):
    """:func:`_narrow_full`, with the general algorithm run (for the whole block) only
    when some element of the block needs it."""
    res, ok = _narrow_fast(hi, lo, r, MODE, T)
    if _any_bad(ok):
        res = _narrow_full(hi, lo, r, MODE, T)
    return res


@triton.jit
def _step_narrow(acc, a, b, r, MODE: tl.constexpr, T: tl.constexpr):
    """One k-step of a binary32 contraction, ``RND(acc + RND(a·b))`` (the add with the
    bits ``rot(r)``), with one block-uniform test: the fast path for both roundings; if
    either rejects an element of the block, both are redone on the full path (the
    ``_step32`` scheme of the numba kernels)."""
    x = a * b  # exact
    p, okp = _narrow_fast(x, x * 0.0, r, MODE, T)
    s, e = _two_sum(acc, p)
    v, oks = _narrow_fast(s, e, _rot(r), MODE, T)
    if _any_bad(okp & oks):
        p = _narrow_full(x, x * 0.0, r, MODE, T)
        s, e = _two_sum(acc, p)
        v = _narrow_full(s, e, _rot(r), MODE, T)
    return v


@triton.jit
def _add_narrow(a, b, r, MODE: tl.constexpr, T: tl.constexpr):
    """``numvar.rounding.kernels.add_f32`` (binary32 values in float64)."""
    s, e = _two_sum(a, b)
    return _round_narrow(s, e, r, MODE, T)


@triton.jit
def _mul_narrow(a, b, r, MODE: tl.constexpr, T: tl.constexpr):
    """``numvar.rounding.kernels.mul_f32``: the float64 product is exact."""
    return _round_narrow(a * b, a * 0.0, r, MODE, T)


@triton.jit
def _round_wide(hi, lo, k, r, MODE: tl.constexpr, T: tl.constexpr):
    return _round_core(hi, lo, k, r, MODE, T, 53, -1022, 1023)


@triton.jit
def _fma_narrow(acc, a, b, r, MODE: tl.constexpr, T: tl.constexpr):
    """``numvar.rounding.kernels.fma_f32``: ``RND(a·b + acc)`` in one rounding, the float64
    product exact, the sum's TwoSum residual carried."""
    s, e = _two_sum(a * b, acc)
    return _round_narrow(s, e, r, MODE, T)


@triton.jit
def _add_wide(a, b, r, MODE: tl.constexpr, T: tl.constexpr):
    """``numvar.rounding.kernels.add_f64`` (``wide_binary`` OP_ADD): TwoSum; a finite sum
    overflowing to inf is redone on the halves, one power of two down (k = -1)."""
    s, e = _two_sum(a, b)
    ovf = not_(tl.abs(s) < _INF) & (tl.abs(a) < _INF) & (tl.abs(b) < _INF)
    s2, e2 = _two_sum(0.5 * a, 0.5 * b)
    k = tl.where(ovf, -1, 0).to(tl.int64)
    return _round_wide(tl.where(ovf, s2, s), tl.where(ovf, e2, e), k, r, MODE, T)


@triton.jit
def _mul_wide(a, b, r, MODE: tl.constexpr, T: tl.constexpr):
    """``numvar.rounding.kernels.mul_f64`` (``wide_binary`` OP_MUL): TwoProduct in
    [2**-480, 2**480], else on the operands scaled to [1, 2) with k = -(ea + eb); zero,
    inf and NaN operands give the plain product."""
    finite = (tl.abs(a) < _INF) & (tl.abs(b) < _INF) & (a != 0) & (b != 0)
    aa = tl.abs(a)
    ab = tl.abs(b)
    safe = (aa >= _SAFE_LO) & (aa <= _SAFE_HI) & (ab >= _SAFE_LO) & (ab <= _SAFE_HI)
    ea = _exponent(tl.where(finite, aa, 1.0))
    eb = _exponent(tl.where(finite, ab, 1.0))
    s1, e1 = _two_prod(a, b)
    s2, e2 = _two_prod(_scale2(a, -ea), _scale2(b, -eb))
    k = tl.where(safe, 0, -(ea + eb))
    hi = tl.where(finite, tl.where(safe, s1, s2), 1.0)
    lo = tl.where(finite, tl.where(safe, e1, e2), 0.0)
    res = _round_wide(hi, lo, tl.where(finite, k, 0), r, MODE, T)
    return tl.where(finite, res, a * b)


@triton.jit
def _add(a, b, r, MODE: tl.constexpr, T: tl.constexpr, WIDE: tl.constexpr):
    if WIDE:
        res = _add_wide(a, b, r, MODE, T)
    else:
        res = _add_narrow(a, b, r, MODE, T)
    return res


@triton.jit
def _mul(a, b, r, MODE: tl.constexpr, T: tl.constexpr, WIDE: tl.constexpr):
    if WIDE:
        res = _mul_wide(a, b, r, MODE, T)
    else:
        res = _mul_narrow(a, b, r, MODE, T)
    return res


@triton.jit
def _step(acc, a, b, r, MODE: tl.constexpr, T: tl.constexpr, WIDE: tl.constexpr):
    """``RND(acc + RND(a·b))``: the product with the bits ``r``, the add with ``rot(r)``."""
    if WIDE:
        res = _add_wide(acc, _mul_wide(a, b, r, MODE, T), _rot(r), MODE, T)
    else:
        res = _step_narrow(acc, a, b, r, MODE, T)
    return res


# ----------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["BA", "BB", "M", "N", "K", "key"])
def _contract_kernel(a_ptr, b_ptr, out_ptr, BA, BB, M, N, K, key, MODE: tl.constexpr,
                     T: tl.constexpr, WIDE: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, FMA: tl.constexpr = False):
    pid = tl.program_id(0)
    tm = tl.cdiv(M, BM)
    tn = tl.cdiv(N, BN)
    bo = pid // (tm * tn)
    rest = pid - bo * (tm * tn)
    i0 = (rest // tn) * BM
    j0 = (rest - (rest // tn) * tn) * BN
    i = i0 + tl.arange(0, BM)
    j = j0 + tl.arange(0, BN)
    mi = i < M
    mj = j < N
    i64 = i.to(tl.int64)
    j64 = j.to(tl.int64)
    bo64 = bo.to(tl.int64)
    a_ptrs = a_ptr + ((bo64 % BA) * M + i64) * K  # a[bo % BA, i, k], k = 0
    b_ptrs = b_ptr + (bo64 % BB) * K * N + j64  # b[bo % BB, k, j], k = 0
    ukey = key.to(tl.uint64)
    line = ((bo64 * M + i64) * K).to(tl.uint64)  # line of term (bo, i, k)
    jg = j64.to(tl.uint64)
    av = tl.load(a_ptrs, mask=mi, other=0.0).to(tl.float64)
    bv = tl.load(b_ptrs, mask=mj, other=0.0).to(tl.float64)
    r = _term(_bits64(ukey, line)[:, None], jg[None, :])
    acc = _mul(av[:, None], bv[None, :], r, MODE, T, WIDE)
    for k in range(1, K):
        a_ptrs += 1
        b_ptrs += N
        line += 1
        av = tl.load(a_ptrs, mask=mi, other=0.0).to(tl.float64)
        bv = tl.load(b_ptrs, mask=mj, other=0.0).to(tl.float64)
        r = _term(_bits64(ukey, line)[:, None], jg[None, :])
        if FMA:
            acc = _fma_narrow(acc, av[:, None], bv[None, :], r, MODE, T)
        else:
            acc = _step(acc, av[:, None], bv[None, :], r, MODE, T, WIDE)
    optr = out_ptr + (bo64 * M + i64)[:, None] * N + j64[None, :]
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=mi[:, None] & mj[None, :])


@triton.jit(do_not_specialize=["K", "M", "key"])
def _scan_kernel(x_ptr, out_ptr, K, M, key, MODE: tl.constexpr, T: tl.constexpr,
                 WIDE: tl.constexpr, MUL: tl.constexpr, CUMULATIVE: tl.constexpr,
                 BLOCK: tl.constexpr):
    m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mm = m < M
    m64 = m.to(tl.int64)
    ukey = key.to(tl.uint64)
    acc = tl.load(x_ptr + m64, mask=mm, other=0.0).to(tl.float64)
    if CUMULATIVE:
        tl.store(out_ptr + m64, acc.to(out_ptr.dtype.element_ty), mask=mm)
    q = m64
    for k in range(1, K):
        q += M
        xv = tl.load(x_ptr + q, mask=mm, other=0.0).to(tl.float64)
        r = _bits64(ukey, q.to(tl.uint64))
        if MUL:
            acc = _mul(acc, xv, r, MODE, T, WIDE)
        else:
            acc = _add(acc, xv, r, MODE, T, WIDE)
        if CUMULATIVE:
            tl.store(out_ptr + q, acc.to(out_ptr.dtype.element_ty), mask=mm)
    if not CUMULATIVE:
        tl.store(out_ptr + m64, acc.to(out_ptr.dtype.element_ty), mask=mm)


# ---------------------------------------------------------------------------- wrappers
def _check(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name}: float32 or float64 tensor expected, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")


def _bits_ok(dtype: torch.dtype, t: int) -> int:
    top = 53 if dtype == torch.float64 else 24
    if not 1 <= int(t) <= top:
        raise ValueError(f"t must be in [1, {top}] for {dtype}, got {t}")
    return int(t)


def contract(a: torch.Tensor, b: torch.Tensor, key: int, mode: int, t: int,
             contraction: str = "separate") -> torch.Tensor:
    """Batched randomly rounded product of ``a`` (BA, M, K) and ``b`` (BB, K, N) on their
    device: :func:`numvar.instrument.kernels.contract` (same batch rule, order, bits).
    ``contraction="fma"`` (one rounding per multiply-add) takes binary32 tensors only."""
    if contraction not in ("separate", "fma"):
        raise ValueError(f"contraction must be separate or fma; got {contraction!r}")
    if contraction == "fma" and a.dtype == torch.float64:
        raise TypeError("contraction='fma' on binary64 has no Triton kernel: use the numba "
                        "kernel (numvar.instrument.kernels.contract)")
    _check(a, "a")
    _check(b, "b")
    if a.dtype != b.dtype:
        raise TypeError("a and b must have the same dtype")
    if a.device != b.device:
        raise ValueError("a and b must be on the same device")
    if a.dim() != 3 or b.dim() != 3 or a.shape[2] != b.shape[1] or a.shape[2] < 1:
        raise ValueError(f"bad shapes for contract: {tuple(a.shape)} @ {tuple(b.shape)}")
    BA, M, Kd = a.shape
    BB, _, N = b.shape
    BO = max(BA, BB)
    if BO % BA or BO % BB:
        raise ValueError(f"batch sizes {BA} and {BB} are incompatible")
    t = _bits_ok(a.dtype, t)
    out = torch.empty((BO, M, N), dtype=a.dtype, device=a.device)
    if out.numel():
        a, b = a.contiguous(), b.contiguous()
        grid = (BO * triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        _contract_kernel[grid](a, b, out, BA, BB, M, N, Kd, int(key) & ((1 << 64) - 1),
                               MODE=int(mode), T=t, WIDE=a.dtype == torch.float64,
                               BM=BLOCK_M, BN=BLOCK_N, FMA=contraction == "fma", **_OPTS)
    return out


def scan(x: torch.Tensor, key: int, mode: int, t: int, *, mul: bool = False,
         cumulative: bool = False) -> torch.Tensor:
    """Randomly rounded sum (or product, ``mul``) of ``x`` (K, M) along axis 0 on its
    device: :func:`numvar.instrument.kernels.scan` (same order, same bits). Returns
    (1, M), or (K, M) with ``cumulative``."""
    _check(x, "x")
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"scan needs a (K>=1, M) tensor, got {tuple(x.shape)}")
    t = _bits_ok(x.dtype, t)
    Kd, M = x.shape
    out = torch.empty((Kd if cumulative else 1, M), dtype=x.dtype, device=x.device)
    if M:
        x = x.contiguous()
        grid = (triton.cdiv(M, BLOCK_SCAN),)
        _scan_kernel[grid](x, out, Kd, M, int(key) & ((1 << 64) - 1), MODE=int(mode), T=t,
                           WIDE=x.dtype == torch.float64, MUL=bool(mul),
                           CUMULATIVE=bool(cumulative), BLOCK=BLOCK_SCAN, **_OPTS)
    return out
