"""``hardswish`` and ``hardsigmoid`` at flop granularity in one compiled call (binary32).

Both are decomposed at flop granularity (torch's decompositions, replayed after the
first call): ``x * clamp(clamp(x + 3, min=0), max=6) / 6`` and ``clamp(clamp(x + 3,
min=0), max=6) / 6``, five and four dispatched sub-ops of which three and two round
(the sum, the product, the quotient; the clamps are exact). Each sub-op is a full-size
pass through the mode with its own Python, allocation and kernel call: MobileNetV3's
activations took about 120 µs (hardswish) and 90 µs (hardsigmoid) each at flop SR on
its zoo shapes, a few µs of which were arithmetic.

:func:`hardswish` and :func:`hardsigmoid`, in the mode's table of fused paths
(``numvar.instrument.mode._FUSED``), draw the keys the decomposition draws (one per
rounded sub-op, in its order) and run its roundings in one compiled call
(:func:`_hard32`): per chunk of :data:`CHUNK` elements the sum, the clamps, the product
and the quotient, each rounding by ``pointwise.round_into`` with its op's key and the
element's index in the (C-order) result, the elementwise kernels' arithmetic. The same
bits as the decomposition, which stays the reference (``USE_KERNEL = False``; the mode
also takes it where these decline: another dtype or device, a target format, a
virtual precision, a key count other than the decomposition's, or a tensor of
``kernels.PARALLEL_MIN_WORK`` elements or more on several threads: the kernel is serial,
a parallel one compiled in 8 s against 5).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K

from . import kernels as KN
from . import linalg_kernels as LK
from .pointwise import round_into

#: take the compiled kernel where it serves (False: the decomposition, the reference)
USE_KERNEL = True
#: elements per chunk of :func:`_hard32` (its four buffers stay in L1/L2)
CHUNK = 4096
#: the keys each decomposition draws at flop granularity (its rounded sub-ops)
HARDSWISH_KEYS = 3
HARDSIGMOID_KEYS = 2


@njit(cache=True, error_model="numpy")
def _hard32(x, out, keys, swish, mode):  # pragma: no cover - compiled
    """``out = RND(RND(x · c) / 6)`` (``swish``) or ``RND(c / 6)``, c = clamp(RND(x + 3),
    0, 6) (a NaN stays NaN, as torch's clamp keeps it), for the binary32 arrays ``x``
    and ``out`` (1-D, same size): the sum with ``keys[0]``, the product with ``keys[1]``
    (``swish``), the quotient with the last key, each at the element's index."""
    n = x.size
    kq = keys[2] if swish else keys[1]
    for c in range((n + CHUNK - 1) // CHUNK):
        c0 = c * CHUNK
        c1 = min(n, c0 + CHUNK)
        m = c1 - c0
        xs = x[c0:c1]
        cst = np.full(m, np.float32(3.0))
        t = np.empty(m, np.float32)
        round_into(K.OP_ADD, xs, cst, t, keys[0], c0, mode)
        for j in range(m):
            v = t[j]
            if v < 0.0:  # (comparisons false for a NaN: it passes through)
                v = np.float32(0.0)
            if v > 6.0:
                v = np.float32(6.0)
            t[j] = v
        cst[:] = np.float32(6.0)
        if swish:
            p = np.empty(m, np.float32)
            round_into(K.OP_MUL, xs, t, p, keys[1], c0, mode)
            round_into(K.OP_DIV, p, cst, out[c0:c1], kq, c0, mode)
        else:
            round_into(K.OP_DIV, t, cst, out[c0:c1], kq, c0, mode)


def _run(ctx, args, kwargs, nkeys: int, swish: bool):
    if kwargs or len(args) != 1:
        return None
    x = args[0]
    want = HARDSWISH_KEYS if swish else HARDSIGMOID_KEYS
    if (not USE_KERNEL or nkeys != want or not isinstance(x, torch.Tensor)
            or x.dtype is not torch.float32 or not LK.serves(ctx, x)
            or (x.numel() >= KN.PARALLEL_MIN_WORK and numba.get_num_threads() > 1)):
        return None  # (large tensors on several threads: the decomposition's parallel kernels)
    xc = x.detach().contiguous()
    out = torch.empty(x.shape, dtype=torch.float32)
    keys = np.zeros(3, np.uint64)
    keys[:want] = ctx.stream_keys(want)
    _hard32(xc.view(-1).numpy(), out.view(-1).numpy(), keys, swish, ctx.code)
    return out


def hardswish(ctx, args, kwargs, nkeys: int):
    """``aten.hardswish`` of a binary32 CPU tensor as its decomposition computes it at
    flop granularity (three keys), or None (the decomposition runs)."""
    return _run(ctx, args, kwargs, nkeys, True)


def hardsigmoid(ctx, args, kwargs, nkeys: int):
    """``aten.hardsigmoid`` of a binary32 CPU tensor as its decomposition computes it at
    flop granularity (two keys), or None (the decomposition runs)."""
    return _run(ctx, args, kwargs, nkeys, False)
