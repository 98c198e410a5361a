"""Statistics of the rounding modes against exact rational theory (fixed seeds).

Each case has an exactly known value x (a Fraction, or the root of one) between grid
neighbours a < b; N independent roundings of x (N elements of one call) are drawn.

Tolerances: the count of "up" results is Binomial(N, p), p = (x-a)/(b-a) (the
implementation draws 53 random bits, |P(up) - p| < 2**-53, negligible). We accept
|k - N p| <= 6 sqrt(N p (1-p)) + 1: a normal tail of 6 sigma, probability < 2e-9 per
case, so the test cannot be flaky in practice and, with fixed seeds, is deterministic.
The same bound on the sample mean reads |mean - x| <= (b-a) (6 sqrt(p(1-p)/N) + 1/N).
A wrong p is detected when |p' - p| > 12 sqrt(p(1-p)/N) ~ 0.04 at N = 20000, p = 1/2.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import numvar.rounding as R
from numvar.rounding.reference import FMTS, Sqrt, neighbours

N = 20000
FMT = {torch.float32: "binary32", torch.float64: "binary64", torch.bfloat16: "bfloat16",
       torch.float16: "binary16"}
F = Fraction
MAX32 = F(torch.finfo(torch.float32).max)
MAX64 = F(torch.finfo(torch.float64).max)


def _frac_p(x, dtype, t=None):
    """(a, u, p) of exact x (Fraction or Sqrt, sign handled) on dtype's t-bit grid."""
    p_, emin, _ = FMTS[FMT[dtype]]
    t = t or p_
    neg = not isinstance(x, Sqrt) and x < 0
    ax = x if isinstance(x, Sqrt) else abs(x)
    a, u = neighbours(ax, t, p_, emin)
    if isinstance(ax, Sqrt):
        # p to 2**-200: floor(sqrt(x) * 2**200) via isqrt
        s = F(math.isqrt(math.floor(ax.a * 2 ** 400)), 2 ** 200)
        p = (s - a) / u
    else:
        p = (ax - a) / u
    if neg:
        a, p = -a, p  # the "up" neighbour is a - u (away from zero)
    return a, (-u if neg else u), p


def _t(v, dtype):
    return torch.full((N,), float(v), dtype=torch.float64).to(dtype)


# (id, dtype, exact x, thunk(mode, stream) -> N results)
def cases():
    f32, f64, bf, f16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
    out = []

    def rnd(x: Fraction, hi: float, lo: float, dtype, name):
        assert F(hi) + F(lo) == x
        out.append((name, dtype, x, lambda m, s: R.round(
            torch.full((N,), hi, dtype=f64), torch.full((N,), lo, dtype=f64), dtype=dtype,
            mode=m, stream=s)))

    def op(name, dtype, x, fn, *vals):
        ts = [_t(v, dtype) for v in vals]
        assert all(F(float(t[0])) == F(v) for t, v in zip(ts, vals)), name
        out.append((name, dtype, x, lambda m, s: fn(*ts, mode=m, stream=s)))

    rnd(1 + F(1, 2 ** 25), 1 + 2.0 ** -25, 0.0, f32, "f32 1+2^-25 (p=1/4)")
    rnd(2 - F(1, 2 ** 25), 2 - 2.0 ** -25, 0.0, f32, "f32 below a power of two (p=3/4)")
    rnd(-(1 + F(3, 2 ** 26)), -(1 + 3 * 2.0 ** -26), 0.0, f32, "f32 negative (p=3/8)")
    sub = F(5.3) * F(2) ** -149
    rnd(sub, float(sub), 0.0, f32, "f32 subnormal 5.3*2^-149")
    big = MAX32 + F(2) ** 104 * F(0.4)
    rnd(big, float(MAX32), 0.4 * 2.0 ** 104, f32, "f32 near overflow (up = inf)")
    rnd(F(3, 2), 1.5, 0.0, f32, "f32 exact 1.5")
    op("f32 mul (1+2^-12)(1+2^-13)", f32, (1 + F(1, 2 ** 12)) * (1 + F(1, 2 ** 13)), R.mul,
       1 + 2.0 ** -12, 1 + 2.0 ** -13)
    op("f32 div 1/3", f32, F(1, 3), R.div, 1.0, 3.0)
    op("f32 sqrt 2", f32, Sqrt(F(2)), R.sqrt, 2.0)
    op("f32 add, exponent gap > 29", f32, F(2) ** 30 + F(1.5) + F(1, 2 ** 23), R.add,
       2.0 ** 30, 1.5 + 2.0 ** -23)
    op("f32 fma 3*(1/3)-1", f32, 3 * F(float(torch.tensor(1 / 3, dtype=f32))) - 1, R.fma,
       3.0, float(torch.tensor(1 / 3, dtype=f32)), -1.0)
    rnd(1 + F(1, 2 ** 54), 1.0, 2.0 ** -54, f64, "f64 1+2^-54 (p=1/4)")
    op("f64 add 1+3*2^-55", f64, 1 + F(3, 2 ** 55), R.add, 1.0, 3 * 2.0 ** -55)
    op("f64 sub 1-3*2^-55", f64, 1 - F(3, 2 ** 55), R.sub, 1.0, 3 * 2.0 ** -55)
    op("f64 mul (1+2^-30)(1+2^-24)", f64, (1 + F(1, 2 ** 30)) * (1 + F(1, 2 ** 24)), R.mul,
       1 + 2.0 ** -30, 1 + 2.0 ** -24)
    op("f64 div 1/3", f64, F(1, 3), R.div, 1.0, 3.0)
    op("f64 div -2/3", f64, F(-2, 3), R.div, -2.0, 3.0)
    op("f64 sqrt 2", f64, Sqrt(F(2)), R.sqrt, 2.0)
    op("f64 subnormal product", f64, F(5.3 * 2.0 ** -600) * F(2) ** -474, R.mul,
       5.3 * 2.0 ** -600, 2.0 ** -474)
    op("f64 fma 0.1*0.1-0.01", f64, F(0.1) * F(0.1) - F(0.01), R.fma, 0.1, 0.1, -0.01)
    rnd(MAX64 + F(0.4 * 2.0 ** 971), float(MAX64), 0.4 * 2.0 ** 971, f64,
        "f64 near overflow (up = inf)")
    op("f64 exact 1+2", f64, F(3), R.add, 1.0, 2.0)
    op("bf16 mul (1+2^-4)(1+2^-5)", bf, (1 + F(1, 16)) * (1 + F(1, 32)), R.mul,
       1 + 2.0 ** -4, 1 + 2.0 ** -5)
    rnd(F(1.3), 1.3, 0.0, bf, "bf16 1.3")
    rnd(F(2.3) * F(2) ** -24, 2.3 * 2.0 ** -24, 0.0, f16, "f16 subnormal 2.3*2^-24")
    rnd(F(65519.5), 65519.5, 0.0, f16, "f16 near overflow (up = inf)")
    op("f16 add 1+2^-12", f16, 1 + F(3, 2 ** 13), R.add, 1.0, 3 * 2.0 ** -13)
    return out


CASES = cases()


def _values(res: torch.Tensor) -> list:
    return res.double().tolist()


def _as_f(v: float):
    return v if math.isinf(v) else F(v)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sr_probability_and_mean(case):
    name, dtype, x, fn = case
    a, u, p = _frac_p(x, dtype)
    b = a + u
    fmax = F(torch.finfo(dtype).max)
    bv = math.copysign(math.inf, float(u)) if abs(b) > fmax else b
    vals = _values(fn("sr", R.Stream(11)))
    ups = sum(1 for v in vals if _as_f(v) == bv)
    downs = sum(1 for v in vals if _as_f(v) == a)
    assert ups + downs == N, f"{name}: results outside {{a, b}}"
    if p == 0:
        assert ups == 0
        return
    sd = math.sqrt(N * float(p) * (1 - float(p)))
    assert abs(ups - N * float(p)) <= 6 * sd + 1, (name, ups / N, float(p))
    if not math.isinf(bv):
        mean = sum((F(v) for v in vals), F(0)) / N
        xv = a + p * u
        bound = abs(u) * (F(6 * math.sqrt(float(p) * (1 - float(p)) / N)) + F(1, N))
        assert abs(mean - xv) <= bound, name


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_random_and_ud(case):
    name, dtype, x, fn = case
    a, u, p = _frac_p(x, dtype)
    fmax = F(torch.finfo(dtype).max)
    # random: exact stays, else up/down with probability 1/2
    vals = _values(fn("random", R.Stream(12)))
    if p == 0:
        assert all(_as_f(v) == a for v in vals), name
    else:
        ups = sum(1 for v in vals if _as_f(v) != a)
        assert abs(ups - N / 2) <= 6 * math.sqrt(N / 4) + 1, name
    # ud: ieee result r, then r +- one grid step (in magnitude), probability 1/2 each
    r = _values(fn("ieee", R.Stream(0)))[0]
    vals = _values(fn("ud", R.Stream(13)))
    if math.isinf(r):
        assert all(v == r for v in vals)
        return
    rt = torch.tensor([r], dtype=dtype)
    up = torch.nextafter(rt, torch.tensor([math.copysign(math.inf, r)], dtype=dtype)).item()
    dn = torch.nextafter(rt, torch.zeros(1, dtype=dtype)).item()
    n_up = sum(1 for v in vals if v == up)
    n_dn = sum(1 for v in vals if v == dn)
    assert n_up + n_dn == N, name
    assert abs(n_up - N / 2) <= 6 * math.sqrt(N / 4) + 1, name
    if F(r) == fmax or F(-r) == fmax:
        assert math.isinf(up)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same values, same signs of zero, NaN where the other has NaN."""
    na, nb = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(na, nb) and torch.equal(a[~na], b[~nb])
                and torch.equal(torch.signbit(a[~na]), torch.signbit(b[~nb])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_ieee_matches_torch_casts_and_ops(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-30, 30, (5000,), generator=g).double())
    s = R.Stream(0)
    for backend in ("numba", "torch"):
        got = R.round(x, dtype=dtype, mode="ieee", stream=s, backend=backend)
        assert _same(got, x.to(dtype))
        a, b = x[:2500].to(dtype), x[2500:].to(dtype)
        # bf16/f16 arithmetic in torch is f32 then one rounding: innocuous double
        # rounding (24 >= 2p+2, Figueroa 1995), so it is correctly rounded.
        assert _same(R.add(a, b, mode="ieee", stream=s, backend=backend), a + b)
        assert _same(R.mul(a, b, mode="ieee", stream=s, backend=backend), a * b)
        assert _same(R.div(a, b, mode="ieee", stream=s, backend=backend), a / b)


def test_ud_special_values():
    s = R.Stream(1)
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan] * 100)
    for dtype in (torch.float32, torch.float64):
        y = R.round(x.double(), dtype=dtype, mode="ud", stream=s)
        assert torch.equal(torch.signbit(y[:2]), torch.tensor([False, True]))
        assert (y.view(-1, 5)[:, :4] == x.view(-1, 5)[:, :4].to(dtype)).all()
        assert torch.isnan(y.view(-1, 5)[:, 4]).all()
        # signed zeros of exact cancellation follow IEEE (+0 in round-to-nearest)
        z = R.add(torch.ones(100, dtype=dtype), -torch.ones(100, dtype=dtype), mode="sr",
                  stream=s)
        assert not torch.signbit(z).any()
        nz = R.add(-torch.zeros(10, dtype=dtype), -torch.zeros(10, dtype=dtype), mode="ud",
                   stream=s)
        assert torch.signbit(nz).all()
