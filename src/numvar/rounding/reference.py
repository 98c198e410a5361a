"""Slow, obviously-correct reference of the rounding core in exact rational arithmetic.

Every value is a :class:`fractions.Fraction` (or the square root of one); the grid
neighbours, the SR draw and the ties are decided by exact comparisons. The fast numba
and torch paths must agree with this bit for bit (they do up to events of probability
below 2**-52 per element, where a rounded error term ``lo`` straddles a random
threshold; see ``kernels``).
"""

from __future__ import annotations

import math
from fractions import Fraction

from ._stream import bits
from .kernels import MODE_DOWN, MODE_FARTHEST, MODE_RANDOM, MODE_SR, MODE_UD, MODE_UP, \
    MODE_ZERO

FMTS = {"binary32": (24, -126, 127), "binary64": (53, -1022, 1023),
        "bfloat16": (8, -126, 127), "binary16": (11, -14, 15)}


def _format(fmt):
    """(p, emin, emax, max_value, overflow, subnormals, signed_zero) of a name of FMTS,
    a :class:`numvar.rounding.Format` or a named format's name."""
    if isinstance(fmt, str) and fmt in FMTS:
        p, emin, emax = FMTS[fmt]
        return p, emin, emax, None, "inf", True, True
    from .formats import get_format

    f = get_format(fmt)
    return f.precision, f.emin, f.emax, f.max_value, f.overflow, f.subnormals, f.signed_zero


class Sqrt:
    """The exact square root of a non-negative Fraction."""

    def __init__(self, a: Fraction) -> None:
        self.a = Fraction(a)


def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    return e


def _pow2(e: int) -> Fraction:
    return Fraction(2) ** e


def _floor_log2_any(x) -> int:
    if isinstance(x, Sqrt):
        return _floor_log2(x.a) // 2
    return _floor_log2(x)


def _floor_div(x, u: Fraction) -> int:
    """floor(x / u) for x >= 0."""
    if isinstance(x, Sqrt):
        return math.isqrt(math.floor(x.a / (u * u)))
    return math.floor(x / u)


def _cmp(x, q: Fraction) -> int:
    """sign(x - q) for x >= 0, q >= 0."""
    if isinstance(x, Sqrt):
        lhs, rhs = x.a, q * q
    else:
        lhs, rhs = x, q
    return (lhs > rhs) - (lhs < rhs)


def spacing(e: int, t: int, p: int, emin: int, subnormals: bool = True) -> Fraction:
    """Grid spacing for |x| in [2**e, 2**(e+1)) at t bits: 2**max(e-t+1, emin-p+1);
    without subnormals, 2**emin below 2**emin (the grid there is {0, 2**emin})."""
    if not subnormals and e < emin:
        return _pow2(emin)
    return _pow2(max(e - t + 1, emin - p + 1))


def neighbours(x, t: int, p: int, emin: int, subnormals: bool = True):
    """(a, u): a <= x < a + u on the t-bit grid, for x > 0 (Fraction or Sqrt)."""
    u = spacing(_floor_log2_any(x), t, p, emin, subnormals)
    return _floor_div(x, u) * u, u


def max_finite(t: int, emax: int, max_value) -> Fraction:
    """The largest finite value at t bits (``max_value`` when the format caps it)."""
    if max_value is not None:
        return Fraction(max_value)
    return _pow2(emax) * (2 - _pow2(1 - t))


def _overflow(negative: bool, mode: int, t: int, emax: int, max_value, overflow: str) -> float:
    """The value of an overflowing result: the largest finite value when the mode
    rounds toward zero in magnitude (IEEE 754), else the format's rule."""
    toward = mode == MODE_ZERO or (mode == MODE_DOWN and not negative) or \
        (mode == MODE_UP and negative)
    if toward or overflow == "saturate":
        v = float(max_finite(t, emax, max_value))
    elif overflow == "inf":
        v = math.inf
    else:
        return math.nan
    return -v if negative else v


def round_exact(x, negative: bool, fmt, t: int, mode: int, r: int) -> float:
    """Round the exact |x| (> 0; Fraction or Sqrt) with sign ``negative`` to ``fmt`` (a
    name of FMTS, a Format or a named format's name) at t bits under ``mode`` using the
    64 random bits ``r``. Returns a Python float.

    Decisions, all exact: sr: up iff floor(d * 2**53) >= (r >> 11) + 1 with d = (x-a)/u;
    random: up iff the top bit of r is set (inexact x); ieee: nearest, ties to the even
    grid point; up/down: toward +inf/-inf; zero: toward 0; farthest: the neighbour that
    ieee does not pick (inexact x); ud: the ieee result R moved one grid point up or down
    in magnitude by the top bit of r when R is finite and non-zero; when R is 0 and x is
    inexact, up to the smallest grid value (top bit set) or stays 0. A result beyond the
    largest finite value overflows (:func:`_overflow`); -0 becomes +0 without signed
    zeros."""
    p, emin, emax, max_value, overflow, subn, signed_zero = _format(fmt)
    a, u = neighbours(x, t, p, emin, subn)
    exact = _cmp(x, a) == 0
    top = (r >> 63) == 1
    if mode == MODE_SR:
        up = not exact and _cmp(x, a + ((r >> 11) + 1) * u / _pow2(53)) >= 0
    elif mode == MODE_RANDOM:
        up = not exact and top
    elif mode in (MODE_UP, MODE_DOWN):
        up = not exact and (mode == MODE_UP) != negative
    elif mode == MODE_ZERO:
        up = False
    else:
        c = _cmp(x, a + u / 2)
        up = c > 0 or (c == 0 and (a / u) % 2 == 1)
        if mode == MODE_FARTHEST and not exact:
            up = not up
    R = a + u if up else a
    top_value = max_finite(t, emax, max_value)
    if mode == MODE_UD:
        if R != 0 and R <= top_value:
            e = _floor_log2(R)
            if top:
                R = R + spacing(e, t, p, emin, subn)
            elif R == _pow2(e):
                R = R - spacing(e - 1, t, p, emin, subn)
            else:
                R = R - spacing(e, t, p, emin, subn)
        elif R == 0 and not exact and top:
            R = u
    if R > top_value:
        return _overflow(negative, mode, t, emax, max_value, overflow)
    v = float(R)
    if v == 0 and not signed_zero:
        return 0.0
    return -v if negative else v


def _with_rules(v: float, fmt, t: int, mode: int) -> float:
    """A special result (0, inf, nan of the float64 IEEE op) under the format's rules."""
    p, emin, emax, max_value, overflow, subn, signed_zero = _format(fmt)
    if math.isinf(v):
        if overflow == "inf":
            return v
        if overflow == "nan":
            return math.nan
        m = float(max_finite(t, emax, max_value))
        return -m if v < 0 else m
    if v == 0 and not signed_zero:
        return 0.0
    return v


def _special(x: float) -> bool:
    return not math.isfinite(x)


def ref_op(op: str, args: tuple[float, ...], fmt, t: int, mode: int, key: int,
           j: int, ieee_value: float, r: int | None = None) -> float:
    """Reference of one element of ``op`` ("add", "sub", "mul", "div", "sqrt", "fma",
    "round") on Python floats (exact values of the inputs). ``ieee_value`` is the
    float64 IEEE result of the same op, used only for non-finite inputs and exact-zero
    results (IEEE decides the sign of zero; the format's rules then apply). Random bits:
    ``bits(key, j)``, or ``r`` when given."""
    rb = bits(key, j) if r is None else r
    if any(_special(a) for a in args):
        return _with_rules(ieee_value, fmt, t, mode)
    F = [Fraction(a) for a in args]
    if op == "add":
        x = F[0] + F[1]
    elif op == "sub":
        x = F[0] - F[1]
    elif op == "mul":
        x = F[0] * F[1]
    elif op == "div":
        if F[1] == 0:
            return _with_rules(ieee_value, fmt, t, mode)
        x = F[0] / F[1]
    elif op == "fma":
        x = F[0] * F[1] + F[2]
    elif op == "round":
        x = sum(F, Fraction(0))
    elif op == "sqrt":
        if F[0] < 0:
            return math.nan
        if F[0] == 0:
            return _with_rules(ieee_value, fmt, t, mode)
        return round_exact(Sqrt(F[0]), False, fmt, t, mode, rb)
    else:
        raise ValueError(op)
    if x == 0:
        return _with_rules(ieee_value, fmt, t, mode)
    return round_exact(abs(x), x < 0, fmt, t, mode, rb)
