"""The compiled grid_sampler_2d (numvar.instrument.grid_kernels) against the decomposition
run op by op (its slow reference, ``USE_KERNELS = False``): same bits, same stream
position afterwards, same report, in every rounding mode, for bilinear and nearest
sampling, each padding mode and both corner alignments, with grid coordinates outside
the image, on its borders and non-finite, and non-finite image values."""

import pytest
import torch
import torch.nn.functional as F

from numvar.instrument import fuzzy
from numvar.instrument import grid_kernels as GK
from numvar.instrument import mode as MO
from _spy import count_calls  # noqa: E402

INF, NAN = float("inf"), float("nan")


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, 3, 4, generator=g)
    x[1, 0, 0, 0] = INF  # read (with weight 0) by every tap outside the image
    x[1, 1, 2, 3] = NAN
    grid = (torch.rand(2, 3, 5, 2, generator=g) * 2.8 - 1.4)
    grid[0, 0, :, 0] = torch.tensor([-1.0, 1.0, 0.0, -0.0, 1e30])
    grid[0, 1, :, 1] = torch.tensor([INF, -INF, NAN, 3.75, -7.0])
    grid[0, 2, :2] = 1 / 3
    return x, grid


def _run(use: bool, monkeypatch, mode, interp, pad, align, seed=3):
    monkeypatch.setattr(GK, "USE_KERNELS", use)
    x, grid = _data(seed)
    with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=seed) as fz:
        outs = [F.grid_sample(x, grid, mode=interp, padding_mode=pad, align_corners=align)
                for _ in range(2)]  # the first call with a signature runs the decomposition
        pos = fz.stream.counter
    return outs, pos, fz.report().to_dict()


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("interp", ["bilinear", "nearest"])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("mode", ["sr", "ud"])
def test_kernel_matches_decomposition(monkeypatch, mode, interp, pad, align):
    calls = count_calls(monkeypatch, GK, "_grid_sample")
    fast, pos, rep = _run(True, monkeypatch, mode, interp, pad, align)
    assert calls, "the compiled kernel did not run"
    ref, pos_ref, rep_ref = _run(False, monkeypatch, mode, interp, pad, align)
    for a, b in zip(fast, ref):
        _same(a, b)
    assert pos == pos_ref
    assert rep == rep_ref


@pytest.mark.parametrize("mode", ["random", "ieee", "down"])
def test_kernel_other_modes(monkeypatch, mode):
    for interp, pad in (("bilinear", "reflection"), ("nearest", "zeros")):
        fast, pos, _ = _run(True, monkeypatch, mode, interp, pad, False, seed=5)
        ref, pos_ref, _ = _run(False, monkeypatch, mode, interp, pad, False, seed=5)
        for a, b in zip(fast, ref):
            _same(a, b)
        assert pos == pos_ref


def test_kernel_degenerate_reflection_and_bicubic(monkeypatch):
    """A one-pixel dim under reflection with aligned corners (no reflection keys);
    bicubic is not served: both still equal the reference."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 1, 3, generator=g)
    grid = torch.rand(1, 2, 3, 2, generator=g) * 3 - 1.5

    def run(use, interp):
        monkeypatch.setattr(GK, "USE_KERNELS", use)
        with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=2) as fz:
            out = [F.grid_sample(x, grid, mode=interp, padding_mode="reflection",
                                 align_corners=True) for _ in range(2)]
            return out, fz.stream.counter

    for interp in ("bilinear", "bicubic"):
        (fast, pos), (ref, pos_ref) = run(True, interp), run(False, interp)
        for a, b in zip(fast, ref):
            _same(a, b)
        assert pos == pos_ref


def test_kernel_with_autograd_and_strided_grid(monkeypatch):
    """A grid that needs grad and is not contiguous (forward values and the gradient of
    the decomposed backward as with the reference)."""
    def run(use):
        monkeypatch.setattr(GK, "USE_KERNELS", use)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(1, 3, 4, 4, generator=g, requires_grad=True)
        base = torch.rand(1, 5, 3, 2, generator=g) * 2 - 1
        grid = base.transpose(1, 2).requires_grad_(True)  # (1, 3, 5, 2), strided
        with fuzzy(mode="sr", granularity="flop", seed=9):
            outs = [F.grid_sample(x, grid, align_corners=False) for _ in range(2)]
            sum(o.sum() for o in outs).backward()
        return outs, x.grad, grid.grad

    fast, ref = run(True), run(False)
    for a, b in zip(fast[0], ref[0]):
        _same(a.detach(), b.detach())
    _same(fast[1], ref[1])
    _same(fast[2], ref[2])


def test_kernel_keys_mismatch_falls_back(monkeypatch):
    """Where the kernel's key count differs from what the decomposition drew, the
    decomposition runs (the result is still the reference's)."""
    x, grid = _data(7)
    monkeypatch.setattr(GK, "keys_needed", lambda *a: -1)
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=1):
        a = [F.grid_sample(x, grid, align_corners=False) for _ in range(2)]
    monkeypatch.setattr(GK, "USE_KERNELS", False)
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=1):
        b = [F.grid_sample(x, grid, align_corners=False) for _ in range(2)]
    for u, v in zip(a, b):
        _same(u, v)


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("mode", ["sr", "ud", "random", "ieee", "up"])
def test_affine_grid_matches_decomposition(monkeypatch, mode, align):
    """affine_grid_generator's fused path (the exact pieces natively, the four roundings in
    one compiled call, or by their flop handlers) against the decomposition op by op: same bits, stream position
    and report; a 1-wide grid (linspace of one step) and a grid of several tiles of
    products too; a 5-D size declines."""
    calls, real = [], GK.affine_grid_generator
    kernel, real_kernel = [], GK._affine_grid
    monkeypatch.setattr(GK, "_affine_grid",
                        lambda *a: kernel.append(1) or real_kernel(*a))

    def counting(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setitem(MO._FUSED, torch.ops.aten.affine_grid_generator.default, counting)
    g = torch.Generator().manual_seed(2)
    theta = torch.randn(2, 2, 3, generator=g)
    theta[1, 0, 2] = 1e-30  # (a translation far below the others: sums that round)
    theta3 = torch.randn(1, 3, 4, generator=g)

    def run(use, one_call=True):
        monkeypatch.setattr(GK, "USE_KERNELS", use)
        monkeypatch.setattr(GK, "AFFINE_IN_ONE_CALL", one_call)
        with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=4) as fz:
            outs = [F.affine_grid(theta, size, align_corners=align)
                    for size in ((2, 3, 5, 7), (2, 1, 4, 1), (2, 1, 16, 24)) for _ in range(2)]
            outs += [F.affine_grid(theta3, (1, 1, 2, 3, 4), align_corners=align)
                     for _ in range(2)]
            return outs, fz.stream.counter, fz.report().to_dict()

    fast = run(True)
    served, in_one_call = sum(calls), len(kernel)
    handlers = run(True, False)
    ref = run(False)
    assert served >= 3, "the fused path did not run"  # (the second call of each 4-D size)
    assert in_one_call == served and len(kernel) == served
    for a, b, c in zip(fast[0], handlers[0], ref[0]):
        _same(a, c)
        _same(b, c)
    assert fast[1:] == ref[1:] == handlers[1:]


_UPSAMPLE_OPS = [torch.ops.aten.upsample_linear1d.default,
                 torch.ops.aten.upsample_bilinear2d.default,
                 torch.ops.aten.upsample_trilinear3d.default]


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "up"])
@pytest.mark.parametrize("align", [False, True])
def test_upsample_linear_matches_decomposition(monkeypatch, mode, align):
    """Linear, bilinear and trilinear upsampling's fused path (coordinates and weights by
    their flop handlers, the taps gathered and the full-size roundings in one compiled
    call) against the decomposition op by op: same bits, stream position and report; up
    and down by sizes and by scale factors, a one-element output, non-finite and huge
    values (sums that round, NaN taps), a plane larger than one chunk; a channels-last
    or float64 input declines."""
    calls, real = [], GK.upsample_linear

    def counting(ctx, args, kwargs, nkeys):
        out = real(ctx, args, kwargs, nkeys)
        v = args[0]
        calls.append((out is not None, v.dtype is torch.float32 and v.is_contiguous()))
        return out

    for op in _UPSAMPLE_OPS:
        monkeypatch.setitem(MO._FUSED, op, counting)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 5, 7, generator=g)
    x[0, 0, 1, 2], x[1, 2, 4, 6], x[0, 1, 0, 0] = INF, NAN, 1e30
    x[1, 0] *= 1e-20
    cases = [(x, "bilinear", {"scale_factor": 2}), (x, "bilinear", {"size": (9, 4)}),
             (x, "bilinear", {"size": (1, 1)}), (x, "bilinear", {"scale_factor": (1.5, 0.75)}),
             (x[:, :, 0].contiguous(), "linear", {"size": (11,)}),
             (x[:, :, 1].contiguous(), "linear", {"scale_factor": 0.5}),
             (x[:, :, :4, :6].reshape(2, 3, 2, 2, 6).contiguous(), "trilinear",
              {"scale_factor": (2, 1.5, 0.5)}),
             (torch.randn(1, 1, 40, 60, generator=g), "bilinear", {"scale_factor": 1.5})]

    def run(use):
        monkeypatch.setattr(GK, "USE_KERNELS", use)
        with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=6) as fz:
            outs = [F.interpolate(v, mode=m, align_corners=align, **kw)
                    for v, m, kw in cases for _ in range(2)]
            outs += [F.interpolate(v, scale_factor=2, mode="bilinear", align_corners=align)
                     for v in (x.to(memory_format=torch.channels_last), x.double())
                     for _ in range(2)]
            return outs, fz.stream.counter, fz.report().to_dict()

    fast = run(True)
    served = [ok for ok, _ in calls]
    ref = run(False)
    # (the second call of each signature at least; a signature seen in an earlier test
    # is fused from its first call)
    assert sum(served) >= len(cases), "the fused path did not serve"
    assert all(plain for ok, plain in calls if ok), "a channels-last or float64 input was served"
    for a, b in zip(fast[0], ref[0]):
        assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
        assert torch.equal(a.isnan(), b.isnan())
        it = torch.int64 if a.dtype is torch.float64 else torch.int32
        assert torch.equal(a.contiguous().view(it)[~a.isnan()],
                           b.contiguous().view(it)[~b.isnan()])
    assert fast[1:] == ref[1:]
