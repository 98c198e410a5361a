"""The numba rounding kernel's input and output paths, bit for bit against the paths they
replace and against the torch backend (the slow reference, itself compared with the
Fraction reference in test_rounding_core): float32 inputs read directly, bfloat16 /
float16 bit patterns written into the target (``out=`` or not), the fast path with a
``lo`` term, and out-of-range elements redone per block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numvar.rounding as R
from numvar.rounding import kernels as K
from test_rounding_core import FULL, MODES, same_bits, special_values

TARGETS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
SMALL_T = {torch.float32: 5, torch.bfloat16: 3, torch.float16: 4, torch.float64: 20}


def _round(hi, lo=None, *, dtype, mode, t, backend="numba", out=None, seed=3):
    return R.round(hi, lo, dtype=dtype, mode=mode, stream=R.Stream(seed), precision=t,
                   backend=backend, out=out)


def _inputs32() -> tuple[torch.Tensor, torch.Tensor]:
    """float32 values over the whole range (subnormals, extremes, zeros, inf, nan) and a
    float32 lo term, zero for some elements, of either sign and size elsewhere."""
    x = special_values(torch.float32, 40, 11)
    g = torch.Generator().manual_seed(5)
    lo = (x * 2.0 ** -30 * torch.randn(len(x), generator=g)).float()
    lo[::3] = 0.0
    lo[1::7] = -0.0
    lo = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
    return x, lo


@pytest.mark.parametrize("dtype", TARGETS)
def test_float32_input_equals_float64_input(dtype):
    """round(x32) gives the bits of round(x32.double()) (the old path copied float32
    inputs to float64 first), with and without lo, and of the torch backend."""
    x, lo = _inputs32()
    for mode in MODES:
        for t in (FULL[dtype], SMALL_T[dtype]):
            got = _round(x, dtype=dtype, mode=mode, t=t)
            assert same_bits(got, _round(x.double(), dtype=dtype, mode=mode, t=t)), (mode, t)
            assert same_bits(got, _round(x.double(), dtype=dtype, mode=mode, t=t,
                                         backend="torch")), (mode, t)
            got = _round(x, lo, dtype=dtype, mode=mode, t=t)
            assert same_bits(got, _round(x.double(), lo.double(), dtype=dtype, mode=mode,
                                         t=t)), (mode, t)
            assert same_bits(got, _round(x.double(), lo.double(), dtype=dtype, mode=mode,
                                         t=t, backend="torch")), (mode, t)


def test_narrow_inputs_and_mixed_dtypes():
    """bfloat16 / float16 inputs (read as float32) and a float32 hi with a float64 lo
    (both read as float64) give the bits of float64 inputs of the same values."""
    for src in (torch.bfloat16, torch.float16):
        x = special_values(src, 20, 12)
        for mode in MODES:
            got = _round(x, dtype=torch.bfloat16, mode=mode, t=5)
            assert same_bits(got, _round(x.double(), dtype=torch.bfloat16, mode=mode, t=5))
    x, lo = _inputs32()
    lo64 = lo.double() * (1 + 2.0 ** -40)
    for mode in MODES:
        got = _round(x, lo64, dtype=torch.float32, mode=mode, t=24)
        assert same_bits(got, _round(x.double(), lo64, dtype=torch.float32, mode=mode, t=24,
                                     backend="torch")), mode


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_out_equals_no_out(dtype):
    """out= (the kernel writes the target's bits) gives the bits of a new result, NaN
    payloads included, and of the torch backend; the result is ``out`` itself."""
    x = special_values(torch.float64, 40, 13) * (1 + 2.0 ** -20)
    lo = x * 2.0 ** -70
    for mode in MODES:
        for t in (FULL[dtype], SMALL_T[dtype]):
            for lo_ in (None, lo):
                out = torch.full(x.shape, 7.0, dtype=dtype)
                got = _round(x, lo_, dtype=dtype, mode=mode, t=t, out=out)
                assert got is out
                new = _round(x, lo_, dtype=dtype, mode=mode, t=t)
                assert torch.equal(out.view(torch.int16 if dtype != torch.float32
                                            else torch.int32),
                                   new.view(torch.int16 if dtype != torch.float32
                                            else torch.int32)), (mode, t)
                assert same_bits(out, _round(x, lo_, dtype=dtype, mode=mode, t=t,
                                             backend="torch")), (mode, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lo_zeros_equals_no_lo(dtype):
    """lo = +0 or -0 everywhere (the exact error term of exact results) keeps hi as is:
    the bits of lo=None, on the fast path now."""
    x = special_values(torch.float64, 40, 14) * (1 + 2.0 ** -33)
    for mode in MODES:
        for t in (FULL[dtype], SMALL_T[dtype]):
            want = _round(x, dtype=dtype, mode=mode, t=t)
            for z in (torch.zeros_like(x), torch.full_like(x, -0.0)):
                assert same_bits(_round(x, z, dtype=dtype, mode=mode, t=t), want), (mode, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_out_of_range_element_among_clean_ones(dtype):
    """Clean values over three blocks of the kernel and a few more, with one element the
    fast path does not take (subnormal, overflowing, beyond the format, inf, nan, zero)
    at the start, at a block boundary or at the end: the bits of the torch backend and
    of the scalar round_narrow applied element by element."""
    n = 3 * K.ROUND_BLOCK + 5
    g = torch.Generator().manual_seed(8)
    clean = torch.rand(n, dtype=torch.float64, generator=g) + 1.0
    fmt = R.FORMATS[dtype]
    odd = [2.0 ** (fmt.emin - 2) * 1.3, -fmt.max_finite * (1 - 2.0 ** -12), 2.0 ** fmt.emax * 3,
           float("inf"), float("nan"), -0.0]
    modes = list(MODES)
    for i, (v, pos) in enumerate(zip(odd, (0, K.ROUND_BLOCK - 1, K.ROUND_BLOCK,
                                           2 * K.ROUND_BLOCK + 1, n - 1, n // 2))):
        x = clean.clone()
        x[pos] = v
        mode = modes[i % len(modes)]
        for m in (mode, modes[(i + 4) % len(modes)]):
            t = FULL[dtype] if i % 2 else SMALL_T[dtype]
            got = _round(x, dtype=dtype, mode=m, t=t)
            assert same_bits(got, _round(x, dtype=dtype, mode=m, t=t, backend="torch")), (v, m)
            # the odd element and its neighbours against the scalar kernel itself
            key = R.Stream(3).next_key()
            for j in {0, max(pos - 1, 0), pos, min(pos + 1, n - 1), n - 1}:
                want = K.call_round_narrow(float(x[j]), 0.0, K.mode_code(m), t, fmt.p,
                                           fmt.emin, fmt.emax, np.uint64(R.bits(key, j)))
                w = torch.tensor([want], dtype=torch.float64).float().to(dtype)
                assert same_bits(got[j:j + 1], w), (v, m, j)


def test_bits16_equals_torch_casts():
    """bits16 (the kernel's bfloat16 / float16 store) gives, for every 16-bit pattern,
    the bits of torch's float32 -> bfloat16 / float16 cast of that value (what the
    kernel's float32 result went through before), NaNs included."""
    pats = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    for dtype, (p, emin) in ((torch.bfloat16, (8, -126)), (torch.float16, (11, -14))):
        vals = pats.view(dtype).float()
        want = vals.to(dtype).view(torch.int16).numpy().view(np.uint16)
        got = _bits16_all(vals.double().numpy(), p, emin)
        assert np.array_equal(got, want), dtype


def _bits16_all(x: np.ndarray, p: int, emin: int) -> np.ndarray:
    return np.array([K.bits16(v, p, emin) for v in x], dtype=np.uint16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_binary_ops_over_blocks_with_declined_elements(dtype):
    """add, sub, mul and div of the numba backend, block by block
    (``kernels.ROUND_BLOCK`` elements, the fast pass with the mode a constant for sr and
    ud; binary32 division at 24 bits has its own), against the torch backend: clean
    pairs over three blocks and a few more, with pairs the fast pass declines (an inexact
    float64 sum, a result below or beyond the format's normal range, inf, NaN, signed
    zeros, a division by zero, a quotient below the normal range, whose rounding draws
    on the element's random bits) at the start, at block boundaries and at the end; every
    mode, the format's precision and a virtual one."""
    n = 3 * K.ROUND_BLOCK + 5
    g = torch.Generator().manual_seed(9)
    fmt = R.FORMATS[dtype]
    a = (torch.rand(n, dtype=torch.float64, generator=g) + 1.0).to(dtype)
    b = (torch.rand(n, dtype=torch.float64, generator=g) + 1.0).to(dtype)
    tiny, big = 2.0 ** (fmt.emin - 1), fmt.max_finite
    odd = [(1.0, 2.0 ** -(fmt.p + 3)), (tiny, 0.25), (big, big), (float("inf"), 1.0),
           (float("nan"), 2.0), (-0.0, 0.0), (big, -tiny), (1.0, 0.0), (tiny, 3.0)]
    for (x, y), pos in zip(odd, (0, K.ROUND_BLOCK - 1, K.ROUND_BLOCK, 2 * K.ROUND_BLOCK + 1,
                                 n - 1, n // 2, 2 * K.ROUND_BLOCK, 5, 3 * K.ROUND_BLOCK + 1),
                           strict=True):
        a[pos], b[pos] = x, y
    for mode in MODES:
        for op in (R.add, R.sub, R.mul, R.div):
            for t in (FULL[dtype], SMALL_T[dtype]):
                got = op(a, b, mode=mode, stream=R.Stream(4), precision=t, backend="numba")
                want = op(a, b, mode=mode, stream=R.Stream(4), precision=t, backend="torch")
                assert same_bits(got, want), (mode, op.__name__, t)


def test_sqrt_over_blocks_with_declined_elements():
    """The numba backend's binary32 square root, block by block (a vectorised fast pass
    for ieee, sr, ud and random at 24 bits; the directed modes and virtual precisions
    element by element), against the torch backend: values over three blocks and a few
    more, with the roots the fast pass declines or passes through (negative, -0, +0, a
    subnormal, inf, -inf, NaN) at the start, at block boundaries and at the end; every
    mode, 24 bits and a virtual precision."""
    n = 3 * K.ROUND_BLOCK + 5
    g = torch.Generator().manual_seed(10)
    x = torch.rand(n, generator=g) * 1e3
    odd = [-1.5, -0.0, 0.0, 1e-40, float("inf"), float("-inf"), float("nan")]
    for v, pos in zip(odd, (0, K.ROUND_BLOCK - 1, K.ROUND_BLOCK, 2 * K.ROUND_BLOCK + 1,
                            n - 1, n // 2, 3 * K.ROUND_BLOCK + 2), strict=True):
        x[pos] = v
    for mode in MODES:
        for t in (24, SMALL_T[torch.float32]):
            got = R.sqrt(x, mode=mode, stream=R.Stream(6), precision=t, backend="numba")
            want = R.sqrt(x, mode=mode, stream=R.Stream(6), precision=t, backend="torch")
            assert same_bits(got, want), (mode, t)


def test_fma_over_blocks_with_declined_elements():
    """The numba backend's binary32 fma, block by block (a vectorised fast pass for
    ieee, sr, ud and random at 24 bits; the directed modes and virtual precisions element
    by element), against the torch backend: triples over three blocks and a few more,
    with ones the fast pass declines (a result below the normal range, whose rounding
    draws on the element's random bits; beyond it; an exact cancellation; inf, NaN)
    at the start, at block boundaries and at the end; every mode, 24 bits and a virtual
    precision."""
    n = 3 * K.ROUND_BLOCK + 5
    g = torch.Generator().manual_seed(11)
    a, b, c = (torch.randn(n, generator=g) for _ in range(3))
    tiny, big = 2.0 ** -127, 3e38
    odd = [(tiny, 0.75, 0.0), (big, 4.0, 0.0), (2.0, 3.0, -6.0), (float("inf"), 1.0, 1.0),
           (float("nan"), 1.0, 0.0), (1.0, 2.0 ** -140, -(2.0 ** -141)), (tiny, 0.5, tiny)]
    for (x, y, z), pos in zip(odd, (0, K.ROUND_BLOCK - 1, K.ROUND_BLOCK, 2 * K.ROUND_BLOCK + 1,
                                    n - 1, n // 2, 3 * K.ROUND_BLOCK + 2), strict=True):
        a[pos], b[pos], c[pos] = x, y, z
    for mode in MODES:
        for t in (24, SMALL_T[torch.float32]):
            got = R.fma(a, b, c, mode=mode, stream=R.Stream(7), precision=t, backend="numba")
            want = R.fma(a, b, c, mode=mode, stream=R.Stream(7), precision=t, backend="torch")
            assert same_bits(got, want), (mode, t)
