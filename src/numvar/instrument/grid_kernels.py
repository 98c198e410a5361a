"""``grid_sampler_2d`` at flop granularity in one compiled call (binary32, bilinear and
nearest); ``affine_grid_generator`` without its decomposition's dispatches
(:func:`affine_grid_generator`); linear, bilinear and trilinear upsampling with their
full-size roundings in one compiled call (:func:`upsample_linear`).

The reference is the decomposition (:func:`numvar.instrument.decompositions.grid_sampler_2d`,
torch's ``_grid_sampler_2d`` with the grid not expanded over channels) run op by op
through the mode: some 100 aten ops per call (35–140 with padding and interpolation),
each with its own stream key. :func:`grid_sampler_2d` computes the same values with the
same keys in one numba call: the keys the decomposition's rounded ops would draw are
drawn in that order (one per op), and each rounding uses the key of its op and the
element's index in that op's result (C order), ``bits64(key, l)``, through the same
fast path and the same rounding-core fallback as the elementwise kernels of
:mod:`numvar.instrument.pointwise`. The ops, per output location ``(n, h, w)``
(index ``l``) and, for the taps, per ``(n, c, h, w)`` (index ``lc``):

* unnormalise x then y: ``RND(RND(g·mul) + ofs)`` (2 keys each);
  border padding: a clamp (exact); reflection (span > 0): ``s = RND(v − min)``,
  ``RND(fmod(|s|, span))`` (a float64 op rounded once), ``q = RND(|s| / span)``,
  ``RND(extra + min)`` and ``RND((span + min) − extra)``, chosen by the parity of
  ``floor(q)``, then the clamp (5 keys more);
* bilinear: ``floor``; ``RND(nw + 1)`` for x then y; the four weights
  ``RND(RND(·−·)·RND(·−·))`` (nw, ne, sw, se: 12 keys); per channel the four taps
  ``RND(v·w)`` (the value at (0, 0) and weight +0 outside the image), summed left to
  right ``RND(RND(RND(t_nw + t_ne) + t_sw) + t_se)`` (7 keys);
* nearest: round half to even (exact); ``RND(v·1)`` inside, ``RND(v(0,0)·0)`` outside
  (1 key).

Compile time: the per-location pieces (:func:`_source` per coordinate, :func:`_weights`,
:func:`_blend` over the channels) are compiled functions of their own, each inlining its
roundings once; with every rounding inlined into one function (some 50 sites) numba's
inliner and SSA passes took 110 s cold, now 36 s, for a kernel 1.15–1.25× slower
(bilinear, 2×8×32² outputs: 0.56 → 0.70 ms best of 30, one thread; nearest 0.13 →
0.15 ms). See docs/internals.md, "Compile time".

The decomposition stays the slow reference: with :data:`USE_KERNELS` false (or outside
the cases :func:`serves` names) every call takes it;
``tests/test_instrument_grid_kernels.py`` compares the two bit for bit. The mode calls
:func:`grid_sampler_2d` with the number of keys the decomposition drew on its first
call with the same signature, and takes the decomposition whenever the two disagree.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch._decomp.decompositions import _compute_scale, _linspace_from_neg_one

from numvar.rounding import kernels as K

from . import linalg_kernels as LK
from .handlers import FLOP_HANDLERS, _get
from .kernels import _bits, _fast32
from .pointwise import round_into

#: take the compiled kernel where it serves (False: the decomposition, the reference)
USE_KERNELS = True

_OP_ADD, _OP_SUB, _OP_MUL, _OP_DIV = K.OP_ADD, K.OP_SUB, K.OP_MUL, K.OP_DIV
_lo32 = K.lo32_fast

#: interpolation modes served (0 bilinear, 1 nearest; bicubic takes the decomposition)
_SERVED_MODES = (0, 1)


# ------------------------------------------------------------------ one rounding each
# the rounding core's scalar functions, compiled once (not inlined at every call site;
# callers pass the op as np.int64(...): a constant would be a literal type, and numba
# compiles a callee once per literal value)
@njit(cache=True, error_model="numpy")
def _core_binary(op, a, b, mode, r):  # pragma: no cover - compiled
    return np.float32(K.narrow_binary(op, a, b, mode, 24, 24, -126, 127, r))


@njit(cache=True, error_model="numpy")
def _core_round(h, mode, r):  # pragma: no cover - compiled
    return np.float32(K.round_f32(h, 0.0, mode, 24, r))


# the arithmetic of numvar.instrument.pointwise's loops (fast path, then the rounding
# core's scalar function where it declines), for one element
@njit(inline="always", error_model="numpy")
def _mul(a, b, ukey, l, mode):
    r = _bits(ukey, np.uint64(l))
    v, ok = _fast32(np.float64(a) * np.float64(b), r, mode)
    if not ok:
        v = _core_binary(np.int64(_OP_MUL), a, b, mode, r)
    return v


@njit(inline="always", error_model="numpy")
def _addsub(a, b, neg, ukey, l, mode):
    r = _bits(ukey, np.uint64(l))
    x = np.float64(a)
    y = np.float64(b)
    if neg:
        y = -y
    s = x + y
    bv = s - x
    e = (x - (s - bv)) + (y - bv)
    v, ok = _fast32(s, r, mode)
    if not (ok and e == 0.0):
        v = _core_binary(np.int64(_OP_SUB if neg else _OP_ADD), a, b, mode, r)
    return v


@njit(inline="always", error_model="numpy")
def _div(a, b, ukey, l, mode):
    r = _bits(ukey, np.uint64(l))
    x = np.float64(a)
    y = np.float64(b)
    q = x / y
    ph, pl = K.two_prod(q, y)
    e = ((x - ph) - pl) / y
    fin = q != 0.0 and abs(q) < np.inf and abs(x) < np.inf and abs(y) < np.inf
    v, ok = _lo32(q, e if fin else 0.0, r, mode)
    if not ok:
        v = _core_binary(np.int64(_OP_DIV), a, b, mode, r)
    return v


@njit(inline="always", error_model="numpy")
def _round(h, ukey, l, mode):
    r = _bits(ukey, np.uint64(l))
    v, ok = _fast32(h, r, mode)
    if not ok:
        v = _core_round(h, mode, r)
    return v


@njit(inline="always")
def _clamp(v, hi):
    """torch.clamp(v, 0, hi): NaN and -0.0 kept."""
    if v < 0.0:
        return np.float32(0.0)
    if v > hi:
        return hi
    return v


@njit(error_model="numpy")
def _source(g, size, align, pad, ks, k, l, mode):
    """The source coordinate of grid value ``g`` along a dim of ``size`` (keys from
    ``ks[k]`` on): (coordinate, next key index)."""
    mul = np.float32(size * 0.5 - 0.5) if align else np.float32(size * 0.5)
    v = _mul(g, mul, ks[k], l, mode)
    v = _addsub(v, np.float32(size * 0.5 - 0.5), False, ks[k + 1], l, mode)
    k += 2
    hi = np.float32(size - 1)
    if pad == 1:
        v = _clamp(v, hi)
    elif pad == 2:
        lo2, hi2 = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
        if lo2 == hi2:
            v = np.float32(0.0)
        else:
            cmin = lo2 / 2
            span = (hi2 - lo2) / 2
            s = abs(_addsub(v, np.float32(cmin), True, ks[k], l, mode))
            extra = _round(np.fmod(np.float64(s), span), ks[k + 1], l, mode)
            q = np.floor(_div(s, np.float32(span), ks[k + 2], l, mode))
            # the parity of torch's int8 cast of floor(q): |q| >= 2**24 (every float32
            # there is even), inf and NaN (the cast's integer indefinite) count as even
            odd = abs(q) < 16777216.0 and (np.int64(q) & 1) == 1
            e1 = _addsub(extra, np.float32(cmin), False, ks[k + 3], l, mode)
            e2 = _addsub(np.float32(span + cmin), extra, True, ks[k + 4], l, mode)
            v = e2 if odd else e1
            k += 5
        v = _clamp(v, hi)
    return v, k


@njit(error_model="numpy")
def _weights(ix, iy, x0, y0, ks, k, l, mode):
    """The bilinear corners ``x1 = RND(x0 + 1)``, ``y1 = RND(y0 + 1)`` and the four
    weights nw, ne, sw, se (14 keys from ``ks[k]`` on)."""
    one = np.float32(1.0)
    x1 = _addsub(x0, one, False, ks[k], l, mode)
    y1 = _addsub(y0, one, False, ks[k + 1], l, mode)
    k += 2
    w_nw = _mul(_addsub(x1, ix, True, ks[k], l, mode),
                _addsub(y1, iy, True, ks[k + 1], l, mode), ks[k + 2], l, mode)
    w_ne = _mul(_addsub(ix, x0, True, ks[k + 3], l, mode),
                _addsub(y1, iy, True, ks[k + 4], l, mode), ks[k + 5], l, mode)
    w_sw = _mul(_addsub(x1, ix, True, ks[k + 6], l, mode),
                _addsub(iy, y0, True, ks[k + 7], l, mode), ks[k + 8], l, mode)
    w_se = _mul(_addsub(ix, x0, True, ks[k + 9], l, mode),
                _addsub(iy, y0, True, ks[k + 10], l, mode), ks[k + 11], l, mode)
    return x1, y1, w_nw, w_ne, w_sw, w_se


@njit(error_model="numpy")
def _blend(inp, out, n, h, w, q, HW, y_nw, x_nw, y_ne, x_ne, y_sw, x_sw, y_se, x_se, w_nw,
           w_ne, w_sw, w_se, ks, k, mode):
    """Every channel of output location ``(n, h, w)`` (``q = h·oW + w``): the four taps
    ``RND(v·w)`` summed left to right (7 keys from ``ks[k]`` on, element index
    ``(n·C + c)·HW + q``)."""
    C = inp.shape[1]
    for c in range(C):
        lc = (n * C + c) * HW + q
        s = _mul(inp[n, c, y_nw, x_nw], w_nw, ks[k], lc, mode)
        t = _mul(inp[n, c, y_ne, x_ne], w_ne, ks[k + 1], lc, mode)
        s = _addsub(s, t, False, ks[k + 2], lc, mode)
        t = _mul(inp[n, c, y_sw, x_sw], w_sw, ks[k + 3], lc, mode)
        s = _addsub(s, t, False, ks[k + 4], lc, mode)
        t = _mul(inp[n, c, y_se, x_se], w_se, ks[k + 5], lc, mode)
        out[n, c, h, w] = _addsub(s, t, False, ks[k + 6], lc, mode)


@njit(inline="always")
def _tap(x, y, iW, iH):
    """(in bounds, column, row) of a corner: (0, 0) outside the image."""
    inb = x >= 0.0 and x < iW and y >= 0.0 and y < iH
    if inb:
        return True, np.int64(x), np.int64(y)
    return False, 0, 0


@njit(cache=True, error_model="numpy")
def _grid_sample(inp, grid, out, interp, pad, align, ks, mode):  # pragma: no cover
    """``out`` (N, C, oH, oW) from ``inp`` (N, C, iH, iW) and ``grid`` (N, oH, oW, 2),
    all C-contiguous binary32; ``ks``: the ops' keys in the decomposition's order."""
    K.wide_vectors()
    N, C, iH, iW = inp.shape
    oH, oW = out.shape[2], out.shape[3]
    HW = oH * oW
    for n in range(N):
        for q in range(HW):
            h = q // oW
            w = q - h * oW
            l = n * HW + q
            ix, k = _source(grid[n, h, w, 0], iW, align, pad, ks, np.int64(0), l, mode)
            iy, k = _source(grid[n, h, w, 1], iH, align, pad, ks, k, l, mode)
            if interp == 1:
                inb, xi, yi = _tap(np.rint(ix), np.rint(iy), iW, iH)
                wt = np.float32(1.0) if inb else np.float32(0.0)
                for c in range(C):
                    lc = (n * C + c) * HW + q
                    out[n, c, h, w] = _mul(inp[n, c, yi, xi], wt, ks[k], lc, mode)
                continue
            x0 = np.floor(ix)
            y0 = np.floor(iy)
            x1, y1, w_nw, w_ne, w_sw, w_se = _weights(ix, iy, x0, y0, ks, k, l, mode)
            k += 14
            zero = np.float32(0.0)
            i_nw, x_nw, y_nw = _tap(x0, y0, iW, iH)
            i_ne, x_ne, y_ne = _tap(x1, y0, iW, iH)
            i_sw, x_sw, y_sw = _tap(x0, y1, iW, iH)
            i_se, x_se, y_se = _tap(x1, y1, iW, iH)
            w_nw = w_nw if i_nw else zero
            w_ne = w_ne if i_ne else zero
            w_sw = w_sw if i_sw else zero
            w_se = w_se if i_se else zero
            _blend(inp, out, n, h, w, q, HW, y_nw, x_nw, y_ne, x_ne, y_sw, x_sw, y_se, x_se,
                   w_nw, w_ne, w_sw, w_se, ks, k, mode)


def _keys_per_coordinate(size: int, padding_mode: int, align_corners: bool) -> int:
    if padding_mode != 2:
        return 2
    degenerate = align_corners and size == 1
    return 2 if degenerate else 7


def keys_needed(input: torch.Tensor, interpolation_mode: int, padding_mode: int,
                align_corners: bool) -> int:
    """The number of stream keys the decomposition draws for these arguments."""
    iH, iW = input.shape[2], input.shape[3]
    n = (_keys_per_coordinate(iW, padding_mode, align_corners)
         + _keys_per_coordinate(iH, padding_mode, align_corners))
    return n + (1 if interpolation_mode == 1 else 21)


def serves(ctx, input, grid, interpolation_mode, padding_mode) -> bool:
    """The kernel computes this call: binary32 CPU input and grid at 24 bits in their own
    format, numba backend, bilinear or nearest, a padding mode torch knows."""
    return (USE_KERNELS and ctx._t32 and ctx._numba and ctx.format is None
            and isinstance(input, torch.Tensor) and isinstance(grid, torch.Tensor)
            and input.dtype is torch.float32 and grid.dtype is torch.float32
            and input.is_cpu and grid.is_cpu and input.dim() == 4 and grid.dim() == 4
            and grid.shape[3] == 2 and grid.shape[0] == input.shape[0]
            and interpolation_mode in _SERVED_MODES and padding_mode in (0, 1, 2))


def grid_sampler_2d(ctx, args, kwargs, nkeys: int):
    """``aten.grid_sampler_2d`` on the mode's stream, or None where the kernel does not
    serve the call or the decomposition drew a number of keys other than ``nkeys``
    (the caller then runs the decomposition)."""
    input, grid, interp, pad, align = _arguments(args, kwargs)
    if not serves(ctx, input, grid, interp, pad):
        return None
    if keys_needed(input, interp, pad, align) != nkeys:
        return None
    N, C = input.shape[0], input.shape[1]
    oH, oW = grid.shape[1], grid.shape[2]
    out = torch.empty((N, C, oH, oW), dtype=torch.float32)
    ks = ctx.stream_keys(nkeys)
    if out.numel():
        _grid_sample(input.detach().contiguous().numpy(), grid.detach().contiguous().numpy(),
                     out.numpy(), interp, pad, bool(align), ks, ctx.code)
    return out


def _arguments(args, kwargs):
    names = ("input", "grid", "interpolation_mode", "padding_mode", "align_corners")
    vals = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
    return tuple(vals)


# ------------------------------------------------------------------ affine grid
_ADD, _MUL, _SUM = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor,
                    torch.ops.aten.sum.dim_IntList)
#: the stream keys ``affine_grid_generator``'s decomposition draws for a 4-D size at
#: flop granularity: its two adds, its product and its sum (one each)
AFFINE_GRID_KEYS = 4


def affine_grid_generator(ctx, args, kwargs, nkeys: int):
    """``aten.affine_grid_generator`` for a 4-D size on the CPU as its decomposition
    (torch's ``_affine_grid_generator_4d``) computes it at flop granularity, without its
    some twenty dispatched sub-ops: the base grid's exact pieces (``linspace``, ``ones``,
    the zero padding) built natively, and its rounded sub-ops (``grid_x + grid_y``,
    ``+ grid_one``, ``base · θᵀ``, the sum over θ's columns) computed by the flop
    handlers those sub-ops reach, on the same values, in the same order: the same keys
    and the same bits (tested against the decomposition). None (the decomposition
    runs) for other sizes, devices or dtypes, with :data:`USE_KERNELS` false, or where
    the decomposition drew other than :data:`AFFINE_GRID_KEYS` keys. (``affine_grid``
    at flop SR, θ (2, 2, 3), a 32×32 grid, one thread: 313 → 219 µs; what remains is
    those four roundings, the product's broadcast and the sum's transposition.)"""
    theta, size = _get(args, kwargs, 0, "theta"), _get(args, kwargs, 1, "size")
    align = _get(args, kwargs, 2, "align_corners")
    if (not USE_KERNELS or nkeys != AFFINE_GRID_KEYS or size is None or len(size) != 4
            or not isinstance(theta, torch.Tensor)
            or theta.dtype is not torch.float32 or not theta.is_cpu or theta.dim() != 3):
        return None
    n, _, h, w = size
    dt, dev = theta.dtype, theta.device
    # (the decomposition's own base coordinates: exact)
    lx, ly = _linspace_from_neg_one(w, align, dt, dev), _linspace_from_neg_one(h, align, dt, dev)
    if AFFINE_IN_ONE_CALL and LK.serves(ctx, lx, ly, theta):
        out = _affine_grid(lx.reshape(w).numpy(), ly.reshape(h).numpy(),
                           theta.detach().contiguous().numpy(),
                           ctx.stream_keys(AFFINE_GRID_KEYS), ctx.code)
        return torch.from_numpy(out).view(n, h, w, 2)
    pad = torch.nn.functional.pad
    grid_x = pad(lx.view(1, w, 1), (0, 2))
    grid_y = pad(ly.view(h, 1, 1), (1, 1))
    grid_one = pad(torch.ones((1, 1, 1), dtype=dt), (2, 0))
    add, mul, total = FLOP_HANDLERS["aten.add"], FLOP_HANDLERS["aten.mul"], FLOP_HANDLERS["aten.sum"]
    base = add(ctx, _ADD, (add(ctx, _ADD, (grid_x, grid_y), {}), grid_one), {})
    prod = mul(ctx, _MUL, (base.view(-1, 3, 1), theta.mT.unsqueeze(1)), {})
    return total(ctx, _SUM, (prod, [-2]), {}).view(n, h, w, 2)


#: :func:`affine_grid_generator`'s four roundings in one compiled call
#: (:func:`_affine_grid`); False: through the flop handlers of ``add``, ``mul`` and ``sum``
AFFINE_IN_ONE_CALL = True


@njit(cache=True, error_model="numpy")
def _affine_grid(lx, ly, theta, keys, mode):  # pragma: no cover - compiled
    """The rounded sub-ops of ``affine_grid_generator``'s decomposition for the base
    coordinates ``lx`` (W,), ``ly`` (H,) and θ (N, 2, 3), binary32, with their ``keys``
    in its order: (N, H·W, 2). The base grid (P = H·W rows of three) as the ``add``
    handler rounds ``[x, 0, 0] + [0, y, 0]``, then ``+ [0, 0, 1]`` (index: the C order of
    (H, W, 3)); the products ``base · θᵀ`` as the ``mul`` handler rounds them (index: the
    C order of their broadcast (N, P, 3, 2)); their sum over the 3 as ``flop.reduce``
    scans it (the first term as it is, the second and third added at ``k·M + m``, M =
    N·P·2, m the C index of (N, P, 2)). ``round_into`` throughout: the elementwise
    tiles' arithmetic. The handlers materialised the broadcast operands through PyTorch
    and transposed the products before the scan (about 190 of 250 µs for a 2 × 32 × 32
    grid, one thread)."""
    N, H, W = theta.shape[0], ly.size, lx.size
    P = H * W
    gx = np.zeros(3 * P, np.float32)
    gy = np.zeros(3 * P, np.float32)
    one = np.zeros(3 * P, np.float32)
    for hh in range(H):
        for ww in range(W):
            q = 3 * (hh * W + ww)
            gx[q] = lx[ww]
            gy[q + 1] = ly[hh]
            one[q + 2] = 1.0
    part = np.empty(3 * P, np.float32)
    base = np.empty(3 * P, np.float32)
    round_into(_OP_ADD, gx, gy, part, keys[0], 0, mode)
    round_into(_OP_ADD, part, one, base, keys[1], 0, mode)
    M = N * P * 2
    a = np.empty(3 * M, np.float32)
    b = np.empty(3 * M, np.float32)
    for n in range(N):
        for p in range(P):
            for j in range(3):
                l0 = ((n * P + p) * 3 + j) * 2
                a[l0] = base[3 * p + j]
                a[l0 + 1] = base[3 * p + j]
                b[l0] = theta[n, 0, j]
                b[l0 + 1] = theta[n, 1, j]
    prod = np.empty(3 * M, np.float32)
    round_into(_OP_MUL, a, b, prod, keys[2], 0, mode)
    t = np.empty((3, M), np.float32)  # the products' transpose, the scan's (K, M) rows
    for q in range(N * P):
        for j in range(3):
            t[j, 2 * q] = prod[(3 * q + j) * 2]
            t[j, 2 * q + 1] = prod[(3 * q + j) * 2 + 1]
    acc = np.empty(M, np.float32)
    out = np.empty(M, np.float32)
    round_into(_OP_ADD, t[0], t[1], acc, keys[3], M, mode)
    round_into(_OP_ADD, acc, t[2], out, keys[3], 2 * M, mode)
    return out.reshape(N, P, 2)


# ------------------------------------------------------------------ linear upsampling
_SUB = torch.ops.aten.sub.Tensor


def upsample_keys(nd: int, align: bool) -> int:
    """The stream keys the decomposition of ``nd``-D linear upsampling (torch's
    ``_upsample_linear``) draws at flop granularity: per spatial dim its source
    coordinates (``scale·(i + 0.5) − 0.5``: three, or with ``align_corners``
    ``scale·i``: one), then per dim, the last first, its interpolation weight
    ``x − ⌊x⌋`` (one) and, per pair of taps, ``v₁ + (v₂ − v₁)·w`` (three; 2^(nd−1)
    pairs across the last dim, half as many across each earlier one): 17 for bilinear
    (13 aligned), 33 for trilinear (27)."""
    return nd * (1 if align else 3) + nd + 3 * (2 ** nd - 1)


#: output elements per chunk of :func:`_upsample_planes` (its buffers, 2^(nd+1) − 1 + 3
#: rows of CHUNK float32, stay in L2)
UPSAMPLE_CHUNK = 2048


@njit(cache=True, error_model="numpy")
def _upsample_planes(x, out, nd, lo, hi, w, keys, mode):  # pragma: no cover - compiled
    """The full-size roundings of :func:`upsample_linear`, plane by plane, for the
    (P, D, H, W) input ``x`` and (P, Do, Ho, Wo) ``out`` (1-D and 2-D as 3-D with leading
    sizes 1), ``nd`` of the dims interpolated (the last ones); ``lo``/``hi``/``w``
    (3, max(Do, Ho, Wo)): per dim (padded to three, leading; zeros for a leading dim)
    the source index pair and the weight of each output index, as the decomposition
    computes them. The 2^nd taps (corner bits in ``itertools.product`` order, the first
    dim most significant) are gathered exactly; then per dim, the last first, each pair
    of the previous results (taps) is combined as ``v₁ + (v₂ − v₁)·w`` by three
    roundings with the keys of its ops in the decomposition's order (``keys``, pairs in
    order, the last dim's first), each element indexed by its place in the (N, C, *So)
    result and rounded by :func:`numvar.instrument.pointwise.round_into` (the
    elementwise kernels' arithmetic). Output elements in chunks of
    :data:`UPSAMPLE_CHUNK`, whose taps' offsets in a plane and weights are set once for
    every plane (buffers in cache)."""
    P = out.shape[0]
    Do, Ho, Wo = out.shape[1], out.shape[2], out.shape[3]
    S = Do * Ho * Wo
    H, W = x.shape[2], x.shape[3]
    CH = UPSAMPLE_CHUNK
    ntap = 1 << nd
    bufs = np.empty((2 * ntap - 1, CH), np.float32)
    d = np.empty(CH, np.float32)
    m = np.empty(CH, np.float32)
    wexp = np.empty((3, CH), np.float32)
    offs = np.empty((ntap, CH), np.int64)
    xf = x.reshape(P, -1)
    for e0 in range(0, S, CH):
        n = min(CH, S - e0)
        for e in range(n):
            f = e0 + e
            ox = f % Wo
            oy = (f // Wo) % Ho
            oz = f // (Wo * Ho)
            wexp[0, e], wexp[1, e], wexp[2, e] = w[0, oz], w[1, oy], w[2, ox]
            for a in range(ntap):  # corner a: bit 2 − dd of a for padded dim dd (0 for a
                #                    leading size-1 dim, whose lo = hi = 0)
                sz = hi[0, oz] if (a >> 2) & 1 else lo[0, oz]
                sy = hi[1, oy] if (a >> 1) & 1 else lo[1, oy]
                sx = hi[2, ox] if a & 1 else lo[2, ox]
                offs[a, e] = (sz * H + sy) * W + sx
        for q in range(P):
            xq = xf[q]
            for a in range(ntap):
                tap = bufs[a]
                oa = offs[a]
                for e in range(n):
                    tap[e] = xq[oa[e]]
            base = 0  # first buffer of the current level's values
            k = 0
            oflat = out[q].reshape(-1)
            l0 = q * S + e0
            for lev in range(nd - 1, -1, -1):  # the last dim first
                we = wexp[lev + 3 - nd, :n]
                npair = 1 << lev
                nxt = base + 2 * npair
                for pr in range(npair):
                    v1 = bufs[base + 2 * pr, :n]
                    v2 = bufs[base + 2 * pr + 1, :n]
                    r = oflat[e0:e0 + n] if lev == 0 else bufs[nxt + pr, :n]
                    round_into(_OP_SUB, v2, v1, d[:n], np.uint64(keys[k]), l0, mode)
                    round_into(_OP_MUL, d[:n], we, m[:n], np.uint64(keys[k + 1]), l0, mode)
                    round_into(_OP_ADD, v1, m[:n], r, np.uint64(keys[k + 2]), l0, mode)
                    k += 3
                base = nxt


def upsample_linear(ctx, args, kwargs, nkeys: int):
    """``aten.upsample_linear1d``, ``upsample_bilinear2d`` and ``upsample_trilinear3d``
    as their decomposition (torch's ``_upsample_linear``) computes them at flop
    granularity: the source coordinates and weights (small 1-D tensors) by the flop
    handlers their sub-ops reach, on the same values in the same order; the 2^nd taps
    gathered and the full-size roundings (``v₁ + (v₂ − v₁)·w`` per pair of taps, the
    last dim first) in one compiled call (:func:`_upsample_planes`) with the keys the
    decomposition draws for them: the same keys and bits (tested against the
    decomposition), without its 2^nd full-size gathers (``_unsafe_index``) and some
    forty (bilinear) to eighty (trilinear) dispatched sub-ops. None (the decomposition
    runs) with :data:`USE_KERNELS` false, for other than a contiguous binary32 CPU input
    under binary32 roundings at 24 bits, or where the decomposition drew other than
    :func:`upsample_keys` keys."""
    x = _get(args, kwargs, 0, "input")
    size = _get(args, kwargs, 1, "output_size")
    align = _get(args, kwargs, 2, "align_corners")
    if not isinstance(x, torch.Tensor) or size is None:
        return None
    nd = x.dim() - 2
    names = ("scales_d", "scales_h", "scales_w")[3 - nd:] if 1 <= nd <= 3 else ()
    if (not USE_KERNELS or not 1 <= nd <= 3 or len(size) != nd or not x.is_contiguous()
            or nkeys != upsample_keys(nd, bool(align)) or not LK.serves(ctx, x)):
        return None
    scales = [_get(args, kwargs, 3 + i, name) for i, name in enumerate(names)]
    add, sub, mul = FLOP_HANDLERS["aten.add"], FLOP_HANDLERS["aten.sub"], FLOP_HANDLERS["aten.mul"]
    taps = []
    for d in range(nd):  # (the decomposition's get_values, the first dim first)
        sf = _compute_scale(x.shape[2 + d], size[d], align, scales[d])
        i = torch.arange(size[d]).to(torch.float32)
        if align:
            src = mul(ctx, _MUL, (i, sf), {})
        else:
            src = sub(ctx, _SUB, (mul(ctx, _MUL, (add(ctx, _ADD, (i, 0.5), {}), sf), {}),
                                  0.5), {})
        src = src.clamp(min=0.0)
        lo = src.to(torch.int64)
        taps.append((src, lo, (lo + 1).clamp(max=x.shape[2 + d] - 1)))
    width = max(size)
    lo3 = np.zeros((3, width), np.int64)
    hi3 = np.zeros((3, width), np.int64)
    w3 = np.zeros((3, width), np.float32)
    keys = []
    for d in reversed(range(nd)):  # the last dim first: its weights, then its pairs' keys
        src, lo, hi = taps[d]
        dd = d + 3 - nd
        w3[dd, :size[d]] = sub(ctx, _SUB, (src, lo), {}).clamp(0.0, 1.0).numpy()
        lo3[dd, :size[d]], hi3[dd, :size[d]] = lo.numpy(), hi.numpy()
        keys.append(ctx.stream_keys(3 << d))
    n, c = x.shape[:2]
    out = torch.empty((n, c, *size), dtype=torch.float32)
    if out.numel():
        lead = (1,) * (3 - nd)
        _upsample_planes(x.detach().numpy().reshape(n * c, *lead, *x.shape[2:]),
                         out.numpy().reshape(n * c, *lead, *size), nd, lo3, hi3, w3,
                         np.concatenate(keys), ctx.code)
    return out
