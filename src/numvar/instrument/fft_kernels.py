"""numba kernel of the binary32 radix-2 FFT at flop granularity
(:func:`numvar.instrument.fft._radix2`).

The tensor implementation makes three rounding calls per stage and some fifteen tensor
ops around them (bit reversal, stacks, concatenations): for the transforms of a model
(n = 256, a few dozen rows) the ops, not the arithmetic, took most of the time
(docs/speed.md). :func:`radix2_32` runs the same stages in one compiled call: the keys
the tensor implementation would draw (``kp``, ``ka`` for the twiddle products of a stage
with h > 1, ``kb`` for its butterflies) are drawn beforehand in the same order, and
every element is rounded by :func:`numvar.instrument.linalg_kernels.round_into` (the
tiles of ``pointwise.binary32``) with the same key and the same C-order index as in the
stacked tensor calls:

* products ``(vr·wr, vi·wi, vr·wi, vi·wr)`` at ``q·S + e``, ``S = B·(n/m)·(h−1)``,
  ``e = (b·n/m + blk)·(h−1) + k−1``; sums ``vr·wr + (−vi·wi)`` at ``e`` and
  ``vr·wi + vi·wr`` at ``S + e``;
* butterflies ``(ur + tr, ui + ti, ur + (−tr), ui + (−ti))`` at ``q·S₂ + e₂``,
  ``S₂ = B·(n/m)·h``, ``e₂ = (b·n/m + blk)·h + k``.

Hence the same bits for the same seed (tested against the tensor implementation and
:func:`numvar.instrument.fft.c2c_reference`). :func:`interleave32` and
:func:`hermitian32` are the exact copies around it for ``_fft_r2c`` and ``_fft_c2r``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from numvar.rounding import kernels as K

from .linalg_kernels import round_into



@njit(cache=True, error_model="numpy")
def radix2_32(re, im, B, n, cw, sw, kp, ka, kb, mode):  # pragma: no cover - compiled
    """Radix-2 DIT of the rows of re, im ((B·n,) float32, C order; n a power of two ≥ 2)
    with twiddles (cw, sw) (n,) float32; stage s (m = 2^(s+1)) uses keys kp[s], ka[s]
    (h > 1) and kb[s]. Returns the transformed (re, im)."""
    half = B * n // 2
    xr = np.empty(B * n, np.float32)
    xi = np.empty(B * n, np.float32)
    bits = 0
    while (1 << bits) < n:
        bits += 1
    for i in range(n):  # bit-reversal permutation (exact)
        rv = 0
        for t in range(bits):
            rv |= ((i >> t) & 1) << (bits - 1 - t)
        for b in range(B):
            xr[b * n + i] = re[b * n + rv]
            xi[b * n + i] = im[b * n + rv]
    vr = np.empty(half, np.float32)
    vi = np.empty(half, np.float32)
    wr = np.empty(half, np.float32)
    wi = np.empty(half, np.float32)
    p = np.empty(4 * half, np.float32)
    tr = np.empty(half, np.float32)
    ti = np.empty(half, np.float32)
    ur = np.empty(half, np.float32)
    ui = np.empty(half, np.float32)
    o = np.empty(4 * half, np.float32)
    m = 2
    s = 0
    while m <= n:
        h = m // 2
        nb = n // m
        stride = n // m
        if h > 1:
            S = B * nb * (h - 1)
            e = 0
            for b in range(B):
                for blk in range(nb):
                    base = b * n + blk * m + h
                    for k in range(1, h):
                        vr[e] = xr[base + k]
                        vi[e] = xi[base + k]
                        wr[e] = cw[k * stride]
                        wi[e] = sw[k * stride]
                        e += 1
            kps = np.uint64(kp[s])
            round_into(K.OP_MUL, vr[:S], wr[:S], p[0:S], kps, 0, mode)
            round_into(K.OP_MUL, vi[:S], wi[:S], p[S:2 * S], kps, S, mode)
            round_into(K.OP_MUL, vr[:S], wi[:S], p[2 * S:3 * S], kps, 2 * S, mode)
            round_into(K.OP_MUL, vi[:S], wr[:S], p[3 * S:4 * S], kps, 3 * S, mode)
            for e in range(S):
                vi[e] = -p[S + e]  # −vi·wi (exact)
            kas = np.uint64(ka[s])
            round_into(K.OP_ADD, p[0:S], vi[:S], vr[:S], kas, 0, mode)  # re of the product
            round_into(K.OP_ADD, p[2 * S:3 * S], p[3 * S:4 * S], wr[:S], kas, S, mode)  # im
        S2 = B * nb * h
        e = 0
        e1 = 0
        for b in range(B):
            for blk in range(nb):
                base = b * n + blk * m
                for k in range(h):
                    ur[e] = xr[base + k]
                    ui[e] = xi[base + k]
                    if k == 0:
                        tr[e] = xr[base + h]
                        ti[e] = xi[base + h]
                    else:
                        tr[e] = vr[e1]
                        ti[e] = wr[e1]
                        e1 += 1
                    e += 1
        kbs = np.uint64(kb[s])
        round_into(K.OP_ADD, ur[:S2], tr[:S2], o[0:S2], kbs, 0, mode)
        round_into(K.OP_ADD, ui[:S2], ti[:S2], o[S2:2 * S2], kbs, S2, mode)
        for e in range(S2):
            tr[e] = -tr[e]
            ti[e] = -ti[e]
        round_into(K.OP_ADD, ur[:S2], tr[:S2], o[2 * S2:3 * S2], kbs, 2 * S2, mode)
        round_into(K.OP_ADD, ui[:S2], ti[:S2], o[3 * S2:4 * S2], kbs, 3 * S2, mode)
        e = 0
        for b in range(B):
            for blk in range(nb):
                base = b * n + blk * m
                for k in range(h):
                    xr[base + k] = o[e]
                    xi[base + k] = o[S2 + e]
                    xr[base + h + k] = o[2 * S2 + e]
                    xi[base + h + k] = o[3 * S2 + e]
                    e += 1
        m *= 2
        s += 1
    return xr, xi


@njit(cache=True, error_model="numpy")
def interleave32(xr, xi, B, n, keep):  # pragma: no cover - compiled
    """The first ``keep`` bins of each of the B rows of parts (xr, xi) ((B·n,) float32)
    as interleaved (re, im) pairs, (B·keep·2,) float32: the memory of a complex64
    (B, keep) tensor (exact copies)."""
    out = np.empty(B * keep * 2, np.float32)
    for b in range(B):
        src = b * n
        dst = 2 * b * keep
        for k in range(keep):
            out[dst + 2 * k] = xr[src + k]
            out[dst + 2 * k + 1] = xi[src + k]
    return out


@njit(cache=True, error_model="numpy")
def hermitian32(h, B, m, n):  # pragma: no cover - compiled
    """The full spectrum parts (fr, fi) ((B·n,) float32, n even) of B half spectra of m
    bins given as interleaved (re, im) pairs ``h`` ((B·m·2,) float32), as
    :func:`numvar.instrument.fft.fft_c2r` extends them: bins 0..n/2 copied (zeros past
    the m given), the imaginary parts of bins 0 and n/2 set to +0, then
    ``X_k = conj X_{n−k}`` for k > n/2 (exact copies and negations)."""
    half = n // 2
    L = min(m, half + 1)
    fr = np.zeros(B * n, np.float32)
    fi = np.zeros(B * n, np.float32)
    for b in range(B):
        src = 2 * b * m
        dst = b * n
        for k in range(L):
            fr[dst + k] = h[src + 2 * k]
            fi[dst + k] = h[src + 2 * k + 1]
        fi[dst] = 0.0
        fi[dst + half] = 0.0
        for k in range(half + 1, n):
            fr[dst + k] = fr[dst + n - k]
            fi[dst + k] = -fi[dst + n - k]
    return fr, fi
