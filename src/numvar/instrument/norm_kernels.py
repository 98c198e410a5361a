"""numba kernel of ``aten.native_layer_norm`` at flop granularity (binary32).

At flop granularity LayerNorm runs torch's decomposition with the mode re-entered:
``var_mean`` (``prims.var``: six tensor steps, ``prims.sum``, ``prims.div``), ``+ eps``,
``rsqrt``, ``− mean``, ``· rstd``, ``· weight``, ``+ bias``: fourteen rounded sub-ops, each
a dispatch, a handler and a kernel call (about 25 µs of Python each against a few µs of
arithmetic on a transformer's activations: docs/speed.md). :func:`layer_norm32` runs the
same steps in one compiled call. The stream keys the decomposition would draw are drawn
beforehand in the same order and every step uses its key and its element indices (the
rows x viewed as (M, K), K the normalised size, m·K + k for element (m, k)):

=====  ==========================  ==========================================
key    step                        kernel (element indices)
=====  ==========================  ==========================================
0–5    ``prims.var`` (biased)      ``scan_kernels.rowvar32`` (its own indices)
6      ``prims.sum``               ``scan_kernels._rows`` (element (k, m): k·M + m)
7      ``prims.div`` by K          ``pointwise.round_into`` (element m)
8      ``+ eps`` (eps as binary32)  ``round_into`` (element m)
9      ``rsqrt``                   float64 ``1/sqrt``, ``pointwise._roundtile`` (m)
10     ``x − mean``                ``round_into`` (m·K + k)
11     ``· rstd``                  ``round_into`` (m·K + k)
12     ``· weight`` (if any)       ``round_into`` (m·K + k)
12/13  ``+ bias`` (if any)         ``round_into`` (m·K + k)
=====  ==========================  ==========================================

``rsqrt`` at flop is "the float64 result rounded once" (``handlers.op_once``): torch's
float64 rsqrt is ``1 / sqrt(x)``, two correctly rounded IEEE operations, which is what
the kernel computes. The mode's ``_fused`` takes this kernel only after the
decomposition ran once with the same signature and drew the same number of keys; the
report then counts the same sub-ops. Same bits for the same seed: tested against the
decomposition (``USE_KERNEL = False``) in every rounding mode, with non-finite values,
with and without weight and bias (``tests/test_instrument_norm_kernels.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K

from . import kernels as KN
from . import pointwise as PW
from . import scan_kernels as SK
from .flop import flop_backend

#: take the kernel (False: the decomposition, op by op: the slow reference)
USE_KERNEL = True

@njit(cache=True, error_model="numpy")
def layer_norm32(x, w, b, has_w, has_b, eps, keys, mode, out, mean, rstd):  # pragma: no cover
    """LayerNorm of the rows of x (M, K) float32 C-contiguous, K ≥ 2, binary32 at 24 bits:
    ``out`` (M, K), ``mean`` and ``rstd`` (M,), with the keys and indices of the module
    docstring. ``w``, ``b``: (K,) float32 (read only when ``has_w`` / ``has_b``)."""
    M, Kd = x.shape
    var = np.empty(M, np.float32)
    SK.rowvar32(x, keys[0:6], np.float32(Kd), np.float32(Kd), mode, var)
    s = np.empty(M, np.float32)
    SK._rows(x, s, np.uint64(keys[6]), mode)
    col = np.empty(M, np.float32)
    col[:] = np.float32(Kd)
    PW.round_into(K.OP_DIV, s, col, mean, np.uint64(keys[7]), 0, mode)
    col[:] = eps
    ve = np.empty(M, np.float32)
    PW.round_into(K.OP_ADD, var, col, ve, np.uint64(keys[8]), 0, mode)
    h = np.empty(M)
    for m in range(M):
        h[m] = 1.0 / np.sqrt(np.float64(ve[m]))
    PW._roundtile(h, rstd, np.uint64(keys[9]), 0, mode)
    # whole-array passes (element m·K + k of the C-order arrays), operands broadcast
    # into full arrays: one round_into call per step, not one per row
    n = M * Kd
    xf = x.reshape(n)
    full = np.empty((M, Kd), np.float32)
    for m in range(M):
        full[m, :] = mean[m]
    d = np.empty(n, np.float32)
    PW.round_into(K.OP_SUB, xf, full.reshape(n), d, np.uint64(keys[10]), 0, mode)
    for m in range(M):
        full[m, :] = rstd[m]
    of = out.reshape(n)
    last = has_w or has_b
    e = np.empty(n, np.float32) if last else of
    PW.round_into(K.OP_MUL, d, full.reshape(n), e, np.uint64(keys[11]), 0, mode)
    if not last:
        return
    k = 12
    if has_w:
        for m in range(M):
            full[m, :] = w
        PW.round_into(K.OP_MUL, e, full.reshape(n), d if has_b else of, np.uint64(keys[k]), 0,
                      mode)
        k += 1
        e, d = d, e
    if has_b:
        for m in range(M):
            full[m, :] = b
        PW.round_into(K.OP_ADD, e, full.reshape(n), of, np.uint64(keys[k]), 0, mode)


def keys_needed(weight, bias) -> int:
    """Stream keys of the decomposition (module docstring)."""
    return 12 + (weight is not None) + (bias is not None)


def _affine_ok(p, k: int) -> bool:
    return p is None or (isinstance(p, torch.Tensor) and p.dtype is torch.float32 and p.is_cpu
                         and p.numel() == k and p.is_contiguous())


def serves(ctx, x, normalized_shape, weight, bias, eps) -> bool:
    """The kernel computes this call: binary32 contiguous CPU input (and affine
    parameters) at 24 bits in its own format, numba backend, at least two normalised
    elements per row, fewer elements than ``kernels.PARALLEL_MIN_WORK`` (the kernel is
    serial; above it the decomposition's kernels run on every thread), an ``eps`` that
    the scalar path holds in binary32."""
    if not (USE_KERNEL and ctx._t32 and ctx._numba and ctx.format is None
            and isinstance(x, torch.Tensor) and x.dtype is torch.float32 and x.is_cpu
            and x.is_contiguous() and isinstance(eps, float) and ctx._scalar32(x, eps)):
        return False
    nd = len(normalized_shape)
    if nd == 0 or nd > x.dim() or tuple(x.shape[x.dim() - nd:]) != tuple(normalized_shape):
        return False
    k = math.prod(normalized_shape)
    return (k >= 2 and 0 < x.numel() < KN.PARALLEL_MIN_WORK and _affine_ok(weight, k)
            and _affine_ok(bias, k) and flop_backend(x.device) == "numba")


def native_layer_norm(ctx, args, kwargs, nkeys: int):
    """``aten.native_layer_norm`` (out, mean, rstd) on the mode's stream, or None where the
    kernel does not serve the call or the decomposition drew another number of keys
    (the caller then runs the decomposition)."""
    x, normalized_shape, weight, bias, eps = _arguments(args, kwargs)
    if not serves(ctx, x, normalized_shape, weight, bias, eps):
        return None
    if keys_needed(weight, bias) != nkeys:
        return None
    nd = len(normalized_shape)
    k = math.prod(normalized_shape)
    m = x.numel() // k
    stat = (*x.shape[:x.dim() - nd], *([1] * nd))
    out = torch.empty(x.shape, dtype=torch.float32)
    mean = torch.empty(stat, dtype=torch.float32)
    rstd = torch.empty(stat, dtype=torch.float32)
    keys = np.array([ctx.stream.next_key() for _ in range(nkeys)], dtype=np.uint64)
    empty = np.empty(0, np.float32)
    w = empty if weight is None else weight.detach().numpy().reshape(k)
    b = empty if bias is None else bias.detach().numpy().reshape(k)
    layer_norm32(x.detach().numpy().reshape(m, k), w, b, weight is not None, bias is not None,
                 np.float32(eps), keys, ctx.code, out.numpy().reshape(m, k),
                 mean.numpy().reshape(m), rstd.numpy().reshape(m))
    return out, mean, rstd


def _arguments(args, kwargs):
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    return tuple(list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs])
