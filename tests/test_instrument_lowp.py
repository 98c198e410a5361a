"""bfloat16/float16 fast paths of the instrumentation against their general paths, bit for
bit: the contraction kernel's exact-product specialisation (product roundings skipped
when every product is exact in binary32) and the short rounding path of
``Ctx.round`` to bfloat16/float16 (no float64 copy of a binary32 result)."""

from fractions import Fraction

import numba
import numpy as np
import pytest
import torch

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box

import numvar.rounding as R
from numvar.instrument import kernels as KN
from numvar.instrument._core import Ctx
from numvar.rounding import kernels as RK

NARROW = (torch.bfloat16, torch.float16)


def _values(rng, shape, dtype, tiny: bool = False) -> np.ndarray:
    """float32 carriers of ``dtype`` values: normal values, zeros, ±0, ones; ``tiny``
    adds magnitudes whose products leave binary32's normal range (rows that are not
    clean: the kernel's checked and full paths)."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))
    x[rng.random(shape) < 0.1] = 0.0
    x[rng.random(shape) < 0.05] = -0.0
    x[rng.random(shape) < 0.05] = 1.0
    if tiny and dtype is torch.bfloat16:
        x[rng.random(shape) < 0.1] = 2.0 ** -100  # products below 2**-102
    return torch.from_numpy(x).to(dtype).float().numpy()


def _sig_bits(v: float) -> int:
    """Significant bits of a finite float, exactly (Fraction)."""
    f = abs(Fraction(v))
    if f == 0:
        return 1
    n, d = f.numerator, f.denominator
    while d > 1 and d % 2 == 0:  # d is a power of two: the significand is n
        d //= 2
    while n % 2 == 0:
        n //= 2
    return n.bit_length()


@pytest.mark.parametrize("dtype,bits", [(torch.bfloat16, 8), (torch.float16, 11)])
def test_narrow_products_bound_is_exact(dtype, bits):
    """The bound read off the OR of fraction fields is ≥ every value's significant bits
    (Fraction), and tight on these arrays: 8 + 8 and 11 + 11 fit 24 bits; one value with
    13 bits more tips the sum past 24."""
    rng = np.random.default_rng(1)
    a = _values(rng, (1, 5, 40), dtype)
    # the format's smallest subnormal (bfloat16: a binary32 subnormal): within the bound
    a.flat[3] = float(torch.finfo(dtype).tiny) * 2.0 ** -(bits - 1)
    pa, pb = KN._narrow_bits(a, a)
    assert pa == pb == bits
    assert max(_sig_bits(float(v)) for v in a.flat) <= pa
    assert KN.narrow_products(a, a, 24)
    wide = a.copy()
    wide.flat[7] = np.float32(1 + 2.0 ** -(bits + 5))  # bits + 6 significant bits
    assert _sig_bits(float(wide.flat[7])) == bits + 6
    assert KN._narrow_bits(wide, a)[0] == bits + 6
    assert KN.narrow_products(wide, a, 24) == (2 * bits + 6 <= 24)
    assert not KN.narrow_products(wide, wide, 24) or 2 * (bits + 6) <= 24
    z = np.zeros((1, 2, 3), np.float32)
    assert KN._narrow_bits(z, z) == (1, 1)
    # every product of a bfloat16/float16 pair in binary32's normal range is exact
    if dtype is torch.bfloat16:
        p = a.reshape(-1)[:, None].astype(np.float64) * a.reshape(-1)[None, :]
        normal = (np.abs(p) >= 2.0 ** -126) | (p == 0)
        assert np.array_equal(p[normal], p[normal].astype(np.float32).astype(np.float64))


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    """Bitwise equal up to the sign and payload of NaNs; signed zeros count."""
    num = ~np.isnan(x)
    return np.array_equal(np.isnan(x), np.isnan(y)) and np.array_equal(
        x[num].view(np.uint32), y[num].view(np.uint32))


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("mode", ("sr", "ieee", "random", "ud"))
def test_exact_product_contract_is_the_general_path(dtype, mode):
    """contract() on bfloat16/float16 values (exact products: the product roundings of
    clean rows skipped) gives the bits of the general clean loop and of the slow
    reference, clean and unclean rows alike; ud (which perturbs exact values) keeps the
    general loop."""
    rng = np.random.default_rng(2)
    a = _values(rng, (2, 5, 23), dtype, tiny=True)
    a[0, 1:] = _values(rng, (4, 23), dtype)  # clean rows next to unclean ones
    a[1, 0, 3], a[1, 2, 5] = np.inf, np.nan
    b = _values(rng, (1, 23, 19), dtype)
    code = RK.mode_code(mode)
    assert KN.narrow_products(a, b, 24)
    clean = KN.clean_rows(a, b, 2, 24)
    assert clean.any() and not clean.all()
    fast = KN.contract(a, b, 11, code, 24)
    general = np.empty_like(fast)
    KN._contract_fast32(a, b, clean, general, np.uint64(11), code, 24, False, False, 1)
    assert _same_bits(fast, general)
    assert _same_bits(fast, KN.contract_reference(a, b, 11, code, 24))


def _hi(rng, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Values around every range of the target: normal, subnormal, below half its
    smallest subnormal, overflowing, ±0, ±inf, NaN."""
    info = torch.finfo(dtype)
    nmant = {torch.bfloat16: 7, torch.float16: 10}[dtype]  # fraction bits
    x = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    x[::7] *= info.tiny / 4  # subnormal in the target
    x[1::11] = info.tiny * 2.0 ** -(nmant + 2)  # below half the smallest subnormal
    x[2::13] = float(info.max) * 1.001  # overflow
    x[3::17] = -float(info.max) * (1 - 2.0 ** -12)
    x[4::19] = 0.0
    x[5::19] = -0.0
    x[6::23] = np.inf
    x[7::29] = np.nan
    return torch.from_numpy(x)


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("mode", ("sr", "ieee", "ud", "random", "up", "farthest"))
@pytest.mark.parametrize("carrier", (torch.float32, torch.float64))
def test_round_to_narrow_is_the_rounding_core(dtype, mode, carrier):
    """Ctx.round of a binary32 or binary64 CPU tensor to bfloat16/float16 (the short
    path) equals numvar.rounding.round of its float64 copy with the same key, bit for
    bit, over every range of the target, and a virtual precision too."""
    rng = np.random.default_rng(3)
    hi = _hi(rng, 3000, dtype).to(carrier).reshape(3, 1000, 1)[:, :-1]  # non-contiguous
    for precision in (None, 5):
        ctx = Ctx(mode=mode, granularity="flop", precision=precision, stream=R.Stream(4))
        ref = R.Stream(4)
        got = ctx.round(hi, dtype)
        want = R.round(hi.double(), dtype=dtype, mode=mode, stream=ref,
                       precision=ctx.prec(dtype))
        assert got.dtype is dtype and got.shape == hi.shape
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert ctx.stream.next_key() == ref.next_key()  # one key each


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("mode", ("sr", "ud", "down"))
def test_binary_narrow_is_the_rounding_core(dtype, mode):
    """Ctx.add/sub/mul/div of bfloat16/float16 CPU tensors (the short path, broadcast
    operands included) equals numvar.rounding's add/sub/mul/div with the same key, bit
    for bit, a virtual precision too."""
    rng = np.random.default_rng(5)
    a = _hi(rng, 600, dtype).to(dtype).reshape(20, 30)
    b = _hi(np.random.default_rng(6), 600, dtype).to(dtype).reshape(20, 30)
    for precision in (None, 6):
        for name, y in (("add", b), ("sub", b[:, :1]), ("mul", b[:1]), ("div", b.t()[:1, :20].t())):
            ctx = Ctx(mode=mode, granularity="flop", precision=precision, stream=R.Stream(7))
            ref = R.Stream(7)
            got = getattr(ctx, name)(a, y)
            want = getattr(R, name)(a, y, mode=mode, stream=ref, precision=ctx.prec(dtype))
            assert got.dtype is dtype and got.shape == want.shape
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name
            assert ctx.stream.next_key() == ref.next_key()
