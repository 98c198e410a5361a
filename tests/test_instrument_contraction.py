"""``contraction="fma"``: one rounding per multiply-add. The numba kernels (clean-row fast
path, checked rows, scalar binary64 path) against the exact rational reference
(``contract_reference(..., contraction="fma")``, Fractions rounded by
``numvar.rounding.reference.round_exact``), bit for bit, every mode, binary32 and
binary64, at the formats' own and at virtual precisions; and its plumbing (config, env,
``fuzzy``, ``sample``, the CLI)."""

import numba
import numpy as np
import pytest
import torch

torch.set_num_threads(1)
numba.set_num_threads(1)

from numvar.errors import ConfigError
from numvar.instrument import FuzzyConfig, fuzzy
from numvar.instrument import kernels as KN
from numvar.rounding import kernels as RK


@numba.njit
def _cleanfma32_row(acc, jg, arow, b64, ukey, base, n, mode, t):
    """``KN._cleanfma32`` as ``_contract_fast32`` calls it: column offset the constant 0
    (a literal type; from Python, 0 would be an int64 and compile the loop once more)."""
    KN._cleanfma32(acc, jg, arow, b64, ukey, base, 0, n, mode, t)


MODES = ("ieee", "sr", "ud", "random")


def _same(a, b):
    num = ~np.isnan(a)
    return np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a)[num],
                                                                   np.signbit(b)[num])


def _operands(dt, seed):
    """(a, b): 4 rows x 6 terms x 11 columns. Row 0 clean, well scaled; row 1 clean with
    a cancellation whose exact sum (2**-147 scale) lies below binary32's normal range
    (the fast path must hand it to the full path); row 2 with tiny and huge magnitudes
    (not clean); row 3 with zeros and signed zeros."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-2, 2, (1, 4, 6))
    b = rng.uniform(-2, 2, (1, 6, 11))
    if dt == np.float32:
        a[0, 1, :] = 0.75
        a[0, 1, 0] = 2.0 ** -49
        a[0, 1, 1] = 2.0 ** -49 * (1 + 2.0 ** -23)
        b[0, 0, 3] = 2.0 ** -52
        b[0, 1, 3] = -(2.0 ** -52) * (1 - 2.0 ** -23)
        b[0, 0, 4] = 2.0 ** -52
        b[0, 1, 4] = -(2.0 ** -52)
        a[0, 2, 1] = 2.0 ** -140
        a[0, 2, 2] = 2.0 ** 100
    else:
        a[0, 2, 1] = 2.0 ** -1060
        a[0, 2, 2] = 2.0 ** 900
    a[0, 3, ::2] = 0.0
    a[0, 3, 1] = -0.0
    return a.astype(dt), b.astype(dt)


@numba.njit
def _decisions(q, thr):  # pragma: no cover - compiled
    """Both spellings of the fma loop's SR decision (``kernels._below_trunc``), lane by
    lane: the int64 compare (AVX-512 hosts) and the float64 one (AVX2 hosts)."""
    as_int = np.empty(q.size, np.bool_)
    as_float = np.empty(q.size, np.bool_)
    exact = np.empty(q.size, np.bool_)
    for i in range(q.size):
        as_int[i] = np.int64(q[i]) < np.int64(thr[i])
        as_float[i] = KN._u53_f64(q[i]) + 1.0 <= thr[i]
        exact[i] = KN._u53_f64(q[i]) == np.float64(q[i])
    return as_int, as_float, exact


def test_fma_sr_decision_is_the_same_in_int64_and_in_float64():
    """q < trunc(thr) for q = r >> 11 below 2**53 and thr in int64's range: the int64
    compare, the float64 compare q + 1 <= thr and Python's integers agree on the edges
    (thr at, just below and just above q + 1; negative, zero, fractions; beyond 2**53,
    where the clean loop's thr can reach 2**53 + 2**23) and on random draws; the float64
    value of q is exact."""
    import math

    rng = np.random.default_rng(5)
    qs = [0, 1, 2, 3, 2**52 - 1, 2**52, 2**52 + 1, 2**53 - 2, 2**53 - 1]
    qs += [int(x) >> 11 for x in rng.integers(0, 2**63, 64, dtype=np.int64)] + [
        int(x) for x in rng.integers(0, 2**53, 64, dtype=np.int64)]
    q, thr = [], []
    for v in qs:
        for t in (v + 1, v + 1.5, v + 0.5, v, v + 2, v - 1, -0.5, -1.0, -3.7, 0.0, 0.25,
                  2.0**53, 2.0**53 + 2.0**23, 2.0**62):
            q.append(v)
            thr.append(float(t))
    q = np.array(q, np.uint64)
    thr = np.array(thr)
    as_int, as_float, exact = _decisions(q, thr)
    expect = np.array([int(a) < math.trunc(t) for a, t in zip(q.tolist(), thr.tolist())])
    assert exact.all()
    np.testing.assert_array_equal(as_int, expect)
    np.testing.assert_array_equal(as_float, expect)
    assert expect.any() and not expect.all()


@pytest.mark.parametrize("dt,ts", [(np.float32, (24, 11, 8)), (np.float64, (53, 30))])
def test_fma_contract_matches_exact_reference(dt, ts):
    for seed in (0, 1):
        a, b = _operands(dt, seed)
        for t in ts:
            for m in MODES:
                code = RK.mode_code(m)
                got = KN.contract(a, b, 77 + seed, code, t, contraction="fma")
                want = KN.contract_reference(a, b, 77 + seed, code, t, contraction="fma")
                assert got.dtype == dt
                assert _same(got, want), (dt, t, m, seed)


def test_fma_clean_row_takes_the_fast_path_and_rejects_the_cancellation():
    a, b = _operands(np.float32, 0)
    assert KN.clean_rows(a, b, 1, 24)[:2].all()  # rows 0 and 1 are clean
    code = RK.MODE_SR
    got = KN.contract(a, b, 5, code, 24, contraction="fma")
    # the exact first two terms of row 1, column 3 sum to 2**-147 (subnormal): the full
    # path must have rounded on the subnormal grid, as the reference does
    want = KN.contract_reference(a, b, 5, code, 24, contraction="fma")
    assert _same(got, want)


def test_fma_clean_loop_hands_over_sums_just_below_a_grid_point():
    """acc = 1, then 1 + (-2**-60): the float64 sum is 1.0 (on the binary32 grid) with a
    negative residual, where the rounding core steps down a finer grid: the clean loop's
    integer decision gives the lane up (NaN) and the full path matches the exact
    reference; the neighbouring lanes (residuals of both signs off the grid) stay."""
    a = np.array([[[1.0, 2.0 ** -30]]], np.float32)
    b = np.array([[[1.0, 1.0, 1.5], [-(2.0 ** -30), 2.0 ** -30, -(1 + 2.0 ** -23) / 4]]],
                 np.float32)  # column 2: 1.5 - 2**-32 - 2**-55, off the grid, residual < 0
    jg = np.arange(3, dtype=np.uint64) * np.uint64(RK.GAMMA)
    for m in ("sr", "random"):
        code = RK.mode_code(m)
        acc = np.empty(3)
        # b widened to float64, as contract passes it (the same values; the same
        # signature, column offset the literal 0, so the compiled loop is the cached one)
        _cleanfma32_row(acc, jg, a[0, 0], b[0].astype(np.float64), np.uint64(9),
                        np.uint64(0), 3, code, 24)
        assert np.isnan(acc[0]) and not np.isnan(acc[1:]).any(), m
        want = KN.contract_reference(a, b, 9, code, 24, contraction="fma")
        assert _same(acc[1:].astype(np.float32), want[0, 0, 1:]), m
        assert _same(KN.contract(a, b, 9, code, 24, contraction="fma"), want), m


def test_fma_ieee_is_sequential_fused_multiply_add():
    """ieee with fma: acc = fl(acc + a·b) with the exact product: numpy's float64 fma of
    binary32 operands is exact before the cast (48-bit products, sums checked)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 3, 9)).astype(np.float32)
    b = rng.standard_normal((1, 9, 5)).astype(np.float32)
    got = KN.contract(a, b, 0, RK.MODE_IEEE, 24, contraction="fma")
    from fractions import Fraction
    for i in range(3):
        for j in range(5):
            acc = np.float32(Fraction(float(a[0, i, 0])) * Fraction(float(b[0, 0, j])))
            for k in range(1, 9):
                exact = Fraction(float(acc)) + Fraction(float(a[0, i, k])) * Fraction(float(b[0, k, j]))
                acc = np.float32(float(exact)) if abs(exact) > 2 ** -100 else np.float32(exact)
                # float(exact) rounds to binary64 first: exact for these magnitudes unless a
                # tie of binary32 is broken by it, which 48 + 24-bit values cannot produce
            assert got[0, i, j] == acc


def test_fma_differs_from_separate_and_halves_nothing_else():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((1, 8, 64)).astype(np.float32)
    b = rng.standard_normal((1, 64, 16)).astype(np.float32)
    sep = KN.contract(a, b, 9, RK.MODE_SR, 24)
    assert _same(sep, KN.contract(a, b, 9, RK.MODE_SR, 24, contraction="separate"))
    assert not np.array_equal(sep, KN.contract(a, b, 9, RK.MODE_SR, 24, contraction="fma"))
    with pytest.raises(ValueError):
        KN.contract(a, b, 9, RK.MODE_SR, 24, contraction="fused")


# ------------------------------------------------------------------------------ plumbing
def test_config_env_and_cli_forms():
    assert FuzzyConfig().contraction == "separate"
    cfg = FuzzyConfig(contraction="fma")
    env = cfg.to_env()
    assert env["NUMVAR_CONTRACTION"] == "fma"
    assert FuzzyConfig.from_env(env) == cfg
    assert "NUMVAR_CONTRACTION" not in FuzzyConfig().to_env()  # default: unchanged env
    assert FuzzyConfig.from_env({"NUMVAR_MODE": "sr"}).contraction == "separate"
    with pytest.raises(ConfigError):
        FuzzyConfig(contraction="fused")
    with pytest.raises(ConfigError):
        FuzzyConfig.from_env({"NUMVAR_MODE": "sr", "NUMVAR_CONTRACTION": "fused"})
    from numvar.runner.script import _canonical_command, fuzzy_env

    conf = {"mode": "sr", "granularity": "flop", "precision": None, "contraction": "fma",
            "n": 2, "seed": 0, "jobs": 1, "capture": [], "exclude": [], "include": [],
            "modules": [], "capture_layers": [], "files": [], "executor": "local"}
    assert fuzzy_env(conf, 3)["NUMVAR_CONTRACTION"] == "fma"
    assert "--contraction" in _canonical_command(conf, "out", ["python", "x.py"])


def test_mode_routes_contractions_through_the_fma_kernel():
    """ieee needs no key: torch.mm and conv2d under fuzzy(contraction="fma") equal the fma
    kernel's ieee result; sr is reproducible and differs from "separate"."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((5, 33)).astype(np.float32)
    b = rng.standard_normal((33, 7)).astype(np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    with fuzzy(mode="ieee", contraction="fma"):
        got = torch.mm(ta, tb)
    want = KN.contract(a[None], b[None], 0, RK.MODE_IEEE, 24, contraction="fma")[0]
    assert _same(got.numpy(), want)
    outs = []
    for con in ("fma", "fma", "separate"):
        with fuzzy(mode="sr", seed=1, contraction=con):
            outs.append(torch.mm(ta, tb))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_sample_takes_the_contraction():
    from numvar.runner import sample

    x = torch.randn(4, 16)
    w = torch.randn(16, 3)
    s_fma = sample(lambda: x @ w, n=2, seed=0, contraction="fma")
    s_sep = sample(lambda: x @ w, n=2, seed=0)
    with fuzzy(mode="sr", seed=0, contraction="fma"):
        first = x @ w
    assert s_fma.config["contraction"] == "fma"
    assert torch.equal(s_fma["output"][0], first)
    assert not torch.equal(s_fma["output"][0], s_sep["output"][0])
