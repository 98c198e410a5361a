"""Formats and rounding modes of the rounding core against the exact Fraction reference.

Every format (the named ones, a custom one, one without subnormals, one that saturates)
under every mode: neighbours, exact values, overflow per the format's rule, signed zeros,
NaN, the numba and torch backends bit-equal, the directed modes deterministic; SR's
up-probability and the 1/2 of random/UD within binomial bounds at normal, subnormal and
near-overflow points; round-to-nearest to fp8 equal to torch's casts; UD at zero.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import numvar
import numvar.rounding as R
from numvar.errors import ConfigError, FormatError
from numvar.rounding.formats import NAMED, Format, get_format
from numvar.rounding.kernels import MODE_NAMES, mode_code
from numvar.rounding.reference import max_finite, ref_op, spacing

CUSTOM = Format.custom(7, 5)  # a 12-bit format: 1 + 5 + 6 bits
FLUSH = Format(5, -6, 7, subnormals=False, name="flush")
SATURATE = Format(3, -14, 15, overflow="saturate", name="e5m2sat")
FORMATS = [*NAMED.values(), CUSTOM, FLUSH, SATURATE]
FMT_IDS = [f.label for f in FORMATS]


def _same(a: float, b: float) -> bool:
    """Bitwise equality of two Python floats (NaN equals NaN, signs of zero count)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _points(f: Format, rng: np.random.Generator) -> list[float]:
    """Values around the format's grid: exact grid values, quarter/half/three-quarter
    points and random points between neighbours in the normal range, the subnormal (or
    flushed) range and just below/above the largest finite value; ±0, ±inf, NaN, values
    far beyond the range and far below the smallest one."""
    pts = [0.0, -0.0, math.inf, -math.inf, math.nan]
    top = f.max_finite
    sub = 2.0 ** f.smallest_exponent
    for e in (f.emin, f.emin + 1, max(f.emin, min(f.emax, 0)), f.emax - 1, f.emax):
        u = float(spacing(e, f.precision, f.precision, f.emin, f.subnormals))
        base = 2.0 ** e
        for k in (0, 1, 3):
            a = base + k * u
            if a > top:
                continue
            for frac in (0.0, 0.25, 0.5, 0.75, float(rng.random())):
                pts += [a + frac * u, -(a + frac * u)]
    for frac in (0.25, 0.5, 0.75, 1.0, 1.5, 2.5, float(rng.random())):
        pts += [frac * sub, -frac * sub]
    pts += [top, -top, top + 0.25 * float(spacing(f.emax, f.precision, f.precision, f.emin)),
            top * 1.6, -top * 1.6, top * 2 ** 40, -top * 2 ** 40, sub * 2.0 ** -40]
    return [p for p in pts if math.isnan(p) or abs(p) < 1e300]


@pytest.mark.parametrize("fmt", FORMATS, ids=FMT_IDS)
def test_round_every_mode_matches_fraction_reference(fmt):
    """numba == torch == the Fraction reference, for every mode, on points that cover the
    normal, subnormal and near-overflow ranges, exact values, signed zeros, inf and NaN.
    The result is stored in the format's storage dtype."""
    rng = np.random.default_rng(3)
    x = torch.tensor(_points(fmt, rng), dtype=torch.float64)
    for mode in MODE_NAMES:
        got = R.round(x, format=fmt, mode=mode, stream=R.Stream(11))
        alt = R.round(x, format=fmt, mode=mode, stream=R.Stream(11), backend="torch")
        assert got.dtype == fmt.storage
        key = R.Stream(11).next_key()
        for j, v in enumerate(x.tolist()):
            ref = ref_op("round", (v,), fmt, fmt.precision, mode_code(mode), key, j, v)
            a, b = float(got[j]), float(alt[j])
            assert _same(a, ref), (fmt.label, mode, v, a, ref)
            assert _same(b, ref), (fmt.label, mode, v, b, ref, "torch backend")


@pytest.mark.parametrize("fmt", [NAMED["e4m3fn"], CUSTOM, FLUSH], ids=["e4m3fn", "custom", "flush"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "sqrt", "fma"])
def test_ops_in_a_format_match_reference(fmt, op):
    """add/sub/mul/div/sqrt/fma of float32 operands rounded once to the format, every mode,
    both backends, against the Fraction reference."""
    rng = np.random.default_rng(5)
    n = 40
    vals = [torch.tensor(rng.standard_normal(n) * 2.0 ** rng.integers(-8, 6, n),
                         dtype=torch.float32) for _ in range(3)]
    vals[0][:3] = torch.tensor([0.0, -0.0, float("inf")])
    if op == "sqrt":
        vals[0] = vals[0].abs()
    fn = getattr(R, op)
    args = vals[:1] if op == "sqrt" else vals[:3] if op == "fma" else vals[:2]
    exact = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
             "div": lambda a, b: a / b, "sqrt": lambda a: a.sqrt(),
             "fma": lambda a, b, c: a * b + c}[op](*[a.double() for a in args])
    for mode in MODE_NAMES:
        got = fn(*args, format=fmt, mode=mode, stream=R.Stream(2))
        alt = fn(*args, format=fmt, mode=mode, stream=R.Stream(2), backend="torch")
        key = R.Stream(2).next_key()
        for j in range(n):
            ref = ref_op(op, tuple(float(a[j]) for a in args), fmt, fmt.precision,
                         mode_code(mode), key, j, float(exact[j]))
            assert _same(float(got[j]), ref), (op, mode, j, float(got[j]), ref)
            assert _same(float(alt[j]), ref), (op, mode, j, float(alt[j]), ref, "torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_any_format_kernel_equals_ieee_kernels(dtype):
    """Rounding to binary32/bfloat16/float16 through the any-format kernel (stored in
    float64) gives the IEEE kernels' bits, in every mode (same key, same bits)."""
    f = R.FORMATS[dtype]
    x = torch.tensor(_points(f, np.random.default_rng(1)), dtype=torch.float64)
    for mode in MODE_NAMES:
        a = R.round(x, dtype=dtype, mode=mode, stream=R.Stream(4))
        b = R.round(x, format=f, dtype=torch.float64, mode=mode, stream=R.Stream(4))
        assert torch.equal(a.double().nan_to_num(7.0), b.nan_to_num(7.0)), mode
        num = ~b.isnan()  # (a NaN's sign is no part of the contract)
        assert torch.equal(torch.signbit(a.double())[num], torch.signbit(b)[num]), mode


def _binomial_ok(k: int, n: int, p: float) -> bool:
    """|k/n - p| within 5 standard deviations of a binomial(n, p) proportion plus 1/n
    (false-failure probability below 1e-6 per check)."""
    return abs(k / n - p) <= 5.0 * math.sqrt(p * (1 - p) / n) + 1.0 / n


@pytest.mark.parametrize("fmt", [NAMED["e4m3fn"], NAMED["e5m2"], NAMED["bfloat16"], CUSTOM,
                                 FLUSH], ids=["e4m3fn", "e5m2", "bfloat16", "custom", "flush"])
def test_up_probability_normal_subnormal_near_overflow(fmt):
    """SR rounds up with probability (x-a)/(b-a), random moves with probability 1/2, at
    a normal point, a point between 0 and the smallest value (subnormal grid, or the
    flushed gap {0, 2**emin}) and a point between the largest finite value and the next
    grid point (where 'up' is the overflow rule's value). n = 4000 copies per point."""
    n = 4000
    top = fmt.max_finite
    u_top = float(spacing(fmt.emax, fmt.precision, fmt.precision, fmt.emin))
    small = 2.0 ** fmt.smallest_exponent
    u1 = float(spacing(0, fmt.precision, fmt.precision, fmt.emin))
    for x, a, b in ((1.0 + 0.3 * u1, 1.0, 1.0 + u1), (0.3 * small, 0.0, small),
                    (top + 0.7 * u_top, top, top + u_top)):
        xs = torch.full((n,), x, dtype=torch.float64)
        p_up = float((Fraction(x) - Fraction(a)) / (Fraction(b) - Fraction(a)))
        up_value = _up_value(fmt, Fraction(b))
        if up_value == a:  # saturation: both neighbours are the largest finite value
            y = R.round(xs, format=fmt, mode="sr", stream=R.Stream(8)).double()
            assert bool((y == a).all())
            continue
        for mode, p in (("sr", p_up), ("random", 0.5)):
            y = R.round(xs, format=fmt, mode=mode, stream=R.Stream(8)).double()
            is_up = y.isnan() if math.isnan(up_value) else y == up_value
            assert bool((is_up | (y == a)).all()), (fmt.label, mode, x)
            assert _binomial_ok(int(is_up.sum()), n, p), (fmt.label, mode, x, float(is_up.float().mean()), p)


def _up_value(fmt: Format, b: Fraction) -> float:
    if b <= Fraction(fmt.max_finite):
        return float(b)
    return {"inf": math.inf, "saturate": fmt.max_finite, "nan": math.nan}[fmt.overflow]


def test_ud_at_zero_and_directed_modes_deterministic():
    """UD at zero (docstring of round_gen): 1e5 copies of 0.3 * 2**-133 rounded to
    bfloat16 give 0 or the smallest subnormal 2**-133 with probability 1/2 each (sign
    kept: -0 / -2**-133 for the negative); an exact zero stays. The directed modes and
    farthest give the same bits under every seed."""
    n = 100_000
    x = torch.full((n,), 0.3 * 2.0 ** -133, dtype=torch.float64)
    for sign in (1.0, -1.0):
        y = R.round(sign * x, dtype=torch.bfloat16, mode="ud", stream=R.Stream(0)).double()
        vals = set(y.tolist())
        assert vals == {0.0, sign * 2.0 ** -133}
        assert torch.signbit(y).all() == (sign < 0)
        assert _binomial_ok(int((y != 0).sum()), n, 0.5)
        alt = R.round(sign * x[:1000], dtype=torch.bfloat16, mode="ud", stream=R.Stream(0),
                      backend="torch").double()
        assert torch.equal(alt, y[:1000])
    z = R.round(torch.zeros(10, dtype=torch.float64), dtype=torch.bfloat16, mode="ud",
                stream=R.Stream(0))
    assert (z == 0).all()
    pts = torch.tensor(_points(NAMED["e5m2"], np.random.default_rng(0)), dtype=torch.float64)
    for mode in ("up", "down", "zero", "farthest", "ieee"):
        a = R.round(pts, format="e5m2", mode=mode, stream=R.Stream(1)).double()
        b = R.round(pts, format="e5m2", mode=mode, stream=R.Stream(99)).double()
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), mode
    up = R.round(pts, format="e5m2", mode="up", stream=R.Stream(1)).double()
    down = R.round(pts, format="e5m2", mode="down", stream=R.Stream(1)).double()
    fin = pts.isfinite()
    assert (up[fin] >= pts[fin]).all() and (down[fin] <= pts[fin]).all()


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"])
def test_round_to_nearest_equals_torch_fp8_casts(name):
    """From float32 sources (torch's float32 -> float8 casts are correctly rounded), ieee
    rounding to each fp8 format equals torch's cast bit for bit: 200,000 values across
    the whole range (subnormals, ties, overflow, specials). (torch saturates e4m3fn
    overflow and infinities to ±448, and the named e4m3fn does the same; the fnuz casts
    give NaN, e5m2 gives inf.)"""
    f = NAMED[name]
    dt = getattr(torch, "float8_" + name)
    g = torch.Generator().manual_seed(0)
    mant = torch.rand(200_000, generator=g) * 2 - 1
    expo = torch.randint(f.emin - f.precision - 2, f.emax + 3, (200_000,), generator=g)
    x = (mant * torch.pow(2.0, expo.float())).float()
    grid = torch.arange(0, 256, dtype=torch.uint8).view(dt).float()
    ties = ((grid[:-1] + grid[1:]) / 2)[grid[:-1].isfinite() & grid[1:].isfinite()]
    x = torch.cat([x, ties.float(), -ties.float(), torch.tensor([0.0, -0.0, float("inf"),
                                                                 float("-inf"), float("nan")])])
    ours = R.round(x, format=name, mode="ieee", stream=R.Stream(0))
    theirs = x.to(dt)
    assert ours.dtype == dt
    assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)), name


def test_round_to_nearest_bf16_fp16_from_float64_is_exact_not_the_cast():
    """torch's float64 -> bf16/fp16 casts double-round through float32 (REFERENCE.md):
    1 + 2**-8 + 2**-40 must round up to 1.0078125 in bfloat16; our ieee result equals the
    Fraction reference where the cast differs."""
    x = torch.tensor([1 + 2 ** -8 + 2 ** -40, 1 + 2 ** -11 + 2 ** -40], dtype=torch.float64)
    bf = R.round(x[:1], dtype=torch.bfloat16, mode="ieee", stream=R.Stream(0))
    assert float(bf) == 1.0078125 and float(x[:1].to(torch.bfloat16)) == 1.0
    hf = R.round(x[1:], dtype=torch.float16, mode="ieee", stream=R.Stream(0))
    assert float(hf) == 1 + 2 ** -10


def test_named_formats_and_storage():
    e4 = NAMED["e4m3fn"]
    assert e4.max_finite == 448.0 and e4.smallest_exponent == -9 and e4.overflow == "saturate"
    assert NAMED["e5m2"].max_finite == 57344.0 and NAMED["e5m2"].overflow == "inf"
    assert NAMED["e4m3fnuz"].max_finite == 240.0 and not NAMED["e4m3fnuz"].signed_zero
    assert NAMED["e5m2fnuz"].max_finite == 57344.0
    assert NAMED["tf32"].storage is torch.float32
    assert e4.storage is torch.float8_e4m3fn and NAMED["e5m2"].storage is torch.float8_e5m2
    assert NAMED["bfloat16"].storage is torch.bfloat16
    assert NAMED["float16"].storage is torch.float16
    assert CUSTOM.storage is torch.bfloat16  # 7 bits, 2**-20: bfloat16 holds it
    assert Format.custom(12, 5).storage is torch.float32
    assert Format.custom(30, 8).storage is torch.float64
    assert (CUSTOM.emin, CUSTOM.emax) == (-14, 15)
    for f in FORMATS:
        assert get_format(f.token) == f
    assert get_format("bf16") is NAMED["bfloat16"] and get_format("custom:7,5") == CUSTOM
    assert numvar.Format is Format


@pytest.mark.parametrize("bad", [
    lambda: Format(8, 5, 4), lambda: Format(0, -10, 10), lambda: Format(54, -10, 10),
    lambda: Format(8, -10, 10, overflow="wrap"), lambda: Format(8, -900, 900),
    lambda: Format(4, -6, 8, max_value=500.0), lambda: Format(4, -6, 8, max_value=449.0),
    lambda: Format.custom(8, 1), lambda: get_format("fp7"), lambda: get_format("custom:x"),
    lambda: R.round(torch.ones(2), format="float16", dtype=torch.bfloat16, mode="sr",
                    stream=R.Stream(0)),
    lambda: R.round(torch.ones(2), format="e4m3fn", precision=5, mode="sr",
                    stream=R.Stream(0)),
])
def test_bad_formats_raise_format_error(bad):
    with pytest.raises(FormatError):
        bad()


def test_bad_mode_raises():
    with pytest.raises(numvar.errors.RoundingError):
        R.round(torch.ones(2), format="e5m2", mode="nearest", stream=R.Stream(0))
    with pytest.raises(ConfigError):
        numvar.FuzzyConfig(mode="nearest")


def test_max_finite_reference():
    assert max_finite(4, 8, 448.0) == 448
    assert max_finite(3, 15, None) == 57344
