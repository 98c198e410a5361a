"""numba kernels of LayerNorm, GroupNorm, eval BatchNorm and softmax at flop granularity
(binary32 and binary64): ``aten.native_layer_norm``,
``native_group_norm`` (with a weight), ``native_batch_norm`` /
``_native_batch_norm_legit_no_training`` (eval: running statistics; and
``native_batch_norm`` in training: batch statistics, the running ones updated, and
InstanceNorm's one-sample call), ``_softmax`` /
``_safe_softmax`` (last dim), and the backward ops ``native_batch_norm_backward`` and
``native_layer_norm_backward``. The layer norm is described here; the
others follow the same rules (their functions say their steps and keys).

At flop granularity LayerNorm runs torch's decomposition with the mode re-entered:
``var_mean`` (``prims.var``: six tensor steps, ``prims.sum``, ``prims.div``), ``+ eps``,
``rsqrt``, ``− mean``, ``· rstd``, ``· weight``, ``+ bias``: fourteen rounded sub-ops, each
a dispatch, a handler and a kernel call (about 25 µs of Python each against a few µs of
arithmetic on a transformer's activations: docs/speed.md). :func:`layer_norm_rows` runs
the same steps in one compiled call, or :func:`layer_norm_par` in runs of rows on
numba's threads (the same bits). The stream keys the decomposition would draw are drawn
beforehand in the same order and every step uses its key and its element indices (the
rows x viewed as (M, K), K the normalised size, m·K + k for element (m, k)):

=====  ==========================  ==========================================
key    step                        kernel (element indices)
=====  ==========================  ==========================================
0–5    ``prims.var`` (biased)      ``scan_kernels.rowvar`` (its own indices)
6      ``prims.sum``               ``scan_kernels._rows`` (element (k, m): k·M + m)
7      ``prims.div`` by K          ``pointwise.round_into_any`` (element m)
8      ``+ eps`` (in x's format)   ``round_into_any`` (element m)
9      ``rsqrt``                   float64 ``1/sqrt``, :func:`_rsqrt_rounded` (m)
10     ``x − mean``                ``round_into_any`` (m·K + k)
11     ``· rstd``                  ``round_into_any`` (m·K + k)
12     ``· weight`` (if any)       ``round_into_any`` (m·K + k)
12/13  ``+ bias`` (if any)         ``round_into_any`` (m·K + k)
=====  ==========================  ==========================================

``rsqrt`` at flop is "the float64 result rounded once" (``handlers.op_once``): torch's
float64 rsqrt is ``1 / sqrt(x)``, two correctly rounded IEEE operations, which is what
the kernel computes. The mode's ``_fused`` takes this kernel only after the
decomposition ran once with the same signature and drew the same number of keys; the
report then counts the same sub-ops. Same bits for the same seed: tested against the
decomposition (``USE_KERNEL = False``) in every rounding mode, with non-finite values,
with and without weight and bias (``tests/test_instrument_norm_kernels.py``). A binary64
input (float64 at 53 bits, :data:`LAYER_NORM64`) runs the same code on float64 arrays:
``round_into_any`` rounds to binary64 there, and ``rsqrt``'s float64 result counts as
exact (only ud perturbs it: :func:`_round_result`). The softmax's, GroupNorm's and
InstanceNorm's kernels likewise (:data:`SOFTMAX64`, ``exp``'s float64 result;
:data:`GROUP_NORM64`; :data:`BATCH_NORM_TRAIN64`) and eval BatchNorm's
(:data:`BATCH_NORM_EVAL64`; its per-channel ``sqrt`` by the rounding core's scalar
function, :func:`_sqrt_into`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange, types
from numba.extending import overload

from numvar.rounding import kernels as K

from . import kernels as KN
from . import linalg_kernels as LK
from . import pointwise as PW
from . import scan_kernels as SK
from .flop import flop_backend
from .kernels import _bits

#: take the kernel (False: the decomposition, op by op: the slow reference)
USE_KERNEL = True
#: the numpy scalar type of the kernels' arrays, per input dtype
_NP = {torch.float32: np.float32, torch.float64: np.float64}
#: take the layer-norm kernel for binary64 inputs too (False: their decomposition)
LAYER_NORM64 = True
#: take the softmax kernels for binary64 inputs too (False: their decomposition)
SOFTMAX64 = True
#: the same for GroupNorm (with a weight) and training batch norm (InstanceNorm's too)
GROUP_NORM64 = True
BATCH_NORM_TRAIN64 = True
#: training batch norm over more than one sample or with running statistics in one
#: compiled call too (False: only one sample without them, InstanceNorm's call; the
#: rest by its decomposition)
BATCH_NORM_TRAIN = True
#: batch norm's backward (training and eval) in one compiled call (False: its
#: decomposition)
BATCH_NORM_BACKWARD = True
#: layer norm's backward in one compiled call (:func:`layer_norm_backward`; False: its
#: decomposition; binary64 inputs under :data:`LAYER_NORM64` too)
LAYER_NORM_BACKWARD = True
#: softmax's backward over the last dim in one compiled call (:func:`softmax_backward`;
#: False: its decomposition; binary64 inputs under :data:`SOFTMAX64` too)
SOFTMAX_BACKWARD = True
#: inputs of ``kernels.PARALLEL_MIN_WORK`` elements or more to the kernels too, on one
#: numba thread, or on several where the kernel splits its work over them
#: (:func:`_size_ok`; False: the decomposition, as for every input that size before)
LARGE_INPUTS = True
#: the same for eval batch norm (running statistics)
BATCH_NORM_EVAL64 = True
#: a binary32 layer norm's time per element at flop granularity, in SR contraction
#: terms (measured, one thread, Zen 3: 24 ns per element of a 128 × 128 layer norm
#: against 0.8 ns per term): the weight of its elements against
#: ``kernels.PARALLEL_MIN_WORK`` (:func:`row_parts`)
LAYER_NORM_WORK = 30
#: the same for a softmax's two compiled steps (:func:`softmax_sub`,
#: :func:`softmax_tail`; 13.6 ns per element of 256 rows of 64, binary32)
SOFTMAX_WORK = 17
#: the same for eval batch norm's normalisation (:func:`batch_norm_eval`: 7.4 ns per
#: element of 2 × 64 × 32 × 32 with weight and bias)
BATCH_NORM_WORK = 9
#: training batch norm's channel sums by columns (a tile of every channel per step,
#: ``scan_kernels.scan_columns``) from this many channels, by rows below (their chains stepped
#: together, ``scan_kernels._rows``). One thread, sr, Zen 4, ns per element, rows /
#: columns: 3 channels 3.9 / 7.8, 4: 3.6 / 4.5, 8: 3.5 / 2.4, 12: 4.1 / 1.8, 16: 3.8 /
#: 1.3, 96: 3.6 / 0.8 (``_rows`` on (C, K) rows from 16 on transposes blocks itself;
#: the columns by the scan's steps since 2026-12-06, by ``pointwise._colsums`` before:
#: 10.6, 6.6, 3.3, 2.3, 1.8, 0.9, and 12 channels then)
COLUMN_SUMS_MIN = 8


@njit(inline="always")
def _statistics(x, eps, keys, mode, mean, rstd, Mg, mg0):
    """``var_mean`` (biased) of the rows of x (M, K), then ``rstd = RND(rsqrt(RND(var +
    eps)))``: keys 0–9 as in the module docstring; ``mean``, ``rstd`` (M,). x is the rows
    mg0 .. mg0 + M of a (Mg, K) whole (the whole: Mg = M, mg0 = 0), the element indices
    those of the whole. binary32 (float32 arrays) or binary64 (float64; ``eps`` of the
    arrays' dtype)."""
    M, Kd = x.shape
    dt = x.dtype
    nk = np.empty(1, dt)
    nk[0] = Kd
    var = np.empty(M, dt)
    SK.rowvar(x, keys[0:6], nk[0], nk[0], mode, var, Mg, mg0)
    s = np.empty(M, dt)
    SK._rows(x, s, np.uint64(keys[6]), mode, Mg, mg0)
    _mean_rstd(s, var, Kd, eps, keys, mode, mean, rstd, mg0)


@njit(inline="always")
def _mean_rstd(s, var, Kd, eps, keys, mode, mean, rstd, mg0):
    """The rest of :func:`_statistics` given the rows' biased variance ``var`` (keys 0–5)
    and their sums ``s`` (``prims.sum``, key 6) over ``Kd`` elements: ``mean = RND(s /
    Kd)`` (``prims.div``, key 7), ``rstd = RND(rsqrt(RND(var + eps)))`` (keys 8, 9)."""
    M = s.size
    col = np.empty(M, s.dtype)
    col[:] = Kd
    # the ops as int64s, not literals: one compiled PW.round_into_any per dtype
    PW.round_into_any(np.int64(K.OP_DIV), s, col, mean, np.uint64(keys[7]), mg0, mode)
    col[:] = eps
    ve = np.empty(M, s.dtype)
    PW.round_into_any(np.int64(K.OP_ADD), var, col, ve, np.uint64(keys[8]), mg0, mode)
    _rsqrt_rounded(ve, rstd, np.uint64(keys[9]), mg0, mode)


def _round_result(h, o, ukey, l0, mode):  # pragma: no cover - replaced by its overload
    """``o[j] = RND(h[j])`` with ``bits64(key, l0 + j)``: a float64 result rounded once
    as ``handlers.op_once`` rounds it (``Ctx.round``). binary32 ``o``: rounded to binary32
    (``pointwise._roundtile``). binary64 ``o``: the result counts as exact, rounded to
    binary64 at 53 bits: itself in the modes that keep exact values (ieee, sr, random;
    NaN payloads kept, as ``Ctx.round`` copies), else ``call_round_rn64`` (ud perturbs
    it)."""


@overload(_round_result)
def _round_result_impl(h, o, ukey, l0, mode):
    if o.dtype == types.float64:
        def wide(h, o, ukey, l0, mode):
            if mode == K.MODE_IEEE or mode == K.MODE_SR or mode == K.MODE_RANDOM:
                PW.copy_into(o, h)
                return
            for j in range(o.size):
                o[j] = K.call_round_rn64(h[j], 0.0, mode, np.int64(53),
                                         _bits(ukey, np.uint64(l0 + j)))
        return wide

    def narrow(h, o, ukey, l0, mode):
        PW._roundtile(h, o, ukey, l0, PW._ONE, mode)  # l0 an int64: one copy
    return narrow


@njit(inline="always")
def _rsqrt_rounded(ve, rstd, ukey, l0, mode):
    """``rstd[m] = RND(1 / sqrt(ve[m]))`` with ``bits64(key, l0 + m)``: ``rsqrt`` at flop
    granularity, the float64 result rounded once (:func:`_round_result`; torch's float64
    ``rsqrt`` is ``1 / sqrt(x)``, two correctly rounded operations)."""
    h = np.empty(rstd.size)
    for m in range(rstd.size):
        h[m] = 1.0 / np.sqrt(np.float64(ve[m]))
    _round_result(h, rstd, ukey, l0, mode)


@njit(cache=True, error_model="numpy")
def layer_norm_rows(x, w, b, has_w, has_b, eps, keys, mode, out, mean, rstd, Mg,
                    mg0):  # pragma: no cover - compiled
    """LayerNorm of the rows of x (M, K) C-contiguous, K ≥ 2, binary32 at 24 bits for
    float32 arrays or binary64 at 53 bits for float64 ones (every array and ``eps`` of
    x's dtype), x the rows mg0 .. mg0 + M of a (Mg, K) whole (int64s; the whole: Mg = M,
    mg0 = 0): ``out`` (M, K), ``mean`` and ``rstd`` (M,), with the keys and the whole's
    element indices of the module docstring, so that a part of the rows gets the values
    the whole gets for them. ``w``, ``b``: (K,) (read only when ``has_w`` / ``has_b``)."""
    M, Kd = x.shape
    _statistics(x, eps, keys, mode, mean, rstd, Mg, mg0)
    z, o = np.int64(0), np.int64(1)  # not literals: one compiled _normalize_affine
    _normalize_affine(x.reshape(M * Kd), mean, rstd, w, b, has_w, has_b, keys,
                      np.int64(10), mode, out.reshape(M * Kd), M, o, Kd, o, z, z, z, z, o,
                      mg0 * Kd)


@njit(parallel=True, cache=True, error_model="numpy")
def layer_norm_par(x, w, b, has_w, has_b, eps, keys, mode, out, mean, rstd,
                   parts):  # pragma: no cover - compiled
    """:func:`layer_norm_rows` of the whole x (M, K), M ≥ ``pointwise.ROW_M_MIN`` (the
    row-block sums: a part's rows are summed as in the whole), in ``parts`` runs of rows
    on numba's threads: the same bits as one call on the whole."""
    M = x.shape[0]
    for p in prange(parts):
        m0 = p * M // parts
        m1 = (p + 1) * M // parts
        layer_norm_rows(x[m0:m1], w, b, has_w, has_b, eps, keys, mode, out[m0:m1],
                        mean[m0:m1], rstd[m0:m1], np.int64(M), np.int64(m0))


@njit(inline="always")
def _spread(full, v, d0, d1, d2, s0, s1, s2):
    """``full`` (d0·d1·d2,) in C order ← ``v[i0·s0 + i1·s1 + i2·s2]`` (a broadcast)."""
    l0 = 0
    for i0 in range(d0):
        for i1 in range(d1):
            base = i0 * s0 + i1 * s1
            # (writes through a view indexed from 0: full[l0 + i2] kept LLVM from vectorising
            # these loops, see pointwise.copy_into)
            dst = full[l0:l0 + d2]
            if s2 == 0:
                c = v[base]
                for i2 in range(d2):
                    dst[i2] = c
            elif s2 == 1:
                PW.copy_into(dst, v[base:base + d2])
            else:
                for i2 in range(d2):
                    dst[i2] = v[base + i2 * s2]
            l0 += d2


@njit(cache=True, error_model="numpy")
def _normalize_affine(xf, mean, inv, w, b, has_w, has_b, keys, k0, mode, out, d0, d1, d2,
                      s0, s1, s2, a0, a1, a2, l0):  # pragma: no cover - compiled
    """``out = RND(RND(RND(RND(x − mean)·inv)·w) + b)`` (the weight and bias steps where
    present; binary32 or binary64 by the arrays' dtype), keys ``keys[k0]``,
    ``keys[k0 + 1]``, then one per affine step, element l0 + l of the C-order (d0, d1,
    d2) arrays: the statistics read with strides (s0, s1, s2), the affine parameters
    with (a0, a1, a2). Whole-array passes, operands broadcast into one
    full buffer: one round_into call per step (one per row made short rows slow).
    Callers pass ``k0`` and the strides as runtime int64s: constants would be literal
    types, one compiled copy per caller's pattern (three in a test run) where one serves."""
    n = out.size
    dt = out.dtype
    sub, mul, add = np.int64(K.OP_SUB), np.int64(K.OP_MUL), np.int64(K.OP_ADD)
    full = np.empty(n, dt)
    _spread(full, mean, d0, d1, d2, s0, s1, s2)
    d = np.empty(n, dt)
    PW.round_into_any(sub, xf, full, d, np.uint64(keys[k0]), l0, mode)
    _spread(full, inv, d0, d1, d2, s0, s1, s2)
    last = has_w or has_b
    e = np.empty(n, dt) if last else out
    PW.round_into_any(mul, d, full, e, np.uint64(keys[k0 + 1]), l0, mode)
    if not last:
        return
    k = k0 + 2
    if has_w:
        _spread(full, w, d0, d1, d2, a0, a1, a2)
        PW.round_into_any(mul, e, full, d if has_b else out, np.uint64(keys[k]), l0, mode)
        k += 1
        e, d = d, e
    if has_b:
        _spread(full, b, d0, d1, d2, a0, a1, a2)
        PW.round_into_any(add, e, full, out, np.uint64(keys[k]), l0, mode)


def _sqrt_into(a, o, ukey, mode):  # pragma: no cover - replaced by its overload
    """``o[j] = RND(sqrt(a[j]))`` with ``bits64(key, j)``, as the flop ``sqrt`` rounds it
    (``Ctx.sqrt``): binary32 ``o`` by ``pointwise._sqrttile``; binary64 ``o`` by
    ``rounding.kernels.wide_sqrt`` per element, the scalar function of ``k_sqrt``, whose
    vectorised block (``_sqrt64_block``) gives the same bits (``tests/test_rounding_core``
    compares them element by element); a channel count of elements needs no more."""


@overload(_sqrt_into)
def _sqrt_into_impl(a, o, ukey, mode):
    if o.dtype == types.float64:
        def wide(a, o, ukey, mode):
            for j in range(o.size):
                o[j] = K.wide_sqrt(a[j], mode, np.int64(53), _bits(ukey, np.uint64(j)))
        return wide

    def narrow(a, o, ukey, mode):
        PW._sqrttile(a, o, ukey, np.int64(0), mode)
    return narrow


@njit(inline="always")
def _bn_invstd(rvar, eps, keys, mode, C):
    """Eval batch norm's ``invstd = RND(RND(1 / RND(sqrt(RND(var + eps)))) · 1)`` per
    channel (keys 0–3, element c) of the running variance ``rvar`` (C,), in its dtype."""
    dt = rvar.dtype
    col = np.empty(C, dt)
    col[:] = eps
    ve = np.empty(C, dt)
    z = np.int64(0)
    PW.round_into_any(np.int64(K.OP_ADD), rvar, col, ve, np.uint64(keys[0]), z, mode)
    sd = np.empty(C, dt)
    _sqrt_into(ve, sd, np.uint64(keys[1]), mode)
    col[:] = 1.0
    rc = np.empty(C, dt)
    PW.round_into_any(np.int64(K.OP_DIV), col, sd, rc, np.uint64(keys[2]), z, mode)
    inv = np.empty(C, dt)
    PW.round_into_any(np.int64(K.OP_MUL), rc, col, inv, np.uint64(keys[3]), z, mode)
    return inv


@njit(cache=True, error_model="numpy")
def batch_norm_eval(x, w, b, has_w, has_b, rmean, rvar, eps, keys, mode, out, N, C,
                    S):  # pragma: no cover - compiled
    """Batch norm with running statistics (eval) of x (N·C·S,) in C order into ``out``,
    binary32 at 24 bits for float32 arrays, binary64 at 53 for float64 ones: torch's
    decomposition step by step, the per-channel ``invstd`` of :func:`_bn_invstd` (keys
    0–3, element c), then :func:`_normalize_affine` per channel (keys 4…, element l)."""
    inv = _bn_invstd(rvar, eps, keys, mode, C)
    z, o = np.int64(0), np.int64(1)  # not literals: one compiled _normalize_affine
    _normalize_affine(x, rmean, inv, w, b, has_w, has_b, keys, np.int64(4), mode, out, N,
                      C, S, z, o, z, z, o, z, z)


@njit(parallel=True, cache=True, error_model="numpy")
def batch_norm_eval_par(x, w, b, has_w, has_b, rmean, rvar, eps, keys, mode, out, N, C,
                        S, parts):  # pragma: no cover - compiled
    """:func:`batch_norm_eval` with the channels split into ``parts`` runs on numba's
    threads: run p normalises channels c0 .. c1 of every sample, each sample's block of
    them (contiguous in x) by one :func:`_normalize_affine` call given the block's first
    element index, so every element gets the keys and index of the whole call: the same
    bits (``invstd``, C elements, is computed once, before the runs)."""
    inv = _bn_invstd(rvar, eps, keys, mode, C)
    z, o = np.int64(0), np.int64(1)
    for p in prange(parts):
        c0 = p * C // parts
        c1 = (p + 1) * C // parts
        wp = w[c0:c1] if has_w else w
        bp = b[c0:c1] if has_b else b
        for n in range(N):
            l0 = (n * C + c0) * S
            l1 = (n * C + c1) * S
            _normalize_affine(x[l0:l1], rmean[c0:c1], inv[c0:c1], wp, bp, has_w, has_b,
                              keys, np.int64(4), mode, out[l0:l1], o, np.int64(c1 - c0),
                              S, z, o, z, z, o, z, np.int64(l0))


@njit(inline="always")
def _channel_layout(x, t, N, C, S):
    """x (N·C·S,) in C order laid out for :func:`_channel_sums`, in ``t`` (N·S, C) or x
    itself: with at least :data:`COLUMN_SUMS_MIN` channels by position, ``t[n·S + s, c]
    = x[(n·C + c)·S + s]`` (each sample's (C, S) block transposed, 16 positions at a
    time: their cache lines stay in L1), the (K, C) order in which :func:`flop.reduce`
    scans dims (0, 2, …); with fewer, by channel, (C, N·S) in the same k order (x's own
    rows when N = 1)."""
    if C >= COLUMN_SUMS_MIN:
        for n in range(N):
            for s0 in range(0, S, 16):
                s1 = min(S, s0 + 16)
                for c in range(C):
                    base = (n * C + c) * S
                    for s in range(s0, s1):
                        t[n * S + s, c] = x[base + s]
        return t
    if N == 1:
        return x.reshape(C, S)
    rows = t.reshape(C, N * S)
    for n in range(N):
        for c in range(C):
            l0 = (n * C + c) * S
            PW.copy_into(rows[c, n * S:(n + 1) * S], x[l0:l0 + S])
    return rows


@njit(inline="always")
def _channel_sums(t, out, key, mode):
    """The channels' sums of ``t`` (:func:`_channel_layout`'s array) into ``out`` (C,),
    in :func:`flop.reduce`'s order and bits over dims (0, 2, …) (element (k, c):
    ``bits64(key, k·C + c)``): with at least :data:`COLUMN_SUMS_MIN` channels
    ``scan_kernels.scan_columns`` over the whole (the scan's own steps), each step one
    tile of the C channels; with
    fewer, ``scan_kernels._rows`` on the channels' rows (their chains stepped together)."""
    C = out.size
    if C >= COLUMN_SUMS_MIN:
        SK.scan_columns(t, out, key, mode, np.int64(C), np.int64(0))
    else:
        SK._rows(t.reshape(C, t.size // C), out, np.uint64(key), mode, np.int64(C),
                 np.int64(0))


@njit(inline="always")
def _channel_var(x, xt, t, keys, mode, var, N, C, S):
    """``prims.var`` (biased) of x (N·C·S,) over dims (0, 2, …) into ``var`` (C,), as
    :func:`flop.var`'s six tensor steps compute it (keys 0–5): the channels' sums (``xt``:
    x by :func:`_channel_layout`; :func:`_channel_sums`), ``mu = RND(Σ / (N·S))`` (element
    c), ``d = RND(x − mu)`` and ``RND(d·d)`` (element l of x), their channels' sums and
    ``RND(Σ / (N·S))``. With N = 1 these are :func:`scan_kernels.rowvar`'s steps and
    indices on x's rows. ``t`` (N·S, C): the layout's scratch (the squares' layout)."""
    dt = x.dtype
    div, sub, mul = np.int64(K.OP_DIV), np.int64(K.OP_SUB), np.int64(K.OP_MUL)
    z, o = np.int64(0), np.int64(1)
    cnt = np.empty(C, dt)
    cnt[:] = N * S
    s = np.empty(C, dt)
    _channel_sums(xt, s, keys[0], mode)
    mu = np.empty(C, dt)
    PW.round_into_any(div, s, cnt, mu, np.uint64(keys[1]), z, mode)
    full = np.empty(x.size, dt)
    _spread(full, mu, N, C, S, z, o, z)
    d = np.empty(x.size, dt)
    PW.round_into_any(sub, x, full, d, np.uint64(keys[2]), z, mode)
    PW.round_into_any(mul, d, d, full, np.uint64(keys[3]), z, mode)
    _channel_sums(_channel_layout(full, t, N, C, S), s, keys[4], mode)
    PW.round_into_any(div, s, cnt, var, np.uint64(keys[5]), z, mode)


@njit(inline="always")
def _running_update(v, r, momentum, rest, keys, k, mode):
    """``r ← RND(RND(momentum · v) + RND(rest · r))`` (keys k, k + 1, k + 2; element c):
    the decomposition's running-statistic update, ``rest`` its ``1 − momentum``, both
    Python numbers rounded to x's dtype as the scalar path reads them."""
    dt = r.dtype
    mul, add = np.int64(K.OP_MUL), np.int64(K.OP_ADD)
    z = np.int64(0)
    col = np.empty(r.size, dt)
    col[:] = momentum
    a = np.empty(r.size, dt)
    PW.round_into_any(mul, col, v, a, np.uint64(keys[k]), z, mode)
    col[:] = rest
    c = np.empty(r.size, dt)
    PW.round_into_any(mul, col, r, c, np.uint64(keys[k + 1]), z, mode)
    PW.round_into_any(add, a, c, r, np.uint64(keys[k + 2]), z, mode)


@njit(cache=True, error_model="numpy")
def batch_norm_train(x, w, b, has_w, has_b, rm, rv, has_rm, has_rv, momentum, rest, unbias,
                     eps, keys, mode, out, mean, rstd, N, C,
                     S):  # pragma: no cover - compiled
    """Batch norm with batch statistics (training) of x (N·C·S,) in C order, binary32 at
    24 bits for float32 arrays, binary64 at 53 for float64 ones (every array and scalar of
    x's dtype), as torch's decomposition (``native_batch_norm_helper``): ``var_mean`` over
    dims (0, 2, …) (:func:`_channel_var`, keys 0–5; ``prims.sum``, ``prims.div``, keys 6,
    7), ``rstd = RND(rsqrt(RND(var + eps)))`` (keys 8, 9), ``RND(RND(x − mean) · rstd)``
    (keys 10, 11, element l of x); where running statistics are given (``has_rm``,
    ``has_rv``), their update in place (:func:`_running_update`, three keys for the mean;
    for the variance one more first: ``u = RND(var · unbias)``, ``unbias`` the
    decomposition's ``n / (n − 1)``); then ``· weight`` and ``+ bias`` (the next keys, in
    that order). ``mean`` and ``rstd`` (C,): ``save_mean``, ``save_invstd``. N = 1
    without running statistics is InstanceNorm's call (its input arrives as (1, N·C,
    *S))."""
    dt = x.dtype
    z, o = np.int64(0), np.int64(1)  # not literals: one compiled _normalize_affine
    t = np.empty((N * S, C), dt)
    xt = _channel_layout(x, t, N, C, S)
    s = np.empty(C, dt)
    _channel_sums(xt, s, keys[6], mode)  # (prims.sum's key: its sums before t is reused)
    var = np.empty(C, dt)
    _channel_var(x, xt, t, keys, mode, var, N, C, S)
    _mean_rstd(s, var, N * S, eps, keys, mode, mean, rstd, z)
    k = 12
    if has_rm:
        _running_update(mean, rm, momentum, rest, keys, k, mode)
        k += 3
    if has_rv:
        col = np.empty(C, dt)
        col[:] = unbias
        u = np.empty(C, dt)
        PW.round_into_any(np.int64(K.OP_MUL), var, col, u, np.uint64(keys[k]), z, mode)
        _running_update(u, rv, momentum, rest, keys, k + 1, mode)
        k += 4
    ka = np.empty(4, keys.dtype)  # the normalisation's keys: 10, 11, then the affine ones
    ka[0] = keys[10]
    ka[1] = keys[11]
    for j in range(k, keys.size):
        ka[2 + j - k] = keys[j]
    _normalize_affine(x, mean, rstd, w, b, has_w, has_b, ka, z, mode, out, N, C, S, z, o,
                      z, z, o, z, z)


@njit(inline="always")
def _rounded(op, a, b, out, key, mode):
    """``out = RND(a op b)``, element l of the arrays (a step of the decompositions)."""
    PW.round_into_any(op, a, b, out, np.uint64(key), np.int64(0), mode)


@njit(cache=True, error_model="numpy")
def batch_norm_backward(g, x, w, has_w, mean, inv, rv, train, eps, norm, keys, mode, gi, gw,
                        want_w, gb, N, C, S):  # pragma: no cover - compiled
    """``native_batch_norm_backward`` of x and the output gradient g (N·C·S,) in C order,
    binary32 at 24 bits for float32 arrays, binary64 at 53 for float64 ones (every array
    and scalar of x's dtype), as torch's decomposition: in eval (not ``train``) first
    ``inv = RND(rsqrt(RND(rv + eps)))`` (two keys; ``mean`` then the running mean),
    then, k the next key: ``gos = Σ g`` over dims (0, 2, …) (key k; element (n·S + s)·C
    + c, as :func:`_channel_var`'s sums), ``t = RND(x − mean)``, ``RND(g · t)`` (k + 1, k
    + 2; element l of x), ``dot = Σ g·t`` (k + 3), ``gm = RND(gos · norm)``, ``RND(dot ·
    norm)``, ``RND(inv · inv)``, their product ``ps``, ``gsc = RND(inv · w)`` (or ``inv ·
    1``) (k + 4 … k + 8, element c), then in training ``RND(RND(RND(RND(x − mean) · ps) −
    g) …`` as written: ``p = RND(RND(x − mean) · ps)``, ``gi = RND(RND(RND(g − p) − gm) ·
    gsc)`` (k + 9 … k + 13), in eval ``gi = RND(g · gsc)`` (k + 9); then ``gw = RND(dot ·
    inv)`` where ``want_w`` (the next key). ``gb`` (C,) ← ``gos``. ``norm`` is the
    decomposition's ``1 / (N·S)`` read in x's dtype."""
    dt = x.dtype
    sub, mul, add = np.int64(K.OP_SUB), np.int64(K.OP_MUL), np.int64(K.OP_ADD)
    z, o = np.int64(0), np.int64(1)
    col = np.empty(C, dt)
    k = 0
    if not train:
        col[:] = eps
        ve = np.empty(C, dt)
        _rounded(add, rv, col, ve, keys[0], mode)
        _rsqrt_rounded(ve, inv, np.uint64(keys[1]), z, mode)
        k = 2
    n = x.size
    tr = np.empty((N * S, C), dt)
    gos = np.empty(C, dt)
    _channel_sums(_channel_layout(g, tr, N, C, S), gos, keys[k], mode)
    full = np.empty(n, dt)
    _spread(full, mean, N, C, S, z, o, z)
    t = np.empty(n, dt)
    u = np.empty(n, dt)  # (no step writes over its own operands: a tile may be redone)
    _rounded(sub, x, full, t, keys[k + 1], mode)
    _rounded(mul, g, t, u, keys[k + 2], mode)
    dot = np.empty(C, dt)
    _channel_sums(_channel_layout(u, tr, N, C, S), dot, keys[k + 3], mode)
    col[:] = norm
    gm = np.empty(C, dt)
    _rounded(mul, gos, col, gm, keys[k + 4], mode)
    dn = np.empty(C, dt)
    _rounded(mul, dot, col, dn, keys[k + 5], mode)
    sq = np.empty(C, dt)
    _rounded(mul, inv, inv, sq, keys[k + 6], mode)
    ps = np.empty(C, dt)
    _rounded(mul, dn, sq, ps, keys[k + 7], mode)
    gsc = np.empty(C, dt)
    if has_w:
        _rounded(mul, inv, w, gsc, keys[k + 8], mode)
    else:
        col[:] = 1.0
        _rounded(mul, inv, col, gsc, keys[k + 8], mode)
    if train:
        _rounded(sub, x, full, t, keys[k + 9], mode)
        _spread(full, ps, N, C, S, z, o, z)
        _rounded(mul, t, full, u, keys[k + 10], mode)
        _rounded(sub, g, u, t, keys[k + 11], mode)
        _spread(full, gm, N, C, S, z, o, z)
        _rounded(sub, t, full, u, keys[k + 12], mode)
        _spread(full, gsc, N, C, S, z, o, z)
        _rounded(mul, u, full, gi, keys[k + 13], mode)
        k += 14
    else:
        _spread(full, gsc, N, C, S, z, o, z)
        _rounded(mul, g, full, gi, keys[k + 9], mode)
        k += 10
    if want_w:
        _rounded(mul, dot, inv, gw, keys[k], mode)
    PW.copy_into(gb, gos)


@njit(cache=True, error_model="numpy")
def layer_norm_backward(g, x, w, has_w, mean, rstd, nk, keys, mode, gi, want_i, gw, want_w,
                        gb, want_b, M, Kd):  # pragma: no cover - compiled
    """``native_layer_norm_backward`` of x and the output gradient g (M·K,) in C order (the
    rows of K normalised elements), binary32 at 24 bits for float32 arrays, binary64 at 53
    for float64 ones (every array and ``nk``, the decomposition's K, of x's dtype), as
    torch's decomposition, each step with the next key (element m·K + k of the rows, m of
    ``mean`` and ``rstd`` (M,)): ``x̂ = RND(RND(x − mean) · rstd)``, ``ĝ = RND(g · w)``
    (where ``has_w``; else g), ``a = RND(ĝ · K)``, ``b = Σ_k ĝ``, ``c1 = RND(ĝ · x̂)``,
    ``c2 = Σ_k c1`` (the rows' sums, ``scan_kernels._rows``), ``c3 = RND(x̂ · c2)``,
    ``inner = RND(RND(a − b) − c3)``; then where ``want_i`` ``gi = RND(RND(rstd / K) ·
    inner)``, where ``want_w`` ``gw = Σ_m RND(g · x̂)`` and where ``want_b`` ``gb = Σ_m
    g`` (the columns' sums, ``scan_kernels.scan_columns``: the scan's, as
    :func:`flop.reduce` sums leading dims)."""
    dt = x.dtype
    sub, mul, div = np.int64(K.OP_SUB), np.int64(K.OP_MUL), np.int64(K.OP_DIV)
    z, o = np.int64(0), np.int64(1)
    n = M * Kd
    full = np.empty(n, dt)  # (no step writes over its own operands: a tile may be redone)
    _spread(full, mean, M, o, Kd, o, z, z)
    xm = np.empty(n, dt)
    _rounded(sub, x, full, xm, keys[0], mode)
    _spread(full, rstd, M, o, Kd, o, z, z)
    xh = np.empty(n, dt)
    _rounded(mul, xm, full, xh, keys[1], mode)
    k = 2
    gh = g
    if has_w:
        _spread(full, w, M, o, Kd, z, z, o)
        gh = np.empty(n, dt)
        _rounded(mul, g, full, gh, keys[2], mode)
        k = 3
    full[:] = nk
    a = np.empty(n, dt)
    _rounded(mul, gh, full, a, keys[k], mode)
    b = np.empty(M, dt)
    SK._rows(gh.reshape(M, Kd), b, np.uint64(keys[k + 1]), mode, M, z)
    _rounded(mul, gh, xh, xm, keys[k + 2], mode)  # c1 (x − mean is no longer needed)
    c2 = np.empty(M, dt)
    SK._rows(xm.reshape(M, Kd), c2, np.uint64(keys[k + 3]), mode, M, z)
    _spread(full, c2, M, o, Kd, o, z, z)
    c3 = np.empty(n, dt)
    _rounded(mul, xh, full, c3, keys[k + 4], mode)
    _spread(full, b, M, o, Kd, o, z, z)
    _rounded(sub, a, full, xm, keys[k + 5], mode)  # a − b
    _rounded(sub, xm, c3, a, keys[k + 6], mode)  # inner
    k += 7
    if want_i:
        col = np.empty(M, dt)
        col[:] = nk
        r = np.empty(M, dt)
        _rounded(div, rstd, col, r, keys[k], mode)
        _spread(full, r, M, o, Kd, o, z, z)
        _rounded(mul, full, a, gi, keys[k + 1], mode)
        k += 2
    if want_w:
        _rounded(mul, g, xh, xm, keys[k], mode)
        SK.scan_columns(xm.reshape(M, Kd), gw, keys[k + 1], mode, Kd, z)
        k += 2
    if want_b:
        SK.scan_columns(g.reshape(M, Kd), gb, keys[k], mode, Kd, z)


@njit(cache=True, error_model="numpy")
def softmax_backward(g, y, keys, mode, out, M, Kd):  # pragma: no cover - compiled
    """``_softmax_backward_data`` over the last dim of the output gradient g and the
    softmax y (M·K,) in C order (the rows of K elements), binary32 at 24 bits for float32
    arrays, binary64 at 53 for float64 ones, as torch's decomposition: ``ĝ = RND(g · y)``
    (key 0), ``s = Σ_k ĝ`` (key 1, the rows' sums, ``scan_kernels._rows``), ``out =
    RND(ĝ − RND(y · s))`` (keys 2, 3); element m·K + k, s's m."""
    dt = y.dtype
    mul, sub = np.int64(K.OP_MUL), np.int64(K.OP_SUB)
    z, o = np.int64(0), np.int64(1)
    n = M * Kd
    gy = np.empty(n, dt)
    _rounded(mul, g, y, gy, keys[0], mode)
    s = np.empty(M, dt)
    SK._rows(gy.reshape(M, Kd), s, np.uint64(keys[1]), mode, M, z)
    full = np.empty(n, dt)
    _spread(full, s, M, o, Kd, o, z, z)
    p = np.empty(n, dt)
    _rounded(mul, y, full, p, keys[2], mode)
    _rounded(sub, gy, p, out, keys[3], mode)


@njit(cache=True, error_model="numpy")
def group_norm(x, w, b, has_b, N, C, HW, G, eps, keys, mode, out, mean,
               rstd):  # pragma: no cover - compiled
    """GroupNorm with a weight of x (N·C·HW,) in C order (binary32 at 24 bits for float32
    arrays, binary64 at 53 for float64 ones; every array and ``eps`` of x's dtype), as
    torch's CPU decomposition: the statistics of the N·G rows of (C/G)·HW elements as in
    :func:`layer_norm_rows` (keys 0–9, ``mean`` and ``rstd`` (N·G,)), ``scale = RND(rstd ·
    weight)`` (key 10) and ``shift = RND(−mean · scale)`` (key 11) on (N, C) (element
    n·C + c), ``shift = RND(shift + bias)`` (key 12, if a bias), then ``out = RND(RND(x ·
    scale) + shift)`` (the last two keys, element l)."""
    R = N * G
    Cg = C // G
    mul, add = np.int64(K.OP_MUL), np.int64(K.OP_ADD)  # int64s: one round_into_any per dtype
    Kd = Cg * HW
    x2 = x.reshape(R, Kd)
    _statistics(x2, eps, keys, mode, mean, rstd, np.int64(R), np.int64(0))
    n = N * C
    a = np.empty(n, x.dtype)
    c = np.empty(n, x.dtype)
    scale = np.empty(n, x.dtype)
    _spread(a, rstd, N, G, Cg, G, 1, 0)
    _spread(c, w, N, G, Cg, 0, Cg, 1)
    PW.round_into_any(mul, a, c, scale, np.uint64(keys[10]), 0, mode)
    negm = -mean
    _spread(a, negm, N, G, Cg, G, 1, 0)
    shift = np.empty(n, x.dtype)
    PW.round_into_any(mul, a, scale, shift, np.uint64(keys[11]), 0, mode)
    k = 12
    if has_b:
        _spread(c, b, N, G, Cg, 0, Cg, 1)
        PW.round_into_any(add, shift, c, a, np.uint64(keys[12]), 0, mode)
        PW.copy_into(shift, a)
        k = 13
    full = np.empty(x.size, x.dtype)
    _spread(full, scale, N, C, HW, C, 1, 0)
    t = np.empty(x.size, x.dtype)
    PW.round_into_any(mul, x, full, t, np.uint64(keys[k]), 0, mode)
    _spread(full, shift, N, C, HW, C, 1, 0)
    PW.round_into_any(add, t, full, out, np.uint64(keys[k + 1]), 0, mode)


@njit(cache=True, error_model="numpy")
def softmax_sub(x, mx, key, mode, out, rg0):  # pragma: no cover - compiled
    """``out = RND(x − max)`` of the rows of x (R, L) C-contiguous (binary32 for float32
    arrays, binary64 for float64 ones), ``mx`` (R,) the row maxima, x the rows rg0 .. rg0
    + R of a whole (int64; the whole: 0), element r·L + l of the whole (softmax's first
    rounded step)."""
    R, L = x.shape
    full = np.empty(R * L, x.dtype)
    _spread(full, mx, R, 1, L, 1, 0, 0)
    PW.round_into_any(np.int64(K.OP_SUB), x.reshape(R * L), full, out, np.uint64(key),
                      rg0 * L, mode)


@njit(cache=True, error_model="numpy")
def softmax_tail(e64, keys, mode, out, Rg, rg0):  # pragma: no cover - compiled
    """Softmax's steps after torch's float64 exp ``e64`` (R, L), L ≥ 2: ``e = RND(e64)``
    (key 0, element r·L + l; :func:`_round_result`), the row sums of e (key 1,
    ``scan_kernels._rows``), ``out = RND(e / sum)`` (key 2, element r·L + l); out (R·L,)
    of the format's dtype (float32: binary32; float64: binary64). e64 is the rows rg0 ..
    rg0 + R of an (Rg, L) whole (int64s; the whole: Rg = R, rg0 = 0), the element
    indices those of the whole."""
    R, L = e64.shape
    dt = out.dtype
    e = np.empty(R * L, dt)
    _round_result(e64.reshape(R * L), e, np.uint64(keys[0]), rg0 * L, mode)
    s = np.empty(R, dt)
    SK._rows(e.reshape(R, L), s, np.uint64(keys[1]), mode, Rg, rg0)
    full = np.empty(R * L, dt)
    _spread(full, s, R, 1, L, 1, 0, 0)
    PW.round_into_any(np.int64(K.OP_DIV), e, full, out, np.uint64(keys[2]), rg0 * L, mode)


@njit(parallel=True, cache=True, error_model="numpy")
def softmax_par(tail, x, mx, e64, keys, mode, out, parts):  # pragma: no cover - compiled
    """:func:`softmax_sub` (x (R, L), ``mx``, ``keys[0]``) or, with ``tail``,
    :func:`softmax_tail` (``e64`` (R, L), ``keys``), R ≥ ``pointwise.ROW_M_MIN``, in
    ``parts`` runs of rows on numba's threads: the same bits as one call on the whole
    (``out`` (R·L,))."""
    R, L = e64.shape if tail else x.shape
    for p in prange(parts):
        r0 = p * R // parts
        r1 = (p + 1) * R // parts
        if tail:
            softmax_tail(e64[r0:r1], keys, mode, out[r0 * L:r1 * L], np.int64(R),
                         np.int64(r0))
        else:
            softmax_sub(x[r0:r1], mx[r0:r1], keys[0], mode, out[r0 * L:r1 * L],
                        np.int64(r0))


def keys_needed(weight, bias) -> int:
    """Stream keys of the decomposition (module docstring)."""
    return 12 + (weight is not None) + (bias is not None)


def _vector_ok(p, k: int, dtype=torch.float32) -> bool:
    """A contiguous CPU tensor of k elements of ``dtype``."""
    return (isinstance(p, torch.Tensor) and p.dtype is dtype and p.is_cpu
            and p.numel() == k and p.is_contiguous())


def _affine_ok(p, k: int, dtype=torch.float32) -> bool:
    return p is None or _vector_ok(p, k, dtype)


def _input_ok(ctx, x, binary64: bool = False) -> bool:
    """A binary32 contiguous CPU input, binary32 at 24 bits in its own format on the numba
    backend; with ``binary64`` (the flag of a kernel that serves binary64:
    :data:`LAYER_NORM64`, :data:`SOFTMAX64`, :data:`GROUP_NORM64`,
    :data:`BATCH_NORM_TRAIN64`, :data:`BATCH_NORM_EVAL64`), a binary64 one at 53 bits
    too. Its size: :func:`_size_ok`."""
    if not (USE_KERNEL and ctx._numba and ctx.format is None and isinstance(x, torch.Tensor)
            and x.is_cpu and x.is_contiguous() and x.numel() > 0):
        return False
    if x.dtype is torch.float32:
        ok = ctx._t32
    else:
        ok = binary64 and x.dtype is torch.float64 and ctx.bits(torch.float64) == 53
    return ok and flop_backend(x.device) == "numba"


def _size_ok(x, splits: bool) -> bool:
    """Any input below ``kernels.PARALLEL_MIN_WORK`` elements; a larger one on one numba
    thread, or on several where the kernel splits it over them (``splits``: enough rows or
    channels for :func:`row_parts` / :func:`channel_parts`). A serial kernel leaves a
    large input on several threads to the decomposition, whose kernels use them all.
    Measured (one thread, sr, ms, decomposition / kernel): layer norm (512, 768) 3.78 /
    3.71, softmax (96, 64, 64) 3.04 / 2.81, eval batch norm (8, 64, 32, 32) 1.82 / 1.64,
    training batch norm 8.79 / 5.34, group norm of 8 groups 4.83 / 4.20; on two threads
    with the first three split 3.31 / 2.65, 2.23 / 1.76, 1.04 / 0.87."""
    return x.numel() < KN.PARALLEL_MIN_WORK or LARGE_INPUTS and (
        splits or KN.num_threads() == 1)


def _eps_ok(ctx, x, eps) -> bool:
    """An eps the scalar path holds in x's dtype (as the decomposition's ``+ eps`` reads
    it; any float for binary64)."""
    return isinstance(eps, float) and (x.dtype is torch.float64 or ctx._scalar32(x, eps))


def serves(ctx, x, normalized_shape, weight, bias, eps) -> bool:
    """The layer-norm kernel computes this call (:func:`_input_ok`, binary32 or binary64,
    at least two normalised elements per row, affine parameters of the normalised shape
    and x's dtype)."""
    if not (_input_ok(ctx, x, LAYER_NORM64) and _eps_ok(ctx, x, eps)):
        return False
    nd = len(normalized_shape)
    if nd == 0 or nd > x.dim() or tuple(x.shape[x.dim() - nd:]) != tuple(normalized_shape):
        return False
    k = math.prod(normalized_shape)
    return (k >= 2 and _affine_ok(weight, k, x.dtype) and _affine_ok(bias, k, x.dtype)
            and _size_ok(x, x.numel() // k >= PW.ROW_M_MIN))


def native_layer_norm(ctx, args, kwargs, nkeys: int):
    """``aten.native_layer_norm`` (out, mean, rstd) on the mode's stream, or None where the
    kernel does not serve the call or the decomposition drew another number of keys
    (the caller then runs the decomposition)."""
    a = _arguments(args, kwargs, ("input", "normalized_shape", "weight", "bias", "eps"))
    if a is None or not serves(ctx, *a):
        return None
    x, normalized_shape, weight, bias, eps = a
    if keys_needed(weight, bias) != nkeys:
        return None
    nd = len(normalized_shape)
    k = math.prod(normalized_shape)
    m = x.numel() // k
    stat = (*x.shape[:x.dim() - nd], *([1] * nd))
    dt = x.dtype
    npt = _NP[dt]
    out = torch.empty(x.shape, dtype=dt)
    mean = torch.empty(stat, dtype=dt)
    rstd = torch.empty(stat, dtype=dt)
    keys = ctx.stream_keys(nkeys)
    empty = np.empty(0, npt)
    w = empty if weight is None else weight.detach().numpy().reshape(k)
    b = empty if bias is None else bias.detach().numpy().reshape(k)
    args = (x.detach().numpy().reshape(m, k), w, b, weight is not None, bias is not None,
            npt(eps), keys, ctx.code, out.numpy().reshape(m, k),
            mean.numpy().reshape(m), rstd.numpy().reshape(m))
    parts = row_parts(m, x.numel(), LAYER_NORM_WORK)
    if parts > 1:
        layer_norm_par(*args, parts)
    else:
        layer_norm_rows(*args, m, 0)
    return out, mean, rstd


def native_layer_norm_backward(ctx, args, kwargs, nkeys: int):
    """``aten.native_layer_norm_backward`` as (grad_input, grad_weight, grad_bias), each
    None where ``output_mask`` (or a missing weight or bias) leaves it out, by
    :func:`layer_norm_backward`; None where the kernel does not serve the call (another
    dtype, a normalised shape covering every dim, a single row, mean and rstd not of the
    rows' count, ...) or the decomposition drew another number of keys."""
    a = _arguments(args, kwargs, ("grad_out", "input", "normalized_shape", "mean", "rstd",
                                  "weight", "bias", "output_mask"))
    if a is None or not LAYER_NORM_BACKWARD:
        return None
    g, x, normalized_shape, mean, rstd, weight, bias, mask = a
    if not (_input_ok(ctx, x, LAYER_NORM64) and _size_ok(x, False)):
        return None
    nd = len(normalized_shape)
    if not 0 < nd < x.dim() or tuple(x.shape[x.dim() - nd:]) != tuple(normalized_shape):
        return None
    dt = x.dtype
    k = math.prod(normalized_shape)
    m = x.numel() // k
    stat = (*x.shape[:x.dim() - nd], *([1] * nd))
    want = [bool(mask[0]), bool(mask[1]) and weight is not None,
            bool(mask[2]) and bias is not None] if len(mask) == 3 else None
    # (K read in x's dtype by the scalar path: exact for binary32 up to 2^24; the
    # columns' sums by the scan's tiles, which kernels.scan takes for binary64 from
    # SCAN64_MIN_COLUMNS columns)
    if (want is None or k < 2 or m < 2 or not (dt is torch.float64 or k <= 1 << 24)
            or (dt is torch.float64 and not (KN.SCAN64_FAST and k >= KN.SCAN64_MIN_COLUMNS))
            or not (isinstance(g, torch.Tensor) and g.shape == x.shape and g.dtype is dt
                    and g.is_cpu)
            or not all(isinstance(v, torch.Tensor) and v.shape == stat and v.dtype is dt
                       and v.is_cpu for v in (mean, rstd))
            or not (_affine_ok(weight, k, dt) and _affine_ok(bias, k, dt))
            or 9 + (weight is not None) + 2 * want[0] + 2 * want[1] + want[2] != nkeys):
        return None
    npt = _NP[dt]
    gi = torch.empty(x.shape, dtype=dt) if want[0] else None
    gw = torch.empty(weight.shape, dtype=dt) if want[1] else None
    gb = torch.empty(bias.shape, dtype=dt) if want[2] else None
    keys = ctx.stream_keys(nkeys)
    empty = np.empty(0, npt)

    def arr(t):
        return empty if t is None else t.detach().contiguous().numpy().reshape(-1)

    layer_norm_backward(arr(g), arr(x), arr(weight), weight is not None, arr(mean), arr(rstd),
                        npt(k), keys, ctx.code, arr(gi), want[0], arr(gw), want[1], arr(gb),
                        want[2], m, k)
    return gi, gw, gb


def row_parts(rows: int, elems: int, work: int) -> int:
    """Runs of rows a layer norm or a softmax of ``rows`` rows and ``elems`` elements is
    split into (one per numba thread: :func:`layer_norm_par`, :func:`softmax_par`),
    or 1 (one call on the calling thread): 1 with one thread, with fewer than
    ``pointwise.ROW_M_MIN`` rows (their sums are one scan, not per-row blocks), or below
    ``kernels.PARALLEL_MIN_WORK`` contraction terms' worth of time (``work`` per
    element: :data:`LAYER_NORM_WORK`, :data:`SOFTMAX_WORK`). Results do not depend on
    it."""
    return thread_parts(rows, PW.ROW_M_MIN, elems, work)


def channel_parts(channels: int, elems: int, work: int) -> int:
    """Runs of channels an eval batch norm of ``channels`` channels and ``elems``
    elements is split into (one per numba thread: :func:`batch_norm_eval_par`), or 1:
    with one thread, one channel, or below ``kernels.PARALLEL_MIN_WORK`` contraction
    terms' worth of time (``work`` per element: :data:`BATCH_NORM_WORK`). Results do not
    depend on it."""
    return thread_parts(channels, 2, elems, work)


def thread_parts(units: int, fewest: int, elems: int, work: int) -> int:
    """One run per numba thread, at most one per unit (row, channel, plane), or 1: with one
    thread, fewer than ``fewest`` units, or ``elems`` elements of ``work`` terms each
    below ``kernels.PARALLEL_MIN_WORK``."""
    n = KN.num_threads()
    if n < 2 or units < fewest or elems * work < KN.PARALLEL_MIN_WORK:
        return 1
    return min(n, units)


def _arguments(args, kwargs, names, defaults=None):
    """The op's arguments by schema position (``names``), keyword ones and ``defaults``
    filled in; None when one is missing (the caller then declines)."""
    vals = list(args)
    for n in names[len(args):]:
        if n in kwargs:
            vals.append(kwargs[n])
        elif defaults and n in defaults:
            vals.append(defaults[n])
        else:
            return None
    return vals


def native_batch_norm(ctx, args, kwargs, nkeys: int):
    """``aten.native_batch_norm`` in eval (``training=False``: running statistics) as
    (out, save_mean, save_invstd), the last two empty as torch's CPU decomposition gives
    them, or in training (:func:`_batch_norm_train`: batch statistics, the running ones
    updated in place where given); None where the kernels do not serve the call
    (missing running statistics in eval, another dtype, ...) or the decomposition drew
    another number of keys."""
    a = _arguments(args, kwargs, ("input", "weight", "bias", "running_mean", "running_var",
                                  "training", "momentum", "eps"))
    if a is None:
        return None
    x, weight, bias, rmean, rvar, training, momentum, eps = a
    if training:
        return _batch_norm_train(ctx, x, weight, bias, rmean, rvar, momentum, eps, nkeys)
    return _batch_norm_eval(ctx, x, weight, bias, rmean, rvar, eps, nkeys)


def batch_norm_no_training(ctx, args, kwargs, nkeys: int):
    """``aten._native_batch_norm_legit_no_training`` (the same computation)."""
    a = _arguments(args, kwargs, ("input", "weight", "bias", "running_mean", "running_var",
                                  "momentum", "eps"))
    if a is None:
        return None
    x, weight, bias, rmean, rvar, _, eps = a
    return _batch_norm_eval(ctx, x, weight, bias, rmean, rvar, eps, nkeys)


def _train_keys(weight, bias, rmean, rvar) -> int:
    """Stream keys of training batch norm's decomposition (:func:`batch_norm_train`)."""
    return (12 + 3 * (rmean is not None) + 4 * (rvar is not None) + (weight is not None)
            + (bias is not None))


def _training_shape(ctx, x, eps):
    """(N, C, S) of an input that :func:`batch_norm_train` and :func:`batch_norm_backward`
    take (:data:`BATCH_NORM_TRAIN64` for binary64; serial: :func:`_size_ok`), or None."""
    if (not (_input_ok(ctx, x, BATCH_NORM_TRAIN64) and _eps_ok(ctx, x, eps)) or x.dim() < 2
            or not _size_ok(x, False)):
        return None
    N, C = x.shape[0], x.shape[1]
    return N, C, x.numel() // (N * C)


def _batch_norm_train(ctx, x, weight, bias, rmean, rvar, momentum, eps, nkeys):
    """``native_batch_norm`` in training as (out, save_mean (C,), save_invstd (C,)), the
    running statistics (where given) updated in place; None where the kernel does not
    serve the call. Without :data:`BATCH_NORM_TRAIN`, one sample without running
    statistics only (InstanceNorm's call, whose input arrives as (1, N·C, *S))."""
    shape = _training_shape(ctx, x, eps)
    if shape is None:
        return None
    N, C, S = shape
    dt = x.dtype
    running = rmean is not None or rvar is not None
    if (N * S < 2 or not BATCH_NORM_TRAIN and (N != 1 or running)
            or not all(_affine_ok(p, C, dt) for p in (weight, bias, rmean, rvar))
            or _train_keys(weight, bias, rmean, rvar) != nkeys):
        return None
    npt = _NP[dt]
    scalars = (0.0, 1.0, 1.0)
    if running:
        # the decomposition's Python numbers (momentum, 1 − momentum, n / (n − 1)), which
        # its tensor-scalar products read in x's dtype (:func:`_eps_ok`'s rule)
        n = x.numel() / x.shape[1]
        scalars = (momentum, 1 - momentum, n / (n - 1))
        if not (type(momentum) is float and all(_eps_ok(ctx, x, v) for v in scalars)):
            return None
    out = torch.empty(x.shape, dtype=dt)
    mean = torch.empty(C, dtype=dt)
    rstd = torch.empty(C, dtype=dt)
    keys = ctx.stream_keys(nkeys)
    empty = np.empty(0, npt)

    def arr(p):
        return empty if p is None else p.detach().numpy()

    batch_norm_train(x.detach().numpy().reshape(-1), arr(weight), arr(bias), weight is not None,
                     bias is not None, arr(rmean), arr(rvar), rmean is not None,
                     rvar is not None, *(npt(v) for v in scalars), npt(eps), keys, ctx.code,
                     out.numpy().reshape(-1), mean.numpy(), rstd.numpy(), N, C, S)
    return out, mean, rstd


def batch_norm_backward_op(ctx, args, kwargs, nkeys: int):
    """``aten.native_batch_norm_backward`` as (grad_input, grad_weight, grad_bias) (the
    last two None where ``output_mask`` leaves them out) by :func:`batch_norm_backward`;
    None where the kernel does not serve the call (another dtype or layout, a mask
    without grad_input, ...) or the decomposition drew another number of keys."""
    a = _arguments(args, kwargs, ("grad_out", "input", "weight", "running_mean",
                                  "running_var", "save_mean", "save_invstd", "train", "eps",
                                  "output_mask"))
    if a is None or not BATCH_NORM_BACKWARD:
        return None
    g, x, weight, rmean, rvar, smean, sinv, train, eps, mask = a
    shape = _training_shape(ctx, x, eps)
    if shape is None:
        return None
    N, C, S = shape
    dt = x.dtype
    mean, inv = (smean, sinv) if train else (rmean, rvar)
    if not (isinstance(g, torch.Tensor) and g.shape == x.shape and g.dtype is dt and g.is_cpu
            and _vector_ok(mean, C, dt) and _vector_ok(inv, C, dt)
            and _affine_ok(weight, C, dt) and len(mask) == 3 and mask[0]
            and 14 - 2 * (not train) + bool(mask[1]) == nkeys):
        return None
    norm = 1.0 / (x.numel() / C)  # the decomposition's Python number
    if not _eps_ok(ctx, x, norm):
        return None
    npt = _NP[dt]
    gi = torch.empty(x.shape, dtype=dt)
    gw = torch.empty(C, dtype=dt) if mask[1] else None
    gb = torch.empty(C, dtype=dt)
    keys = ctx.stream_keys(nkeys)
    empty = np.empty(0, npt)
    invstd = inv.detach().numpy() if train else np.empty(C, npt)
    batch_norm_backward(g.detach().contiguous().numpy().reshape(-1),
                        x.detach().numpy().reshape(-1),
                        empty if weight is None else weight.detach().numpy(),
                        weight is not None, mean.detach().numpy(), invstd,
                        empty if train else inv.detach().numpy(), bool(train), npt(eps),
                        npt(norm), keys, ctx.code, gi.numpy().reshape(-1),
                        empty if gw is None else gw.numpy(), bool(mask[1]), gb.numpy(),
                        N, C, S)
    return gi, gw, gb if mask[2] else None


def _batch_norm_eval(ctx, x, weight, bias, rmean, rvar, eps, nkeys):
    if (not (_input_ok(ctx, x, BATCH_NORM_EVAL64) and _eps_ok(ctx, x, eps)) or x.dim() < 2
            or not _size_ok(x, x.shape[1] >= 2)):
        return None
    N, C = x.shape[0], x.shape[1]
    dt = x.dtype
    if not (_vector_ok(rmean, C, dt) and _vector_ok(rvar, C, dt) and _affine_ok(weight, C, dt)
            and _affine_ok(bias, C, dt)) or 6 + (weight is not None) + (bias is not None) != nkeys:
        return None
    S = x.numel() // (N * C)
    npt = _NP[dt]
    out = torch.empty(x.shape, dtype=dt)
    keys = ctx.stream_keys(nkeys)
    empty = np.empty(0, npt)
    w = empty if weight is None else weight.detach().numpy()
    b = empty if bias is None else bias.detach().numpy()
    args = (x.detach().numpy().reshape(-1), w, b, weight is not None, bias is not None,
            rmean.detach().numpy(), rvar.detach().numpy(), npt(eps), keys, ctx.code,
            out.numpy().reshape(-1), N, C, S)
    parts = channel_parts(C, x.numel(), BATCH_NORM_WORK)
    if parts > 1:
        batch_norm_eval_par(*args, parts)
    else:
        batch_norm_eval(*args)
    return out, x.new_zeros((0,)), x.new_zeros((0,))


def softmax(ctx, args, kwargs, nkeys: int):
    """``aten._softmax`` over the last dim: torch's decomposition (``amax``, ``x − max``,
    ``exp``, ``sum``, ``/ sum``; four keys) with its exact steps (amax, the float64 exp
    that the flop ``exp`` rounds once) run by torch and its rounded steps in two
    compiled calls; None where not served."""
    a = _arguments(args, kwargs, ("self", "dim", "half_to_float"))
    if a is None or a[2]:
        return None
    return _softmax_last(ctx, a[0], a[1], nkeys)


def safe_softmax(ctx, args, kwargs, nkeys: int):
    """``aten._safe_softmax`` (softmax, then 0 on rows that are all −inf: exact)."""
    a = _arguments(args, kwargs, ("self", "dim", "dtype"), {"dtype": None})
    if a is None or a[2] is not None:
        return None
    x, dim, _ = a
    res = _softmax_last(ctx, x, dim, nkeys, maxima=True)
    if res is None:
        return None
    out, mx = res
    # rows that are all −inf (the decomposition's eq(−inf).all()): the rows whose maximum
    # is −inf (a NaN makes both false), found from softmax's own maxima; 0 there
    dead = (mx == float("-inf")).reshape(*x.shape[:-1], 1)
    if bool(dead.any()):
        out = torch.where(dead, torch.zeros((), dtype=out.dtype), out)
    return out


def softmax_backward_op(ctx, args, kwargs, nkeys: int):
    """``aten._softmax_backward_data`` over the last dim (:func:`softmax_backward`, four
    keys), its result contiguous as the decomposition's; None where not served: another
    dim, an input dtype other than the gradient's, operands whose strides are not in C
    order (the decomposition's product, whose rows it sums, would not be contiguous)."""
    a = _arguments(args, kwargs, ("grad_output", "output", "dim", "input_dtype"))
    if a is None or not SOFTMAX_BACKWARD or nkeys != 4:
        return None
    g, y, dim, input_dtype = a
    if not (isinstance(dim, int) and isinstance(y, torch.Tensor) and y.dim() > 0
            and y.shape[-1] >= 2 and LK.c_ordered(y)):
        return None
    yc = y.detach().contiguous()
    if (not _input_ok(ctx, yc, SOFTMAX64) or not _size_ok(yc, False)
            or dim % y.dim() != y.dim() - 1
            or not (isinstance(g, torch.Tensor) and g.shape == y.shape and g.is_cpu
                    and g.dtype is y.dtype is input_dtype and LK.c_ordered(g))):
        return None
    L = y.shape[-1]
    out = torch.empty(y.shape, dtype=y.dtype)
    softmax_backward(LK.flat32(g), yc.view(-1).numpy(), ctx.stream_keys(4), ctx.code,
                     out.numpy().reshape(-1), y.numel() // L, L)
    return out


def _softmax_last(ctx, x, dim, nkeys, maxima: bool = False):
    """The softmax over the last dim (None where not served); with ``maxima``, (out, the
    row maxima (R,))."""
    if (nkeys != 4 or not isinstance(dim, int) or not _input_ok(ctx, x, SOFTMAX64)
            or x.dim() == 0 or dim % x.dim() != x.dim() - 1 or x.shape[-1] < 2
            or not _size_ok(x, x.numel() // x.shape[-1] >= PW.ROW_M_MIN)):
        return None
    L = x.shape[-1]
    R = x.numel() // L
    x2 = x.detach().reshape(R, L)
    mx = torch.amax(x2, -1)
    keys = ctx.stream_keys(4)
    d = torch.empty(x.shape, dtype=x.dtype)
    parts = row_parts(R, x.numel(), SOFTMAX_WORK)
    xa, ma, da = x2.numpy(), mx.numpy(), d.numpy().reshape(-1)
    if parts > 1:
        softmax_par(False, xa, ma, np.empty((0, L)), keys, ctx.code, da, parts)
    else:
        softmax_sub(xa, ma, keys[0], ctx.code, da, 0)
    e64 = torch.exp(d.double())  # (a float64 d is itself: its exp, which op_once rounds)
    out = torch.empty(x.shape, dtype=x.dtype)
    ea, oa = e64.numpy().reshape(R, L), out.numpy().reshape(-1)
    if parts > 1:
        softmax_par(True, xa, ma, ea, keys[1:], ctx.code, oa, parts)
    else:
        softmax_tail(ea, keys[1:], ctx.code, oa, R, 0)
    return (out, mx) if maxima else out


def native_group_norm(ctx, args, kwargs, nkeys: int):
    """``aten.native_group_norm`` with a weight (torch's CPU decomposition then folds the
    statistics and the affine parameters into a per-channel scale and shift) as (out,
    mean, rstd); None where the kernel does not serve the call (no weight, fewer than
    two elements per group, ...) or the decomposition drew another number of keys."""
    a = _arguments(args, kwargs, ("input", "weight", "bias", "N", "C", "HxW", "group", "eps"))
    if a is None:
        return None
    x, weight, bias, N, C, HW, G, eps = a
    if (not (_input_ok(ctx, x, GROUP_NORM64) and _eps_ok(ctx, x, eps) and _size_ok(x, False))
            or weight is None
            or not all(isinstance(v, int) for v in (N, C, HW, G))):
        return None
    dt = x.dtype
    if (G < 1 or C % G or N * C * HW != x.numel() or (C // G) * HW < 2
            or not _vector_ok(weight, C, dt) or not _affine_ok(bias, C, dt)
            or 14 + (bias is not None) != nkeys):
        return None
    npt = _NP[dt]
    out = torch.empty(x.shape, dtype=dt)
    mean = torch.empty((N, G), dtype=dt)
    rstd = torch.empty((N, G), dtype=dt)
    keys = ctx.stream_keys(nkeys)
    b = np.empty(0, npt) if bias is None else bias.detach().numpy()
    group_norm(x.detach().numpy().reshape(-1), weight.detach().numpy(), b, bias is not None,
               N, C, HW, G, npt(eps), keys, ctx.code, out.numpy().reshape(-1),
               mean.numpy().reshape(-1), rstd.numpy().reshape(-1))
    return out, mean, rstd
