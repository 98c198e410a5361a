"""Rounding diagnostic: SR versus UD (and random, ieee) on one value, theory vs draws.

For a value x between grid neighbours a < b = a + u of the target format (default:
binary32, a = 1.5, x = a + u/4), the exact distribution of one rounding of x under each
mode is derived with :class:`fractions.Fraction`:

* SR: b with probability p = (x-a)/u, else a: mean x (unbiased), variance u² p(1-p);
* UD: r = RN(x), then r + u⁺ or r - u⁻ with probability 1/2 (u⁺, u⁻ the grid steps
  above and below r): mean r + (u⁺-u⁻)/2 (= r away from powers of two, biased by r - x),
  variance u⁺u⁻ (= u²);
* random: a or b with probability 1/2: mean (a+b)/2, variance u²/4;
* ieee: RN(x) with variance 0.

The chain ``s_0 = a; s_{k+1} = round(s_k + δ)`` with δ = u/4 (a miniature harmonic
series) is propagated exactly by dynamic programming over the finite distribution of
s_k. Empirical means and variances over ``draws`` independent realizations (one tensor
element each) are compared with these moments; the tolerance is 6 standard errors from
the exact moments: |mean - μ| <= 6 σ/√N =: m and, for the sample variance,
|var - σ²| <= N/(N-1) (6 √((μ₄ - σ⁴)/N) + m²) + σ²/(N-1) (CLT).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from ..errors import RoundingError
from . import _api
from ._stream import Stream
from .reference import FMTS, neighbours, spacing

FMT_NAMES = {torch.float32: "binary32", torch.float64: "binary64",
             torch.bfloat16: "bfloat16", torch.float16: "binary16"}


def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > x else e


def one_rounding(x: Fraction, dtype: torch.dtype, mode: str,
                 t: int | None = None) -> dict[Fraction, Fraction]:
    """Exact distribution {value: probability} of rounding x > 0 once under ``mode``."""
    p_, emin, _ = FMTS[FMT_NAMES[dtype]]
    t = t or p_
    a, u = neighbours(x, t, p_, emin)
    d = (x - a) / u
    if d == 0 and mode != "ud":
        return {a: Fraction(1)}
    if mode in ("up", "down", "zero"):  # x > 0: up rounds away from zero, the others toward
        return {a + u if mode == "up" else a: Fraction(1)}
    if mode == "sr":
        # the kernels draw 53 bits: P(up) = floor(d 2**53) / 2**53
        pu = Fraction(math.floor(d * 2 ** 53), 2 ** 53)
        return _merge({a: 1 - pu, a + u: pu})
    if mode == "random":
        return {a: Fraction(1, 2), a + u: Fraction(1, 2)}
    r = a + u if d > Fraction(1, 2) or (d == Fraction(1, 2) and (a / u) % 2 == 1) else a
    if mode == "ieee":
        return {r: Fraction(1)}
    if mode == "farthest":
        return {a if r == a + u else a + u: Fraction(1)}
    e = _floor_log2(r)
    up = spacing(e, t, p_, emin)
    dn = spacing(e - 1, t, p_, emin) if r == Fraction(2) ** e else up
    return {r + up: Fraction(1, 2), r - dn: Fraction(1, 2)}


def _merge(dist: dict) -> dict:
    return {k: v for k, v in dist.items() if v != 0}


@dataclass
class Moments:
    mean: Fraction
    var: Fraction
    m4: Fraction  # fourth central moment

    @staticmethod
    def of(dist: dict[Fraction, Fraction]) -> "Moments":
        mu = sum((v * p for v, p in dist.items()), Fraction(0))
        var = sum(((v - mu) ** 2 * p for v, p in dist.items()), Fraction(0))
        m4 = sum(((v - mu) ** 4 * p for v, p in dist.items()), Fraction(0))
        return Moments(mu, var, m4)


def chain(s0: Fraction, delta: Fraction, steps: int, dtype: torch.dtype,
          mode: str) -> dict[Fraction, Fraction]:
    """Exact distribution of s_steps for s_{k+1} = round(s_k + delta) under ``mode``."""
    dist = {s0: Fraction(1)}
    for _ in range(steps):
        nxt: dict[Fraction, Fraction] = {}
        for v, p in dist.items():
            for w, q in one_rounding(v + delta, dtype, mode).items():
                nxt[w] = nxt.get(w, Fraction(0)) + p * q
        dist = nxt
    return dist


@dataclass
class Comparison:
    """Theory vs empirical moments of one experiment, in units of the grid step u."""

    mode: str
    exact: Fraction          # the exact real result the rounding should estimate
    theory: Moments
    emp_mean: Fraction
    emp_var: Fraction
    mean_bound: float
    var_bound: float
    unit: Fraction = field(repr=False)

    @property
    def ok(self) -> bool:
        return (abs(float(self.emp_mean - self.theory.mean)) <= self.mean_bound
                and abs(float(self.emp_var - self.theory.var)) <= self.var_bound)

    def as_dict(self) -> dict:
        u = self.unit
        return {"mode": self.mode,
                "theory_bias_ulp": float((self.theory.mean - self.exact) / u),
                "empirical_bias_ulp": float((self.emp_mean - self.exact) / u),
                "theory_std_ulp": math.sqrt(float(self.theory.var / u ** 2)),
                "empirical_std_ulp": math.sqrt(float(self.emp_var / u ** 2)),
                "mean_bound_ulp": self.mean_bound / float(u),
                "var_bound_ulp2": self.var_bound / float(u) ** 2,
                "ok": self.ok}


def _compare(mode: str, exact: Fraction, dist: dict, values: torch.Tensor,
             unit: Fraction) -> Comparison:
    th = Moments.of(dist)
    n = values.numel()
    # exact statistics over the (few) distinct values
    uniq, counts = torch.unique(values.double(), return_counts=True)
    vc = [(Fraction(v), c) for v, c in zip(uniq.tolist(), counts.tolist())]
    mean = sum((v * c for v, c in vc), Fraction(0)) / n
    var = sum(((v - mean) ** 2 * c for v, c in vc), Fraction(0)) / (n - 1)
    sd = math.sqrt(float(th.var))
    mean_bound = 6 * sd / math.sqrt(n)
    # s² = N/(N-1) (T - (mean - μ)²) with T = mean of (v - μ)²: |T - σ²| <= 6 sd(T),
    # sd(T) = √((μ₄ - σ⁴)/N); (mean - μ)² <= mean_bound²
    var_bound = (n / (n - 1) * (6 * math.sqrt(max(float(th.m4 - th.var ** 2), 0.0) / n)
                                + mean_bound ** 2) + float(th.var) / (n - 1))
    # zero theoretical variance (ieee) gives zero bounds: exact agreement required
    return Comparison(mode, exact, th, mean, var, mean_bound, var_bound, unit)


def run_diagnostic(dtype: torch.dtype = torch.float32, a: float = 1.5,
                   frac: Fraction = Fraction(1, 4), steps: int = 16, draws: int = 100_000,
                   seed: int = 0, backend: str = "auto") -> dict:
    """Run both experiments for every mode. Returns a JSON-able dict with, per
    experiment and mode, theory and empirical bias and std in ulps and the bounds."""
    p_, emin, _ = FMTS[FMT_NAMES[dtype]]
    A = Fraction(a)
    if float(torch.tensor(a, dtype=torch.float64).to(dtype)) != a or A <= 0:
        raise RoundingError(f"a = {a} must be a positive {dtype} value")
    _, u = neighbours(A, p_, p_, emin)
    x = A + frac * u
    delta = frac * u
    s = Stream(seed)
    out: dict = {"dtype": str(dtype).replace("torch.", ""), "a": a, "ulp": float(u),
                 "x": float(x), "frac": str(frac), "steps": steps, "draws": draws,
                 "single": [], "chain": []}
    # x = a + frac*u is passed exactly as the pair (hi, lo) = (a, frac*u)
    hi = torch.full((draws,), a, dtype=torch.float64)
    lo = torch.full((draws,), float(delta), dtype=torch.float64)
    if Fraction(float(delta)) != delta:
        raise RoundingError(f"frac = {frac} is not exact in float64 at this ulp")
    dvec = torch.full((draws,), float(delta), dtype=torch.float64).to(dtype)
    if Fraction(float(dvec[0])) != delta:
        raise RoundingError(f"frac * ulp = {float(delta)} is not a {dtype} value")
    for mode in _api.MODES:
        v = _api.round(hi, lo, dtype=dtype, mode=mode, stream=s, backend=backend)
        out["single"].append(_compare(mode, x, one_rounding(x, dtype, mode), v, u).as_dict())
        acc = torch.full((draws,), a, dtype=torch.float64).to(dtype)
        for _ in range(steps):
            acc = _api.add(acc, dvec, mode=mode, stream=s, backend=backend)
        exact = A + steps * delta
        out["chain"].append(_compare(mode, exact, chain(A, delta, steps, dtype, mode), acc,
                                     u).as_dict())
    return out
