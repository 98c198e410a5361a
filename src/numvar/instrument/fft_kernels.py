"""numba kernel of the binary32 radix-2 FFT at flop granularity
(:func:`numvar.instrument.fft._radix2`).

The tensor implementation makes three rounding calls per stage and some fifteen tensor
ops around them (bit reversal, stacks, concatenations): for the transforms of a model
(n = 256, a few dozen rows) the ops, not the arithmetic, took most of the time
(docs/speed.md). :func:`radix2_32` runs the same stages in one compiled call: the keys
the tensor implementation would draw (``kp``, ``ka`` for the twiddle products of a stage
with h > 1, ``kb`` for its butterflies) are drawn beforehand in the same order, and
every element is rounded by :func:`numvar.instrument.pointwise.round_into` (the
tiles of ``pointwise.binary32``) with the same key and the same C-order index as in the
stacked tensor calls:

* products ``(vr·wr, vi·wi, vr·wi, vi·wr)`` at ``q·S + e``, ``S = B·(n/m)·(h−1)``,
  ``e = (b·n/m + blk)·(h−1) + k−1``; sums ``vr·wr − vi·wi`` at ``e`` and
  ``vr·wi + vi·wr`` at ``S + e``;
* butterflies ``(ur + tr, ui + ti, ur − tr, ui − ti)`` at ``q·S₂ + e₂``,
  ``S₂ = B·(n/m)·h``, ``e₂ = (b·n/m + blk)·h + k``.

Hence the same bits for the same seed (tested against the tensor implementation and
:func:`numvar.instrument.fft.c2c_reference`). :func:`interleave32` and
:func:`hermitian32` are the exact copies around it for ``_fft_r2c`` and ``_fft_c2r``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from numvar.rounding import kernels as K

from .pointwise import copy_into, fill, round_into, round_sum_into


@njit(cache=True, error_model="numpy")
def stage_twiddles32(cw, sw, B, n):  # pragma: no cover - compiled
    """The twiddle factors of :func:`radix2_32`'s products in their element order: for
    each stage with h > 1 (m = 4, 8, …, n), ``(cw, sw)[k·n/m]`` for every (b, blk) and
    k = 1 … h−1, the stages one after the other; (wr, wi), each of
    ``Σ B·(n/m)·(h−1)`` float32 (exact copies)."""
    tot = 0
    m = 4
    while m <= n:
        tot += B * (n // m) * (m // 2 - 1)
        m *= 2
    wr = np.empty(tot, np.float32)
    wi = np.empty(tot, np.float32)
    e = 0
    m = 4
    while m <= n:
        h = m // 2
        stride = n // m
        for _ in range(B * (n // m)):
            for k in range(1, h):
                wr[e] = cw[k * stride]
                wi[e] = sw[k * stride]
                e += 1
        m *= 2
    return wr, wi


@njit(cache=True, error_model="numpy")
def radix2_32(re, im, B, n, twr, twi, kp, ka, kb, mode, real_in, real_out, scale,
              ks):  # pragma: no cover - compiled
    """Radix-2 DIT of the rows of re, im ((B·n,) float32, C order; n a power of two ≥ 2)
    with the stages' twiddles (twr, twi) from :func:`stage_twiddles32`; stage s
    (m = 2^(s+1)) uses keys kp[s], ka[s] (h > 1) and kb[s]. Returns the transformed
    (re, im). ``real_in``: the imaginary parts are all +0 (an rfft's input; ``im`` is not
    read): stage 0's imaginary sums and differences are +0 + +0 and +0 − +0, exactly +0
    in every mode, and are written as such rather than gathered and rounded (7.5 µs of a
    256-point, 32-row transform); from stage 1 on the real parts' butterflies are sums
    with a tiny term (``u ± t`` with t a real part times the tiny cos(π/2) of the
    twiddles), often inexact in float64: they start on the residual path
    (:func:`_butterflies`); same values either way. ``real_out``: only
    the real parts of the result are wanted (an irfft's): the last stage computes no
    imaginary part (its twiddle products ``vr·wi`` and ``vi·wr``, their sum, its
    imaginary butterflies: 7 % of a 256-point transform's roundings), and the returned
    imaginary parts are empty; its input is an irfft's Hermitian extension, whose
    imaginary butterflies start on the residual path (:func:`_butterflies`); a ``scale``
    other than 1 (an irfft's normalisation, with ``real_out``) multiplies the real parts
    as they are written back, rounded with the key ``ks`` at their row-major indices:
    ``Ctx.mul(out, scale)``'s key, indices and values, without its call (8.8 µs for 32
    rows of 256, its kernel 4.4). The values computed keep their keys and indices.

    Between stages the data stays in the butterflies' element order: a stage's four
    results (``ur + tr``, ``ui + ti``, ``ur − tr``, ``ui − ti`` at e₂ = (b·n/m + blk)·h + k)
    are the next stage's inputs, read as runs of h (block 2·blk' gives u, block 2·blk'+1
    gives t, each its sums then its differences), and only the last stage's are written
    back in row order. Differences are rounded as such (``a − b`` is ``a + (−b)``
    exactly, with the same key and index), the twiddle products' sums on the residual
    path first (:func:`numvar.instrument.pointwise.round_sum_into`). Before, every stage
    gathered its operands from and scattered its results to the row layout and negated
    copies: 250 of a 256-point, 32-row transform's 550 µs went to copies (docs/speed.md)."""
    half = B * n // 2
    rev = np.empty(n, np.int64)  # the bit-reversal permutation (exact), read by stage 0
    bits = 0
    while (1 << bits) < n:
        bits += 1
    for i in range(n):
        rv = 0
        for t in range(bits):
            rv |= ((i >> t) & 1) << (bits - 1 - t)
        rev[i] = rv
    ur = np.empty(half, np.float32)
    ui = np.empty(half, np.float32)
    tr = np.empty(half, np.float32)
    ti = np.empty(half, np.float32)
    vr = np.empty(half, np.float32)
    vi = np.empty(half, np.float32)
    p = np.empty(4 * half, np.float32)
    o = np.empty(4 * half, np.float32)  # a stage's (ur+tr, ui+ti, ur−tr, ui−ti), order e₂
    o2 = np.empty(4 * half, np.float32)
    for b in range(B):  # stage 0 (h = 1): u, t = elements rev[2k], rev[2k + 1] of row b
        r0 = b * n
        q0 = b * (n // 2)
        for k in range(n // 2):
            ur[q0 + k] = re[r0 + rev[2 * k]]
            tr[q0 + k] = re[r0 + rev[2 * k + 1]]
        if not real_in:
            for k in range(n // 2):
                ui[q0 + k] = im[r0 + rev[2 * k]]
                ti[q0 + k] = im[r0 + rev[2 * k + 1]]
    _butterflies(ur, ui, tr, ti, o, half, np.uint64(kb[0]), mode, False,
                 not (real_out and n == 2 or real_in), False)
    if real_in:  # (+0 ± +0: exact, +0)
        fill(o[half:2 * half], np.float32(0.0))
        fill(o[3 * half:4 * half], np.float32(0.0))
    m = 4
    s = 1
    toff = 0
    while m <= n:
        h = m // 2
        ph = h // 2  # the previous stage's h: its runs
        S = B * (n // m) * (h - 1)
        nq = B * (n // m)
        # the first stages' runs (1, 2, 4, 8) as constants: their loops unroll (the
        # copies of stages 1-3 took 50 of a 256-point, 32-row transform's 89 µs; 19 now);
        # longer runs copied as views (:func:`_stage_runs`)
        if ph == 1:
            _stage_inputs(o, ur, ui, tr, ti, vr, vi, nq, 1, half)
        elif ph == 2:
            _stage_inputs(o, ur, ui, tr, ti, vr, vi, nq, 2, half)
        elif ph == 4:
            _stage_inputs(o, ur, ui, tr, ti, vr, vi, nq, 4, half)
        elif ph == 8:
            _stage_inputs(o, ur, ui, tr, ti, vr, vi, nq, 8, half)
        else:
            _stage_runs(o, ur, ui, tr, ti, vr, vi, nq, ph, half)
        wr = twr[toff:toff + S]
        wi = twi[toff:toff + S]
        toff += S
        imag = not (real_out and m == n)  # (the last stage of a real output: no im parts)
        kps = np.uint64(kp[s])
        round_into(K.OP_MUL, vr[:S], wr, p[0:S], kps, 0, mode)
        round_into(K.OP_MUL, vi[:S], wi, p[S:2 * S], kps, S, mode)
        if imag:
            round_into(K.OP_MUL, vr[:S], wi, p[2 * S:3 * S], kps, 2 * S, mode)
            round_into(K.OP_MUL, vi[:S], wr, p[3 * S:4 * S], kps, 3 * S, mode)
        kas = np.uint64(ka[s])
        round_sum_into(K.OP_SUB, p[0:S], p[S:2 * S], vr[:S], kas, 0, mode)  # re of the product
        if imag:
            round_sum_into(K.OP_ADD, p[2 * S:3 * S], p[3 * S:4 * S], vi[:S], kas, S, mode)  # im
        if h == 2:
            _twiddled(vr, vi, tr, ti, nq, 2)
        elif h == 4:
            _twiddled(vr, vi, tr, ti, nq, 4)
        elif h == 8:
            _twiddled(vr, vi, tr, ti, nq, 8)
        elif h == 16:
            _twiddled(vr, vi, tr, ti, nq, 16)
        else:
            _twiddled_runs(vr, vi, tr, ti, nq, h)
        _butterflies(ur, ui, tr, ti, o2, half, np.uint64(kb[s]), mode, real_in, imag, real_out)
        o, o2 = o2, o
        m *= 2
        s += 1
    h = n // 2  # the last stage has one block per row: x[b, k] = sum, x[b, h + k] = difference
    xr = np.empty(B * n, np.float32)
    xi = np.empty(0 if real_out else B * n, np.float32)
    scaled = scale != np.float32(1.0)
    sc = np.empty(h if scaled else 0, np.float32)
    fill(sc, scale)
    for b in range(B):
        r0 = b * n
        q0 = b * h
        if scaled:
            round_into(K.OP_MUL, o[q0:q0 + h], sc, xr[r0:r0 + h], ks, r0, mode)
            round_into(K.OP_MUL, o[2 * half + q0:2 * half + q0 + h], sc, xr[r0 + h:r0 + n],
                       ks, r0 + h, mode)
        else:
            copy_into(xr[r0:r0 + h], o[q0:q0 + h])
            copy_into(xr[r0 + h:r0 + n], o[2 * half + q0:2 * half + q0 + h])
        if not real_out:
            copy_into(xi[r0:r0 + h], o[half + q0:half + q0 + h])
            copy_into(xi[r0 + h:r0 + n], o[3 * half + q0:3 * half + q0 + h])
    return xr, xi


@njit(inline="always", error_model="numpy")
def _stage_inputs(o, ur, ui, tr, ti, vr, vi, nq, ph, half):
    """A stage's operands from the previous stage's results ``o`` (runs of ``ph``): for
    each of its ``nq`` blocks q, u (``ur``, ``ui`` at q·h + k) from previous block 2q
    (:func:`_blend_u`), t's unmultiplied k = 0 (``tr``, ``ti`` at q·h) and the parts to
    be multiplied (``vr``, ``vi`` at q·(h−1) + k − 1) from block 2q + 1; h = 2·ph
    (exact copies). Called with ``ph`` (1, 2, 4, 8) a constant, whose loops unroll;
    longer runs: :func:`_stage_runs`."""
    h = 2 * ph
    _blend_u(o, ur, ui, half, ph)
    e = 0
    e1 = 0
    for q in range(nq):
        ev = 2 * q * ph  # previous block 2q: u; 2q + 1: t (k = 0 unmultiplied)
        od = ev + ph
        tr[e] = o[od]
        ti[e] = o[half + od]
        for k in range(1, ph):
            vr[e1 + k - 1] = o[od + k]
            vi[e1 + k - 1] = o[half + od + k]
        for k in range(ph):
            vr[e1 + ph - 1 + k] = o[2 * half + od + k]
            vi[e1 + ph - 1 + k] = o[3 * half + od + k]
        e += h
        e1 += h - 1


@njit(inline="always", error_model="numpy")
def _blend_u(o, ur, ui, half, ph):
    """u of every block of a stage from the previous stage's results ``o`` (runs of
    ``ph``, h = 2·ph): at q·h + k the sum at q·h + k for k < ph, the difference at
    q·h + k − ph after (block 2q's sums, then its differences; exact copies), as one
    select between two contiguous reads per element, which LLVM vectorises whatever ph
    (the reads indexed by the loop counter itself: a computed index goes through numba's
    negative-index wrap, a gather per load). The per-block copies of runs of 1–8 took
    6 of a 256-point, 32-row transform's 250 µs more (Zen 4, one thread, sr)."""
    sr = o[0:half]
    dr = o[2 * half - ph:3 * half - ph]
    si = o[half:2 * half]
    di = o[3 * half - ph:4 * half - ph]
    for i in range(half):
        first = (i & ph) == 0
        a = sr[i]
        b = dr[i]
        ur[i] = a if first else b
    for i in range(half):
        first = (i & ph) == 0
        a = si[i]
        b = di[i]
        ui[i] = a if first else b


@njit(inline="always", error_model="numpy")
def _stage_runs(o, ur, ui, tr, ti, vr, vi, nq, ph, half):
    """:func:`_stage_inputs` for runs of ``ph`` >= 16: each run of v copied as a view
    (``pointwise.copy_into``, which LLVM vectorises). The element loops with a runtime
    ``ph`` stayed scalar: a 256-point, 32-row transform's last three stages copied in
    39 µs (0.75 ns an element), in 7 this way (Zen 4, in cache)."""
    h = 2 * ph
    _blend_u(o, ur, ui, half, ph)
    e = 0
    e1 = 0
    for q in range(nq):
        ev = 2 * q * ph
        od = ev + ph
        tr[e] = o[od]
        ti[e] = o[half + od]
        copy_into(vr[e1:e1 + ph - 1], o[od + 1:od + ph])
        copy_into(vi[e1:e1 + ph - 1], o[half + od + 1:half + od + ph])
        copy_into(vr[e1 + ph - 1:e1 + h - 1], o[2 * half + od:2 * half + od + ph])
        copy_into(vi[e1 + ph - 1:e1 + h - 1], o[3 * half + od:3 * half + od + ph])
        e += h
        e1 += h - 1


@njit(inline="always", error_model="numpy")
def _twiddled_runs(vr, vi, tr, ti, nq, h):
    """:func:`_twiddled` for ``h`` >= 32, each block's run copied as a view (as
    :func:`_stage_runs`: 21 → 3 µs for the last three stages of the transform there)."""
    e = 0
    e1 = 0
    for q in range(nq):
        copy_into(tr[e + 1:e + h], vr[e1:e1 + h - 1])
        copy_into(ti[e + 1:e + h], vi[e1:e1 + h - 1])
        e += h
        e1 += h - 1


@njit(inline="always", error_model="numpy")
def _twiddled(vr, vi, tr, ti, nq, h):
    """The twiddle products (``vr``, ``vi`` at q·(h−1) + k − 1) into t at q·h + k,
    k = 1 … h−1, for the ``nq`` blocks (exact copies)."""
    e = 0
    e1 = 0
    for q in range(nq):
        for k in range(1, h):
            tr[e + k] = vr[e1 + k - 1]
            ti[e + k] = vi[e1 + k - 1]
        e += h
        e1 += h - 1


@njit(inline="always", error_model="numpy")
def _butterflies(ur, ui, tr, ti, o, half, kbs, mode, lo, imag, lo_im):
    """A stage's ``(ur + tr, ui + ti, ur − tr, ui − ti)`` into ``o`` at q·half + e₂
    (without ``imag``, the real parts only); with ``lo`` the real parts' sums, with
    ``lo_im`` the imaginary parts', on the residual path first (``round_sum_into``: same
    values). Measured on an rfft's 32 rows of 256 (Zen 4, one thread, sr): 280 → 264 µs
    with ``lo`` from stage 1 on; on complex input it cost 257 → 264 µs, so only a real
    input takes it. An irfft's Hermitian input declines about 1 % of its imaginary sums
    (near-cancelling parts, inexact in float64) from stage 2 on, which redid nearly every
    tile: fft_filter's irfft of 32 rows of 256 took 264 µs, 233 with ``lo_im``."""
    if lo:
        round_sum_into(K.OP_ADD, ur, tr, o[0:half], kbs, 0, mode)
        round_sum_into(K.OP_SUB, ur, tr, o[2 * half:3 * half], kbs, 2 * half, mode)
    else:
        round_into(K.OP_ADD, ur, tr, o[0:half], kbs, 0, mode)
        round_into(K.OP_SUB, ur, tr, o[2 * half:3 * half], kbs, 2 * half, mode)
    if imag:
        if lo_im:
            round_sum_into(K.OP_ADD, ui, ti, o[half:2 * half], kbs, half, mode)
            round_sum_into(K.OP_SUB, ui, ti, o[3 * half:4 * half], kbs, 3 * half, mode)
        else:
            round_into(K.OP_ADD, ui, ti, o[half:2 * half], kbs, half, mode)
            round_into(K.OP_SUB, ui, ti, o[3 * half:4 * half], kbs, 3 * half, mode)


@njit(cache=True, error_model="numpy")
def interleave32(xr, xi, B, n, keep):  # pragma: no cover - compiled
    """The first ``keep`` bins of each of the B rows of parts (xr, xi) ((B·n,) float32)
    as interleaved (re, im) pairs, (B·keep·2,) float32: the memory of a complex64
    (B, keep) tensor (exact copies). Each row through slices of its own: LLVM then
    vectorises the interleaving (32 rows of 129 bins: 4.3 → 1.5 µs, Zen 4)."""
    out = np.empty(B * keep * 2, np.float32)
    for b in range(B):
        r = xr[b * n:b * n + keep]
        i = xi[b * n:b * n + keep]
        o = out[2 * b * keep:2 * (b + 1) * keep]
        for k in range(keep):
            o[2 * k] = r[k]
            o[2 * k + 1] = i[k]
    return out


@njit(cache=True, error_model="numpy")
def hermitian32(h, B, m, n):  # pragma: no cover - compiled
    """The full spectrum parts (fr, fi) ((B·n,) float32, n even) of B half spectra of m
    bins given as interleaved (re, im) pairs ``h`` ((B·m·2,) float32), as
    :func:`numvar.instrument.fft.fft_c2r` extends them: bins 0..n/2 copied (zeros past
    the m given), the imaginary parts of bins 0 and n/2 set to +0, then
    ``X_k = conj X_{n−k}`` for k > n/2 (exact copies and negations; the mirrors of bins
    past the m given are (+0, −0)). Every part written once, each row through slices of
    its own, the mirrors read from ``h``: 32 rows of 129 bins to 256 took 10 µs as zeros,
    copies and a second pass over the written halves, 5.6 now (Zen 4)."""
    half = n // 2
    L = min(m, half + 1)
    fr = np.empty(B * n, np.float32)
    fi = np.empty(B * n, np.float32)
    for b in range(B):
        src = h[2 * b * m:2 * b * m + 2 * L]
        r = fr[b * n:(b + 1) * n]
        i = fi[b * n:(b + 1) * n]
        for k in range(L):
            r[k] = src[2 * k]
            i[k] = src[2 * k + 1]
        for k in range(L, half + 1):
            r[k] = 0.0
            i[k] = 0.0
        i[0] = 0.0
        i[half] = 0.0
        for k in range(1, min(L, half)):  # bins n − k from the given bins k < n/2
            r[n - k] = src[2 * k]
            i[n - k] = -src[2 * k + 1]
        for k in range(max(L, 1), half):  # and from the zeros past them
            r[n - k] = 0.0
            i[n - k] = -0.0
    return fr, fi
