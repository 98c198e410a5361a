"""The handler table: one small function per op family, registered by aten name.

``FLOP_HANDLERS[name](ctx, func, args, kwargs)`` computes an op at ``flop`` granularity;
``OP_HANDLERS`` holds the few ops that need special care at ``op`` granularity too
(dropout, foreach). Everything else at ``op`` granularity goes through :func:`op_once`.
Adding an op means adding one entry (as ``torch/utils/flop_counter.py`` registers its
formulas).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce as _reduce

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from . import flop
from ._core import FLOATS, Ctx, is_float_tensor, result_dtype

Handler = Callable[[Ctx, object, tuple, dict], object]
FLOP_HANDLERS: dict[str, Handler] = {}
OP_HANDLERS: dict[str, Handler] = {}
#: how each registered handler rounds (for the report)
HOW: dict[str, str] = {}

#: returned by a handler to ask the mode to run the op natively (exact after all)
EXACT = object()


def register(*names: str, table: dict[str, Handler] = FLOP_HANDLERS, how: str = "flop"):
    def deco(fn: Handler) -> Handler:
        for n in names:
            table[n] = fn
            HOW.setdefault(n, how)
        return fn

    return deco


def _get(args, kwargs, i: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


# ------------------------------------------------------------------ op once (generic)
_OUT_DTYPES: dict = {}


def _meta_out_dtypes(func, flat, spec):
    """Output dtypes of ``func`` on these inputs (run once per signature on 'meta')."""
    sig = (func, tuple(x.dtype if isinstance(x, torch.Tensor) else
                       (x if isinstance(x, torch.dtype) else None) for x in flat))
    if sig in _OUT_DTYPES:
        return _OUT_DTYPES[sig]
    try:
        meta = [x.detach().to("meta") if isinstance(x, torch.Tensor) else x for x in flat]
        a, k = tree_unflatten(meta, spec)
        out = func(*a, **k)
        res = [o.dtype if isinstance(o, torch.Tensor) else None for o in tree_flatten(out)[0]]
    except Exception:  # no meta kernel: fall back to type promotion
        res = None
    _OUT_DTYPES[sig] = res
    return res


def op_once(ctx: Ctx, func, args, kwargs):
    """One rounding of each float output, computed from float64 inputs.

    For binary32/16 inputs the op runs in float64 (its result is the "exact" value that
    is rounded once); for binary64 inputs it runs natively and its result counts as
    exact (only UD, or a virtual precision, perturbs it). Mutated arguments (running
    statistics) are rounded back into place.
    """
    flat, spec = tree_flatten((args, kwargs))
    dts = [x.dtype for x in flat if is_float_tensor(x)]
    if not dts:
        return func(*args, **kwargs)
    out_dts = _meta_out_dtypes(func, flat, spec)
    promoted = _reduce(torch.promote_types, dts)
    up = []
    for x in flat:
        if is_float_tensor(x) and x.dtype != torch.float64:
            x = x.to(torch.float64)
        elif isinstance(x, torch.dtype) and x in FLOATS:
            x = torch.float64
        up.append(x)
    a2, k2 = tree_unflatten(up, spec)
    out = func(*a2, **k2)
    # rounded write-back of mutated float arguments (e.g. batch norm running stats)
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            orig = kwargs.get(arg.name) if arg.kwarg_only or arg.name in kwargs else (
                args[i] if i < len(args) else None)
            new = k2.get(arg.name) if arg.kwarg_only or arg.name in kwargs else (
                a2[i] if i < len(a2) else None)
            if is_float_tensor(orig) and new is not orig:
                orig.copy_(ctx.round(new, orig.dtype))
    oflat, ospec = tree_flatten(out)
    res = []
    for j, o in enumerate(oflat):
        if is_float_tensor(o):
            target = out_dts[j] if out_dts is not None and j < len(out_dts) and out_dts[j] else promoted
            if target in FLOATS:
                o = ctx.round(o, target)
        res.append(o)
    return tree_unflatten(res, ospec)


def f64_once(ctx: Ctx, func, args, kwargs):
    """Transcendentals at flop granularity: one rounding of the float64 result."""
    return op_once(ctx, func, args, kwargs)


# ------------------------------------------------------------------ pointwise arithmetic
def _float_result(*xs) -> bool:
    return result_dtype(*xs) in FLOATS


@register("aten.add", "prims.add", how="elementwise")
def _add(ctx, func, args, kwargs):
    a, b = args[0], args[1]
    if not _float_result(a, b):
        return EXACT
    alpha = _get(args, kwargs, 2, "alpha", 1)
    if alpha != 1:
        b = ctx.mul(b, alpha)
    return ctx.add(a, b)


@register("aten.sub", "prims.sub", how="elementwise")
def _sub(ctx, func, args, kwargs):
    a, b = args[0], args[1]
    if not _float_result(a, b):
        return EXACT
    alpha = _get(args, kwargs, 2, "alpha", 1)
    if alpha != 1:
        b = ctx.mul(b, alpha)
    return ctx.sub(a, b)


@register("aten.rsub", how="elementwise")
def _rsub(ctx, func, args, kwargs):
    a, b = args[0], args[1]
    if not _float_result(a, b):
        return EXACT
    alpha = _get(args, kwargs, 2, "alpha", 1)
    if alpha != 1:
        a = ctx.mul(a, alpha)
    return ctx.sub(b, a)


@register("aten.mul", "prims.mul", how="elementwise")
def _mul(ctx, func, args, kwargs):
    a, b = args[0], args[1]
    if not _float_result(a, b):
        return EXACT
    return ctx.mul(a, b)


@register("aten.div", "aten.true_divide", "prims.div", how="elementwise")
def _div(ctx, func, args, kwargs):
    a, b = args[0], args[1]
    if _get(args, kwargs, 2, "rounding_mode") is not None:
        return op_once(ctx, func, args, kwargs)
    if not _float_result(a, b) and func._schema.name != "prims::div":
        # true division of integers promotes to the default float dtype
        dt = torch.get_default_dtype()
        a = a.to(dt) if isinstance(a, torch.Tensor) else a
    elif not _float_result(a, b):
        return EXACT
    return ctx.div(a, b)


@register("aten.sqrt", "prims.sqrt", how="elementwise")
def _sqrt(ctx, func, args, kwargs):
    (a,) = args[:1]
    if a.dtype not in FLOATS:
        a = a.to(torch.get_default_dtype())
    return ctx.sqrt(a)


@register("aten.reciprocal", how="elementwise")
def _reciprocal(ctx, func, args, kwargs):
    a = args[0]
    if a.dtype not in FLOATS:
        a = a.to(torch.get_default_dtype())
    return ctx.div(1.0, a)


@register("aten.square", how="elementwise")
def _square(ctx, func, args, kwargs):
    a = args[0]
    if a.dtype not in FLOATS:
        return EXACT
    return ctx.mul(a, a)


@register("aten.pow", how="elementwise")
def _pow(ctx, func, args, kwargs):
    a, e = args[0], args[1]
    if isinstance(a, torch.Tensor) and not isinstance(e, torch.Tensor) and a.dtype in FLOATS:
        if e == 2:
            return ctx.mul(a, a)
        if e == 1:
            return a.clone()
        if e == 0.5:
            return ctx.sqrt(a)
        if e == -1:
            return ctx.div(1.0, a)
    if not any(is_float_tensor(x) for x in (a, e)):
        return EXACT
    return op_once(ctx, func, args, kwargs)


@register("aten.addcmul", how="elementwise")
def _addcmul(ctx, func, args, kwargs):
    """``RND(self + RND(RND(value·t1)·t2))`` (PyTorch's CPU evaluation order)."""
    s, t1, t2 = args[:3]
    value = _get(args, kwargs, 3, "value", 1)
    if not _float_result(s, t1, t2):
        return EXACT
    p = t1 if value == 1 else ctx.mul(value, t1)
    return ctx.add(s, ctx.mul(p, t2))


@register("aten.addcdiv", how="elementwise")
def _addcdiv(ctx, func, args, kwargs):
    """``RND(self + RND(RND(value·t1)/t2))`` (PyTorch's CPU evaluation order)."""
    s, t1, t2 = args[:3]
    value = _get(args, kwargs, 3, "value", 1)
    if not _float_result(s, t1, t2):
        return EXACT
    p = t1 if value == 1 else ctx.mul(value, t1)
    return ctx.add(s, ctx.div(p, t2))


@register("aten.lerp", how="elementwise")
def _lerp(ctx, func, args, kwargs):
    """PyTorch's formula: ``|w| < ½ ? a + w·(b − a) : b − (b − a)·(1 − w)``, each op rounded."""
    a, b, w = args[:3]
    d = ctx.sub(b, a)
    if not isinstance(w, torch.Tensor):
        if abs(w) < 0.5:
            return ctx.add(a, ctx.mul(w, d))
        return ctx.sub(b, ctx.mul(d, ctx.sub(1.0, torch.tensor(w, dtype=d.dtype))))
    lo = ctx.add(a, ctx.mul(w, d))
    hi = ctx.sub(b, ctx.mul(d, ctx.sub(1.0, w.to(d.dtype))))
    return torch.where(w.abs() < 0.5, lo, hi)


# ------------------------------------------------------------------------ contractions
@register("aten.mm")
def _mm(ctx, func, args, kwargs):
    a, b = args[:2]
    if not _float_result(a, b):
        return EXACT
    return flop.mm(a, b, ctx)


@register("aten.bmm")
def _bmm(ctx, func, args, kwargs):
    a, b = args[:2]
    if not _float_result(a, b):
        return EXACT
    return flop.bmm(a, b, ctx)


@register("aten.addmm")
def _addmm(ctx, func, args, kwargs):
    c, a, b = args[:3]
    if not _float_result(a, b):
        return EXACT
    beta = _get(args, kwargs, 3, "beta", 1)
    alpha = _get(args, kwargs, 4, "alpha", 1)
    return flop.scale_add(flop.mm(a, b, ctx), c, alpha, beta, ctx)


@register("aten.baddbmm")
def _baddbmm(ctx, func, args, kwargs):
    c, a, b = args[:3]
    if not _float_result(a, b):
        return EXACT
    beta = _get(args, kwargs, 3, "beta", 1)
    alpha = _get(args, kwargs, 4, "alpha", 1)
    return flop.scale_add(flop.bmm(a, b, ctx), c, alpha, beta, ctx)


@register("aten._addmm_activation")
def _addmm_act(ctx, func, args, kwargs):
    c, a, b = args[:3]
    beta = _get(args, kwargs, 3, "beta", 1)
    alpha = _get(args, kwargs, 4, "alpha", 1)
    y = flop.scale_add(flop.mm(a, b, ctx), c, alpha, beta, ctx)
    if _get(args, kwargs, 5, "use_gelu", False):
        return op_once(ctx, torch.ops.aten.gelu.default, (y,), {})
    return torch.relu(y)


@register("aten.convolution", "aten._convolution")
def _convolution(ctx, func, args, kwargs):
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    if not _float_result(x, w):
        return EXACT
    return flop.convolution(x, w, bias, stride, padding, dilation, transposed,
                            output_padding, groups, ctx)


@register("aten.convolution_backward")
def _convolution_backward(ctx, func, args, kwargs):
    return flop.convolution_backward(*args[:11], ctx)


# -------------------------------------------------------------------------- reductions
@register("aten.sum", "prims.sum")
def _sum(ctx, func, args, kwargs):
    x = args[0]
    dtype = kwargs.get("dtype", kwargs.get("output_dtype"))
    prims = func._schema.name == "prims::sum"
    if prims or func._overloadname == "dim_IntList":
        dim = _get(args, kwargs, 1, "dims" if prims else "dim")
        keepdim = False if prims else _get(args, kwargs, 2, "keepdim", False)
    else:
        dim, keepdim = None, False
    target = dtype or x.dtype
    if target not in FLOATS:
        return EXACT
    return flop.reduce(x, dim, ctx, keepdim=keepdim, dtype=target)


@register("aten.mean")
def _mean(ctx, func, args, kwargs):
    x = args[0]
    dtype = kwargs.get("dtype")
    if func._overloadname == "dim":
        dim, keepdim = _get(args, kwargs, 1, "dim"), _get(args, kwargs, 2, "keepdim", False)
    else:
        dim, keepdim = None, False
    target = dtype or x.dtype
    return flop.mean(x, dim, ctx, keepdim=keepdim, dtype=target)


@register("aten.prod")
def _prod(ctx, func, args, kwargs):
    x = args[0]
    dtype = kwargs.get("dtype")
    if func._overloadname == "dim_int":
        dim, keepdim = [_get(args, kwargs, 1, "dim")], _get(args, kwargs, 2, "keepdim", False)
    else:
        dim, keepdim = None, False
    target = dtype or x.dtype
    if target not in FLOATS:
        return EXACT
    return flop.reduce(x, dim, ctx, keepdim=keepdim, mul=True, dtype=target)


@register("aten.cumsum", "aten.cumprod")
def _cumsum(ctx, func, args, kwargs):
    x, dim = args[0], _get(args, kwargs, 1, "dim")
    target = kwargs.get("dtype") or x.dtype
    if target not in FLOATS:
        return EXACT
    return flop.scan(x, dim, ctx, mul=func._schema.name == "aten::cumprod", dtype=target)


@register("prims.var")
def _prims_var(ctx, func, args, kwargs):
    x = args[0]
    dims = _get(args, kwargs, 1, "dims")
    correction = _get(args, kwargs, 2, "correction", 1)
    correction = 1 if correction is None else correction
    out = flop.var(x, dims, correction, ctx)
    dt = kwargs.get("output_dtype")
    return out if dt is None else out.to(dt)


# --------------------------------------------------------------------- special cases
def _dropout(ctx, func, args, kwargs):
    """Native dropout (so torch's RNG draws the same mask), then ``RND(x·scale)`` kept."""
    x, p = args[0], args[1]
    train = _get(args, kwargs, 2, "train", True)
    out, mask = func(*args, **kwargs)
    if not train or p == 0 or x.dtype not in FLOATS:
        return out, mask
    if p == 1:
        return out, mask
    scaled = ctx.mul(x, 1.0 / (1.0 - p))
    return torch.where(mask, scaled, torch.zeros((), dtype=scaled.dtype, device=scaled.device)), mask


register("aten.native_dropout", how="elementwise")(_dropout)
register("aten.native_dropout", table=OP_HANDLERS, how="elementwise")(_dropout)


@register("aten.max_pool2d_with_indices_backward", "aten.max_pool3d_with_indices_backward",
          how="exact or op")
def _maxpool_backward(ctx, func, args, kwargs):
    """Exact (a scatter) when windows do not overlap; else one rounding per element."""
    ks, stride, dilation = args[2], args[3], args[5]
    nd = len(ks)
    stride = list(stride) if len(stride) else list(ks)
    stride = stride * nd if len(stride) == 1 else stride
    ks = list(ks) * nd if len(ks) == 1 else list(ks)
    dilation = list(dilation) * nd if len(dilation) == 1 else list(dilation)
    if all(d * (k - 1) + 1 <= s for k, s, d in zip(ks, stride, dilation)):
        return EXACT
    return op_once(ctx, func, args, kwargs)


def _foreach(ctx, func, args, kwargs, mode=None):
    """``_foreach_op(lists...)`` as the per-tensor ops, each dispatched through the mode."""
    name = func._schema.name.split("::")[1][len("_foreach_"):]
    base = getattr(torch.ops.aten, name)
    lists = [a for a in args if isinstance(a, (list, tuple))]
    n = len(lists[0]) if lists else 0
    outs = []
    for i in range(n):
        a_i = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
        outs.append(base(*a_i, **kwargs))
    if name.endswith("_"):
        return None
    return outs


#: op name prefixes handled by :func:`_foreach` (in both granularities)
FOREACH_PREFIX = "aten._foreach_"


def _glob_names():  # pragma: no cover - documentation helper
    return sorted(FLOP_HANDLERS)


def count_elements(x) -> int:
    return sum(t.numel() for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor))


__all__ = ["FLOP_HANDLERS", "OP_HANDLERS", "HOW", "EXACT", "op_once", "f64_once", "register",
           "tree_map", "math"]
