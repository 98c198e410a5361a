"""``hardswish`` and ``hardsigmoid`` and their backward, and the backward of ``sigmoid``
and ``tanh``, at flop granularity in one compiled call each (binary32).

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

The backward ops likewise (:func:`hardswish_backward`, :func:`hardsigmoid_backward`;
:func:`_hard_backward32`): their decompositions, ``where(x <= −3, 0, where(x < 3, g ·
RND(RND(x / 3) + 0.5), g))`` (three keys) and ``where(−3 < x < 3, RND(g · 1/6), 0)``
(one), round every element whatever branch keeps it, and so does the kernel. In a
training step of MobileNetV3 at flop SR they took 3.1 and 0.9 ms of 58 (17 and 8 calls,
one thread), nine and five dispatched sub-ops each.

``sigmoid_backward`` and ``tanh_backward`` (:func:`sigmoid_backward`,
:func:`tanh_backward`; :func:`_sigmoid_tanh_backward32`) likewise: their decompositions
``g · (y · (1 − y))`` and ``g · (1 − y · y)`` round three times (three keys), the kernel
in the same order at the same indices. A recurrent layer's training step calls them on
slices of its gates (an LSTM at the zoo's bench size: 120 and 80 calls of 128 elements
per step, four and five dispatched sub-ops each), so they take operands whose strides
are in C order (``linalg_kernels.c_ordered``), not only contiguous ones: the
decomposition's result is contiguous for those too.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K

from . import kernels as KN
from . import linalg_kernels as LK
from .pointwise import round_into

#: take the compiled kernel where it serves (False: the decomposition, the reference)
USE_KERNEL = True
#: the same for the backward ops (False: their decompositions, as before they had one)
USE_BACKWARD_KERNEL = True
#: elements per chunk of :func:`_hard32` (its four buffers stay in L1/L2)
CHUNK = 4096
#: the keys each decomposition draws at flop granularity (its rounded sub-ops)
HARDSWISH_KEYS = 3
HARDSIGMOID_KEYS = 2
HARDSWISH_BACKWARD_KEYS = 3
HARDSIGMOID_BACKWARD_KEYS = 1
SIGMOID_TANH_BACKWARD_KEYS = 3


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


@njit(cache=True, error_model="numpy")
def _hard_backward32(g, x, out, keys, swish, mode):  # pragma: no cover - compiled
    """The backward of hardswish (``swish``) or hardsigmoid for the binary32 arrays ``g``
    (the output's gradient), ``x`` and ``out`` (1-D, same size), as the decompositions:
    hardswish ``out = 0`` where x ≤ −3, ``RND(g · RND(RND(x / 3) + 0.5))`` where x < 3
    (keys 0, 1, 2), else g (a NaN x too); hardsigmoid ``RND(g · RND_nearest(1/6))``
    where −3 < x < 3 (key 0), else 0. Every element is rounded at its index, kept or
    not."""
    n = x.size
    for c in range((n + CHUNK - 1) // CHUNK):
        c0 = c * CHUNK
        c1 = min(n, c0 + CHUNK)
        m = c1 - c0
        xs = x[c0:c1]
        gs = g[c0:c1]
        o = out[c0:c1]
        cst = np.empty(m, np.float32)
        p = np.empty(m, np.float32)
        if swish:
            q = np.empty(m, np.float32)
            cst[:] = np.float32(3.0)
            round_into(K.OP_DIV, xs, cst, q, keys[0], c0, mode)
            cst[:] = np.float32(0.5)
            round_into(K.OP_ADD, q, cst, p, keys[1], c0, mode)
            round_into(K.OP_MUL, gs, p, q, keys[2], c0, mode)
            for j in range(m):
                v = xs[j]
                if v <= -3.0:
                    o[j] = np.float32(0.0)
                elif v < 3.0:
                    o[j] = q[j]
                else:  # (a NaN too: both comparisons false)
                    o[j] = gs[j]
        else:
            cst[:] = np.float32(1.0 / 6.0)
            round_into(K.OP_MUL, gs, cst, p, keys[0], c0, mode)
            for j in range(m):
                v = xs[j]
                o[j] = p[j] if v > -3.0 and v < 3.0 else np.float32(0.0)


@njit(cache=True, error_model="numpy")
def _sigmoid_tanh_backward32(g, y, out, keys, tanh, mode):  # pragma: no cover - compiled
    """The backward of sigmoid or of tanh (``tanh``) from the binary32 arrays ``g`` (the
    output's gradient), ``y`` (the forward's output) and ``out`` (1-D, same size), as
    the decompositions: sigmoid ``RND(g · RND(y · RND(1 − y)))``, tanh ``RND(g · RND(1 −
    RND(y · y)))``, the inner rounding with ``keys[0]``, the next with ``keys[1]``, the
    product by g with ``keys[2]``, each at the element's index."""
    n = y.size
    for c in range((n + CHUNK - 1) // CHUNK):
        c0 = c * CHUNK
        c1 = min(n, c0 + CHUNK)
        m = c1 - c0
        ys = y[c0:c1]
        one = np.full(m, np.float32(1.0))
        p = np.empty(m, np.float32)
        q = np.empty(m, np.float32)
        if tanh:
            round_into(K.OP_MUL, ys, ys, p, keys[0], c0, mode)
            round_into(K.OP_SUB, one, p, q, keys[1], c0, mode)
        else:
            round_into(K.OP_SUB, one, ys, p, keys[0], c0, mode)
            round_into(K.OP_MUL, ys, p, q, keys[1], c0, mode)
        round_into(K.OP_MUL, g[c0:c1], q, out[c0:c1], keys[2], c0, mode)


def _served(ctx, x) -> bool:
    """A binary32 CPU tensor the serial kernels take (module docstring)."""
    return (USE_KERNEL and isinstance(x, torch.Tensor) and x.dtype is torch.float32
            and LK.serves(ctx, x)
            and not (x.numel() >= KN.PARALLEL_MIN_WORK and KN.num_threads() > 1))


def _backward_operands(ctx, args, kwargs, nkeys: int, want: int):
    """(g, x, out, keys) for a backward kernel of ``aten.<op>_backward(g, x)`` (x the
    forward's input or output) that draws ``want`` keys, or None where it declines: x
    with strides in C order (``linalg_kernels.c_ordered``), g of x's shape, the same or
    one value broadcast (a sum's gradient), so that the decomposition's result is
    contiguous, as the kernel's."""
    if kwargs or len(args) != 2:
        return None
    g, x = args
    if (not USE_BACKWARD_KERNEL or nkeys != want or not _served(ctx, x)
            or not LK.c_ordered(x) or not isinstance(g, torch.Tensor)
            or g.dtype is not torch.float32 or g.shape != x.shape or not g.is_cpu
            or not (LK.c_ordered(g) or not any(g.stride()))):
        return None
    out = torch.empty(x.shape, dtype=torch.float32)
    keys = np.zeros(3, np.uint64)
    keys[:want] = ctx.stream_keys(want)
    return LK.flat32(g), LK.flat32(x), out, keys


def _run_backward(ctx, args, kwargs, nkeys: int, want: int, kernel, which: bool):
    """``kernel(g, x, out, keys, which, mode)`` on :func:`_backward_operands`' arrays, or
    None where those decline."""
    ops = _backward_operands(ctx, args, kwargs, nkeys, want)
    if ops is None:
        return None
    g, x, out, keys = ops
    kernel(g, x, out.view(-1).numpy(), keys, which, ctx.code)
    return out


def _run(ctx, args, kwargs, nkeys: int, swish: bool):
    if kwargs or len(args) != 1:
        return None
    x = args[0]
    want = HARDSWISH_KEYS if swish else HARDSIGMOID_KEYS
    if nkeys != want or not _served(ctx, x):
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


def hardswish_backward(ctx, args, kwargs, nkeys: int):
    """``aten.hardswish_backward`` of binary32 CPU tensors as its decomposition computes it
    at flop granularity (three keys), or None (the decomposition runs)."""
    return _run_backward(ctx, args, kwargs, nkeys, HARDSWISH_BACKWARD_KEYS, _hard_backward32,
                         True)


def hardsigmoid_backward(ctx, args, kwargs, nkeys: int):
    """``aten.hardsigmoid_backward`` of binary32 CPU tensors as its decomposition computes
    it at flop granularity (one key), or None (the decomposition runs)."""
    return _run_backward(ctx, args, kwargs, nkeys, HARDSIGMOID_BACKWARD_KEYS,
                         _hard_backward32, False)


def sigmoid_backward(ctx, args, kwargs, nkeys: int):
    """``aten.sigmoid_backward`` of binary32 CPU tensors as its decomposition computes it
    at flop granularity (three keys), or None (the decomposition runs)."""
    return _run_backward(ctx, args, kwargs, nkeys, SIGMOID_TANH_BACKWARD_KEYS,
                         _sigmoid_tanh_backward32, False)


def tanh_backward(ctx, args, kwargs, nkeys: int):
    """``aten.tanh_backward`` of binary32 CPU tensors as its decomposition computes it at
    flop granularity (three keys), or None (the decomposition runs)."""
    return _run_backward(ctx, args, kwargs, nkeys, SIGMOID_TANH_BACKWARD_KEYS,
                         _sigmoid_tanh_backward32, True)
