"""Bit-for-bit agreement of the numba path, the torch path and the exact Fraction
reference; IEEE mode against torch's own arithmetic; the random bits in three
implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from numba import njit

import numvar.rounding as R
from numvar.errors import RoundingError
from numvar.rounding import _torch as RT
from numvar.rounding import kernels as K
from numvar.rounding.reference import ref_op

MODES = R.MODES
FULL = {torch.float32: 24, torch.float64: 53, torch.bfloat16: 8, torch.float16: 11}
FMT = {torch.float32: "binary32", torch.float64: "binary64", torch.bfloat16: "bfloat16",
       torch.float16: "binary16"}
INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
       torch.float16: torch.int16}


def special_values(dtype: torch.dtype, n_random: int, seed: int) -> torch.Tensor:
    """Values of ``dtype``: random magnitudes over the whole range, neighbours of powers
    of two, subnormals, extremes, zeros, inf, nan."""
    fi = torch.finfo(dtype)
    rng = np.random.default_rng(seed)
    emin, emax = R.FORMATS[dtype].emin, R.FORMATS[dtype].emax
    mant = rng.uniform(1.0, 2.0, n_random)
    expo = rng.integers(emin - 3, emax + 1, n_random)
    sign = rng.choice([-1.0, 1.0], n_random)
    vals = list(sign * np.ldexp(mant, expo))
    for e in (0, 1, -1, 10, emin, emin + 1, emax):
        vals += [2.0 ** e, -(2.0 ** e)]
    vals += [fi.max, -fi.max, fi.tiny, fi.smallest_normal * 0.5, 1.0 + fi.eps, 1.0 - fi.eps / 2,
             3.0, 0.1, -0.1, 1 / 3, 0.0, -0.0, math.inf, -math.inf, math.nan]
    x = torch.tensor(vals, dtype=torch.float64).to(dtype)
    # neighbours of powers of two and of 1.0 as exact dtype values
    ones = torch.tensor([1.0, 2.0 ** (emin + 1), 2.0 ** (emax - 1)], dtype=torch.float64).to(dtype)
    x = torch.cat([x, torch.nextafter(ones, torch.zeros_like(ones)),
                   torch.nextafter(ones, torch.full_like(ones, math.inf))])
    return x


def operands(dtype: torch.dtype, n: int, seed: int) -> list[torch.Tensor]:
    """Three operand vectors whose pairs cover the special values."""
    base = special_values(dtype, n, seed)
    g = np.random.default_rng(seed + 1)
    idx = [torch.as_tensor(g.permutation(len(base))) for _ in range(3)]
    out = [base[i] for i in idx]
    # add exact-result pairs: b = a, b = -a, b = 2a
    a = base
    out = [torch.cat([o, a, a, a]) for o in out]
    out[1][-3 * len(a):] = torch.cat([a, -a, a * 2])
    return out


def run(op: str, xs, dtype, mode, t, backend, seed=7):
    s = R.Stream(seed)
    if op == "round":
        hi = xs[0].to(torch.float64) * 1.0000001 if dtype != torch.float64 else xs[0].double()
        lo = xs[1].double() * 2.0 ** -60
        return R.round(hi, lo, dtype=dtype, mode=mode, stream=s, precision=t, backend=backend)
    fn = getattr(R, op)
    k = 1 if op == "sqrt" else 3 if op == "fma" else 2
    return fn(*xs[:k], mode=mode, stream=s, precision=t, backend=backend)


OPS = ("add", "sub", "mul", "div", "sqrt", "fma", "round")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical bit patterns, except that any NaN equals any NaN (payloads differ)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    ia, ib = a.view(INT[a.dtype]), b.view(INT[b.dtype])
    return torch.equal(na, nb) and torch.equal(ia[~na], ib[~nb])


SMALL_T = {torch.float32: 3, torch.float64: 20, torch.bfloat16: 1, torch.float16: 6}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_numba_equals_torch_bitwise(dtype):
    xs = operands(dtype, 300, 1)
    for op in OPS:
        for mode in MODES:
            for t in (FULL[dtype], SMALL_T[dtype]):
                a = run(op, xs, dtype, mode, t, "numba")
                b = run(op, xs, dtype, mode, t, "torch")
                bad = torch.nonzero((a != b) & ~(a.isnan() & b.isnan()))
                assert same_bits(a, b), (op, mode, t, bad)


def test_bits_three_implementations():
    for key in (0, 1, 2 ** 63 + 12345, 2 ** 64 - 1, R.Stream(3).next_key()):
        n = 1000
        py = [R.bits(key, j) for j in range(n)]
        nb = [int(K.bits64(np.uint64(key), np.uint64(j))) for j in range(n)]
        th = [int(v) & (2 ** 64 - 1) for v in RT.bits_tensor(key, n, "cpu").tolist()]
        assert py == nb == th
    # uniformity sanity: top bits of 4096 draws, each bit set with probability 1/2;
    # 4096 draws: std 32, so |count - 2048| < 6 std = 192 fails with prob < 1e-8.
    v = [R.bits(99, j) for j in range(4096)]
    for b in (0, 11, 35, 63):
        c = sum((x >> b) & 1 for x in v)
        assert abs(c - 2048) < 192


def test_round_out_argument():
    x = torch.randn(100, dtype=torch.float64)
    for dtype in (torch.float32, torch.bfloat16):
        for backend in ("numba", "torch"):
            out = torch.empty(100, dtype=dtype)
            got = R.round(x, dtype=dtype, mode="sr", stream=R.Stream(4), backend=backend,
                          out=out)
            assert got is out
            assert same_bits(out, R.round(x, dtype=dtype, mode="sr", stream=R.Stream(4),
                                          backend=backend))
    with pytest.raises(RoundingError, match="out must be"):
        R.round(x, dtype=torch.float32, stream=R.Stream(0), out=torch.empty(99))


def test_stream_key_is_the_documented_hash():
    from numvar.rounding._stream import _SEED_SALT, mix64

    for seed in (0, 1, 2 ** 40 + 7):
        s = R.Stream(seed)
        base = mix64(seed ^ _SEED_SALT)
        assert [s.next_key() for _ in range(6)] == [R.bits(base, j) for j in range(6)]
        assert s.counter == 6


def test_stream_keys_are_the_next_keys():
    """``Stream.keys(n)`` (a Python loop for one key, one compiled call from two on)
    returns what n calls of ``next_key`` would, and advances the stream as far; large
    seeds and counters included (every product wraps mod 2**64)."""
    for seed in (0, 3, 2 ** 63 + 11):
        s, r = R.Stream(seed), R.Stream(seed)
        for n in (0, 1, 2, 3, 5, 33):
            k = s.keys(n)
            assert k.dtype == np.uint64 and [int(v) for v in k] == [r.next_key()
                                                                     for _ in range(n)]
            assert s.counter == r.counter
    s, r = R.Stream(9, counter=2 ** 62), R.Stream(9, counter=2 ** 62)
    assert [int(v) for v in s.keys(4)] == [r.next_key() for _ in range(4)]


def test_stream_reproducible_and_distinct():
    s1, s2, s3 = R.Stream(5), R.Stream(5), R.Stream(6)
    k1 = [s1.next_key() for _ in range(5)]
    assert k1 == [s2.next_key() for _ in range(5)]
    assert len(set(k1)) == 5 and not set(k1) & {s3.next_key() for _ in range(5)}
    state = torch.random.get_rng_state()
    R.add(torch.ones(10), torch.ones(10) * 1e-9, stream=s1)
    R.add(torch.ones(10), torch.ones(10) * 1e-9, stream=s1, backend="torch")
    assert torch.equal(state, torch.random.get_rng_state())
    assert s1.counter == 7


@pytest.mark.parametrize("dtype", DTYPES)
def test_numba_equals_fraction_reference(dtype):
    xs = operands(dtype, 60, 2)
    fmt = FMT[dtype]
    for op in OPS:
        k = 1 if op == "sqrt" else 3 if op == "fma" else 2
        args = [x.double() for x in xs[:k]]
        if op == "round":
            args = [xs[0].double() * 1.0000001 if dtype != torch.float64 else xs[0].double(),
                    xs[1].double() * 2.0 ** -60]
        for mode in MODES:
            for t in (FULL[dtype], 5):
                got = run(op, xs, dtype, mode, t, "numba").double().tolist()
                key = R.Stream(7).next_key()
                cols = [a.tolist() for a in args]
                for j in range(len(got)):
                    vals = tuple(c[j] for c in cols)
                    ieee = _ieee64(op, vals)
                    want = ref_op(op, vals, fmt, t, K.mode_code(mode), key, j, ieee)
                    assert _same(got[j], want), (op, mode, t, vals, got[j], want)


def _ieee64(op, v):
    try:
        if op == "round":  # lo == 0 keeps hi, including its sign of zero
            return v[0] if v[1] == 0 else v[0] + v[1]
        if op == "add":
            return v[0] + v[1]
        if op == "sub":
            return v[0] - v[1]
        if op == "mul":
            return v[0] * v[1]
        if op == "div":
            return float(torch.tensor(v[0], dtype=torch.float64) / v[1])
        if op == "fma":
            return v[0] * v[1] + v[2]
        if op == "sqrt":
            return math.sqrt(v[0]) if v[0] >= 0 else math.nan
    except (OverflowError, ValueError):
        pass
    return float(torch.tensor(v[0], dtype=torch.float64) * v[1]) if op == "mul" else math.nan


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_ieee_equals_torch(dtype, backend):
    a, b, c = operands(dtype, 300, 3)
    s = R.Stream(0)
    kw = dict(mode="ieee", stream=s, backend=backend)
    assert same_bits(R.add(a, b, **kw), a + b)
    assert same_bits(R.sub(a, b, **kw), a - b)
    assert same_bits(R.mul(a, b, **kw), a * b)
    assert same_bits(R.div(a, b, **kw), a / b)
    # torch's own CPU sqrt is not correctly rounded (SLEEF, ~1% of inputs one ulp off,
    # e.g. sqrt(2.0) in float64): compare with numpy's hardware sqrt instead.
    with np.errstate(invalid="ignore"):
        want = torch.from_numpy(np.sqrt(a.numpy()))
    assert same_bits(R.sqrt(a, **kw), want)
    x = a.double() * b.double() + 1e-3 * c.double()
    assert same_bits(R.round(x, dtype=torch.float32, **kw), x.float())


@njit(cache=True)
def _apply_scalar_kernels(op, a, b, c, key, mode, t):
    out32 = np.empty(a.size, np.float32)
    out64 = np.empty(a.size, np.float64)
    for j in range(a.size):
        r = K.bits64(key, j)
        x, y, z = np.float32(a[j]), np.float32(b[j]), np.float32(c[j])
        if op == 0:
            out32[j] = K.add_f32(x, y, mode, t, r)
            out64[j] = K.add_f64(a[j], b[j], mode, t + 29, r)
        elif op == 1:  # mul_f32/_f64 share narrow_binary/wide_binary with add
            out32[j] = K.sub_f32(x, y, mode, t, r)
            out64[j] = K.sub_f64(a[j], b[j], mode, t + 29, r)
        elif op == 2:
            out32[j] = K.fma_f32(x, y, z, mode, t, r)
            out64[j] = K.fma_f64(a[j], b[j], c[j], mode, t + 29, r)
        else:
            s, e = K.two_prod(a[j], b[j])
            out32[j] = K.round_f32(s, e, mode, t, r)
            out64[j] = K.round_f64(s, e, mode, t + 29, r)
    return out32, out64


def test_scalar_kernels_for_other_parts_match_the_api():
    """numvar.rounding.kernels' scalar functions, called from another njit kernel with
    bits64(key, j), give the same bits as the tensor API with that key."""
    a64, b64, c64 = (x.double() for x in operands(torch.float32, 200, 4))
    a32, b32, c32 = a64.float(), b64.float(), c64.float()
    for mode in MODES:
        for t in (24, 10):
            key = R.Stream(21).next_key()
            for op, fn in enumerate(("add", "sub", "fma", "round")):
                o32, o64 = _apply_scalar_kernels(op, a64.numpy(), b64.numpy(), c64.numpy(), np.uint64(key),
                                 K.mode_code(mode), t)
                kw = dict(mode=mode, stream=R.Stream(21))
                if fn == "round":
                    p, e = RT.two_prod(a64, b64)
                    w32 = R.round(p, e, dtype=torch.float32, precision=t, **kw)
                    w64 = R.round(p, e, dtype=torch.float64, precision=t + 29,
                                  mode=mode, stream=R.Stream(21))
                else:
                    k = 3 if fn == "fma" else 2
                    w32 = getattr(R, fn)(*(a32, b32, c32)[:k], precision=t, **kw)
                    w64 = getattr(R, fn)(*(a64, b64, c64)[:k], precision=t + 29,
                                         mode=mode, stream=R.Stream(21))
                o32, o64 = torch.from_numpy(o32), torch.from_numpy(o64)
                if fn == "round":  # round(hi, lo) needs a meaningful lo (not inf*x's NaN)
                    m = torch.isfinite(e)
                    o32, o64, w32, w64 = o32[m], o64[m], w32[m], w64[m]
                assert same_bits(o32, w32), (fn, mode, t)
                assert same_bits(o64, w64), (fn, mode, t)


def test_binary32_division_fast_pass_equals_scalar_path():
    """The kernel's binary32 division fast pass against the scalar ``narrow_binary`` it
    shortcuts, element by element, on inputs that hit each of its cases: ordinary
    quotients, exact ones (powers of two, x = y·k), quotients just below and above grid
    points, binary32-subnormal and overflowing quotients, zeros, infinities and NaN."""
    rng = np.random.default_rng(31)
    n = 20000
    y = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    k = rng.integers(1, 4096, n).astype(np.float32)
    sel = rng.random(n)
    x = np.where(sel < 0.15, y * k, x)  # exact quotients (k is exact)
    x = np.where((sel >= 0.15) & (sel < 0.2), y * np.float32(0.5), x)
    # x = y·(1 ± 2**-24): quotient within a float64 ulp of... grid points, both sides
    x = np.where((sel >= 0.2) & (sel < 0.3), y * np.float32(1 + 2.0**-23) * np.float32(1 - 2.0**-24), x)
    x = np.where((sel >= 0.3) & (sel < 0.35), np.float32(3e38), x)
    y = np.where((sel >= 0.3) & (sel < 0.35), np.float32(1e-3), y)  # overflow
    x = np.where((sel >= 0.35) & (sel < 0.4), np.float32(1e-30), x)
    y = np.where((sel >= 0.35) & (sel < 0.4), np.float32(3e12), y)  # below 2**-126
    x[:6] = [0.0, -0.0, np.inf, np.nan, 1.0, 1.0]
    y[:6] = [1.0, 3.0, 2.0, 1.0, 0.0, np.inf]
    x, y = x.astype(np.float32), y.astype(np.float32)
    for mode in MODES:
        code = K.mode_code(mode)
        out = np.empty(n, dtype=np.float32)
        K.k_binary(K.OP_DIV, x, y, out, 24, -126, 127, code, 24, 77)
        want = np.array([K.call_narrow_binary(K.OP_DIV, x[j], y[j], code, 24, 24, -126, 127,
                                              np.uint64(R.bits(77, j)))
                         for j in range(n)], dtype=np.float32)
        same = (out.view(np.uint32) == want.view(np.uint32)) | (np.isnan(out) & np.isnan(want))
        assert same.all(), (mode, np.nonzero(~same)[0][:5])


def test_binary64_fast_pass_equals_scalar_path():
    """The kernel's binary64 add, sub and mul (t = 53: a vectorised pass by blocks, the
    declined elements of a block redone) against the scalar ``wide_binary``, element by
    element, on inputs that hit each case: ordinary operands over a wide exponent range,
    exact sums, cancellations to zero, sums just below a power of two (the finer ulp
    below it), results around the pass's range [2**-700, 2**1000) and past it
    (subnormal, overflowing), factors around [2**-480, 2**480], zeros, infinities, NaN;
    the declined elements scattered over many blocks."""
    rng = np.random.default_rng(32)
    n = 20000
    x = rng.standard_normal(n) * np.exp2(rng.integers(-300, 300, n))
    y = rng.standard_normal(n) * np.exp2(rng.integers(-300, 300, n))
    sel = rng.random(n)
    near = rng.standard_normal(n)
    y = np.where(sel < 0.2, x * np.exp2(rng.integers(-60, 5, n)), y)  # overlapping sums
    y = np.where((sel >= 0.2) & (sel < 0.25), -x, y)  # exact zeros
    x = np.where((sel >= 0.25) & (sel < 0.3), np.exp2(rng.integers(-20, 20, n)), x)
    y = np.where((sel >= 0.25) & (sel < 0.3), -x * np.exp2(-rng.integers(54, 70, n)), y)
    # results around 2**-700 and 2**1000, subnormal and overflowing ones
    x = np.where((sel >= 0.3) & (sel < 0.35), near * np.exp2(rng.integers(-706, -694, n)), x)
    y = np.where((sel >= 0.3) & (sel < 0.35), near * np.exp2(rng.integers(-706, -694, n)), y)
    x = np.where((sel >= 0.35) & (sel < 0.4), near * np.exp2(rng.integers(995, 1023, n)), x)
    y = np.where((sel >= 0.35) & (sel < 0.4), np.abs(near) * np.exp2(rng.integers(995, 1023, n)), y)
    x = np.where((sel >= 0.4) & (sel < 0.45), near * np.exp2(rng.integers(-1074, -1000, n)), x)
    # factors around 2**±480 (products of the mul)
    y = np.where((sel >= 0.45) & (sel < 0.5), near * np.exp2(rng.integers(-485, -475, n)), y)
    x = np.where((sel >= 0.45) & (sel < 0.5), near * np.exp2(rng.integers(475, 485, n)), x)
    # quotients: exact ones (small integers over powers of two and small odd divisors),
    # quotients around 2**-700 and 2**±960, divisors around 2**±480
    y = np.where((sel >= 0.5) & (sel < 0.55), np.exp2(rng.integers(-8, 8, n)), y)
    x = np.where((sel >= 0.55) & (sel < 0.6), rng.integers(-99, 99, n) * 3.0, x)
    y = np.where((sel >= 0.55) & (sel < 0.6), 3.0, y)
    x = np.where((sel >= 0.6) & (sel < 0.65), near * np.exp2(rng.integers(-360, -340, n)), x)
    y = np.where((sel >= 0.6) & (sel < 0.65), near * np.exp2(rng.integers(340, 360, n)), y)
    x = np.where((sel >= 0.65) & (sel < 0.7), near * np.exp2(rng.integers(470, 485, n)), x)
    x[:8] = [0.0, -0.0, np.inf, np.nan, 1.0, -np.inf, 0.0, 2.0 ** -1074]
    y[:8] = [1.0, -0.0, 2.0, 1.0, np.inf, np.inf, -0.0, 2.0 ** -1074]
    declined = 0
    for op in (K.OP_ADD, K.OP_SUB, K.OP_MUL, K.OP_DIV):
        for mode in MODES:
            code = K.mode_code(mode)
            out = np.empty(n)
            K.k_binary(op, x, y, out, 53, -1022, 1023, code, 53, 78)
            want = np.array([K.call_wide_binary(op, x[j], y[j], code, 53,
                                                np.uint64(R.bits(78, j))) for j in range(n)])
            same = (out.view(np.uint64) == want.view(np.uint64)) | (np.isnan(out) & np.isnan(want))
            assert same.all(), (op, mode, np.nonzero(~same)[0][:5])
            blk = np.empty(K.WIDE_BLOCK)
            declined += sum(K._wide_block(op, x[j0:j0 + K.WIDE_BLOCK], y[j0:j0 + K.WIDE_BLOCK],
                                          blk[:min(K.WIDE_BLOCK, n - j0)], np.uint64(78), j0,
                                          code) for j0 in range(0, n, K.WIDE_BLOCK))
    assert declined > 0.05 * 16 * n  # the redo ran, in many blocks


def test_binary64_quotients_on_the_fast_pass_where_taken():
    """The quotients the binary64 pass takes are most of an ordinary division's (the
    comparison above would hold with every element redone): with the pass off
    (``DIV64_FAST``) the kernel gives the same bits, and the pass itself declines none of
    ordinary operands."""
    rng = np.random.default_rng(33)
    x = rng.standard_normal(3000) * np.exp2(rng.integers(-60, 60, 3000))
    y = rng.standard_normal(3000) * np.exp2(rng.integers(-60, 60, 3000))
    for mode in ("sr", "ieee", "ud", "random"):
        code = K.mode_code(mode)
        blk = np.empty(K.WIDE_BLOCK)
        assert K._wide_block(K.OP_DIV, x[:K.WIDE_BLOCK], y[:K.WIDE_BLOCK], blk, np.uint64(5), 0,
                             code) == 0
        fast, slow = np.empty(3000), np.empty(3000)
        K.k_binary(K.OP_DIV, x, y, fast, 53, -1022, 1023, code, 53, 5)
        old = K.DIV64_FAST
        try:
            K.DIV64_FAST = False
            K.k_binary(K.OP_DIV, x, y, slow, 53, -1022, 1023, code, 53, 5)
        finally:
            K.DIV64_FAST = old
        assert (fast.view(np.uint64) == slow.view(np.uint64)).all(), mode
        assert (fast != x / y).any() == (mode != "ieee")  # the modes other than ieee perturb


def test_binary64_sqrt_fast_pass_equals_scalar_path():
    """k_sqrt in binary64 at 53 bits (a vectorised pass by blocks, the declined roots
    redone) against the scalar ``wide_sqrt`` element by element, every mode: operands
    over the whole normal range (odd and even exponents: the scaling into [1, 4)), its
    ends, perfect squares (exact roots), subnormals, zeros, negatives, infinities, NaN."""
    rng = np.random.default_rng(34)
    n = 9000
    x = np.abs(rng.standard_normal(n)) * np.exp2(rng.integers(-1022, 1023, n))
    sel = rng.random(n)
    x = np.where(sel < 0.1, rng.integers(1, 3000, n).astype(np.float64) ** 2, x)
    x = np.where((sel >= 0.1) & (sel < 0.15), rng.random(n) * 2.0 ** -1022, x)  # subnormal
    x = np.where((sel >= 0.15) & (sel < 0.2), -x, x)
    x = np.where((sel >= 0.2) & (sel < 0.25), (1 + rng.random(n)) * 2.0 ** 1023, x)
    x = np.where((sel >= 0.25) & (sel < 0.3), (1 + rng.random(n)) * 2.0 ** -1022, x)
    x[:6] = [0.0, -0.0, np.inf, np.nan, -np.inf, np.finfo(np.float64).max]
    for mode in MODES:
        code = K.mode_code(mode)
        out = np.empty(n)
        K.k_sqrt(x, out, 53, -1022, 1023, code, 53, 91)
        want = np.array([K.wide_sqrt(x[j], code, 53, np.uint64(R.bits(91, j)))
                         for j in range(n)])
        same = (out.view(np.uint64) == want.view(np.uint64)) | (np.isnan(out) & np.isnan(want))
        assert same.all(), (mode, np.nonzero(~same)[0][:5])
        old = K.SQRT64_FAST
        try:
            K.SQRT64_FAST = False
            slow = np.empty(n)
            K.k_sqrt(x, slow, 53, -1022, 1023, code, 53, 91)
        finally:
            K.SQRT64_FAST = old
        assert ((slow.view(np.uint64) == want.view(np.uint64))
                | (np.isnan(slow) & np.isnan(want))).all(), mode
