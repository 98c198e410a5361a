"""Op granularity for ops with a scalar multiplier: one rounding of the exact result.

At ``op`` granularity every op's result is rounded once. For ``add``/``sub``/``rsub``
with ``alpha``, ``addcmul``, ``addcdiv`` and ``lerp`` numvar computes the exact value of
the whole op as an unevaluated sum ``hi + lo`` of float64 tensors (error-free
transformations: TwoSum, TwoProduct by Veltkamp splitting, the division residual) and
rounds it once (``numvar.rounding.round(hi, lo)``), so that ``mode="ieee"`` gives the
correctly rounded result. That is what PyTorch's CPU ``add(x, y, alpha=a)`` returns for
binary32 (a fused multiply-add); rounding ``a·y`` first and the sum second (two roundings)
differs from it in about a quarter of the elements.

Scalars are taken as the op's kernel takes them: operands are converted to the result
dtype (PyTorch's type promotion) and a Python-number multiplier to binary32 for
binary32/bfloat16/float16 results (the kernels' ``opmath`` type). binary64 results go
through :func:`~numvar.instrument.handlers.op_once` (the native result counts as exact).
The contractions with ``alpha``/``beta`` (``addmm``, ``baddbmm``, ``addbmm``, ``addmv``,
``addr``) are computed in float64 with their scalars so converted and rounded once.
``alpha == 1`` keeps the elementwise kernels (a single operation, rounded once anyway).
"""

from __future__ import annotations

import torch

from numvar.rounding._torch import two_prod, two_sum

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


def _renorm(hi, lo):
    """``hi + lo`` with non-finite parts cleaned (inf/NaN results carry no residual)."""
    lo = torch.where(torch.isfinite(hi) & torch.isfinite(lo), lo, torch.zeros((), dtype=_F64))
    return hi, lo


def _once(ctx, hi, lo, dtype):
    hi, lo = _renorm(hi, lo)
    return ctx.round(hi, dtype, lo)


def _axpy(ctx, func, args, kwargs, sign: float, reverse: bool = False):
    """``a + sign·alpha·b`` (``reverse``: ``b + sign·alpha·a``, as rsub) rounded once."""
    a, b = args[0], args[1]
    if not _float_result(a, b):
        return EXACT
    alpha = _get(args, kwargs, 2, "alpha", 1)
    dtype = result_dtype(a, b)
    if alpha == 1:
        return _with_alpha(ctx, args, kwargs, ctx.add if sign > 0 else ctx.sub, reverse)
    if dtype is _F64 or dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    x, y = _f64(a, b)
    if reverse:
        x, y = y, x
    ph, pl = two_prod(y, sign * opmath_scalar(alpha, dtype))
    h, e = two_sum(x, ph)
    return _once(ctx, h, e + pl, dtype)


@register("aten.add", table=OP_HANDLERS, how="rounded once (op)")
def _add_once(ctx, func, args, kwargs):
    return _axpy(ctx, func, args, kwargs, 1.0)


@register("aten.sub", table=OP_HANDLERS, how="rounded once (op)")
def _sub_once(ctx, func, args, kwargs):
    return _axpy(ctx, func, args, kwargs, -1.0)


@register("aten.rsub", table=OP_HANDLERS, how="rounded once (op)")
def _rsub_once(ctx, func, args, kwargs):
    return _axpy(ctx, func, args, kwargs, -1.0, reverse=True)


def _ternary(ctx, func, args, kwargs):
    """(s, t1, t2, value, dtype) of addcmul/addcdiv, or None where op_once applies."""
    s, t1, t2 = args[:3]
    dtype = result_dtype(s, t1, t2)
    if dtype is _F64 or dtype not in FLOATS:
        return None
    value = opmath_scalar(_get(args, kwargs, 3, "value", 1), dtype)
    return (*_f64(s, t1, t2), value, dtype)


@register("aten.addcmul", table=OP_HANDLERS, how="rounded once (op)")
def _addcmul_once(ctx, func, args, kwargs):
    """``self + value·t1·t2`` exactly: two TwoProducts, one TwoSum, one rounding."""
    if not _float_result(*args[:3]):
        return EXACT
    parts = _ternary(ctx, func, args, kwargs)
    if parts is None:
        return op_once(ctx, func, args, kwargs)
    s, t1, t2, v, dtype = parts
    n, nl = two_prod(t1, v)
    ph, pl = two_prod(n, t2)
    h, e = two_sum(s, ph)
    return _once(ctx, h, e + (pl + nl * t2), dtype)


@register("aten.addcdiv", table=OP_HANDLERS, how="rounded once (op)")
def _addcdiv_once(ctx, func, args, kwargs):
    """``self + value·t1/t2``: the quotient and its residual ``(n − q·t2)/t2``, one rounding."""
    if not _float_result(*args[:3]):
        return EXACT
    parts = _ternary(ctx, func, args, kwargs)
    if parts is None:
        return op_once(ctx, func, args, kwargs)
    s, t1, t2, v, dtype = parts
    n, nl = two_prod(t1, v)
    q = n / t2
    qp, ql = two_prod(q, t2)
    r = (((n - qp) - ql) + nl) / t2
    r = torch.where(torch.isfinite(q), r, torch.zeros((), dtype=_F64))
    h, e = two_sum(s, q)
    return _once(ctx, h, e + r, dtype)


@register("aten.lerp", table=OP_HANDLERS, how="rounded once (op)")
def _lerp_once(ctx, func, args, kwargs):
    """``a + w·(b − a)`` exactly (TwoSum for b − a, TwoProduct for the scaling)."""
    a, b, w = args[:3]
    if not _float_result(a, b):
        return EXACT
    dtype = result_dtype(a, b)
    if dtype is _F64 or dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    x, y = _f64(a, b)
    wt = opmath_scalar(w, dtype)
    d, de = two_sum(y, -x)
    ph, pl = two_prod(d, wt)
    h, e = two_sum(x, ph)
    return _once(ctx, h, e + (pl + de * wt), dtype)


#: contractions with scalar multipliers: (index of beta, index of alpha) in the schema
_SCALED = {"aten.addmm": (3, 4), "aten.baddbmm": (3, 4), "aten.addbmm": (3, 4),
           "aten.addmv": (3, 4), "aten.addr": (3, 4)}


def _scaled_contraction(ctx, func, args, kwargs):
    """float64 contraction with alpha/beta converted as the kernel converts them; once."""
    dtype = result_dtype(*args[:3])
    if dtype in FLOATS and dtype is not _F64:
        args, kwargs = list(args), dict(kwargs)
        for i, name in zip(_SCALED[f"aten.{func._schema.name.split('::')[1]}"], ("beta", "alpha")):
            if name in kwargs:
                kwargs[name] = opmath_scalar(kwargs[name], dtype)
            elif len(args) > i:
                args[i] = opmath_scalar(args[i], dtype)
    return op_once(ctx, func, tuple(args), kwargs)


for _name in _SCALED:
    register(_name, table=OP_HANDLERS, how="rounded once (op)")(_scaled_contraction)
