"""Complex results and FFTs under fuzzy (numvar.instrument.fft, numvar.instrument.cplx):
native dtypes, perturbation, slow references bit for bit, derived ieee bounds, report."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import numvar.rounding as R
from numvar.instrument import cplx, fuzzy
from numvar.instrument import fft as FT
from numvar.instrument._core import Ctx

from _bitwise import same
from _scalar_round import ScalarRounding

U32 = 2.0 ** -24


def _gamma(k: int, u: float = U32) -> float:
    return k * u / (1 - k * u)


def _rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _ctx(seed, mode="sr", precision=None):
    return Ctx(mode, "flop", precision, R.Stream(seed))


CASES = [("sr", None, torch.float32), ("sr", 10, torch.float32), ("ud", None, torch.float64)]


# ------------------------------------------------------------------- bit for bit
@pytest.mark.parametrize("mode,prec,dt", CASES)
@pytest.mark.parametrize("n", [8, 6, 1, 2, FT.DIRECT_MAX + 1])
@pytest.mark.parametrize("sign", [-1, 1])
def test_c2c_matches_reference(mode, prec, dt, n, sign):
    """Radix-2 (n = 8, 2), direct DFT (n = 6), Bluestein (n = 65), identity (n = 1)
    against the plain loops."""
    B = 1 if n > FT.DIRECT_MAX else 3
    re, im = _rand(B, n, seed=n, dtype=dt), _rand(B, n, seed=n + 1, dtype=dt)
    fr, fi = FT.c2c_parts(_ctx(3, mode, prec), re, im, sign)
    sr = ScalarRounding(3, mode, dt, prec)
    rr, ri = FT.c2c_reference(re.numpy(), im.numpy(), sign, iter(sr.key, None), sr.code, sr.t)
    assert same(fr.contiguous(), torch.from_numpy(rr)) and same(fi.contiguous(), torch.from_numpy(ri))


@pytest.mark.parametrize("mode,prec,dt", CASES[:2])
def test_complex_mul_matches_reference(mode, prec, dt):
    """z·w = (RND(RND(zr·wr) − RND(zi·wi)), RND(RND(zr·wi) + RND(zi·wr))): the products
    in one call (stacked zr·wr, zi·wi, zr·wi, zi·wr), the sums in one."""
    cd = torch.complex64
    z = torch.complex(_rand(2, 3, seed=1, dtype=dt), _rand(2, 3, seed=2, dtype=dt))
    w = torch.complex(_rand(2, 3, seed=3, dtype=dt), _rand(2, 3, seed=4, dtype=dt))
    out = cplx.mul(_ctx(5, mode, prec), z, w)
    assert out.dtype == cd
    sr = ScalarRounding(5, mode, dt, prec)
    kp, ks = sr.key(), sr.key()
    n = 6
    zr, zi, wr, wi = (t.reshape(-1).numpy() for t in (z.real, z.imag, w.real, w.imag))
    for e in range(n):
        p = [sr.mul(zr[e], wr[e], kp, e), sr.mul(zi[e], wi[e], kp, n + e),
             sr.mul(zr[e], wi[e], kp, 2 * n + e), sr.mul(zi[e], wr[e], kp, 3 * n + e)]
        assert out.real.reshape(-1)[e].item() == sr.add(p[0], -p[1], ks, e)
        assert out.imag.reshape(-1)[e].item() == sr.add(p[2], p[3], ks, n + e)


def _same_as_tensor_implementation(fn, mode, shape, monkeypatch):
    """``fn(ctx)`` (a complex64 result) with ``cplx``'s compiled kernels and with its
    tensor implementation (``cplx.USE_KERNELS`` off): the same bits, shape and dtype, and
    the stream at the same position afterwards."""
    ctx = _ctx(9, mode)
    got = fn(ctx)
    after = ctx.stream.next_key()
    monkeypatch.setattr(cplx, "USE_KERNELS", False)
    ref_ctx = _ctx(9, mode)
    want = fn(ref_ctx)
    assert ref_ctx.stream.next_key() == after
    assert got.shape == want.shape == shape and got.dtype == torch.complex64
    assert same(torch.view_as_real(got), torch.view_as_real(want))


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "up"])
def test_complex_mul_kernel_equals_the_tensor_implementation(mode, monkeypatch):
    """complex64 · complex64 on the CPU at 24 bits goes through ``pointwise.cmul32`` (one
    compiled call): bit for bit the tensor implementation's values, keys and stream
    position, with broadcasting, a conjugate view, more elements than a rounding tile,
    and parts that make the float64 sums inexact or leave the binary32 range (tiny,
    huge, subnormal, inf, NaN)."""
    g = torch.Generator().manual_seed(7)
    S = 1500
    parts = torch.randn(2, S, 2, generator=g)
    mag = torch.exp2(torch.randint(-140, 120, (2, S, 2), generator=g).float())
    wild = torch.rand(2, S, 2, generator=g) < 0.2
    parts = torch.where(wild, parts * mag, parts)
    parts[0, :4, 0] = torch.tensor([float("inf"), float("nan"), 0.0, -0.0])
    z = torch.view_as_complex(parts[0].contiguous()).reshape(3, 500)
    w = torch.view_as_complex(parts[1, :500].contiguous()).conj()  # broadcast over rows
    assert cplx._mul_kernel(_ctx(9, mode), z, w) is not None  # the kernel path is taken
    _same_as_tensor_implementation(lambda ctx: cplx.mul(ctx, z, w), mode, (3, 500),
                                   monkeypatch)


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "down"])
def test_polar_kernel_equals_the_tensor_implementation(mode, monkeypatch):
    """``polar`` of binary32 tensors of one shape goes through ``pointwise.polar32``:
    bit for bit the tensor implementation's values and stream position, on a transposed
    (non-contiguous) angle, more elements than a rounding tile, magnitudes that leave
    the binary32 range in the products, zeros, inf and NaN."""
    g = torch.Generator().manual_seed(3)
    r = torch.randn(40, 30, generator=g) * torch.exp2(
        torch.randint(-130, 100, (40, 30), generator=g).float())
    r[0, :3] = torch.tensor([0.0, float("inf"), float("nan")])
    theta = (torch.randn(30, 40, generator=g) * 4).mT  # (40, 30), not contiguous
    theta[1, :2] = torch.tensor([0.0, float("nan")])
    calls = []
    kernel = cplx.PW.polar32
    monkeypatch.setattr(cplx.PW, "polar32", lambda *a: calls.append(1) or kernel(*a))
    _same_as_tensor_implementation(lambda ctx: cplx.polar(ctx, r, theta), mode, (40, 30),
                                   monkeypatch)
    assert calls == [1]  # the kernel path was taken (the reference run does not call it)


def test_complex_div_smith_accuracy():
    """Smith's algorithm (module docstring of cplx), ieee: each part within
    |q_part − exact| ≤ 8u·|q| (Higham §3.6: Smith's method has a normwise relative error
    of a few units; 8u covers the 5 to 6 roundings on each path), checked with Fractions.
    Also both branches (|wr| ≥ |wi| and <) and the zero divisor."""
    z = torch.complex(_rand(40, seed=5), _rand(40, seed=6))
    w = torch.complex(_rand(40, seed=7), _rand(40, seed=8) * 3)
    q = cplx.div(_ctx(0, "ieee"), z, w)
    for k in range(40):
        a, b = Fraction(z.real[k].item()), Fraction(z.imag[k].item())
        c, d = Fraction(w.real[k].item()), Fraction(w.imag[k].item())
        den = c * c + d * d
        er, ei = (a * c + b * d) / den, (b * c - a * d) / den
        mag = math.sqrt(float(er * er + ei * ei))
        assert abs(Fraction(q.real[k].item()) - er) <= 8 * U32 * mag
        assert abs(Fraction(q.imag[k].item()) - ei) <= 8 * U32 * mag
    zero = cplx.div(_ctx(0, "ieee"), z[:1], torch.zeros(1, dtype=torch.complex64))
    assert torch.isinf(zero.real).all() or torch.isnan(zero.real).all()


# ------------------------------------------------- native dtype, perturbation, report
X = _rand(2, 16, seed=10)
Y = _rand(12, seed=11)
Z = torch.complex(_rand(2, 3, 8, seed=12), _rand(2, 3, 8, seed=13))
WIN = torch.hann_window(8)
OPS = {
    "rfft": (lambda: torch.fft.rfft(X), "aten._fft_r2c.default"),
    "fft_real": (lambda: torch.fft.fft(X, norm="ortho"), "aten._fft_r2c.default"),
    "fft_12": (lambda: torch.fft.fft(Y), "aten._fft_r2c.default"),
    "ifft": (lambda: torch.fft.ifft(Z), "aten._fft_c2c.default"),
    "fft2": (lambda: torch.fft.fft2(Z, norm="forward"), "aten._fft_c2c.default"),
    "fftn_dims": (lambda: torch.fft.fftn(Z, dim=(0, 2)), "aten._fft_c2c.default"),
    "irfft": (lambda: torch.fft.irfft(Z), "aten._fft_c2r.default"),
    "irfft_odd": (lambda: torch.fft.irfft(Z, n=9, norm="ortho"), "aten._fft_c2r.default"),
    "irfftn": (lambda: torch.fft.irfftn(Z, s=(3, 6)), "aten._fft_c2r.default"),
    "rfft2": (lambda: torch.fft.rfft2(_rand(2, 4, 6, seed=14)), "aten._fft_r2c.default"),
    "stft": (lambda: torch.stft(X[0], 8, hop_length=4, window=WIN, return_complex=True),
             "aten._fft_r2c.default"),
    "polar": (lambda: torch.polar(X.abs(), X), "aten.polar.default"),
    "complex_mul": (lambda: Z * Z.conj().flip(-1), "aten.mul.Tensor"),
    "complex_div": (lambda: Z / (Z + 2), "aten.div.Tensor"),
    "complex_abs": (lambda: Z.abs(), "aten.abs.default"),
    "complex_sum": (lambda: Z.sum(-1), "aten.sum.dim_IntList"),
    "complex_matmul": (lambda: Z @ Z.mT, "aten.bmm.default"),
    "eigvals": (lambda: torch.linalg.eigvals(_rand(2, 3, 3, seed=15)), "aten.linalg_eig.default"),
}


@pytest.mark.parametrize("gran", ["flop", "op"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_native_dtype_and_perturbation(name, gran):
    """The native dtype (complex64 stays complex64: on main these return complex128);
    same seed bitwise equal, two seeds differ (on main: unperturbed); the aten op listed
    as instrumented, never native or exact."""
    f, op = OPS[name]
    ref = f()
    outs = []
    for seed in (0, 0, 1):
        with fuzzy(mode="sr", granularity=gran, seed=seed) as fz:
            outs.append(f())
    assert outs[0].dtype == ref.dtype and outs[0].shape == ref.shape
    assert same(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    rep = fz.report()
    assert op in rep.instrumented and op not in rep.exact and not rep.native


def test_report_flop_level_fft():
    """At flop granularity the FFTs and complex arithmetic are flop-level handlers, not
    'rounded once'; at op granularity they are rounded once."""
    with fuzzy(mode="sr", seed=0) as fz:
        torch.fft.irfft(torch.fft.rfft(X) * torch.fft.rfft(X.flip(-1)), n=16)
    how = fz.report().how
    for op in ("aten._fft_r2c.default", "aten._fft_c2r.default"):
        assert how[op] == "flop (radix-2 FFT / direct DFT / Bluestein)"
    assert how["aten.mul.Tensor"] == "elementwise"
    with fuzzy(mode="sr", granularity="op", seed=0) as fz:
        torch.fft.rfft(X)
    assert fz.report().how["aten._fft_r2c.default"] == "rounded once (op)"


def test_complex_exact_and_polar():
    """torch.complex assembles parts: exact, never perturbed (also under UD); polar at
    flop granularity is RND(r·RND(cos θ)), RND(r·RND(sin θ))."""
    with fuzzy(mode="ud", seed=3) as fz:
        c = torch.complex(X, X.flip(-1))
    assert torch.equal(c, torch.complex(X, X.flip(-1)))
    assert "aten.complex.default" in fz.report().exact
    with fuzzy(mode="ieee") as fz:
        p = torch.polar(X.abs(), X)
    x64 = X.double()
    want = (X.abs() * torch.cos(x64).float(), X.abs() * torch.sin(x64).float())
    assert torch.equal(p.real, want[0]) and torch.equal(p.imag, want[1])


# ------------------------------------------------------- ieee accuracy (derived)
MU = U32  # twiddle error |ŵ − w|: each part rounded to nearest from float64: ≤ u/√2 < u
ETA = MU + _gamma(4) * (math.sqrt(2) + MU)  # Higham (24.5)


def _rel_bound(n: int) -> float:
    """Relative 2-norm error bound of one length-n transform as implemented: Higham
    Thm 24.2 for radix-2 (log2 n stages, each within η), and for the direct DFT the dot
    products of length 2n: |Δy_k| ≤ (γ_2n + 2μ)·2‖x‖₁ ≤ (γ_2n + 2μ)·2√n‖x‖₂ per
    element, ‖y‖₂ = √n‖x‖₂, so ‖Δy‖₂/‖y‖₂ ≤ 2√n(γ_2n + 2μ)."""
    if isinstance(n, str):
        # Bluestein of length n: 2 chirp products, 2 radix-2 transforms of length M and
        # a product by B̂. The intermediate norms exceed ‖X‖ by M·max|B̂|/√n ≈ √2
        # (|B̂_k| ≈ √(2n)/M for a chirp of 2n − 1 unit entries): factor 2.
        n = int(n[len("bluestein"):])
        M = 1 << (2 * n - 2).bit_length()
        cm = math.sqrt(2) * _gamma(2) + 2 * MU  # one complex product with a rounded factor
        return 2 * (2 * _rel_bound(M) + 3 * cm)
    if n <= 1:
        return 0.0
    if FT.is_pow2(n):
        t = int(math.log2(n))
        return t * ETA / (1 - t * ETA)
    return 2 * math.sqrt(n) * (_gamma(2 * n) + 2 * MU)


ACC = [
    ("rfft", lambda x: torch.fft.rfft(x), (16,), [16], 0),
    ("rfft_ortho", lambda x: torch.fft.rfft(x, norm="ortho"), (16,), [16], 1),
    ("fft_12", lambda x: torch.fft.fft(x.to(torch.complex64)), (12,), [12], 0),
    ("fft_100", lambda x: torch.fft.fft(x.to(torch.complex64)), (100,), ["bluestein100"], 0),
    ("ifft_32", lambda x: torch.fft.ifft(x.to(torch.complex64)), (32,), [32], 1),
    ("irfft_16", lambda x: torch.fft.irfft(torch.fft.rfft(x)), (16,), [16, 16], 2),
    ("irfft_9", lambda x: torch.fft.irfft(torch.fft.rfft(x), n=9), (9,), [9, 9], 2),
    ("fftn_8x6", lambda x: torch.fft.fftn(x.to(torch.complex64), norm="forward"), (8, 6), [8, 6], 1),
    ("rfft2_4x6", lambda x: torch.fft.rfft2(x), (4, 6), [4, 6], 0),
]


@pytest.mark.parametrize("name,f,shape,lengths,roundings", ACC, ids=[a[0] for a in ACC])
def test_ieee_within_derived_bound(name, f, shape, lengths, roundings):
    """ieee at flop granularity vs the float64 transform of the same input: relative
    2-norm error per batch row within Σ over the transformed lengths of the one-transform
    bounds, plus u per normalisation rounding (first order; ×1.1 for the products of
    small terms). Native pocketfft lies within the same bound."""
    x = _rand(4, *shape, seed=21)
    with fuzzy(mode="ieee") as fz:
        y = f(x)
    assert not fz.report().native
    ref = f(x.double())
    nat = f(x)
    assert y.dtype == nat.dtype and y.shape == nat.shape
    bound = 1.1 * (sum(_rel_bound(n) for n in lengths) + roundings * U32)
    dims = tuple(range(1, y.dim()))
    err = torch.linalg.vector_norm((y.to(ref.dtype) - ref), dim=dims)
    scale = torch.linalg.vector_norm(ref, dim=dims)
    assert (err <= bound * scale).all(), (err / scale).max().item()
    nerr = torch.linalg.vector_norm((nat.to(ref.dtype) - ref), dim=dims)
    assert (nerr <= bound * scale).all()


def test_backward_through_rfft():
    """A spectral loss's gradient (reaches _fft_c2c, complex mul, abs, sgn in the mode)
    under ieee equals native within 1e-5 relative; SR seeds differ."""
    grads = []
    for mode, seed in (("native", 0), ("ieee", 0), ("sr", 1), ("sr", 2)):
        x = X.clone().requires_grad_()
        if mode == "native":
            torch.fft.rfft(x).abs().pow(2).sum().backward()
        else:
            with fuzzy(mode=mode, seed=seed) as fz:
                torch.fft.rfft(x).abs().pow(2).sum().backward()
            assert not fz.report().native
        grads.append(x.grad)
    assert torch.allclose(grads[1], grads[0], rtol=1e-5, atol=1e-5 * grads[0].abs().max().item())
    assert not torch.equal(grads[2], grads[3])


def test_twiddles_and_bit_reverse():
    """Twiddles are float64 cos/sin rounded once; bit reversal is a permutation."""
    c, s = FT.twiddles(12, -1, torch.float32)
    ang = [-2 * math.pi * j / 12 for j in range(12)]
    assert c.tolist() == [float(np.float32(math.cos(a))) for a in ang]
    assert s.tolist() == [float(np.float32(math.sin(a))) for a in ang]
    assert sorted(FT.bit_reverse(16)) == list(range(16)) and FT.bit_reverse(8)[1] == 4


def _overlap_add_reference(g: np.ndarray, L: int, size: int, step: int, sr: ScalarRounding):
    """unfold_backward of (B, nwin, size) windows along a length-L axis, element by element:
    position p sums its covering windows in increasing order; one key per overlap rank."""
    B, nwin, _ = g.shape
    cover = [[w for w in range(nwin) if w * step <= p < w * step + size] for p in range(L)]
    out = np.zeros((B, L), g.dtype)
    for b in range(B):
        for p in range(L):
            if cover[p]:
                out[b, p] = g[b, cover[p][0], p - cover[p][0] * step]
    for r in range(1, max(len(c) for c in cover)):
        key = sr.key()
        for b in range(B):
            for p in range(L):
                if r < len(cover[p]):
                    w = cover[p][r]
                    out[b, p] = sr.add(out[b, p], g[b, w, p - w * step], key, b * L + p)
    return out


@pytest.mark.parametrize("L,size,step", [(10, 4, 2), (11, 4, 1), (9, 3, 3), (7, 2, 3)])
def test_overlap_add_matches_reference(L, size, step):
    """aten.unfold_backward (istft's overlap-add) at flop granularity, bit for bit."""
    from numvar.instrument import flop

    x = _rand(2, L, seed=L)
    g = _rand(*x.unfold(1, size, step).shape, seed=L + 1)
    out = flop.unfold_backward(g, [2, L], 1, size, step, _ctx(4))
    ref = _overlap_add_reference(g.numpy(), L, size, step, ScalarRounding(4, "sr", torch.float32))
    assert same(out, torch.from_numpy(ref))


def test_istft_flop_level():
    """istft round trip: every piece flop-level (no 'rounded once'), ieee close to native."""
    S = torch.stft(X[0], 8, hop_length=2, window=WIN, return_complex=True)
    ref = torch.istft(S, 8, hop_length=2, window=WIN)
    with fuzzy(mode="ieee") as fz:
        y = torch.istft(S, 8, hop_length=2, window=WIN)
    rep = fz.report()
    assert rep.how["aten.unfold_backward.default"] == "flop" and not rep.native
    assert not [k for k, h in rep.how.items() if h == "rounded once (no flop handler)"]
    assert y.dtype == ref.dtype and torch.allclose(y, ref, atol=1e-6)
