"""numba kernels of the stochastic arithmetic core.

Scalar functions that other parts' kernels call (the common ones are
``@njit(inline="always")``: their fast paths inline into the caller, the general
algorithm ``round_core`` stays out of line), plus the parallel array kernels used by
:mod:`numvar.rounding`, one per op family (``k_round``, ``k_binary``, ``k_sqrt``,
``k_fma``; the first two dispatch to a binary64 and a narrow-format kernel, so that each
compiles only its own code). ``mode`` and the virtual precision ``t`` are runtime integers.

Rounding model (see ``numvar.rounding`` for the full statement)
----------------------------------------------------------------
A value is given exactly as ``x = (hi + lo) * 2**-k`` (float64 ``hi``, ``lo``; ``k`` an
integer scale, 0 except inside the binary64 ops near under/overflow). The target grid
at ``t`` significand bits has, for ``|x|`` in ``[2**e, 2**(e+1))``, the spacing
``u = 2**max(e - t + 1, emin - p + 1)``: ``t`` bits relative precision, never finer
than the format's subnormal spacing (Verificarlo's convention). ``a <= x < b = a + u``
are the neighbours; ``b >= 2**(emax+1)`` means overflow to ``inf``.

* SR: ``b`` with probability ``floor(d * 2**53) / 2**53``, ``d = (x - a)/u`` (53 random
  bits; ``d`` is exact when ``lo == 0``, else within 2**-53 relative). Exact values stay.
* random: ``b`` or ``a`` with probability 1/2 each (top random bit); exact values stay.
* ieee: round to nearest, ties to even on the t-bit grid (exact tie detection).
* UD: ``r`` = ieee result; if ``r`` is finite and non-zero, the next grid value above
  or below ``r`` in magnitude (top random bit). ``inf``, ``nan`` and exact zeros pass.
  UD at zero: when ``r`` is 0 but ``x`` is not exactly 0, the step up gives
  ``sign(x)`` times the smallest grid value and the step down keeps ``sign(x)·0`` (top
  random bit): an underflowing result is perturbed like any other, without a sign flip.
* up / down / zero: toward +inf / -inf / 0 (deterministic); farthest (Verrou's): the
  neighbour that ieee does not pick; exact values stay in all four.
* Formats (``round_gen``): a largest finite value ``maxv`` (e4m3fn: 448), an overflow
  rule (inf, saturate, nan), no subnormals (flush), no negative zero (fnuz).

Randomness: ``bits64(key, j)`` is the splitmix64 output ``mix64(key + (j+1)*γ)``
(Steele, Lea & Flood 2014; constants of Vigna's ``splitmix64.c``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from .. import _numba_compile  # noqa: F401  (numba's IR copies in linear time: compile time)

MODE_IEEE, MODE_SR, MODE_UD, MODE_RANDOM = 0, 1, 2, 3
MODE_UP, MODE_DOWN, MODE_ZERO, MODE_FARTHEST = 4, 5, 6, 7
_MODE_CODES = {"ieee": MODE_IEEE, "sr": MODE_SR, "ud": MODE_UD, "random": MODE_RANDOM,
               "up": MODE_UP, "down": MODE_DOWN, "zero": MODE_ZERO, "farthest": MODE_FARTHEST}
#: every rounding mode by name, in code order
MODE_NAMES = tuple(_MODE_CODES)

# format flags of round_gen: the overflow rule in the low two bits, then flush / zero
OVF_INF, OVF_SATURATE, OVF_NAN = 0, 1, 2
FLAG_FLUSH = 4  # no subnormals
FLAG_UNSIGNED_ZERO = 8  # no negative zero (torch's fnuz formats)

# (p, emin, emax) of the targets
FMT_F32 = (24, -126, 127)
FMT_F64 = (53, -1022, 1023)
FMT_BF16 = (8, -126, 127)
FMT_F16 = (11, -14, 15)

# op codes of the binary kernel
OP_ADD, OP_SUB, OP_MUL, OP_DIV = 0, 1, 2, 3

GAMMA = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB

_G = np.uint64(GAMMA)
_M1 = np.uint64(MIX1)
_M2 = np.uint64(MIX2)
_U1 = np.uint64(1)
_U11 = np.uint64(11)
_U63 = np.uint64(63)
_U0 = np.uint64(0)
_EXPMASK = np.uint64(0x7FF)
_MANT = np.uint64((1 << 52) - 1)
_TWO53 = 9007199254740992.0
_TWO64 = 18446744073709551616.0
_SPLIT = 134217729.0  # 2**27 + 1 (Veltkamp)


def mode_code(mode: str) -> int:
    """Integer code of a mode name ("ieee" 0, "sr" 1, "ud" 2, "random" 3, "up" 4,
    "down" 5, "zero" 6, "farthest" 7)."""
    try:
        return _MODE_CODES[mode]
    except KeyError:
        from ..errors import RoundingError

        raise RoundingError(f"unknown rounding mode {mode!r}; expected one of "
                            f"{tuple(_MODE_CODES)}") from None


@intrinsic
def _f64_bits(typingctx, x):
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint64))

    return types.uint64(types.float64), codegen


@intrinsic
def _bits_f64(typingctx, x):
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(types.uint64), codegen


@intrinsic
def wide_vectors(typingctx):
    """Ask LLVM for 512-bit vectors in the function that calls this (no code emitted).

    LLVM's tuning for Intel server CPUs prefers 256-bit vectors for auto-vectorised loops;
    the function attribute ``"prefer-vector-width"="512"`` lifts that for one function
    (measured on an AVX-512 Xeon: the SR contraction loop 0.99 -> 1.35 Gterm/s). CPUs
    without AVX-512 ignore it. Results do not depend on the vector width (integer and
    IEEE operations only, no contraction into FMA). If llvmlite ever refuses the
    attribute, nothing is added and the loops keep LLVM's default width."""

    def codegen(context, builder, signature, args):
        try:
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        except Exception:  # pragma: no cover - depends on llvmlite internals
            pass
        return context.get_dummy_value()

    return types.void(), codegen


@njit(inline="always", cache=True, error_model="numpy")
def mix64(z):
    """splitmix64 finalizer (uint64 -> uint64, wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(inline="always", cache=True, error_model="numpy")
def bits64(key, index):
    """64 random bits for element ``index`` of the call with ``key``."""
    return mix64(weyl64(key, index))


@njit(cache=True, error_model="numpy")
def keys64(base, counter, n):  # pragma: no cover - compiled
    """``bits64(base, counter + i)`` for i = 0 .. n−1 (uint64): the next ``n`` keys of a
    stream whose Weyl base is ``base`` and position ``counter``
    (:meth:`numvar.rounding._stream.Stream.keys`)."""
    out = np.empty(n, np.uint64)
    for i in range(n):
        out[i] = bits64(base, counter + np.uint64(i))
    return out


@njit(inline="always", cache=True, error_model="numpy")
def weyl64(key, index):
    """The Weyl value ``key + (index + 1)·γ`` (mod 2**64) that :func:`bits64` mixes. A
    vectorised loop over consecutive indices starts from its first element's value and
    steps it by γ (``mix64(z)``, then ``z += γ``): the same bits without a 64-bit
    multiply per element (``numvar.instrument.kernels._weyl``)."""
    return np.uint64(key) + (np.uint64(index) + _U1) * _G


@njit(inline="always", cache=True, error_model="numpy")
def pow2(k):
    """2.0**k for integer -1074 <= k <= 1023, built from the bit pattern (exact)."""
    if k >= -1022:
        return _bits_f64(np.uint64(k + 1023) << np.uint64(52))
    return _bits_f64(_U1 << np.uint64(k + 1074))


@njit(inline="always", cache=True, error_model="numpy")
def exponent(h):
    """floor(log2(h)) for finite h > 0 (subnormals included)."""
    be = np.int64(_f64_bits(h) >> np.uint64(52))
    if be == 0:
        return np.int64(_f64_bits(h * _TWO64) >> np.uint64(52)) - 1023 - 64
    return be - 1023


@njit(cache=True, error_model="numpy")
def scale2(x, n):
    """x * 2**n, exact whenever the result is representable (n any integer)."""
    while n > 1000:
        x = x * pow2(1000)
        n -= 1000
    while n < -1000:
        x = x * pow2(-1000)
        n += 1000
    return x * pow2(n)


@njit(inline="always", cache=True, error_model="numpy")
def two_sum(a, b):
    """Knuth's TwoSum: s = RN(a+b), e = a+b-s exactly (barring overflow)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@njit(inline="always", cache=True, error_model="numpy")
def _split(a):
    c = _SPLIT * a
    ah = c - (c - a)
    return ah, a - ah


@njit(inline="always", cache=True, error_model="numpy")
def two_prod(a, b):
    """Dekker's TwoProduct (Veltkamp splitting): p = RN(a*b), e = a*b-p exactly when
    |a|, |b| < 2**995 and the error does not underflow (|a*b| >= 2**-969)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


@njit(inline="always", cache=True, error_model="numpy")
def _odd(q):
    return q - 2.0 * math.floor(0.5 * q) == 1.0


@njit(inline="always", cache=True, error_model="numpy")
def _spacing_fmt(e_true, t, sub, lowest):
    """_spacing_exp with a flush floor: below the binade ``lowest`` (a format without
    subnormals: its emin) the spacing is 2**lowest (the grid there is {0, 2**emin})."""
    if e_true < lowest:
        return lowest
    s = e_true - t + 1
    return s if s > sub else sub


@njit(inline="always", cache=True, error_model="numpy")
def max_finite(t, emax, maxv):
    """The largest finite value of the format at t bits: ``maxv`` when given (> 0), else
    (2 - 2**(1-t)) * 2**emax."""
    if maxv > 0.0:
        return maxv
    return pow2(emax) * (2.0 - pow2(1 - t))


@njit(inline="always", cache=True, error_model="numpy")
def _beyond(R, eR, k, emax, maxv):
    """Whether the grid value R * 2**-k (R > 0 finite, eR = exponent(R)) lies beyond the
    format's largest finite value."""
    if eR - k > emax:
        return True
    if maxv > 0.0:
        return (R if k == 0 else scale2(R, -k)) > maxv
    return False


@njit(cache=True, error_model="numpy")
def round_core(hi, lo, k, mode, t, p, emin, emax, r):
    """round_core3 with lo2 = 0."""
    return round_gen(hi, lo, 0.0, k, mode, t, p, emin, emax, 0.0, 0, r)


@njit(cache=True, error_model="numpy")
def round_core3(hi, lo, lo2, k, mode, t, p, emin, emax, r):
    """round_gen for an IEEE format (overflow to inf, subnormals, signed zeros)."""
    return round_gen(hi, lo, lo2, k, mode, t, p, emin, emax, 0.0, 0, r)


@njit(cache=True, error_model="numpy")
def round_gen(hi, lo, lo2, k, mode, t, p, emin, emax, maxv, flags, r):
    """Round x = (hi + lo + lo2) * 2**-k to the t-bit grid of the format (p, emin, emax,
    ``maxv``, ``flags``); lo2 is a tiny term that only decides ties and the sign of the
    error. ``maxv`` > 0: the largest finite value (else (2 - 2**(1-t)) * 2**emax; needs
    k == 0 or a power-of-two-free overflow test); ``flags``: the overflow rule
    (``flags & 3``: OVF_INF, OVF_SATURATE, OVF_NAN), FLAG_FLUSH (no subnormals: the grid
    below 2**emin is {0, 2**emin}), FLAG_UNSIGNED_ZERO (-0 becomes +0).

    Requires sign(hi) == sign(x) and |lo| below the grid spacing at hi (true of every
    EFT output here). Returns a float64 on the target grid (or +-inf / nan / +-0).

    Modes: ieee (nearest even), sr, ud, random (module doc); up / down (toward +inf /
    -inf), zero (toward 0), farthest (the neighbour that round-to-nearest does not pick;
    exact values stay). Overflow (a result beyond the largest finite value): the modes
    that round toward zero in magnitude (zero; down for x > 0; up for x < 0) give the
    largest finite value, as IEEE 754; every other mode applies the format's rule (inf,
    the largest finite value, NaN). UD at zero: an inexact x whose nearest value is 0
    becomes sign(x) * (the smallest grid value) or sign(x) * 0 with probability 1/2 each
    (UD steps one grid point away from the round-to-nearest result; below 0 in magnitude
    there is no grid point, so the step down keeps 0). Exact zeros stay.
    """
    ovf = flags & 3
    if not (abs(hi) < np.inf):
        if hi != hi or ovf == OVF_INF:
            return hi  # nan stays nan, +-inf stays
        if ovf == OVF_NAN:
            return np.nan
        m = max_finite(t, emax, maxv)
        return -m if hi < 0.0 else m
    if hi == 0.0:
        return 0.0 if (flags & FLAG_UNSIGNED_ZERO) != 0 else hi
    neg = hi < 0.0
    H = -hi if neg else hi
    L = -lo if neg else lo
    flush = (flags & FLAG_FLUSH) != 0
    lowest = emin if flush else -(1 << 30)
    sub = emin - p + 1
    top = (r >> _U63) == _U1
    e = exponent(H)
    ue_s = _spacing_fmt(e - k, t, sub, lowest) + k
    if ue_s > 1023:
        # |x| far below the smallest grid value (x inexact): rounding up gives it
        if mode == MODE_RANDOM or mode == MODE_UD:
            up = top
        else:
            up = mode == MODE_FARTHEST or (mode == MODE_UP and not neg) or \
                (mode == MODE_DOWN and neg)
        v = pow2(emin if flush else sub) if up else 0.0
        if v == 0.0 and (flags & FLAG_UNSIGNED_ZERO) != 0:
            return 0.0
        return -v if neg else v
    u = pow2(ue_s)
    A = math.floor(H / u) * u
    L2 = -lo2 if neg else lo2
    D = H - A
    s, ee = two_sum(D, L)
    ee = ee + L2
    if A > 0.0 and (s < 0.0 or (s == 0.0 and ee < 0.0)):
        # x lies below A: step one grid point down (finer spacing below a power of two)
        ea = exponent(A)
        if A == pow2(ea):
            u = pow2(_spacing_fmt(ea - k - 1, t, sub, lowest) + k)
        A = A - u
        D = H - A
        s, ee = two_sum(D, L)
        ee = ee + L2
    elif s > u or (s == u and ee >= 0.0):
        A = A + u
        D = H - A
        s, ee = two_sum(D, L)
        ee = ee + L2
        u = pow2(_spacing_fmt(exponent(A) - k, t, sub, lowest) + k)
    exact = s == 0.0 and ee == 0.0
    R = A
    if mode == MODE_SR:
        if not exact:
            if np.float64(r >> _U11) + 1.0 <= (s / u) * _TWO53:
                R = A + u
    elif mode == MODE_RANDOM:
        if not exact and top:
            R = A + u
    elif mode == MODE_UP or mode == MODE_DOWN:
        if not exact and (mode == MODE_UP) != neg:
            R = A + u
    elif mode != MODE_ZERO:
        s2 = 2.0 * s  # exact; u/2 could underflow at the subnormal spacing
        up = s2 > u or (s2 == u and (ee > 0.0 or (ee == 0.0 and _odd(A / u))))
        if mode == MODE_FARTHEST and not exact:
            up = not up
        if up:
            R = A + u
        if mode == MODE_UD:
            if R != 0.0:
                eR = exponent(R)
                if not _beyond(R, eR, k, emax, maxv):
                    if top:
                        R = R + pow2(_spacing_fmt(eR - k, t, sub, lowest) + k)
                    elif R == pow2(eR):
                        R = R - pow2(_spacing_fmt(eR - k - 1, t, sub, lowest) + k)
                    else:
                        R = R - pow2(_spacing_fmt(eR - k, t, sub, lowest) + k)
            elif not exact and top:
                R = u  # UD at zero (docstring)
    if R != 0.0 and R < np.inf and _beyond(R, exponent(R), k, emax, maxv):
        if mode == MODE_ZERO or (mode == MODE_DOWN and not neg) or (mode == MODE_UP and neg):
            R = max_finite(t, emax, maxv)
        elif ovf == OVF_INF:
            R = np.inf
        elif ovf == OVF_SATURATE:
            R = max_finite(t, emax, maxv)
        else:
            return np.nan
    elif k != 0:
        R = scale2(R, -k)
    if R == 0.0 and (flags & FLAG_UNSIGNED_ZERO) != 0:
        return 0.0
    return -R if neg else R


@njit(inline="always", cache=True, error_model="numpy")
def _fast_bits(b, mode, t, p, emin, emax, r):
    """The integer version of round_core on a float64 bit pattern b (lo == 0, k == 0,
    t <= 24, exponent of b in [emin, emax]); a result whose exponent exceeds emax is
    left for the caller (round_bits maps it to inf, the kernels recompute it)."""
    nb = np.uint64(53 - t)
    one = _U1 << nb
    mask = one - _U1
    if mode == MODE_SR:
        # up iff floor(d * 2**53) >= (r >> 11) + 1: add the complement of the top 53-t
        # random bits below the kept bits, truncate
        return (b + ((~r) >> np.uint64(11 + t))) & ~mask
    if mode == MODE_RANDOM:
        if (b & mask) != _U0:
            return (b & ~mask) + ((r >> _U63) << nb)
        return b
    # round to nearest even: the integer significand's last bit (always 1 when t == 1)
    lsb = _U1 if t == 1 else (b >> nb) & _U1
    if mode >= MODE_UP:
        # directed modes and farthest: truncate (toward zero), or add one unit (away)
        tr = b & ~mask
        if (b & mask) == _U0 or mode == MODE_ZERO:
            return tr
        neg = (b >> _U63) == _U1
        if mode == MODE_UP:
            return tr if neg else tr + one
        if mode == MODE_DOWN:
            return tr + one if neg else tr
        rn = (b + ((one >> _U1) - _U1) + lsb) & ~mask
        return tr + one if rn == tr else tr  # farthest: the neighbour RN does not pick
    b = (b + ((one >> _U1) - _U1) + lsb) & ~mask
    if mode == MODE_UD:
        be = np.int64((b >> np.uint64(52)) & _EXPMASK)
        if be <= 1023 + emax:
            if (r >> _U63) == _U1:
                b = b + one
            elif (b & _MANT) == _U0 and be == 1023 + emin and t == p:
                b = b - (one << _U1)  # below 2**emin: the subnormal spacing
            else:
                b = b - one  # below a power of two this is half a unit (lower binade)
    return b


@njit(inline="always", cache=True, error_model="numpy")
def round_bits(hi, mode, t, p, emin, emax, r):
    """round_core for lo == 0, k == 0, t <= 24 and hi with exponent in [emin, emax], by
    integer operations on the float64 bit pattern (identical results)."""
    b = _fast_bits(_f64_bits(hi), mode, t, p, emin, emax, r)
    if np.int64((b >> np.uint64(52)) & _EXPMASK) > 1023 + emax:
        return -np.inf if hi < 0.0 else np.inf
    return _bits_f64(b)


@njit(inline="always", cache=True, error_model="numpy")
def round_narrow(hi, lo, mode, t, p, emin, emax, r):
    """Round hi+lo (float64, hi = RN64(hi+lo)) to a format of p <= 24 bits at t bits:
    the integer fast path (round_bits) when lo == 0 and hi is in the normal range,
    else round_core."""
    if lo == 0.0:
        be = np.int64((_f64_bits(hi) >> np.uint64(52)) & _EXPMASK)
        if be >= 1023 + emin and be <= 1023 + emax:
            return round_bits(hi, mode, t, p, emin, emax, r)
    return round_core(hi, lo, 0, mode, t, p, emin, emax, r)


@njit(inline="always", cache=True, error_model="numpy")
def _rn64_fast(hi, lo, mode, r):
    """round_core for binary64 at t = 53 with hi = RN64(hi + lo) normal: the result and
    True, or (0, False) when hi is not a normal float (then use round_core)."""
    b = _f64_bits(hi)
    be = np.int64((b >> np.uint64(52)) & _EXPMASK)
    if be < 1 or be > 2046 or mode > MODE_RANDOM:
        return 0.0, False
    if mode == MODE_IEEE or (lo == 0.0 and mode != MODE_UD):
        return hi, True
    neg = hi < 0.0
    H = -hi if neg else hi
    L = -lo if neg else lo
    u = pow2(be - 1023 - 52)
    if mode == MODE_UD:
        if (r >> _U63) == _U1:
            R = H + u
        elif (b & _MANT) == _U0 and be > 1:
            R = H - 0.5 * u
        else:
            R = H - u
    else:
        if L > 0.0:
            A = H
            sv = L
        else:
            if (b & _MANT) == _U0 and be > 1:
                u = 0.5 * u
            A = H - u
            sv, _e = two_sum(u, L)
        R = A
        if mode == MODE_SR:
            # sv / u * 2**53 as one exact scaling by a power of two (as round_core's
            # (s / u) * 2**53: the same correctly rounded value)
            ue = exponent(u)
            thr = sv * pow2(53 - ue) if ue >= -970 else (sv / u) * _TWO53
            if np.float64(r >> _U11) + 1.0 <= thr:
                R = A + u
        elif (r >> _U63) == _U1:
            R = A + u
    return (-R if neg else R), True


@njit(inline="always", cache=True, error_model="numpy")
def round_rn64(hi, lo, mode, t, r):
    """round_core for binary64 at t bits with hi = RN64(hi + lo) (TwoSum/TwoProduct
    output), with the _rn64_fast shortcut at t = 53 (identical results)."""
    if t == 53:
        v, ok = _rn64_fast(hi, lo, mode, r)
        if ok:
            return v
    return round_core(hi, lo, 0, mode, t, 53, -1022, 1023, r)


@njit(inline="always", cache=True, error_model="numpy")
def round_f32(hi, lo, mode, t, r):
    """Randomly round the exact value hi+lo (float64, hi = RN64(hi+lo)) to binary32 at t
    significand bits (t = 24: full precision)."""
    return np.float32(round_narrow(hi, lo, mode, t, 24, -126, 127, r))


@njit(inline="always", cache=True, error_model="numpy")
def round_f64(hi, lo, mode, t, r):
    """Randomly round hi+lo to binary64 at t bits; hi = RN(exact), lo = exact error."""
    return round_rn64(hi, lo, mode, t, r)


# ---------------------------------------------------------------- narrow-format ops
# Inputs are values of a format with p <= 24 (binary32, bfloat16, float16) as float64.
# Products are exact in float64; sums carry the TwoSum residual; div/sqrt carry the
# exact residual (Dekker TwoProduct), divided by b (resp. 2s): exact sign, 2**-53 rel.

@njit(inline="always", cache=True, error_model="numpy")
def _div_parts(a, b):
    q = a / b
    if q == 0.0 or not (abs(q) < np.inf) or not (abs(a) < np.inf) or not (abs(b) < np.inf):
        return q, 0.0
    ph, pl = two_prod(q, b)
    return q, ((a - ph) - pl) / b


@njit(inline="always", cache=True, error_model="numpy")
def _sqrt_parts(a):
    if not (a > 0.0) or not (a < np.inf):
        return math.sqrt(a) if a >= 0.0 else np.nan, 0.0
    s = math.sqrt(a)
    ph, pl = two_prod(s, s)
    return s, ((a - ph) - pl) / (2.0 * s)


@njit(inline="always", cache=True, error_model="numpy")
def narrow_binary(op, a, b, mode, t, p, emin, emax, r):
    x = np.float64(a)
    y = np.float64(b)
    if op == OP_ADD:
        s, e = two_sum(x, y)
    elif op == OP_SUB:
        s, e = two_sum(x, -y)
    elif op == OP_MUL:
        s, e = x * y, 0.0
    else:
        s, e = _div_parts(x, y)
    return round_narrow(s, e, mode, t, p, emin, emax, r)


@njit(inline="always", cache=True, error_model="numpy")
def narrow_sqrt(a, mode, t, p, emin, emax, r):
    s, e = _sqrt_parts(np.float64(a))
    return round_narrow(s, e, mode, t, p, emin, emax, r)


@njit(inline="always", cache=True, error_model="numpy")
def narrow_fma(a, b, c, mode, t, p, emin, emax, r):
    s, e = two_sum(np.float64(a) * np.float64(b), np.float64(c))
    return round_narrow(s, e, mode, t, p, emin, emax, r)


@njit(inline="always", cache=True, error_model="numpy")
def add_f32(a, b, mode, t, r):
    """RN-free binary32 a+b under ``mode`` at t bits (exact TwoSum residual)."""
    return np.float32(narrow_binary(OP_ADD, a, b, mode, t, 24, -126, 127, r))


@njit(inline="always", cache=True, error_model="numpy")
def mul_f32(a, b, mode, t, r):
    """binary32 a*b under ``mode`` (the float64 product is exact)."""
    return np.float32(narrow_binary(OP_MUL, a, b, mode, t, 24, -126, 127, r))


@njit(inline="always", cache=True, error_model="numpy")
def fma_f32(a, b, c, mode, t, r):
    """binary32 a*b+c with one rounding (exact product, TwoSum residual)."""
    return np.float32(narrow_fma(a, b, c, mode, t, 24, -126, 127, r))


# ---------------------------------------------------------------- binary64 ops
_SAFE_LO = 2.0 ** -480
_SAFE_HI = 2.0 ** 480
_FMA_LO = 2.0 ** -300
_FMA_HI = 2.0 ** 300
_STANDIN = 2.0 ** -200


@njit(inline="always", cache=True, error_model="numpy")
def _normal_in(x, lo, hi):
    ax = abs(x)
    return ax >= lo and ax <= hi


@njit(inline="always", cache=True, error_model="numpy")
def round_format(hi, lo, mode, t, p, emin, emax, maxv, flags, r):
    """Round hi+lo (float64, hi = RN64(hi+lo)) to any format: the integer fast path of
    round_narrow (p <= 24, lo == 0, hi normal and, without subnormals, above the lowest
    binade; a result beyond the largest finite value redone) or round_gen."""
    if lo == 0.0 and p <= 24:
        be = np.int64((_f64_bits(hi) >> np.uint64(52)) & _EXPMASK)
        lowb = 1023 + emin + (1 if (flags & FLAG_FLUSH) != 0 else 0)
        if be >= lowb and be <= 1023 + emax:
            b = _fast_bits(_f64_bits(hi), mode, t, p, emin, emax, r)
            v = _bits_f64(b)
            if np.int64((b >> np.uint64(52)) & _EXPMASK) <= 1023 + emax and \
                    (maxv == 0.0 or abs(v) <= maxv):
                return v
    return round_gen(hi, lo, 0.0, 0, mode, t, p, emin, emax, maxv, flags, r)


@njit(cache=True, error_model="numpy")
def format_binary(op, a, b, mode, t, p, emin, emax, maxv, flags, r):
    """a (op) b (float64 operands) rounded once to any format (p, emin, emax, maxv,
    flags: see round_gen): x = hi + lo exactly via TwoSum / TwoProduct / the division
    residual, scaled by a power of two near under/overflow; special results (0, inf,
    nan) follow the format's rules. binary64's uncommon cases come here too."""
    if op <= OP_SUB:
        bb = -b if op == OP_SUB else b
        s, e = two_sum(a, bb)
        if not (abs(s) < np.inf) and abs(a) < np.inf and abs(bb) < np.inf:
            s, e = two_sum(0.5 * a, 0.5 * bb)
            return round_gen(s, e, 0.0, -1, mode, t, p, emin, emax, maxv, flags, r)
        return round_format(s, e, mode, t, p, emin, emax, maxv, flags, r)
    finite = abs(a) < np.inf and abs(b) < np.inf and a != 0.0 and b != 0.0
    k = 0
    if op == OP_MUL:
        if not finite:
            return round_gen(a * b, 0.0, 0.0, 0, mode, t, p, emin, emax, maxv, flags, r)
        if _normal_in(a, _SAFE_LO, _SAFE_HI) and _normal_in(b, _SAFE_LO, _SAFE_HI):
            s, e = two_prod(a, b)
            return round_format(s, e, mode, t, p, emin, emax, maxv, flags, r)
        ea = exponent(abs(a))
        eb = exponent(abs(b))
        s, e = two_prod(scale2(a, -ea), scale2(b, -eb))
        k = -(ea + eb)
        return round_gen(s, e, 0.0, k, mode, t, p, emin, emax, maxv, flags, r)
    if not finite:
        return round_gen(a / b, 0.0, 0.0, 0, mode, t, p, emin, emax, maxv, flags, r)
    if _normal_in(a, _SAFE_LO, _SAFE_HI) and _normal_in(b, _SAFE_LO, _SAFE_HI):
        s, e = _div_parts(a, b)
    else:
        ea = exponent(abs(a))
        eb = exponent(abs(b))
        s, e = _div_parts(scale2(a, -ea), scale2(b, -eb))
        k = eb - ea
    return round_gen(s, _t53_residual(e, mode, t), 0.0, k, mode, t, p, emin, emax, maxv,
                     flags, r)


@njit(inline="always", cache=True, error_model="numpy")
def _t53_residual(e, mode, t):
    """The rounded residual of a division or square root as the decisions at t = 53 use
    it: the decisions of ieee/ud take the hardware-rounded result (the rounded residual
    could fake a tie, and a true tie is impossible there); farthest needs only its sign
    and non-zeroness (a quarter of it cannot fake a tie)."""
    if t == 53:
        if mode == MODE_IEEE or mode == MODE_UD:
            return 0.0
        if mode == MODE_FARTHEST:
            return 0.25 * e
    return e


@njit(cache=True, error_model="numpy")
def _wide_binary_rest(op, a, b, mode, t, r):
    """wide_binary's uncommon cases (overflowing sums, products outside the safe range,
    specials, division): format_binary on binary64."""
    return format_binary(op, a, b, mode, t, 53, -1022, 1023, 0.0, 0, r)


@njit(inline="always", cache=True, error_model="numpy")
def wide_binary(op, a, b, mode, t, r):
    """binary64 a (op) b: x = hi + lo exactly via TwoSum / TwoProduct / the division
    residual, scaled by a power of two near under/overflow. The common cases are
    inlined into the caller; the rest is out of line (_wide_binary_rest)."""
    if op <= OP_SUB:
        s, e = two_sum(a, -b if op == OP_SUB else b)
        if abs(s) < np.inf:
            return round_rn64(s, e, mode, t, r)
    elif op == OP_MUL and _normal_in(a, _SAFE_LO, _SAFE_HI) and _normal_in(b, _SAFE_LO, _SAFE_HI):
        s, e = two_prod(a, b)
        return round_rn64(s, e, mode, t, r)
    return _wide_binary_rest(op, a, b, mode, t, r)


@njit(cache=True, error_model="numpy")
def format_sqrt(a, mode, t, p, emin, emax, maxv, flags, r):
    """sqrt(a) (float64) rounded once to any format: s + r/(2s), exact residual r = a - s*s."""
    if not (a > 0.0) or not (a < np.inf):
        v = math.sqrt(a) if a >= 0.0 else np.nan
        return round_gen(v, 0.0, 0.0, 0, mode, t, p, emin, emax, maxv, flags, r)
    ea = exponent(a)
    h = ea // 2
    s, e = _sqrt_parts(scale2(a, -2 * h))
    return round_gen(s, _t53_residual(e, mode, t), 0.0, -h, mode, t, p, emin, emax, maxv,
                     flags, r)


@njit(cache=True, error_model="numpy")
def wide_sqrt(a, mode, t, r):
    """binary64 sqrt(a): format_sqrt on binary64."""
    return format_sqrt(a, mode, t, 53, -1022, 1023, 0.0, 0, r)


@njit(cache=True, error_model="numpy")
def _fma_parts(a, b, c):
    # x = a*b + c = H + L (L: the rounded exact error, sign exact)
    ph, pl = two_prod(a, b)
    s1, s2 = two_sum(ph, c)
    t1, t2 = two_sum(s2, pl)
    h, h2 = two_sum(s1, t1)
    if h == 0.0:
        return t2, 0.0, 0.0
    return h, h2, t2


@njit(cache=True, error_model="numpy")
def _fma_scaled(a, b, c):
    """(h, l, l2, m): a*b + c = (h + l + l2) * 2**m, decision-exact. a, b normalised to
    [1, 2); a term more than 2**-110 below the other is replaced by a same-signed
    stand-in 2**-200 (all decision thresholds are multiples of 2**-106 there)."""
    ea = exponent(abs(a))
    eb = exponent(abs(b))
    ec = exponent(abs(c))
    pe = ea + eb
    an = scale2(a, -ea)
    bn = scale2(b, -eb)
    if ec > pe + 110:
        sp = _STANDIN if (a < 0.0) == (b < 0.0) else -_STANDIN
        h, l = two_sum(scale2(c, -ec), sp)
        return h, l, 0.0, ec
    if pe > ec + 110:
        h, l, l2 = _fma_parts(an, bn, _STANDIN if c > 0.0 else -_STANDIN)
        return h, l, l2, pe
    m = pe if pe > ec else ec
    h, l, l2 = _fma_parts(an, scale2(bn, pe - m), scale2(c, -m))
    return h, l, l2, m


@njit(cache=True, error_model="numpy")
def format_fma(a, b, c, mode, t, p, emin, emax, maxv, flags, r):
    """a*b+c (float64) rounded once to any format. Exact error (TwoProduct + TwoSums)
    when |a|, |b|, |c| lie in [2**-300, 2**300]; otherwise after power-of-two scaling
    (_fma_scaled). Special results (0, inf, nan) follow the format's rules."""
    if not (abs(a) < np.inf and abs(b) < np.inf and abs(c) < np.inf) or \
            ((a == 0.0 or b == 0.0) and c == 0.0):
        return round_gen(a * b + c, 0.0, 0.0, 0, mode, t, p, emin, emax, maxv, flags, r)
    if a == 0.0 or b == 0.0:
        return round_gen(c, 0.0, 0.0, 0, mode, t, p, emin, emax, maxv, flags, r)
    if c == 0.0:
        return format_binary(OP_MUL, a, b, mode, t, p, emin, emax, maxv, flags, r)
    if (_normal_in(a, _FMA_LO, _FMA_HI) and _normal_in(b, _FMA_LO, _FMA_HI)
            and _normal_in(c, _FMA_LO, _FMA_HI)):
        h, l, l2 = _fma_parts(a, b, c)
        m = 0
    else:
        h, l, l2, m = _fma_scaled(a, b, c)
    if h == 0.0:  # exact cancellation: IEEE sign of zero
        return round_gen(a * b + c, 0.0, 0.0, 0, mode, t, p, emin, emax, maxv, flags, r)
    return round_gen(h, l, l2, -m, mode, t, p, emin, emax, maxv, flags, r)


@njit(cache=True, error_model="numpy")
def wide_fma(a, b, c, mode, t, r):
    """binary64 a*b+c, one rounding: format_fma on binary64."""
    return format_fma(a, b, c, mode, t, 53, -1022, 1023, 0.0, 0, r)


#: op codes of k_format beyond the binary ones
KIND_SQRT, KIND_FMA, KIND_ROUND, KIND_ROUND_LO = 4, 5, 6, 7


@njit(cache=True, parallel=True, error_model="numpy")
def k_format(kind, a, b, c, out, t, p, emin, emax, maxv, flags, mode, key):
    """Any format (p, emin, emax, maxv, flags; round_gen): out[j] = a[j] (op) b[j]
    (kind OP_ADD..OP_DIV), sqrt(a[j]) (KIND_SQRT), a[j]*b[j]+c[j] (KIND_FMA), or the
    rounding of a[j] (KIND_ROUND) or of a[j] + b[j] (KIND_ROUND_LO: renormalised by
    TwoSum where b[j] != 0), rounded once with bits64(key, j). float64 1-D arrays."""
    key = np.uint64(key)
    for j in prange(out.size):
        r = bits64(key, j)
        if kind <= OP_DIV:
            out[j] = format_binary(kind, a[j], b[j], mode, t, p, emin, emax, maxv, flags, r)
        elif kind == KIND_SQRT:
            out[j] = format_sqrt(a[j], mode, t, p, emin, emax, maxv, flags, r)
        elif kind == KIND_FMA:
            out[j] = format_fma(a[j], b[j], c[j], mode, t, p, emin, emax, maxv, flags, r)
        else:
            h = a[j]
            lo = 0.0
            if kind == KIND_ROUND_LO and b[j] != 0.0:
                h, lo = two_sum(h, b[j])
            out[j] = round_format(h, lo, mode, t, p, emin, emax, maxv, flags, r)


@njit(inline="always", cache=True, error_model="numpy")
def add_f64(a, b, mode, t, r):
    """binary64 a+b under ``mode`` at t bits (exact TwoSum error)."""
    return wide_binary(OP_ADD, a, b, mode, t, r)


@njit(inline="always", cache=True, error_model="numpy")
def mul_f64(a, b, mode, t, r):
    """binary64 a*b under ``mode`` at t bits (exact TwoProduct error)."""
    return wide_binary(OP_MUL, a, b, mode, t, r)


@njit(cache=True, error_model="numpy")
def fma_f64(a, b, c, mode, t, r):
    """binary64 a*b+c, one rounding under ``mode`` at t bits."""
    return wide_fma(a, b, c, mode, t, r)


# ---------------------------------------------------------------- out-of-line wrappers
# The scalar functions above are inlined (numba IR) into callers; the array kernels call
# these compiled-once wrappers instead, which keeps cold compilation short.

@njit(cache=True, error_model="numpy")
def call_round_narrow(hi, lo, mode, t, p, emin, emax, r):
    return round_narrow(hi, lo, mode, t, p, emin, emax, r)


@njit(cache=True, error_model="numpy")
def call_round_rn64(hi, lo, mode, t, r):
    return round_rn64(hi, lo, mode, t, r)


@njit(cache=True, error_model="numpy")
def call_narrow_binary(op, a, b, mode, t, p, emin, emax, r):
    return narrow_binary(op, a, b, mode, t, p, emin, emax, r)


@njit(cache=True, error_model="numpy")
def call_narrow_sqrt(a, mode, t, p, emin, emax, r):
    return narrow_sqrt(a, mode, t, p, emin, emax, r)


@njit(cache=True, error_model="numpy")
def call_narrow_fma(a, b, c, mode, t, p, emin, emax, r):
    return narrow_fma(a, b, c, mode, t, p, emin, emax, r)


@njit(cache=True, error_model="numpy")
def call_wide_binary(op, a, b, mode, t, r):
    return wide_binary(op, a, b, mode, t, r)


# ---------------------------------------------------------------- array kernels
# One kernel per op family; ``wide`` selects binary64 ops, else the narrow format
# (p, emin, emax). Inputs/outputs are 1-D contiguous arrays of equal length.

#: elements per block of the narrow rounding kernel: the fast pass of a block and the
#: exact redo of its few out-of-range elements run while the block is in cache
ROUND_BLOCK = 2048


def _store_fast(out, j, v, p, emin):  # pragma: no cover - replaced by its overload
    """out[j] = the value with float64 bit pattern ``v`` (a normal value of the target
    format): a value store into a float array, the format's bit pattern into a uint16
    array (bf16, fp16: sign, exponent ``be - 1023 + 1 - emin``, top p-1 mantissa bits)."""


def _store_value(out, j, x, p, emin):  # pragma: no cover - replaced by its overload
    """out[j] = x (a float64 on the target grid, or +-0, +-inf, nan): a value store into a
    float array, the format's bit pattern into a uint16 array (:func:`bits16`)."""


@overload(_store_fast, inline="always")
def _ov_store_fast(out, j, v, p, emin):
    if isinstance(out.dtype, types.Float):
        def impl(out, j, v, p, emin):
            out[j] = _bits_f64(v)
        return impl

    def impl16(out, j, v, p, emin):
        be = (v >> _U52) & _EXPMASK
        q = np.uint64(p - 1)
        e16 = (be + np.uint64(1 - emin) - np.uint64(1023)) << q
        out[j] = np.uint16(((v >> np.uint64(48)) & np.uint64(0x8000)) | e16 |
                           ((v & _MANT) >> np.uint64(53 - p)))
    return impl16


@njit(cache=True, error_model="numpy")
def bits16(x, p, emin):
    """The 16-bit pattern of x (a float64 value of the IEEE-style 16-bit format with p
    significand bits and normal exponents from emin: bfloat16 (8, -126) or float16
    (11, -14)), as torch's float32 -> bfloat16 / float16 casts of ``float32(x)`` give it
    (NaN: bfloat16 0xFFFF; float16 sign | 0x7E00 | the top mantissa bits)."""
    b = _f64_bits(x)
    sign = (b >> np.uint64(48)) & np.uint64(0x8000)
    q = np.uint64(p - 1)
    allexp = ((_U1 << np.uint64(16 - p)) - _U1) << q
    if x != x:
        if p == 8:
            return np.uint16(0xFFFF)
        return np.uint16(sign | allexp | (_U1 << (q - _U1)) | ((b & _MANT) >> np.uint64(53 - p)))
    ax = abs(x)
    if ax == np.inf:
        return np.uint16(sign | allexp)
    if ax < pow2(emin):  # zero or subnormal: the integer multiple of 2**(emin - p + 1)
        return np.uint16(sign | np.uint64(ax * pow2(p - 1 - emin)))
    be = (b >> _U52) & _EXPMASK
    return np.uint16(sign | ((be + np.uint64(1 - emin) - np.uint64(1023)) << q) |
                     ((b & _MANT) >> np.uint64(53 - p)))


@overload(_store_value, inline="always")
def _ov_store_value(out, j, x, p, emin):
    if isinstance(out.dtype, types.Float):
        def impl(out, j, x, p, emin):
            out[j] = x
        return impl

    def impl16(out, j, x, p, emin):
        out[j] = bits16(x, p, emin)
    return impl16


@njit(inline="always", cache=True, error_model="numpy")
def _narrow_fast(h, l, mode, t, p, emin, emax, r):
    """The integer fast path of round_narrow on (h, l): (bit pattern, slow). ``slow``:
    the fast path does not apply (l != 0, h outside the format's normal range, or a
    result beyond it: overflow, or UD's step below 2**emin) and the element must be
    redone by round_narrow."""
    b = _f64_bits(h)
    be = (b >> _U52) & _EXPMASK
    v = _fast_bits(b, mode, t, p, emin, emax, r)
    ve = (v >> _U52) & _EXPMASK
    lo_b = np.uint64(1023 + emin)
    hi_b = np.uint64(1023 + emax)
    slow = (be < lo_b) | (be > hi_b) | (ve < lo_b) | (ve > hi_b) | (l != 0.0)
    return v, slow


@njit(inline="always", error_model="numpy")
def _fast_pass(hi, out, z, p, emin, emax, mode, t):
    """:func:`_round_block`'s vectorised pass: the integer fast path on every element of
    ``hi`` into ``out`` (element i with ``mix64(z + i·γ)``); the number of elements it
    declines."""
    nslow = 0
    for i in range(hi.size):
        v, slow = _narrow_fast(np.float64(hi[i]), 0.0, mode, t, p, emin, emax, mix64(z))
        z += _G
        _store_fast(out, i, v, p, emin)
        nslow += np.int64(slow)
    return nslow


@njit(cache=True, error_model="numpy")
def _round_block(hi, lo, out, j0, has_lo, p, emin, emax, mode, t, key):
    """One block of _k_round_narrow (hi, lo, out: slices starting at element j0): the
    integer fast path on hi over the block in one branch-free (vectorised) loop, and a
    count of the non-zero lo; then, only if the block has any, the elements the fast path
    does not take (``_narrow_fast``'s ``slow``, or lo != 0) are redone by round_narrow on
    TwoSum(hi, lo) while the block is in cache. (A separate function: LLVM vectorises its
    loop; a loop nested in the prange body stayed 2-3x slower. No vectorised loop per
    has_lo: each costs seconds of cold compilation; one for sr and one for ud.)"""
    wide_vectors()
    z = weyl64(key, j0)  # element j0's Weyl value, stepped by γ (weyl64)
    # sr and ud with the mode a constant: LLVM does not take the mode's branches out of
    # the loop, which then ran 2.5-3x slower (docs/speed.md, "The rounding core's pass by
    # mode"); a copy per mode costs about 4 s of cold compilation, so the other modes
    # (random, ieee and the directed ones) share the general one
    if mode == MODE_SR:
        nslow = _fast_pass(hi, out, z, p, emin, emax, MODE_SR, t)
    elif mode == MODE_UD:
        nslow = _fast_pass(hi, out, z, p, emin, emax, MODE_UD, t)
    else:
        nslow = _fast_pass(hi, out, z, p, emin, emax, mode, t)
    if has_lo:
        for i in range(hi.size):
            nslow += np.int64(lo[i] != 0.0)
    if nslow == 0:
        return
    for i in range(hi.size):
        h = np.float64(hi[i])
        l = 0.0
        redo = False
        if has_lo and lo[i] != 0.0:
            h, l = two_sum(h, np.float64(lo[i]))  # (lo == 0 keeps hi, its sign of zero)
            redo = True
        r = bits64(key, j0 + i)
        v, slow = _narrow_fast(h, l, mode, t, p, emin, emax, r)
        if slow or redo:
            _store_value(out, i, call_round_narrow(h, l, mode, t, p, emin, emax, r), p, emin)


@njit(cache=True, parallel=True, error_model="numpy")
def _k_round_narrow(hi, lo, out, has_lo, p, emin, emax, mode, t, key):
    """round_narrow of hi[j] (+ lo[j]) into out[j] with bits64(key, j), in blocks of
    ROUND_BLOCK elements (_round_block): an out-of-range element costs the exact redo of
    the elements of its own block only. hi, lo: float32 or float64, of equal size (lo
    unread unless has_lo); out: float32 values, or the uint16 bit patterns of a 16-bit
    format (bits16)."""
    key = np.uint64(key)
    n = hi.size
    for blk in prange((n + ROUND_BLOCK - 1) // ROUND_BLOCK):
        j0 = blk * ROUND_BLOCK
        j1 = min(j0 + ROUND_BLOCK, n)
        _round_block(hi[j0:j1], lo[j0:j1], out[j0:j1], j0, has_lo, p, emin, emax, mode, t,
                     key)


@njit(cache=True, parallel=True, error_model="numpy")
def _k_round_wide(hi, lo, out, has_lo, mode, t, key):
    key = np.uint64(key)
    for j in prange(hi.size):
        r = bits64(key, j)
        h = np.float64(hi[j])
        l = 0.0
        if has_lo and lo[j] != 0.0:
            h, l = two_sum(h, np.float64(lo[j]))
        out[j] = call_round_rn64(h, l, mode, t, r)


def k_round(hi, lo, out, has_lo, p, emin, emax, mode, t, key):
    """Round hi (+ lo) elementwise into out (1-D arrays). hi, lo: float32 or float64 (the
    same dtype; lo is not read unless has_lo). out: float64 for p == 53; float32 for
    p <= 24, or, for bfloat16 (p 8, emin -126) and float16 (p 11, emin -14), the uint16
    view of the target tensor (its bit patterns are written directly, :func:`bits16`).
    ``key`` as for :func:`k_binary`."""
    key = np.uint64(key)
    if p == 53:
        _k_round_wide(hi, lo, out, has_lo, mode, t, key)
    else:
        _k_round_narrow(hi, lo if has_lo else hi, out, has_lo, p, emin, emax, mode, t, key)


#: elements per block of :func:`_k_binary_wide`'s binary64 fast pass: a block with an
#: element the vectorised loop declines has those elements redone on the scalar path
WIDE_BLOCK = 256


@njit(inline="always", error_model="numpy")
def _wide_loop(a, b, out, key, j0, mul, neg, mode):
    """binary64 at 53 bits, sr, ieee, ud or random: ``out[i] = RND(a[i] + b[i])`` (``neg``:
    ``a[i] - b[i]``; ``mul``: ``a[i]·b[i]``) with ``bits64(key, j0 + i)``, vectorised:
    TwoSum, or TwoProduct by FMA (the exact error of Dekker's ``two_prod`` for factors in
    [2**-480, 2**480]), then :func:`rn64_step`. Returns how many elements it declined
    (results to be redone by ``call_wide_binary``): a result outside [2**-700, 2**1000),
    zero included, or a product with a factor outside [2**-480, 2**480], zero included;
    everywhere else its value is ``_rn64_fast``'s, the scalar path's."""
    nbad = 0
    z = weyl64(key, j0)  # element j0's Weyl value, stepped by γ (weyl64)
    for i in range(out.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if mul:
            s = x * y
            e = fma64(x, y, -s)
        else:
            s, e = two_sum(x, -y if neg else y)
        out[i] = rn64_step(s, e, mix64(z), mode)
        z += _G
        nbad += 0 if _wide_takes(x, y, s, mul) else 1
    return nbad


@njit(inline="always", error_model="numpy")
def _wide_takes(x, y, s, mul):
    """Whether :func:`_wide_loop` takes the element with operands ``x``, ``y`` and float64
    result ``s``: ``|s|`` in [2**-700, 2**1000) and, for a product, both factors'
    magnitudes in [2**-480, 2**480] (no branch: it vectorises)."""
    ax = abs(x)
    ay = abs(y)
    safe = (ax >= _SAFE_LO) & (ax <= _SAFE_HI) & (ay >= _SAFE_LO) & (ay <= _SAFE_HI)
    return (safe | (not mul)) & (((_f64_bits(s) & ~_SIGN) - SUM64_LO) < SUM64_SPAN)


@njit(inline="always", error_model="numpy")
def _wide_modes(a, b, out, key, j0, mul, neg, mode):
    """:func:`_wide_loop` with the mode folded into a constant (sr, ieee, ud, random)."""
    if mode == MODE_SR:
        return _wide_loop(a, b, out, key, j0, mul, neg, MODE_SR)
    if mode == MODE_IEEE:
        return _wide_loop(a, b, out, key, j0, mul, neg, MODE_IEEE)
    if mode == MODE_UD:
        return _wide_loop(a, b, out, key, j0, mul, neg, MODE_UD)
    return _wide_loop(a, b, out, key, j0, mul, neg, MODE_RANDOM)


@njit(inline="always", error_model="numpy")
def _wide_div_loop(a, b, out, key, j0, mode):
    """binary64 at 53 bits, sr, ieee, ud or random: ``out[i] = RND(a[i] / b[i])`` with
    ``bits64(key, j0 + i)``, vectorised: the float64 quotient ``q`` and its residual as
    :func:`_div_parts` computes it (``((x − q·y) − err)/y``), the product's exact error
    ``err`` by one FMA, which is the value of Dekker's ``two_prod`` for the factors the
    pass takes, then :func:`rn64_step` on the residual :func:`format_binary` hands the
    rounding (:func:`_t53_residual`: none for ieee and ud). Returns how many elements it
    declined (to be redone by ``call_wide_binary``): those :func:`_wide_takes` declines as
    a product's (an operand outside [2**-480, 2**480], zero, infinite or NaN, or a
    quotient outside [2**-700, 2**1000)). For the others format_binary takes its unscaled
    branch, Dekker's product is exact (factors below 2**995, product above 2**-969) and
    ``round_gen`` at k = 0 gives ``_rn64_fast``'s value, which ``rn64_step`` computes
    (``tests/test_rounding_core.py`` compares it with the scalar path element by
    element). It was the scalar path for every element: ~40 ns each against ~1.5."""
    nbad = 0
    z = weyl64(key, j0)  # element j0's Weyl value, stepped by γ (weyl64)
    for i in range(out.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        q = x / y
        ph = q * y
        e = ((x - ph) - fma64(q, y, -ph)) / y
        out[i] = rn64_step(q, _t53_residual(e, mode, 53), mix64(z), mode)
        z += _G
        nbad += 0 if _wide_takes(x, y, q, True) else 1
    return nbad


@njit(cache=True, error_model="numpy")
def _wide_block(op, a, b, out, key, j0, mode):  # pragma: no cover - compiled
    """:func:`_wide_loop` (:func:`_wide_div_loop` for a quotient) on one block, one
    vectorised copy per op kind (mul; add or sub; div) and mode, 512-bit vectors allowed."""
    wide_vectors()
    if op == OP_MUL:
        return _wide_modes(a, b, out, key, j0, True, False, mode)
    if op == OP_DIV:
        if mode == MODE_SR:
            return _wide_div_loop(a, b, out, key, j0, MODE_SR)
        if mode == MODE_IEEE:
            return _wide_div_loop(a, b, out, key, j0, MODE_IEEE)
        if mode == MODE_UD:
            return _wide_div_loop(a, b, out, key, j0, MODE_UD)
        return _wide_div_loop(a, b, out, key, j0, MODE_RANDOM)
    return _wide_modes(a, b, out, key, j0, False, op == OP_SUB, mode)


@njit(inline="always", error_model="numpy")
def _wide_result(op, x, y):
    """The float64 result of ``x op y`` that :func:`_wide_takes` tests."""
    if op == OP_MUL:
        return x * y
    if op == OP_DIV:
        return x / y
    return x + (-y if op == OP_SUB else y)


@njit(cache=True, parallel=True, error_model="numpy")
def _k_binary_wide(op, a, b, out, mode, t, key, fast):
    key = np.uint64(key)
    n = out.size
    if fast and t == 53 and mode <= MODE_RANDOM:
        # binary64 fast pass (_wide_block), block by block; in a block where it declined
        # elements, those (the same test) on the scalar path. (It was a scalar loop with
        # _rn64_fast: 12.7 ns per element against ~1.5, one thread; quotients ~40 ns.)
        for blk in prange((n + WIDE_BLOCK - 1) // WIDE_BLOCK):
            j0 = blk * WIDE_BLOCK
            j1 = min(n, j0 + WIDE_BLOCK)
            if _wide_block(op, a[j0:j1], b[j0:j1], out[j0:j1], key, j0, mode) == 0:
                continue
            for j in range(j0, j1):
                x = np.float64(a[j])
                y = np.float64(b[j])
                if not _wide_takes(x, y, _wide_result(op, x, y), op >= OP_MUL):
                    out[j] = call_wide_binary(op, x, y, mode, t, bits64(key, j))
        return
    for j in prange(n):
        out[j] = call_wide_binary(op, np.float64(a[j]), np.float64(b[j]), mode, t,
                                  bits64(key, j))


_EMIN32B = np.uint64(1023 - 126)
_EMAX32B = np.uint64(1023 + 127)
_NLOW29 = np.uint64(~((1 << 29) - 1) & ((1 << 64) - 1))
_ULP32B = np.uint64(1 << 29)
_SIGN = np.uint64(1 << 63)
_EXPBITS = np.uint64(0x7FF << 52)
_U23E = np.uint64(23 << 52)
_U53E = np.uint64(53 << 52)
_U149E = np.uint64((2 * 1023 + 23) << 52)  # minus a biased exponent e: the bits of 2**(23-e)
_INF128 = np.uint64((1023 + 128) << 52)  # the float64 pattern of 2**128
_U29 = np.uint64(29)
_U52 = np.uint64(52)


# ------------------------------------------------------------ binary64 without branches
#: the range of |x| (float64 bit patterns: [2**-700, 2**1000)) where :func:`rn64_step`
#: equals ``_rn64_fast``: ``(bits(|x|) - SUM64_LO) < SUM64_SPAN``
SUM64_LO = np.uint64(1023 - 700) << np.uint64(52)
SUM64_SPAN = np.uint64(1700) << np.uint64(52)
_U52E = np.uint64(52 << 52)
_ONEE = np.uint64(1 << 52)
_S53 = np.uint64(2099 << 52)  # minus a biased exponent e: the bits of 2**(53-(e-1023))


@intrinsic
def fma64(typingctx, x, y, z):
    """``x·y + z`` with one rounding (LLVM's ``llvm.fma.f64``: the hardware FMA, vfmadd,
    where the CPU has one, a correctly rounded library call otherwise: exact either way)."""
    if not all(v == types.float64 for v in (x, y, z)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return types.float64(types.float64, types.float64, types.float64), codegen


@njit(inline="always")
def rn64_step(x, lo, r, mode):
    """``_rn64_fast(x, lo, mode, r)`` (binary64 at 53 bits of the
    exact ``x + lo``, ``x = RN64(x + lo)``) for ``|x|`` in [2**-700, 2**1000) and modes
    sr, ieee, ud, random, without branches (same operations, selects instead of jumps):
    ulp ``u`` from the exponent bits (halved below a power of two when the exact value
    lies below it, for sr and random, or on ud's step down); sr moves up iff
    ``float(r >> 11) + 1 <= sv·2**(53 - exponent(u))``."""
    if mode == MODE_IEEE:
        return x
    xb = _f64_bits(x)
    sign = xb & _SIGN
    ab = xb ^ sign
    H = _bits_f64(ab)
    top = (r >> _U63) == _U1
    pw2 = (ab & _MANT) == np.uint64(0)
    ueb = (ab & _EXPBITS) - _U52E
    if mode == MODE_UD:
        u = _bits_f64(ueb - (_ONEE if pw2 & (not top) else np.uint64(0)))
        R = H + u if top else H - u
        return _bits_f64(_f64_bits(R) | sign)
    L = _bits_f64(_f64_bits(lo) ^ sign)
    pos = L > 0.0
    ueb = ueb - (_ONEE if pw2 & (not pos) else np.uint64(0))
    u = _bits_f64(ueb)
    A = H if pos else H - u
    if mode == MODE_SR:
        sv = L if pos else u + L
        up = np.float64(r >> _U11) + 1.0 <= sv * _bits_f64(_S53 - ueb)
    else:
        up = top
    R = A + u if up else A
    R = H if lo == 0.0 else R
    return _bits_f64(_f64_bits(R) | sign)


@njit(inline="always", cache=True, error_model="numpy")
def lo32_fast(h, lo, r, mode):
    """binary32 rounding of the exact value ``h + lo`` (``h = RN64(h + lo)``, as the
    rounding core's division and square root residuals give): (value, ok).

    Identical to ``round_f32(h, lo, mode, 24, r)`` (round_core at k = 0, t = p = 24) where
    ``ok``; ``ok`` is False outside the binary32 normal range of ``h`` (and its lowest
    binade for UD, or where ``h`` lies on the grid with the exact value below it), and when
    ``|lo|`` exceeds half a float64 ulp of ``h``. Derivation, for ``H = |h|`` of exponent e
    and ``L = ±lo`` (the sign of h taken off): ``A = H`` with the low 29 bits cleared,
    ``u = 2**(e-23)``, ``D = H - A``, ``(s, ee) = TwoSum(D, L)``; ``s / u`` is computed as
    ``s * 2**(23-e)`` (the same correctly rounded value); then ``0 <= s < u`` (|L| <=
    2**(e-53)), so round_core takes neither of its re-gridding branches and decides up or
    down as written below. When ``H`` lies on the grid and ``L < 0`` (a sum or quotient
    just below a grid point: ``D = 0``, ``s < 0``), round_core steps one grid point down:
    ``A' = A - u'`` with ``u' = u``, or ``u/2`` when A is a power of two (the finer grid
    below it), which is the binary32 predecessor of A: its bit pattern ``A - 2**29`` in
    float64, of exponent e' with ``u' = 2**(e'-23)``. Then ``D = u'``, ``s = RN(u' + L)``
    lies in (u'/2, u'), and the same decision with ``A'``, ``u'`` follows (rounding "up"
    gives A back). In binary32's lowest binade the grid below 2**-126 is the subnormal one
    (spacing 2**-149, not u/2): declined there.
    """
    hb = _f64_bits(h)
    sign = hb & _SIGN
    ab = hb ^ sign
    be = ab >> _U52
    # flags combined bitwise throughout: `and`/`or` are branches in numba's IR, which LLVM
    # did not always fold back into selects in the vectorised loops that inline this
    ok = (be >= _EMIN32B) & (be <= _EMAX32B) & (mode <= MODE_RANDOM)  # else round_f32
    if mode == MODE_UD:
        ok = ok & (be != _EMIN32B)
    H = _bits_f64(ab)
    L = -lo if sign != _U0 else lo
    Ab = ab & _NLOW29
    below = (Ab == ab) & (L < 0.0)  # H on the grid, the exact value below it
    Ab = Ab - _ULP32B if below else Ab  # A' (the predecessor of A)
    A = _bits_f64(Ab)
    eb = Ab & _EXPBITS
    inv_u = _bits_f64(_U149E - eb)  # 1/u = 2**(23-e), exact (u' for A')
    half = _bits_f64((ab & _EXPBITS) - _U53E)
    D = H - A
    s = D + L
    bv = s - D
    ee = (D - (s - bv)) + (L - bv)
    ok = ok & (abs(L) <= half) & (not (below & (be == _EMIN32B)))
    exact = (s == 0.0) & (ee == 0.0)
    top = (r >> _U63) == _U1
    if mode == MODE_SR:
        up = (not exact) & (np.float64(r >> _U11) + 1.0 <= (s * inv_u) * _TWO53)
    elif mode == MODE_RANDOM:
        up = (not exact) & top
    else:
        s2 = 2.0 * s
        odd = ((Ab >> _U29) & _U1) == _U1
        u = _bits_f64(eb - _U23E)
        up = (s2 > u) | ((s2 == u) & ((ee > 0.0) | ((ee == 0.0) & odd)))
    Rb = Ab + _ULP32B if up else Ab
    if mode == MODE_UD and Rb < _INF128:
        Rb = Rb + _ULP32B if top else Rb - _ULP32B
    v = np.float32(_bits_f64(Rb | sign))
    zero = (h == 0.0) & (lo == 0.0)
    return (np.float32(h) if zero else v), ok | zero


@njit(inline="always", cache=True, error_model="numpy")
def _div32_fast(x, y, mode, r):
    """binary32 x/y at 24 bits as ``narrow_binary(OP_DIV, ...)`` where
    :func:`lo32_fast` accepts the quotient and residual of ``_div_parts``."""
    q, lo = _div_parts(x, y)
    return lo32_fast(q, lo, r, mode)


@njit(inline="always", error_model="numpy")
def _sum_or_product(op, x, y):
    """The float64 product (residual 0), sum or difference of ``x`` and ``y`` with its
    TwoSum residual: :func:`_narrow_binary_block`'s exact step before the rounding."""
    if op == OP_MUL:
        return x * y, 0.0
    return two_sum(x, -y if op == OP_SUB else y)


@njit(inline="always", error_model="numpy")
def _narrow_binary_pass(op, a, b, out, z, p, emin, emax, mode, t):
    """:func:`_narrow_binary_block`'s vectorised pass: the integer fast path on the float64
    product, sum or difference of every element pair (element j with ``mix64(z + j·γ)``)
    into ``out``; the number of elements it declines (the float64 result inexact or out of
    the format's normal range, or the rounded one beyond it)."""
    lo_b = np.uint64(1023 + emin)
    hi_b = np.uint64(1023 + emax)
    nslow = 0
    for j in range(out.size):
        s, e = _sum_or_product(op, np.float64(a[j]), np.float64(b[j]))
        bs = _f64_bits(s)
        be = (bs >> np.uint64(52)) & _EXPMASK
        v = _fast_bits(bs, mode, t, p, emin, emax, mix64(z))
        z += _G
        out[j] = _bits_f64(v)
        ve = (v >> np.uint64(52)) & _EXPMASK
        nslow += np.int64((be < lo_b) | (be > hi_b) | (ve > hi_b) | (e != 0.0))
    return nslow


@njit(cache=True, error_model="numpy")
def _narrow_binary_block(op, a, b, out, j0, p, emin, emax, mode, t, key):
    """One block of :func:`_k_binary_narrow`'s product, sum or difference (a, b, out:
    slices starting at element j0): the fast pass, with the mode a constant for sr and ud
    (as :func:`_round_block`), then, only if it declined elements, those elements redone
    exactly while the block is in cache (the same test as before the blocks, same bits)."""
    wide_vectors()
    z = weyl64(key, j0)
    if mode == MODE_SR:
        nslow = _narrow_binary_pass(op, a, b, out, z, p, emin, emax, MODE_SR, t)
    elif mode == MODE_UD:
        nslow = _narrow_binary_pass(op, a, b, out, z, p, emin, emax, MODE_UD, t)
    else:
        nslow = _narrow_binary_pass(op, a, b, out, z, p, emin, emax, mode, t)
    if nslow == 0:
        return
    lo_b = np.uint64(1023 + emin)
    hi_b = np.uint64(1023 + emax)
    for j in range(out.size):
        s, e = _sum_or_product(op, np.float64(a[j]), np.float64(b[j]))
        be = (_f64_bits(s) >> np.uint64(52)) & _EXPMASK
        if be < lo_b or be > hi_b or e != 0.0 or not (abs(out[j]) < np.inf) or \
                abs(out[j]) >= pow2(emax + 1):
            out[j] = call_narrow_binary(op, a[j], b[j], mode, t, p, emin, emax,
                                        bits64(key, j0 + j))


@njit(inline="always", error_model="numpy")
def _div32_pass(a, b, out, z, mode):
    """:func:`_div32_block`'s vectorised pass (element j with ``mix64(z + j·γ)``); the
    number of quotients :func:`lo32_fast` declined."""
    nslow = 0
    for j in range(out.size):
        v, ok = _div32_fast(np.float64(a[j]), np.float64(b[j]), mode, mix64(z))
        z += _G
        out[j] = v
        nslow += np.int64(not ok)
    return nslow


@njit(cache=True, error_model="numpy")
def _div32_block(a, b, out, j0, emin, emax, mode, key):
    """One block of :func:`_k_binary_narrow`'s division at p = t = 24 (a, b, out: slices
    starting at element j0): the fast pass, with the mode a constant for sr and ud (as
    :func:`_round_block`), then the quotients it declined redone exactly (the same test
    and calls as before the blocks)."""
    wide_vectors()
    z = weyl64(key, j0)
    if mode == MODE_SR:
        nslow = _div32_pass(a, b, out, z, MODE_SR)
    elif mode == MODE_UD:
        nslow = _div32_pass(a, b, out, z, MODE_UD)
    else:
        nslow = _div32_pass(a, b, out, z, mode)
    if nslow == 0:
        return
    for j in range(out.size):
        r = bits64(key, j0 + j)
        v, ok = _div32_fast(np.float64(a[j]), np.float64(b[j]), mode, r)
        if not ok:
            out[j] = call_narrow_binary(OP_DIV, a[j], b[j], mode, 24, 24, emin, emax, r)


@njit(cache=True, parallel=True, error_model="numpy")
def _k_binary_narrow(op, a, b, out, p, emin, emax, mode, t, key):
    key = np.uint64(key)
    n = out.size
    if op != OP_DIV:
        # fast pass (exact float64 result in the normal range), the rest redone exactly,
        # block by block
        for blk in prange((n + ROUND_BLOCK - 1) // ROUND_BLOCK):
            j0 = blk * ROUND_BLOCK
            j1 = min(j0 + ROUND_BLOCK, n)
            _narrow_binary_block(op, a[j0:j1], b[j0:j1], out[j0:j1], j0, p, emin, emax, mode,
                                 t, key)
        return
    if p == 24 and t == 24:  # binary32 division: fast pass, the rest redone exactly
        for blk in prange((n + ROUND_BLOCK - 1) // ROUND_BLOCK):
            j0 = blk * ROUND_BLOCK
            j1 = min(j0 + ROUND_BLOCK, n)
            _div32_block(a[j0:j1], b[j0:j1], out[j0:j1], j0, emin, emax, mode, key)
        return
    for j in prange(n):
        out[j] = call_narrow_binary(op, a[j], b[j], mode, t, p, emin, emax, bits64(key, j))


#: binary64 quotients at 53 bits in the sr, ieee, ud and random modes through the
#: vectorised pass (:func:`_wide_div_loop`); False: every element on the scalar path
#: (``call_wide_binary``), which the tests and ``benchmarks/bench_oneop.py`` compare it with
DIV64_FAST = True


def k_binary(op, a, b, out, p, emin, emax, mode, t, key):
    """out = a (op) b elementwise, rounded (1-D arrays; float32 for p <= 24). ``key``: the
    stream key, any int in [0, 2**64) (passed on as uint64: numba types a Python int as
    int64 below 2**63 and uint64 above, and compiled each kernel once per type)."""
    key = np.uint64(key)
    if p == 53:
        _k_binary_wide(op, a, b, out, mode, t, key, op != OP_DIV or DIV64_FAST)
    else:
        _k_binary_narrow(op, a, b, out, p, emin, emax, mode, t, key)


@njit(inline="always", error_model="numpy")
def sqrt32_parts(x):
    """The float64 square root ``s`` of a binary32 value ``x`` (as float64) and the residual
    :func:`_sqrt_parts` rounds it with (``(x − s²)/(2s)`` for finite positive ``x``, else
    0), without branches; ``s² − RN(s²)`` by one hardware FMA, the value of Dekker's
    TwoProduct for the root of every binary32 value (``instrument.pointwise._prod_err``).
    Shared by :func:`_sqrt32_fast` and flop granularity's square-root tile."""
    s = np.sqrt(x)
    ph = s * s
    e = ((x - ph) - fma64(s, s, -ph)) / (2.0 * s)
    return s, e if ((x > 0.0) & (x < np.inf)) else 0.0


@njit(inline="always", error_model="numpy")
def _sqrt32_fast(x, mode, r):
    """binary32 sqrt(x) at 24 bits (x a binary32 value as float64) as :func:`narrow_sqrt`
    computes it where :func:`lo32_fast` accepts the root and its residual
    (:func:`sqrt32_parts`), and ``x >= 0``: (value, ok)."""
    s, e = sqrt32_parts(x)
    v, ok = lo32_fast(s, e, r, mode)
    return v, ok & (x >= 0.0)


@njit(inline="always", error_model="numpy")
def _sqrt32_pass(a, out, z, mode):
    """:func:`_sqrt32_block`'s vectorised pass (element j with ``mix64(z + j·γ)``); the
    number of roots it declined."""
    nslow = 0
    for j in range(out.size):
        v, ok = _sqrt32_fast(np.float64(a[j]), mode, mix64(z))
        z += _G
        out[j] = v
        nslow += np.int64(not ok)
    return nslow


@njit(cache=True, error_model="numpy")
def _sqrt32_block(a, out, j0, mode, key):
    """One block of :func:`k_sqrt` into binary32 at 24 bits (a, out: slices starting at
    element j0): the fast pass, with the mode a constant for sr and ud (as
    :func:`_round_block`), then the roots it declined by :func:`narrow_sqrt`."""
    wide_vectors()
    z = weyl64(key, j0)
    if mode == MODE_SR:
        nslow = _sqrt32_pass(a, out, z, MODE_SR)
    elif mode == MODE_UD:
        nslow = _sqrt32_pass(a, out, z, MODE_UD)
    else:
        nslow = _sqrt32_pass(a, out, z, mode)
    if nslow == 0:
        return
    for j in range(out.size):
        r = bits64(key, j0 + j)
        v, ok = _sqrt32_fast(np.float64(a[j]), mode, r)
        if not ok:
            out[j] = call_narrow_sqrt(a[j], mode, 24, 24, -126, 127, r)


@njit(inline="always", error_model="numpy")
def _sqrt64_pass(a, out, z, mode):
    """:func:`_sqrt64_block`'s vectorised pass (element j with ``mix64(z + j·γ)``): the root
    as :func:`format_sqrt` computes it, ``a`` scaled by ``2**(−2h)`` (h = ⌊exponent/2⌋:
    into [1, 4)), its float64 root ``s`` and residual ``((x − s²) − err)/(2s)`` (``err``,
    the square's exact error, by one FMA: Dekker's value there), :func:`rn64_step` on the
    residual :func:`_t53_residual` hands the rounding, scaled back by ``2**h`` (exact: a
    root of a normal number is normal). Declines (the count) zero, negative, subnormal,
    infinite and NaN operands (the scalar path's special cases)."""
    nslow = 0
    for j in range(out.size):
        x = np.float64(a[j])
        xb = _f64_bits(x)
        be = np.int64((xb >> np.uint64(52)) & _EXPMASK)
        h = (be - 1023) >> 1  # (floor division by 2, as format_sqrt's ea // 2)
        xs = x * pow2(-2 * h)
        s = np.sqrt(xs)
        ph = s * s
        e = ((xs - ph) - fma64(s, s, -ph)) / (2.0 * s)
        out[j] = rn64_step(s, _t53_residual(e, mode, 53), mix64(z), mode) * pow2(h)
        z += _G
        nslow += np.int64(not ((be >= 1) & (be <= 2046) & (x > 0.0)))
    return nslow


@njit(cache=True, error_model="numpy")
def _sqrt64_block(a, out, j0, mode, key):
    """One block of :func:`k_sqrt` into binary64 at 53 bits (a, out: slices starting at
    element j0): the fast pass (:func:`_sqrt64_pass`, the mode a constant), then the roots
    it declined by :func:`wide_sqrt`. It was ``wide_sqrt`` for every element: ~40 ns each
    against ~1.5 (one thread; ``tests/test_rounding_core.py`` compares the two element by
    element)."""
    wide_vectors()
    z = weyl64(key, j0)
    if mode == MODE_SR:
        nslow = _sqrt64_pass(a, out, z, MODE_SR)
    elif mode == MODE_IEEE:
        nslow = _sqrt64_pass(a, out, z, MODE_IEEE)
    elif mode == MODE_UD:
        nslow = _sqrt64_pass(a, out, z, MODE_UD)
    else:
        nslow = _sqrt64_pass(a, out, z, MODE_RANDOM)
    if nslow == 0:
        return
    for j in range(out.size):
        x = np.float64(a[j])
        be = np.int64((_f64_bits(x) >> np.uint64(52)) & _EXPMASK)
        if not ((be >= 1) & (be <= 2046) & (x > 0.0)):
            out[j] = wide_sqrt(x, mode, 53, bits64(key, j0 + j))


#: binary64 roots at 53 bits in the sr, ieee, ud and random modes through the vectorised
#: pass (:func:`_sqrt64_block`); False: every element by ``wide_sqrt`` (the scalar path
#: the tests and ``benchmarks/bench_oneop.py`` compare it with)
SQRT64_FAST = True


def k_sqrt(a, out, p, emin, emax, mode, t, key):
    """out = sqrt(a) elementwise, rounded (1-D arrays; float32 for p <= 24)."""
    _k_sqrt(a, out, p, emin, emax, mode, t, np.uint64(key), SQRT64_FAST)


@njit(cache=True, parallel=True, error_model="numpy")
def _k_sqrt(a, out, p, emin, emax, mode, t, key, fast64):
    key = np.uint64(key)
    n = out.size
    if fast64 and p == 53 and t == 53 and mode <= MODE_RANDOM:
        for blk in prange((n + ROUND_BLOCK - 1) // ROUND_BLOCK):
            j0 = blk * ROUND_BLOCK
            j1 = min(j0 + ROUND_BLOCK, n)
            _sqrt64_block(a[j0:j1], out[j0:j1], j0, mode, key)
        return
    if p == 24 and t == 24 and emin == -126 and emax == 127 and mode <= MODE_RANDOM:
        # binary32 in the modes lo32_fast takes: a vectorised fast pass per block, the
        # rest redone exactly (until 2026-12-05 every element went through narrow_sqrt:
        # 36-45 ns each; the directed modes still do)
        for blk in prange((n + ROUND_BLOCK - 1) // ROUND_BLOCK):
            j0 = blk * ROUND_BLOCK
            j1 = min(j0 + ROUND_BLOCK, n)
            _sqrt32_block(a[j0:j1], out[j0:j1], j0, mode, key)
        return
    wide = p == 53
    for j in prange(n):
        r = bits64(key, j)
        if wide:
            out[j] = wide_sqrt(np.float64(a[j]), mode, t, r)
        else:
            out[j] = call_narrow_sqrt(a[j], mode, t, p, emin, emax, r)


@njit(inline="always", error_model="numpy")
def _fma32_fast(a, b, c, mode, r):
    """binary32 ``a·b + c`` at 24 bits as :func:`narrow_fma` computes it (the exact
    product, TwoSum with ``c``) where :func:`lo32_fast` accepts it: (value, ok)."""
    s, e = two_sum(np.float64(a) * np.float64(b), np.float64(c))
    return lo32_fast(s, e, r, mode)


@njit(inline="always", error_model="numpy")
def _fma32_pass(a, b, c, out, z, mode):
    """:func:`_fma32_block`'s vectorised pass (element j with ``mix64(z + j·γ)``); the
    number of results :func:`_fma32_fast` declined."""
    nslow = 0
    for j in range(out.size):
        v, ok = _fma32_fast(a[j], b[j], c[j], mode, mix64(z))
        z += _G
        out[j] = v
        nslow += np.int64(not ok)
    return nslow


@njit(cache=True, error_model="numpy")
def _fma32_block(a, b, c, out, j0, mode, key):
    """One block of :func:`k_fma` into binary32 at 24 bits (slices starting at element
    j0): the fast pass, with the mode a constant for sr and ud (as :func:`_round_block`),
    then the elements it declined by :func:`narrow_fma`."""
    wide_vectors()
    z = weyl64(key, j0)
    if mode == MODE_SR:
        nslow = _fma32_pass(a, b, c, out, z, MODE_SR)
    elif mode == MODE_UD:
        nslow = _fma32_pass(a, b, c, out, z, MODE_UD)
    else:
        nslow = _fma32_pass(a, b, c, out, z, mode)
    if nslow == 0:
        return
    for j in range(out.size):
        r = bits64(key, j0 + j)
        v, ok = _fma32_fast(a[j], b[j], c[j], mode, r)
        if not ok:
            out[j] = call_narrow_fma(a[j], b[j], c[j], mode, 24, 24, -126, 127, r)


@njit(cache=True, parallel=True, error_model="numpy")
def k_fma(a, b, c, out, p, emin, emax, mode, t, key):
    key = np.uint64(key)
    n = out.size
    if p == 24 and t == 24 and emin == -126 and emax == 127 and mode <= MODE_RANDOM:
        # binary32 in the modes lo32_fast takes: a vectorised fast pass per block, the
        # rest redone exactly (until 2026-12-05 every element went through narrow_fma)
        for blk in prange((n + ROUND_BLOCK - 1) // ROUND_BLOCK):
            j0 = blk * ROUND_BLOCK
            j1 = min(j0 + ROUND_BLOCK, n)
            _fma32_block(a[j0:j1], b[j0:j1], c[j0:j1], out[j0:j1], j0, mode, key)
        return
    wide = p == 53
    for j in prange(n):
        r = bits64(key, j)
        if wide:
            out[j] = wide_fma(np.float64(a[j]), np.float64(b[j]), np.float64(c[j]), mode, t, r)
        else:
            out[j] = call_narrow_fma(a[j], b[j], c[j], mode, t, p, emin, emax, r)


# ---------------------------------------------------------------- more scalar ops
@njit(inline="always", cache=True, error_model="numpy")
def sub_f32(a, b, mode, t, r):
    """binary32 a-b under ``mode`` at t bits."""
    return np.float32(narrow_binary(OP_SUB, a, b, mode, t, 24, -126, 127, r))


@njit(inline="always", cache=True, error_model="numpy")
def div_f32(a, b, mode, t, r):
    """binary32 a/b under ``mode`` (float64 quotient + exact residual / b)."""
    return np.float32(narrow_binary(OP_DIV, a, b, mode, t, 24, -126, 127, r))


@njit(inline="always", cache=True, error_model="numpy")
def sqrt_f32(a, mode, t, r):
    """binary32 sqrt(a) under ``mode`` (float64 root + exact residual / 2s)."""
    return np.float32(narrow_sqrt(a, mode, t, 24, -126, 127, r))


@njit(inline="always", cache=True, error_model="numpy")
def sub_f64(a, b, mode, t, r):
    """binary64 a-b under ``mode`` at t bits."""
    return wide_binary(OP_SUB, a, b, mode, t, r)


@njit(cache=True, error_model="numpy")
def div_f64(a, b, mode, t, r):
    """binary64 a/b under ``mode`` at t bits."""
    return wide_binary(OP_DIV, a, b, mode, t, r)


@njit(cache=True, error_model="numpy")
def sqrt_f64(a, mode, t, r):
    """binary64 sqrt(a) under ``mode`` at t bits."""
    return wide_sqrt(a, mode, t, r)
