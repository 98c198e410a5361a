"""The compiled layer norm, softmax, group norm and instance norm (binary32 and binary64) and
eval batch norm (numvar.instrument.norm_kernels) against torch's decompositions run op by
op (their slow reference, ``USE_KERNEL = False``): same bits of all three outputs, same
stream position afterwards, same report, in every rounding mode, with and without weight
and bias. Layer norm: normalised over one and two dims, few rows (the row-scan sums) and
many (the row-block sums), rows holding inf, NaN, a constant (variance 0: rstd =
rsqrt(eps)) and values whose squares overflow the format. Softmax (``_softmax``,
``_safe_softmax``, through SDPA's math path too) over the last dim, rows with −inf, inf,
NaN and a dominant value, with autograd. Group norm (with a weight; with and without bias;
2- and 4-D; a constant group, inf, NaN). Batch norm: 2-, 3- and 4-D inputs, a zero running
variance, non-finite inputs and statistics, under no_grad and with autograd (another aten
op reaches the mode). Layer norm's and softmax's backward: every output mask, with and
without weight and bias, few and many rows and columns, slices and a transposed
gradient."""

import copy
import math

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numvar.instrument import fuzzy
from numvar.instrument import mode as MD
from numvar.instrument import norm_kernels as NK
from numvar.instrument import pointwise as PW
from numvar.rounding import kernels as RK
from _spy import count_calls  # noqa: E402

LN = torch.ops.aten.native_layer_norm.default


def _data(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=dtype) * 3 + 0.5
    rows = x.view(-1, x.shape[-1])
    rows[0, 1] = float("inf")
    rows[1, 0] = float("nan")
    rows[2] = 0.25  # constant row: variance 0
    # squares overflow the format
    rows[3, :2] = torch.tensor([3e19, -2e19] if dtype is torch.float32 else [3e160, -2e160])
    return x


def _run(use, monkeypatch, mode, x, nshape, w, b, seed=5):
    monkeypatch.setattr(NK, "USE_KERNEL", use)
    with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=seed) as fz:
        outs = [LN(x, nshape, w, b, 1e-5) for _ in range(2)]  # the first call decomposes
        pos = fz.stream.counter
    return outs, pos, fz.report().to_dict()


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    if not a.is_floating_point():
        assert torch.equal(a, b)
        return
    bits = torch.int64 if a.dtype is torch.float64 else torch.int32
    assert torch.equal(a.view(bits), b.view(bits))


def _check(monkeypatch, mode, shape, nd, affine, kernel="layer_norm_rows",
           dtype=torch.float32):
    x = _data(shape, dtype=dtype)
    nshape = list(shape[len(shape) - nd:])
    g = torch.Generator().manual_seed(1)
    w = torch.randn(nshape, generator=g, dtype=dtype) if affine in ("both", "weight") else None
    b = torch.randn(nshape, generator=g, dtype=dtype) if affine in ("both", "bias") else None
    calls = count_calls(monkeypatch, NK, kernel)
    fast, pos, rep = _run(True, monkeypatch, mode, x, nshape, w, b)
    assert calls, "the compiled kernel did not run"
    ref, pos_ref, rep_ref = _run(False, monkeypatch, mode, x, nshape, w, b)
    for o1, o2 in zip(fast, ref):
        for a, c in zip(o1, o2):
            _same(a, c)
    assert pos == pos_ref
    assert rep == rep_ref
    return fast[1]


def _parts(monkeypatch, parts: int) -> None:
    """Force the row kernels' split into ``parts`` runs of rows where they allow one (at
    least ``pointwise.ROW_M_MIN`` rows), whatever the thread count and size. (The tests
    then count the calls of the parallel kernel: a kernel that a compiled one calls must
    not be replaced by a counting wrapper while that one compiles.)"""
    if parts > 1:
        monkeypatch.setattr(NK, "row_parts", lambda rows, elems, work: parts
                            if rows >= PW.ROW_M_MIN else 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode,parts", [("sr", 1), ("ud", 1), ("random", 1), ("down", 1),
                                        ("sr", 3), ("down", 2)])
def test_kernel_matches_decomposition(monkeypatch, mode, parts, dtype):
    _parts(monkeypatch, parts)
    out, mean, rstd = _check(monkeypatch, mode, (3, 7, 8), 1, "both",  # 21 rows: row blocks
                             "layer_norm_par" if parts > 1 else "layer_norm_rows", dtype)
    # the special rows came through: NaN where inf/NaN, rsqrt(eps) for the constant row
    assert torch.isnan(out.view(-1, 8)[:2]).all()
    assert torch.isfinite(out.view(-1, 8)[4:]).all()
    assert abs(rstd.view(-1)[2].item() - 1e-5 ** -0.5) < 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_kernel_without_affine_parameters(monkeypatch, affine, dtype):
    # 8 rows: row scans (binary64: the rows' chains); 2-D shape
    _check(monkeypatch, "sr", (2, 4, 3, 5), 2, affine, dtype=dtype)


def test_mean_and_rstd_against_float64():
    """In ieee mode the kernel's statistics are binary32 roundings of what float64 gives
    (two-pass variance; each step rounded: a few units of binary32's last place)."""
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), fuzzy(mode="ieee", granularity="flop", seed=0):
        outs = [LN(x, [32], None, None, 1e-5) for _ in range(2)]
    out, mean, rstd = outs[1]
    x64 = x.double()
    m64 = x64.mean(-1, keepdim=True)
    r64 = (x64.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    torch.testing.assert_close(mean.double(), m64, rtol=4 * 2.0 ** -24, atol=1e-7)
    torch.testing.assert_close(rstd.double(), r64, rtol=16 * 2.0 ** -24, atol=0)
    torch.testing.assert_close(out.double(), (x64 - m64) * r64, rtol=0, atol=1e-5)


def test_declines_and_autograd(monkeypatch):
    """Non-contiguous input, float64 with ``LAYER_NORM64`` off or at a virtual precision
    take the decomposition (no kernel call), float64 otherwise the kernel; with autograd
    the forward takes the kernel and the gradients equal the reference's."""
    calls = count_calls(monkeypatch, NK, "layer_norm_rows")
    xt = torch.randn(8, 5).t()
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0):
        for _ in range(2):
            F.layer_norm(xt, [8])
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0, precision=40):
        for _ in range(2):
            F.layer_norm(xt.contiguous().double(), [8])
    monkeypatch.setattr(NK, "LAYER_NORM64", False)
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0):
        for _ in range(2):
            F.layer_norm(xt.contiguous().double(), [8])
    assert not calls
    monkeypatch.setattr(NK, "LAYER_NORM64", True)
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0):
        for _ in range(2):
            F.layer_norm(xt.contiguous().double(), [8])
    assert calls
    calls.clear()

    def grads(use):
        monkeypatch.setattr(NK, "USE_KERNEL", use)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), requires_grad=True)
        w = torch.ones(6, requires_grad=True)
        with fuzzy(mode="sr", granularity="flop", seed=1):
            for _ in range(2):
                y = F.layer_norm(x, [6], w, None)
            (y * torch.arange(6.0)).sum().backward()
        return y.detach(), x.grad, w.grad

    fast = grads(True)
    assert calls
    for a, b in zip(fast, grads(False)):
        _same(a, b)


LNB = torch.ops.aten.native_layer_norm_backward.default
#: a negative and a positive quiet NaN (where two meet in a sum, the scan keeps the first)
_NAN_SIGNS = torch.tensor([-0x400000, 0x7FC00000], dtype=torch.int32).view(torch.float32)


def _ln_backward_cases(dtype):
    """(g, x, normalized_shape, mean, rstd, weight, bias, output_mask) of
    native_layer_norm_backward: many rows (row blocks) and few (row scans), few and many
    columns (the scan's column tiles), one and two normalised dims, weight and bias or
    neither, every output or some, a transposed gradient; x
    with _data's inf, NaN, constant and overflowing rows, g with inf and a subnormal; mean
    and rstd from the forward (in float64: only their values matter)."""
    gen = torch.Generator().manual_seed(12)
    out = []
    for shape, nd, affine, mask in [((3, 8, 16), 1, True, [True, True, True]),
                                    ((5, 7), 1, False, [True, False, False]),
                                    ((20, 5), 1, True, [True, True, True]),
                                    ((4, 3, 2, 6), 2, True, [False, True, True]),
                                    ((17, 40), 1, True, [True, True, False])]:
        x = _data(shape, dtype=dtype)
        ns = list(shape[len(shape) - nd:])
        x64 = x.double().flatten(len(shape) - nd)
        mean = x64.mean(-1).to(dtype).view(*shape[:len(shape) - nd], *[1] * nd)
        rstd = (x64.var(-1, unbiased=False) + 1e-5).rsqrt().to(dtype).view(mean.shape)
        w, b = ((torch.randn(ns, generator=gen, dtype=dtype),
                 torch.randn(ns, generator=gen, dtype=dtype)) if affine else (None, None))
        g = torch.randn(shape, generator=gen, dtype=dtype) * 2
        g.view(-1)[4:6] = torch.tensor([float("inf"), 1e-42])
        # NaNs of both signs in one column: the scan's sums keep the first (see below)
        g.view(-1, math.prod(ns))[:2, -1] = _NAN_SIGNS.to(dtype)
        out.append((g, x, ns, mean, rstd, w, b, mask))
    g, x, *rest = out[4]
    out.append((g.t().contiguous().t(), x, *rest))  # (a column-major gradient)
    return out


def _kernel_and_decomposition(monkeypatch, kernel: str, flag: str, mode: str, body,
                              calls: int) -> list:
    """``body()`` (a list of tensors) in a flop block of ``mode`` with ``NK.<flag>`` on and
    off (the first call of each signature records the decomposition): the outputs (their
    strides too), stream position and report equal; ``NK.<kernel>`` ran ``calls`` times,
    all with the flag on. Returns the outputs."""
    monkeypatch.setattr(MD, "_FUSED_SEEN", {})
    counted = count_calls(monkeypatch, NK, kernel)
    runs = []
    for use in (True, False):
        monkeypatch.setattr(NK, flag, use)
        with fuzzy(mode=mode, granularity="flop", seed=7) as fz:
            outs = body()
            runs.append((outs, fz.stream.counter, fz.report().to_dict()))
        assert len(counted) == calls
    (fast, *rest), (ref, *rest_ref) = runs
    assert len(fast) == len(ref) and rest == rest_ref
    for a, b in zip(fast, ref):
        _same(a, b)
    return fast


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "down", "up"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_backward_matches_decomposition(monkeypatch, mode, dtype):
    """native_layer_norm_backward (_ln_backward_cases), each case three times (the first
    records the decomposition), then a training step of F.layer_norm twice: every
    gradient (strides too), stream position and report equal with the kernel and with
    the decomposition (LAYER_NORM_BACKWARD off); the kernel ran for every later call."""
    cases = _ln_backward_cases(dtype)

    def body():
        outs = []
        for case in cases:
            for _ in range(3):
                outs += [t for t in LNB(*case) if t is not None]
        for _ in range(2):
            x = _data((6, 12), dtype=dtype).requires_grad_()
            w = torch.linspace(-1, 2, 12, dtype=dtype, requires_grad=True)
            b = torch.zeros(12, dtype=dtype, requires_grad=True)
            (F.layer_norm(x, [12], w, b) * torch.arange(12.0, dtype=dtype)).sum().backward()
            outs += [x.grad, w.grad, b.grad]
        return outs

    outs = _kernel_and_decomposition(monkeypatch, "layer_norm_backward",
                                     "LAYER_NORM_BACKWARD", mode, body, 2 * len(cases) + 1)
    assert len(outs) == 3 * 13 + 6


@pytest.mark.parametrize("channels", [3, 16])
def test_batch_norm_backward_keeps_the_scans_nan_signs(monkeypatch, channels):
    """A channel whose gradients hold NaNs of both signs, in each order: the compiled
    backward's channel sums (by rows below COLUMN_SUMS_MIN channels, by columns from it)
    give the NaN the decomposition's scan gives (the accumulated one), bit for bit."""
    monkeypatch.setattr(MD, "_FUSED_SEEN", {})
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, channels, 5, generator=gen)
    g = torch.randn(4, channels, 5, generator=gen)
    g[:2, 0, 0] = _NAN_SIGNS
    g[:2, 1, 0] = _NAN_SIGNS.flip(0)
    mean = x.mean((0, 2))
    inv = x.var((0, 2), unbiased=False).add(1e-5).rsqrt()
    w = torch.randn(channels, generator=gen)
    calls = count_calls(monkeypatch, NK, "batch_norm_backward")

    def run(use):
        monkeypatch.setattr(NK, "BATCH_NORM_BACKWARD", use)
        with fuzzy(mode="sr", granularity="flop", seed=1):
            return [torch.ops.aten.native_batch_norm_backward(
                g, x, w, None, None, mean, inv, True, 1e-5, [True, True, True])
                for _ in range(2)][1]

    fast = run(True)
    assert len(calls) == 1
    for a, b in zip(fast, run(False)):
        _same(a, b)
    assert torch.equal(fast[2][:2].view(torch.int32), _NAN_SIGNS.view(torch.int32))


@pytest.mark.parametrize("case", ["one row", "every dim normalised", "mean's shape",
                                  "LAYER_NORM64", "precision"])
def test_layer_norm_backward_declines(monkeypatch, case):
    """A single row, a normalised shape covering every dim, mean and rstd of another
    shape (as rows), float64 with LAYER_NORM64 off and a virtual precision run the
    decomposition (no kernel call), with its bits."""
    calls = count_calls(monkeypatch, NK, "layer_norm_backward")
    dtype = torch.float64 if case in ("LAYER_NORM64", "precision") else torch.float32
    g, x, ns, mean, rstd, w, b, mask = _ln_backward_cases(dtype)[0]
    if case == "one row":
        g, x, mean, rstd = g[:1, :1], x[:1, :1], mean[:1, :1], rstd[:1, :1]
    elif case == "every dim normalised":
        g, x, ns = g[0], x[0], [8, 16]
        mean, rstd = mean[:1, :1], rstd[:1, :1]
    elif case == "mean's shape":
        mean, rstd = mean.view(-1), rstd.view(-1)
    elif case == "LAYER_NORM64":
        monkeypatch.setattr(NK, "LAYER_NORM64", False)
    kw = {"precision": 40} if case == "precision" else {}
    with fuzzy(mode="sr", granularity="flop", seed=0, **kw):
        for _ in range(2):
            LNB(g, x, ns, mean, rstd, w, b, mask)
    assert not calls


def _bn(c, affine, seed=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    bn = torch.nn.BatchNorm1d(c, affine=affine).eval().to(dtype)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=g, dtype=dtype))
        bn.running_var.copy_(torch.rand(c, generator=g, dtype=dtype) * 3)
        bn.running_var[0] = 0.0  # invstd = 1/sqrt(eps)
        bn.running_mean[1] = float("inf")
        if affine:
            bn.weight.copy_(torch.randn(c, generator=g, dtype=dtype))
            bn.bias.copy_(torch.randn(c, generator=g, dtype=dtype))
    return bn


def _bn_run(use, monkeypatch, mode, x, bn, grad):
    monkeypatch.setattr(NK, "USE_KERNEL", use)
    with torch.set_grad_enabled(grad), fuzzy(mode=mode, granularity="flop", seed=2) as fz:
        outs = [F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False,
                             0.1, 1e-5) for _ in range(2)]
        pos = fz.stream.counter
    return [o.detach() for o in outs], pos, fz.report().to_dict()


@pytest.mark.parametrize("mode,shape,affine,grad,parts", [
    ("sr", (3, 5, 4, 2), True, False, 1), ("down", (3, 5, 4, 2), True, False, 1),
    ("ud", (4, 5), False, False, 1), ("sr", (2, 5, 7), True, True, 1),
    ("sr", (3, 5, 4, 2), True, False, 2), ("random", (3, 5, 4, 2), False, False, 3),
    ("ud", (2, 5, 7), True, True, 2), ("ieee", (3, 5, 4), True, False, 1),
    ("up", (2, 5, 3), False, False, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eval_batch_norm_matches_decomposition(monkeypatch, mode, shape, affine, grad, parts,
                                               dtype):
    """(``parts`` > 1: the channels split into that many runs, :func:`batch_norm_eval_par`,
    whatever the thread count and size.) binary64: the per-channel square root by the
    rounding core's scalar function, the decomposition's by ``k_sqrt``'s vectorised block
    in sr, ieee, ud and random."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(6), dtype=dtype)
    x.view(-1)[3] = float("nan")
    x.view(-1)[-1] = 1e38 if dtype is torch.float32 else 1e307
    bn = _bn(shape[1], affine, dtype=dtype)
    if parts > 1:
        monkeypatch.setattr(NK, "channel_parts", lambda channels, elems, work: parts)
    calls = count_calls(monkeypatch, NK,
                        "batch_norm_eval_par" if parts > 1 else "batch_norm_eval")
    fast, pos, rep = _bn_run(True, monkeypatch, mode, x, bn, grad)
    assert calls, "the compiled kernel did not run"
    ref, pos_ref, rep_ref = _bn_run(False, monkeypatch, mode, x, bn, grad)
    for a, b in zip(fast, ref):
        _same(a, b)
    assert pos == pos_ref and rep == rep_ref


def test_eval_batch_norm_binary64_declines(monkeypatch):
    """float64 eval batch norm takes the kernel at 53 bits; with ``BATCH_NORM_EVAL64`` off
    or at a virtual precision, the decomposition."""
    calls = count_calls(monkeypatch, NK, "batch_norm_eval")
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    bn = _bn(4, True, dtype=torch.float64)

    def run(**kw):
        with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0, **kw):
            for _ in range(2):
                F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False,
                             0.1, 1e-5)
    run(precision=40)
    monkeypatch.setattr(NK, "BATCH_NORM_EVAL64", False)
    run()
    assert not calls
    monkeypatch.setattr(NK, "BATCH_NORM_EVAL64", True)
    run()
    assert calls


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_runs_of_channels_give_the_whole_batch_norms_bits(dt):
    """The parallel eval batch norm in 1, 2, 3, 5 and 7 runs of channels (7 channels: runs
    of one channel and of none) against one call on the whole, bit for bit, in every
    rounding mode, with and without weight and bias, inputs holding inf, NaN and a
    channel of zero running variance, binary32 and binary64. (As for the row kernels
    above, a NaN's sign may differ where a run's elements go through a vectorised loop's
    scalar remainder: NaNs must be at the same places, every other bit must agree.)"""
    N, C, S = 3, 7, 10
    g = np.random.default_rng(3)
    x = (g.standard_normal(N * C * S) * 3).astype(dt)
    x[5], x[S * C + 2], x[-1] = np.inf, np.nan, -3e38 if dt is np.float32 else -3e307
    w, b, rmean = (g.standard_normal(C).astype(dt) for _ in range(3))
    rvar = (np.abs(g.standard_normal(C)) + 0.1).astype(dt)
    rvar[4] = 0.0
    keys = np.arange(1, 9, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    eps = dt(1e-5)
    empty = np.empty(0, dt)
    bits = np.int32 if dt is np.float32 else np.int64
    for has_w, has_b in ((True, True), (False, True), (False, False)):
        args = (x, w if has_w else empty, b if has_b else empty, has_w, has_b, rmean, rvar,
                eps, keys)
        for mode in range(len(RK.MODE_NAMES)):
            whole = np.empty_like(x)
            NK.batch_norm_eval(*args, mode, whole, N, C, S)
            nan = np.isnan(whole)
            assert nan[S * C + 2] and np.isinf(whole[5]) and not nan.all()
            for parts in (1, 2, 3, 5, 7):
                out = np.full_like(x, 7.0)
                NK.batch_norm_eval_par(*args, mode, out, N, C, S, parts)
                assert np.array_equal(nan, np.isnan(out)), (RK.MODE_NAMES[mode], parts)
                assert np.array_equal(whole[~nan].view(bits), out[~nan].view(bits)), (
                    RK.MODE_NAMES[mode], parts, has_w, has_b)


def test_channel_parts_split_only_work_worth_the_threads(monkeypatch):
    """One run with one thread, one channel, or less than PARALLEL_MIN_WORK terms' worth
    of time; else one per thread, at most one per channel."""
    from numvar.instrument import kernels as KN

    monkeypatch.setattr(KN, "num_threads", lambda: 2)
    big = KN.PARALLEL_MIN_WORK // NK.BATCH_NORM_WORK + 1
    assert NK.channel_parts(64, big, NK.BATCH_NORM_WORK) == 2
    assert NK.channel_parts(64, big - 2, NK.BATCH_NORM_WORK) == 1
    assert NK.channel_parts(1, 10 * big, NK.BATCH_NORM_WORK) == 1
    monkeypatch.setattr(KN, "num_threads", lambda: 1)
    assert NK.channel_parts(64, 10 * big, NK.BATCH_NORM_WORK) == 1
    monkeypatch.setattr(KN, "num_threads", lambda: 8)
    assert NK.channel_parts(3, 10 * big, NK.BATCH_NORM_WORK) == 3


def _train_data(shape, special, dtype):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(9), dtype=dtype) * 2 + 0.5
    if special:
        x.view(-1)[2] = float("nan")  # channel 2 % C: its statistics NaN
        x[:, 1] = 3.0  # a constant channel: variance 0, rstd 1/sqrt(eps)
        x.view(-1)[-1] = 2e38 if dtype is torch.float32 else 2e300  # its square overflows
    return x


def _train_run(use, monkeypatch, mode, x, bn, grad, seed=4):
    """Three steps of (a copy of) ``bn`` (in training: running statistics updated each
    time; the second and third steps take the kernels) on x scaled, with the backward of
    a weighted sum where ``grad``. Everything that may differ between the two paths is
    returned: outputs, running statistics, gradients, the stream position and the
    report."""
    monkeypatch.setattr(NK, "USE_KERNEL", use)
    monkeypatch.setattr(MD, "_FUSED_SEEN", {})  # (the first step decomposes, in any order)
    bn = copy.deepcopy(bn)
    outs = []
    xx = x.clone().requires_grad_(grad)
    weights = torch.linspace(-1.0, 2.0, x.numel(), dtype=x.dtype).reshape(x.shape)
    with torch.set_grad_enabled(grad), fuzzy(mode=mode, granularity="flop", seed=seed) as fz:
        for i in range(3):
            y = bn(xx * (i + 1.0))
            if grad:
                (y * weights).sum().backward()
            outs.append(y.detach())
        pos = fz.stream.counter
    for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked):
        if t is not None:
            outs.append(t)
    if grad:
        outs += [xx.grad] + [p.grad for p in bn.parameters() if p.grad is not None]
    return outs, pos, fz.report().to_dict()


@pytest.mark.parametrize("mode,shape,affine,running,momentum,special,grad", [
    ("sr", (4, 3), True, True, 0.1, True, True),
    ("ud", (3, 4, 5), False, True, 0.1, True, True),
    ("random", (2, 3, 4, 2), True, False, 0.1, True, True),
    ("down", (2, 3, 6), True, True, None, False, False),
    ("ieee", (3, 17, 4), True, True, 1 / 3, True, True),
    ("sr", (2, 16, 3, 3), False, False, 0.1, False, True),
    ("up", (1, 3, 5), True, True, 0.1, False, True),
    ("sr", (5, 2, 1), True, True, 1.0, True, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_training_batch_norm_matches_decomposition(monkeypatch, mode, shape, affine, running,
                                                   momentum, special, grad, dtype):
    """Training batch norm (batch statistics over N > 1 samples, or one; running statistics
    updated in place or absent; momentum 1/3, whose 1 − momentum binary32 rounds; None:
    the cumulative average, 1, 1/2, 1/3: one signature for the kernel) through
    batch_norm_train, and its backward through batch_norm_backward: the decomposition's
    bits for the outputs, the running statistics, every gradient, the stream position
    and the report. 16 and 17 channels: the channels' sums by columns (a tile of every
    channel per step); 2 to 4: by rows, x's own for one sample. A NaN, a constant channel
    and an overflowing square (``special``)."""
    cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    bn = cls[len(shape)](shape[1], affine=affine, momentum=momentum,
                         track_running_stats=running).to(dtype).train()
    if affine:
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            bn.weight.copy_(torch.randn(shape[1], generator=g, dtype=dtype))
            bn.bias.copy_(torch.randn(shape[1], generator=g, dtype=dtype))
    x = _train_data(shape, special, dtype)
    forward = count_calls(monkeypatch, NK, "batch_norm_train")
    backward = count_calls(monkeypatch, NK, "batch_norm_backward")
    fast, pos, rep = _train_run(True, monkeypatch, mode, x, bn, grad)
    # (momentum None: each step's factor 1/k differs, and the kernel is taken under a
    # signature without it: mode._FUSED_FREE_ARGS)
    assert len(forward) == 2 and len(backward) == (2 if grad else 0)
    ref, pos_ref, rep_ref = _train_run(False, monkeypatch, mode, x, bn, grad)
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref):
        _same(a, b)
    assert pos == pos_ref and rep == rep_ref


@pytest.mark.parametrize("mode,affine,frozen_weight", [
    ("sr", True, False), ("ud", False, False), ("down", True, True), ("random", True, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eval_batch_norm_backward_matches_decomposition(monkeypatch, mode, affine,
                                                        frozen_weight, dtype):
    """Eval batch norm's backward (fine-tuning through a frozen batch norm: the
    decomposition's rsqrt of the running variance, then grad_input from it), with the
    weight's gradient left out of ``output_mask`` (``frozen_weight``: 13 keys, not 14)."""
    bn = _bn(4, affine, dtype=dtype)
    with torch.no_grad():
        bn.running_mean[1] = 0.5  # (_bn's inf mean: NaN gradients only)
    if affine and frozen_weight:
        bn.weight.requires_grad_(False)
    x = _train_data((3, 4, 5), True, dtype)
    calls = count_calls(monkeypatch, NK, "batch_norm_backward")
    fast, pos, rep = _train_run(True, monkeypatch, mode, x, bn.eval(), True)
    assert len(calls) == 2
    ref, pos_ref, rep_ref = _train_run(False, monkeypatch, mode, x, bn.eval(), True)
    assert len(fast) == len(ref) == 7 + affine + (affine and not frozen_weight)
    for a, b in zip(fast, ref):
        _same(a, b)
    assert pos == pos_ref and rep == rep_ref


@pytest.mark.parametrize("flag", ["BATCH_NORM_TRAIN", "BATCH_NORM_TRAIN64",
                                  "BATCH_NORM_BACKWARD", "precision"])
def test_training_batch_norm_declines(monkeypatch, flag):
    """Each flag off (or a virtual precision) sends its calls to the decomposition:
    BATCH_NORM_TRAIN the calls over several samples or with running statistics (not
    InstanceNorm's), BATCH_NORM_TRAIN64 float64's forward and backward,
    BATCH_NORM_BACKWARD the backward."""
    monkeypatch.setattr(MD, "_FUSED_SEEN", {})  # (the first step decomposes, in any order)
    forward = count_calls(monkeypatch, NK, "batch_norm_train")
    backward = count_calls(monkeypatch, NK, "batch_norm_backward")
    dtype = torch.float64 if flag in ("BATCH_NORM_TRAIN64", "precision") else torch.float32
    bn = torch.nn.BatchNorm1d(3).to(dtype).train()
    instance = torch.nn.InstanceNorm1d(3).to(dtype)
    x = torch.randn(4, 3, 5, dtype=dtype, requires_grad=True)
    kw = {"precision": 40} if flag == "precision" else {}
    if flag != "precision":
        monkeypatch.setattr(NK, flag, False)
    with fuzzy(mode="sr", granularity="flop", seed=0, **kw):
        for _ in range(2):
            (bn(x).sum() + instance(x).sum()).backward()
    # (the second step takes the kernels: one sample's forward, InstanceNorm's, without
    # BATCH_NORM_TRAIN; none for float64 without BATCH_NORM_TRAIN64 or at 40 bits)
    expect = {"BATCH_NORM_TRAIN": (1, 2), "BATCH_NORM_TRAIN64": (0, 0),
              "BATCH_NORM_BACKWARD": (2, 0), "precision": (0, 0)}[flag]
    assert (len(forward), len(backward)) == expect


def _instance_run(use, monkeypatch, mode, x, norm, grad):
    monkeypatch.setattr(NK, "USE_KERNEL", use)
    norm.zero_grad(set_to_none=True)  # (else the second run accumulates: one more add_)
    xx = x.clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad), fuzzy(mode=mode, granularity="flop", seed=6) as fz:
        outs = [norm(xx) for _ in range(2)]
        if grad:
            (torch.nan_to_num(outs[1]) * torch.arange(float(x.shape[-1]), dtype=x.dtype)
             ).sum().backward()
        pos = fz.stream.counter
    grads = [xx.grad] + [p.grad for p in norm.parameters()] if grad else []
    return [o.detach() for o in outs] + grads, pos, fz.report().to_dict()


@pytest.mark.parametrize("mode,shape,affine,grad", [
    ("sr", (2, 3, 4, 5), True, False), ("ieee", (2, 3, 4, 5), False, False),
    ("ud", (3, 4, 7), True, False), ("random", (1, 2, 3, 3, 2), True, False),
    ("down", (2, 3, 6), True, False), ("sr", (2, 3, 4, 4), True, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_instance_norm_matches_decomposition(monkeypatch, mode, shape, affine, grad, dtype):
    """InstanceNorm (training-mode batch norm of one (1, N·C, *S) sample, no running
    statistics) through batch_norm_train: the decomposition's bits, stream position
    and report, with NaN, a constant channel and overflowing squares, and its backward."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=dtype) * 2 + 0.5
    x.view(-1)[2] = float("nan")
    x[0, 1] = 3.0  # a constant channel: variance 0, rstd 1/sqrt(eps)
    x.view(-1)[-1] = 2e38 if dtype is torch.float32 else 2e300
    cls = {3: torch.nn.InstanceNorm1d, 4: torch.nn.InstanceNorm2d, 5: torch.nn.InstanceNorm3d}
    norm = cls[len(shape)](shape[1], affine=affine).to(dtype)
    if affine:
        g = torch.Generator().manual_seed(8)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(shape[1], generator=g))
            norm.bias.copy_(torch.randn(shape[1], generator=g))
    calls = count_calls(monkeypatch, NK, "batch_norm_train")
    fast, pos, rep = _instance_run(True, monkeypatch, mode, x, norm, grad)
    assert calls, "the compiled kernel did not run"
    ref, pos_ref, rep_ref = _instance_run(False, monkeypatch, mode, x, norm, grad)
    for a, b in zip(fast, ref):
        _same(a, b)
    assert pos == pos_ref and rep == rep_ref


def _softmax_data(dtype=torch.float32):
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(8), dtype=dtype)
    x[0, 0, :] = float("-inf")  # an all −inf row: NaN in _softmax, 0 in _safe_softmax
    x[1, 1, 2] = float("inf")
    x[1, 2, 3] = float("nan")
    x[2, 0, 1] = 100.0
    return x


@pytest.mark.parametrize("mode,which,parts", [
    ("sr", "softmax", 1), ("ud", "safe", 1), ("down", "safe", 1), ("random", "sdpa", 1),
    ("sr", "safe", 1), ("ieee", "safe_alive", 1), ("sr", "softmax", 3), ("ud", "safe", 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_matches_decomposition(monkeypatch, mode, which, parts, dtype):
    _parts(monkeypatch, parts)
    x = _softmax_data(dtype)
    if which == "safe_alive":  # no dead row: the kernel's output returned as it is
        x[0, 0, :] = torch.arange(6.0)
    fn = {"softmax": lambda t: torch.softmax(t, -1),
          "safe": lambda t: torch.ops.aten._safe_softmax.default(t, -1),
          "safe_alive": lambda t: torch.ops.aten._safe_softmax.default(t, -1),
          "sdpa": lambda t: F.scaled_dot_product_attention(t, t, t)}[which]
    grad = which == "softmax"

    def run(use):
        monkeypatch.setattr(NK, "USE_KERNEL", use)
        t = x.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad), fuzzy(mode=mode, granularity="flop", seed=4) as fz:
            outs = [fn(t) for _ in range(2)]
            if grad:
                torch.nan_to_num(outs[1]).sum().backward()
            pos = fz.stream.counter
        return [o.detach() for o in outs] + ([t.grad] if grad else []), pos, fz.report().to_dict()

    calls = count_calls(monkeypatch, NK, "softmax_par" if parts > 1 else "softmax_tail")
    fast, pos, rep = run(True)
    assert calls, "the compiled kernel did not run"
    ref, pos_ref, rep_ref = run(False)
    for a, b in zip(fast, ref):
        _same(a, b)
    assert pos == pos_ref and rep == rep_ref


SMB = torch.ops.aten._softmax_backward_data.default


def _softmax_backward_cases(dtype):
    """(grad_output, output, dim, input_dtype) of _softmax_backward_data over the last
    dim: few rows (the row scans) and many (the row blocks), a gradient and an output
    that are slices of wider tensors (strides in C order, not contiguous), a
    column-major gradient (declined); outputs with NaN, 0, 1, gradients with inf, a
    subnormal and NaNs of both signs in one row."""
    gen = torch.Generator().manual_seed(21)
    out = []
    for shape in [(3, 5, 7), (40, 24), (2, 3, 20, 20)]:
        y = torch.softmax(torch.randn(shape, generator=gen, dtype=dtype) * 3, -1)
        g = torch.randn(shape, generator=gen, dtype=dtype)
        y.view(-1)[:3] = torch.tensor([float("nan"), 0.0, 1.0], dtype=dtype)
        g.view(-1)[4:6] = torch.tensor([float("inf"), 1e-42], dtype=dtype)
        g.view(-1)[7:9] = _NAN_SIGNS.to(dtype)
        out.append((g, y, -1, dtype))
    wide = torch.softmax(torch.randn(20, 32, generator=gen, dtype=dtype), -1)
    out.append((torch.randn(20, 32, generator=gen, dtype=dtype)[:, 8:24], wide[:, :16], 1,
                dtype))
    g, y, *rest = out[2]
    out.append((g.transpose(-1, -2).contiguous().transpose(-1, -2), y, *rest))
    return out


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "down", "up"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_backward_matches_decomposition(monkeypatch, mode, dtype):
    """_softmax_backward_data (_softmax_backward_cases), each three times (the first
    records the decomposition), then F.softmax's gradient twice: results (strides too),
    stream position and report equal with the kernel and with the decomposition
    (SOFTMAX_BACKWARD off); the kernel ran for the later calls of every case but the
    column-major gradient."""
    cases = _softmax_backward_cases(dtype)

    def body():
        outs = [SMB(*case) for case in cases for _ in range(3)]
        for _ in range(2):
            x = torch.randn(6, 9, generator=torch.Generator().manual_seed(4), dtype=dtype,
                            requires_grad=True)
            (F.softmax(x, -1) * torch.arange(9.0, dtype=dtype)).sum().backward()
            outs.append(x.grad)
        return outs

    _kernel_and_decomposition(monkeypatch, "softmax_backward", "SOFTMAX_BACKWARD", mode,
                              body, 2 * (len(cases) - 1) + 1)


def test_softmax_backward_declines(monkeypatch):
    """Another dim, an input dtype other than the gradient's (a bfloat16 softmax computed
    in float32) and a virtual precision run the decomposition (no kernel call)."""
    calls = count_calls(monkeypatch, NK, "softmax_backward")
    g, y, _, dtype = _softmax_backward_cases(torch.float32)[0]
    for kw, args in [({}, (g, y, 1, dtype)), ({}, (g, y, -1, torch.bfloat16)),
                     ({"precision": 20}, (g, y, -1, dtype))]:
        with fuzzy(mode="sr", granularity="flop", seed=0, **kw):
            for _ in range(2):
                SMB(*args)
    assert not calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_long_rows_keep_the_scans_nan_signs(monkeypatch, dtype):
    """Rows longer than ROW_K_MAX in a whole of ROW_M_MIN rows or more, which flop.reduce
    sums as the scan of a transposed copy (``scan_kernels._long_rows``), with NaNs of both
    signs in a row: layer norm and softmax forward and backward and a group norm whose
    groups are that long give the decomposition's bits (NaN signs included) with the
    kernels (USE_KERNEL) and without; the kernels ran."""
    monkeypatch.setattr(MD, "_FUSED_SEEN", {})
    # (the forward kernels call each other from compiled code, where a counting wrapper
    # must not stand: their fused entries are counted where they serve a call)
    served = []

    def counted(op, real):
        def fused(*args):
            out = real(*args)
            if out is not None:
                served.append(op)
            return out
        return fused

    for op in (LN, torch.ops.aten._softmax.default):
        monkeypatch.setitem(MD._FUSED, op, counted(op, MD._FUSED[op]))
    calls = {k: count_calls(monkeypatch, NK, k) for k in (
        "layer_norm_backward", "softmax_backward", "group_norm")}
    gen = torch.Generator().manual_seed(13)
    rows, k = PW.ROW_M_MIN + 1, PW.ROW_K_MAX + 4
    x = torch.randn(rows, k, generator=gen, dtype=dtype)
    x[3, 10:12] = _NAN_SIGNS.to(dtype)
    x[4, 20:22] = _NAN_SIGNS.flip(0).to(dtype)
    gy = torch.randn(rows, k, generator=gen, dtype=dtype)
    gy[5, 1:3] = _NAN_SIGNS.to(dtype)
    w = torch.randn(k, generator=gen, dtype=dtype)
    xg = torch.randn(8, 16, 32, 32, generator=gen, dtype=dtype)  # 16 groups of 8 192
    xg[0, 0, 0, :2] = _NAN_SIGNS.to(dtype)
    xg[5, 9, 3, 4:6] = _NAN_SIGNS.flip(0).to(dtype)
    wg = torch.randn(16, generator=gen, dtype=dtype)

    def run(use):
        monkeypatch.setattr(NK, "USE_KERNEL", use)
        outs = []
        with fuzzy(mode="sr", granularity="flop", seed=2):
            for _ in range(2):
                xx = x.clone().requires_grad_()
                ww = w.clone().requires_grad_()
                y = F.layer_norm(xx, [k], ww, None)
                sm = torch.softmax(xx, -1)
                torch.autograd.backward([y, sm], [gy, gy])
                outs += [y.detach(), sm.detach(), xx.grad, ww.grad,
                         F.group_norm(xg, 2, wg, None)]
        return outs

    fast = run(True)
    assert set(served) == {LN, torch.ops.aten._softmax.default}
    assert all(calls.values())
    for a, b in zip(fast, run(False)):
        _same(a, b)


def test_softmax_over_another_dim_takes_the_decomposition(monkeypatch):
    """Another dim, or binary64 with ``SOFTMAX64`` off, takes the decomposition."""
    calls = count_calls(monkeypatch, NK, "softmax_tail")
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0):
        for _ in range(2):
            torch.softmax(_softmax_data(), 1)
    monkeypatch.setattr(NK, "SOFTMAX64", False)
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0):
        for _ in range(2):
            torch.softmax(_softmax_data(torch.float64), -1)
    assert not calls


@pytest.mark.parametrize("mode,shape,groups,bias", [("sr", (3, 6, 4, 5), 2, True),
                                                     ("down", (3, 6, 4, 5), 3, False),
                                                     ("ud", (5, 6), 3, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_norm_matches_decomposition(monkeypatch, mode, shape, groups, bias, dtype):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    x.view(shape[0], -1)[0, 0] = float("inf")
    x.view(shape[0], -1)[1, :shape[1] // groups * (x.numel() // shape[0] // shape[1])] = 0.5
    x.view(-1)[-2] = float("nan")
    w = torch.randn(shape[1], generator=g, dtype=dtype)
    b = torch.randn(shape[1], generator=g, dtype=dtype) if bias else None

    def run(use):
        monkeypatch.setattr(NK, "USE_KERNEL", use)
        with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=6) as fz:
            outs = [torch.ops.aten.native_group_norm.default(
                x, w, b, shape[0], shape[1], x.numel() // shape[0] // shape[1], groups, 1e-5)
                for _ in range(2)]  # (out, mean, rstd)
            pos = fz.stream.counter
        return outs, pos, fz.report().to_dict()

    calls = count_calls(monkeypatch, NK, "group_norm")
    fast, pos, rep = run(True)
    assert calls, "the compiled kernel did not run"
    ref, pos_ref, rep_ref = run(False)
    for o1, o2 in zip(fast, ref):
        for a, c in zip(o1, o2):
            _same(a, c)
    assert pos == pos_ref and rep == rep_ref


@pytest.mark.parametrize("rows,k", [(21, 8), (40, 5), (16, 33)])
def test_runs_of_rows_give_the_whole_calls_bits(rows, k):
    """The parallel layer norm and softmax in 1, 2, 3 and 5 runs of rows against one call
    on the whole, bit for bit, in every rounding mode (numba's thread count is whatever
    the run has: the split, not the threads, is what could change a bit), rows holding
    inf, NaN, a constant and all −inf.

    Bit for bit except the sign of a NaN, which IEEE 754 leaves uninterpreted (§6.3): a
    run of a few rows sends elements through a vectorised loop's scalar remainder, where
    LLVM may order a commutative add's operands, or fold ``x + (−y)`` into ``x − y``,
    otherwise than in the vector body, so a NaN met there may come out with the other
    sign (seen in ud: a NaN row's variance from 3 rows against 16). NaNs must be at the
    same places; every other bit must agree."""
    g = np.random.default_rng(rows)
    x = (g.standard_normal((rows, k)) * 3).astype(np.float32)
    x[0, 1], x[1, 0], x[2], x[3] = np.inf, np.nan, 0.25, -np.inf
    w, b = (g.standard_normal(k).astype(np.float32) for _ in range(2))
    keys = np.arange(1, 15, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    mx = x.max(1)
    with np.errstate(invalid="ignore"):  # inf − inf, −inf − (−inf): NaN, as softmax has it
        e64 = np.exp((x - mx[:, None]).astype(np.float64))
    eps = np.float32(1e-5)

    def run(mode, parts):
        out, d, sm = (np.empty(rows * k, np.float32) for _ in range(3))
        mean, rstd = np.empty(rows, np.float32), np.empty(rows, np.float32)
        o2 = out.reshape(rows, k)
        if parts:
            NK.layer_norm_par(x, w, b, True, True, eps, keys, mode, o2, mean, rstd, parts)
            NK.softmax_par(False, x, mx, e64[:0], keys, mode, d, parts)
            NK.softmax_par(True, x, mx, e64, keys[1:], mode, sm, parts)
        else:
            NK.layer_norm_rows(x, w, b, True, True, eps, keys, mode, o2, mean, rstd, rows, 0)
            NK.softmax_sub(x, mx, keys[0], mode, d, 0)
            NK.softmax_tail(e64, keys[1:], mode, sm, rows, 0)
        return [a.view(np.int32).copy() for a in (out, mean, rstd, d, sm)]

    for mode in range(len(RK.MODE_NAMES)):
        whole = run(mode, 0)
        assert np.isnan(whole[0].view(np.float32)[k:k + 1]).all()  # the NaN row came through
        for parts in (1, 2, 3, 5):
            for a, c in zip(whole, run(mode, parts)):
                nan = np.isnan(a.view(np.float32))
                assert np.array_equal(nan, np.isnan(c.view(np.float32))), (mode, parts)
                assert np.array_equal(a[~nan], c[~nan]), (RK.MODE_NAMES[mode], parts)


def test_runs_of_rows_give_the_whole_binary64_layer_norm():
    """The binary64 layer norm in 2, 3 and 5 runs of rows against one call on the whole,
    bit for bit (NaNs at the same places), in every rounding mode: the row blocks' sums
    and every element-wise step take the whole's element indices."""
    rows, k = 21, 8
    g = np.random.default_rng(3)
    x = g.standard_normal((rows, k)) * 3
    x[0, 1], x[1, 0], x[2], x[3, :2] = np.inf, np.nan, 0.25, (3e160, -2e160)
    w, b = g.standard_normal(k), g.standard_normal(k)
    keys = np.arange(1, 15, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)

    def run(mode, parts):
        out, mean, rstd = np.empty((rows, k)), np.empty(rows), np.empty(rows)
        if parts:
            NK.layer_norm_par(x, w, b, True, True, 1e-5, keys, mode, out, mean, rstd, parts)
        else:
            NK.layer_norm_rows(x, w, b, True, True, 1e-5, keys, mode, out, mean, rstd, rows, 0)
        return out, mean, rstd

    for mode in range(len(RK.MODE_NAMES)):
        whole = run(mode, 0)
        assert np.isnan(whole[0][:2]).all() and np.isfinite(whole[0][4:]).all()
        for parts in (2, 3, 5):
            for a, c in zip(whole, run(mode, parts)):
                nan = np.isnan(a)
                assert np.array_equal(nan, np.isnan(c)), (mode, parts)
                assert np.array_equal(a[~nan].view(np.int64), c[~nan].view(np.int64)), (
                    RK.MODE_NAMES[mode], parts)


def test_row_parts(monkeypatch):
    """One run per thread where the work is worth it; one run with one thread, with fewer
    than ROW_M_MIN rows or below kernels.PARALLEL_MIN_WORK terms' worth of time."""
    from numvar.instrument import kernels as KN

    monkeypatch.setattr(KN, "num_threads", lambda: 2)
    big = KN.PARALLEL_MIN_WORK // NK.LAYER_NORM_WORK + 1
    assert NK.row_parts(128, big, NK.LAYER_NORM_WORK) == 2
    assert NK.row_parts(128, big - 2, NK.LAYER_NORM_WORK) == 1
    assert NK.row_parts(PW.ROW_M_MIN - 1, 10 * big, NK.LAYER_NORM_WORK) == 1
    monkeypatch.setattr(KN, "num_threads", lambda: 1)
    assert NK.row_parts(128, 10 * big, NK.SOFTMAX_WORK) == 1


def _large_cases():
    """(name, op) on inputs of just over kernels.PARALLEL_MIN_WORK elements (2 · 64 · 2049
    = 262 272), and whether the kernel splits the work over threads."""
    from numvar.instrument import kernels as KN

    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 64, 2049, generator=g)
    assert x.numel() >= KN.PARALLEL_MIN_WORK
    rows = x.reshape(128, 2049)
    w, b = torch.randn(64, generator=g), torch.randn(64, generator=g)
    wl, bl = torch.randn(2049, generator=g), torch.randn(2049, generator=g)
    rm, rv = torch.randn(64, generator=g), torch.rand(64, generator=g) + 0.5
    xg = x.clone().requires_grad_()

    def train_step():
        with torch.enable_grad():
            y = F.batch_norm(xg, rm.clone(), rv.clone(), w, b, True)
            return [y.detach(), *torch.autograd.grad(y, xg, x)]
    return [
        ("layer_norm", True, lambda: F.layer_norm(rows, [2049], wl, bl)),
        ("softmax", True, lambda: rows.softmax(-1)),
        ("eval batch_norm", True, lambda: F.batch_norm(x, rm, rv, w, b, False)),
        ("training batch_norm and its backward", False, train_step),
        ("group_norm", False, lambda: F.group_norm(x, 8, w, b)),
    ]


@pytest.mark.parametrize("case", range(5))
def test_large_inputs_take_the_kernels_where_threads_allow(monkeypatch, case):
    """Inputs of kernels.PARALLEL_MIN_WORK elements or more take the kernels on one numba
    thread (every kernel), and on two where the kernel splits its rows or channels over
    them (layer norm, softmax, eval batch norm), with the decomposition's bits; the serial
    kernels (training batch norm and its backward, group norm) leave them to the
    decomposition on two threads, and so does every kernel with LARGE_INPUTS off. A
    kernel was taken when the second call ran no decomposition (the first records it)."""
    name, splits, op = _large_cases()[case]
    decompositions = count_calls(monkeypatch, MD.FuzzyMode, "_decompose_reference")

    def run(use, threads, large=True):
        monkeypatch.setattr(NK, "USE_KERNEL", use)
        monkeypatch.setattr(NK, "LARGE_INPUTS", large)
        monkeypatch.setattr(MD, "_FUSED_SEEN", {})
        numba.set_num_threads(threads)
        try:
            with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=3) as fz:
                outs = [op()]
                decompositions.clear()
                outs.append(op())
                pos = fz.stream.counter
        finally:
            numba.set_num_threads(1)
        flat = [t for o in outs for t in (o if isinstance(o, list) else [o])]
        return flat, pos, not decompositions

    ref, pos_ref, taken = run(False, 1)
    assert not taken
    for threads in (1, 2):
        got, pos, taken = run(True, threads)
        assert taken == (threads == 1 or splits), (name, threads)
        assert pos == pos_ref
        for a, b in zip(got, ref):
            _same(a, b)
    assert not run(True, 1, large=False)[2], name
