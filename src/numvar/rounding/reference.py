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
from .kernels import MODE_RANDOM, MODE_SR, MODE_UD

FMTS = {"binary32": (24, -126, 127), "binary64": (53, -1022, 1023),
        "bfloat16": (8, -126, 127), "binary16": (11, -14, 15)}


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


def spacing(e: int, t: int, p: int, emin: int) -> Fraction:
    """Grid spacing for |x| in [2**e, 2**(e+1)) at t bits: 2**max(e-t+1, emin-p+1)."""
    return _pow2(max(e - t + 1, emin - p + 1))


def neighbours(x, t: int, p: int, emin: int):
    """(a, u): a <= x < a + u on the t-bit grid, for x > 0 (Fraction or Sqrt)."""
    u = spacing(_floor_log2_any(x), t, p, emin)
    return _floor_div(x, u) * u, u


def round_exact(x, negative: bool, fmt: str, t: int, mode: int, r: int) -> float:
    """Round the exact |x| (> 0; Fraction or Sqrt) with sign ``negative`` to ``fmt`` at t
    bits under ``mode`` using the 64 random bits ``r``. Returns a Python float."""
    p, emin, emax = FMTS[fmt]
    a, u = neighbours(x, t, p, emin)
    exact = _cmp(x, a) == 0
    if mode == MODE_SR:
        # up iff floor(d * 2**53) >= (r >> 11) + 1, d = (x - a)/u
        up = not exact and _cmp(x, a + ((r >> 11) + 1) * u / _pow2(53)) >= 0
    elif mode == MODE_RANDOM:
        up = not exact and (r >> 63) == 1
    else:
        c = _cmp(x, a + u / 2)
        up = c > 0 or (c == 0 and (a / u) % 2 == 1)
    R = a + u if up else a
    if mode == MODE_UD and R != 0 and R < _pow2(emax + 1):
        e = _floor_log2(R)
        if (r >> 63) == 1:
            R = R + spacing(e, t, p, emin)
        elif R == _pow2(e):
            R = R - spacing(e - 1, t, p, emin)
        else:
            R = R - spacing(e, t, p, emin)
    if R >= _pow2(emax + 1):
        v = math.inf
    else:
        v = float(R)
    return -v if negative else v


def _special(x: float) -> bool:
    return not math.isfinite(x)


def ref_op(op: str, args: tuple[float, ...], fmt: str, t: int, mode: int, key: int,
           j: int, ieee_value: float) -> float:
    """Reference of one element of ``op`` ("add", "sub", "mul", "div", "sqrt", "fma",
    "round") on Python floats (exact values of the inputs). ``ieee_value`` is the
    float64 IEEE result of the same op, used only for non-finite inputs and exact-zero
    results (IEEE decides the sign of zero)."""
    if any(_special(a) for a in args):
        return ieee_value
    F = [Fraction(a) for a in args]
    if op == "add":
        x = F[0] + F[1]
    elif op == "sub":
        x = F[0] - F[1]
    elif op == "mul":
        x = F[0] * F[1]
    elif op == "div":
        if F[1] == 0:
            return ieee_value
        x = F[0] / F[1]
    elif op == "fma":
        x = F[0] * F[1] + F[2]
    elif op == "round":
        x = sum(F, Fraction(0))
    elif op == "sqrt":
        if F[0] < 0:
            return math.nan
        if F[0] == 0:
            return ieee_value
        return round_exact(Sqrt(F[0]), False, fmt, t, mode, bits(key, j))
    else:
        raise ValueError(op)
    if x == 0:
        return ieee_value
    return round_exact(abs(x), x < 0, fmt, t, mode, bits(key, j))
