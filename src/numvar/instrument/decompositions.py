"""numvar's own decompositions, for ops that ``torch._decomp`` does not decompose.

Pure functions of aten ops, one per op (the style of ``torch/_decomp/decompositions.py``),
run by the mode at ``flop`` granularity with the mode re-entered, so that every sub-op is
rounded (recorded and replayed like torch's decompositions). Gradient scatters go through
``scatter_reduce(..., "sum", include_self=False)`` on a zero tensor: the accumulation of
:mod:`numvar.instrument.scatter` (sources in increasing source index order, the first
copied, every later add rounded). The orders are documented in docs/accumulating-ops.md.

``DECOMPOSITIONS`` maps aten overloads to these functions; the mode uses an entry when
its op name is listed in :data:`numvar.instrument.ops.DECOMPOSED_OPS`.
"""

from __future__ import annotations

import torch
import torch._decomp.decompositions as TD

aten = torch.ops.aten

DECOMPOSITIONS: dict = {}


def _register(*ops):
    def deco(fn):
        for op in ops:
            DECOMPOSITIONS[op] = fn
        return fn

    return deco


def _scatter_sum(shape, pos: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """A zero tensor of ``shape`` with ``src`` summed at the flat positions ``pos`` (same
    shape as src), in increasing source index order (the first contribution copied)."""
    n = 1
    for s in shape:
        n *= s
    zeros = torch.zeros(n, dtype=src.dtype, device=src.device)
    out = aten.scatter_reduce.two(zeros, 0, pos.reshape(-1), src.reshape(-1), "sum",
                                  include_self=False)
    return out.view(tuple(shape))


# ------------------------------------------------------------------- addbmm
@_register(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    """``β·self + α·Σ_b batch1[b] @ batch2[b]`` as one product over the concatenated
    contraction index (b, k), b-major: the flop matmul's order (products in increasing
    (b, k), accumulated left to right), then the scalings and the add."""
    b, m, k = batch1.shape
    a = batch1.permute(1, 0, 2).reshape(m, b * k)
    return aten.addmm.default(self, a, batch2.reshape(b * k, -1), beta=beta, alpha=alpha)


# ------------------------------------------------------------------- logcumsumexp
@_register(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    """A scan of ``logaddexp`` along ``dim``: ``acc_0 = x_0``, ``acc_k = logaddexp(acc_{k-1},
    x_k)``, each step one rounding of its float64 value (as native's sequential scan)."""
    if x.dim() == 0 or x.shape[dim] <= 1:
        return x.clone()
    xs = x.unbind(dim)
    acc = xs[0]
    outs = [acc]
    for v in xs[1:]:
        acc = aten.logaddexp.default(acc, v)
        outs.append(acc)
    return torch.stack(outs, dim)


# ------------------------------------------------------------------- weight norm
@_register(aten._weight_norm_interface_backward.default)
def weight_norm_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """PyTorch's formula (WeightNorm.cpp, _weight_norm_differentiable_backward):
    ``s = Σ_{¬dim} grad_w·v``; ``grad_v = (g/‖v‖)·(grad_w − v·(s/‖v‖²))``;
    ``grad_g = s/‖v‖``."""
    red = [d for d in range(saved_v.dim()) if d != dim]
    s = (grad_w * saved_v).sum(red, keepdim=True) if red else grad_w * saved_v
    norm = saved_norms.to(saved_v.dtype) if saved_norms.dtype != saved_v.dtype else saved_norms
    grad_v = (saved_g / norm) * (grad_w - saved_v * (s / (norm * norm)))
    grad_g = (s / norm).to(saved_g.dtype)
    return grad_v, grad_g


# ------------------------------------------------------------------- resampling
def _taps(kind: str, in_size: int, out_size: int, align_corners, scale, dtype, device):
    """One dimension of an interpolation: (indices (O, T) int64, weights (O, T) or None)
    computed as torch's forward decompositions compute them (linear: 2 taps with weights
    1−λ, λ; cubic: 4 taps, Keys' coefficients with A = −0.75; nearest: 1 tap)."""
    if kind in ("nearest", "nearest-exact"):
        scale_ = (in_size / (in_size * scale) if scale is not None and scale > 0
                  else in_size / out_size)
        o = torch.arange(out_size, dtype=torch.float32, device=device)
        off = 0.5 if kind == "nearest-exact" else 0.0
        idx = ((o + off) * scale_).to(torch.int64).clamp(max=in_size - 1)
        return idx.unsqueeze(1), None
    sf = TD._compute_scale(in_size, out_size, align_corners, scale)
    i = torch.arange(out_size, device=device).to(dtype=dtype)
    xf = TD._compute_source_index(sf, i, align_corners)
    if kind == "linear":
        xf = xf.clamp(min=0.0)
        x = xf.to(torch.int64)
        lam = (xf - x).clamp(0.0, 1.0).to(dtype)
        idx = torch.stack([x, (x + 1).clamp(max=in_size - 1)], 1)
        return idx, torch.stack([1.0 - lam, lam], 1)
    x = xf.floor()
    t = (xf - x).clamp(0.0, 1.0)
    x = x.to(torch.int64)
    idx = torch.stack([(x + k).clamp(0, in_size - 1) for k in (-1, 0, 1, 2)], 1)
    return idx, torch.stack(list(TD._upsample_get_cubic_coefficients(t)), 1)


def _transpose_1d(g: torch.Tensor, d: int, in_size: int, idx, w) -> torch.Tensor:
    """The transpose of a 1-D interpolation along dim ``d`` of ``g``: output position o
    sends ``w[o, t]·g[..., o, ...]`` to input position ``idx[o, t]`` (summed in
    increasing (o, t) per input position)."""
    shape = list(g.shape)
    outer = 1
    for s in shape[:d]:
        outer *= s
    inner = 1
    for s in shape[d + 1:]:
        inner *= s
    o, taps = idx.shape
    g3 = g.reshape(outer, o, 1, inner)
    src = g3.expand(outer, o, taps, inner) if w is None else g3 * w.reshape(1, o, taps, 1)
    pos = (torch.arange(outer, device=g.device).view(outer, 1, 1, 1) * (in_size * inner)
           + idx.view(1, o, taps, 1) * inner
           + torch.arange(inner, device=g.device).view(1, 1, 1, inner))
    shape[d] = in_size
    return _scatter_sum(shape, pos.expand(outer, o, taps, inner), src)


def _resample_backward(kind, grad, input_size, align_corners, scales):
    """Gradient of a separable interpolation: the 1-D transposes, first spatial dim first."""
    nd = len(input_size) - 2
    half = grad.dtype in (torch.bfloat16, torch.float16)
    g = grad.to(torch.float32) if half else grad  # opmath, as the forward decompositions
    for i in range(nd):
        d = 2 + i
        scale = scales[i] if i < len(scales) else None
        idx, w = _taps(kind, input_size[d], grad.shape[d], align_corners, scale, g.dtype,
                       grad.device)
        g = _transpose_1d(g, d, input_size[d], idx, w)
    return g.to(grad.dtype) if half else g


@_register(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad, output_size, input_size, align_corners, scales=None):
    return _resample_backward("linear", grad, input_size, align_corners, [scales])


@_register(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    return _resample_backward("linear", grad, input_size, align_corners, [scales_h, scales_w])


@_register(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(grad, output_size, input_size, align_corners, scales_d=None,
                                  scales_h=None, scales_w=None):
    return _resample_backward("linear", grad, input_size, align_corners,
                              [scales_d, scales_h, scales_w])


@_register(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad, output_size, input_size, align_corners, scales_h=None,
                                scales_w=None):
    return _resample_backward("cubic", grad, input_size, align_corners, [scales_h, scales_w])


def _nearest_backward(kind):
    def backward(grad, output_size, input_size, *scales):
        return _resample_backward(kind, grad, input_size, None, list(scales))

    return backward


for _nd in (1, 2, 3):
    _register(getattr(aten, f"upsample_nearest{_nd}d_backward").default)(
        _nearest_backward("nearest"))
    _register(getattr(aten, f"_upsample_nearest_exact{_nd}d_backward").default)(
        _nearest_backward("nearest-exact"))


# ------------------------------------------------------------------- padding
def _pad_backward(forward):
    """Gradient of a padding that copies input elements (reflection, replication): the
    forward applied to the input's flat positions gives, per output element, its source;
    grad_output is summed into those sources in C order."""
    def backward(grad, x, padding):
        n = x.numel()
        lin = torch.arange(n, dtype=torch.float64, device=x.device).view(x.shape)  # < 2^53
        pos = forward(lin, padding).to(torch.int64)
        return _scatter_sum(x.shape, pos, grad)

    return backward


for _nd in (1, 2, 3):
    for _kind in ("reflection", "replication"):
        _fwd = getattr(aten, f"{_kind}_pad{_nd}d").default
        _register(getattr(aten, f"{_kind}_pad{_nd}d_backward").default)(_pad_backward(_fwd))


# ------------------------------------------------------------------- cdist
def _uses_mm(x1, x2, p, compute_mode) -> bool:
    """PyTorch's choice of the matmul form of the Euclidean distance (compute_mode None
    or 0: when either set has more than 25 rows; 1: always; 2: never)."""
    if p != 2:
        return False
    if compute_mode == 1:
        return True
    if compute_mode == 2:
        return False
    return x1.shape[-2] > 25 or x2.shape[-2] > 25


@_register(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    """Direct form: ``(Σ_m |x1_i,m − x2_j,m|^p)^(1/p)`` (the sum over m in increasing m;
    p = 2: products and a square root; p = 1: no power; p = inf: max; p = 0: count);
    matmul form (p = 2, see :func:`_uses_mm`): :func:`euclidean_dist`."""
    if _uses_mm(x1, x2, p, compute_mode):
        return aten._euclidean_dist.default(x1, x2)
    return _cdist_direct(x1, x2, p)


def _cdist_direct(x1, x2, p):
    return _pnorm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p)


def _pnorm(diff, p):
    """The p-norm of ``diff`` over its last dim (see :func:`cdist_forward`)."""
    diff = diff.abs()
    if p == 0:
        return (diff != 0).sum(-1).to(diff.dtype)
    if p == float("inf"):
        return diff.amax(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        return (diff * diff).sum(-1).sqrt()
    return diff.pow(p).sum(-1).pow(1.0 / p)


@_register(aten._euclidean_dist.default)
def euclidean_dist(x1, x2):
    """torch's decomposition without ``matmul`` (a composite op): ``[−2·x1, ‖x1‖², 1]``
    times ``[x2, 1, ‖x2‖²]ᵀ`` as one batched product (the flop matmul order over the
    m + 2 terms), then ``sqrt(clamp_min(·, 0))``."""
    x1_norm = (x1 * x1).sum(-1, keepdim=True)
    x2_norm = (x2 * x2).sum(-1, keepdim=True)
    x1_ = torch.cat([x1 * -2, x1_norm, torch.ones_like(x1_norm)], -1)
    x2_ = torch.cat([x2, torch.ones_like(x2_norm), x2_norm], -1)
    lead = torch.broadcast_shapes(x1_.shape[:-2], x2_.shape[:-2])
    a = x1_.expand(*lead, *x1_.shape[-2:]).reshape(-1, *x1_.shape[-2:])
    b = x2_.expand(*lead, *x2_.shape[-2:]).reshape(-1, *x2_.shape[-2:])
    res = aten.bmm.default(a, b.transpose(1, 2)).reshape(*lead, x1.shape[-2], x2.shape[-2])
    return res.clamp_min(0).sqrt()


@_register(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    """PyTorch's per-pair formula (Distance.cpp), summed over the rows of x2 in increasing
    order: ``grad_x1[i] = Σ_j g_ij · φ(x1_i − x2_j, d_ij)`` with φ = sign(diff) (p = 1),
    ``(g·diff)/d`` (p = 2), ``sign(diff)·|diff|^(p−1)/d^(p−1)`` (other p), sign(diff) where
    ``|diff|`` is largest (p = inf); 0 where d = 0 (and everywhere for p = 0)."""
    if p == 0:
        return torch.zeros_like(x1)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., r1, r2, m)
    return _pair_grad(grad.unsqueeze(-1), diff, cdist.unsqueeze(-1), p).sum(-2)


def _pair_grad(g, diff, d, p):
    """``g · φ(diff, d)`` of :func:`cdist_backward` (p != 0)."""
    zero = torch.zeros((), dtype=diff.dtype, device=diff.device)
    if p == 1:
        term = g * diff.sign()
    elif p == 2:
        term = torch.where(d == 0, zero, (g * diff) / d)
    elif p == float("inf"):
        # the coordinates where |diff| is largest (recomputed here: under random rounding
        # the forward's rounded differences need not equal these)
        ad = diff.abs()
        term = torch.where(ad == ad.amax(-1, keepdim=True), g * diff.sign(), zero)
    else:
        term = torch.where(d == 0, zero,
                           (g * diff.sign()) * (diff.abs().pow(p - 1) / d.pow(p - 1)))
    return term


@_register(aten._pdist_forward.default)
def pdist_forward(x, p=2):
    """The pairs i < j in row-major order, each ``_pnorm(x_i − x_j)`` (as cdist's direct
    form)."""
    i, j = torch.triu_indices(x.shape[0], x.shape[0], 1, device=x.device)
    return _pnorm(x[i] - x[j], p)


@_register(aten._pdist_backward.default)
def pdist_backward(grad, x, p, pdist):
    """PyTorch's order: pairs (i, j) in row-major order, each adding ``g·φ`` to row i and
    subtracting it from row j (cdist's φ), summed per row in pair order."""
    n, m = x.shape
    if p == 0 or n < 2:
        return torch.zeros_like(x)
    i, j = torch.triu_indices(n, n, 1, device=x.device)
    term = _pair_grad(grad.unsqueeze(-1), x[i] - x[j], pdist.unsqueeze(-1), p)  # (P, m)
    src = torch.stack([term, -term], 1)  # (P, 2, m)
    pos = torch.stack([i, j], 1).unsqueeze(-1) * m + torch.arange(m, device=x.device)
    return _scatter_sum(x.shape, pos, src)


# ------------------------------------------------------------------- grid sampler
@_register(aten.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """torch's decomposition with the grid not expanded over channels, so that each output
    location's coordinates and weights are computed (and rounded) once, as in PyTorch's
    CPU kernel; binary16/bfloat16 in binary32 (torch's opmath cast)."""
    half = input.dtype in (torch.bfloat16, torch.float16)
    if half:
        input, grid_ = input.float(), grid.float()
    else:
        grid_ = grid
    out = TD._grid_sampler_2d(input, grid_, interpolation_mode, padding_mode, align_corners,
                              _expand_grid=False)
    return out.to(grid.dtype) if half else out


def _unnormalize(coords, size: int, align_corners: bool):
    """(pixel coordinate, its derivative) of torch's forward decomposition:
    ``coords·mul + ofs``."""
    mul = (size * 0.5 - 0.5) if align_corners else (size * 0.5)
    return coords * mul + (size * 0.5 - 0.5), mul


def _pad_coordinates(x, size: int, padding_mode: int, align_corners: bool):
    """(coordinate after padding, derivative factor ±1 or 0) as PyTorch's
    ``compute_coordinates_set_grad``: zeros: unchanged; border: clip to [0, size − 1];
    reflection: reflect about the borders, then clip."""
    one = torch.ones((), dtype=x.dtype, device=x.device)
    if padding_mode == 0:
        return x, one.expand(x.shape)
    grad = one
    if padding_mode == 2:
        lo, hi = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        if lo == hi:
            return torch.zeros_like(x), torch.zeros_like(x)
        cmin, span = lo / 2, (hi - lo) / 2
        shifted = x - cmin
        sign = torch.where(shifted < 0, -one, one)
        a = shifted.abs()
        extra = torch.fmod(a, span)
        even = (a / span).floor().to(torch.int64) % 2 == 0
        x = torch.where(even, extra + cmin, (span + cmin) - extra)
        grad = torch.where(even, sign, -sign)
    inside = (x > 0) & (x < size - 1)
    return x.clamp(0, size - 1), torch.where(inside, grad, torch.zeros_like(x))


def _grid_source_index(coords, size: int, padding_mode: int, align_corners: bool):
    """(source coordinate, d coordinate / d grid) as PyTorch's
    ``grid_sampler_compute_source_index_set_grad``."""
    x, mul = _unnormalize(coords, size, align_corners)
    x, factor = _pad_coordinates(x, size, padding_mode, align_corners)
    return x, factor * mul


def _cubic_coefficients_grad(t):
    """PyTorch's ``get_cubic_coefficients_grad`` (A = −0.75): minus the derivatives of
    the four cubic convolution weights with respect to t."""
    A = -0.75
    x0, x1, x2, x3 = -1 - t, -t, 1 - t, 2 - t
    return ((-3 * A * x0 - 10 * A) * x0 - 8 * A,
            (-3 * (A + 2) * x1 - 2 * (A + 3)) * x1,
            (3 * (A + 2) * x2 - 2 * (A + 3)) * x2,
            (3 * A * x3 - 10 * A) * x3 + 8 * A)


@_register(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                             align_corners, output_mask):
    """grad_input: each output element sends ``w_k·g`` to its in-bounds taps k (bilinear:
    the corners nw, ne, sw, se; bicubic: the 4×4 taps, ``(g·wx_i)·wy_j``, i outer;
    nearest: 1), summed per input element in increasing (output position, tap) order
    (the first copied). grad_grid: PyTorch's sum over (channel, tap) of the tap value
    times the weights' derivatives times g (bilinear ``±v·Δ·g``; bicubic
    ``−((v·wx'_i)·wy_j)·g``), each product and add rounded, then times d coordinate /
    d grid. binary16/bfloat16: computed in binary32 (as the forward decomposition)."""
    if input.dtype in (torch.bfloat16, torch.float16):
        gi, gg = grid_sampler_2d_backward(grad_output.float(), input.float(), grid.float(),
                                          interpolation_mode, padding_mode, align_corners,
                                          output_mask)
        return (None if gi is None else gi.to(input.dtype),
                None if gg is None else gg.to(grid.dtype))
    N, C, iH, iW = input.shape
    _, oH, oW, _ = grid.shape
    g = grad_output  # (N, C, oH, oW)
    n_idx = torch.arange(N, device=g.device).view(N, 1, 1, 1)
    c_idx = torch.arange(C, device=g.device).view(1, C, 1, 1)
    zero = torch.zeros((), dtype=g.dtype, device=g.device)

    def locate(cx, cy):
        """(flat positions (N, C, oH, oW), in-bounds mask) of integer-valued coordinates."""
        xi, yi = cx.to(torch.int64), cy.to(torch.int64)
        inb = ((xi >= 0) & (xi < iW) & (yi >= 0) & (yi < iH)).unsqueeze(1).expand(N, C, oH, oW)
        p = ((n_idx * C + c_idx) * iH + yi.clamp(0, iH - 1).unsqueeze(1)) * iW \
            + xi.clamp(0, iW - 1).unsqueeze(1)
        return p, inb

    def value(p, inb):
        return torch.where(inb, input.reshape(-1)[p], zero)

    u = lambda t: t.unsqueeze(1)  # noqa: E731  (N, 1, oH, oW): broadcast over channels
    if interpolation_mode == 2:
        ix, mx = _unnormalize(grid[..., 0], iW, align_corners)
        iy, my = _unnormalize(grid[..., 1], iH, align_corners)
        gx_mult, gy_mult = mx, my
        ix_nw, iy_nw = ix.floor(), iy.floor()
        tx, ty = ix - ix_nw, iy - iy_nw
        wx, wy = TD._upsample_get_cubic_coefficients(tx), TD._upsample_get_cubic_coefficients(ty)
        dwx, dwy = _cubic_coefficients_grad(tx), _cubic_coefficients_grad(ty)
        taps = []
        for i in range(4):
            for j in range(4):
                cx = _pad_coordinates(ix_nw + (i - 1), iW, padding_mode, align_corners)[0]
                cy = _pad_coordinates(iy_nw + (j - 1), iH, padding_mode, align_corners)[0]
                taps.append((cx, cy, i, j))
        weighted = [(cx, cy, (g * u(wx[i])) * u(wy[j])) for cx, cy, i, j in taps]
    else:
        ix, gx_mult = _grid_source_index(grid[..., 0], iW, padding_mode, align_corners)
        iy, gy_mult = _grid_source_index(grid[..., 1], iH, padding_mode, align_corners)
        if interpolation_mode == 1:
            weighted = [(ix.round(), iy.round(), g)]
        else:
            ix_nw, iy_nw = ix.floor(), iy.floor()
            ix_se, iy_se = ix_nw + 1, iy_nw + 1
            dx_e, dx_w = ix_se - ix, ix - ix_nw  # x weights of the west / east corners
            dy_s, dy_n = iy_se - iy, iy - iy_nw
            corners = [(ix_nw, iy_nw, dx_e * dy_s), (ix_se, iy_nw, dx_w * dy_s),
                       (ix_nw, iy_se, dx_e * dy_n), (ix_se, iy_se, dx_w * dy_n)]
            weighted = [(cx, cy, g * u(w)) for cx, cy, w in corners]
    grad_input = grad_grid = None
    if output_mask[0]:
        located = [locate(cx, cy) for cx, cy, _ in weighted]
        pos = torch.stack([p for p, _ in located], -1)  # (N, C, oH, oW, taps)
        ok = torch.stack([m for _, m in located], -1)
        src = torch.stack([w for _, _, w in weighted], -1)
        grad_input = _scatter_sum(input.shape, pos[ok], src[ok])
    if output_mask[1]:
        if interpolation_mode == 1:
            grad_grid = torch.zeros_like(grid)
        else:
            if interpolation_mode == 2:
                vals = [value(*locate(cx, cy)) for cx, cy, _, _ in taps]
                tx_ = [-(((v * u(dwx[i])) * u(wy[j])) * g) for v, (_, _, i, j) in zip(vals, taps)]
                ty_ = [-(((v * u(dwy[j])) * u(wx[i])) * g) for v, (_, _, i, j) in zip(vals, taps)]
            else:
                v_nw, v_ne, v_sw, v_se = (value(*locate(cx, cy)) for cx, cy, _ in corners)
                tx_ = [-(v_nw * u(dy_s)), v_ne * u(dy_s), -(v_sw * u(dy_n)), v_se * u(dy_n)]
                ty_ = [-(v_nw * u(dx_e)), -(v_ne * u(dx_w)), v_sw * u(dx_e), v_se * u(dx_w)]
                tx_, ty_ = [t * g for t in tx_], [t * g for t in ty_]
            k = len(tx_)
            # (N, C, oH, oW, taps) -> sums over (channel, tap) in C order
            gx = torch.stack(tx_, -1).permute(0, 2, 3, 1, 4).reshape(N, oH, oW, C * k).sum(-1)
            gy = torch.stack(ty_, -1).permute(0, 2, 3, 1, 4).reshape(N, oH, oW, C * k).sum(-1)
            grad_grid = torch.stack([gx * gx_mult, gy * gy_mult], -1)
    return grad_input, grad_grid


# ------------------------------------------------------------------- CTC loss
def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    """Lengths as lists, the extended targets l' (blank, l1, blank, l2, ..., blank) of
    each sequence padded with blanks (N, 2·max L + 1), and the mask of the s for which
    the skip transition s−2 → s is allowed (l'_s ≠ l'_{s−2})."""
    il = [int(v) for v in (input_lengths.reshape(-1).tolist()
                           if isinstance(input_lengths, torch.Tensor) else input_lengths)]
    tl = [int(v) for v in (target_lengths.reshape(-1).tolist()
                           if isinstance(target_lengths, torch.Tensor) else target_lengths)]
    n = len(il)
    maxl = max(tl) if tl else 0
    tg = targets.cpu().to(torch.int64)
    rows, off = [], 0
    for b in range(n):
        if tg.dim() == 2:
            seq = tg[b, :tl[b]].tolist()
        else:
            seq = tg[off:off + tl[b]].tolist()
            off += tl[b]
        ext = [blank] * (2 * maxl + 1)
        ext[1:2 * len(seq):2] = seq
        rows.append(ext)
    tp = torch.tensor(rows, dtype=torch.int64, device=log_probs.device).reshape(n, 2 * maxl + 1)
    skip = torch.zeros_like(tp, dtype=torch.bool)
    skip[:, 2:] = tp[:, 2:] != tp[:, :-2]
    return il, tl, tp, skip


def _logsumexp3(a, b, c):
    """PyTorch's CTC step: ``m = max(a, b, c)`` (0 if −inf), ``log(e^(a−m) + e^(b−m) +
    e^(c−m)) + m`` (each op rounded, left to right)."""
    m = torch.maximum(torch.maximum(a, b), c)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    return torch.log((torch.exp(a - m) + torch.exp(b - m)) + torch.exp(c - m)) + m


def _shift(x, k: int):
    """x[:, s − k] along the last dim, −inf where s < k."""
    pad = torch.full((*x.shape[:-1], k), float("-inf"), dtype=x.dtype, device=x.device)
    return torch.cat([pad, x[..., :-k]], -1)


@_register(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """PyTorch's CPU forward (LossCTC.cpp), vectorised over the batch and the extended
    target positions s, t in increasing order: ``α_0`` from the first frame, then
    ``α_t(s) = logsumexp3(α_{t−1}(s), α_{t−1}(s−1), α_{t−1}(s−2) if allowed) +
    lp_t(l'_s)``; ``nll = −log(e^(α(2L)−m) + e^(α(2L−1)−m)) − m`` at the last frame.
    Entries of log_alpha outside a sequence's lengths are −inf."""
    il, tl, tp, skip = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    T, N, _ = log_probs.shape
    S = tp.shape[1]
    ninf = float("-inf")
    s_idx = torch.arange(S, device=tp.device)
    tl_t = torch.tensor(tl, device=tp.device).unsqueeze(1)
    il_t = torch.tensor(il, device=tp.device).unsqueeze(1)
    valid = s_idx < 2 * tl_t + 1  # (N, S)
    lp = log_probs.permute(1, 0, 2)  # (N, T, C)
    lpt = torch.gather(lp, 2, tp.unsqueeze(1).expand(N, T, S))  # (N, T, S): lp_t(l'_s)
    full = torch.full((N, S), ninf, dtype=log_probs.dtype, device=log_probs.device)
    first = torch.where((s_idx == 0) | ((s_idx == 1) & (tl_t > 0)), lpt[:, 0], full)
    first = torch.where(il_t > 0, first, full)
    alphas = [first]
    la = first
    for t in range(1, T):
        la3 = torch.where(skip, _shift(la, 2), full)
        new = _logsumexp3(la, _shift(la, 1), la3) + lpt[:, t]
        la = torch.where(valid & (t < il_t), new, full)
        alphas.append(la)
    log_alpha = torch.stack(alphas, 1)  # (N, T, S)
    last = log_alpha[torch.arange(N), (il_t.squeeze(1) - 1).clamp(min=0)]  # (N, S)
    l1 = torch.gather(last, 1, 2 * tl_t).squeeze(1)
    l2 = torch.gather(last, 1, (2 * tl_t - 1).clamp(min=0)).squeeze(1)
    l2 = torch.where(tl_t.squeeze(1) > 0, l2, torch.full_like(l2, ninf))
    m = torch.maximum(l1, l2)
    m = torch.where(m == ninf, torch.zeros_like(m), m)
    ll = torch.log(torch.exp(l1 - m) + torch.exp(l2 - m)) + m
    nll = torch.where(tl_t.squeeze(1) > 0, -ll, -l1)
    return nll, log_alpha


@_register(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha,
                      blank, zero_infinity=False):
    """PyTorch's CPU backward: β from the last frame of each sequence down to t = 0 (the
    step of the forward mirrored); per (sequence, frame, class) the log-sum of
    ``α_t(s) + β_t(s)`` over the s with l'_s = class in decreasing s (pairwise
    ``log(e^(a−m) + e^(b−m)) + m``); then ``(e^lp − e^(lcab + nll − lp))·grad``; 0 after
    a sequence's last frame and, with zero_infinity, for infinite losses."""
    il, tl, tp, skip = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    T, N, C = log_probs.shape
    S = tp.shape[1]
    ninf = float("-inf")
    s_idx = torch.arange(S, device=tp.device)
    tl_t = torch.tensor(tl, device=tp.device).unsqueeze(1)
    il_t = torch.tensor(il, device=tp.device).unsqueeze(1)
    valid = s_idx < 2 * tl_t + 1
    lp = log_probs.permute(1, 0, 2)  # (N, T, C)
    lpt = torch.gather(lp, 2, tp.unsqueeze(1).expand(N, T, S))
    full = torch.full((N, S), ninf, dtype=log_probs.dtype, device=log_probs.device)
    ends = (s_idx == 2 * tl_t) | ((s_idx == 2 * tl_t - 1) & (tl_t > 0))
    # skip s+2 -> s allowed where l'_{s+2} != l'_s
    skip_up = torch.zeros_like(skip)
    skip_up[:, :-2] = skip[:, 2:]
    betas = [None] * T
    lb = full
    for t in range(T - 1, -1, -1):
        up1 = torch.cat([lb[:, 1:], full[:, :1]], 1)
        up2 = torch.where(skip_up, torch.cat([lb[:, 2:], full[:, :2]], 1), full)
        rec = _logsumexp3(lb, up1, up2) + lpt[:, t]
        lb = torch.where(t == il_t - 1, torch.where(ends, lpt[:, t], full),
                         torch.where((t < il_t - 1) & valid, rec, full))
        betas[t] = lb
    log_beta = torch.stack(betas, 1)  # (N, T, S)
    lab = log_alpha[:, :T, :S] + log_beta  # (N, T, S)
    lcab = torch.full((N, T, C), ninf, dtype=log_probs.dtype, device=log_probs.device)
    for s in range(S - 1, -1, -1):
        cls = tp[:, s].view(N, 1, 1).expand(N, T, 1)
        cur = torch.gather(lcab, 2, cls).squeeze(2)
        x = lab[:, :, s]
        m = torch.maximum(cur, x)
        both = torch.log(torch.exp(cur - m) + torch.exp(x - m)) + m
        new = torch.where(x == ninf, cur, torch.where(cur == ninf, x, both))
        lcab = torch.scatter(lcab, 2, cls, new.unsqueeze(2))
    res = (torch.exp(lp) - torch.exp((lcab + nll.view(N, 1, 1)) - lp)) * grad.view(N, 1, 1)
    t_idx = torch.arange(T, device=tp.device).view(1, T, 1)
    keep = t_idx < il_t.unsqueeze(2)
    if zero_infinity:
        keep = keep & (nll != float("inf")).view(N, 1, 1)
    res = torch.where(keep, res, torch.zeros((), dtype=res.dtype, device=res.device))
    return res.permute(1, 0, 2)
