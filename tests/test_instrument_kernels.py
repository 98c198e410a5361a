"""Flop kernels against their slow pure-Python references, bit for bit."""

import os

import numba
import numpy as np
import pytest
import torch

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box

import numvar.rounding as R
from numvar.instrument import fuzzy
from numvar.instrument import kernels as KN
from numvar.instrument import pointwise as PW
from numvar.rounding import kernels as RK

MODES = ("ieee", "sr", "ud", "random")


def _weird(rng, shape, dt):
    """Normal values with scattered huge/tiny/subnormal magnitudes, zeros and ones, so that
    the fast paths' rejects (full path) are exercised too."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-150, 125, shape) * (rng.random(shape) < 0.3))
    x[rng.random(shape) < 0.1] = 0.0
    x[rng.random(shape) < 0.05] = 1.0
    x[rng.random(shape) < 0.05] = -0.0
    return x.astype(dt)


def _with_specials(rng, x):
    x = x.copy()
    x.flat[rng.integers(0, x.size, 2)] = np.inf
    x.flat[rng.integers(0, x.size, 1)] = -np.inf
    x.flat[rng.integers(0, x.size, 1)] = np.nan
    return x


def _same(a, b):
    """Bitwise equal up to the sign of NaNs (meaningless in IEEE 754); signed zeros count."""
    num = ~np.isnan(a)
    return np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a)[num], np.signbit(b)[num])


def test_inline_hash_is_the_rounding_core_hash():
    keys = [0, 1, 2**63 + 5, 2**64 - 1, 0x1234_5678_9ABC_DEF0]
    for key in keys:
        for j in (0, 1, 7, 2**40 + 3):
            want = R.bits(key, j)
            assert int(RK.bits64(np.uint64(key), np.uint64(j))) == want
            # the kernels' inline copy, called through a tiny njit wrapper
            assert int(_inline_bits(np.uint64(key), np.uint64(j))) == want


from numba import njit  # noqa: E402


# The clean-row loops called as _contract_fast32 calls them: column offset the constant 0
# (a literal type). Called from Python, 0 would be an int64 and numba would compile each
# loop once more (50-80 s cold each, measured in CI's test phase); these wrappers compile
# in a moment and find the loops in the cache the warm-up filled.
@njit
def _clean32_row(acc, jg, arow, b64, ukey, base, n, mode):
    KN._clean32(acc, jg, arow, b64, ukey, base, 0, n, mode)


@njit
def _cleanm32_row(acc, jg, arow, b64, ukey, base, n):
    KN._cleanm32(acc, jg, arow, b64, ukey, base, 0, n)


@njit
def _cleant32_row(acc, jg, arow, b64, ukey, base, n, mode, t):
    KN._cleant32(acc, jg, arow, b64, ukey, base, 0, n, mode, t)


@njit
def _inline_bits(k, j):
    return KN._bits(k, j)


@njit
def _stepped_bits(k, l0, n):
    """The bits of elements l0 .. l0 + n - 1 as the vectorised loops draw them: each
    layer's Weyl value at l0, stepped by γ (kernels._weyl, rounding.kernels.weyl64)."""
    out = np.empty((2, n), np.uint64)
    z = KN._weyl(k, np.uint64(l0))
    w = RK.weyl64(k, l0)
    for j in range(n):
        out[0, j] = KN._bits_weyl(z)
        out[1, j] = RK.mix64(w)
        z += KN._G
        w += KN._G
    return out


def test_stepped_weyl_value_is_the_hash_of_each_index():
    """A loop that starts from element l0's Weyl value and adds γ per element draws
    ``bits64(key, l0 + j)`` for every j: against the pure-Python splitmix64
    (``numvar.rounding.bits``). γ is about 0.62·2**64, so the stepped value wraps mod
    2**64 at most steps; keys and first indices at both ends of their ranges."""
    n = 70
    for key in (0, 1, 2**63 + 5, 2**64 - 1, 0x1234_5678_9ABC_DEF0):
        for l0 in (0, 7, 2**40 + 3, 2**62 + 11, 2**63 - n - 1):
            got = _stepped_bits(np.uint64(key), l0, n)
            want = [R.bits(key, l0 + j) for j in range(n)]
            assert [int(v) for v in got[0]] == want, (key, l0)
            assert [int(v) for v in got[1]] == want, (key, l0)


@pytest.mark.parametrize("dt,ts", [(np.float32, (24, 11)), (np.float64, (53, 20))])
def test_contract_matches_reference(dt, ts):
    rng = np.random.default_rng(1)
    for t in ts:
        for shapes in (((2, 3, 7), (1, 7, 5)), ((1, 2, 4), (3, 4, 6)), ((2, 2, 3), (4, 3, 2))):
            a, b = _weird(rng, shapes[0], dt), _weird(rng, shapes[1], dt)
            for m in MODES:
                code = RK.mode_code(m)
                out = KN.contract(a, b, 987654321, code, t)
                ref = KN.contract_reference(a, b, 987654321, code, t)
                assert out.dtype == dt and _same(out, ref), (dt, t, m, shapes)


def test_special_values_match_reference():
    rng = np.random.default_rng(7)
    for dt, t in ((np.float32, 24), (np.float64, 53)):
        a = _with_specials(rng, _weird(rng, (1, 4, 6), dt))
        b = _with_specials(rng, _weird(rng, (1, 6, 5), dt))
        x = _with_specials(rng, _weird(rng, (8, 5), dt))
        for m in MODES:
            code = RK.mode_code(m)
            out = KN.contract(a, b, 3, code, t)
            assert _same(out, KN.contract_reference(a, b, 3, code, t)), (dt, m)
            assert np.isnan(out).any() and np.isinf(out).any()
            assert _same(KN.scan(x, 4, code, t), KN.scan_reference(x, 4, code, t))


def test_contract_tiles_match_reference():
    # N above the tile width: tiles are split over columns
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1, 2, 3)).astype(np.float32)
    b = rng.standard_normal((1, 3, KN.TILE + 9)).astype(np.float32)
    for m in ("sr", "ud"):
        code = RK.mode_code(m)
        assert _same(KN.contract(a, b, 5, code, 24), KN.contract_reference(a, b, 5, code, 24))


@pytest.mark.parametrize("dt,t", [(np.float32, 24), (np.float32, 9), (np.float64, 53)])
def test_scan_matches_reference(dt, t):
    rng = np.random.default_rng(3)
    x = _weird(rng, (9, 6), dt)
    for m in MODES:
        code = RK.mode_code(m)
        for mul in (False, True):
            for cum in (False, True):
                out = KN.scan(x, 77, code, t, mul=mul, cumulative=cum)
                ref = KN.scan_reference(x, 77, code, t, mul=mul, cumulative=cum)
                assert _same(out, ref), (m, mul, cum)


def test_binary64_scan_fast_path_equals_the_scalar_steps(monkeypatch):
    """The binary64 scan at 53 bits (vectorised steps, :func:`_scan_tiles`; chains of
    fewer columns, :func:`_scan_chain64`) against the scalar steps of ``_scan_kernel``
    (``SCAN64_FAST`` off) bit for bit, every mode, sums and products, cumulative or not,
    over two column tiles, with steps the fast paths decline: cancellations to zero,
    overflowing sums, results below 2**-700, factors past 2**480, infinities and NaN."""
    rng = np.random.default_rng(7)
    Kd, M = 6, KN.TILE + 37
    x = rng.standard_normal((Kd, M)) * np.exp2(rng.integers(-40, 40, (Kd, M)))
    x[1, :50] = -x[0, :50]  # exact zeros
    x[:, 50:100] = (1.0 + rng.random((Kd, 50))) * 2.0 ** 1022  # sums past 2**1000, overflows
    x[:, 100:150] *= 2.0 ** -690  # sums around 2**-700, products below it
    x[:, 150:200] = rng.standard_normal((Kd, 50)) * np.exp2(rng.integers(474, 486, (Kd, 50)))
    x[2, 200:204] = [np.inf, np.nan, -np.inf, 0.0]
    declined = KN._scanstep64(x[0].copy(), x[1], np.uint64(9), np.uint64(0), RK.MODE_SR,
                              False, np.empty(M, np.bool_))
    assert 100 <= declined < M // 4  # some steps declined, most taken
    # and chains of one to three columns (_scan_chain64), over the same kinds of steps
    narrow = [x[:, :1], x[:, 49:52], x[:, 148:150], x[:, 199:202], x[:, 160:163]]
    assert all(a.shape[1] < KN.SCAN64_MIN_COLUMNS for a in narrow)
    for m in MODES:
        code = RK.mode_code(m)
        for mul in (False, True):
            for cum in (False, True):
                for arr in (x, *narrow):
                    fast = KN.scan(arr, 19, code, 53, mul=mul, cumulative=cum)
                    monkeypatch.setattr(KN, "SCAN64_FAST", False)
                    slow = KN.scan(arr, 19, code, 53, mul=mul, cumulative=cum)
                    monkeypatch.setattr(KN, "SCAN64_FAST", True)
                    assert _same(fast, slow), (m, mul, cum, arr.shape)


def test_ieee_contract_is_sequential_round_to_nearest():
    # ieee: each product and add rounded to nearest in binary32, k in increasing order
    rng = np.random.default_rng(4)
    a = rng.standard_normal((1, 3, 17)).astype(np.float32)
    b = rng.standard_normal((1, 17, 4)).astype(np.float32)
    out = KN.contract(a, b, 1, RK.MODE_IEEE, 24)
    for i in range(3):
        for j in range(4):
            acc = np.float32(a[0, i, 0] * b[0, 0, j])
            for k in range(1, 17):
                acc = np.float32(acc + np.float32(a[0, i, k] * b[0, k, j]))
            assert out[0, i, j] == acc


def test_mm_through_the_mode_matches_reference():
    rng = np.random.default_rng(5)
    a = torch.from_numpy(rng.standard_normal((4, 9)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((9, 6)).astype(np.float32))
    for m in MODES:
        with fuzzy(mode=m, seed=11):
            y = torch.mm(a, b)
        key = R.Stream(11).next_key()  # the first key of the block's stream
        ref = KN.contract_reference(a.numpy()[None], b.numpy()[None], key, RK.mode_code(m), 24)[0]
        assert _same(y.numpy(), ref), m


def _conv2d_reference(x, w, stride, padding, dilation, groups, key, code, t):
    """Direct convolution loops, independent of im2col: per output element the terms
    (input channel of the group, kernel row, kernel column) in that order, zero-padding
    positions included; term (line (g·M + i)·K + k, column n·L + l)."""
    n_, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    oh = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    L = oh * ow
    K = cg * kh * kw
    out = np.empty((n_, o, oh, ow), dtype=x.dtype)
    mul, add = RK.mul_f32, RK.add_f32
    for n in range(n_):
        for g in range(groups):
            for i in range(og):
                for y in range(oh):
                    for z in range(ow):
                        l_ = y * ow + z
                        acc = None
                        k = 0
                        for ci in range(cg):
                            for u in range(kh):
                                for v in range(kw):
                                    yy = y * stride - padding + u * dilation
                                    zz = z * stride - padding + v * dilation
                                    inside = 0 <= yy < h and 0 <= zz < wd
                                    xv = x[n, g * cg + ci, yy, zz] if inside else np.float32(0)
                                    r = KN.term_bits(key, (g * og + i) * K + k, n * L + l_)
                                    r2 = ((r << 29) | (r >> 35)) & (2**64 - 1)
                                    p = mul(w[g * og + i, ci, u, v], xv, code, t, np.uint64(r))
                                    acc = p if k == 0 else add(acc, p, code, t, np.uint64(r2))
                                    k += 1
                        out[n, g * og + i, y, z] = acc
    return out


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 1, 1, 1), (2, 1, 2, 2)])
def test_conv2d_through_the_mode_matches_direct_reference(stride, padding, dilation, groups):
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((2, 4, 6, 5)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((4, 4 // groups, 3, 2)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(4).astype(np.float32))
    for m in ("sr", "ud", "random"):
        with fuzzy(mode=m, seed=3):
            y = torch.nn.functional.conv2d(x, w, bias, stride, padding, dilation, groups)
        s = R.Stream(3)
        key = s.next_key()
        ref = _conv2d_reference(x.numpy(), w.numpy(), stride, padding, dilation, groups, key,
                                RK.mode_code(m), 24)
        ref = R.add(torch.from_numpy(ref), bias.view(1, 4, 1, 1), mode=m, stream=s)  # bias add
        assert _same(y.numpy(), ref.numpy()), m


def test_round32_is_the_rounding_core_round():
    rng = np.random.default_rng(8)
    h = _with_specials(rng, _weird(rng, (3000,), np.float64))
    h[:50] = np.float32(h[:50])  # exact binary32 values
    h[50:60] = 3.4028235677973366e38  # just above FLT_MAX (overflow boundary)
    h[60:70] = 1.1754943508222875e-38  # 2^-126 (the UD boundary case)
    for m in MODES:
        got = np.empty(h.size, dtype=np.float32)
        PW.round32(h, got, 12345, RK.mode_code(m))
        want = R.round(torch.from_numpy(h), dtype=torch.float32, mode=m, stream=_key_stream(12345))
        assert _same(got, want.numpy()), m


def test_round32_tensor_by_address_is_round32(monkeypatch):
    """The address-taking serial kernel (``round32_tensor`` below PARALLEL_MIN_WORK) gives
    round32's bits: keys at and above 2**63 (passed as the int64 of their bits), tensors
    that start inside their storage, one element to several tiles; above the threshold
    it takes the array path."""
    rng = np.random.default_rng(9)
    base = _with_specials(rng, _weird(rng, (2 * PW.TILE + 37,), np.float64))
    for key in (0, 12345, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 0xD1B54A32D192ED03):
        for m in MODES:
            for lo, hi in ((0, 1), (3, 40), (5, base.size)):
                h = torch.from_numpy(base)[lo:hi]
                want = np.empty(hi - lo, dtype=np.float32)
                PW.round32(h.numpy(), want, key, RK.mode_code(m))
                out = torch.full((hi - lo + 2,), 7.0, dtype=torch.float32)[1:-1]
                PW.round32_tensor(h, out, key, RK.mode_code(m))
                assert _same(out.numpy(), want), (key, m, lo, hi)
                assert float(out._base[0]) == 7.0 and float(out._base[-1]) == 7.0
    monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", 1)
    h = torch.from_numpy(base)
    out = torch.empty(h.shape, dtype=torch.float32)
    want = np.empty(h.shape, dtype=np.float32)
    PW.round32(h.numpy(), want, 1 << 63, RK.MODE_SR)
    PW.round32_tensor(h, out, 1 << 63, RK.MODE_SR)
    assert _same(out.numpy(), want)
    neg = torch._neg_view(h)  # a negative-bit view: its values, not its storage's
    PW.round32_tensor(neg, out, 3, RK.MODE_IEEE)
    assert _same(out.numpy(), (-base).astype(np.float32))


def test_narrow_kernels_by_address_are_the_rounding_core_kernels():
    """round_narrow_tensor / binary_narrow_tensor (bfloat16 and float16 through the
    tensors' addresses) write what the rounding core's k_round / k_binary write from numpy
    arrays: float64 and float32 sources, keys on both sides of 2**63, tensors that start
    inside their storage, every op, at the format's precision and below it."""
    rng = np.random.default_rng(10)
    base = _with_specials(rng, _weird(rng, (700,), np.float64))
    a32 = base.astype(np.float32)
    b32 = _weird(rng, (700,), np.float32)
    for p, emin, emax in ((8, -126, 127), (11, -14, 15)):
        for t in (p, p - 3):
            for key in (7, 1 << 63, (1 << 64) - 5):
                for m in MODES:
                    code = RK.mode_code(m)
                    for src in (base, a32):
                        h = torch.from_numpy(src)[3:]
                        want = np.empty(h.numel(), np.float32)
                        RK.k_round(h.numpy(), h.numpy()[:0], want, False, p, emin, emax,
                                   code, t, np.uint64(key))
                        out = torch.empty(h.numel() + 1, dtype=torch.float32)[1:]
                        PW.round_narrow_tensor(h, out, p, emin, emax, code, t, key)
                        assert _same(out.numpy(), want), (p, t, key, m, src.dtype)
                    for op in (RK.OP_ADD, RK.OP_SUB, RK.OP_MUL, RK.OP_DIV):
                        x, y = torch.from_numpy(a32)[2:], torch.from_numpy(b32)[:-2]
                        want = np.empty(x.numel(), np.float32)
                        RK.k_binary(op, x.numpy(), y.numpy(), want, p, emin, emax, code, t,
                                    np.uint64(key))
                        out = torch.empty(x.numel(), dtype=torch.float32)
                        PW.binary_narrow_tensor(op, x, y, out, p, emin, emax, code, t, key)
                        assert _same(out.numpy(), want), (p, t, key, m, op)


def test_narrow_kernels_compile_one_variant_whatever_the_key_or_the_caller():
    """The rounding core's narrow kernels keep one compiled variant per array type: k_binary
    and k_round pass the stream key on as uint64 whatever int they get (numba types a
    Python int as int64 below 2**63 and uint64 above, and compiled ``_k_binary_narrow``
    once per type: 27 s cold), and the bfloat16/float16 rounding by address passes
    ``has_lo`` as a plain bool (a literal False compiled ``_k_round_narrow`` and
    ``_round_block`` a second time). After calls with keys on both sides of 2**63 through
    every entry point, no signature of theirs has an int64 key or a literal argument, and
    both entry points still write the same values."""
    x = np.linspace(-3, 3, 40, dtype=np.float32)
    y = np.linspace(0.5, 2, 40, dtype=np.float32)
    h = np.linspace(-1, 1, 40)
    code = RK.mode_code("sr")
    # the by-address kernel compiled afresh here, once (its cached copy would not show
    # which types it passes on): its call of _k_round_narrow registers those types
    fresh = njit(PW._round_narrow_at.py_func)
    for key in (77, (1 << 64) - 5):
        want = np.empty(40, np.float32)
        RK.k_binary(RK.OP_ADD, x, y, want, 8, -126, 127, code, 8, key)
        out = torch.empty(40)
        PW.binary_narrow_tensor(RK.OP_ADD, torch.from_numpy(x), torch.from_numpy(y), out, 8,
                                -126, 127, code, 8, key)
        assert _same(out.numpy(), want)
        RK.k_round(h, h[:0], want, False, 8, -126, 127, code, 8, key)
        PW.round_narrow_tensor(torch.from_numpy(h), out, 8, -126, 127, code, 8, key)
        assert _same(out.numpy(), want)
        out2 = np.empty(40, np.float32)
        fresh(h.ctypes.data, True, out2.ctypes.data, 40, 8, -126, 127, code, 8,
              PW.signed_key(key))
        assert _same(out2, want)
    for kernel, key_at in ((RK._k_binary_narrow, 9), (RK._k_round_narrow, 9),
                           (RK._round_block, 10)):
        assert kernel.signatures or kernel is RK._round_block  # (compiled inside a cached
        for sig in kernel.signatures:                            # caller: not registered)
            assert sig[key_at] == numba.types.uint64, (kernel, sig)
            assert not any(isinstance(a, numba.types.Literal) for a in sig), (kernel, sig)


class _key_stream(R.Stream):
    """A stream whose next key is the given one."""

    def __init__(self, key):
        super().__init__(0)
        self._k = key

    def next_key(self):
        return self._k


def test_serial_below_threshold_same_bits_and_threads_restored(monkeypatch):
    """Small work runs on one thread (launch), large work in parallel: same bits either
    way, and numba's thread count is restored after each call."""
    rng = np.random.default_rng(7)
    a = _weird(rng, (2, 5, 9), np.float32)
    b = _weird(rng, (2, 9, 33), np.float32)
    x = _weird(rng, (6, 40), np.float32)
    h = _weird(rng, (300,), np.float64)
    want = (KN.contract_reference(a, b, 3, RK.MODE_SR, 24),
            KN.scan_reference(x, 4, RK.MODE_SR, 24))
    seen = []
    numba.set_num_threads(2)
    try:
        for min_work in (1 << 40, 0):  # all serial, then all parallel
            monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", min_work)
            got = (KN.contract(a, b, 3, RK.MODE_SR, 24), KN.scan(x, 4, RK.MODE_SR, 24))
            assert all(_same(g, w) for g, w in zip(got, want))
            got = np.empty(h.size, dtype=np.float32)
            PW.round32(h, got, 5, RK.MODE_SR)
            seen.append(got)
            assert numba.get_num_threads() == 2
        assert _same(seen[0], seen[1])
        monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", 1 << 20)
        n = []
        KN.launch(10, lambda: n.append(numba.get_num_threads()))
        KN.launch(1 << 40, lambda: n.append(numba.get_num_threads()))
        assert n == [1, 2]
    finally:
        numba.set_num_threads(1)


def test_contract_term_bits_are_fair():
    """The per-term hash drives SR with the right probabilities, for products (bits
    35..63) and adds (bits 6..34), over 4 lines × 1024 columns = 4096 independent terms.
    Product: 3·(1 + 2^-23) = 3 + 1.5·2^-22 lies half-way between binary32 neighbours
    (p = 0.5). Add: 1 + 3·2^-25 lies 0.75 ulp above 1 (p = 0.75). Binomial std ≤
    sqrt(0.25/4096) = 0.0078; tolerance 0.035 ≈ 4.5 σ."""
    n, m = 1024, 4
    a = np.full((1, m, 1), 3.0, np.float32)
    b = np.full((1, 1, n), 1 + 2.0**-23, np.float32)
    up = KN.contract(a, b, 11, RK.MODE_SR, 24) > np.float32(3 + 2.0**-22)
    assert abs(up.mean() - 0.5) < 0.035
    a = np.ones((1, m, 2), np.float32)
    b = np.empty((1, 2, n), np.float32)
    b[0, 0], b[0, 1] = 1.0, 3 * 2.0**-25
    up = KN.contract(a, b, 12, RK.MODE_SR, 24) > np.float32(1.0)
    assert abs(up.mean() - 0.75) < 0.035


# ------------------------------------------------------------------ clean-row fast path
def _clean32_direct(a, b, key, code):
    """Run the clean-row loops of ``contract`` directly on every row of a (1, M, K) @
    (1, K, N) product (``b`` widened to float64, as ``contract`` passes it): the float64
    accumulators, NaN where the loops gave up."""
    M, Kd = a.shape[1], a.shape[2]
    N = b.shape[2]
    acc = np.empty((M, N))
    jg = (np.arange(N, dtype=np.uint64) * np.uint64(RK.GAMMA))
    b64 = b[0].astype(np.float64)
    for i in range(M):
        _clean32_row(acc[i], jg, a[0, i], b64, np.uint64(key), np.uint64(i * Kd), N, code)
    return acc


def test_clean_rows_over_narrowed_tiles_equal_the_full_path():
    """K >= 384 narrows the column tiles to 256 (clean_tile), each widened into its own
    block: clean rows over three tiles (256, 256, 88 columns) and two batches of b give
    the bits of the same rows on the full path (``clean`` all False, which reads b
    itself), for sr/ieee/ud/random, t = 24 and 12, separate, exact
    (bf16-valued inputs) and fma; the sr product also against the reference."""
    rng = np.random.default_rng(40)
    a = rng.uniform(0.5, 1.0, (1, 2, 400)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (2, 400, 600)).astype(np.float32)
    bf = (b.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    af = (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    assert KN.clean_tile(400) == 256
    for x, y, exact in ((a, b, False), (af, bf, True)):
        on = KN.clean_rows(x, y, 2, 24)
        assert on.all()
        for m in MODES:
            code = RK.mode_code(m)
            for t, fma in ((24, False), (12, False), (24, True)):
                if exact and (t != 24 or fma or m == "ud"):
                    continue
                out = np.empty((2, 2, 600), np.float32)
                ref = np.empty((2, 2, 600), np.float32)
                KN._contract_fast32(x, y, on, out, np.uint64(3), code, t, fma, exact, 1)
                KN._contract_fast32(x, y, ~on, ref, np.uint64(3), code, t, fma, False, 1)
                assert _same(out, ref), (m, t, fma, exact)
    a1, b1 = a[:, :1, :384], b[:1, :384, :300]
    code = RK.mode_code("sr")
    assert _same(KN.contract(a1, b1, 9, code, 24), KN.contract_reference(a1, b1, 9, code, 24))


def test_clean_rows_match_reference():
    """Ordinary data (normal values, zeros, ones, signed zeros): every row is clean and the
    clean loops alone reproduce the reference, in every mode, also over several column
    tiles and broadcast batches."""
    rng = np.random.default_rng(21)

    def data(shape):
        x = rng.standard_normal(shape)
        x[rng.random(shape) < 0.2] = 0.0
        x[rng.random(shape) < 0.05] = -0.0
        x[rng.random(shape) < 0.05] = 1.0
        return x.astype(np.float32)

    for shapes in (((2, 3, 7), (1, 7, 5)), ((1, 2, 6), (3, 6, KN.TILE + 3)), ((1, 4, 1), (1, 1, 9))):
        a, b = data(shapes[0]), data(shapes[1])
        BO = max(a.shape[0], b.shape[0])
        assert KN.clean_rows(a, b, BO, 24).all()
        for m in MODES:
            code = RK.mode_code(m)
            assert _same(KN.contract(a, b, 31, code, 24), KN.contract_reference(a, b, 31, code, 24)), m
    a, b = data((1, 3, 9)), data((1, 9, 11))
    for m in MODES:
        acc = _clean32_direct(a, b, 8, RK.mode_code(m))
        assert not np.isnan(acc).any()
        assert _same(acc.astype(np.float32), KN.contract_reference(a, b, 8, RK.mode_code(m), 24)[0]), m


@pytest.mark.parametrize("t", [16, 11, 8, 2])
def test_clean_rows_at_virtual_precision_match_reference(t):
    """Below 24 bits (virtual precision, and bfloat16/float16 products, which run at 8/11
    bits) clean rows take the vectorised loops too: same bits as the reference, in every
    mode, including lanes given up on (magnitudes 2**±40 apart make float64 sums inexact;
    ud also gives up below 2**-126)."""
    rng = np.random.default_rng(25 + t)
    a = rng.standard_normal((1, 6, 7))
    a *= np.exp2(40.0 * rng.choice([-1, 0, 1], a.shape, p=[0.05, 0.9, 0.05]))
    a[rng.random(a.shape) < 0.15] = 0.0  # zero products (ReLU outputs)
    a[rng.random(a.shape) < 0.05] = -0.0
    a = a.astype(np.float32)
    b = rng.standard_normal((2, 7, 9)).astype(np.float32)
    b[:, 3, :] = 0.0
    clean = KN.clean_rows(a, b, 2, t)
    assert clean.all()
    for m in MODES:
        code = RK.mode_code(m)
        assert _same(KN.contract(a, b, 41, code, t), KN.contract_reference(a, b, 41, code, t)), m


def test_virtual_precision_loops_keep_zeros_on_the_fast_path():
    """Zero products and sums (ReLU outputs, zero weights) stay on the fast loops at t < 24
    in every mode (ud leaves ±0 unchanged): no lane is given up on ordinary data."""
    rng = np.random.default_rng(29)
    a = rng.standard_normal((6, 9)).astype(np.float32)
    a[rng.random(a.shape) < 0.3] = 0.0
    b = rng.standard_normal((9, 16)).astype(np.float32)
    b[2] = 0.0
    jg = np.arange(16, dtype=np.uint64) * np.uint64(RK.GAMMA)
    acc = np.empty(16)
    b = b.astype(np.float64)  # as contract passes it
    for m in MODES:
        for i in range(6):
            _cleant32_row(acc, jg, a[i], b, np.uint64(3), np.uint64(i * 9), 16, RK.mode_code(m),
                          8)
            assert not np.isnan(acc).any(), (m, i)


def test_clean_row_growth_bound_depends_on_precision():
    """The overflow bound counts a growth of 1 + 2**(2-t) per rounding over 2K roundings:
    a row clean at 24 bits is not at 2 bits when K is large."""
    a = np.full((1, 1, 400), 2.0**50, np.float32)
    b = np.full((1, 400, 3), 2.0**50, np.float32)
    assert KN.clean_rows(a, b, 1, 24).all()
    assert not KN.clean_rows(a, b, 1, 2).any()
    for m in ("sr", "ud"):
        code = RK.mode_code(m)
        assert _same(KN.contract(a, b, 3, code, 2), KN.contract_reference(a, b, 3, code, 2)), m


def test_clean_rows_give_up_on_inexact_sums():
    """Magnitudes 2**±40 apart in one row keep every product above 2**-102 (rows stay
    clean) but make float64 sums inexact: those lanes turn NaN in the clean loops and are
    recomputed on the full path; the product still equals the reference bit for bit."""
    rng = np.random.default_rng(22)
    a = rng.standard_normal((1, 8, 6))
    a *= np.exp2(40.0 * rng.choice([-1, 0, 1], a.shape, p=[0.1, 0.8, 0.1]))
    a = a.astype(np.float32)
    b = rng.standard_normal((1, 6, 16)).astype(np.float32)
    assert KN.clean_rows(a, b, 1, 24).all()
    for m in MODES:
        code = RK.mode_code(m)
        ref = KN.contract_reference(a, b, 77, code, 24)
        acc = _clean32_direct(a, b, 77, code)
        bad = np.isnan(acc)
        assert bad.any() and not bad.all(), m
        assert _same(acc[~bad].astype(np.float32), ref[0][~bad]), m
        assert _same(KN.contract(a, b, 77, code, 24), ref), m


def test_rows_that_give_up_run_again_taking_moot_residuals():
    """A tiny element of ``a`` (a term far below the sum so far: the product of an
    activation's tiny tail) makes the lanes of its row give up in the clean loops; such a
    row tile runs again (sr) on ``_cleanm32``, which takes the inexact sums whose residual
    cannot change the rounding (``kernels._moot``), before the lanes left go to the full
    path. ``_cleanm32`` gives the reference's bits and gives up on no lane here;
    ``contract`` equals the reference in every mode through the column kernel (3 × 17)
    and the narrow kernel (64 × 8), rows where every lane gives up and rows where one
    does."""
    rng = np.random.default_rng(8)
    for M, Kd, N in ((3, 33, 17), (64, 40, 8)):
        a = rng.standard_normal((1, M, Kd)).astype(np.float32)
        b = (rng.standard_normal((1, Kd, N)) * 0.05).astype(np.float32)
        a[0, ::2, 5] = np.float32(1e-12)  # every lane of those rows gives up
        a[0, 1, 0] = np.float32(2.0 ** -50)  # at k = 0: the first sum is inexact
        b[0, 9, 3] = np.float32(3e-13)  # one lane of every row
        assert KN.clean_rows(a, b, 1, 24).all()
        b64 = b[0].astype(np.float64)
        jg = np.arange(N, dtype=np.uint64) * np.uint64(RK.GAMMA)
        for m in MODES:
            code = RK.mode_code(m)
            ref = KN.contract_reference(a, b, 31, code, 24)
            # (nearly) every lane of those rows gave up: more than RERUN_SHARE allows
            assert np.isnan(_clean32_direct(a, b, 31, code)[::2]).mean() > 0.9, m
            if m == "sr":
                moot = np.empty((M, N))
                for i in range(M):
                    _cleanm32_row(moot[i], jg, a[0, i], b64, np.uint64(31),
                                  np.uint64(i * Kd), N)
                assert _same(moot.astype(np.float32), ref[0]), m  # (no NaN left)
            assert _same(KN.contract(a, b, 31, code, 24), ref), (m, M, N)
    # bfloat16 values (every product exact: the clean loops skip the product roundings,
    # _cleanm32 rounds them, which leaves exact values unchanged): the same bits
    a = torch.randn(1, 3, 33).bfloat16().float().numpy()
    b = (torch.randn(1, 33, 17) * 0.05).bfloat16().float().numpy()
    a[0, ::2, 5] = 2.0 ** -60
    assert KN.narrow_products(a, b, 24) and KN.clean_rows(a, b, 1, 24).all()
    sr = RK.mode_code("sr")
    assert np.isnan(_clean32_direct(a, b, 31, sr)[::2]).mean() > 0.9
    assert _same(KN.contract(a, b, 31, sr, 24), KN.contract_reference(a, b, 31, sr, 24))


def test_contraction_sums_at_their_declined_bits_take_the_full_path():
    """sr: a sum whose float64 value is inexact and whose low 29 bits are ``q`` or ``q + 1``
    (``q = (r >> 6) & (2**29 − 1)``, the sum's random bits from its term's ``r``) can round
    either way, so ``_cleanm32`` must leave it to the full path. Built row by row: a row
    ``(1, p)`` times ``b = (1, 1)`` sums ``c = 1`` and ``p = (4·(q + d) ± 1)·2**-54``, whose
    float64 sum ``1 + (q + d)·2**-52`` has low bits ``q + d`` and a residual of ±2**-54: d
    = 0 and 1 (declined), −1 and 2 (the nearest taken), both signs; the product equals
    the reference. The test checks that it can fail: in some of the declined rows the
    value of the sum without its residual (what taking it would give) is not the
    reference's. (Random data almost never meets these two values in 2**29.)"""
    key, M = 97, 16384
    a = np.tile(np.float32([0.5, 0.25]), (1, M, 1))
    picked = []
    for i in range(M):
        r = KN.term_bits(key, 2 * i + 1, 0)
        q = (r >> 6) & ((1 << 29) - 1)
        if 4 < q < (1 << 22) - 4:
            d, sign = ((0, 1), (1, -1), (-1, 1), (2, -1), (0, -1), (1, 1))[len(picked) % 6]
            a[0, i] = (1.0, (4 * (q + d) + sign) * 2.0 ** -54)
            picked.append((i, d, q))
    assert len(picked) >= 80
    b = np.ones((1, 2, 1), np.float32)
    sr = RK.mode_code("sr")
    ref = KN.contract_reference(a, b, key, sr, 24)
    assert _same(KN.contract(a, b, key, sr, 24), ref)
    taken = 0  # declined rows whose sum without its residual rounds otherwise
    for i, d, q in picked:
        s = np.float64(1.0) + np.float64(a[0, i, 1])
        w = (1 << 29) - 1 - q  # sr's added integer (kernels._round_term)
        fast = np.uint64((int(s.view(np.uint64)) + w) & ~((1 << 29) - 1)).view(np.float64)
        taken += d in (0, 1) and np.float32(fast) != ref[0, i, 0]
    assert taken > 0


def _narrow_direct(a, b, key, code):
    """The narrow kernel's loops (:func:`numvar.instrument.kernels._narrow32`, or
    ``_narrow64`` for float64) on every block of rows of a (1, M, K) @ (1, K, N) product,
    as ``_contract_narrow32`` / ``_contract_narrow64`` run them: (M, N) float64
    accumulators, NaN where the loops gave up. The lanes' Weyl values are computed here
    in Python integers (``key + (line + 1)·γ`` mod 2**64), and each lane's first line
    hash is checked against ``bits64``."""
    M, Kd = a.shape[1], a.shape[2]
    N, L = b.shape[2], KN.NARROW_ROWS
    loops = KN._narrow64 if a.dtype == np.float64 else KN._narrow32
    b64 = b[0].astype(np.float64)
    out = np.empty((M, N))
    for i0 in range(0, M, L):
        i1 = min(M, i0 + L)
        acc, at = np.empty((N, L)), np.empty((KN.NARROW_KC, L))
        lines = [min(i0 + lane, i1 - 1) * Kd for lane in range(L)]
        hb = np.array([(key + (line + 1) * RK.GAMMA) % 2 ** 64 for line in lines],
                      dtype=np.uint64)
        hk = np.empty(L, np.uint64)
        for k0 in range(0, Kd, KN.NARROW_KC):
            kc = min(KN.NARROW_KC, Kd - k0)
            KN._transpose_block(at, a[0], i0, i1, k0, kc)
            assert np.array_equal(at[:kc], a[0, np.minimum(np.arange(i0, i0 + L), i1 - 1),
                                             k0:k0 + kc].T)
            loops(acc, at, b64, hb, hk, k0, kc, code)
        # after the last block hk holds the lanes' hashes of line row·K + K − 1
        assert hk.tolist() == [int(RK.bits64(np.uint64(key), np.uint64(line + Kd - 1)))
                               for line in lines]
        out[i0:i1] = acc[:, :i1 - i0].T
    return out


def _count_calls(monkeypatch, name, out_arg):
    """Patch kernel ``name`` of the flop kernels to record the shape of its output
    argument (positional ``out_arg``) at each call; the list of shapes."""
    calls = []
    real = getattr(KN, name)

    def counted(*args):
        calls.append(args[out_arg].shape)
        return real(*args)

    monkeypatch.setattr(KN, name, counted)
    return calls


def test_narrow_products_match_reference(monkeypatch):
    """Products with few columns (N <= NARROW_N) and enough rows take
    ``_contract_narrow32``, vectorised across rows: the same bits as the reference in every
    mode, with a partial row block (70 rows: one block of 64 or two of 32, then 6 rows row
    by row), a partial k block (37 = 32 + 5), rows that are not clean (tiny, huge and
    infinite values: the per-row path), and lanes the loops give up on (magnitudes 2**±40
    apart: inexact float64 sums, full path)."""
    calls = _count_calls(monkeypatch, "_contract_narrow32", 4)
    rng = np.random.default_rng(26)
    a = rng.standard_normal((2, 70, 37))
    a[:, 10:20] *= np.exp2(40.0 * rng.choice([-1, 0, 1], (2, 10, 37), p=[0.1, 0.8, 0.1]))
    # rows that are not clean: products below binary32's normal range (the clean loops
    # would round them on too fine a grid), a huge value, an infinity
    a[0, 3] = rng.standard_normal(37) * 1e-38
    a[1, 66, 0], a[0, 40, 36] = 3e38, np.inf
    a[rng.random(a.shape) < 0.1] = 0.0
    a = a.astype(np.float32)
    b = rng.standard_normal((1, 37, 5)).astype(np.float32)
    clean = KN.clean_rows(a, b, 2, 24)
    assert clean.any() and not clean.all()
    for m in MODES:
        code = RK.mode_code(m)
        ref = KN.contract_reference(a, b, 99, code, 24)
        assert _same(KN.contract(a, b, 99, code, 24), ref), m
        acc = _narrow_direct(a[:1], b, 99, code)
        bad = np.isnan(acc) | ~clean[:70, None]
        assert np.isnan(acc[10:20]).any() and not bad.all(), m
        assert _same(acc[~bad].astype(np.float32), ref[0][~bad]), m
    # the widest narrow product, 49 rows (three quarters of a block of 64, or a block of
    # 32 and a partial one) over a broadcast batch, K below a block
    a2 = rng.standard_normal((1, 49, 3)).astype(np.float32)
    b2 = rng.standard_normal((2, 3, KN.NARROW_N)).astype(np.float32)
    for m in MODES:
        code = RK.mode_code(m)
        assert _same(KN.contract(a2, b2, 5, code, 24), KN.contract_reference(a2, b2, 5, code, 24))
    # products exact in binary32 (bfloat16 values): the column kernel skips their
    # roundings, the narrow one rounds them (unchanged): the same bits
    a3 = torch.randn(1, 40, 20).bfloat16().float().numpy()
    b3 = torch.randn(1, 20, 3).bfloat16().float().numpy()
    assert KN.narrow_products(a3, b3, 24)
    for m in ("sr", "ieee", "random"):
        code = RK.mode_code(m)
        ref = KN.contract_reference(a3, b3, 6, code, 24)
        assert _same(KN.contract(a3, b3, 6, code, 24), ref), m
        assert _same(_narrow_direct(a3, b3, 6, code).astype(np.float32), ref[0]), m
    assert calls == [(2, 70, 5)] * 4 + [(2, 49, KN.NARROW_N)] * 4 + [(1, 40, 3)] * 3


def test_few_outputs_kernel_matches_reference(monkeypatch):
    """Products in sr with two rows or more, at most FEW_LANES outputs per batch and
    K >= FEW_K take ``_contract_few32`` (the products vectorised along k, then eight
    interleaved scalar sums; ``b`` read transposed): the reference's bits (the other modes
    keep the column kernel, checked too), over two k blocks (K = FEW_KC + 44) and exactly
    FEW_K, with fewer lanes than eight, batches broadcast either way, a row that is not
    clean (an infinity), lanes that give up (terms 2**±40 apart: inexact float64 sums,
    the full path) and zeros; ``b`` as a transposed view and contiguous gives the same
    bits."""
    calls = _count_calls(monkeypatch, "_contract_few32", 3)
    rng = np.random.default_rng(31)
    K = KN.FEW_KC + 44
    cases = [((1, 2, K), (1, K, 4)), ((3, 2, K), (1, K, 3)),
             ((1, 2, KN.FEW_K), (2, KN.FEW_K, 3)), ((2, 8, K), (2, K, 1))]
    for sa, sb in cases:
        a = rng.standard_normal(sa)
        a[..., ::7] *= np.exp2(40.0 * rng.choice([-1.0, 1.0], a[..., ::7].shape))
        a[rng.random(a.shape) < 0.05] = 0.0
        a = a.astype(np.float32)
        if sa[1] > 1:
            a[0, 1, 3] = np.inf
        b = rng.standard_normal((sb[0], sb[2], sb[1])).astype(np.float32).transpose(0, 2, 1)
        clean = KN.clean_rows(a, np.ascontiguousarray(b), max(sa[0], sb[0]), 24)
        assert clean.any() and not clean.all()
        for m in MODES:
            code = RK.mode_code(m)
            ref = KN.contract_reference(a, np.ascontiguousarray(b), 41, code, 24)
            assert _same(KN.contract(a, b, 41, code, 24), ref), (sa, sb, m)
            assert _same(KN.contract(a, np.ascontiguousarray(b), 41, code, 24), ref), (sa, sb, m)
    assert calls == [(max(sa[0], sb[0]), sa[1], sb[2]) for sa, sb in cases for _ in range(2)]
    # the other modes, fma, binary64, one row and K below FEW_K keep their kernels
    a, b = rng.standard_normal((2, 1, 2, K)).astype(np.float32)
    b = b.reshape(1, K, 2)
    for code in (RK.MODE_IEEE, RK.MODE_UD, RK.MODE_RANDOM, RK.MODE_UP):
        KN.contract(a, b, 1, code, 24)
    KN.contract(a[:, :1], b, 1, RK.mode_code("sr"), 24)
    KN.contract(a[:, :, :KN.FEW_K - 1], b[:, :KN.FEW_K - 1], 1, RK.mode_code("sr"), 24)
    KN.contract(a, b, 1, RK.mode_code("sr"), 24, "fma")
    KN.contract(a.astype(np.float64), b.astype(np.float64), 1, RK.mode_code("sr"), 53)
    assert len(calls) == 2 * len(cases)


def test_linear_head_through_few_outputs_kernel(monkeypatch):
    """A linear layer with few outputs under flop SR takes the few-outputs kernel once
    (its weight's transpose passed as a view) and gives the bits of the column kernel
    (FEW_KERNEL off)."""
    calls = _count_calls(monkeypatch, "_contract_few32", 3)
    torch.manual_seed(3)
    lin = torch.nn.Linear(KN.FEW_K * 3, 4)
    x = torch.randn(2, KN.FEW_K * 3)
    outs = []
    for few in (True, False):
        monkeypatch.setattr(KN, "FEW_KERNEL", few)
        with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=4):
            outs.append(lin(x))
    assert calls == [(1, 2, 4)]
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], lin(x))


def test_narrow64_products_match_reference(monkeypatch):
    """binary64 products with few columns (N <= NARROW_N) and enough rows take
    ``_contract_narrow64``, vectorised across rows: the reference's bits in every mode,
    with a partial row block (70 rows: one block of 64 or two of 32, then 6 rows row by
    row), a partial k block, a one-column head (N = 1, the case it is for), rows that are
    not clean (a subnormal product, 2**700, inf, NaN: the per-row path) and a broadcast
    batch; the loops alone give up (NaN) exactly on lanes whose sums leave their range
    (factors below the clean bound, reachable only by a direct call)."""
    calls = _count_calls(monkeypatch, "_contract_narrow64", 3)
    rng = np.random.default_rng(28)
    a = rng.standard_normal((2, 70, 37)) * np.exp2(rng.integers(-200, 200, (2, 70, 37)) *
                                                    (rng.random((2, 70, 37)) < 0.2))
    a[rng.random(a.shape) < 0.1] = 0.0
    a[rng.random(a.shape) < 0.05] = -0.0
    a[0, 3, 2], a[1, 66, 0], a[0, 40, 36], a[1, 5, 7] = 2.0 ** -1060, 2.0 ** 700, np.inf, np.nan
    clean = KN.clean_rows64(a, np.ones((1, 37, 1)), 2)
    assert clean.any() and not clean.all()
    for n in (1, 5):
        b = rng.standard_normal((1, 37, n))
        for m in MODES:
            code = RK.mode_code(m)
            ref = KN.contract_reference(a, b, 99, code, 53)
            assert _same(KN.contract(a, b, 99, code, 53), ref), (m, n)
            acc = _narrow_direct(a[:1], b, 99, code)
            ok = clean[:70]
            assert not np.isnan(acc[ok]).any(), (m, n)
            assert _same(acc[ok], ref[0][ok]), (m, n)
    a2 = rng.standard_normal((1, 49, 3))  # as in the binary32 test
    b2 = rng.standard_normal((2, 3, KN.NARROW_N))
    for m in MODES:
        code = RK.mode_code(m)
        assert _same(KN.contract(a2, b2, 5, code, 53), KN.contract_reference(a2, b2, 5, code, 53))
    assert calls == [(2, 70, 1)] * 4 + [(2, 70, 5)] * 4 + [(2, 49, KN.NARROW_N)] * 4
    # give-ups: sums of 2**-650 products (in the loops' range) that cancel to 2**-702 in
    # rows 1 and 2 of 40, below it
    a3 = np.full((1, 40, 2), 2.0 ** -400)
    a3[0, 1:3, 1] = -(2.0 ** -400) * (1 - 2.0 ** -52)
    b3 = np.full((1, 2, 2), 2.0 ** -250)
    for m in MODES:
        code = RK.mode_code(m)
        acc = _narrow_direct(a3, b3, 3, code)
        gave_up = np.zeros((40, 2), bool)
        gave_up[1:3] = True
        # (ud moves even exact products by an ulp: some of its sums cancel to zero)
        assert np.array_equal(np.isnan(acc), gave_up) or (m == "ud" and np.isnan(acc).any()
                                                          and not np.isnan(acc[~gave_up]).any()), m
        ref = KN.contract_reference(a3, b3, 3, code, 53)[0]
        kept = ~np.isnan(acc)
        assert _same(acc[kept], ref[kept]), m
        assert _same(KN.contract(a3, b3, 3, code, 53), ref[None]), m


def test_narrow_kernel_serves_a_few_dozen_columns_without_512_bit_vectors(monkeypatch):
    """Without 512-bit vectors (forced here on any host), binary32 products of up to
    NARROW_N_AVX2 columns whose rows fill whole blocks take ``_contract_narrow32``: the
    reference's bits in every mode, with a partial row block, rows that are not clean
    and lanes the loops give up on. Not taken: less than a block of rows, a last block
    neither of at most an eighth of a block nor three quarters full, all-exact products,
    fewer blocks than threads on a parallel product, 512-bit vectors."""
    monkeypatch.setattr(KN, "VECTORS_512", False)
    # as many threads as row blocks or fewer (the rule asks numba; the run is whatever)
    monkeypatch.setattr(KN, "num_threads", lambda: 1)
    calls = _count_calls(monkeypatch, "_contract_narrow32", 4)
    rng = np.random.default_rng(29)
    a = rng.standard_normal((1, 130, 37))
    a[0, 10:20] *= np.exp2(40.0 * rng.choice([-1, 0, 1], (10, 37), p=[0.1, 0.8, 0.1]))
    a[0, 3] = rng.standard_normal(37) * 1e-38  # not clean
    a[0, 100, 5] = np.inf
    a = a.astype(np.float32)
    for n in (KN.NARROW_N + 1, 40, KN.NARROW_N_AVX2):
        b = rng.standard_normal((1, 37, n)).astype(np.float32)
        for m in MODES:
            code = RK.mode_code(m)
            ref = KN.contract_reference(a, b, 98, code, 24)
            assert _same(KN.contract(a, b, 98, code, 24), ref), (m, n)
    assert calls == [(1, 130, n) for n in (KN.NARROW_N + 1, 40, KN.NARROW_N_AVX2)
                     for _ in MODES]
    serves, L = KN._narrow32_serves, KN.NARROW_ROWS
    assert serves((1, L, KN.NARROW_N_AVX2), 1 << 30, False)
    assert not serves((1, 40, 32), 1, False)  # less than a block: the column kernel
    assert not serves((1, L, KN.NARROW_N_AVX2 + 1), 1, False)
    # a last partial block: at most an eighth of a block (row by row) or three quarters full
    assert serves((1, 2 * L + L // 8, 32), 1, False)
    assert not serves((1, 2 * L + L // 8 + 1, 32), 1, False)
    assert not serves((1, 2 * L + 3 * L // 4 - 1, 32), 1, False)
    assert serves((1, 2 * L + 3 * L // 4, 32), 1, False)
    # few columns: three quarters of a block suffice
    assert serves((1, 3 * L // 4, KN.NARROW_N), 1, False)
    assert not serves((1, 3 * L // 4 - 1, KN.NARROW_N), 1, False)
    assert not serves((1, 2 * L, 32), 1, True)  # all exact: the copy without product roundings
    monkeypatch.setattr(KN, "num_threads", lambda: 4)
    assert serves((1, 2 * L, 32), KN.PARALLEL_MIN_WORK - 1, False)  # one thread runs it
    assert not serves((1, 2 * L, 32), KN.PARALLEL_MIN_WORK, False)  # 2 blocks for 4 threads
    assert serves((2, 2 * L, 32), KN.PARALLEL_MIN_WORK, False)
    monkeypatch.setattr(KN, "VECTORS_512", True)
    monkeypatch.setattr(KN, "TERM_BITS_APART", True)
    assert not serves((2, 2 * L, 32), 1, False) and serves((1, L // 2, 4), 1, False)
    assert serves((1, L // 2, KN.NARROW_N), 1, False)
    assert not serves((1, L // 2 - 1, KN.NARROW_N), 1, False)
    monkeypatch.setattr(KN, "TERM_BITS_APART", False)  # the column kernel is faster
    assert not serves((1, L // 2, KN.NARROW_N), 1, False)
    assert not serves((1, 3 * L // 4 - 1, 8), 1, False)
    assert serves((1, 3 * L // 4, 8), 1, False) and serves((1, L // 2, 7), 1, False)
    # more columns, up to NARROW_N_512: rows in whole blocks (and a tail of at most
    # NARROW_TAIL), not all exact, a block for every thread where several run it (4 here)
    assert serves((2, 2 * L, 32), KN.PARALLEL_MIN_WORK, False)
    assert serves((1, L, KN.NARROW_N_512), 1, False)
    assert not serves((1, L, KN.NARROW_N_512 + 1), 1, False)
    assert serves((1, 2 * L + KN.NARROW_TAIL, 32), 1, False)  # a tail row by row
    assert not serves((1, 2 * L + KN.NARROW_TAIL + 1, 32), 1, False)
    assert not serves((1, 3 * L // 2, 32), 1, False) and not serves((1, L - 1, 32), 1, False)
    assert not serves((1, 2 * L, 32), 1, True)
    assert not serves((1, 2 * L, 32), KN.PARALLEL_MIN_WORK, False)


def test_untransposed_b_keeps_every_bit():
    """``_untransposed32`` puts a transposed (BB, N, K) array in C order as (BB, K, N) and
    widens it, every bit pattern kept (NaN payloads, signed zeros, subnormals): square
    blocks, their remainders in both dims, fewer rows or columns than a block, several
    batches, with and without the widened copy."""
    rng = np.random.default_rng(8)
    R = KN.UNTRANSPOSE_ROWS
    for BB, N, K in ((1, 5, 3), (3, 37, 19), (2, 2 * R, 3 * R), (1, R, R), (2, 1, 2 * R + 1)):
        bits = rng.integers(0, 1 << 32, (BB, N, K), dtype=np.uint64).astype(np.uint32)
        bt = bits.view(np.float32)
        want = np.ascontiguousarray(bits.transpose(0, 2, 1)).reshape(-1)
        for wide in (True, False):
            flat = np.empty(bt.size, np.float32)
            b64 = np.empty(bt.size if wide else 0)
            KN._untransposed32(bt, flat, b64)
            assert np.array_equal(flat.view(np.uint32), want), (BB, N, K)
            if wide:
                with np.errstate(invalid="ignore"):  # (signalling NaNs quieted, as numba does)
                    wide64 = want.view(np.float32).astype(np.float64)
                assert _same(b64, wide64), (BB, N, K)


def test_contract_reads_a_transposed_b_as_it_lies(monkeypatch):
    """A transposed ``b`` (``weight.t()``, its transpose C-contiguous) gives the bits of
    the same values in C order on every path of ``contract``: the narrow and column
    kernels, the full-path kernel (ud, fma, virtual precision), binary64, every mode, with
    rows that are not clean; the binary32 paths put it in C order through
    ``_untransposed32`` (no other copy)."""
    calls = _count_calls(monkeypatch, "_untransposed32", 1)
    rng = np.random.default_rng(9)
    a = _with_specials(rng, _weird(rng, (2, 70, 37), np.float32))
    w = rng.standard_normal((1, 24, 37)).astype(np.float32)  # (BB, N, K): weight rows
    w[0, 3, 5] = np.float32(3e38)
    bt = w.transpose(0, 2, 1)  # (BB, K, N), a view
    n = 0
    for m in MODES:
        code = RK.mode_code(m)
        for t, contraction in ((24, "separate"), (24, "fma"), (13, "separate")):
            for narrow in (True, False):
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(KN, "NARROW_KERNEL", narrow)
                    got = KN.contract(a, bt, 5, code, t, contraction)
                    want = KN.contract(a, np.ascontiguousarray(bt), 5, code, t, contraction)
                n += 1
                assert _same(got, want), (m, t, contraction, narrow)
        got = KN.contract(a.astype(np.float64), bt.astype(np.float64), 5, code, 53)
        want = KN.contract(a.astype(np.float64), np.ascontiguousarray(bt).astype(np.float64),
                           5, code, 53)
        assert _same(got, want), m
    assert calls == [(bt.size,)] * n
    # (contiguous operands against the reference: the tests above; once more here)
    code = RK.mode_code("sr")
    assert _same(KN.contract(a, bt, 5, code, 24),
                 KN.contract_reference(a, np.ascontiguousarray(bt), 5, code, 24))


def test_narrow_kernel_on_wide_products_agrees_with_the_column_kernel():
    """Rows in whole blocks across more than NARROW_N columns (on 512-bit hosts with the
    term bits inside the loops up to NARROW_N_512 take ``_contract_narrow32``), forced
    each way on any host: bit for bit, every mode, two batches, with a row that is not
    clean (tiny values) and a batch of ``b`` holding a value near the binary32 maximum
    (none of its rows clean)."""
    rng = np.random.default_rng(31)
    L = KN.NARROW_ROWS
    a = rng.standard_normal((2, 2 * L, 40)).astype(np.float32)
    a[0, 5] *= np.float32(1e-38)  # not clean
    b = rng.standard_normal((2, 40, 300)).astype(np.float32)
    b[1, 3, 7] = np.float32(3e38)
    for m in MODES:
        code = RK.mode_code(m)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(KN, "_narrow32_serves", lambda shape, work, exact: True)
            calls = _count_calls(mp, "_contract_narrow32", 4)
            narrow = KN.contract(a, b, 77, code, 24)
            assert calls == [(2, 2 * L, 300)], m
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(KN, "NARROW_KERNEL", False)
            wide = KN.contract(a, b, 77, code, 24)
        assert _same(narrow, wide), m


def test_narrow_and_wide_kernels_agree():
    """The narrow kernels against the column-vectorised ones (``NARROW_KERNEL`` off) on
    larger products, binary32 and binary64, every mode: bit for bit."""
    rng = np.random.default_rng(27)
    for dt, t in ((np.float32, 24), (np.float64, 53)):
        b = rng.standard_normal((1, 300, 12)).astype(dt)
        # a partial lane block (2L + 22 rows: 150 with 64 lanes), then a last block of
        # NARROW_TAIL rows (row by row) and of one more (a lane block), over a batch of 2;
        # taken whatever the host's rule for the rows (_narrow_rows_fit)
        L = KN.NARROW_ROWS
        for rows, batch in ((2 * L + 22, 1), (2 * L + KN.NARROW_TAIL, 2),
                            (2 * L + KN.NARROW_TAIL + 1, 2)):
            a = rng.standard_normal((batch, rows, 300)).astype(dt)
            for m in MODES:
                code = RK.mode_code(m)
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(KN, "_narrow_rows_fit", lambda M, N: True)
                    calls = _count_calls(mp, "_contract_narrow32" if t == 24
                                         else "_contract_narrow64", 4 if t == 24 else 3)
                    narrow = KN.contract(a, b, 123, code, t)
                    assert calls == [(batch, rows, 12)], (m, rows, t)
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(KN, "NARROW_KERNEL", False)
                    wide = KN.contract(a, b, 123, code, t)
                assert _same(narrow, wide), (m, rows, t)


def test_clean_rows_ud_gives_up_below_its_range():
    """ud perturbs exact results, so sums of ±2**-102 products random-walk in steps of
    2**-125 and 2**-126 and reach nonzero magnitudes below 2**-125, where the fast ud step
    does not hold (every sum here is exact: the NaN lanes come from the range check)."""
    rng = np.random.default_rng(23)
    a = (np.exp2(-51.0) * rng.choice([-1.0, 1.0], (1, 8, 16))).astype(np.float32)
    b = np.full((1, 16, 64), np.exp2(-51.0), np.float32)
    assert KN.clean_rows(a, b, 1, 24).all()
    code = RK.MODE_UD
    acc = _clean32_direct(a, b, 5, code)
    assert np.isnan(acc).any()
    assert _same(KN.contract(a, b, 5, code, 24), KN.contract_reference(a, b, 5, code, 24))
    for m in ("sr", "random", "ieee"):  # these never leave the grid: no give-up
        assert not np.isnan(_clean32_direct(a, b, 5, RK.mode_code(m))).any(), m


def test_clean_row_test():
    """Rows with a non-finite value, a product below 2**-102 or a possible overflow are
    not clean; all-zero rows are. Mixed batches run both paths and match the reference."""
    rng = np.random.default_rng(24)
    a = rng.standard_normal((1, 6, 5)).astype(np.float32)
    b = rng.standard_normal((1, 5, 7)).astype(np.float32)
    a[0, 1, 2] = np.inf
    a[0, 2, 0] = np.nan
    a[0, 3, 1] = 2.0**-110  # times |b| >= ~1e-3: below 2**-102
    a[0, 4, :] = 0.0
    a[0, 5, 3] = 2.0**118  # K·max|a|·max|b| above 2**120
    b[0, 0, 0] = 4.0
    clean = KN.clean_rows(a, b, 1, 24)
    assert clean.tolist() == [True, False, False, False, True, False]
    for m in MODES:
        code = RK.mode_code(m)
        assert _same(KN.contract(a, b, 9, code, 24), KN.contract_reference(a, b, 9, code, 24)), m
    b[0, 0, 0] = np.inf  # one non-finite b: no row is clean
    assert not KN.clean_rows(a, b, 1, 24).any()


def test_wide_vectors_marks_the_calling_function():
    """The kernels' 512-bit request reaches LLVM as the calling function's
    ``prefer-vector-width`` attribute (a silent no-op would only show as lost speed)."""

    @njit
    def f(x):
        RK.wide_vectors()
        s = 0.0
        for v in x:
            s += v
        return s

    assert f(np.ones(4)) == 4.0
    ir = f.inspect_llvm(f.signatures[0])
    assert '"prefer-vector-width"="512"' in ir


# ------------------------------------------------------------ binary64 clean-row fast path
def _clean64_direct(a, b, key, code):
    """The binary64 clean-row loop of ``contract`` run directly on every row of a
    (1, M, K) @ (1, K, N) product: the accumulators, NaN where the loop gave up."""
    M, Kd = a.shape[1], a.shape[2]
    N = b.shape[2]
    acc = np.empty((M, N))
    jg = np.arange(N, dtype=np.uint64) * np.uint64(RK.GAMMA)
    for i in range(M):
        KN._clean64(acc[i], jg, a[0, i], b[0], np.uint64(key), np.uint64(i * Kd), 0, N, code)
    return acc


def test_fma_two_product_is_exact():
    """The kernels' FMA intrinsic: p + fma(a, b, -p) equals a·b exactly (Fractions), and
    the error term equals Dekker's (the scalar kernel's TwoProduct) bit for bit."""
    from fractions import Fraction

    @njit
    def two_prod_fma(x, y):
        p = x * y
        return p, KN._fma64(x, y, -p)

    rng = np.random.default_rng(40)
    xs = rng.standard_normal(300) * np.exp2(rng.integers(-290, 290, 300))
    ys = rng.standard_normal(300) * np.exp2(rng.integers(-290, 290, 300))
    for x, y in zip(xs, ys):
        p, e = two_prod_fma(x, y)
        assert Fraction(p) + Fraction(e) == Fraction(x) * Fraction(y)
        assert (p, e) == RK.two_prod(x, y)


def test_clean64_rows_match_reference():
    """binary64 at 53 bits: ordinary data (normal values, zeros, ones, signed zeros) makes
    every row clean; the vectorised loop alone (no lane given up) and ``contract``
    reproduce the scalar reference bit for bit in every mode, over several column tiles
    and broadcast batches."""
    rng = np.random.default_rng(41)

    def data(shape):
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-200, 200, shape) *
                                                 (rng.random(shape) < 0.2))
        x[rng.random(shape) < 0.2] = 0.0
        x[rng.random(shape) < 0.05] = -0.0
        x[rng.random(shape) < 0.05] = 1.0
        return x

    for shapes in (((2, 3, 7), (1, 7, 5)), ((1, 2, 3), (3, 3, KN.TILE + 3)), ((1, 4, 1), (1, 1, 9))):
        a, b = data(shapes[0]), data(shapes[1])
        BO = max(a.shape[0], b.shape[0])
        assert KN.clean_rows64(a, b, BO).all()
        for m in MODES:
            code = RK.mode_code(m)
            assert _same(KN.contract(a, b, 33, code, 53), KN.contract_reference(a, b, 33, code, 53)), m
    a, b = data((1, 3, 9)), data((1, 9, 11))
    for m in MODES:
        acc = _clean64_direct(a, b, 8, RK.mode_code(m))
        assert not np.isnan(acc).any(), m
        assert _same(acc, KN.contract_reference(a, b, 8, RK.mode_code(m), 53)[0]), m


def test_clean64_rows_mixed_with_subnormal_overflow_and_special_rows():
    """Rows that are not clean (a subnormal product, products overflowing to inf, a huge
    or tiny factor beyond 2**±300, inf, NaN) run the scalar path next to clean rows;
    every mode matches the reference, at 53 bits and at a virtual precision (scalar
    kernel)."""
    rng = np.random.default_rng(42)
    a = rng.standard_normal((1, 7, 5))
    b = rng.standard_normal((1, 5, 6))
    a[0, 1, 2] = 2.0 ** -1060  # subnormal products
    a[0, 2, :] = 2.0 ** 700  # products overflow (b ~ 1 times 2**700 is fine; squared below)
    a[0, 3, 1] = 2.0 ** 301
    a[0, 4, 0] = np.inf
    a[0, 5, 3] = np.nan
    a[0, 6, :] = 0.0
    b2 = b.copy()
    b2[0, :, 5] = 2.0 ** 700  # row 2 times column 5: 2**1400, inf
    assert KN.clean_rows64(a, b, 1).tolist() == [True, False, False, False, False, False, True]
    for m in MODES:
        code = RK.mode_code(m)
        for bb in (b, b2):
            assert _same(KN.contract(a, bb, 19, code, 53), KN.contract_reference(a, bb, 19, code, 53)), m
            assert _same(KN.contract(a, bb, 19, code, 30), KN.contract_reference(a, bb, 19, code, 30)), m
    b[0, 0, 0] = 2.0 ** -301  # one tiny b: no row is clean
    assert not KN.clean_rows64(a, b, 1).any()


def test_clean64_loop_gives_up_on_sums_out_of_its_range():
    """A sum that cancels below 2**-700 (products of 2**-800, one ulp apart; factors below
    the clean bound, so only a direct call reaches the loop with them) turns its lane NaN;
    the other lanes equal the reference."""
    a = np.full((1, 1, 2), 2.0 ** -400)
    b = np.full((1, 2, 4), 2.0 ** -250)  # sums 2**-649: in range
    b[0, 0, 1] = 2.0 ** -400
    b[0, 1, 1] = -(2.0 ** -400) * (1 - 2.0 ** -52)  # sum 2**-852
    for m in MODES:
        code = RK.mode_code(m)
        acc = _clean64_direct(a, b, 3, code)
        assert np.isnan(acc[0, 1]) and not np.isnan(acc[0, [0, 2, 3]]).any(), m
        ref = KN.contract_reference(a, b, 3, code, 53)[0]
        assert _same(acc[0, [0, 2, 3]], ref[0, [0, 2, 3]]), m
        assert _same(KN.contract(a, b, 3, code, 53), KN.contract_reference(a, b, 3, code, 53)), m


# The clean loops compiled with TERM_BITS_APART set before compiling (a compile-time
# constant: the host's form runs in every other test, the other form only here), in a
# fresh process, uncached: one row tile of binary32 sr (separate and "fma") and binary64
# sr; prints the accumulators' bit patterns.
_TERM_BITS_SCRIPT = """
import sys
import numpy as np
from numba import njit
from numvar.instrument import kernels as KN

KN.TERM_BITS_APART = KN.CLEAN_LOOPS_BITS_APART = sys.argv[1] == "1"


@njit
def sep32(acc, jg, arow, bmat, ukey, n):
    KN._clean_loops(acc, jg, arow, bmat, ukey, np.uint64(0), 0, n, KN._SR, 24)


@njit
def fma32(acc, jg, arow, bmat, ukey, n):
    KN._clean_fma_loops(acc, jg, arow, bmat, ukey, np.uint64(0), 0, n, KN._SR, 24)


@njit
def sep64(acc, jg, arow, bmat, ukey, n):
    KN._clean64_loops(acc, jg, arow, bmat, ukey, np.uint64(0), 0, n, KN._SR)


rng = np.random.default_rng(31)
K, n = 40, 37
a = rng.uniform(0.5, 1.0, K)
b = rng.uniform(0.5, 1.0, (K, n))
jg = np.arange(n, dtype=np.uint64) * np.uint64(KN._G)
out = []
for fn, dt in ((sep32, np.float32), (fma32, np.float32), (sep64, np.float64)):
    acc = np.empty(n)
    fn(acc, jg, a.astype(dt), b.astype(dt).astype(np.float64), np.uint64(12), n)
    out.append(acc.view(np.uint64))
print(" ".join(str(v) for v in np.concatenate(out)))
"""


def test_term_bits_apart_and_inside_give_the_same_bits():
    """The clean loops with the term bits drawn in a loop of their own and inside the
    accumulating loop (``KN.TERM_BITS_APART``, ``KN.CLEAN_LOOPS_BITS_APART``; which one a
    host compiles depends on its CPU): the same bit patterns for binary32 sr (separate
    and ``"fma"``) and binary64 sr, and those of the exact reference
    (``contract_reference``) for one row tile. A form that drew a lane's bits from
    another lane or k-step fails it."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _TERM_BITS_SCRIPT, flag],
                              stdout=subprocess.PIPE, text=True) for flag in ("1", "0")]
    apart, inside = (np.array(p.communicate()[0].split(), dtype=np.uint64) for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert apart.size == 3 * 37 and np.array_equal(apart, inside)
    rng = np.random.default_rng(31)
    a = rng.uniform(0.5, 1.0, 40)
    b = rng.uniform(0.5, 1.0, (40, 37))
    for part, (dt, kw) in enumerate(((np.float32, {}),
                                     (np.float32, {"contraction": "fma"}),
                                     (np.float64, {}))):
        got = apart[part * 37:(part + 1) * 37].view(np.float64)
        t = 24 if dt == np.float32 else 53
        ref = KN.contract_reference(a.astype(dt)[None, None], b.astype(dt)[None], 12, RK.MODE_SR,
                                    t, **kw)[0, 0]
        ok = ~np.isnan(got)
        assert ok.sum() >= 30, part  # positive terms: float64 sums exact almost always
        assert np.array_equal(got[ok].astype(dt), ref[ok]), part


def test_clean_loops_form_follows_the_cpu_numba_compiles_for(monkeypatch):
    """``_cpu_name`` is ``NUMBA_CPU_NAME`` where it names a CPU, else the host's (LLVM's
    name); the binary32 separate clean loops draw their bits apart wherever the other
    loops do (no AVX-512DQ) and on AMD Zen 4, inside on other AVX-512DQ CPUs: the
    module's constants for three CPUs numba is told to compile for (fresh processes,
    nothing compiled)."""
    import subprocess
    import sys

    import llvmlite.binding as llvm

    monkeypatch.setattr(numba.config, "CPU_NAME", "znver4")
    assert KN._cpu_name() == "znver4"
    for name in ("host", None):
        monkeypatch.setattr(numba.config, "CPU_NAME", name)
        assert KN._cpu_name() == llvm.get_host_cpu_name()
    script = ("from numvar.instrument import kernels as KN; "
              "print(KN._cpu_name(), KN.TERM_BITS_APART, KN.CLEAN_LOOPS_BITS_APART)")
    for cpu, features, want in (("znver4", "+avx512f,+avx512dq", "znver4 False True"),
                                ("sapphirerapids", "+avx512f,+avx512dq",
                                 "sapphirerapids False False"),
                                ("znver3", "+avx2,+fma", "znver3 True True")):
        env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, check=True, timeout=300).stdout.split("\n")[-2]
        assert out == want
