"""Complex arithmetic at ``flop`` granularity, as the real operations it is made of.

A complex64 (complex128) tensor is a pair of binary32 (binary64) tensors, its real and
imaginary parts; every real add, sub, mul and div below is one rounding of numvar's core,
in the order written (each line is one vectorised call: one stream key, element ``j`` of
its C-order output drawing ``bits(key, j)``):

* ``z + w``: ``(RND(zr + wr), RND(zi + wi))``, one call on the interleaved parts
  (``view_as_real``); a real operand adds to the real part only (the imaginary part is
  copied, no operation).
* ``z · w``: products ``RND(zr·wr), RND(zi·wi), RND(zr·wi), RND(zi·wr)`` (one call,
  stacked in that order), then ``re = RND(zr·wr − zi·wi)``, ``im = RND(zr·wi + zi·wr)``
  (one call): 4 multiplications and 2 additions. A real factor scales both parts
  (2 multiplications).
* ``z / w``: Smith's algorithm, as ``c10::complex`` (PyTorch's CPU complex division)
  evaluates it: when ``|wr| ≥ |wi|``: ``ρ = RND(wi/wr)``, ``δ = RND(wr + RND(wi·ρ))``,
  ``σ = RND(1/δ)``, ``re = RND(RND(zr + RND(zi·ρ))·σ)``, ``im = RND(RND(zi − RND(zr·ρ))·σ)``;
  otherwise the same with the roles of ``wr`` and ``wi`` exchanged (``ρ = RND(wr/wi)``,
  ``δ = RND(wi + RND(wr·ρ))``, ``re = RND(RND(RND(zr·ρ) + zi)·σ)``,
  ``im = RND(RND(RND(zi·ρ) − zr)·σ)``). Both branches are computed for every element and
  one is selected (the branch decision reads the operands, never a rounded value); a zero
  divisor gives ``(zr/|wr|, zi/|wi|)`` as PyTorch does. A real divisor divides both parts.
* ``Σ z`` (sum, mean): the real and imaginary parts are reduced separately by
  :func:`numvar.instrument.flop.reduce` (one call over the interleaved parts).
* ``A @ B`` (mm, bmm): ``re = RND(Ar@Br − Ai@Bi)``, ``im = RND(Ar@Bi + Ai@Br)``, the four
  real products at flop granularity (:func:`numvar.instrument.flop.bmm`), then one call
  for the two additions.
* ``polar(r, θ)``: ``c = RND(cos θ)``, ``s = RND(sin θ)`` (float64 results rounded once,
  as every transcendental), then ``(RND(r·c), RND(r·s))``.

:func:`round_parts` rounds a complex128 result (op granularity, and the library functions
``abs``, ``sgn``, ``exp``, ``sqrt`` ... of complex tensors) to a complex64/complex128 result:
real and imaginary parts interleaved, one call.
"""

from __future__ import annotations

from numbers import Number

import numpy as np
import torch

from . import flop
from . import linalg_kernels as LK
from . import pointwise as PW
from ._core import Ctx
from .kernels import PARALLEL_MIN_WORK

#: complex dtype -> dtype of its parts
PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}
COMPLEX = frozenset(PART)


def is_complex(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in COMPLEX or isinstance(x, complex)


def any_complex(*xs) -> bool:
    """Some operand is a complex64/complex128 tensor or a Python complex number."""
    for x in xs:  # a loop, not any(generator): asked for every arithmetic op
        if isinstance(x, torch.Tensor):
            if x.dtype in COMPLEX:
                return True
        elif isinstance(x, complex):
            return True
    return False


def result_dtype(*xs) -> torch.dtype:
    """PyTorch's promoted dtype of the operands (a complex dtype when any is complex)."""
    from ._core import result_dtype as rd

    return rd(*xs)


def parts(x, cdtype: torch.dtype, like: torch.Tensor):
    """(real part, imaginary part or None) of ``x`` in the part dtype of ``cdtype``.

    Real tensors and real numbers have no imaginary part (None); conjugate and negative
    views are resolved (exact)."""
    pd = PART[cdtype]
    if isinstance(x, torch.Tensor):
        if x.dtype in COMPLEX:
            x = x.resolve_conj().resolve_neg().to(cdtype)
            return x.real, x.imag
        return x.to(pd), None
    if isinstance(x, complex):
        t = torch.tensor(x, dtype=cdtype, device=like.device)
        return t.real, t.imag
    if isinstance(x, Number):
        return torch.tensor(x, dtype=pd, device=like.device), None
    raise TypeError(f"unexpected operand {type(x).__name__}")


def join(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    """The complex tensor with these parts (exact)."""
    re, im = torch.broadcast_tensors(re, im)
    return torch.view_as_complex(torch.stack((re, im), -1).contiguous())


def _pair(out: torch.Tensor) -> torch.Tensor:
    """A (..., 2) real tensor of interleaved parts as a complex tensor (exact)."""
    return torch.view_as_complex(out.contiguous())


def _tensor_operand(t):
    return next(x for x in t if isinstance(x, torch.Tensor))


def round_parts(z: torch.Tensor, cdtype: torch.dtype, ctx: Ctx) -> torch.Tensor:
    """Round the real and imaginary parts of a complex result to ``cdtype``'s parts (one
    call on the interleaved parts, real before imaginary per element)."""
    z = z.resolve_conj().resolve_neg()
    if z.dtype is not torch.complex128:
        z = z.to(torch.complex128)
    return _pair(ctx.round(torch.view_as_real(z), PART[cdtype]))


# --------------------------------------------------------------------------- arithmetic
def add(ctx: Ctx, a, b, *, negate: bool = False) -> torch.Tensor:
    """``a + b`` (``negate``: ``a − b``), complex result."""
    cd = result_dtype(a, b)
    like = _tensor_operand((a, b))
    ar, ai = parts(a, cd, like)
    br, bi = parts(b, cd, like)
    op = ctx.sub if negate else ctx.add
    if ai is not None and bi is not None:
        return _pair(op(torch.view_as_real(join(ar, ai)), torch.view_as_real(join(br, bi))))
    if bi is None:  # complex ± real: only the real part moves
        re = op(ar, br)
        return join(re, ai)
    re = op(ar, br)  # real ± complex
    return join(re, -bi if negate else bi)


#: complex64 products of two tensors and ``polar`` of binary32 tensors on the CPU at 24
#: bits take :func:`pointwise.cmul32` and :func:`pointwise.polar32` (one compiled call
#: each, same keys and bits) below :data:`kernels.PARALLEL_MIN_WORK` roundings; false:
#: the tensor implementation (their reference in the tests)
USE_KERNELS = True


def _mul_kernel(ctx: Ctx, a, b) -> torch.Tensor | None:
    """:func:`mul` of two complex64 CPU tensors through :func:`pointwise.cmul32`, or None
    where it does not serve (other dtypes, formats or backends, parallel sizes)."""
    if not (USE_KERNELS and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dtype is torch.complex64 and b.dtype is torch.complex64):
        return None
    za, zb = torch.broadcast_tensors(a.resolve_conj().resolve_neg(),
                                     b.resolve_conj().resolve_neg())
    if 6 * za.numel() >= PARALLEL_MIN_WORK or not LK.serves(ctx, torch.view_as_real(za)):
        return None
    kp, ka = ctx.stream.keys(2)
    out = PW.cmul32(LK.flat32(torch.view_as_real(za)), LK.flat32(torch.view_as_real(zb)),
                    np.uint64(kp), np.uint64(ka), ctx.code)
    return torch.view_as_complex(torch.from_numpy(out).view(*za.shape, 2))


def mul(ctx: Ctx, a, b) -> torch.Tensor:
    """``a · b``: 4 multiplications and 2 additions (2 multiplications with a real factor)."""
    fast = _mul_kernel(ctx, a, b)
    if fast is not None:
        return fast
    cd = result_dtype(a, b)
    like = _tensor_operand((a, b))
    ar, ai = parts(a, cd, like)
    br, bi = parts(b, cd, like)
    if ai is None or bi is None:
        (zr, zi), s = ((br, bi), ar) if ai is None else ((ar, ai), br)
        z = torch.view_as_real(join(zr, zi))
        return _pair(ctx.mul(z, s.unsqueeze(-1)))
    return join(*mul_parts(ctx, ar, ai, br, bi))


def mul_parts(ctx: Ctx, ar, ai, br, bi):
    """(re, im) of ``(ar + i·ai)(br + i·bi)``: the four products in one call (stacked
    ``ar·br, ai·bi, ar·bi, ai·br``), then ``re = ar·br − ai·bi``, ``im = ar·bi + ai·br`` in
    one call. Operands are broadcast to one shape."""
    ar, ai, br, bi = torch.broadcast_tensors(ar, ai, br, bi)
    p = ctx.mul(torch.stack((ar, ai, ar, ai)), torch.stack((br, bi, bi, br)))
    s = ctx.add(torch.stack((p[0], p[2])), torch.stack((-p[1], p[3])))
    return s[0], s[1]


def div(ctx: Ctx, a, b) -> torch.Tensor:
    """``a / b`` by Smith's algorithm (module docstring)."""
    cd = result_dtype(a, b)
    like = _tensor_operand((a, b))
    ar, ai = parts(a, cd, like)
    br, bi = parts(b, cd, like)
    if bi is None:
        z = torch.view_as_real(join(ar, ai if ai is not None else torch.zeros_like(ar)))
        return _pair(ctx.div(z, br.unsqueeze(-1)))
    if ai is None:
        ai = torch.zeros_like(ar)
    ar, ai, br, bi = torch.broadcast_tensors(ar, ai, br, bi)
    big_r = br.abs() >= bi.abs()
    # branch |wr| >= |wi| first, then |wr| < |wi|, stacked on a leading axis of 2
    c = torch.stack((br, bi))  # the larger-by-branch part
    d = torch.stack((bi, br))
    rho = ctx.div(d, c)
    den = ctx.add(c, ctx.mul(d, rho))
    sig = ctx.div(1.0, den)
    ar2, ai2 = torch.stack((ar, ar)), torch.stack((ai, ai))
    # numerators: branch 0 (zr + zi·ρ, zi − zr·ρ); branch 1 (zr·ρ + zi, zi·ρ − zr)
    q = ctx.mul(torch.stack((ai2[0], ar2[0], ar2[1], ai2[1])),
                torch.stack((rho[0], rho[0], rho[1], rho[1])))
    n = ctx.add(torch.stack((ar2[0], ai2[0], q[2], q[3])),
                torch.stack((q[0], -q[1], ai2[1], -ar2[1])))
    o = ctx.mul(n, torch.stack((sig[0], sig[0], sig[1], sig[1])))
    re = torch.where(big_r, o[0], o[2])
    im = torch.where(big_r, o[1], o[3])
    zero = (br == 0) & (bi == 0)
    if bool(zero.any()):
        re = torch.where(zero, ar / br.abs(), re)
        im = torch.where(zero, ai / bi.abs(), im)
    return join(re, im)


def reduce(ctx: Ctx, z: torch.Tensor, dim, *, keepdim: bool = False, dtype=None,
           mean: bool = False) -> torch.Tensor:
    """Sum (``mean``: then one rounded division per part) of a complex tensor over ``dim``."""
    cd = dtype or z.dtype
    z = z.resolve_conj().resolve_neg().to(cd)
    nd = z.dim()
    dims = flop._dims(z, dim) if nd else []
    r = torch.view_as_real(z)
    out = flop.reduce(r, dims if dims else [], ctx, keepdim=keepdim) if dims else r.clone()
    if mean:
        n = 1
        for d in dims:
            n *= z.shape[d]
        out = ctx.div(out, float(n))
    return _pair(out)


def bmm(ctx: Ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched complex product from four real flop-level products (module docstring)."""
    cd = result_dtype(a, b)
    ar, ai = parts(a, cd, a)
    br, bi = parts(b, cd, a)
    if ai is None:
        ai = torch.zeros_like(ar)
    if bi is None:
        bi = torch.zeros_like(br)
    rr, ii = flop.bmm(ar, br, ctx), flop.bmm(ai, bi, ctx)
    ri, ir = flop.bmm(ar, bi, ctx), flop.bmm(ai, br, ctx)
    s = ctx.add(torch.stack((rr, ri)), torch.stack((-ii, ir)))
    return join(s[0], s[1])


def polar(ctx: Ctx, r: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``r·(cos θ + i sin θ)``: cos and sin rounded once from float64, then 2 products
    (binary32 operands of one shape on the CPU at 24 bits: :func:`pointwise.polar32`, one
    compiled call with the same keys and bits)."""
    pd = torch.promote_types(r.dtype, theta.dtype)
    t64 = theta.to(torch.float64)
    if (USE_KERNELS and r.dtype is torch.float32 and theta.dtype is torch.float32
            and r.shape == theta.shape and 4 * r.numel() < PARALLEL_MIN_WORK
            and LK.serves(ctx, r, theta)):
        kr, km = ctx.stream.keys(2)
        out = PW.polar32(LK.flat32(r), torch.cos(t64).contiguous().view(-1).numpy(),
                         torch.sin(t64).contiguous().view(-1).numpy(), np.uint64(kr),
                         np.uint64(km), ctx.code)
        return torch.view_as_complex(torch.from_numpy(out).view(*r.shape, 2))
    cs = ctx.round(torch.stack((torch.cos(t64), torch.sin(t64))), pd)
    p = ctx.mul(r.to(pd).unsqueeze(0), cs)
    return join(p[0], p[1])
