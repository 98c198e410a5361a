"""The scalar budgets against the formalisation's table and an exact (Fraction)
transcription of the issue's formulas."""

import functools
from fractions import Fraction as Fr

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numvar.bounds import budgets as B

UACC, ULEAF = Fr(1, 2 ** 24), Fr(1, 2 ** 8)


# --- exact transcriptions of the formulas (issue 7), in Fractions -----------------------
@functools.lru_cache(maxsize=None)
def pw(u: Fr, k: int) -> Fr:
    return (1 + u) ** k


def br_exact(uacc, uleaf, n):
    return (pw(uacc, n + 1) - 1) * (1 + uleaf) ** 2 + (2 * uleaf + uleaf ** 2)


def mixed_exact(n, w, A, E, beta, uacc=UACC, uleaf=ULEAF):
    b = br_exact(uacc, uleaf, n)
    P = n * w * (A + E)
    return uacc * ((1 + uleaf) * (1 + b) * P + beta) + uleaf * (1 + b) * P + b * P + n * w * E


def fp32_exact(m, w, A, E, beta, u=UACC):
    return (pw(u, m + 2) - 1) * (m * w * (A + E) + beta) + m * w * E


def close(x: float, exact: Fr, rel=1e-13) -> bool:
    # float64 evaluation with expm1/log1p: a few ulps relative; 1e-13 leaves ample room
    return abs(Fr(x) - exact) <= rel * abs(exact) + Fr(1, 10 ** 300)


# --- the formalisation's table --------------------------------------------------------
@pytest.mark.parametrize("n,table", [(147, 0.0078), (576, 0.0079), (4608, 0.0081),
                                     (512, 0.0079), (9, 0.0078)])
def test_br_table(n, table):
    value = B.br(B.U_FP32, B.U_BF16, n)
    assert close(value, br_exact(UACC, ULEAF, n))
    assert round(value, 4) == table           # the table as printed (to 1e-4)
    print(f"br(2^-24, 2^-8, {n}) = {value:.6g}  (table {table})")


def test_gain_epsilon_at_4608():
    """"gain ε" = gain/(n·w) - 1: the excess of a layer's E-coefficient over the exact
    amplification n·w. fp32: gain = m·w·(1+u)^(m+2) from layerBudget, so ε = (1+u)^(n+2)-1;
    bf16-mixed: ε = br + uleaf(1+br) + uacc(1+uleaf)(1+br)."""
    n = 4608
    e32 = B.gain_epsilon(n, "fp32")
    e16 = B.gain_epsilon(n, "bf16-mixed")
    print(f"gain eps n=4608: fp32 {e32:.6g}, bf16-mixed {e16:.6g}")
    assert f"{e32:.3g}" == "0.000275"
    assert f"{e16:.5g}" == "0.012043"
    # derived from the budgets: ε is the coefficient of E (with n·w = 1), minus one
    w = Fr(1, n)
    coef32 = fp32_exact(n, w, Fr(3), Fr(1), Fr(0)) - fp32_exact(n, w, Fr(3), Fr(0), Fr(0))
    coef16 = mixed_exact(n, w, Fr(3), Fr(1), Fr(0)) - mixed_exact(n, w, Fr(3), Fr(0), Fr(0))
    assert close(e32, coef32 - 1, 1e-11)
    assert close(e16, coef16 - 1, 1e-12)
    assert close(B.layer_gain(n, 0.25), coef32 * n / 4, 1e-12)
    assert close(B.mixed_gain(n, 0.25), coef16 * n / 4, 1e-12)


sizes = st.integers(1, 600)  # exact (1+u)^n stays cheap
mags = st.fractions(min_value=0, max_value=1000, max_denominator=1000)
weights = st.fractions(min_value=0, max_value=4, max_denominator=1000)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=sizes, w=weights, A=mags, E=mags, beta=mags)
def test_budgets_match_exact_formulas(n, w, A, E, beta):
    f = float
    assert close(B.layer_budget(n, f(w), f(A), f(E), f(beta)), fp32_exact(n, w, A, E, beta),
                 1e-12)
    assert close(B.mixed_budget(n, f(w), f(A), f(E), f(beta)), mixed_exact(n, w, A, E, beta),
                 1e-12)
    # affine in E: budget = gain·E + offset
    assert close(B.layer_gain(n, f(w)) * f(E) + B.layer_offset(n, f(w), f(A), f(beta)),
                 fp32_exact(n, w, A, E, beta), 1e-12)
    assert close(B.mixed_gain(n, f(w)) * f(E) + B.mixed_offset(n, f(w), f(A), f(beta)),
                 mixed_exact(n, w, A, E, beta), 1e-12)
    assert close(B.layer_magnitude(n, f(w), f(A), f(beta)),
                 n * w * A + beta + fp32_exact(n, w, A, 0, beta), 1e-12)
    assert close(B.mixed_magnitude(n, f(w), f(A), f(beta)),
                 n * w * A + beta + mixed_exact(n, w, A, 0, beta), 1e-12)
    # without bias the mixed budget is the looser one (bf16 operands cost 2·uleaf > (n+2)·u
    # for n < 2^17); the bias is rounded once in mixed, n+2 times in the fp32 budget
    assert B.mixed_budget(n, f(w), f(A), f(E)) >= B.layer_budget(n, f(w), f(A), f(E))


def test_other_layer_budgets_exact():
    u = UACC
    Ax, Ex, Ay, Ey = Fr(3), Fr(1, 7), Fr(5, 2), Fr(1, 9)
    assert close(B.residual_add_budget(*map(float, (Ax, Ex, Ay, Ey))),
                 u * (Ax + Ex + Ay + Ey) + Ex + Ey)
    k, A, E, s = 9, Fr(7, 3), Fr(1, 100), Fr(4, 9)
    assert close(B.avgpool_budget(k, float(A), float(E), float(s)),
                 ((1 + u) ** (k + 2) - 1) * s * (A + E) + s * E)
    a, mua, beta = Fr(-3, 2), Fr(1, 3), Fr(-5, 4)
    g7 = 7 * u / (1 - 7 * u)
    assert close(B.batchnorm_budget(float(a), float(mua), float(beta), float(A), float(E)),
                 g7 * (abs(a) * (A + E) + abs(mua) + abs(beta)) + abs(a) * E)
    assert B.relu_budget(2.0, 0.5) == (2.0, 0.5)
    with pytest.raises(ValueError):
        B.gamma(0.5, 2)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(gain=st.fractions(min_value=0, max_value=3, max_denominator=64),
       c=st.fractions(min_value=0, max_value=10, max_denominator=64),
       d=st.integers(0, 30), E0=st.fractions(min_value=0, max_value=5, max_denominator=64))
def test_identical_layers_closed_form(gain, c, d, E0):
    E = E0
    m = B.AffineError(1.0, 0.0)
    for _ in range(d):
        E = gain * E + c
        m = m.then(B.AffineError(float(gain), float(c)))
    closed = B.identical_layers(float(gain), float(c), d, float(E0))
    assert close(closed, E, 1e-12)
    assert close(m(float(E0)), E, 1e-12)


@pytest.mark.parametrize("gain", [1 + 2.0 ** -40, 1 - 2.0 ** -40, 1 + 2.0 ** -20, 0.5, 1.5])
def test_identical_layers_near_one(gain):
    """gain^d - 1 without cancellation: relative 1e-12 of the exact geometric sum even
    when gain is within 2^-40 of 1 (the naive (gain^d - 1)/(gain - 1) loses ~6 digits)."""
    d, c, E0 = 1000, 0.75, 0.5
    g = Fr(gain)
    gd = g ** d
    exact = gd * Fr(E0) + Fr(c) * (gd - 1) / (g - 1)      # exact geometric sum
    assert close(B.identical_layers(gain, c, d, E0), exact, 1e-12)


def test_precisions():
    assert B.get_precision("fp32").uacc == 2.0 ** -24 and not B.get_precision("fp32").mixed
    p = B.get_precision("bf16-mixed")
    assert p.mixed and p.uleaf == 2.0 ** -8 and p.uacc == 2.0 ** -24
    from numvar.errors import ConfigError

    with pytest.raises(ConfigError, match="fp16"):
        B.get_precision("fp16")
