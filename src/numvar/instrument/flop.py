"""Flop-level contractions and reductions on tensors, built on the two kernels of
:mod:`numvar.instrument.kernels`.

Orders (every product and every add rounded):

* matmul ``A (M×K) @ B (K×N)``: for each output element, the K products in increasing k,
  accumulated left to right starting from the first product. With the configuration's
  ``contraction="fma"`` every multiply-add is rounded once instead (the product exact);
  this applies to every contraction below (convolutions included), not to reductions.
* ``addmm``/``baddbmm``/``addbmm``: ``RND(RND(β·C) + RND(α·Σ))``; the scalings are
  skipped when α or β is 1, C is ignored when β is 0 (PyTorch's rule).
* convolution (1d/2d/3d, stride, zero padding, dilation, groups): im2col, then per output
  element the sum over (input channel of the group, kernel position in C order) in that
  order, zero-padding positions included as terms (as an im2col + GEMM implementation
  does); then the bias add. Per group it is one product ``W_g (O/G × K) @ cols_g (K × N·L)``
  (batch and output positions as columns, n-major), which fixes the random bits. Transposed convolution is the direct convolution of the
  stride-dilated, padded input with the flipped kernel, whose inserted zeros are terms too.
* convolution backward: grad_input is the transposed convolution of grad_output (direct
  form above); grad_weight sums over (batch, output position) in that order; grad_bias
  sums over (batch, output position).
* reductions (sum, mean, prod, cumsum, cumprod, var): the reduced elements in C order of
  the reduced dimensions, accumulated left to right from the first element; mean and var
  divide once at the end (var: two passes, Σ(x−mean)² / (n − correction)).

Accumulation policy (``Ctx.accumulation``): with ``accumulate="native"`` (default),
contractions and reductions whose target format is below binary32 (bfloat16, float16, a
``format`` such as e4m3fn) run in the binary32 kernels at 24 bits (products and partial
sums rounded to binary32 under the mode; exact products for inputs of the low format)
and their result is rounded once to the target format under the mode, as CPU and GPU
kernels accumulate in fp32. With ``accumulate="same"``, bfloat16 and float16 run in the
binary32 kernels at 8 and 11 significand bits and are cast at the end (exact except
below the narrow format's normal range, and for float16 above its range), and other
formats in the any-format kernels (CPU; every product and add rounded to the format).

Backends (:func:`flop_backend`): the numba kernels of :mod:`numvar.instrument.kernels`
for CPU tensors, the Triton kernels of :mod:`numvar.instrument.triton_kernels` for CUDA
tensors (same order, same random bits, same results); ``NUMVAR_FLOP_BACKEND`` overrides
the choice. Tensors the numba backend serves on another device are copied to the CPU
and back. The modes up, down, zero and farthest take the numba kernels (their binary32
scalar path) on every device.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..rounding.kernels import MODE_RANDOM
from . import conv_kernels as CK
from . import dense_kernels as DK
from . import kernels as KN
from . import linalg_kernels as LK
from . import pointwise as PW
from . import scan_kernels as SK
from ._core import Ctx

_log = logging.getLogger(__name__)

#: environment variable choosing the backend of the flop kernels, and its values
FLOP_BACKEND_ENV = "NUMVAR_FLOP_BACKEND"
FLOP_BACKENDS = ("auto", "numba", "triton")
_triton_missing_logged = False
#: os.environ's own table (CPython's ``os._Environ`` keeps the encoded names and values
#: and updates it on every write through os.environ) and the encoded name of
#: FLOP_BACKEND_ENV: :func:`_backend_env` reads it per op, where ``os.environ.get``
#: (``Mapping.get``, ``encodekey``, ``decodevalue``) cost 0.86 µs a call
_ENV_TABLE = getattr(os.environ, "_data", None)
_ENV_KEY = (os.environ.encodekey(FLOP_BACKEND_ENV)
            if _ENV_TABLE is not None and hasattr(os.environ, "encodekey") else None)


def _backend_env() -> str | None:
    """``os.environ.get(FLOP_BACKEND_ENV)``: its current value (None where unset), read
    from os.environ's table where this Python has one."""
    if _ENV_KEY is None:
        return os.environ.get(FLOP_BACKEND_ENV)
    raw = _ENV_TABLE.get(_ENV_KEY)
    return None if raw is None else os.environ.decodevalue(raw)


@functools.lru_cache(maxsize=None)
def _triton_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def flop_backend(device: torch.device) -> str:
    """The backend (``"numba"`` or ``"triton"``) of the flop kernels for tensors on
    ``device``, from ``NUMVAR_FLOP_BACKEND``:

    * ``auto`` (default, or unset): ``triton`` for CUDA tensors, ``numba`` otherwise; a
      CUDA tensor takes ``numba`` (through the CPU) when triton is not installed (logged
      once);
    * ``numba``: always the CPU numba kernels (device tensors are copied to the CPU and
      back);
    * ``triton``: always the Triton kernels; CPU tensors need Triton's interpreter
      (``TRITON_INTERPRET=1``, slow: meant for tests).

    Both backends give the same bits for the same seed. A bad value, or ``triton``
    where it cannot run, raises :class:`numvar.errors.ConfigError`.
    """
    global _triton_missing_logged
    raw = _backend_env()
    if not raw and device.type == "cpu":  # the common case, answered first (per op)
        return "numba"
    v = (raw or "").strip().lower() or "auto"
    if v not in FLOP_BACKENDS:
        raise ConfigError(f"{FLOP_BACKEND_ENV} must be one of {', '.join(FLOP_BACKENDS)}; "
                          f"got {v!r}")
    if v == "numba":
        return v
    cuda = device.type == "cuda"
    if v == "auto":
        if not cuda:
            return "numba"
        if _triton_available():
            return "triton"
        if not _triton_missing_logged:
            _log.warning("triton is not installed: flop kernels of CUDA tensors run on the "
                         "CPU (pip install 'numvar[gpu]')")
            _triton_missing_logged = True
        return "numba"
    if not _triton_available():
        raise ConfigError(f"{FLOP_BACKEND_ENV}=triton needs triton: pip install 'numvar[gpu]'")
    if not cuda and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ConfigError(f"{FLOP_BACKEND_ENV}=triton on {device.type} tensors needs "
                          "Triton's interpreter (TRITON_INTERPRET=1, set before triton is "
                          "imported)")
    return v


#: binary32 CPU products at 24 bits on the numba backend (the commonest contraction)
#: straight to the kernel (:func:`bmm`, :func:`_contract`), without the general path's
#: steps that are identities there (type promotion, the accumulation policy, the backend
#: choice, the casts around the kernel): the same key, kernel call and bits; False: the
#: general path, which the tests compare it with. 20–30 µs less per product
#: (docs/speed.md, "Products straight to the kernel")
LEAN_BMM = True
_F32 = torch.float32


def _contract(a: torch.Tensor, b: torch.Tensor, key: int, ctx: Ctx, t: int,
              kd: torch.dtype) -> torch.Tensor:
    """The flop contraction kernel of :func:`flop_backend` on carriers of dtype ``kd``;
    the result on ``a``'s device, dtype ``kd``. The entry point of every flop-level
    product but the group products that :func:`_contract_groups` computes without their
    im2col matrix (``numvar.workloads.zoo.count_contractions`` counts the calls of both)."""
    if (LEAN_BMM and kd is _F32 and a.dtype is _F32 and b.dtype is _F32 and a.is_cpu
            and b.is_cpu and not _backend_env()):
        # binary32 CPU operands on the numba backend: the kernel on their own arrays (the
        # casts of _np and _back below are identities); a transposed b (a linear layer's
        # weight.t()) as it is: the few-outputs kernel reads it transposed (a torch copy of
        # fft_filter's 4096 × 4 head took 27 µs), the others put it in C order themselves
        # (kernels._untransposed32: a BERT-tiny 128 × 512 weight 30 against 114 µs)
        b = b.detach()
        if not b.transpose(1, 2).is_contiguous():
            b = b.contiguous()
        return torch.from_numpy(KN.contract(
            a.detach().contiguous().numpy(), b.numpy(), key, ctx.code, t, ctx.contraction))
    if (flop_backend(a.device) == "triton" and ctx.code <= MODE_RANDOM
            and not (ctx.contraction == "fma" and kd == torch.float64)):
        # (binary64 fma and the directed modes have no Triton kernel: the numba one,
        # through the CPU, same bits)
        from . import triton_kernels as TK

        return TK.contract(a.detach().to(kd), b.detach().to(kd), key, ctx.code, t,
                           ctx.contraction)
    return _back(KN.contract(_np(a, kd), _np(b, kd), key, ctx.code, t, ctx.contraction), kd,
                 a.device)


def _scan(x: torch.Tensor, key: int, ctx: Ctx, t: int, kd: torch.dtype, *, mul: bool,
          cumulative: bool = False) -> torch.Tensor:
    """The flop scan kernel of :func:`flop_backend` (see :func:`_contract`)."""
    if flop_backend(x.device) == "triton" and ctx.code <= MODE_RANDOM:
        from . import triton_kernels as TK

        return TK.scan(x.detach().to(kd), key, ctx.code, t, mul=mul, cumulative=cumulative)
    return _back(KN.scan(_np(x, kd), key, ctx.code, t, mul=mul, cumulative=cumulative), kd,
                 x.device)


def _kdtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _np(x: torch.Tensor, kd: torch.dtype):
    """``x``'s values as a C-order ``kd`` array on the CPU: a view where x already is one
    (one check and ``numpy()``, 1.0–1.4 µs against 1.9 for the general chain of
    conversions, which returns the same view there), a copy elsewhere."""
    if x.dtype is kd and x.is_cpu and x.is_contiguous():
        return (x.detach() if x.requires_grad else x).numpy()
    return x.detach().to(device="cpu", dtype=kd).contiguous().numpy()


def _back(arr, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(arr).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------ contractions
def bmm(a: torch.Tensor, b: torch.Tensor, ctx: Ctx, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Randomly rounded batched product of ``a`` (BA, M, K) and ``b`` (BB, K, N).

    Batch ``max(BA, BB)``; ``a[i % BA]`` times ``b[i % BB]``. One stream key per call.
    """
    if (LEAN_BMM and a.dtype is _F32 and b.dtype is _F32 and (dtype is None or dtype is _F32)
            and ctx._t32 and a.shape[2]):
        # (_t32: no other target format, 24 bits: the accumulation is binary32's own)
        return _contract(a, b, ctx.stream.next_key(), ctx, 24, _F32)
    dtype = dtype or torch.result_type(a, b)
    device = a.device
    BO = max(a.shape[0], b.shape[0])
    M, Kd, N = a.shape[1], a.shape[2], b.shape[2]
    if Kd == 0:
        return torch.zeros(BO, M, N, dtype=dtype, device=device)
    acc = ctx.accumulation(dtype)
    key = ctx.stream.next_key()
    if acc.spec is not None:
        out = _back(KN.contract_format(_np(a, torch.float64), _np(b, torch.float64), key,
                                       ctx.code, acc.t, acc.spec), torch.float64, device)
    else:
        out = _contract(a, b, key, ctx, acc.t, acc.kernel_dtype)
    return _finish(out, acc, dtype, ctx)


def _finish(out: torch.Tensor, acc, dtype: torch.dtype, ctx: Ctx) -> torch.Tensor:
    """A kernel's result as a ``dtype`` tensor: rounded once more to the target format
    under the mode (accumulate="native"), else cast (exact, or the cast at the end of
    accumulate="same" for bfloat16/float16)."""
    if acc.then_round:
        return ctx.round(out, dtype)
    return out.to(dtype)


def mm(a: torch.Tensor, b: torch.Tensor, ctx: Ctx) -> torch.Tensor:
    return bmm(a.unsqueeze(0), b.unsqueeze(0), ctx)[0]


def addmm(c, a: torch.Tensor, b: torch.Tensor, alpha, beta, ctx: Ctx) -> torch.Tensor:
    """``aten.addmm``: :func:`scale_add` of :func:`mm`; a linear layer's bias row (α = β =
    1, binary32) rounded in the product's compiled call where
    :mod:`numvar.instrument.dense_kernels` serves it (the same keys and bits)."""
    if LEAN_BMM and not _backend_env() and DK.serves(c, a, b, alpha, beta, ctx):
        return _contract_bias(a, b, c, ctx)
    return scale_add(mm(a, b, ctx), c, alpha, beta, ctx)


def _contract_bias(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, ctx: Ctx) -> torch.Tensor:
    """``RND(c + RND(a @ b))`` by :func:`numvar.instrument.dense_kernels.addmm32`: the
    entry point of the products computed with their bias
    (``numvar.workloads.zoo.count_contractions`` counts its calls too)."""
    return DK.addmm32(c, a, b, ctx)


def scale_add(acc: torch.Tensor, c: torch.Tensor | None, alpha, beta, ctx: Ctx) -> torch.Tensor:
    """``RND(RND(β·c) + RND(α·acc))`` with PyTorch's conventions for α = 1, β ∈ {0, 1}."""
    if alpha != 1:
        acc = ctx.mul(acc, alpha)
    if c is None or beta == 0:
        return acc
    if beta != 1:
        c = ctx.mul(c, beta)
    return ctx.add(c.to(acc.dtype), acc)


# ------------------------------------------------------------------------- convolution
def _tup(v, nd: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * nd
    v = tuple(int(x) for x in v)
    return v * nd if len(v) == 1 else v


def _windows(x: torch.Tensor, ks: Sequence[int], stride, padding, dilation):
    """The sliding windows of (N, C, *S) as a view (N, C, *L, *k) (zero padding applied),
    and the output spatial shape L."""
    nd = len(ks)
    if any(padding):
        pads = []
        for p in reversed(padding):
            pads += [p, p]
        x = F.pad(x, pads)
    for d in range(nd):
        x = x.unfold(2 + d, dilation[d] * (ks[d] - 1) + 1, stride[d])
    if any(dl > 1 for dl in dilation):
        x = x[(Ellipsis,) + tuple(slice(None, None, dl) for dl in dilation)]
    return x, tuple(x.shape[2:2 + nd])


def im2col(x: torch.Tensor, ks: Sequence[int], stride, padding, dilation):
    """(N, C, *S) -> ((N, C·∏k, L), output spatial shape); rows in (C, k...) C order."""
    nd = len(ks)
    x, ls = _windows(x, ks, stride, padding, dilation)
    n, c = x.shape[:2]
    x = x.permute(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
    return x.reshape(n, c * math.prod(ks), math.prod(ls)), ls


def _group_cols(x: torch.Tensor, ks, stride, padding, dilation, g: int):
    """im2col in the layout of the per-group product, ``(g, C/g·∏k, N·L)``: rows (channel
    of the group, kernel position in C order), columns (batch, output position); the
    same matrix as ``im2col`` reshaped to (N, g, C/g·∏k, L) and permuted, in one copy."""
    nd = len(ks)
    x, ls = _windows(x, ks, stride, padding, dilation)
    n, c = x.shape[:2]
    x = x.permute(1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd))  # (C, k..., N, L...)
    return x.reshape(g, (c // g) * math.prod(ks), n * math.prod(ls)), ls


def _group_products(x, w, ks, stride, padding, dilation, g: int, ctx: Ctx, dtype):
    """:func:`conv`'s group products ``(g, O/g, N·∏L)`` as :func:`bmm` computes them from
    the im2col matrix, through :func:`_contract_groups` (the matrix built a group at a
    time in cache, :mod:`numvar.instrument.conv_kernels`), and the output's spatial
    shape; ``(None, None)`` where that does not serve (another backend, format, mode or
    kernel): then the im2col route. The same checks, key and kernel arguments as
    :func:`bmm`'s two paths, the same bits."""
    nd = len(ks)
    ls = tuple((x.shape[2 + d] + 2 * padding[d] - dilation[d] * (ks[d] - 1) - 1) // stride[d] + 1
               for d in range(nd))
    if not (x.is_cpu and w.is_cpu and min(ls) > 0) or flop_backend(x.device) != "numba":
        return None, None
    if LEAN_BMM and dtype is _F32 and x.dtype is _F32 and w.dtype is _F32 and ctx._t32:
        acc, t = None, 24  # (bmm's lean path)
    else:
        acc = ctx.accumulation(dtype)
        if acc.spec is not None or acc.kernel_dtype is not _F32:
            return None, None
        t = acc.t
    m = w.shape[0] // g
    k = math.prod(w.shape[1:])  # (from the shapes: indexing makes a view, 1.5 µs each)
    if not CK.serves(ctx.code, t, ctx.contraction, w.shape[1], g, m, x.shape[0] * math.prod(ls),
                     k, x.shape[0] * math.prod(x.shape[2:]) * w.shape[1]):
        return None, None
    out = _contract_groups(x, w, ks, stride, padding, dilation, g, ls, ctx.stream.next_key(),
                           ctx, t)
    return (out if acc is None else _finish(out, acc, dtype, ctx)), ls


def _contract_groups(x, w, ks, stride, padding, dilation, g: int, ls, key: int, ctx: Ctx,
                     t: int) -> torch.Tensor:
    """The group products of a convolution on binary32 carriers, (g, O/g, N·∏L) float32:
    :func:`_contract` of the weights and the im2col matrix without the matrix
    (:func:`numvar.instrument.conv_kernels.grouped32`; call where
    :func:`numvar.instrument.conv_kernels.serves`). The other entry point of the flop
    contractions (``numvar.workloads.zoo.count_contractions`` counts its calls too)."""
    return torch.from_numpy(CK.grouped32(
        _np(x, _F32), _np(w, _F32), ks, stride, padding, dilation, g, ls, key, ctx.code, t,
        ctx.contraction))


def conv(x, w, bias, stride, padding, dilation, groups, ctx: Ctx) -> torch.Tensor:
    """Direct (non-transposed) convolution, every product and add rounded."""
    nd = w.dim() - 2
    stride, padding, dilation = _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd)
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    dtype = torch.result_type(x, w)
    n = x.shape[0]
    o = w.shape[0]
    g = groups
    ks = tuple(w.shape[2:])
    # one product per group: (o/g, kk) @ (kk, n·L), the batch inside the columns
    out, ls = _group_products(x, w, ks, stride, padding, dilation, g, ctx, dtype)
    if out is None:  # through the im2col matrix
        cols, ls = _group_cols(x, ks, stride, padding, dilation, g)
        out = bmm(w.reshape(g, o // g, cols.shape[1]), cols, ctx, dtype)  # (g, o/g, n·L)
    if bias is not None and CK.BIAS_KERNEL and dtype is _F32 and LK.serves(ctx, out, bias):
        # (Ctx.add's binary32 tiles on the products as they lie: same key and bits)
        out = torch.from_numpy(CK.bias_rows32(
            _np(out, _F32).reshape(-1), _np(bias, _F32), n, math.prod(ls),
            np.uint64(ctx.stream.next_key()), ctx.code)).view(n, o, *ls)
        return out[0] if unbatched else out
    out = out.reshape(g, o // g, n, -1).permute(2, 0, 1, 3).reshape(n, o, *ls)  # a view
    if bias is not None:
        # read through the view: the bias add writes the (N, O, L...) result
        out = ctx.add(out, bias.to(dtype).reshape(1, o, *([1] * nd)))
    else:
        out = out.contiguous()
    return out[0] if unbatched else out


def conv_transpose(x, w, bias, stride, padding, dilation, output_padding, groups, ctx: Ctx):
    """Transposed convolution as the direct convolution of the stride-dilated, padded
    input with the flipped, channel-swapped kernel."""
    nd = w.dim() - 2
    stride, padding = _tup(stride, nd), _tup(padding, nd)
    dilation, output_padding = _tup(dilation, nd), _tup(output_padding, nd)
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    n, cin = x.shape[:2]
    sp = x.shape[2:]
    ks = tuple(w.shape[2:])
    if any(s > 1 for s in stride):
        xz = x.new_zeros(n, cin, *[(s - 1) * st + 1 for s, st in zip(sp, stride)])
        xz[(slice(None), slice(None)) + tuple(slice(None, None, st) for st in stride)] = x
    else:
        xz = x
    pads = []
    for d in reversed(range(nd)):
        lo = dilation[d] * (ks[d] - 1) - padding[d]
        pads += [lo, lo + output_padding[d]]
    if any(pads):
        xz = F.pad(xz, pads)
    g = groups
    coutg = w.shape[1]
    w2 = w.reshape(g, cin // g, coutg, *ks).transpose(1, 2).reshape(g * coutg, cin // g, *ks)
    w2 = w2.flip(dims=tuple(range(2, 2 + nd)))
    out = conv(xz, w2, bias, 1, 0, dilation, g, ctx)
    return out[0] if unbatched else out


def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups, ctx):
    if transposed:
        return conv_transpose(x, w, bias, stride, padding, dilation, output_padding, groups, ctx)
    return conv(x, w, bias, stride, padding, dilation, groups, ctx)


def _weight_grad(a, src, ks, stride, padding, dilation, groups, ctx, dtype):
    """Σ over (batch, position) of a[n, g, m, l] · im2col(src)[n, g, κ, l] -> (g, m, κ)."""
    n = a.shape[0]
    g = groups
    cols, ls = im2col(src, ks, stride, padding, dilation)  # (n, C·kk, L)
    L = cols.shape[-1]
    kk = cols.shape[1] // g
    m = a.shape[1] // g
    if a.reshape(n, a.shape[1], -1).shape[-1] != L:
        raise RuntimeError("convolution_backward: inconsistent spatial sizes")
    A = a.reshape(n, g, m, L).permute(1, 2, 0, 3).reshape(g, m, n * L)
    B = cols.reshape(n, g, kk, L).permute(1, 0, 3, 2).reshape(g, n * L, kk)
    return bmm(A, B, ctx, dtype)


def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask, ctx):
    nd = w.dim() - 2
    stride, padding = _tup(stride, nd), _tup(padding, nd)
    dilation, output_padding = _tup(dilation, nd), _tup(output_padding, nd)
    ks = tuple(w.shape[2:])
    unbatched = x.dim() == nd + 1
    if unbatched:
        x, grad = x.unsqueeze(0), grad.unsqueeze(0)
    dtype = torch.result_type(grad, w)
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            gi = conv(grad, w, None, stride, padding, dilation, groups, ctx)
        else:
            op = []
            for d in range(nd):
                full = (grad.shape[2 + d] - 1) * stride[d] - 2 * padding[d] + dilation[d] * (ks[d] - 1) + 1
                op.append(x.shape[2 + d] - full)
            gi = conv_transpose(grad, w, None, stride, padding, dilation, op, groups, ctx)
        if unbatched:
            gi = gi[0]
    if output_mask[1]:
        if transposed:
            gw = _weight_grad(x, grad, ks, stride, padding, dilation, groups, ctx, dtype)
        else:
            gw = _weight_grad(grad, x, ks, stride, padding, dilation, groups, ctx, dtype)
        gw = gw.reshape(w.shape)
    if output_mask[2]:
        gb = reduce(grad, [0, *range(2, 2 + nd)], ctx)
    return gi, gw, gb


# --------------------------------------------------------------------------- reductions
def _dims(x: torch.Tensor, dim) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    dims = sorted({d % max(x.dim(), 1) for d in dim})
    return dims if dims else list(range(x.dim()))


def _trailing(x: torch.Tensor, dims: list[int]) -> bool:
    """The reduced dims ``dims`` (sorted) are x's trailing dims once dims of size 1 are
    left out. A size-1 dim moves no element of the (K, M) order the reductions use (K the
    reduced dims in C order, M the kept ones), so the rows of x viewed as (M, K) are then
    that order (InstanceNorm's batch norm reduces dims 0, 2, 3 of a (1, C, H, W) input)."""
    if not dims:
        return False
    if dims[0] == x.dim() - len(dims):
        return True
    shape = x.shape
    last_kept = max((d for d in range(x.dim()) if d not in dims and shape[d] != 1), default=-1)
    return all(d > last_kept for d in dims if shape[d] != 1)


#: binary32 sums and products over the leading dims of a contiguous CPU tensor at 24 bits
#: on the numba backend (a bias's gradient, a column sum) straight to the scan on the
#: tensor's own (K, M) array, without the general path's steps that are identities there
#: (the accumulation policy, the backend choice, the casts): the same key, kernel call
#: and bits; False: the general path, which the tests compare it with. A (32, 64) sum
#: over dim 0 at flop SR took 47 µs a call through the general path, 5.5 in the scan
LEAN_SUMS = True

#: float64 sums and products over the trailing dims of a contiguous tensor with many
#: rows by the row kernels (``pointwise.rowsum32`` on float64 rows), without the
#: transposed copy the scan reads; False: the scan, which the tests compare it with
ROW_SUMS64 = True


def reduce(x: torch.Tensor, dim, ctx: Ctx, *, keepdim: bool = False, mul: bool = False,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """Randomly rounded sum (or product) over ``dim`` (None or [] = all dims)."""
    dtype = dtype or x.dtype
    if x.dtype != dtype:
        x = x.to(dtype)
    dims = _dims(x, dim) if x.dim() else []
    kept = [d for d in range(x.dim()) if d not in dims]
    out_shape = [x.shape[d] for d in kept]
    kshape = [1 if d in dims else x.shape[d] for d in range(x.dim())]
    k = math.prod(x.shape[d] for d in dims)
    m = math.prod(out_shape)
    if k == 0:
        res = torch.full(out_shape, 1.0 if mul else 0.0, dtype=dtype, device=x.device)
    elif k == 1:
        res = x.reshape(out_shape).clone()
    elif (dtype is torch.float32 and ctx._t32 and x.is_cpu and _trailing(x, dims)
          and x.is_contiguous() and flop_backend(x.device) == "numba"
          and (m < PW.ROW_M_MIN or k <= PW.ROW_K_MAX)):
        # trailing dims of a contiguous tensor: the rows of x viewed as (m, k), without
        # the transposed copy (same order and bits as the scan below); a few rows are
        # walked one by one (rowscan32), many in blocks (rowsum32)
        key = ctx.stream.next_key()
        rows = PW.array(x).reshape(m, k)
        if m < PW.ROW_M_MIN:
            arr = np.empty((m, 1), np.float32)
            SK.rowscan32(rows, arr, np.uint64(key), ctx.code, mul, False)
        else:
            arr = PW.rowsum32(rows, key, ctx.code, mul=mul)
        res = torch.from_numpy(arr).reshape(out_shape)
    elif (LEAN_SUMS and dtype is torch.float32 and ctx._t32 and x.is_cpu
          and x.is_contiguous() and dims[-1] == len(dims) - 1
          and not _backend_env()):
        # leading dims of a contiguous tensor: x viewed as (k, m) is the scan's operand
        arr = KN.scan(PW.array(x).reshape(k, m), ctx.stream.next_key(), ctx.code, 24, mul=mul)
        res = torch.from_numpy(arr).reshape(out_shape)
    elif (ROW_SUMS64 and dtype is torch.float64 and ctx.bits(dtype) == 53 and ctx._numba
          and ctx.target(dtype) is None and x.is_cpu and _trailing(x, dims)
          and x.is_contiguous() and m >= PW.ROW_M_MIN and k <= PW.ROW_K_MAX
          and flop_backend(x.device) == "numba"):
        # binary64 at 53 bits: the rows in blocks too (the scan's order and bits)
        arr = PW.rowsum32(PW.array(x).reshape(m, k), ctx.stream.next_key(), ctx.code, mul=mul)
        res = torch.from_numpy(arr).reshape(out_shape)
    else:
        xp = x.permute(*dims, *kept).reshape(k, m)
        res = _policy_scan(xp, ctx, mul, False, dtype).reshape(out_shape)
    return res.reshape(kshape) if keepdim else res


#: windows of a pooling summed in place (:func:`window_sums`); False: materialised as rows
#: first (:func:`reduce` of their reshape), which the tests compare it with
WINDOW_SUMS = True


def window_sums(win: torch.Tensor, ctx: Ctx) -> torch.Tensor:
    """The sums of the 2-D windows of a :func:`_windows` view ``win`` (B, 1, L1, L2, k1,
    k2) over (k1, k2), (B, L1·L2): ``reduce`` of ``win.reshape(B, L1·L2, k1·k2)`` over its
    last dim (the same key, order and bits), where that takes the row kernels, by
    :func:`numvar.instrument.pointwise.window_sum32` on the view's own storage (no copy
    of the windows)."""
    B, _, L1, L2, k1, k2 = win.shape
    k, m = k1 * k2, B * L1 * L2
    if not (WINDOW_SUMS and win.dtype is torch.float32 and ctx._t32 and win.is_cpu
            and not win.is_neg() and 1 < k <= PW.ROW_K_MAX and m >= PW.ROW_M_MIN
            and flop_backend(win.device) == "numba"):
        return reduce(win.reshape(B, L1 * L2, k), [2], ctx)
    st = win.stride()
    strides = (st[0], st[2], st[3], st[4], st[5])
    extent = 1 + sum((n - 1) * s for n, s in zip((B, L1, L2, k1, k2), strides))
    flat = win.detach().as_strided((extent,), (1,)).numpy()
    out = PW.window_sum32(flat, (B, L1, L2), strides[:3], (k1, k2), strides[3:],
                          ctx.stream.next_key(), ctx.code)
    return torch.from_numpy(out).reshape(B, L1 * L2)


def scan(x: torch.Tensor, dim: int, ctx: Ctx, *, mul: bool = False,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """Randomly rounded cumulative sum (or product) along ``dim``."""
    dtype = dtype or x.dtype
    if x.dtype != dtype:
        x = x.to(dtype)
    if x.dim() == 0:
        return x.clone()
    d = dim % x.dim()
    k = x.shape[d]
    if k <= 1 or x.numel() == 0:
        return x.clone()
    if (d == x.dim() - 1 and dtype is torch.float32 and ctx._t32 and x.is_cpu
            and x.numel() // k < PW.ROW_M_MIN and x.is_contiguous()
            and flop_backend(x.device) == "numba"):
        # a few contiguous rows along the last dim: each walked in place (rowscan32;
        # the order and bits of the (K, M) scan below)
        key = ctx.stream.next_key()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        SK.rowscan32(PW.array(x).reshape(-1, k), PW.array(out).reshape(-1, k),
                     np.uint64(key), ctx.code, mul, True)
        return out
    xm = x.movedim(d, 0)
    rest = xm.shape[1:]
    res = _policy_scan(xm.reshape(k, -1), ctx, mul, True, dtype)
    return res.reshape(k, *rest).movedim(0, d).contiguous()


def _policy_scan(x2: torch.Tensor, ctx: Ctx, mul: bool, cumulative: bool,
                 dtype: torch.dtype) -> torch.Tensor:
    """The scan kernel on (K, M) under the block's accumulation policy, as ``dtype``."""
    acc = ctx.accumulation(dtype)
    key = ctx.stream.next_key()
    if acc.spec is not None:
        arr = KN.scan_format(_np(x2, torch.float64), key, ctx.code, acc.t, acc.spec, mul=mul,
                             cumulative=cumulative)
        out = _back(arr, torch.float64, x2.device)
    else:
        out = _scan(x2, key, ctx, acc.t, acc.kernel_dtype, mul=mul, cumulative=cumulative)
    return _finish(out, acc, dtype, ctx)


def mean(x, dim, ctx: Ctx, *, keepdim=False, dtype=None):
    dims = _dims(x, dim) if x.dim() else []
    n = math.prod(x.shape[d] for d in dims)
    s = reduce(x, dim, ctx, keepdim=keepdim, dtype=dtype)
    return ctx.div(s, float(n))


#: flop.var over trailing dims of small contiguous binary32 tensors in one compiled call
#: (scan_kernels.rowvar; False: the tensor steps below, its reference)
USE_ROWVAR = True
#: the same for binary64 (float64 tensors at 53 bits; False: the tensor steps)
USE_ROWVAR64 = True


def _rowvar_dtype(x: torch.Tensor, m: int, ctx: Ctx) -> type | None:
    """The numpy dtype :func:`var`'s compiled call runs ``x``'s dtype in (binary32 at 24
    bits, binary64 at 53, each in its own format), or None (the tensor steps). binary64
    takes it for rows the compiled sums serve better than :func:`reduce`'s column tiles:
    fewer than ``kernels.SCAN64_MIN_COLUMNS`` (chains, as :func:`reduce`'s) or at least
    ``pointwise.ROW_M_MIN`` (blocks of rows, as :func:`reduce`'s); measured, one thread,
    sr, compiled ÷ tensor steps: 2 × 4096 240 / 404 µs, 16 × 256 81 / 166, 256 × 128
    208 / 321; 8 × 1024 253 / 228 (chains) and 570 / 517 µs for a GroupNorm of 8 such
    rows (its variance's row blocks, a tile of 8 per step)."""
    if x.dtype is torch.float32:
        ok = USE_ROWVAR and ctx._t32
    elif x.dtype is torch.float64:
        ok = (USE_ROWVAR64 and ctx.bits(torch.float64) == 53
              and (m < KN.SCAN64_MIN_COLUMNS or m >= PW.ROW_M_MIN))
    else:
        return None
    if not ok or ctx.target(x.dtype) is not None:
        return None
    return np.float32 if x.dtype is torch.float32 else np.float64


def var(x, dim, correction, ctx: Ctx, *, keepdim=False):
    """Two-pass variance: mean, then Σ(x − mean)² / max(0, n − correction)."""
    dims = _dims(x, dim) if x.dim() else []
    n = math.prod(x.shape[d] for d in dims)
    m = x.numel() // n if n else 0
    if (n >= 2 and m and ctx._numba and x.is_cpu and x.is_contiguous()
            and (nd := _rowvar_dtype(x, m, ctx)) is not None
            and _trailing(x, dims) and (m < PW.ROW_M_MIN or n <= PW.ROW_K_MAX)
            and x.numel() < KN.PARALLEL_MIN_WORK and flop_backend(x.device) == "numba"):
        keys = ctx.stream_keys(6)
        out = np.empty(m, nd)
        SK.rowvar(PW.array(x).reshape(m, n), keys, nd(n), nd(max(0, n - correction)),
                  ctx.code, out, m, 0)
        kshape = [1 if d in dims else x.shape[d] for d in range(x.dim())]
        res = torch.from_numpy(out)
        return res.reshape(kshape) if keepdim else res.reshape(
            [x.shape[d] for d in range(x.dim()) if d not in dims])
    mu = mean(x, dims, ctx, keepdim=True)
    d = ctx.sub(x, mu)
    s = reduce(ctx.mul(d, d), dims, ctx, keepdim=keepdim)
    return ctx.div(s, float(max(0, n - correction)))


def unfold_backward(g: torch.Tensor, input_sizes, dim: int, size: int, step: int,
                    ctx: Ctx) -> torch.Tensor:
    """The backward of ``Tensor.unfold`` (the overlap-add of ``torch.istft``): each input
    position sums the gradients of the windows covering it, in increasing window order,
    accumulated left to right from the first (every add rounded). One rounding call per
    overlap rank r ≥ 1 (the r-th covering window of every position), over all positions:
    element j of the call is position j of the C-order output."""
    sizes = [int(s) for s in input_sizes]
    nd = len(sizes)
    d = dim % nd if nd else 0
    if nd == 0:
        sizes, g = [1], g.reshape(1, -1)
    L = sizes[d]
    gm = g.movedim(d if nd else 0, -2)  # (..., nwin, size)
    nwin = gm.shape[-2]
    p = torch.arange(L, device=g.device)
    wmin = torch.clamp(torch.div(p - size + step, step, rounding_mode="floor"), min=0)
    wmax = torch.clamp(torch.div(p, step, rounding_mode="floor"), max=nwin - 1)
    count = (wmax - wmin + 1).clamp(min=0)
    zero = torch.zeros((), dtype=g.dtype, device=g.device)
    acc = None
    for r in range(int(count.max()) if L and nwin else 0):
        w = (wmin + r).clamp(max=max(nwin - 1, 0))
        off = (p - w * step).clamp(0, size - 1)
        contrib = gm[..., w, off]
        valid = r < count
        acc = torch.where(valid, contrib, zero) if acc is None else torch.where(
            valid, ctx.add(acc, contrib), acc)
    if acc is None:
        acc = torch.zeros((*gm.shape[:-2], L), dtype=g.dtype, device=g.device)
    out = acc.movedim(-1, d if nd else 0)
    return out.reshape(sizes) if nd else out.reshape(())
