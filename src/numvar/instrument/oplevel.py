"""Op granularity for ops with a scalar multiplier: one rounding of the exact result.

At ``op`` granularity every op's result is rounded once. For ``add``/``sub``/``rsub``
with ``alpha``, ``addcmul``, ``addcdiv`` and ``lerp`` numvar computes the exact value of
the whole op as an unevaluated sum ``hi + lo`` of float64 tensors (error-free
transformations: TwoSum, TwoProduct by Veltkamp splitting, the division residual),
folds it into one binary64 number by rounding to odd (:func:`round_to_odd`) and rounds
that once to the result format, so that ``mode="ieee"`` gives the correctly rounded
result (tested against Fractions). That is what PyTorch's CPU ``add(x, y, alpha=a)`` returns for
binary32 (a fused multiply-add); rounding ``a·y`` first and the sum second (two roundings)
differs from it in about a quarter of the elements.

Scalars are taken as the op's kernel takes them: operands are converted to the result
dtype (PyTorch's type promotion) and a Python-number multiplier to binary32 for
binary32/bfloat16/float16 results (the kernels' ``opmath`` type). binary64 results go
through :func:`~numvar.instrument.handlers.op_once` (the native result counts as exact).
The exact value is computed by a numba kernel (:func:`_parts_kernel`) whose slow
reference, :func:`parts_reference`, does the same in torch; tests compare them.
The contractions with ``alpha``/``beta`` (``addmm``, ``baddbmm``, ``addbmm``, ``addmv``,
``addr``) are computed in float64 with their scalars so converted and rounded once.
``alpha == 1`` keeps the elementwise kernels (a single operation, rounded once anyway).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from numvar.rounding import kernels as K
from numvar.rounding._torch import two_prod, two_sum

from . import cplx
from . import ops as O
from ._core import FLOATS, operands, result_dtype
from .handlers import EXACT, OP_HANDLERS, _float_result, _get, _with_alpha, op_once, register

_F64 = torch.float64


def opmath_scalar(x, dtype: torch.dtype):
    """A multiplier as the kernel of a ``dtype`` op uses it: a Python number converted to
    binary32 (binary64 for binary64 ops); a tensor in float64."""
    if isinstance(x, torch.Tensor):
        return x.to(_F64)
    if dtype is _F64:
        return float(x)
    return float(torch.tensor(float(x), dtype=torch.float32))


def _f64(*xs):
    """The operands in the result dtype (type promotion, scalars converted), then float64."""
    return [t.to(_F64) for t in operands(*xs)]


OP_AXPY, OP_ADDCMUL, OP_ADDCDIV, OP_LERP = range(4)
_ZERO = torch.zeros((), dtype=_F64)


def parts_reference(op: int, a, b, c, s: float):
    """``(hi, lo)``, float64 tensors whose sum is the exact result of ``op`` on float64
    tensors ``a, b, c`` holding values of a format of at most 24 bits, and a binary32
    scalar ``s`` (the slow reference of :func:`_parts_kernel`):

    * OP_AXPY ``a + s·b`` (the product is exact in float64: 24 + 24 bits);
    * OP_ADDCMUL ``a + (s·b)·c`` (TwoProduct for the second product);
    * OP_ADDCDIV ``a + (s·b)/c`` (the quotient and its residual ``(n − q·c)/c``: exact
      up to a relative 2^-100);
    * OP_LERP ``a + c·(b − a)`` (TwoSum for the difference, TwoProduct for the scaling).
    """
    if op == OP_AXPY:
        hi, lo = two_sum(a, b * s)
    elif op == OP_ADDCMUL:
        ph, pl = two_prod(b * s, c)
        hi, e = two_sum(a, ph)
        lo = e + pl
    elif op == OP_ADDCDIV:
        n = b * s
        q = n / c
        qp, ql = two_prod(q, c)
        r = torch.where(torch.isfinite(q), ((n - qp) - ql) / c, _ZERO)
        hi, e = two_sum(a, q)
        lo = e + r
    else:
        d, de = two_sum(b, -a)
        ph, pl = two_prod(d, c)
        hi, e = two_sum(a, ph)
        lo = e + (pl + de * c)
    lo = torch.where(torch.isfinite(hi) & torch.isfinite(lo), lo, _ZERO)
    return hi, lo


def round_to_odd(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """``hi + lo`` (``hi = RN(hi + lo)``) rounded to odd in binary64: ``hi`` when ``lo``
    is 0, else whichever of the two binary64 numbers around the exact value has an odd
    significand. Rounding that once more to a format of at most 51 bits is exact the
    same as rounding ``hi + lo`` (Boldo & Melquiond, "Emulation of FMA and correctly
    rounded sums: proved algorithms using rounding to odd", IEEE TC 2008) for round to
    nearest; for SR the probability moves by less than 2^-29 of the binary32 ulp (the
    resolution of the binary64 → binary32 SR step anyway), and an inexact value never
    becomes exact. The torch form (reference) of the kernel's last step."""
    bits = hi.view(torch.int64)
    mag = bits & 0x7FFFFFFFFFFFFFFF
    away = (lo > 0) != (hi < 0)
    odd = torch.where(away, mag | 1, (mag - 1) | 1)
    mag = torch.where(lo != 0, odd, mag)
    return ((bits & -0x8000000000000000) | mag).view(torch.float64)


@njit(cache=True, error_model="numpy")
def _parts_kernel(op, a, b, c, s, hi, lo):  # pragma: no cover - compiled
    """:func:`parts_reference` on binary32 arrays of one shape, element by element, then
    ``hi`` := :func:`round_to_odd` (hi, lo)."""
    for i in range(hi.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if op == OP_AXPY:
            h, lw = K.two_sum(x, y * s)
        elif op == OP_ADDCMUL:
            ph, pl = K.two_prod(y * s, np.float64(c[i]))
            h, e = K.two_sum(x, ph)
            lw = e + pl
        elif op == OP_ADDCDIV:
            z = np.float64(c[i])
            n = y * s
            q = n / z
            qp, ql = K.two_prod(q, z)
            r = ((n - qp) - ql) / z if abs(q) < np.inf else 0.0
            h, e = K.two_sum(x, q)
            lw = e + r
        else:
            w = np.float64(c[i])
            d, de = K.two_sum(y, -x)
            ph, pl = K.two_prod(d, w)
            h, e = K.two_sum(x, ph)
            lw = e + (pl + de * w)
        hi[i] = h
        lo[i] = lw if (abs(h) < np.inf and abs(lw) < np.inf) else 0.0
    _to_odd(hi, lo)


@njit(cache=True, error_model="numpy")
def _to_odd(hi, lo):  # pragma: no cover - compiled
    """hi := hi + lo rounded to odd in binary64 (see :func:`round_to_odd`), in place."""
    bits = hi.view(np.int64)
    for i in range(hi.size):
        lw = lo[i]
        if lw != 0.0:
            m = bits[i] & 0x7FFFFFFFFFFFFFFF
            if (lw > 0.0) != (hi[i] < 0.0):  # the exact value lies farther from zero
                m = m | 1
            else:
                m = (m - 1) | 1
            bits[i] = (bits[i] & np.int64(-0x8000000000000000)) | m


def _round_parts(ctx, op: int, dtype, s: float, *xs, weight=None):
    """Round the exact result of ``op`` (see :func:`parts_reference`) on ``xs`` (converted
    to ``dtype`` by type promotion) and ``weight`` (lerp's, as given) once to ``dtype``.
    CPU operands with numba take :func:`_parts_kernel`; others the torch reference."""
    ts = operands(*xs) + ([weight] if weight is not None else [])
    ts = torch.broadcast_tensors(*ts)
    if ctx._numba and all(t.is_cpu for t in ts):
        arrs = [t.to(torch.float32).contiguous().view(-1).numpy() for t in ts]
        hi = torch.empty(ts[0].shape, dtype=_F64)
        lo = torch.empty(ts[0].shape, dtype=_F64)
        if hi.numel():
            c = arrs[2] if len(arrs) > 2 else arrs[0]
            _parts_kernel(op, arrs[0], arrs[1], c, s, hi.view(-1).numpy(), lo.view(-1).numpy())
        # hi now holds hi + lo rounded to odd
    else:
        f = [t.to(_F64) for t in ts]
        hi, lo = parts_reference(op, f[0], f[1], f[2] if len(f) > 2 else None, s)
        hi = round_to_odd(hi, lo)
    return ctx.round(hi, dtype)


def _axpy(ctx, func, args, kwargs, sign: float, reverse: bool = False):
    """``a + sign·alpha·b`` (``reverse``: ``b + sign·alpha·a``, as rsub) rounded once."""
    a, b = args[0], args[1]
    alpha = _get(args, kwargs, 2, "alpha", 1)
    if alpha == 1 or cplx.any_complex(a, b):  # one op anyway; complex: handlers' own
        return _with_alpha(ctx, func, args, kwargs, ctx.add if sign > 0 else ctx.sub, reverse)
    if not _float_result(a, b):
        return EXACT
    dtype = result_dtype(a, b)
    if dtype is _F64 or dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    if reverse:
        a, b = b, a
    return _round_parts(ctx, OP_AXPY, dtype, sign * opmath_scalar(alpha, dtype), a, b)


@register("aten.add", table=OP_HANDLERS, how="rounded once (op)")
def _add_once(ctx, func, args, kwargs):
    return _axpy(ctx, func, args, kwargs, 1.0)


@register("aten.sub", table=OP_HANDLERS, how="rounded once (op)")
def _sub_once(ctx, func, args, kwargs):
    return _axpy(ctx, func, args, kwargs, -1.0)


@register("aten.rsub", table=OP_HANDLERS, how="rounded once (op)")
def _rsub_once(ctx, func, args, kwargs):
    return _axpy(ctx, func, args, kwargs, -1.0, reverse=True)


def _ternary(ctx, func, args, kwargs, op: int):
    """addcmul/addcdiv: ``self + value·t1 ∘ t2`` rounded once."""
    s, t1, t2 = args[:3]
    if cplx.any_complex(s, t1, t2):
        return op_once(ctx, func, args, kwargs)
    if not _float_result(s, t1, t2):
        return EXACT
    dtype = result_dtype(s, t1, t2)
    if dtype is _F64 or dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    value = opmath_scalar(_get(args, kwargs, 3, "value", 1), dtype)
    return _round_parts(ctx, op, dtype, value, s, t1, t2)


@register("aten.addcmul", table=OP_HANDLERS, how="rounded once (op)")
def _addcmul_once(ctx, func, args, kwargs):
    """``self + value·t1·t2`` exactly: one TwoProduct, one TwoSum, one rounding."""
    return _ternary(ctx, func, args, kwargs, OP_ADDCMUL)


@register("aten.addcdiv", table=OP_HANDLERS, how="rounded once (op)")
def _addcdiv_once(ctx, func, args, kwargs):
    """``self + value·t1/t2``: the quotient and its residual, one rounding."""
    return _ternary(ctx, func, args, kwargs, OP_ADDCDIV)


@register("aten.lerp", table=OP_HANDLERS, how="rounded once (op)")
def _lerp_once(ctx, func, args, kwargs):
    """``a + w·(b − a)`` exactly (TwoSum for b − a, TwoProduct for the scaling)."""
    a, b, w = args[:3]
    if cplx.any_complex(a, b, w):
        return op_once(ctx, func, args, kwargs)
    if not _float_result(a, b):
        return EXACT
    dtype = result_dtype(a, b)
    if dtype is _F64 or dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    if not isinstance(w, torch.Tensor):
        w = torch.tensor(opmath_scalar(w, dtype), dtype=torch.float32, device=b.device)
    return _round_parts(ctx, OP_LERP, dtype, 1.0, a, b, weight=w)


#: contractions with scalar multipliers: (index of beta, index of alpha) in the schema
_SCALED = {"aten.addmm": (3, 4), "aten.baddbmm": (3, 4), "aten.addbmm": (3, 4),
           "aten.addmv": (3, 4), "aten.addr": (3, 4)}


def _scaled_contraction(ctx, func, args, kwargs):
    """float64 contraction with alpha/beta converted as the kernel converts them; once."""
    if len(args) <= 3 and not kwargs:
        return op_once(ctx, func, args, kwargs)  # (no multiplier given: 1 and 1)
    dtype = result_dtype(*args[:3])
    if dtype in FLOATS and dtype is not _F64:
        args, kwargs = list(args), dict(kwargs)
        for i, name in zip(_SCALED[O.packet_name(func)], ("beta", "alpha")):
            if name in kwargs:
                kwargs[name] = opmath_scalar(kwargs[name], dtype)
            elif len(args) > i:
                args[i] = opmath_scalar(args[i], dtype)
    return op_once(ctx, func, tuple(args), kwargs)


for _name in _SCALED:
    register(_name, table=OP_HANDLERS, how="rounded once (op)")(_scaled_contraction)
