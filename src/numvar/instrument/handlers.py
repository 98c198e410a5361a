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
from functools import wraps

import torch
import torch.nn.functional as F

from . import bag_kernels as BK
from . import cplx, flop
from . import fft as fftmod
from . import linalg as LA
from . import scatter as SC
from ._core import FLOATS, Ctx, is_float_tensor, result_dtype

Handler = Callable[[Ctx, object, tuple, dict], object]
FLOP_HANDLERS: dict[str, Handler] = {}
#: ops run at both granularities with the mode re-entered, one tensor of their lists at
#: a time (fused optimizers, :mod:`numvar.instrument.optim`); the ``_foreach_*`` family
#: goes through :func:`_foreach` the same way
PER_TENSOR: dict[str, Handler] = {}
OP_HANDLERS: dict[str, Handler] = {}
#: how each registered handler rounds (for the report)
HOW: dict[str, str] = {}
#: how an OP_HANDLERS entry rounds at op granularity, where it differs from HOW
OP_HOW: dict[str, str] = {}

#: returned by a handler to ask the mode to run the op natively (exact after all)
EXACT = object()


def register(*names: str, table: dict[str, Handler] = FLOP_HANDLERS, how: str = "flop"):
    hows = OP_HOW if table is OP_HANDLERS else HOW

    def deco(fn: Handler) -> Handler:
        for n in names:
            table[n] = fn
            hows.setdefault(n, how)
        return fn

    return deco


def _get(args, kwargs, i: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


# ------------------------------------------------------------------ op once (generic)
_OUT_DTYPES: dict = {}
#: ops that update arguments in place without saying so in their schema (legacy batch
#: norm: running_mean, running_var)
_HIDDEN_MUTATIONS = {
    "aten::native_batch_norm": (3, 4),
    "aten::cudnn_batch_norm": (3, 4),
    "aten::miopen_batch_norm": (3, 4),
}
#: of those, the ones that update them only when ``training`` (argument 5) is true: in
#: eval their float64 copies come back unchanged, and op_once skips the write-back where
#: rounding them is the identity (``Ctx.round_keeps``)
_WRITES_IF_TRAINING = frozenset(_HIDDEN_MUTATIONS)
#: False: round every write-back (the reference the tests compare the skip against)
SKIP_UNWRITTEN_WRITEBACK = True


def _meta_out_dtypes(func, flat, rebuild):
    """Output dtypes of ``func`` on these inputs (run once per signature on 'meta')."""
    sig = (func, tuple(x.dtype if isinstance(x, torch.Tensor) else
                       (x if isinstance(x, torch.dtype) else None) for x in flat))
    if sig in _OUT_DTYPES:
        return _OUT_DTYPES[sig]
    try:
        meta = [x.detach().to("meta") if isinstance(x, torch.Tensor) else x for x in flat]
        a, k = rebuild(meta)
        out = func(*a, **k)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        res = [o.dtype if isinstance(o, torch.Tensor) else None for o in outs]
    except Exception:  # no meta kernel: fall back to type promotion
        res = None
    _OUT_DTYPES[sig] = res
    return res


def _flatten(args, kwargs):
    """(flat values, rebuild) for aten arguments: values, or lists/tuples of values
    (one level, as aten schemas have). Cheaper than a general pytree."""
    flat: list = []
    shape: list = []
    for a in args:
        if isinstance(a, (list, tuple)):
            shape.append(len(a))
            flat.extend(a)
        else:
            shape.append(-1)
            flat.append(a)
    keys = list(kwargs)
    for k in keys:
        v = kwargs[k]
        if isinstance(v, (list, tuple)):
            shape.append(len(v))
            flat.extend(v)
        else:
            shape.append(-1)
            flat.append(v)
    nargs = len(args)

    def rebuild(vals):
        out, i = [], 0
        for n in shape:
            if n < 0:
                out.append(vals[i])
                i += 1
            else:
                out.append(list(vals[i:i + n]))
                i += n
        return tuple(out[:nargs]), dict(zip(keys, out[nargs:]))

    return flat, rebuild


def _map_outputs(out, fn):
    if isinstance(out, torch.Tensor):
        return fn(out, 0)
    if isinstance(out, (tuple, list)):
        res = [fn(o, j) if isinstance(o, torch.Tensor) else o for j, o in enumerate(out)]
        return type(out)(res) if isinstance(out, tuple) else res
    return out


#: per op: (written arguments as (index, name, kwarg-only), whether a list argument can
#: hold tensors or dtypes, which op_once must then flatten, whether any argument can be
#: a dtype)
_STATIC: dict = {}
_F64 = torch.float64


def _static(func):
    st = _STATIC.get(func)
    if st is None:
        sch = func._schema
        hidden = _HIDDEN_MUTATIONS.get(sch.name, ())
        writes = tuple((i, a.name, a.kwarg_only) for i, a in enumerate(sch.arguments)
                       if (a.alias_info is not None and a.alias_info.is_write) or i in hidden)
        lists = any(isinstance(a.type, torch.ListType)
                    and ("Tensor" in str(a.type) or "ScalarType" in str(a.type))
                    for a in sch.arguments)
        # (a dtype argument's type reads "int" in the parsed schema: its text says it)
        dtypes = lists or "ScalarType" in str(sch)
        st = _STATIC[func] = (writes, lists, dtypes)
    return st


_C128 = torch.complex128
_INEXACT = FLOATS | cplx.COMPLEX
_F32_F64 = (torch.float32, _F64)
#: the dtypes of op_once's unary short path
_SHORT = (torch.float32, _F64, torch.bfloat16, torch.float16)


def _unary_args(vals):
    """The (args, kwargs) of a one-argument call (``_meta_out_dtypes``' rebuild)."""
    return tuple(vals), {}


def _up(x):
    """float64 stand-in of an argument of op_once: float tensors upcast, float dtypes
    (complex64 to complex128)."""
    if isinstance(x, torch.Tensor):
        if x.dtype in FLOATS:
            return x.double() if x.dtype is not _F64 else x
        return x.to(_C128) if x.dtype is torch.complex64 else x
    if isinstance(x, torch.dtype):
        if x in FLOATS:
            return _F64
        if x in cplx.COMPLEX:
            return _C128
    return x


def op_once(ctx: Ctx, func, args, kwargs):
    """One rounding of each float output, computed from float64 inputs.

    For binary32/16 inputs the op runs in float64 (its result is the "exact" value that
    is rounded once); for binary64 inputs it runs natively and its result counts as
    exact (only UD, or a virtual precision, perturbs it). Mutated arguments (running
    statistics) are rounded back into place.

    A unary op of one binary32, binary64, bfloat16 or float16 tensor (no other argument,
    nothing written, no list arguments: ``silu``, ``sigmoid``, ``tanh``, ``exp``, ...) takes a
    short path with the general path's steps for that case and nothing else (same calls,
    same key, same bits: ``tests/test_instrument_fastpaths.py``); the output dtypes of a
    16-bit input's non-float64 outputs (``frexp``'s) are asked of the meta kernel there,
    as on the general path.
    """
    writes, lists, dtypes = _static(func)
    if not kwargs and len(args) == 1 and not writes and not lists:
        x = args[0]
        if type(x) is torch.Tensor and x.dtype in _SHORT:
            dt = x.dtype
            out = func(x.double())  # (a float64 x is itself: the op runs natively)
            if dt is torch.float32 or dt is _F64:
                if type(out) is torch.Tensor and out.dtype is _F64:
                    return ctx.round(out, dt)
                return _round_outputs(ctx, out, None, dt)
            od = _meta_out_dtypes(func, args, _unary_args)  # (as the general path asks)
            if type(out) is torch.Tensor and out.dtype is _F64 and od and od[0] is dt:
                return ctx.round(out, dt)
            return _round_outputs(ctx, out, od, dt)
    if lists:
        flat, rebuild = _flatten(args, kwargs)
    else:  # no tensors inside lists: the arguments themselves are the values
        flat = [*args, *kwargs.values()] if kwargs else args
        rebuild = None
    dts = [x.dtype for x in flat if isinstance(x, torch.Tensor) and x.dtype in _INEXACT]
    if not dts:
        return func(*args, **kwargs)
    promoted = dts[0]
    uniform = True
    for d in dts:
        if d is not promoted:
            promoted = _reduce(torch.promote_types, dts)
            uniform = False
            break
    if uniform and promoted in _F32_F64 and not (
            dtypes and any(isinstance(x, torch.dtype) for x in flat)):
        out_dts = None  # one binary32/64 dtype in, no dtype argument: float outputs alike
    else:
        if rebuild is None:
            keys, n = list(kwargs), len(args)

            def rebuild(vals):
                return tuple(vals[:n]), dict(zip(keys, vals[n:]))
        out_dts = _meta_out_dtypes(func, flat, rebuild)
    if not lists:
        a2 = tuple([_up(x) for x in args])
        k2 = {k: _up(v) for k, v in kwargs.items()} if kwargs else kwargs
    else:
        a2, k2 = rebuild([_up(x) for x in flat])
    out = func(*a2, **k2)
    # rounded write-back of mutated float arguments (e.g. batch norm running stats)
    unwritten = (SKIP_UNWRITTEN_WRITEBACK and writes and func._schema.name in _WRITES_IF_TRAINING
                 and not _get(args, kwargs, 5, "training", True))
    for i, name, kwarg_only in writes:
        byname = kwarg_only or name in kwargs
        orig = kwargs.get(name) if byname else (args[i] if i < len(args) else None)
        new = k2.get(name) if byname else (a2[i] if i < len(a2) else None)
        if is_float_tensor(orig) and new is not orig and not (unwritten and ctx.round_keeps(orig)):
            orig.copy_(ctx.round(new, orig.dtype))

    if out_dts is None and type(out) is torch.Tensor and out.dtype is _F64:
        return ctx.round(out, promoted)  # (_round_outputs' one call for this case)
    return _round_outputs(ctx, out, out_dts, promoted)


def _round_outputs(ctx: Ctx, out, out_dts, promoted):
    """:func:`op_once`'s rounding of each inexact output of ``out`` to its dtype
    (``out_dts[j]`` where given, else ``promoted``; complex outputs part by part)."""

    def rnd(o, j):
        if o.dtype not in _INEXACT:
            return o
        target = out_dts[j] if out_dts is not None and j < len(out_dts) and out_dts[j] else promoted
        if o.dtype in cplx.COMPLEX:  # real and imaginary parts rounded (one call)
            if target not in cplx.COMPLEX:
                target = torch.complex128 if target is _F64 else torch.complex64
            return cplx.round_parts(o, target, ctx)
        target = cplx.PART.get(target, target)
        return ctx.round(o, target) if target in FLOATS else o

    return _map_outputs(out, rnd)


def rounded_once(ctx: Ctx, func, args, kwargs, why: str):
    """A flop handler's fallback for a case it does not cover: :func:`op_once`, reported
    to the fuzzy block as an escape at flop granularity (``strict`` raises here)."""
    if ctx.granularity == "flop" and ctx.on_escape is not None:
        ctx.on_escape(func, f"rounded once at flop granularity: {why}")
    return op_once(ctx, func, args, kwargs)


def f64_once(ctx: Ctx, func, args, kwargs):
    """Transcendentals at flop granularity: one rounding of the float64 result."""
    return op_once(ctx, func, args, kwargs)


# ------------------------------------------------------------------ pointwise arithmetic
_PYNUM = (int, float, bool)


def _float_result(*xs) -> bool:
    """PyTorch's result dtype of the operands is a float format of FLOATS. Short cut: a
    FLOATS tensor first, then FLOATS, integer or bool tensors and real Python numbers."""
    a = xs[0]
    if isinstance(a, torch.Tensor) and a.dtype in FLOATS:
        for x in xs[1:]:
            if isinstance(x, torch.Tensor):
                if x.dtype not in FLOATS and (x.is_floating_point() or x.is_complex()):
                    break
            elif type(x) not in _PYNUM:
                break
        else:
            return True
    return result_dtype(*xs) in FLOATS


def _with_alpha(ctx, func, args, kwargs, op, reverse: bool = False):
    """``a op alpha·b`` (``reverse``: ``b op alpha·a``, as rsub), the scaling rounded
    first and skipped when alpha is 1; EXACT for non-float results."""
    a, b = args[0], args[1]
    if cplx.any_complex(a, b):
        if ctx.granularity == "op":  # op granularity: the complex128 result rounded once
            return op_once(ctx, func, args, kwargs)
        return _complex_with_alpha(ctx, args, kwargs, op is ctx.sub, reverse)
    if not _float_result(a, b):
        return EXACT
    if reverse:
        a, b = b, a
    alpha = _get(args, kwargs, 2, "alpha", 1)
    if alpha != 1:
        b = ctx.mul(b, alpha)
    return op(a, b)


def _complex_with_alpha(ctx, args, kwargs, negate: bool, reverse: bool):
    """Complex ``a ± alpha·b`` as real operations (numvar.instrument.cplx)."""
    a, b = args[0], args[1]
    if reverse:
        a, b = b, a
    alpha = _get(args, kwargs, 2, "alpha", 1)
    if alpha != 1:
        b = cplx.mul(ctx, b, alpha)
    return cplx.add(ctx, a, b, negate=negate)


@register("aten.add", "prims.add", how="elementwise")
def _add(ctx, func, args, kwargs):
    return _with_alpha(ctx, func, args, kwargs, ctx.add)


@register("aten.sub", "prims.sub", how="elementwise")
def _sub(ctx, func, args, kwargs):
    return _with_alpha(ctx, func, args, kwargs, ctx.sub)


@register("aten.rsub", how="elementwise")
def _rsub(ctx, func, args, kwargs):
    return _with_alpha(ctx, func, args, kwargs, ctx.sub, reverse=True)


@register("aten.mul", "prims.mul", how="elementwise")
def _mul(ctx, func, args, kwargs):
    a, b = args[0], args[1]
    if cplx.any_complex(a, b):
        if ctx.granularity == "op":
            return op_once(ctx, func, args, kwargs)
        return cplx.mul(ctx, a, b)
    if not _float_result(a, b):
        return EXACT
    return ctx.mul(a, b)


@register("aten.div", "aten.true_divide", "prims.div", how="elementwise")
def _div(ctx, func, args, kwargs):
    a, b = args[0], args[1]
    if _get(args, kwargs, 2, "rounding_mode") is not None:
        return op_once(ctx, func, args, kwargs)
    if cplx.any_complex(a, b):
        if ctx.granularity == "op":
            return op_once(ctx, func, args, kwargs)
        return cplx.div(ctx, a, b)
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
    if cplx.is_complex(a):  # a library function of complex numbers: rounded once
        return op_once(ctx, func, args, kwargs)
    if a.dtype not in FLOATS:
        a = a.to(torch.get_default_dtype())
    return ctx.sqrt(a)


@register("aten.reciprocal", how="elementwise")
def _reciprocal(ctx, func, args, kwargs):
    a = args[0]
    if cplx.is_complex(a):
        return cplx.div(ctx, 1.0, a)
    if a.dtype not in FLOATS:
        a = a.to(torch.get_default_dtype())
    return ctx.div(1.0, a)


@register("aten.square", how="elementwise")
def _square(ctx, func, args, kwargs):
    a = args[0]
    if cplx.is_complex(a):
        return cplx.mul(ctx, a, a)
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
    if not any(is_float_tensor(x) or cplx.is_complex(x) for x in (a, e)):
        return EXACT
    return op_once(ctx, func, args, kwargs)


def _add_combined(ctx, func, args, kwargs, combine):
    """``RND(self + RND(combine(RND(value·t1), t2)))``, PyTorch's CPU evaluation order of
    addcmul (``combine`` = ``ctx.mul``) and addcdiv (``ctx.div``); ``value·t1`` is skipped
    when ``value`` is 1."""
    s, t1, t2 = args[:3]
    value = _get(args, kwargs, 3, "value", 1)
    if cplx.any_complex(s, t1, t2, value):  # complex: the complex128 result rounded once
        return op_once(ctx, func, args, kwargs)
    if not _float_result(s, t1, t2):
        return EXACT
    p = t1 if value == 1 else ctx.mul(value, t1)
    return ctx.add(s, combine(p, t2))


@register("aten.addcmul", how="elementwise")
def _addcmul(ctx, func, args, kwargs):
    """``RND(self + RND(RND(value·t1)·t2))`` (PyTorch's CPU evaluation order)."""
    return _add_combined(ctx, func, args, kwargs, ctx.mul)


@register("aten.addcdiv", how="elementwise")
def _addcdiv(ctx, func, args, kwargs):
    """``RND(self + RND(RND(value·t1)/t2))`` (PyTorch's CPU evaluation order)."""
    return _add_combined(ctx, func, args, kwargs, ctx.div)


@register("aten.lerp", how="elementwise")
def _lerp(ctx, func, args, kwargs):
    """PyTorch's formula: ``|w| < ½ ? a + w·(b − a) : b − (b − a)·(1 − w)``, each op rounded."""
    a, b, w = args[:3]
    if cplx.any_complex(a, b, w):  # complex: the complex128 result rounded once
        return op_once(ctx, func, args, kwargs)
    d = ctx.sub(b, a)
    if not isinstance(w, torch.Tensor):
        if abs(w) < 0.5:
            return ctx.add(a, ctx.mul(w, d))
        one_minus_w = ctx.sub(1.0, torch.tensor(w, dtype=d.dtype, device=d.device))
        return ctx.sub(b, ctx.mul(d, one_minus_w))
    lo = ctx.add(a, ctx.mul(w, d))
    hi = ctx.sub(b, ctx.mul(d, ctx.sub(1.0, w.to(d.dtype))))
    return torch.where(w.abs() < 0.5, lo, hi)


# ------------------------------------------------------------------------ contractions
@register("aten.mm")
def _mm(ctx, func, args, kwargs):
    a, b = args[:2]
    if cplx.any_complex(a, b):
        return cplx.bmm(ctx, a.unsqueeze(0), b.unsqueeze(0))[0]
    if not _float_result(a, b):
        return EXACT
    return flop.mm(a, b, ctx)


@register("aten.bmm")
def _bmm(ctx, func, args, kwargs):
    a, b = args[:2]
    if cplx.any_complex(a, b):
        return cplx.bmm(ctx, a, b)
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
    return flop.addmm(c, a, b, alpha, beta, ctx)


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
    if target in cplx.COMPLEX:
        return cplx.reduce(ctx, x, dim, keepdim=keepdim, dtype=target)
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
    if target in cplx.COMPLEX:
        return cplx.reduce(ctx, x, dim, keepdim=keepdim, dtype=target, mean=True)
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


# ------------------------------------------------------------ accumulating index ops
# Sources accumulated into a copy of self in increasing source index order, every add
# (multiply) rounded at flop granularity, the exact sum rounded once at op granularity:
# numvar.instrument.scatter. Non-accumulating variants (plain writes) are exact.
def _accumulating(*names: str):
    """Register an accumulating index op at both granularities."""
    def deco(fn: Handler) -> Handler:
        register(*names, how="flop")(fn)
        for n in names:
            OP_HANDLERS[n] = fn
            OP_HOW[n] = "rounded once (exact sum)"
        return fn

    return deco


def _reduce_into(ctx, self, pos, src, reduce, include_self=True):
    """scatter_reduce / index_reduce: sum, prod, mean (one rounded division by the count,
    where some source arrived; at op granularity the callers round mean once instead);
    amax / amin select (exact)."""
    if reduce in ("amax", "amin") or self.dtype not in FLOATS:
        return EXACT
    op = SC.MUL if reduce in ("prod", "multiply") else SC.ADD
    out = SC.scatter_accumulate(ctx, self, pos, src.to(self.dtype), op=op,
                                include_self=include_self)
    if reduce == "mean":
        hits = torch.bincount(pos.reshape(-1), minlength=self.numel()).view(self.shape)
        sel = (hits > 0).to(out.device)
        count = (hits + int(bool(include_self))).to(device=out.device, dtype=out.dtype)
        out = out.clone()
        out[sel] = ctx.div(out[sel], count[sel])
    return out


def _corner(src: torch.Tensor, shape) -> torch.Tensor:
    """The part of ``src`` a scatter reads: ``src[:index.shape[0], :index.shape[1], ...]``."""
    return src[tuple(slice(0, s) for s in shape)] if src.dim() else src.reshape(shape)


@_accumulating("aten.index_put", "aten._unsafe_index_put", "aten._index_put_impl")
def _index_put(ctx, func, args, kwargs):
    """``accumulate=True``: ``values`` (broadcast to ``self[indices]``) added in its C order."""
    self, indices, values = args[:3]
    if not _get(args, kwargs, 3, "accumulate", False) or self.dtype not in FLOATS:
        return EXACT
    pos = SC.positions_index_put(self.shape, indices)
    return SC.scatter_accumulate(ctx, self, pos, values.to(self.dtype).expand(pos.shape))


@_accumulating("aten.scatter")
def _scatter(ctx, func, args, kwargs):
    """``reduce="add"|"multiply"`` accumulate; the other overloads are plain writes."""
    self, dim, index, src = args[:4]
    reduce = _get(args, kwargs, 4, "reduce")
    if reduce is None or self.dtype not in FLOATS:
        return EXACT
    pos = SC.positions_scatter(self.shape, dim, index)
    vals = (_corner(src, index.shape) if isinstance(src, torch.Tensor)
            else torch.full(tuple(index.shape), src, dtype=self.dtype))
    return _reduce_into(ctx, self, pos, vals, "prod" if reduce == "multiply" else "sum")


@_accumulating("aten.scatter_add")
def _scatter_add(ctx, func, args, kwargs):
    self, dim, index, src = args[:4]
    if self.dtype not in FLOATS:
        return EXACT
    return _reduce_into(ctx, self, SC.positions_scatter(self.shape, dim, index),
                        _corner(src, index.shape), "sum")


@_accumulating("aten.scatter_reduce")
def _scatter_reduce(ctx, func, args, kwargs):
    self, dim, index, src, reduce = args[:5]
    include_self = _get(args, kwargs, 5, "include_self", True)
    if self.dtype not in FLOATS:
        return EXACT
    if reduce == "mean" and ctx.granularity == "op":
        return op_once(ctx, func, args, kwargs)  # sum and division: one rounding
    return _reduce_into(ctx, self, SC.positions_scatter(self.shape, dim, index),
                        _corner(src, index.shape), reduce, include_self)


@_accumulating("aten.index_add")
def _index_add(ctx, func, args, kwargs):
    """``source`` added along ``dim``; with ``alpha != 1`` each ``RND(alpha·source)`` at
    flop granularity, the exact ``self + Σ alpha·source`` rounded once at op granularity."""
    self, dim, index, source = args[:4]
    alpha = _get(args, kwargs, 4, "alpha", 1)
    if self.dtype not in FLOATS:
        return EXACT
    src = source.to(self.dtype)
    pos = SC.positions_index_add(self.shape, dim, index, src.shape)
    if alpha != 1:
        if ctx.granularity == "op":  # the exact products alpha·source, rounded with the sum
            return SC.scatter_accumulate(ctx, self, pos, src, scale=alpha)
        src = ctx.mul(src, alpha)
    return SC.scatter_accumulate(ctx, self, pos, src)


@_accumulating("aten.index_reduce")
def _index_reduce(ctx, func, args, kwargs):
    self, dim, index, source, reduce = args[:5]
    include_self = _get(args, kwargs, 5, "include_self", True)
    if self.dtype not in FLOATS:
        return EXACT
    if reduce == "mean" and ctx.granularity == "op":
        return op_once(ctx, func, args, kwargs)  # sum and division: one rounding
    pos = SC.positions_index_add(self.shape, dim, index, source.shape)
    return _reduce_into(ctx, self, pos, source, reduce, include_self)


@_accumulating("aten.put")
def _put(ctx, func, args, kwargs):
    self, index, source = args[:3]
    if not _get(args, kwargs, 3, "accumulate", False) or self.dtype not in FLOATS:
        return EXACT
    n = self.numel()
    pos = index.reshape(-1).to(torch.int64).cpu()
    pos = torch.where(pos < 0, pos + n, pos)
    return SC.scatter_accumulate(ctx, self, pos, source.reshape(-1).to(self.dtype))


@_accumulating("aten.embedding_dense_backward")
def _embedding_backward(ctx, func, args, kwargs):
    """Per vocabulary row, the gradient rows of its occurrences summed in position order
    (the first copied, each later add rounded); ``scale_grad_by_freq`` divides each row
    by its token's count first (rounded); ``padding_idx`` rows stay 0."""
    grad, indices, num_weights, padding_idx, scale = args[:5]
    if grad.dtype not in FLOATS:
        return EXACT
    if scale and ctx.granularity == "op":
        return op_once(ctx, func, args, kwargs)  # scaling and sum: one rounding
    d = grad.shape[-1]
    g = grad.reshape(-1, d)
    idx = indices.reshape(-1).to(torch.int64)
    keep = idx != padding_idx
    g, idx = g[keep], idx[keep]
    out = torch.zeros(num_weights, d, dtype=grad.dtype, device=grad.device)
    if scale and idx.numel():
        counts = torch.bincount(idx.cpu(), minlength=num_weights).to(g.device)
        g = ctx.div(g, counts[idx].unsqueeze(1).to(g.dtype))
    pos = idx.cpu().unsqueeze(1) * d + torch.arange(d)
    return SC.scatter_accumulate(ctx, out, pos, g, include_self=False)


# ------------------------------------------------------------------- embedding bag
def _bags(indices: torch.Tensor, offsets: torch.Tensor, include_last: bool):
    """(bag of each index, number of bags), from the offsets (exact integer ops)."""
    n = indices.numel()
    nbags = offsets.numel() - (1 if include_last else 0)
    bag = torch.searchsorted(offsets.cpu().to(torch.int64), torch.arange(n), right=True) - 1
    return bag, nbags


@register("aten._embedding_bag", "aten._embedding_bag_forward_only")
def _embedding_bag(ctx, func, args, kwargs):
    """sum / mean: per bag, its rows (each times its per-sample weight, rounded) summed in
    index order (the first copied, each later add rounded), mean then divided by the
    bag's count (rounded); max: exact. The integer outputs are the native op's."""
    weight, indices, offsets = args[:3]
    mode = _get(args, kwargs, 4, "mode", 0)
    psw = _get(args, kwargs, 6, "per_sample_weights")
    include_last = _get(args, kwargs, 7, "include_last_offset", False)
    padding_idx = _get(args, kwargs, 8, "padding_idx", -1)
    if mode == 2 or weight.dtype not in FLOATS:
        return EXACT
    out, offset2bag, bag_size, max_indices = func(*args, **kwargs)
    bag, nbags = _bags(indices, offsets, include_last)
    idx = indices.reshape(-1).cpu().to(torch.int64)
    if padding_idx < 0 and not include_last:
        keep = None  # every index is in a bag (offsets[0] is 0: the native op checks it)
    else:
        keep = (bag < nbags) & (idx != padding_idx) if padding_idx >= 0 else bag < nbags
        idx, bag = idx[keep], bag[keep]
    kept = None if psw is None else (psw.reshape(-1) if keep is None
                                     else psw.reshape(-1)[keep.to(psw.device)])
    if BK.accepts(ctx, weight, psw):  # one compiled call, same keys and bits
        sums = BK.embedding_bag32(ctx, weight, idx, bag, nbags, kept, mode == 1)
        return sums.reshape(out.shape), offset2bag, bag_size, max_indices
    d = weight.shape[1]
    rows = weight[idx.to(weight.device)]
    if psw is not None:
        rows = ctx.mul(rows, kept.unsqueeze(1).to(rows.dtype))
    zeros = torch.zeros(nbags, d, dtype=weight.dtype, device=weight.device)
    sums = SC.scatter_accumulate(ctx, zeros, bag.unsqueeze(1) * d + torch.arange(d), rows,
                                 include_self=False)
    if mode == 1:
        count = torch.bincount(bag, minlength=nbags)
        sel = count > 0
        sums[sel] = ctx.div(sums[sel], count[sel].unsqueeze(1).to(sums.dtype))
    return sums.reshape(out.shape), offset2bag, bag_size, max_indices


def _embedding_bag_grad(ctx, grad, indices, offset2bag, bag_size, max_indices, num_weights,
                        mode, psw, padding_idx):
    """Dense gradient of the weight: each index's bag gradient (mean: divided by the bag
    size; times its per-sample weight; each rounded) summed into its row in index order
    (the first copied); max: each bag's gradient sent to its argmax rows, summed in
    (bag, column) order."""
    d = grad.shape[1]
    out = torch.zeros(num_weights, d, dtype=grad.dtype, device=grad.device)
    if mode == 2:
        mi = max_indices.cpu().to(torch.int64)
        valid = mi >= 0
        pos = (mi * d + torch.arange(d))[valid]
        return SC.scatter_accumulate(ctx, out, pos, grad[valid.to(grad.device)], include_self=False)
    idx = indices.reshape(-1).cpu().to(torch.int64)
    bag = offset2bag.reshape(-1).cpu().to(torch.int64)
    keep = bag < grad.shape[0]
    if padding_idx >= 0:
        keep &= idx != padding_idx
    rows = grad[bag[keep].to(grad.device)]
    if mode == 1:
        bs = bag_size.cpu()[bag[keep]].clamp_min(1)
        rows = ctx.div(rows, bs.unsqueeze(1).to(device=rows.device, dtype=rows.dtype))
    if psw is not None:
        rows = ctx.mul(rows, psw.reshape(-1)[keep.to(psw.device)].unsqueeze(1).to(rows.dtype))
    idx = idx[keep]
    return SC.scatter_accumulate(ctx, out, idx.unsqueeze(1) * d + torch.arange(d), rows,
                                 include_self=False)


@register("aten._embedding_bag_backward")
def _embedding_bag_backward(ctx, func, args, kwargs):
    (grad, indices, offsets, offset2bag, bag_size, max_indices, num_weights, scale, mode,
     sparse) = args[:10]
    psw = _get(args, kwargs, 10, "per_sample_weights")
    padding_idx = _get(args, kwargs, 11, "padding_idx", -1)
    if sparse or scale or grad.dtype not in FLOATS:
        # scale_grad_by_freq: PyTorch's CPU kernel scales by counts that are not the
        # tokens' frequencies (index 4 of [1, 2, 4, 5, 4, 3, 2, 9] gets weight 1 twice,
        # index 3 weight 1/2): kept as native computes it, rounded once
        return op_once(ctx, func, args, kwargs)
    if offset2bag.numel() != indices.numel():  # the native sum fast path leaves it empty
        offset2bag = _bags(indices, offsets, False)[0]
    return _embedding_bag_grad(ctx, grad, indices, offset2bag, bag_size, max_indices,
                               num_weights, mode, psw, padding_idx)


@register("aten._embedding_bag_dense_backward")
def _embedding_bag_dense_backward(ctx, func, args, kwargs):
    grad, indices, offset2bag, bag_size, max_indices, num_weights, scale, mode = args[:8]
    psw = _get(args, kwargs, 8, "per_sample_weights")
    padding_idx = _get(args, kwargs, 9, "padding_idx", -1)
    if scale or grad.dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    return _embedding_bag_grad(ctx, grad, indices, offset2bag, bag_size, max_indices,
                               num_weights, mode, psw, padding_idx)


@register("aten._embedding_bag_per_sample_weights_backward")
def _embedding_bag_psw_backward(ctx, func, args, kwargs):
    """``Σ_d grad[bag(i), d] · weight[index_i, d]`` per index (products and the sum over
    d in increasing d rounded); 0 at padding indices."""
    grad, weight, indices, offsets, offset2bag, mode = args[:6]
    padding_idx = _get(args, kwargs, 6, "padding_idx", -1)
    if grad.dtype not in FLOATS:
        return EXACT
    idx = indices.reshape(-1).to(torch.int64)
    if offset2bag.numel() != idx.numel():
        offset2bag = _bags(indices, offsets, False)[0].clamp(max=grad.shape[0] - 1)
    prod = ctx.mul(grad[offset2bag.reshape(-1).to(torch.int64)], weight[idx].to(grad.dtype))
    out = flop.reduce(prod, [1], ctx)
    if padding_idx >= 0:
        out = torch.where(idx == padding_idx, torch.zeros((), dtype=out.dtype), out)
    return out


def _pool_params(ks, stride, padding):
    ks = list(ks) * 2 if len(ks) == 1 else list(ks)
    stride = list(stride) if len(stride) else list(ks)
    stride = stride * 2 if len(stride) == 1 else stride
    padding = list(padding) * 2 if len(padding) == 1 else list(padding)
    return ks, stride, padding


def _avg_divisor(x, ks, stride, padding, count_include_pad, divisor_override):
    if divisor_override:
        return float(divisor_override)
    if count_include_pad or not any(padding):
        return float(ks[0] * ks[1])
    ones = torch.ones((1, 1) + tuple(x.shape[-2:]), dtype=x.dtype, device=x.device)
    cnt, _ = flop.im2col(ones, ks, stride, padding, (1, 1))
    return cnt.sum(1).reshape(1, -1)  # exact small integers


@register("aten.avg_pool2d")
def _avg_pool2d(ctx, func, args, kwargs):
    """Window sum (im2col order, padded zeros as terms, each add rounded), then one
    rounded division by the divisor. ``ceil_mode`` windows: rounded once (op level)."""
    x = args[0]
    ks, stride, padding = _pool_params(args[1], _get(args, kwargs, 2, "stride", []),
                                       _get(args, kwargs, 3, "padding", [0]))
    ceil = _get(args, kwargs, 4, "ceil_mode", False)
    cip = _get(args, kwargs, 5, "count_include_pad", True)
    dov = _get(args, kwargs, 6, "divisor_override")
    if x.dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    if ceil:
        return rounded_once(ctx, func, args, kwargs, "ceil_mode windows")
    lead = x.shape[:-2]
    xx = x.reshape(-1, 1, *x.shape[-2:])
    # each window a row of (B, L, kh*kw): the sum over the last dim takes the row kernels,
    # with the order and bits of the scan of im2col's (B, kh*kw, L) over dim 1 (window
    # positions in C order, element (k, b·L + l)), without its transposed copy and, in
    # flop.window_sums, without a copy of the windows
    win, ls = flop._windows(xx, ks, stride, padding, (1, 1))  # (B, 1, *L, kh, kw)
    sums = flop.window_sums(win, ctx)
    div = _avg_divisor(x, ks, stride, padding, cip, dov)
    return ctx.div(sums, div).reshape(*lead, *ls)


@register("aten.avg_pool2d_backward")
def _avg_pool2d_backward(ctx, func, args, kwargs):
    """Non-overlapping windows: grad / divisor scattered (one rounded division per
    element); overlapping windows: rounded once (op level)."""
    gout, x = args[0], args[1]
    ks, stride, padding = _pool_params(args[2], args[3], args[4])
    ceil, cip, dov = args[5], args[6], args[7]
    if gout.dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    if ceil or any(k > s for k, s in zip(ks, stride)):
        return rounded_once(ctx, func, args, kwargs, "ceil_mode or overlapping windows")
    div = _avg_divisor(x, ks, stride, padding, cip, dov)
    g = gout.reshape(-1, 1, gout.shape[-2] * gout.shape[-1])
    q = ctx.div(g, div)  # (B, 1, L)
    cols = q.expand(-1, ks[0] * ks[1], -1)
    h, w = x.shape[-2:]
    out = F.fold(cols, (h + 2 * padding[0], w + 2 * padding[1]), ks, stride=stride)  # no overlap: exact
    out = out[..., padding[0]:padding[0] + h, padding[1]:padding[1] + w]
    return out.reshape(x.shape)


@register("aten._adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(ctx, func, args, kwargs):
    """Windows that tile the input (sizes divisible by the output's): each input element
    gets its window's gradient divided by the window size (one rounded division per
    output element, then an exact scatter, as ATen's single-term sums); other sizes:
    rounded once (an escape at flop granularity)."""
    gout, x = args[0], args[1]
    if gout.dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    (h, w), (oh, ow) = x.shape[-2:], gout.shape[-2:]
    if oh == 0 or ow == 0 or h % oh or w % ow:
        return rounded_once(ctx, func, args, kwargs, "adaptive windows of unequal sizes")
    kh, kw = h // oh, w // ow
    q = ctx.div(gout, float(kh * kw))
    return q.repeat_interleave(kh, -2).repeat_interleave(kw, -1).reshape(x.shape)


# ------------------------------------------------------------- complex and FFT
def _complex_inexact(ctx, func, args, kwargs):
    """``abs``/``sgn``: exact on real tensors; on complex ones library functions
    (hypot, z/|z|): the float64 result rounded once."""
    if not cplx.is_complex(args[0]):
        return EXACT
    return op_once(ctx, func, args, kwargs)


#: ops of the exact list (numvar.instrument.ops.EXACT_OPS) that round on complex inputs
COMPLEX_INEXACT = ("aten.abs", "aten.sgn")
for _table in (FLOP_HANDLERS, OP_HANDLERS):
    register(*COMPLEX_INEXACT, table=_table,
             how="float64, rounded once (complex)")(_complex_inexact)


def _complex_exact(ctx, func, args, kwargs):
    """``torch.complex(re, im)``: assembling parts is exact."""
    return EXACT


for _table in (FLOP_HANDLERS, OP_HANDLERS):
    register("aten.complex", table=_table, how="exact")(_complex_exact)


@register("aten.polar", how="flop (complex)")
def _polar(ctx, func, args, kwargs):
    """``r·cos θ + i·r·sin θ``: cos, sin rounded once from float64, two rounded products."""
    return cplx.polar(ctx, args[0], args[1])


_CPU_KINDS = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _cpu_kernel(*ts) -> bool:
    """CPU tensors of binary32/64 (or complex64/128): what the FFT and linear algebra
    implementations take; anything else is rounded once (op_once)."""
    return all(t.is_cpu and t.dtype in _CPU_KINDS for t in ts if isinstance(t, torch.Tensor))


_FFT_HOW = "flop (radix-2 FFT / direct DFT / Bluestein)"


@register("aten._fft_c2c", how=_FFT_HOW)
def _fft_c2c(ctx, func, args, kwargs):
    x, dim, norm, forward = args[:4]
    if not _cpu_kernel(x):
        return op_once(ctx, func, args, kwargs)
    return fftmod.fft_c2c(ctx, x, dim, norm, forward)


@register("aten._fft_r2c", how=_FFT_HOW)
def _fft_r2c(ctx, func, args, kwargs):
    x, dim, norm, onesided = args[:4]
    if not _cpu_kernel(x) or x.is_complex():
        return op_once(ctx, func, args, kwargs)
    return fftmod.fft_r2c(ctx, x, dim, norm, onesided)


@register("aten._fft_c2r", how=_FFT_HOW)
def _fft_c2r(ctx, func, args, kwargs):
    x, dim, norm, last = args[:4]
    if not _cpu_kernel(x):
        return op_once(ctx, func, args, kwargs)
    return fftmod.fft_c2r(ctx, x, dim, norm, last)


@register("aten.unfold_backward")
def _unfold_backward(ctx, func, args, kwargs):
    """Overlap-add (istft, the backward of Tensor.unfold): numvar.instrument.flop."""
    g, sizes, dim, size, step = args[:5]
    if g.dtype not in FLOATS:
        return op_once(ctx, func, args, kwargs)
    return flop.unfold_backward(g, sizes, dim, size, step, ctx)


# ------------------------------------------------------------------- linear algebra
def _linalg(how: str, *names: str):
    """Register a linear-algebra handler (numvar.instrument.linalg) for real binary32/64
    CPU tensors; complex or other inputs are rounded once."""
    def deco(fn):
        @wraps(fn)
        def handler(ctx, func, args, kwargs):
            ts = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if not all(t.is_cpu and t.dtype in (torch.float32, torch.float64) for t in ts) or any(
                    isinstance(a, torch.Tensor) and a.is_complex() for a in args):
                return op_once(ctx, func, args, kwargs)
            return fn(ctx, func, args, kwargs)

        return register(*names, how=how)(handler)

    return deco


@_linalg("flop (LU, partial pivoting)", "aten.linalg_lu_factor_ex")
def _lu_factor_ex(ctx, func, args, kwargs):
    if not _get(args, kwargs, 1, "pivot", True):
        return op_once(ctx, func, args, kwargs)
    return LA.lu_factor(ctx, args[0])


@_linalg("flop (LU solve)", "aten._linalg_solve_ex")
def _solve_ex(ctx, func, args, kwargs):
    A, B = args[:2]
    X, LU, piv, info = LA.solve(ctx, A, B, left=_get(args, kwargs, 2, "left", True))
    return X, LU, piv, info


@_linalg("flop (LU solve)", "aten.linalg_lu_solve")
def _lu_solve(ctx, func, args, kwargs):
    LU, piv, B = args[:3]
    return LA.lu_solve(ctx, LU, piv, B, left=_get(args, kwargs, 3, "left", True),
                       adjoint=_get(args, kwargs, 4, "adjoint", False))


@_linalg("flop (LU inverse)", "aten.linalg_inv_ex")
def _inv_ex(ctx, func, args, kwargs):
    return LA.inv(ctx, args[0])


@_linalg("flop (LU determinant)", "aten._linalg_det")
def _det(ctx, func, args, kwargs):
    return LA.det(ctx, args[0])


@_linalg("flop (triangular solve)", "aten.linalg_solve_triangular")
def _solve_triangular(ctx, func, args, kwargs):
    A, B = args[:2]
    return LA.solve_triangular(ctx, A, B, upper=_get(args, kwargs, 2, "upper"),
                               left=_get(args, kwargs, 3, "left", True),
                               unitriangular=_get(args, kwargs, 4, "unitriangular", False))


@_linalg("flop (triangular solve)", "aten.triangular_solve")
def _triangular_solve(ctx, func, args, kwargs):
    """Legacy ``torch.triangular_solve(b, A, upper, transpose, unitriangular)``."""
    b, A = args[:2]
    upper = _get(args, kwargs, 2, "upper", True)
    transpose = _get(args, kwargs, 3, "transpose", False)
    unit = _get(args, kwargs, 4, "unitriangular", False)
    T = A.mT if transpose else A
    X = LA.solve_triangular(ctx, T, b, upper=upper != transpose, unitriangular=unit)
    return X, A.clone()


@_linalg("flop (Cholesky)", "aten.linalg_cholesky_ex")
def _cholesky_ex(ctx, func, args, kwargs):
    return LA.cholesky(ctx, args[0], upper=_get(args, kwargs, 1, "upper", False))


@_linalg("flop (Householder QR)", "aten.linalg_qr")
def _qr(ctx, func, args, kwargs):
    return LA.qr(ctx, args[0], _get(args, kwargs, 1, "mode", "reduced"))


@_linalg("flop (cyclic Jacobi)", "aten._linalg_eigh")
def _eigh(ctx, func, args, kwargs):
    return LA.eigh(ctx, args[0], _get(args, kwargs, 1, "UPLO", "L"),
                   _get(args, kwargs, 2, "compute_v", True))


@_linalg("flop (one-sided Jacobi)", "aten._linalg_svd")
def _svd(ctx, func, args, kwargs):
    return LA.svd(ctx, args[0], _get(args, kwargs, 1, "full_matrices", False),
                  _get(args, kwargs, 2, "compute_uv", True))


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


@register("aten._safe_softmax", table=OP_HANDLERS, how="rounded once (op)")
def _safe_softmax_op(ctx, func, args, kwargs):
    """Op granularity: op_once's result (the float64 softmax rounded once, 0 on rows whose
    inputs are all -inf), with those rows found by one max over the input instead of
    _safe_softmax's float64 comparison, reduction and select over every element (the
    select then acts on the rounded result: the rounding of 0 is 0, NaN rows are set)."""
    x = args[0]
    dim = _get(args, kwargs, 1, "dim")
    if (_get(args, kwargs, 2, "dtype") is not None or not is_float_tensor(x)
            or x.dim() == 0 or x.numel() == 0):
        return op_once(ctx, func, args, kwargs)
    s = torch.ops.aten._softmax.default(x.double(), dim, False)
    out = ctx.round(s, x.dtype)
    dead = x.amax(dim, keepdim=True) == float("-inf")
    if dead.any():
        out = torch.where(dead, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out


#: overlapping max-pooling windows' backward accumulated at flop granularity (False:
#: rounded once, reported as an escape, as before)
MAXPOOL_BACKWARD_ADDS = True


@register("aten.max_pool2d_with_indices_backward", "aten.max_pool3d_with_indices_backward",
          how="exact (windows apart) or accumulated")
def _maxpool_backward(ctx, func, args, kwargs):
    """Exact (a scatter) when windows do not overlap. Overlapping windows (a ResNet stem's
    3×3/2 pooling) send several windows' gradients to an input that is the maximum of
    each: they are accumulated as torch's CPU kernel adds them, window after window in
    C order within each plane, every add rounded (``scatter.scatter_accumulate`` on a
    zero input, the first gradient copied: a single window's stays exact, as when
    windows do not overlap); the result in x's memory format."""
    gout, x, ks, stride, dilation, indices = args[0], args[1], args[2], args[3], args[5], args[7]
    nd = len(ks)
    stride = list(stride) if len(stride) else list(ks)
    stride = stride * nd if len(stride) == 1 else stride
    ks = list(ks) * nd if len(ks) == 1 else list(ks)
    dilation = list(dilation) * nd if len(dilation) == 1 else list(dilation)
    if (all(d * (k - 1) + 1 <= s for k, s, d in zip(ks, stride, dilation))
            or not x.numel() or not gout.numel()):
        return EXACT
    if not (MAXPOOL_BACKWARD_ADDS and gout.dtype in FLOATS and gout.dtype == x.dtype):
        return rounded_once(ctx, func, args, kwargs, "overlapping windows")
    plane = math.prod(x.shape[x.dim() - nd:])
    planes = x.numel() // plane if plane else 0
    idx = indices.detach().cpu().reshape(planes, -1).to(torch.int64)
    pos = idx + torch.arange(planes).unsqueeze(1) * plane
    zeros = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    out = SC.scatter_accumulate(ctx, zeros, pos, gout.reshape(planes, -1), include_self=False)
    return out if x.is_contiguous() else torch.empty_like(x).copy_(out)


def _foreach(ctx, func, args, kwargs, mode=None):
    """``_foreach_op(lists...)`` as the per-tensor ops, each dispatched through the mode
    (per-element values of list arguments; trailing ones passed by the base op's
    keyword-only names, e.g. addcmul's ``value``)."""
    name = func._schema.name.split("::")[1][len("_foreach_"):]
    base = getattr(torch.ops.aten, name)
    lists = [a for a in args if isinstance(a, (list, tuple))]
    n = len(lists[0]) if lists else 0
    nargs = len(args)
    call = None
    for ov in base.overloads():
        sch = getattr(base, ov)._schema
        pos = [a.name for a in sch.arguments if not a.kwarg_only]
        kwo = [a.name for a in sch.arguments if a.kwarg_only and a.name not in kwargs]
        if len(pos) >= nargs:
            call = (len(pos), [])
            break
        if len(pos) < nargs <= len(pos) + len(kwo):
            call = (len(pos), kwo[:nargs - len(pos)])
    npos, kwnames = call if call is not None else (nargs, [])
    outs = []
    for i in range(n):
        vals = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
        kw = dict(kwargs)
        kw.update(zip(kwnames, vals[npos:]))
        outs.append(base(*vals[:npos], **kw))
    if name.endswith("_"):
        return None
    return outs


# ------------------------------------------------------------- exact ops, done faster
#: exact (never perturbed) ops, by full overload name, with a faster implementation than
#: calling the op: the same output (values, dtype, shape, strides, aliasing)
EXACT_IMPLS: dict[str, Callable] = {}


def _broadcast_in_dim(a, shape, broadcast_dimensions):
    """``prims.broadcast_in_dim`` as its eager implementation (torch._prims'
    ``_broadcast_in_dim_aten``: unsqueeze each new dim, expand), without the prim's
    Python wrapper and meta checks (its callers are torch's own decompositions)."""
    v = a
    bd = set(broadcast_dimensions)
    for idx in range(len(shape)):
        if idx not in bd:
            v = v.unsqueeze(idx)
    return v.expand(shape)


def _all_dim(x, dim, keepdim=False):
    """``all.dim`` of a non-empty bool tensor as the min of its bytes (ATen's ``all``
    over a short innermost dim is several times slower)."""
    if x.dtype is not torch.bool or x.dim() == 0 or x.numel() == 0:
        return torch.ops.aten.all.dim(x, dim, keepdim)
    return torch.amin(x.view(torch.uint8), dim, keepdim).view(torch.bool)


def _eq_scalar(x, other):
    """``eq.Scalar`` against -inf / +inf of a float tensor as isneginf / isposinf
    (safe softmax's decomposition looks for -inf this way)."""
    if isinstance(x, torch.Tensor) and x.dtype in FLOATS and type(other) is float:
        if other == float("-inf"):
            return torch.isneginf(x)
        if other == float("inf"):
            return torch.isposinf(x)
    return torch.ops.aten.eq.Scalar(x, other)


EXACT_IMPLS["aten.eq.Scalar"] = _eq_scalar
EXACT_IMPLS["prims.broadcast_in_dim.default"] = _broadcast_in_dim
EXACT_IMPLS["aten.all.dim"] = _all_dim


#: op name prefixes handled by :func:`_foreach` (in both granularities)
FOREACH_PREFIX = "aten._foreach_"


__all__ = ["FLOP_HANDLERS", "OP_HANDLERS", "PER_TENSOR", "HOW", "OP_HOW", "EXACT", "EXACT_IMPLS", "op_once", "f64_once", "rounded_once",
           "register"]
