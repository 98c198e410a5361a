"""Accumulating index ops: ``index_put(accumulate=True)``, ``scatter(reduce=add|multiply)``,
``scatter_add``, ``scatter_reduce`` (sum, prod, mean), ``index_add``, ``index_reduce``,
``put(accumulate=True)`` and the gradient scatters built on them.

Each of these ops sends source elements ``src[k]`` (k = 0, 1, ... in C order of the
source, see :func:`positions_scatter` & co) to destination positions ``pos[k]`` of a
copy of ``self``, where they are combined with what is there. Several sources may share
a destination, so these ops accumulate and must round.

Order (documented, deterministic, tested bit for bit against :func:`accumulate_reference`):
for k = 0, 1, ..., n-1 in increasing source index,
``out[pos[k]] = RND(out[pos[k]] ∘ src[k])`` (∘ = add or multiply), starting from
``self[pos[k]]``; with ``include_self=False`` a destination's first source is copied
(no rounding) and only later ones are combined. Source element k draws its random bits
from ``bits64(key, k)`` (one stream key per call), so each rounding has its own bits
whatever the destinations.

At ``op`` granularity the same accumulation runs with error-free transformations in
float64 (TwoSum: the sum is carried as an unevaluated pair ``hi + lo``, Ogita, Rump &
Oishi's Sum2, as accurate as a sum in twice binary64's precision) and the pair is
rounded once (:func:`accumulate_exact`). Products are carried in float64 and rounded once.

Under ``fuzzy(format=...)`` the results are rounded to the block's format (tensors keep
their dtype) under its accumulation policy (``Ctx.accumulation``, as the contractions of
:mod:`numvar.instrument.flop`): at ``flop`` granularity ``accumulate="native"`` runs the
order above in binary32 and rounds the result once to the format; ``"same"`` rounds every
add (multiply) to the format (:func:`accumulate` with ``spec``); in both, destinations no
combination reached are rounded once to the format too. At ``op`` the exact sum is rounded
once to the format.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K

from ._core import Ctx
from .flop import _back, _kdtype, _np
from .kernels import _bits

#: the combining operations
ADD, MUL = 0, 1


# ------------------------------------------------------------------------- kernels
@njit(cache=True)
def _accumulate_kernel(out, pos, src, key, mode, t, is32, use_mul, include_self,
                       touched):  # pragma: no cover - compiled
    ukey = np.uint64(key)
    for k in range(src.size):
        p = pos[k]
        if not include_self and not touched[p]:
            out[p] = src[k]
            touched[p] = True
            continue
        r = _bits(ukey, np.uint64(k))
        a = np.float64(out[p])
        x = np.float64(src[k])
        if is32:
            out[p] = K.mul_f32(a, x, mode, t, r) if use_mul else K.add_f32(a, x, mode, t, r)
        else:
            out[p] = K.mul_f64(a, x, mode, t, r) if use_mul else K.add_f64(a, x, mode, t, r)


@njit(cache=True)
def _accumulate_format_kernel(out, pos, src, key, mode, t, p_, emin, emax, maxv, flags,
                              use_mul, include_self, touched):  # pragma: no cover - compiled
    """_accumulate_kernel on float64 arrays with every combination rounded to the format
    (p_, emin, emax, maxv, flags) by numvar.rounding.kernels.format_binary."""
    ukey = np.uint64(key)
    op = K.OP_MUL if use_mul else K.OP_ADD
    for k in range(src.size):
        p = pos[k]
        if not include_self and not touched[p]:
            out[p] = src[k]
            touched[p] = True
            continue
        r = _bits(ukey, np.uint64(k))
        out[p] = K.format_binary(op, out[p], src[k], mode, t, p_, emin, emax, maxv, flags, r)


@njit(cache=True)
def _exact_kernel(hi, lo, pos, src, use_mul, include_self, touched):  # pragma: no cover
    for k in range(src.size):
        p = pos[k]
        x = np.float64(src[k])
        if not include_self and not touched[p]:
            hi[p] = x
            lo[p] = 0.0
            touched[p] = True
            continue
        if use_mul:
            hi[p] = hi[p] * x
            continue
        s, e = K.two_sum(hi[p], x)
        hi[p] = s
        lo[p] = lo[p] + e if abs(s) < np.inf else 0.0
    for p in range(hi.size):
        if lo[p] != 0.0 and abs(hi[p]) < np.inf:
            s, e = K.two_sum(hi[p], lo[p])
            hi[p] = s
            lo[p] = e
        elif not abs(hi[p]) < np.inf:
            lo[p] = 0.0


def _check(out: np.ndarray, pos: np.ndarray, src: np.ndarray, spec=None) -> None:
    if spec is not None and out.dtype != np.float64:
        raise TypeError(f"accumulate to a format: float64 arrays expected, got {out.dtype}")
    if out.dtype not in (np.float32, np.float64) or src.dtype != out.dtype:
        raise TypeError(f"accumulate: float32/float64 arrays of one dtype expected, got "
                        f"{out.dtype} and {src.dtype}")
    if pos.dtype != np.int64 or pos.shape != src.shape or pos.ndim != 1 or out.ndim != 1:
        raise ValueError("accumulate: 1-D int64 positions and 1-D source of one length expected")
    if pos.size and (pos.min() < 0 or pos.max() >= out.size):
        raise IndexError(f"accumulate: position out of range [0, {out.size})")


def accumulate(out: np.ndarray, pos: np.ndarray, src: np.ndarray, key: int, mode: int, t: int,
               *, op: int = ADD, include_self: bool = True, spec: tuple | None = None
               ) -> np.ndarray:
    """``out[pos[k]] = RND(out[pos[k]] ∘ src[k])`` for k in increasing order, in place on
    ``out`` (1-D float32/float64; ``pos`` int64; ``src`` of out's dtype), at ``t``
    significand bits under rounding ``mode``; random bits ``bits64(key, k)``. Returns out.
    ``spec``: round to that format ((p, emin, emax, maxv, flags) of
    :meth:`numvar.rounding.Format.spec`, float64 arrays) instead of out's dtype."""
    _check(out, pos, src, spec)
    touched = np.zeros(out.size if not include_self else 0, dtype=np.bool_)
    if src.size and spec is not None:
        _accumulate_format_kernel(out, np.ascontiguousarray(pos), np.ascontiguousarray(src),
                                  np.uint64(key), mode, t, *spec, op == MUL, include_self,
                                  touched)
    elif src.size:
        _accumulate_kernel(out, np.ascontiguousarray(pos), np.ascontiguousarray(src),
                           np.uint64(key), mode, t, out.dtype == np.float32, op == MUL,
                           include_self, touched)
    return out


def accumulate_reference(out: np.ndarray, pos: np.ndarray, src: np.ndarray, key: int, mode: int,
                         t: int, *, op: int = ADD, include_self: bool = True,
                         spec: tuple | None = None) -> np.ndarray:
    """Slow, obviously sequential reference of :func:`accumulate` (same order, same bits)."""
    _check(out, pos, src, spec)
    is32 = out.dtype == np.float32
    if spec is not None:
        code = K.OP_MUL if op == MUL else K.OP_ADD

        def fn(a, b, mode, t, r):
            return K.format_binary(code, a, b, mode, t, *spec, r)
    elif op == MUL:
        fn = K.mul_f32 if is32 else K.mul_f64
    else:
        fn = K.add_f32 if is32 else K.add_f64
    seen: set[int] = set()
    for k in range(src.size):
        p = int(pos[k])
        if not include_self and p not in seen:
            out[p] = src[k]
            seen.add(p)
            continue
        r = np.uint64(K.bits64(np.uint64(key), np.uint64(k)))
        out[p] = fn(np.float64(out[p]), np.float64(src[k]), mode, t, r)
    return out


def accumulate_exact(init: np.ndarray, pos: np.ndarray, src: np.ndarray, *, op: int = ADD,
                     include_self: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The accumulation of :func:`accumulate` without rounding: float64 ``(hi, lo)`` with
    ``hi + lo`` the sum (Sum2: TwoSum on every add, the errors summed in float64, one
    final TwoSum), or for products the float64 product (lo = 0)."""
    hi = np.array(init, dtype=np.float64).reshape(-1)
    lo = np.zeros_like(hi)
    touched = np.zeros(hi.size if not include_self else 0, dtype=np.bool_)
    src = np.ascontiguousarray(src, dtype=np.float64)
    _exact_kernel(hi, lo, np.ascontiguousarray(pos, dtype=np.int64), src, op == MUL,
                  include_self, touched)
    return hi, lo


# ------------------------------------------------------------ destination positions
def _linear(shape) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.int64).view(tuple(shape))


def positions_index_put(shape, indices) -> torch.Tensor:
    """Flat destinations of ``index_put(self, indices, values)`` in the C order of the
    indexed result ``self[indices]`` (``None`` entries: whole dimensions)."""
    idx = tuple(slice(None) if i is None else i.cpu() for i in indices)
    return _linear(shape)[idx]


def _coords(shape, dim: int, along: torch.Tensor) -> torch.Tensor:
    """Flat positions in a C-contiguous tensor of ``shape`` of the grid ``along.shape``
    whose coordinate ``dim`` is ``along`` (the others their own index)."""
    nd = len(shape)
    strides = [1] * nd
    for d in range(nd - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    pos = along.to(torch.int64) * strides[dim]
    for d in range(nd):
        if d != dim:
            view = [1] * nd
            view[d] = along.shape[d]
            pos = pos + torch.arange(along.shape[d], dtype=torch.int64).view(view) * strides[d]
    return pos


def positions_scatter(shape, dim: int, index: torch.Tensor) -> torch.Tensor:
    """Flat destinations of ``scatter*(self, dim, index, src)``: source element at
    multi-index i (in ``index.shape``) goes to i with coordinate ``dim`` = index[i]."""
    if len(shape) == 0:
        return index.reshape(-1).to(torch.int64) * 0
    index = index.cpu()
    return _coords(shape, dim % len(shape), torch.where(index < 0, index + shape[dim], index))


def positions_index_add(shape, dim: int, index: torch.Tensor, source_shape) -> torch.Tensor:
    """Flat destinations of ``index_add(self, dim, index, source)``: source element at
    multi-index i goes to i with coordinate ``dim`` = index[i[dim]]."""
    if len(shape) == 0:
        return torch.zeros(index.numel(), dtype=torch.int64)
    dim = dim % len(shape)
    index = index.cpu().reshape(-1).to(torch.int64)
    index = torch.where(index < 0, index + shape[dim], index)
    view = [1] * len(shape)
    view[dim] = -1
    along = index.view(view).expand(tuple(source_shape))
    return _coords(shape, dim, along)


# ----------------------------------------------------------------- tensor interface
def two_prod(a: np.ndarray, b: float) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's TwoProduct, elementwise: ``p = RN(a·b)`` and ``e = a·b − p`` exactly (the
    arithmetic of numvar.rounding.kernels.two_prod; finite, non-extreme operands)."""
    p = a * b
    c = K._SPLIT * a
    ah = c - (c - a)
    al = a - ah
    cb = K._SPLIT * b
    bh = cb - (cb - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, np.where(np.isfinite(p), e, 0.0)


def scatter_accumulate(ctx: Ctx, self: torch.Tensor, pos: torch.Tensor, src: torch.Tensor, *,
                       op: int = ADD, include_self: bool = True, scale: float = 1
                       ) -> torch.Tensor:
    """A copy of ``self`` with ``src`` (same number of elements as ``pos``, C order)
    accumulated at the flat positions ``pos``: every add (multiply) rounded at ``flop``
    granularity, in the order of the module docstring; rounded once at ``op``. ``scale``
    (op granularity, sums only): accumulate the exact products ``scale·src``."""
    dtype = self.dtype
    kd = _kdtype(dtype)
    flat_pos = pos.reshape(-1).to(torch.int64).contiguous().numpy()
    if ctx.granularity == "op":
        s64 = _np(src.reshape(-1), torch.float64)
        if scale != 1:
            p, e = two_prod(s64, float(scale))
            s64, flat_pos = np.concatenate([p, e]), np.concatenate([flat_pos, flat_pos])
        hi, lo = accumulate_exact(_np(self.reshape(-1), torch.float64), flat_pos, s64, op=op,
                                  include_self=include_self)
        out = ctx.round(torch.from_numpy(hi), dtype, torch.from_numpy(lo))
        return out.to(self.device).reshape(self.shape)
    key = ctx.stream.next_key()
    if ctx.target(dtype) is None:
        out = _np(self.reshape(-1), kd).copy()
        accumulate(out, flat_pos, _np(src.reshape(-1), kd), key, ctx.code, ctx.bits(dtype),
                   op=op, include_self=include_self)
        return _back(out, dtype, self.device).reshape(self.shape)
    # fuzzy(format=...): the block's accumulation policy (Ctx.accumulation), as flop.py
    acc = ctx.accumulation(dtype)
    if acc.spec is not None:
        out = _np(self.reshape(-1), torch.float64).copy()
        accumulate(out, flat_pos, _np(src.reshape(-1), torch.float64), key, ctx.code, acc.t,
                   op=op, include_self=include_self, spec=acc.spec)
    else:
        out = _np(self.reshape(-1), acc.kernel_dtype).copy()
        accumulate(out, flat_pos, _np(src.reshape(-1), acc.kernel_dtype), key, ctx.code,
                   acc.t, op=op, include_self=include_self)
    # the result rounded once to the format: the partial sums of accumulate="native", and
    # the destinations no add reached (copies of self or of a first source); values the
    # format kernel already rounded are on the grid and stay unchanged
    out = ctx.round(torch.from_numpy(out).to(torch.float64), dtype)
    return out.to(self.device).reshape(self.shape)
