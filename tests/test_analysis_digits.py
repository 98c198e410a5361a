"""Moments and significant digits against closed forms (synthetic normal noise, fixed seeds).

Bounds are derived in the comments; each holds with probability ≥ 1 − 1e-5 for a random
seed, and the seeds are fixed, so the tests are deterministic and cannot be flaky.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats as ss
import significantdigits as sdp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numvar.analysis import analyze, minimum_trials, significant_digits
from numvar.errors import AnalysisError
from numvar.runner.store import Samples

P, C = 0.95, 0.95


def delta_cnh(R, p=P, c=C):
    """Sohier et al.'s CNH correction: ½·log2((R−1)/χ²_{(1−c)/2,R−1}) + log2 Φ⁻¹((p+1)/2)."""
    return 0.5 * math.log2((R - 1) / ss.chi2.ppf((1 - c) / 2, R - 1)) + math.log2(
        ss.norm.ppf((p + 1) / 2))


def samples_of(caps, ref=None, **kw):
    R = next(iter(caps.values())).shape[0]
    return Samples(captures=caps, reference=ref or {}, indices=list(range(R)),
                   seeds=list(range(R)), **kw)


def normal(R, M, seed):
    return np.random.default_rng(seed).standard_normal((R, M))


def test_std_sem_closed_form():
    # x[r, j] = mu_j + sigma * eps, eps ~ N(0, 1). Per element, (R−1)s²/σ² ~ χ²_{R−1}, so
    # E[s] = c4·σ with c4 = sqrt(2/(R−1))·Γ(R/2)/Γ((R−1)/2) and Var[s] = σ²(1 − c4²).
    # The reported std is the mean of M independent s_j: its standard deviation is
    # σ·sqrt((1 − c4²)/M); we allow 6 of those (normal tail 2e-9) plus the 6-significant-
    # figure rounding of the JSON (relative 5e-6).
    R, M, sigma = 16, 4000, 0.25
    eps = normal(R, M, 1)
    mu = np.linspace(1, 2, M)
    x = torch.from_numpy(mu[None] + sigma * eps)
    res = analyze(samples_of({"y": x}, {"y": torch.from_numpy(mu)}))
    e = res["captures"]["y"]
    c4 = math.sqrt(2 / (R - 1)) * math.exp(math.lgamma(R / 2) - math.lgamma((R - 1) / 2))
    tol = 6 * sigma * math.sqrt((1 - c4 ** 2) / M) + 5e-6 * sigma
    assert abs(e["std"] - c4 * sigma) <= tol
    # sem is std/√R: the standard error of the mean, not the dispersion of one run
    assert e["sem"] == pytest.approx(e["std"] / math.sqrt(R), rel=1e-5)
    assert e["sem"] < e["std"] / 3.9
    # the mean |x|: mean of mu_j (=1.5) plus the mean of M·R noise terms / M (sd σ/√(RM))
    assert abs(e["mean_abs"] - 1.5) <= 6 * sigma / math.sqrt(R * M) + 1e-5
    assert e["varying_elements"] == M and e["shape"] == [M]
    # the other per-capture numbers against direct float64 computations (6 significant
    # figures in the JSON: relative 5e-6)
    xs = x.numpy()
    s = xs.std(axis=0, ddof=1)
    assert e["std_max"] == pytest.approx(s.max(), rel=5e-6)
    assert e["rel_std"] == pytest.approx(np.median(s / np.abs(xs.mean(axis=0))), rel=5e-6)
    assert e["mean"] == pytest.approx(xs.mean(), rel=5e-6)
    assert e["max_abs_dev_ref"] == pytest.approx(np.abs(xs - mu[None]).max(), rel=5e-6)


def test_std_sem_exact_scalar():
    # a scalar capture: std (R−1) and sem = s/√R computed in exact rational arithmetic
    vals = [1.0, 1.5, 0.25, 2.0, 1.125]
    q = [Fraction(v) for v in vals]
    m = sum(q) / len(q)
    var = sum((v - m) ** 2 for v in q) / (len(q) - 1)
    s = math.sqrt(var)
    res = analyze(samples_of({"loss": torch.tensor(vals, dtype=torch.float64)}))
    e = res["captures"]["loss"]
    assert e["mean"] == pytest.approx(float(m), rel=5e-6)
    assert e["std"] == pytest.approx(s, rel=5e-6)
    assert e["sem"] == pytest.approx(s / math.sqrt(len(vals)), rel=5e-6)


def test_cnh_digits_closed_form():
    # Relative error against the reference mu: Z = X/mu − 1 = σ·eps. numvar estimates σ by
    # the root mean square about the hypothesised centre 0, ρ̂² = mean Z²: R·ρ̂²/σ² = Q ~ χ²_R
    # (not χ²_{R−1}: no mean is estimated), and digits = −log2 ρ̂ − δ
    #   = −log2 σ − δ − ½·log2(Q/R).
    # Per element Q ∈ [χ²_R(α), χ²_R(1−α)] with α = 1e-6/M (union bound over M elements
    # and both tails: failure ≤ 2e-6), which bounds the min and max digits.
    # The sample median of M iid Q lies between the population quantiles 0.5 ∓ 5/(2√M)
    # (5-sigma binomial bound), which bounds the median digits.
    R, M, sigma = 20, 2000, 2.0 ** -12
    eps = normal(R, M, 2)
    mu = np.exp(np.linspace(-3, 3, M))
    x = torch.from_numpy(mu[None] * (1 + sigma * eps))
    sd = significant_digits(x, torch.from_numpy(mu))
    d = -math.log2(sigma) - delta_cnh(R)

    def at(q):
        return d - 0.5 * math.log2(q / R)

    a = 1e-6 / M
    lo, hi = at(ss.chi2.ppf(1 - a, R)), at(ss.chi2.ppf(a, R))
    assert lo <= sd.digits.min() and sd.digits.max() <= hi
    h = 5 / (2 * math.sqrt(M))
    med = float(np.median(sd.digits))
    assert at(ss.chi2.ppf(0.5 + h, R)) <= med <= at(ss.chi2.ppf(0.5 - h, R))
    assert sd.cap == 53 and not sd.no_variation.any() and not sd.undefined.any()
    # element for element: −log2 sqrt(mean Z²) − δ with Z formed in float64 as the package
    # forms it (no capping needed here)
    z = x.numpy() / mu[None] - 1
    np.testing.assert_allclose(sd.digits, -0.5 * np.log2((z ** 2).mean(axis=0)) - delta_cnh(R),
                               rtol=0, atol=1e-9)
    # ... which is the package's value minus ½·log2(1 + m²/σ̂²) (m, σ̂: mean and
    # population std of Z); the package alone ignores m
    raw = sdp.significant_digits(x.numpy(), reference=mu, axis=0, method=sdp.Method.CNH,
                                 error=sdp.Error.Relative, probability=P, confidence=C)
    m, s = z.mean(axis=0), z.std(axis=0)
    np.testing.assert_allclose(sd.digits, raw - 0.5 * np.log2(1 + (m / s) ** 2), rtol=0,
                               atol=1e-9)
    assert (sd.digits < raw).all()
    # against the sample mean, m ≈ 0 (rounding only): the package's value
    sdm = significant_digits(x, "mean")
    rawm = sdp.significant_digits(x.numpy(), reference=x.numpy().mean(axis=0), axis=0,
                                  method=sdp.Method.CNH, error=sdp.Error.Relative,
                                  probability=P, confidence=C)
    np.testing.assert_allclose(sdm.digits, rawm, rtol=0, atol=1e-9)
    # and analyze's summary is that of significant_digits
    res = analyze(samples_of({"y": x}, {"y": torch.from_numpy(mu)}), basis=2)
    assert res["captures"]["y"]["digits"]["median"] == pytest.approx(med, abs=1e-6)
    assert res["captures"]["y"]["digits"]["min"] == pytest.approx(float(sd.digits.min()), abs=1e-6)


def test_general_digits_closed_form():
    # General method: s = max{k ∈ [0, 53] : |Z_i| ≤ 2^-k ∀i}. With Z = σ·eps, the max of
    # R half-normals satisfies P(max|eps| > t) ≤ 2R·Φ(−t) and P(max|eps| < u) = (2Φ(u)−1)^R.
    # Choosing t, u so that both are ≤ 1e-6/M bounds every element's digits between
    # floor(−log2(σt)) and floor(−log2(σu)) (s is a decreasing step function of max|Z|).
    R, M, sigma = 30, 1000, 2.0 ** -10
    eps = normal(R, M, 3)
    x = torch.from_numpy(3.0 * (1 + sigma * eps))
    sd = significant_digits(x, torch.full((M,), 3.0), method="general")
    a = 1e-6 / M
    t = ss.norm.isf(a / (2 * R))
    u = ss.norm.ppf(((a ** (1 / R)) + 1) / 2)
    assert math.floor(-math.log2(sigma * t)) <= sd.digits.min()
    assert sd.digits.max() <= math.floor(-math.log2(sigma * u))
    # exact definition, element by element, with Z computed as the package does
    z = np.abs(x.numpy() / 3.0 - 1).max(axis=0)
    k = np.array([max(kk for kk in range(54) if zz <= 2.0 ** -kk) for zz in z])
    np.testing.assert_array_equal(sd.digits, k)


def test_basis_10_and_absolute_error():
    R, M = 12, 300
    eps = normal(R, M, 4)
    x = torch.from_numpy(8.0 * (1 + 1e-5 * eps))
    ref = torch.full((M,), 8.0)
    b2 = significant_digits(x, ref)
    b10 = significant_digits(x, ref, basis=10)
    np.testing.assert_allclose(b10.digits, b2.digits * math.log10(2), rtol=1e-14)
    assert b10.cap == pytest.approx(53 * math.log10(2))
    # absolute error scales by e = floor(log2|ref|) + 1 = 4: Z_abs = 8·Z_rel, so the
    # absolute digits −log2(σ̂_abs) + (e − 1) − δ equal the relative ones
    ab = significant_digits(x, ref, error="absolute")
    np.testing.assert_allclose(ab.digits, b2.digits, rtol=0, atol=1e-9)


def _z_digits(z, R):
    """Closed form of numvar's CNH digits for given relative errors (float64 rationals
    turned into one float): −½·log2(mean Z²) − δ(R)."""
    ms = sum(Fraction(v) ** 2 for v in z) / len(z)
    return -0.5 * math.log2(ms) - delta_cnh(R)


def test_cnh_bias_constant():
    # Every realization carries the same relative bias b = 2^-10 against the reference
    # (e.g. op granularity: a float64-then-rounded result that differs from native IEEE
    # without varying). Z_i = b exactly: ρ̂ = b, digits = 10 − δ(4) ≈ 7.13 (the package's
    # max|Z| fallback gives the same); General: max{k : b ≤ 2^-k} = 10.
    R, b = 4, 2.0 ** -10
    ref = torch.tensor([1.0, -3.0, 0.75], dtype=torch.float64)
    x = (ref * (1 + b)).repeat(R, 1)
    sd = significant_digits(x, ref)
    np.testing.assert_allclose(sd.digits, 10 - delta_cnh(R), rtol=0, atol=1e-12)
    assert sd.digits[0] == pytest.approx(7.1306, abs=1e-4)
    assert not sd.no_variation.any() and not sd.undefined.any()
    assert significant_digits(x, ref, method="general").digits.tolist() == [10.0] * 3
    # absolute error: Z = b·x, e − 1 = floor(log2|x|); −log2|b·x| + floor(log2|x|) − δ
    ab = significant_digits(x, ref, error="absolute")
    r = ref.abs().numpy()
    np.testing.assert_allclose(ab.digits, 10 - np.log2(r) + np.floor(np.log2(r)) - delta_cnh(R),
                               rtol=0, atol=1e-12)


def test_cnh_bias_plus_tiny_spread():
    # Same bias, plus 2^-22 on one realization: Z = (b + ε, b, b, b). The package's CNH
    # takes the std about the mean of Z (≈ 2^-23.2: 20.3 bits, the bias dropped); numvar
    # takes ρ̂² = mean Z² = b² + (2bε + ε²)/R, so the digits stay ≈ 7.13.
    R, b, e = 4, 2.0 ** -10, 2.0 ** -22
    ref = torch.tensor([1.0], dtype=torch.float64)
    x = torch.full((R, 1), 1 + b, dtype=torch.float64)
    x[0, 0] += e
    expect = _z_digits([b + e, b, b, b], R)
    sd = significant_digits(x, ref)
    assert sd.digits[0] == pytest.approx(expect, abs=1e-9)
    assert abs(sd.digits[0] - (10 - delta_cnh(R))) < 1e-3       # the bias is kept
    raw = sdp.significant_digits(x.numpy(), reference=ref.numpy(), axis=0)
    assert raw[0] > 20                                          # the package's jump
    # General: max|Z| = b + ε > 2^-10, so 9
    assert significant_digits(x, ref, method="general").digits.tolist() == [9.0]


def test_cnh_bias_and_spread_comparable():
    # Z = b ± σ alternately (R even): mean b, population std σ exactly, ρ̂² = b² + σ².
    # numvar: −½·log2(b² + σ²) − δ; the package: −log2 σ − δ (bias ignored).
    R, b, sig = 8, 2.0 ** -12, 2.0 ** -14
    z = [b + sig, b - sig] * (R // 2)
    x = torch.tensor([[1 + v] for v in z], dtype=torch.float64)
    ref = torch.ones(1, dtype=torch.float64)
    d = significant_digits(x, ref).digits[0]
    assert d == pytest.approx(-0.5 * math.log2(b * b + sig * sig) - delta_cnh(R), abs=1e-9)
    assert d == pytest.approx(_z_digits(z, R), abs=1e-9)
    raw = sdp.significant_digits(x.numpy(), reference=ref.numpy(), axis=0)[0]
    assert raw == pytest.approx(14 - delta_cnh(R), abs=1e-9)
    assert raw - d > 1.9   # ½·log2(1 + 16) = 2.04 bits the package over-counts


def test_cnh_pure_spread_unchanged():
    # No bias: Z = ±σ alternately, mean exactly 0: ρ̂ = σ̂ = σ and numvar equals the
    # package, −log2 σ − δ. Absolute error, reference 8 (e − 1 = 3): Z_abs = 8·Z_rel.
    R, sig = 6, 2.0 ** -17
    z = [sig, -sig] * (R // 2)
    x = torch.tensor([[8 * (1 + v)] for v in z], dtype=torch.float64)
    ref = torch.full((1,), 8.0, dtype=torch.float64)
    for error in ("relative", "absolute"):
        d = significant_digits(x, ref, error=error).digits[0]
        raw = sdp.significant_digits(x.numpy(), reference=ref.numpy(), axis=0,
                                     error=error)[0]
        assert d == pytest.approx(17 - delta_cnh(R), abs=1e-9)
        assert d == pytest.approx(raw, abs=1e-9)
    # in float32 (cap 24): spread of one ulp 2^-23 around 1 → 23 − δ(6) bits
    x32 = torch.tensor([[1 + 2.0 ** -23], [1 - 2.0 ** -23]] * 3, dtype=torch.float32)
    d32 = significant_digits(x32, torch.ones(1)).digits[0]
    assert d32 == pytest.approx(23 - delta_cnh(R), abs=1e-9)


def test_cnh_continuous_as_spread_vanishes():
    # Spread ε = 2^-k on one realization over a bias b = 2^-10, k = 12 … 52: the digits
    # follow −½·log2(b² + (2bε + ε²)/R) − δ, decrease towards the zero-spread value
    # 10 − δ as ε → 0, and differ from it by ½·log2(1 + (2ε/b + ε²/b²)/R) ≤ ε/(b·R·ln 2)
    # (+ ε² terms). The package's values instead jump above 20 bits for every k ≥ 22.
    R, b = 4, 2.0 ** -10
    ref = torch.ones(1, dtype=torch.float64)
    base = 10 - delta_cnh(R)
    prev = -math.inf
    for k in range(12, 53, 2):
        e = 2.0 ** -k
        x = torch.full((R, 1), 1 + b, dtype=torch.float64)
        x[0, 0] = 1 + b + e          # exact in float64 for k ≤ 52
        d = float(significant_digits(x, ref).digits[0])
        assert d == pytest.approx(_z_digits([b + e, b, b, b], R), abs=1e-9)
        gap = base - d
        assert 0 <= gap <= e / (b * R * math.log(2)) * (1 + e / b) + 1e-12
        assert d >= prev - 1e-12     # non-decreasing as ε shrinks
        prev = d
        if k >= 22:
            raw = sdp.significant_digits(x.numpy(), reference=ref.numpy(), axis=0)[0]
            assert raw - base > 13
    assert base - prev < 1e-9


@pytest.mark.filterwarnings("ignore")
def test_cap_and_no_variation_float32():
    R = 6
    base = torch.tensor([1.0, -3.5, 0.0, 1e-30, 7.0], dtype=torch.float32)
    x = base.repeat(R, 1)
    x[2, 4] = torch.nextafter(torch.tensor(7.0), torch.tensor(8.0))  # one ulp once
    sd = significant_digits(x, base)
    # the package alone reports ≈ 50 bits where nothing varied (the float64 mantissa)
    raw = sdp.significant_digits(x.double().numpy(), reference=base.double().numpy(), axis=0)
    assert raw[0] > 40
    assert sd.cap == 24 and sd.precision_bits == 24
    assert sd.no_variation.tolist() == [True, True, True, True, False]
    assert sd.digits[:4].tolist() == [24.0] * 4
    assert 0 < sd.digits[4] <= 24
    res = analyze(samples_of({"y": x}, {"y": base}), basis=2)
    dg = res["captures"]["y"]["digits"]
    assert dg["no_variation"] == 4 and dg["no_variation_share"] == 0.8
    assert not dg["all_no_variation"] and dg["cap"] == 24.0
    assert dg["median"] == 24.0 and dg["median_varying"] == pytest.approx(float(sd.digits[4]), abs=1e-6)
    assert sum(dg["histogram"]["counts"]) == 5
    same = analyze(samples_of({"y": base.repeat(R, 1)}, {"y": base}), basis=2)["captures"]["y"]["digits"]
    assert same["all_no_variation"] and same["median"] == 24.0 and same["median_varying"] is None
    # bfloat16 / float16 caps
    assert significant_digits(base.repeat(R, 1).bfloat16(), base.bfloat16()).cap == 8
    assert significant_digits(base.repeat(R, 1).half(), "mean", precision_bits=11).cap == 11


def test_zero_reference_and_nonfinite():
    x = torch.tensor([[0.0, 0.0, 1.0, float("nan")], [1e-9, 0.0, 1.0, float("nan")],
                      [-1e-9, 0.0, 1.0, float("nan")]])
    ref = torch.tensor([0.0, 0.0, 1.0, 1.0])
    sd = significant_digits(x, ref)
    assert sd.undefined.tolist() == [True, False, False, True]
    assert sd.no_variation.tolist() == [False, True, True, False]
    assert sd.digits.tolist() == [0.0, 24.0, 24.0, 0.0]


def test_against_mean_and_virtual_precision():
    R, M = 10, 200
    eps = normal(R, M, 5)
    x = torch.from_numpy(2.0 + 1e-3 * eps)
    sd = significant_digits(x, "mean")
    mean = x.numpy().mean(axis=0)
    raw = sdp.significant_digits(x.numpy(), reference=mean, axis=0)
    np.testing.assert_array_equal(sd.digits, raw)
    # a run at virtual precision t caps at t bits
    s = samples_of({"y": torch.ones(R, 3)}, config={"precision": 10})
    assert analyze(s, basis=2)["captures"]["y"]["digits"]["cap"] == 10.0


def test_minimum_trials_and_errors():
    assert minimum_trials(0.99, 0.95) == 299
    assert minimum_trials(0.95, 0.95) == math.ceil(math.log(0.05) / math.log(0.95)) == 59
    res = analyze(samples_of({"y": torch.ones(5, 2)}))
    assert res["settings"]["minimum_trials"] == 59 and not res["settings"]["enough_trials"]
    assert any("59" in n for n in res["notes"])
    with pytest.raises(AnalysisError):
        significant_digits(torch.ones(3, 2), torch.ones(2), method="bogus")
    with pytest.raises(AnalysisError):
        significant_digits(torch.ones(1, 2), torch.ones(2))
    with pytest.raises(AnalysisError):
        significant_digits(torch.ones(3, 2), torch.ones(3))
    with pytest.raises(AnalysisError):
        analyze(samples_of({"y": torch.ones(1, 2)}))


@settings(max_examples=25, deadline=None, derandomize=True)  # fixed examples
@given(st.integers(2, 12), st.integers(1, 6), st.integers(-30, 30), st.integers(0, 2 ** 31),
       st.sampled_from(["cnh", "general"]), st.sampled_from([2, 10]))
def test_digits_invariants(R, M, k, seed, method, basis):
    # digits lie in [0, cap]; no-variation elements sit exactly at the cap; the relative
    # error is invariant under scaling by 2^k (exact in binary floating point)
    g = torch.Generator().manual_seed(seed)
    x = (1 + 2.0 ** -20 * torch.randn(R, M, generator=g, dtype=torch.float64)).float()
    x[:, 0] = 1.0  # one element never varies
    ref = torch.ones(M)
    a = significant_digits(x, ref, method=method, basis=basis)
    b = significant_digits(x * 2.0 ** k, ref * 2.0 ** k, method=method, basis=basis)
    assert np.all((a.digits >= 0) & (a.digits <= a.cap))
    assert a.no_variation[0] and a.digits[0] == a.cap
    np.testing.assert_array_equal(a.digits, b.digits)
    np.testing.assert_array_equal(a.no_variation, b.no_variation)
