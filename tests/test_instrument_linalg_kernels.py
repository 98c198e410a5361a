"""The compiled binary32 kernels of the flop linear algebra, FFT and row scans
(numvar.instrument.linalg_kernels, fft_kernels, scan_kernels) against their tensor
implementations (the modules' USE_KERNELS off) or kernels.scan, bit for bit: every
rounding mode (the fast tiles and the scalar path of up), pivot ties, zero and NaN
pivots, rectangular and batched inputs, non-contiguous operands, and the stream position
after the call (the same number of keys drawn)."""

import pytest
import torch

import numvar.rounding as R
from numvar.instrument import linalg as LA
from numvar.instrument._core import Ctx

from _bitwise import same


def _pair(fn, mode, seed=3, module=LA):
    """fn(ctx) with the kernels and with the tensor implementation: both results and the
    streams' counters after the call."""
    out = []
    for use in (True, False):
        module.USE_KERNELS = use
        try:
            ctx = Ctx(mode, "flop", None, R.Stream(seed))
            out.append((fn(ctx), ctx.stream.counter))
        finally:
            module.USE_KERNELS = True
    return out


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("mode", ["sr", "ud", "ieee", "random", "up"])
def test_lu_and_solves_match_tensor_implementation(mode):
    A = _rand(3, 5, 5, seed=1)
    A[1, :, 0] = 0.0  # zero pivot: info set, column left unscaled
    A[2, 3, 0] = A[2, 1, 0] = 9.0  # a tie: the first maximum is the pivot
    Bm = _rand(3, 5, 2, seed=2)
    cases = [
        lambda c: LA.lu_factor(c, A),
        lambda c: LA.lu_factor(c, _rand(2, 4, 6, seed=4)),  # wide
        lambda c: LA.lu_factor(c, _rand(2, 6, 3, seed=5).mT.mT[:, :, :3]),  # tall
        lambda c: LA.lu_factor(c, _rand(2, 4, 4, seed=6).mT),  # non-contiguous
        lambda c: LA.solve(c, A[[0, 2]], Bm[[0, 2]]),
        lambda c: LA.solve(c, A[0], Bm[0, :, 0]),  # a vector right-hand side
        lambda c: LA.lu_solve(c, *LA.lu_factor(c, A)[:2], Bm, adjoint=True),
        lambda c: LA.lu_solve(c, *LA.lu_factor(c, A)[:2], Bm.mT, left=False),
        lambda c: LA.inv(c, A[2]),
        lambda c: LA.solve_triangular(c, torch.triu(A[0]) + 3 * torch.eye(5), Bm[0], upper=True),
        lambda c: LA.solve_triangular(c, torch.tril(A[2]), Bm[2], upper=False,
                                      unitriangular=True),
    ]
    for fn in cases:
        (fast, nf), (slow, ns) = _pair(fn, mode)
        assert same(fast, slow) and nf == ns


@pytest.mark.parametrize("mode", ["sr", "ud", "up"])
def test_solve_in_one_call_matches_the_calls_one_by_one(mode, monkeypatch):
    """linalg.solve in one compiled call (linalg_kernels.solve32) against the LU and the
    two triangular solves called one by one (SOLVE_IN_ONE_CALL off) and against the
    tensor implementation (USE_KERNELS off): the same bits, the same strides of all four
    results, the stream at the same position; batched with a zero pivot and a tie,
    transposed operands, a vector and a batch of vectors as right-hand side, n = 1."""
    from numvar.instrument import linalg_kernels as LK

    calls = []
    one_call = LK.solve32
    monkeypatch.setattr(LK, "solve32", lambda *a: (calls.append(1), one_call(*a))[1])
    A = _rand(3, 5, 5, seed=1)
    A[1, :, 0] = 0.0
    A[2, 3, 0] = A[2, 1, 0] = 9.0
    cases = [(A, _rand(3, 5, 2, seed=2)), (A[0].mT, _rand(4, 5, seed=3).mT),
             (A[2], _rand(5, seed=4)), (A, _rand(3, 5, seed=5)),
             (_rand(1, 1, seed=6), _rand(1, 3, seed=7))]
    for Am, Bx in cases:
        got = []
        for use, one in ((True, True), (True, False), (False, False)):
            monkeypatch.setattr(LA, "USE_KERNELS", use)
            monkeypatch.setattr(LA, "SOLVE_IN_ONE_CALL", one)
            ctx = Ctx(mode, "flop", None, R.Stream(3))
            out = LA.solve(ctx, Am, Bx)
            got.append((out, [t.stride() for t in out], ctx.stream.counter))
        (fused, sf, nf), (calls_, sc, nc), (tensor, st, nt) = got
        assert same(fused, calls_) and same(fused, tensor)
        assert sf == sc == st and nf == nc == nt
    assert len(calls) == len(cases)


def test_nan_pivot_matches_tensor_implementation():
    A = _rand(2, 4, 4, seed=7)
    A[0, 2, 0] = float("nan")  # torch.argmax picks the NaN
    A[1, 1, 1] = float("nan")
    (fast, _), (slow, _) = _pair(lambda c: LA.lu_factor(c, A), "sr")
    assert same(fast, slow)


def test_stream_keys_are_next_key():
    import numpy as np

    from numvar.instrument.linalg_kernels import stream_keys

    s, ref = R.Stream(11), R.Stream(11)
    ref.next_key()
    s.next_key()
    flags = np.array([[True, False, True], [False, True, True]])
    keys = stream_keys(s, flags).T  # drawn as (calls, steps)
    want = [[ref.next_key(), 0, ref.next_key()], [0, ref.next_key(), ref.next_key()]]
    assert keys.tolist() == want and s.counter == ref.counter


def test_compiled_keys_are_stream_keys():
    """linalg_kernels.keys (one compiled call) draws what stream_keys draws from the
    stacked flags: the same keys in the same places, the stream left at the same
    counter; seeds at both ends of their range, flags empty, sparse, full."""
    import numpy as np

    from numvar.instrument.linalg_kernels import keys, stream_keys

    class _Ctx:
        pass

    rng = np.random.default_rng(3)
    for seed in (0, 11, 2**64 - 1):
        ctx, ref = _Ctx(), R.Stream(seed)
        ctx.stream = R.Stream(seed)
        for _ in range(5):
            ctx.stream.next_key(), ref.next_key()
        for n, p in ((1, 0.5), (3, 0.0), (8, 1.0), (64, 0.6), (300, 0.3)):
            flags = [rng.random(n) < p for _ in range(3)]
            got = keys(ctx, *flags)
            want = stream_keys(ref, np.stack(flags, 1))
            assert got.dtype == np.uint64 and got.shape == (3, n)
            assert got.tolist() == want.tolist() and ctx.stream.counter == ref.counter
            assert ctx.stream.next_key() == ref.next_key()


@pytest.mark.parametrize("mode", ["sr", "ud", "up"])
def test_radix2_matches_tensor_implementation(mode):
    from numvar.instrument import fft as FT

    for n in (2, 8, 32, 70):  # 70: Bluestein, radix-2 of length 256 inside
        re, im = _rand(3, n, seed=n), _rand(3, n, seed=n + 1)
        for sign in (-1, 1):
            (fast, nf), (slow, ns) = _pair(lambda c: FT.c2c_parts(c, re, im, sign), mode,
                                           module=FT)
            assert same(fast, slow) and nf == ns


@pytest.mark.parametrize("mode", ["sr", "ieee", "random", "ud"])
def test_radix2_specials_and_scalar_redo(mode):
    """fft_kernels.radix2_32 against the tensor implementation where the fast path
    declines in part of a stage (subnormal and overflowing products, inexact float64
    sums from values 2^±60 apart, inf, NaN, zeros): the tiles redone on the scalar path
    keep the bits of the rest; lengths 4 and 16."""
    from numvar.instrument import fft as FT

    for n in (4, 16):
        re, im = _rand(2, n, seed=n), _rand(2, n, seed=n + 7)
        re[0, 1], im[0, 3] = 2.0 ** 60, 2.0 ** -60
        re[1, 2], im[1, 1] = 1e-40, 3e38
        re[1, n - 1], im[0, n - 2] = float("inf"), float("nan")
        re[0, 0] = 0.0
        (fast, nf), (slow, ns) = _pair(lambda c: FT.c2c_parts(c, re, im, -1), mode, module=FT)
        assert same(fast, slow) and nf == ns


@pytest.mark.parametrize("mode", ["sr", "ud", "up"])
def test_radix2_through_torch_fft(mode):
    """torch.fft under fuzzy flop, the kernels (with the short paths of ``fft_r2c`` and
    ``fft_c2r`` along the last dim: ``_r2c_last``, ``_c2r_last``) and the tensor
    implementation on the same seed: same bits, strides and stream position. rfft with
    every normalisation, one- and two-sided (``fft`` of a real tensor), irfft with as
    many, fewer (zero padded) and more bins than it reads, imaginary parts at bins 0 and
    n/2 (ignored), a length that is not a power of two, lengths 2 and 4, conjugated and
    non-contiguous inputs, a transform along another dim (the general path), and special
    values."""
    from numvar.instrument import fft as FT
    from numvar.instrument import fuzzy

    x = _rand(2, 3, 16, seed=5)
    x[1, 2, 3] = float("nan")
    x[0, 1, 5] = float("inf")
    xt = _rand(16, 6, seed=6).t()  # non-contiguous rows
    X = torch.fft.rfft(_rand(3, 16, seed=7))
    Z = torch.complex(_rand(3, 9, seed=8), _rand(3, 9, seed=9))  # imaginary parts at 0, n/2

    def run():
        with fuzzy(mode=mode, granularity="flop", seed=1) as fz:
            outs = [torch.fft.irfft(torch.fft.rfft(x) * 0.5, n=16),
                    torch.fft.fft(x.to(torch.complex64), dim=1),
                    torch.fft.fft(x),                       # _fft_r2c, onesided=False
                    torch.fft.rfft(xt), torch.fft.rfft(xt, dim=0)]
            outs += [torch.fft.rfft(x, norm=nm) for nm in ("ortho", "forward")]
            outs += [torch.fft.irfft(X, n=k, norm=nm) for k in (16, 32, 8)
                     for nm in ("backward", "ortho", "forward")]
            outs += [torch.fft.irfft(X.conj()), torch.fft.irfft(X[:, ::2], n=16),
                     torch.fft.ifft(X.conj()), torch.fft.irfft(Z), torch.fft.irfft(Z, n=12)]
            # the shortest transforms: stage 0 is the last (an irfft's imaginary parts
            # are not computed there either)
            outs += [torch.fft.irfft(X, n=2), torch.fft.irfft(X, n=4),
                     torch.fft.rfft(x[..., :2]), torch.fft.rfft(x[..., :4])]
            counter = fz._ctx.stream.counter
        return [torch.view_as_real(o) if o.is_complex() else o for o in outs], counter

    out = []
    for use in (True, False):
        FT.USE_KERNELS = use
        try:
            out.append(run())
        finally:
            FT.USE_KERNELS = True
    (fast, nf), (slow, ns) = out
    assert nf == ns
    for i, (a, b) in enumerate(zip(fast, slow)):
        assert a.stride() == b.stride() and same(a, b), i


def _hermitian_reference(h, B, m, n):
    """fft_kernels.hermitian32's docstring in plain Python: bins 0..n/2 from the pairs
    (zeros past the m given), imaginary parts of bins 0 and n/2 set to +0, then
    X_k = conj X_{n-k} for k > n/2."""
    fr, fi = [], []
    for b in range(B):
        re = [float(h[2 * (b * m + k)]) if k < m else 0.0 for k in range(n // 2 + 1)]
        im = [float(h[2 * (b * m + k) + 1]) if k < m else 0.0 for k in range(n // 2 + 1)]
        im[0] = im[n // 2] = 0.0
        fr += re + [re[n - k] for k in range(n // 2 + 1, n)]
        fi += im + [-im[n - k] for k in range(n // 2 + 1, n)]
    return fr, fi


@pytest.mark.parametrize("B,m,n", [(3, 9, 16), (2, 5, 16), (2, 20, 16), (1, 2, 2), (4, 3, 4),
                                   (2, 1, 8), (32, 129, 256)])
def test_hermitian_and_interleave_copies(B, m, n):
    """fft_kernels.hermitian32 and interleave32 against plain Python, bit for bit (the
    signs of zeros included: a mirrored zero bin is (+0, -0)), for as many, fewer and
    more bins than the transform reads."""
    import numpy as np

    from numvar.instrument import fft_kernels as FK

    h = _rand(B * m * 2, seed=m).numpy()
    h[::7] = 0.0
    h[1::5] = -0.0
    fr, fi = FK.hermitian32(h, B, m, n)
    rr, ri = _hermitian_reference(h, B, m, n)
    assert np.array_equal(fr.view(np.uint32), np.array(rr, np.float32).view(np.uint32))
    assert np.array_equal(fi.view(np.uint32), np.array(ri, np.float32).view(np.uint32))
    for keep in (1, n // 2 + 1, n):
        out = FK.interleave32(fr, fi, B, n, keep)
        ref = np.stack((fr.reshape(B, n)[:, :keep], fi.reshape(B, n)[:, :keep]), -1)
        assert np.array_equal(out.view(np.uint32), ref.reshape(-1).view(np.uint32))


@pytest.mark.parametrize("mode", ["sr", "ud", "random", "up"])
def test_rowscan_matches_column_scan(mode):
    """flop.reduce / flop.scan over the last dim of fewer than ROW_M_MIN rows
    (scan_kernels.rowscan32) against kernels.scan on the transposed rows, bit for bit;
    rows mixing magnitudes (inexact float64 sums: the scalar fallback), zeros and
    infinities."""
    import numpy as np

    from numvar.instrument import flop
    from numvar.instrument import kernels as KN

    x = _rand(3, 300, seed=9)
    x[0, ::7] *= 2.0 ** 40
    x[1, 5] = 0.0
    x[2, 100] = float("inf")
    code = R.kernels.mode_code(mode)
    for mul in (False, True):
        xs = x.abs() ** 0.01 if mul else x  # products near 1: no overflow
        for cumulative in (False, True):
            ctx = Ctx(mode, "flop", None, R.Stream(5))
            got = (flop.scan(xs, 1, ctx, mul=mul) if cumulative
                   else flop.reduce(xs, [1], ctx, mul=mul))
            key = R.Stream(5).next_key()
            ref = KN.scan(np.ascontiguousarray(xs.numpy().T), key, code, 24, mul=mul,
                          cumulative=cumulative)
            want = torch.from_numpy(ref.T.copy()) if cumulative else torch.from_numpy(ref[0])
            assert same(got, want) and ctx.stream.counter == 1
