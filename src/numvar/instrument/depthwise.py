"""The float64 value of a depthwise convolution at ``op`` granularity.

``op`` granularity rounds an op's float64 result once (:func:`handlers.op_once`): the
op runs on float64 copies of its binary32 (bfloat16, float16) operands. PyTorch's CPU
has no vectorised float64 convolution for groups: it runs one ``slow_conv2d`` (im2col
and a ``dgemm``) per group, and a depthwise convolution (one input channel per group)
takes 10–50× its binary32 time there (EfficientNet's 5×5 depthwise layers on 4×4 maps:
2.2 ms against 62 µs; the float64 re-runs of ``efficientnet_mbconv``'s depthwise layers
were 8.5 of its 24 ms op SR forward, docs/speed.md).

What that path computes for one output element is fixed by the im2col and the ``dgemm``
with β = 1 over a bias-filled output: the bias (0 without one), then the products of
the kernel's positions in order ``(ky, kx)``, zero padding included, each added with one
binary64 rounding. Products of binary32 (and 16-bit) operands are exact in binary64, so
whether the ``dgemm`` fuses them does not matter. :func:`depthwise64` computes exactly
that, a plane at a time: the input zero-padded and split into its stride phases, then
one vectorised loop over the plane per kernel position (each element's adds in their
order), planes in runs on numba's threads; :func:`value64` uses it where it
applies and :func:`convolution_op` rounds its result as ``op_once`` rounds the
``float64`` result: the same key, the same bits (tested bit for bit against PyTorch's
float64 convolution and against :func:`reference64`, Python floats in that order, in
``tests/test_instrument_depthwise.py``). Elsewhere the op goes through ``op_once``
unchanged: one output per plane (the ``dgemm`` is then a dot product, added in MKL's own
order), channels-last strides (another path of PyTorch's, another order), a channel
multiplier above 1 (with 3 or 4 the ``dgemm``'s several rows changed the order: 86 of
96 and 81 of 93 random shapes differed), float64 operands (products not exact),
transposed convolutions, other devices.

The other convolutions' float64 value is PyTorch's, computed by :func:`batched64` in runs
of whole samples where the im2col buffer of the whole batch would exceed
:data:`COLUMN_BYTES`. PyTorch's float64 CPU convolution (``slow_conv2d``,
``slow_conv3d``; one per group) allocates that buffer for every sample of the batch at
once, and where glibc maps blocks above its mmap threshold on their own (before
2026-12-07, and with ``NUMVAR_KEEP_FREED_MEMORY=0``: :mod:`.heap`) it did so afresh on
every call: brain's 24-channel 3 × 3 convolution on 4 slices of 96 × 80 took a 53 MB
buffer and 13 000 page faults per forward (docs/speed.md). With such blocks from the
heap (numvar's default inside fuzzy blocks) the runs still keep the buffer the heap
holds after the call smaller, and were no slower: brain at op granularity 47.3–47.6 ms
a forward in runs, 48.6–48.8 whole (``benchmarks/bench_conv_runs.py``). The samples are
computed one by one whatever the batch (an im2col and a ``dgemm`` per sample, samples
spread over the threads), but MKL's ``dgemm`` sums in an order that depends on its
operands' alignment: a sample that sits at another offset modulo 64 bytes in a run's
buffers than in the whole batch's can come out different (23 of 394 random
convolutions split at such offsets differed; docs/speed.md).
So the batch is split only where one sample's input, im2col buffer and output (each
group's and all of them) are whole multiples of 64 bytes: every buffer PyTorch allocates
is 64-byte aligned, so every sample then sits at the offset it has in the whole call,
and a run gives the rows the whole batch gives, bit for bit (156 of 156 such random
convolutions, 1-D to 3-D, groups, strides, dilations, at one and two threads; the tests
compare them). With several threads every run holds at least two samples, so that each
sample's ``dgemm`` runs inside the parallel loop over samples, single threaded, as in the
whole call.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from ._core import FLOATS
from .flop import _tup
from .handlers import OP_HANDLERS, _up, op_once, register
from .heap import MMAP_THRESHOLD
from .norm_kernels import thread_parts

#: False: every convolution through ``op_once`` (PyTorch's float64 convolution), the
#: path the tests compare :func:`convolution_op` with
USE_KERNEL = True
#: the operand dtypes :func:`value64` takes (their products are exact in binary64)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: the float64 re-run of a convolution whose whole batch's im2col buffer is larger than
#: this runs in runs of samples (:func:`batched64`); 0: never split. glibc's mmap
#: threshold: the largest block it serves from the heap where large blocks are mapped
COLUMN_BYTES = MMAP_THRESHOLD


@njit(inline="always", error_model="numpy")
def _stage(x, xo, H, W, ph, pw, sh, sw, Hq, Wq, buf):
    """Plane ``x[xo:xo + H·W]`` zero-padded (ph, pw) and split into its sh·sw stride
    phases, in binary64 (exact): ``buf[((py·sw + px)·Hq + qy)·Wq + qx]`` holds padded
    element (qy·sh + py, qx·sw + px), so that every kernel position reads its outputs'
    inputs at a unit stride."""
    buf[:] = 0.0
    for iy in range(H):
        qy, py = divmod(iy + ph, sh)
        if qy >= Hq:
            break
        src = x[xo + iy * W:xo + (iy + 1) * W]
        for px in range(sw):  # padded columns qx·sw + px, x's ix = qx·sw + px − pw
            q0 = max(0, -((px - pw) // sw))
            q1 = min(Wq, (W - 1 + pw - px) // sw + 1)
            d0 = ((py * sw + px) * Hq + qy) * Wq
            if sw == 1:  # (unit strides: a vectorised copy)
                dst = buf[d0 + q0:d0 + q1]
                run = src[q0 - pw:q1 - pw]
                for i in range(q1 - q0):
                    dst[i] = np.float64(run[i])
            else:
                for qx in range(q0, q1):
                    buf[d0 + qx] = np.float64(src[qx * sw + px - pw])


@njit(inline="always", error_model="numpy")
def _plane(buf, w, wo, b, KH, KW, sh, sw, dh, dw, Hq, Wq, Ho, Wo, acc, out, oo):
    """One output plane from its staged input ``buf``: ``acc`` (Ho rows of Wq, the last
    Wq − Wo of each unused) filled with the bias ``b``, then each kernel position's
    products added over the whole plane in one unit-stride loop, in order (ky, kx);
    the Ho·Wo outputs copied to ``out[oo:]``."""
    n = (Ho - 1) * Wq + Wo
    a = acc[:n]
    for j in range(n):
        a[j] = b
    for ky in range(KH):
        qy, py = divmod(ky * dh, sh)
        for kx in range(KW):
            qx, px = divmod(kx * dw, sw)
            wv = np.float64(w[wo + ky * KW + kx])
            s0 = ((py * sw + px) * Hq + qy) * Wq + qx
            # (slices, not offsets into the whole arrays: LLVM vectorises this loop)
            src = buf[s0:s0 + n]
            for j in range(n):
                a[j] = a[j] + wv * src[j]
    for oy in range(Ho):
        row = acc[oy * Wq:oy * Wq + Wo]
        dst = out[oo + oy * Wo:oo + (oy + 1) * Wo]
        for ox in range(Wo):
            dst[ox] = row[ox]


@njit(parallel=True, cache=True, error_model="numpy")
def depthwise64(x, w, bias, N, C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, Ho, Wo, out,
                parts):  # pragma: no cover - compiled
    """Depthwise convolution of ``x`` ((N, C, H, W) float32, C order, flat) with ``w``
    ((C, KH, KW) float32, flat) and ``bias`` ((C,) float64) into ``out`` ((N, C, Ho, Wo)
    float64, flat): strides (sh, sw), zero padding (ph, pw), dilations (dh, dw); each
    element the bias plus its products in order (ky, kx), zero padding included, every
    add rounded to binary64 (the products are exact). The N·C planes in ``parts`` runs,
    one per numba thread: the result does not depend on ``parts``."""
    Hq = Ho + (KH - 1) * dh // sh
    Wq = Wo + (KW - 1) * dw // sw
    P = N * C
    for q in prange(parts):
        buf = np.empty(sh * sw * Hq * Wq, np.float64)
        acc = np.empty(Ho * Wq, np.float64)
        for p in range(q * P // parts, (q + 1) * P // parts):
            c = p % C
            _stage(x, p * H * W, H, W, ph, pw, sh, sw, Hq, Wq, buf)
            _plane(buf, w, c * KH * KW, bias[c], KH, KW, sh, sw, dh, dw, Hq, Wq, Ho, Wo,
                   acc, out, p * Ho * Wo)


def _ints(v, nd: int) -> tuple[int, ...] | None:
    """``flop._tup``'s ``nd`` ints of a convolution argument, or None where it has
    another length."""
    v = _tup(v if isinstance(v, (list, tuple)) else int(v), nd)
    return v if len(v) == nd else None


def _row_major(t: torch.Tensor) -> bool:
    """``t`` has C-order strides, size-1 dimensions included (``is_contiguous`` ignores
    those: a channels-last tensor with one channel passes it, and PyTorch's convolution
    then takes its channels-last path, which adds in another order)."""
    step = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        if stride != step:
            return False
        step *= size
    return True


def _geometry(x: torch.Tensor, w: torch.Tensor, bias, stride, padding, dilation,
              transposed, groups):
    """``(stride, padding, dilation)`` as 2-D tuples for a convolution :func:`value64`
    computes, else None: CPU, not transposed, 1-D or 2-D with a batch, operands (and
    bias) of one dtype in :data:`DTYPES` with C-order strides, one input and one output
    channel per group, no empty dimension."""
    if (transposed or not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor)
            or x.dtype not in DTYPES or w.dtype is not x.dtype or not x.is_cpu
            or not w.is_cpu or x.dim() not in (3, 4) or w.dim() != x.dim()):
        return None
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype is not x.dtype
                             or not bias.is_cpu):
        return None
    nd = x.dim() - 2
    c = x.shape[1]
    if (groups != c or w.shape[0] != c or w.shape[1] != 1 or x.numel() == 0 or w.numel() == 0
            or not _row_major(x) or not _row_major(w)):
        return None
    s, p, d = _ints(stride, nd), _ints(padding, nd), _ints(dilation, nd)
    if s is None or p is None or d is None or min(s) < 1 or min(d) < 1 or min(p) < 0:
        return None
    if nd == 1:
        s, p, d = (1, *s), (0, *p), (1, *d)
    return s, p, d


def value64(x, w, bias, stride, padding, dilation, transposed=False, output_padding=(0,),
            groups=1) -> torch.Tensor | None:
    """The float64 result of ``aten.convolution`` with these arguments as PyTorch's CPU
    float64 convolution computes it on float64 copies of the operands, for the
    depthwise convolutions :func:`depthwise64` serves; None for the others."""
    g = _geometry(x, w, bias, stride, padding, dilation, transposed, groups)
    if g is None:
        return None
    (sh, sw), (ph, pw), (dh, dw) = g
    one_d = x.dim() == 3
    if one_d:
        x, w = x.unsqueeze(2), w.unsqueeze(2)
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ho < 1 or wo < 1 or ho * wo == 1:
        return None  # (one output per plane: the dgemm is a dot product, in its own order)
    xc = x.detach().float().contiguous()  # (16-bit operands: exact)
    wk = w.detach().float().contiguous()
    b = (torch.zeros(c, dtype=torch.float64) if bias is None
         else bias.detach().to(torch.float64).contiguous())
    out = torch.empty((n, c, ho, wo), dtype=torch.float64)
    parts = thread_parts(n * c, 2, out.numel(), kh * kw)
    depthwise64(xc.view(-1).numpy(), wk.view(-1).numpy(), b.numpy(), n, c, h, wd, kh, kw,
                sh, sw, ph, pw, dh, dw, ho, wo, out.view(-1).numpy(), parts)
    return out.squeeze(2) if one_d else out


def reference64(x, w, bias, stride, padding, dilation) -> torch.Tensor:
    """:func:`value64`'s slow reference: Python floats, each output element the bias
    (0.0) plus its products (zero padding included) in order (ky, kx), batched 2-D."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xs, ws = x.double().tolist(), w.double().tolist()
    out = torch.empty((n, c, ho, wo), dtype=torch.float64)
    for i in range(n):
        for ch in range(c):
            for oy in range(ho):
                for ox in range(wo):
                    acc = 0.0 if bias is None else float(bias[ch])
                    for ky in range(kh):
                        for kx in range(kw):
                            iy, ix = oy * sh + ky * dh - ph, ox * sw + kx * dw - pw
                            v = xs[i][ch][iy][ix] if 0 <= iy < h and 0 <= ix < wd else 0.0
                            acc += ws[ch][0][ky][kx] * v
                    out[i, ch, oy, ox] = acc
    return out


#: the alignment of every buffer PyTorch allocates (c10's ``gAlignment``), in bytes
ALIGNMENT = 64


def sample_column_bytes(x, w, stride, padding, dilation, groups) -> int:
    """Bytes of the float64 im2col buffer of one sample of one group of PyTorch's float64
    convolution of ``x`` (N, C, *spatial) by ``w`` (OC, C / groups, *kernel), or 0 where
    the batch is not to be split there: no buffer (a 1 × 1 kernel at stride 1 without
    padding reads its input as it is), no output, or a sample's input, buffer or output
    (each group's or all of them) not a whole multiple of :data:`ALIGNMENT` bytes (a run
    would put samples at other offsets than the whole call; module docstring)."""
    ks = tuple(w.shape[2:])
    d = len(ks)
    st, pd, dl = _tup(stride, d), _tup(padding, d), _tup(dilation, d)
    if all(k == 1 for k in ks) and all(v == 1 for v in st) and not any(pd):
        return 0
    outs = [(n + 2 * p - q * (k - 1) - 1) // s + 1
            for n, k, s, p, q in zip(x.shape[2:], ks, st, pd, dl)]
    if min(outs, default=0) < 1:
        return 0
    c, oc, area, length = x.shape[1], w.shape[0], math.prod(x.shape[2:]), math.prod(outs)
    column = c // groups * math.prod(ks) * length * 8
    sizes = (column, c * area * 8, c // groups * area * 8, oc * length * 8,
             oc // groups * length * 8)
    return column if all(v % ALIGNMENT == 0 for v in sizes) else 0


def sample_runs(n: int, per_sample: int, limit: int, threads: int) -> list[int]:
    """Sizes of the runs of samples :func:`batched64` splits a batch of ``n`` into: as
    few as keep each run's buffer (``per_sample`` bytes a sample) within ``limit``, of
    nearly equal sizes, at least two samples each with several ``threads`` (a run of one
    sample would run its ``dgemm`` outside the parallel loop over samples, where it may
    use several threads); [n] where no split is needed or allowed."""
    if limit <= 0 or per_sample <= 0 or n < 2 or n * per_sample <= limit:
        return [n]
    runs = -(-n // max(1, limit // per_sample))
    if threads > 1:
        runs = min(runs, n // 2)
    if runs < 2:
        return [n]
    base, extra = divmod(n, runs)
    return [base + 1] * extra + [base] * (runs - extra)


def batched64(func, args) -> torch.Tensor | None:
    """The float64 result of ``aten.convolution`` with positional ``args``, as
    ``op_once`` computes it (``func`` on float64 copies of the operands), in runs of
    samples (:func:`sample_runs`) where the whole batch's im2col buffer would exceed
    :data:`COLUMN_BYTES` (module docstring); None where the call is not split:
    transposed, on another device, of mixed float dtypes, not in contiguous (N, C, ...)
    layout, small enough, or of sample sizes that would move samples' alignment
    (:func:`sample_column_bytes`)."""
    if len(args) != 9 or args[6] or not isinstance(args[0], torch.Tensor):
        return None
    x, w, bias = args[0], args[1], args[2]
    if not (x.dim() in (3, 4, 5) and x.is_cpu and x.dtype in FLOATS and x.is_contiguous()
            and isinstance(w, torch.Tensor) and w.dtype is x.dtype and w.dim() == x.dim()
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.dtype is x.dtype))):
        return None
    per = sample_column_bytes(x, w, args[3], args[4], args[5], args[8])
    runs = sample_runs(x.shape[0], per, COLUMN_BYTES, torch.get_num_threads())
    if len(runs) < 2:
        return None
    a = [_up(v) for v in args]
    outs, i = [], 0
    for r in runs:
        outs.append(func(a[0][i:i + r], *a[1:]))
        i += r
    return torch.cat(outs)


@register("aten.convolution", table=OP_HANDLERS, how="rounded once (op)")
def convolution_op(ctx, func, args, kwargs):
    """``aten.convolution`` at op granularity: the float64 value of a depthwise
    convolution from :func:`value64`, of a large batch from :func:`batched64`, rounded
    once as ``op_once`` rounds it (one key); every other convolution through
    ``op_once``."""
    v = None
    if not kwargs:
        v = value64(*args) if USE_KERNEL else None
        if v is None:
            v = batched64(func, args)
    if v is None:
        return op_once(ctx, func, args, kwargs)
    return ctx.round(v, args[0].dtype)
