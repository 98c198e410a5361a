"""Discrete Fourier transforms at ``flop`` granularity: every butterfly add and multiply
rounded.

The algorithm (not pocketfft's, as numvar's matmul need not follow MKL's order):

* **length n a power of two**: iterative radix-2 decimation-in-time Cooley–Tukey. The
  input is permuted to bit-reversed order (exact); then for each stage m = 2, 4, ..., n
  (half-size h = m/2) and each block of m elements, with ``u`` the first and ``v`` the
  second half of the block and twiddle ``w_k = exp(∓2πi·k/m)``:

  - ``t_k = w_k · v_k`` for k = 1..h−1 (``t_0 = v_0``: no multiplication by 1), as 4
    rounded products and 2 rounded additions (:func:`numvar.instrument.cplx.mul_parts`:
    one call for the products of the whole stage, one for the additions);
  - ``u_k + t_k`` and ``u_k − t_k``, real and imaginary parts: one call of 4 rounded
    additions per butterfly for the whole stage (stacked ``ur+tr, ui+ti, ur−tr, ui−ti``).

  Cost: ``(n/2)·log2 n`` butterflies, 3 vectorised rounding calls per stage.
* **other lengths n ≤ DIRECT_MAX (64)**: the direct DFT ``X_k = Σ_j x_j·w^{jk}`` as one
  real flop-level matrix product (:func:`numvar.instrument.flop.bmm`) of the interleaved
  input ``(xr_0, xi_0, xr_1, xi_1, ...)`` with the real 2n×2n matrix of the twiddles:
  each output part is the sum of its 2n products in the order j = 0..n−1, real part of
  x before imaginary, accumulated left to right, every product and add rounded. Cost
  ``4n²`` products and adds per transform.
* **other lengths n > DIRECT_MAX**: Bluestein's chirp-z algorithm, with
  ``jk = (j² + k² − (k−j)²)/2``: ``a_j = x_j·c_j`` (chirp ``c_j = exp(∓πi·j²/n)``; one
  complex multiplication each), zero padded to M, the smallest power of two ≥ 2n − 1;
  ``A = FFT_M(a)`` (radix-2 above, forward); ``C = A·B̂`` (complex multiplications) with
  ``B̂ = FFT_M(b)/M`` of the conjugate chirp ``b`` (a constant of the algorithm: computed
  in float64 and rounded to nearest once, as the twiddles); ``y = FFT_M⁻¹(C)``
  (radix-2, unnormalised: the 1/M is inside B̂); ``X_k = y_k·c_k`` (complex
  multiplications) for k < n. Cost: two radix-2 transforms of length M and 2n + M
  complex multiplications,
  O(n log n) (a direct DFT of n = 1000 is 4·10⁶ rounded operations per transform).

Twiddles ``w^j = exp(∓2πi·j/n)`` are computed in float64 (the angle from the exact
integer j·k mod n) and rounded to nearest in the format once: they are constants of the
algorithm, as the tables of an FFT library, not results of the user's arithmetic.

The aten ops, in terms of the 1-D transform along the last axis (:func:`c2c`):

* ``_fft_c2c(x, dim, normalization, forward)``: the 1-D transform along each dim in the
  order listed (sign −1 when ``forward``, +1 otherwise);
* ``_fft_r2c(x, dim, normalization, onesided)``: the c2c forward transform of ``x + 0i``
  (the zero imaginary parts make exact operations, which SR, ieee and random leave
  untouched), keeping the first ``n//2 + 1`` bins of the last listed dim when
  ``onesided``;
* ``_fft_c2r(x, dim, normalization, last_dim_size)``: the inverse c2c transform along
  every dim but the last listed one, then the Hermitian extension of the last one to
  ``n = last_dim_size`` bins (``X_{n−k} = conj X_k``, the imaginary parts of ``X_0`` and,
  n even, ``X_{n/2}`` set to 0 as pocketfft ignores them: exact), its inverse transform,
  and the real part.

Normalization (``0`` none, ``1`` by 1/√N, ``2`` by 1/N, N the product of the transformed
lengths): one rounded multiplication of each real and imaginary part by the factor
(a Python float, rounded to the format as ``torch.tensor`` does) at the end.

Every batch of transforms is one set of vectorised calls over the batch (torch tensor
ops per stage, each rounding through numvar's core). Binary32 at 24 bits on the CPU
(numba backend), the radix-2 stages run in one compiled call
(:func:`numvar.instrument.fft_kernels.radix2_32`: the same keys, element indices and
arithmetic); with :data:`USE_KERNELS` false they take the tensor implementation (the
kernel's reference in the tests). ``_fft_r2c`` and ``_fft_c2r`` along the last dim of a
power-of-two length then skip the complex intermediates around that call: the rows go
to the kernel as arrays, the Hermitian extension and the interleaving of the result are
compiled copies (:func:`numvar.instrument.fft_kernels.hermitian32`, ``interleave32``).
:func:`c2c_reference` is the slow reference (plain Python loops, same order, same random
bits), compared bit for bit in the tests.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from . import cplx
from . import flop
from . import linalg_kernels as LK
from ._core import Ctx
from .fft_kernels import hermitian32, interleave32, radix2_32, stage_twiddles32

#: binary32 radix-2 stages in the compiled kernel (False: the tensor implementation)
USE_KERNELS = True

NORM_NONE, NORM_ROOT_N, NORM_N = 0, 1, 2
#: longest non-power-of-two length transformed by the direct DFT (longer: Bluestein)
DIRECT_MAX = 64


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def bit_reverse(n: int) -> list[int]:
    """The bit-reversal permutation of range(n), n a power of two."""
    bits = n.bit_length() - 1
    return [int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(n)]


def twiddles(n: int, sign: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of ``sign·2π·j/n`` for j in 0..n−1, computed in float64 and rounded to
    nearest in ``dtype`` once."""
    j = torch.arange(n, dtype=torch.float64)
    ang = (sign * 2.0 * math.pi / n) * j
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


@functools.lru_cache(maxsize=64)
def _twiddles32(n: int, sign: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`twiddles` in binary32 as arrays, kept per (n, sign) (only read)."""
    cw, sw = twiddles(n, sign, torch.float32)
    return cw.numpy(), sw.numpy()


#: largest B·n whose stage twiddles (:func:`stage_twiddles32`, about 24·B·n bytes) are
#: kept between calls (:func:`_stage_twiddles`); larger transforms build them per call
#: (26 µs for 32 rows of 256: 6 % of the transform's own time)
STAGE_TWIDDLES_KEEP = 1 << 16


@functools.lru_cache(maxsize=16)
def _kept_stage_twiddles(n: int, sign: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    return stage_twiddles32(*_twiddles32(n, sign), B, n)


def _stage_twiddles(n: int, sign: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    """The twiddles of :func:`radix2_32`'s products for B rows of length n (only read)."""
    if B * n <= STAGE_TWIDDLES_KEEP:
        return _kept_stage_twiddles(n, sign, B)
    return stage_twiddles32(*_twiddles32(n, sign), B, n)


@functools.lru_cache(maxsize=64)
def _stage_flags(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per radix-2 stage of length n: whether it has twiddle products (h = 2^s > 1), and
    all set (its butterflies)."""
    stages = n.bit_length() - 1
    return 2 ** np.arange(stages) > 1, np.ones(stages, bool)


def _radix2_flat(ctx: Ctx, re: np.ndarray, im: np.ndarray, B: int, n: int, sign: int,
                 real_in: bool = False, real_out: bool = False, scale: float = 1.0):
    """:func:`radix2_32` on B rows of (B·n,) float32 parts, with the keys the tensor
    implementation draws (products and their sums where h > 1, then the butterflies,
    stage by stage): the transformed (re, im) arrays. ``real_in``: ``im`` is all +0;
    ``real_out``: only the real parts are wanted (the imaginary ones come back empty);
    ``scale`` (with ``real_out``, other than 1): the real parts multiplied by it, as
    ``ctx.mul(out, scale)`` after the transform would (its key drawn next, the scale
    rounded to binary32 as that call rounds a Python float)."""
    h1, every = _stage_flags(n)
    kp, ka, kb = LK.keys(ctx, h1, h1, every)
    twr, twi = _stage_twiddles(n, sign, B)
    ks = ctx.stream.next_key() if scale != 1.0 else 0
    return radix2_32(re, im, B, n, twr, twi, kp, ka, kb, ctx.code, real_in, real_out,
                     np.float32(scale), np.uint64(ks))


def _radix2(ctx: Ctx, re: torch.Tensor, im: torch.Tensor, sign: int):
    """Radix-2 DIT on the last axis of (B, n) parts (module docstring)."""
    B, n = re.shape
    if USE_KERNELS and LK.serves(ctx, re, im):
        xr, xi = _radix2_flat(ctx, LK.flat32(re), LK.flat32(im), B, n, sign)
        return torch.from_numpy(xr).view(B, n), torch.from_numpy(xi).view(B, n)
    perm = torch.tensor(bit_reverse(n), dtype=torch.long, device=re.device)
    re, im = re[:, perm], im[:, perm]
    cw, sw = twiddles(n, sign, re.dtype)
    m = 2
    while m <= n:
        h = m // 2
        blocks = re.reshape(B, n // m, 2, h), im.reshape(B, n // m, 2, h)
        ur, vr = blocks[0][:, :, 0], blocks[0][:, :, 1]
        ui, vi = blocks[1][:, :, 0], blocks[1][:, :, 1]
        if h > 1:
            idx = torch.arange(1, h, device=re.device) * (n // m)
            wr, wi = cw[idx], sw[idx]
            pr, pi = cplx.mul_parts(ctx, vr[..., 1:], vi[..., 1:], wr, wi)
            tr = torch.cat((vr[..., :1], pr), -1)
            ti = torch.cat((vi[..., :1], pi), -1)
        else:
            tr, ti = vr, vi
        o = ctx.add(torch.stack((ur, ui, ur, ui)), torch.stack((tr, ti, -tr, -ti)))
        re = torch.stack((o[0], o[2]), 2).reshape(B, n)
        im = torch.stack((o[1], o[3]), 2).reshape(B, n)
        m *= 2
    return re, im


def dft_matrix(n: int, sign: int, dtype: torch.dtype) -> torch.Tensor:
    """The real (2n, 2n) matrix of the direct DFT on interleaved parts:
    rows (xr_j, xi_j), columns (Xr_k, Xi_k); ``w^{jk}`` from the exact ``jk mod n``."""
    jk = (torch.arange(n).unsqueeze(1) * torch.arange(n).unsqueeze(0)) % n
    cw, sw = twiddles(n, sign, dtype)
    c, s = cw[jk], sw[jk]
    W = torch.empty(2 * n, 2 * n, dtype=dtype)
    W[0::2, 0::2] = c
    W[1::2, 0::2] = -s
    W[0::2, 1::2] = s
    W[1::2, 1::2] = c
    return W


def _direct(ctx: Ctx, re: torch.Tensor, im: torch.Tensor, sign: int):
    B, n = re.shape
    x = torch.stack((re, im), -1).reshape(1, B, 2 * n)
    out = flop.bmm(x, dft_matrix(n, sign, re.dtype).unsqueeze(0), ctx)
    out = out.reshape(B, n, 2)
    return out[..., 0], out[..., 1]


def chirp(n: int, sign: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of ``sign·π·(j² mod 2n)/n`` for j in 0..n−1 (float64, rounded once)."""
    j = torch.arange(n, dtype=torch.int64)
    ang = (sign * math.pi / n) * ((j * j) % (2 * n)).to(torch.float64)
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def bluestein_kernel(n: int, sign: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, (re, im) of B̂ = FFT_M(b)/M) for Bluestein's convolution, b the conjugate
    chirp wrapped around (b_m = b_{M−m}); computed in float64, rounded once to ``dtype``."""
    M = 1 << (2 * n - 2).bit_length()
    j = torch.arange(n, dtype=torch.int64)
    ang = (-sign * math.pi / n) * ((j * j) % (2 * n)).to(torch.float64)
    b = torch.zeros(M, dtype=torch.complex128)
    b[:n] = torch.polar(torch.ones(n, dtype=torch.float64), ang)
    b[M - n + 1:] = b[1:n].flip(0)
    bh = torch.fft.fft(b) / M
    return M, (bh.real.to(dtype), bh.imag.to(dtype))


def _bluestein(ctx: Ctx, re: torch.Tensor, im: torch.Tensor, sign: int):
    B, n = re.shape
    cr, ci = chirp(n, sign, re.dtype)
    M, (kr, ki) = bluestein_kernel(n, sign, re.dtype)
    ar, ai = cplx.mul_parts(ctx, re, im, cr, ci)
    pad = (0, M - n)
    ar, ai = torch.nn.functional.pad(ar, pad), torch.nn.functional.pad(ai, pad)
    Ar, Ai = _radix2(ctx, ar, ai, -1)
    Cr, Ci = cplx.mul_parts(ctx, Ar, Ai, kr, ki)
    cr2, ci2 = _radix2(ctx, Cr, Ci, 1)
    return cplx.mul_parts(ctx, cr2[:, :n], ci2[:, :n], cr, ci)


def c2c_parts(ctx: Ctx, re: torch.Tensor, im: torch.Tensor, sign: int):
    """The unnormalised 1-D DFT with ``w = exp(sign·2πi/n)`` of (B, n) parts along the
    last axis: radix-2 for powers of two, the direct DFT up to :data:`DIRECT_MAX`,
    Bluestein above."""
    n = re.shape[-1]
    if n <= 1:
        return re.clone(), im.clone()
    if is_pow2(n):
        return _radix2(ctx, re, im, sign)
    if n <= DIRECT_MAX:
        return _direct(ctx, re, im, sign)
    return _bluestein(ctx, re, im, sign)


def _along(ctx: Ctx, z: torch.Tensor, d: int, sign: int) -> torch.Tensor:
    """The 1-D transform of complex ``z`` along dim ``d``."""
    zm = z.movedim(d, -1)
    shape = zm.shape
    n = shape[-1]
    zm = zm.reshape(-1, n)
    re, im = c2c_parts(ctx, zm.real.contiguous(), zm.imag.contiguous(), sign)
    out = cplx.join(re, im).reshape(shape)
    return out.movedim(-1, d)


def _normalize(ctx: Ctx, z: torch.Tensor, normalization: int, count: int) -> torch.Tensor:
    if normalization == NORM_NONE or count <= 1 and normalization in (NORM_ROOT_N, NORM_N):
        return z
    if normalization == NORM_ROOT_N:
        f = 1.0 / math.sqrt(count)
    elif normalization == NORM_N:
        f = 1.0 / count
    else:
        raise ValueError(f"unknown FFT normalization {normalization!r}")
    return torch.view_as_complex(ctx.mul(torch.view_as_real(z), f).contiguous())


def _dims(x: torch.Tensor, dim) -> list[int]:
    return [int(d) % x.dim() for d in dim]


def fft_c2c(ctx: Ctx, x: torch.Tensor, dim, normalization: int, forward: bool) -> torch.Tensor:
    """``aten._fft_c2c`` at flop granularity."""
    z = x.resolve_conj().resolve_neg()
    dims = _dims(z, dim)
    sign = -1 if forward else 1
    for d in dims:
        z = _along(ctx, z, d, sign)
    return _normalize(ctx, z, normalization, math.prod(x.shape[d] for d in dims))


def _last_dim_kernel(x: torch.Tensor, dims: list[int], n: int) -> bool:
    """The short paths of :func:`fft_r2c` and :func:`fft_c2r` apply: one transformed dim,
    the last, of a power-of-two length n >= 2, with the compiled kernels on."""
    return USE_KERNELS and len(dims) == 1 and dims[0] == x.dim() - 1 and n >= 2 and is_pow2(n)


def _r2c_last(ctx: Ctx, x: torch.Tensor, n: int, normalization: int,
              onesided: bool) -> torch.Tensor:
    """:func:`fft_r2c` of binary32 x along its last dim straight through :func:`radix2_32`:
    x's rows as the real parts and +0 as the imaginary ones, the bins kept written
    as complex64 by :func:`interleave32`. The same keys, element indices and values as
    the general path, without its complex intermediates (joins, part copies, the
    narrowed copy). A normalisation rounds every bin of the full transform (its element
    indices are those of the (…, n) result), and the bins are narrowed after it."""
    B = x.numel() // n
    xr, xi = _radix2_flat(ctx, LK.flat32(x), np.empty(0, np.float32), B, n, -1,
                          real_in=True)  # (imaginary parts +0: not read)
    half = n // 2 + 1 if onesided else n
    keep = half if normalization == NORM_NONE else n
    pairs = torch.from_numpy(interleave32(xr, xi, B, n, keep))
    z = torch.view_as_complex(pairs.view(*x.shape[:-1], keep, 2))
    z = _normalize(ctx, z, normalization, n)
    return z if keep == half else z.narrow(-1, 0, half).contiguous()


def _c2r_last(ctx: Ctx, z: torch.Tensor, n: int, normalization: int) -> torch.Tensor:
    """:func:`fft_c2r` of complex64 z along its last dim: the Hermitian extension by
    :func:`hermitian32`, :func:`radix2_32`, the real parts, normalised as they are
    written back (same values, keys and element indices as the general path's transform
    and ``ctx.mul``)."""
    m = z.shape[-1]
    B = z.numel() // m
    fr, fi = hermitian32(LK.flat32(torch.view_as_real(z)), B, m, n)
    scale = (1.0 if normalization == NORM_NONE
             else 1.0 / math.sqrt(n) if normalization == NORM_ROOT_N else 1.0 / n)
    xr, _ = _radix2_flat(ctx, fr, fi, B, n, 1, real_out=True, scale=scale)
    return torch.from_numpy(xr).view(*z.shape[:-1], n)


def fft_r2c(ctx: Ctx, x: torch.Tensor, dim, normalization: int, onesided: bool) -> torch.Tensor:
    """``aten._fft_r2c`` at flop granularity."""
    dims = _dims(x, dim)
    if _last_dim_kernel(x, dims, x.shape[dims[-1]] if dims else 0) and LK.serves(ctx, x):
        return _r2c_last(ctx, x, x.shape[-1], normalization, onesided)
    cd = torch.complex128 if x.dtype == torch.float64 else torch.complex64
    z = cplx.join(x.to(cplx.PART[cd]), torch.zeros((), dtype=cplx.PART[cd]))
    out = fft_c2c(ctx, z, dims, normalization, True)
    if onesided:
        last = dims[-1]
        out = out.narrow(last, 0, x.shape[last] // 2 + 1).contiguous()
    return out


def fft_c2r(ctx: Ctx, x: torch.Tensor, dim, normalization: int, last_dim_size: int) -> torch.Tensor:
    """``aten._fft_c2r`` at flop granularity."""
    z = x.resolve_conj().resolve_neg()
    dims = _dims(z, dim)
    n = int(last_dim_size)
    if (_last_dim_kernel(z, dims, n) and z.dtype is torch.complex64
            and LK.serves(ctx, torch.view_as_real(z))):
        return _c2r_last(ctx, z, n, normalization)
    for d in dims[:-1]:
        z = _along(ctx, z, d, 1)
    last = dims[-1]
    half = z.movedim(last, -1)[..., : n // 2 + 1]
    if half.shape[-1] < n // 2 + 1:  # fewer input bins: zero padded (exact)
        half = torch.nn.functional.pad(half, (0, n // 2 + 1 - half.shape[-1]))
    re, im = half.real.clone(), half.imag.clone()
    im[..., 0] = 0
    if n % 2 == 0:
        im[..., n // 2] = 0
    k = torch.arange(n // 2 + 1, n, device=z.device)
    full_re = torch.cat((re, re[..., n - k]), -1)
    full_im = torch.cat((im, -im[..., n - k]), -1)
    shape = full_re.shape
    fr, _ = c2c_parts(ctx, full_re.reshape(-1, n).contiguous(),
                      full_im.reshape(-1, n).contiguous(), 1)
    out = fr.reshape(shape).movedim(-1, last)
    count = math.prod(z.shape[d] for d in dims[:-1]) * n
    if normalization == NORM_NONE or count <= 1:
        return out.contiguous()
    f = 1.0 / math.sqrt(count) if normalization == NORM_ROOT_N else 1.0 / count
    return ctx.mul(out.contiguous(), f)


# --------------------------------------------------------------------------- reference
def c2c_reference(re: np.ndarray, im: np.ndarray, sign: int, keys, mode: int, t: int):
    """Slow reference of :func:`c2c_parts` on (B, n) float32/float64 arrays: plain Python
    loops in the same order, each rounding by the core's scalar functions with the bits
    of the same call key and element index. ``keys`` yields the call keys in order (the
    ones ``ctx.stream`` would give). The direct DFT's contraction is checked through
    the kernel's own reference (``kernels.contract_reference``)."""
    from numvar.rounding import kernels as RK

    from . import kernels as KN

    is32 = re.dtype == np.float32
    add = RK.add_f32 if is32 else RK.add_f64
    mul = RK.mul_f32 if is32 else RK.mul_f64
    ft = np.float32 if is32 else np.float64
    dtype = torch.float32 if is32 else torch.float64
    B, n = re.shape

    def r(key, j):
        return np.uint64(RK.bits64(np.uint64(key), np.uint64(j)))

    def cmul(xr, xi, wr, wi):
        """mul_parts on (B, L) arrays and (L,) or (B, L) factors, element by element."""
        L = xr.shape[1]
        wr, wi = np.broadcast_to(wr, (B, L)), np.broadcast_to(wi, (B, L))
        kp, ka = next(keys), next(keys)
        size = B * L
        outr, outi = np.empty((B, L), ft), np.empty((B, L), ft)
        for b in range(B):
            for j in range(L):
                e = b * L + j
                p0 = mul(xr[b, j], wr[b, j], mode, t, r(kp, e))
                p1 = mul(xi[b, j], wi[b, j], mode, t, r(kp, size + e))
                p2 = mul(xr[b, j], wi[b, j], mode, t, r(kp, 2 * size + e))
                p3 = mul(xi[b, j], wr[b, j], mode, t, r(kp, 3 * size + e))
                outr[b, j] = add(p0, -p1, mode, t, r(ka, e))
                outi[b, j] = add(p2, p3, mode, t, r(ka, size + e))
        return outr, outi

    if n <= 1:
        return re.copy(), im.copy()
    if not is_pow2(n) and n > DIRECT_MAX:
        cr, ci = (a.numpy() for a in chirp(n, sign, dtype))
        M, (kr, ki) = bluestein_kernel(n, sign, dtype)
        ar, ai = cmul(re, im, cr, ci)
        ar = np.concatenate((ar, np.zeros((B, M - n), ft)), 1)
        ai = np.concatenate((ai, np.zeros((B, M - n), ft)), 1)
        Ar, Ai = c2c_reference(ar, ai, -1, keys, mode, t)
        Cr, Ci = cmul(Ar, Ai, kr.numpy(), ki.numpy())
        c2r_, c2i_ = c2c_reference(Cr, Ci, 1, keys, mode, t)
        return cmul(c2r_[:, :n], c2i_[:, :n], cr, ci)
    if not is_pow2(n):
        x = np.empty((1, B, 2 * n), dtype=ft)
        for b in range(B):
            for j in range(n):
                x[0, b, 2 * j], x[0, b, 2 * j + 1] = re[b, j], im[b, j]
        W = dft_matrix(n, sign, dtype).numpy()[None]
        out = KN.contract_reference(x, W, next(keys), mode, t)[0]
        return out[:, 0::2].copy(), out[:, 1::2].copy()

    cw, sw = (a.numpy() for a in twiddles(n, sign, dtype))
    perm = bit_reverse(n)
    xr = [[re[b, perm[i]] for i in range(n)] for b in range(B)]
    xi = [[im[b, perm[i]] for i in range(n)] for b in range(B)]
    m = 2
    while m <= n:
        h, nb = m // 2, n // m
        tr = [[[xr[b][blk * m + h + k] for k in range(h)] for blk in range(nb)] for b in range(B)]
        ti = [[[xi[b][blk * m + h + k] for k in range(h)] for blk in range(nb)] for b in range(B)]
        if h > 1:
            kp, ka = next(keys), next(keys)
            w = h - 1
            size = B * nb * w
            for b in range(B):
                for blk in range(nb):
                    for k in range(1, h):
                        e = (b * nb + blk) * w + (k - 1)
                        vr, vi = xr[b][blk * m + h + k], xi[b][blk * m + h + k]
                        wr, wi = cw[k * (n // m)], sw[k * (n // m)]
                        p0 = mul(vr, wr, mode, t, r(kp, e))
                        p1 = mul(vi, wi, mode, t, r(kp, size + e))
                        p2 = mul(vr, wi, mode, t, r(kp, 2 * size + e))
                        p3 = mul(vi, wr, mode, t, r(kp, 3 * size + e))
                        tr[b][blk][k] = add(p0, -p1, mode, t, r(ka, e))
                        ti[b][blk][k] = add(p2, p3, mode, t, r(ka, size + e))
        kb = next(keys)
        size = B * nb * h
        nr = [[0.0] * n for _ in range(B)]
        ni = [[0.0] * n for _ in range(B)]
        for b in range(B):
            for blk in range(nb):
                for k in range(h):
                    e = (b * nb + blk) * h + k
                    ur, ui = xr[b][blk * m + k], xi[b][blk * m + k]
                    a, c = tr[b][blk][k], ti[b][blk][k]
                    nr[b][blk * m + k] = add(ur, a, mode, t, r(kb, e))
                    ni[b][blk * m + k] = add(ui, c, mode, t, r(kb, size + e))
                    nr[b][blk * m + h + k] = add(ur, -a, mode, t, r(kb, 2 * size + e))
                    ni[b][blk * m + h + k] = add(ui, -c, mode, t, r(kb, 3 * size + e))
        xr, xi = nr, ni
        m *= 2
    return np.array(xr, dtype=ft), np.array(xi, dtype=ft)
