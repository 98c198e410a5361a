"""Convolutions with one input channel per group at flop granularity without their im2col
matrix (numvar.instrument.conv_kernels) against the im2col route they replace
(``USE_KERNEL = False``: ``flop._group_cols`` and ``kernels.contract``) and against the
contraction's slow reference: the gather table rebuilds the im2col matrix exactly (1-, 2-
and 3-D, strides, dilations, paddings wider than the kernel); under ``fuzzy`` a
convolution gives the same bits, stream position, report and contraction count either
way over random shapes (depthwise with channel multipliers 1–3, one-channel inputs) in sr,
ieee, ud and random, both contraction semantics, a virtual precision, bfloat16 and
float16 operands, non-finite values and a wide exponent range (rows off the clean path,
lanes with inexact sums), at one thread and in parallel, and through a training step.
What it does not serve (other modes, several channels per group, float64, formats) takes
the im2col route."""

import random

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _bitwise import same
from _spy import count_calls

from numvar.instrument import conv_kernels as CK
from numvar.instrument import flop as FL
from numvar.instrument import fuzzy
from numvar.instrument import kernels as KN
from numvar.rounding import kernels as RK
from numvar.workloads.zoo import count_contractions

torch.set_num_threads(1)
numba.set_num_threads(1)

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _case(rng: random.Random, nd: int, dtype=torch.float32, depthwise: bool = True):
    """A random convolution with one input channel per group: (x, w, b, stride, padding,
    dilation, groups)."""
    ks = [rng.randint(1, 4) for _ in range(nd)]
    st = [rng.randint(1, 3) for _ in range(nd)]
    dl = [rng.randint(1, 2) for _ in range(nd)]
    pd = [rng.randint(0, k * d) for k, d in zip(ks, dl)]  # (up to wider than the kernel)
    sp = [rng.randint(2, 9 if nd < 3 else 5) for _ in range(nd)]
    sp = [max(s, d * (k - 1) + 1 - 2 * p) for s, k, d, p in zip(sp, ks, dl, pd)]
    n = rng.randint(1, 2)
    c = rng.randint(1, 5) if depthwise else 1
    o = c * rng.randint(1, 3) if depthwise else rng.randint(1, 4)
    g = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    x = (torch.randn(n, c, *sp, generator=g) * 3).to(dtype)
    w = torch.randn(o, 1, *ks, generator=g).to(dtype)
    b = torch.randn(o, generator=g).to(dtype) if rng.random() < 0.7 else None
    return x, w, b, st, pd, dl, c


def _run(monkeypatch, use: bool, case, **config):
    """The convolution under ``fuzzy(granularity="flop", **config)`` with the kernel on or
    off: (output, stream position, report, contraction terms)."""
    x, w, b, st, pd, dl, g = case
    monkeypatch.setattr(CK, "USE_KERNEL", use)
    with torch.no_grad(), count_contractions() as cc, fuzzy(granularity="flop",
                                                             **config) as fz:
        out = _CONV[w.dim() - 2](x, w, b, st, pd, dl, g)
    return out, fz.stream.counter, fz.report().to_dict(), cc.terms


def _assert_same_both_ways(monkeypatch, case, **config) -> int:
    calls = count_calls(monkeypatch, CK, "grouped32")
    fast = _run(monkeypatch, True, case, **config)
    served = len(calls)
    ref = _run(monkeypatch, False, case, **config)
    assert len(calls) == served, "the im2col route called the kernel"
    assert same(fast[0], ref[0]), config
    assert fast[1:] == ref[1:]
    return served


def test_gather_table_rebuilds_the_im2col_matrix():
    rng = random.Random(3)
    for nd in (1, 2, 3):
        for _ in range(25):
            x, w, _, st, pd, dl, g = _case(rng, nd)
            ks = tuple(w.shape[2:])
            cols, ls = FL._group_cols(x, ks, st, pd, dl, g)
            t3 = CK._three
            off = CK.offsets(x.shape[0], 1, t3(x.shape[2:]), t3(ks), t3(st), t3(pd, 0), t3(dl),
                             t3(ls))
            for grp in range(g):  # the group's staged input, a zero first
                ext = torch.cat([torch.zeros(1), x[:, grp].reshape(-1)])
                assert torch.equal(ext[torch.from_numpy(off).long()], cols[grp])


def test_gather_tables_are_kept_per_geometry(monkeypatch):
    """``conv_kernels._table`` (what ``grouped32`` reads): the table ``offsets`` builds for
    the geometry, kept for a later call with the same geometry and not for another (each
    size, kernel, stride, padding and dilation changed alone); built afresh when it is
    larger than ``TABLE_BYTES``; the least recently used tables dropped first when the
    kept ones would exceed it."""
    CK._clear_tables()
    base = (2, 1, (9, 8), (3, 2), (1, 2), (1, 0), (1, 1))

    def geometry(n, cg, sp, ks, st, pd, dl):
        ls = tuple((sp[d] + 2 * pd[d] - dl[d] * (ks[d] - 1) - 1) // st[d] + 1
                   for d in range(len(sp)))
        return n, cg, sp, ks, st, pd, dl, ls

    def direct(n, cg, sp, ks, st, pd, dl, ls):
        t3 = CK._three
        return CK.offsets(n, cg, t3(sp), t3(ks), t3(st), t3(pd, 0), t3(dl), t3(ls))

    g0 = geometry(*base)
    kept = CK._table(*g0)
    assert np.array_equal(kept, direct(*g0)) and CK._table(*g0) is kept
    others = []
    for i, other in ((0, 3), (2, (9, 9)), (3, (2, 2)), (4, (2, 2)), (5, (0, 1)), (6, (2, 1))):
        changed = list(base)
        changed[i] = other
        g = geometry(*changed)
        t = CK._table(*g)
        assert t is not kept and np.array_equal(t, direct(*g)), i
        assert CK._table(*g) is t, i
        others.append((g, t))
    assert CK._table(*g0) is kept  # (g0 now the most recently used)
    # a budget that holds g0's table and the last other one: the older ones go first
    (g_last, t_last) = others[-1]
    monkeypatch.setattr(CK, "TABLE_BYTES", kept.nbytes + t_last.nbytes)
    g_new = geometry(3, 2, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1))
    CK._clear_tables()
    for g, _ in others:
        CK._table(*g)
    kept = CK._table(*g0)
    t_last = CK._table(*g_last)
    assert set(CK._TABLES) == {g0, g_last}
    assert CK._tables_bytes == kept.nbytes + t_last.nbytes
    t_new = CK._table(*g_new)  # larger than the budget: built, not kept
    assert t_new.nbytes > CK.TABLE_BYTES and np.array_equal(t_new, direct(*g_new))
    assert CK._table(*g_new) is not t_new and set(CK._TABLES) == {g0, g_last}
    # one no larger than g0's: kept, g0 (the least recently used) dropped, g_last not
    g_small = next(g for g, t in others[:-1] if t.nbytes <= kept.nbytes)
    CK._table(*g_small)
    assert list(CK._TABLES) == [g_last, g_small]
    monkeypatch.setattr(CK, "TABLE_BYTES", 0)
    fresh = CK._table(*g0)
    assert fresh is not kept and np.array_equal(fresh, kept)
    CK._clear_tables()


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random"])
@pytest.mark.parametrize("contraction", ["separate", "fma"])
def test_same_bits_as_the_im2col_route(monkeypatch, mode, contraction):
    rng = random.Random(len(mode) * 7 + len(contraction))
    served = 0
    for i in range(24):
        case = _case(rng, 1 + i % 3, depthwise=i % 4 != 3)
        served += _assert_same_both_ways(monkeypatch, case, mode=mode, seed=i,
                                         contraction=contraction)
    assert served == 24


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_same_bits_with_16_bit_operands_a_virtual_precision_and_a_format(monkeypatch, dtype):
    """16-bit operands and a format accumulate in binary32, then round once more (the
    accumulation policy's ``then_round``); a virtual precision runs the kernel at t bits."""
    rng = random.Random(5)
    served = 0
    for i in range(12):
        served += _assert_same_both_ways(monkeypatch, _case(rng, 1 + i % 2, dtype), mode="sr",
                                         seed=i)
        served += _assert_same_both_ways(monkeypatch, _case(rng, 2), mode="sr", seed=i,
                                         precision=8 + i)
    served += _assert_same_both_ways(monkeypatch, _case(rng, 2), mode="sr", seed=1,
                                     format="e4m3fn" if dtype is torch.bfloat16 else "e5m2")
    assert served == 25


def test_same_bits_with_non_finite_values_and_a_wide_exponent_range(monkeypatch):
    """Rows off the clean path (inf, NaN, magnitudes beyond its range) and lanes whose
    float64 sums are inexact (terms 2**40 apart) take the kernel's other paths."""
    rng = random.Random(9)
    for i in range(8):
        x, w, b, st, pd, dl, g = _case(rng, 2)
        x = x * torch.tensor([1e-30, 1.0, 1e30, 2.0 ** 40])[torch.randint(0, 4, x.shape)]
        if i % 2:
            x.view(-1)[0] = float("inf") if i % 4 == 1 else float("nan")
            w.view(-1)[-1] = 1e-38
        for mode in ("sr", "ud"):
            assert _assert_same_both_ways(monkeypatch, (x, w, b, st, pd, dl, g), mode=mode,
                                          seed=i)


def test_equals_the_contraction_reference():
    """The group products against ``kernels.contract_reference`` (plain Python) of the
    weights and the im2col matrix."""
    rng = random.Random(11)
    for i in range(6):
        x, w, _, st, pd, dl, g = _case(rng, 1 + i % 2)
        ks = tuple(w.shape[2:])
        cols, ls = FL._group_cols(x, ks, st, pd, dl, g)
        a = w.reshape(g, w.shape[0] // g, -1).numpy()
        for mode in (RK.MODE_SR, RK.MODE_UD):
            got = CK.grouped32(x.numpy(), w.numpy(), ks, st, pd, dl, g, ls, 40 + i, mode, 24,
                               "separate")
            assert np.array_equal(got, KN.contract_reference(a, cols.numpy(), 40 + i, mode, 24),
                                  equal_nan=True)


def test_parallel_runs_give_the_same_bits(monkeypatch):
    g = torch.Generator().manual_seed(13)
    case = (torch.randn(2, 6, 12, 12, generator=g), torch.randn(12, 1, 3, 3, generator=g),
            torch.randn(12, generator=g), [2, 1], [1, 2], [1, 2], 6)
    want = _run(monkeypatch, True, case, mode="sr", seed=4)
    numba.set_num_threads(2)
    try:
        monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", 0)  # (every call in parallel)
        assert _assert_same_both_ways(monkeypatch, case, mode="sr", seed=4)
        assert same(_run(monkeypatch, True, case, mode="sr", seed=4)[0], want[0])
    finally:
        numba.set_num_threads(1)


def test_declines_what_it_does_not_serve(monkeypatch):
    calls = count_calls(monkeypatch, CK, "grouped32")
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        with fuzzy(mode="up", granularity="flop", seed=0):  # (the scalar kernel's mode)
            F.conv2d(x, torch.randn(4, 1, 3, 3), groups=4)
        with fuzzy(mode="sr", granularity="flop", seed=0):
            F.conv2d(x, torch.randn(4, 2, 3, 3), groups=2)  # two channels per group
            F.conv2d(x.double(), torch.randn(4, 1, 3, 3, dtype=torch.float64), groups=4)
        with fuzzy(mode="sr", granularity="flop", seed=0, format="e4m3fn", accumulate="same"):
            F.conv2d(x, torch.randn(4, 1, 3, 3), groups=4)  # (accumulated in the format)
        assert not calls
        with fuzzy(mode="sr", granularity="flop", seed=0):
            F.conv2d(x, torch.randn(4, 1, 3, 3), groups=4)
    assert len(calls) == 1


def test_training_step_same_loss_and_gradients(monkeypatch):
    """Forward and backward (a depthwise layer's input gradient is a transposed
    convolution with one channel per group: the kernel serves it too; with a channel
    multiplier m it has m channels per group, and takes the im2col route)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4))
    x = torch.randn(2, 1, 8, 8, requires_grad=True)
    calls = count_calls(monkeypatch, CK, "grouped32")
    results = {}
    for use in (True, False):
        monkeypatch.setattr(CK, "USE_KERNEL", use)
        net.zero_grad()
        x.grad = None
        with fuzzy(mode="sr", granularity="flop", seed=21) as fz:
            loss = net(x).square().mean()
            loss.backward()
        results[use] = (loss.detach(), x.grad.clone(),
                        *[p.grad.clone() for p in net.parameters()], fz.stream.counter)
    assert len(calls) >= 3  # two forward convolutions, the depthwise input gradient
    fast, ref = results[True], results[False]
    assert all(same(a, b) for a, b in zip(fast[:-1], ref[:-1])) and fast[-1] == ref[-1]


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "up"])
def test_bias_add_kernel_equals_ctx_add(monkeypatch, mode):
    """conv_kernels.bias_rows32 (a convolution's bias added to its products in one
    compiled call) against Ctx.add on the permuted products (BIAS_KERNEL off): same
    bits, stream position, report and contraction count, over random convolutions of both
    routes (one channel per group: grouped32; several: the im2col matrix), 1-3-D,
    batches of 1 and 2, unbatched input, and biases with inf, NaN, -0 and values 2^60
    apart from the products (inexact float64 sums: the residual path)."""
    rng = random.Random(11)
    cases = [_case(rng, nd, depthwise=dw) for nd in (1, 2, 3) for dw in (True, False)
             for _ in range(2)]
    x, w, _, st, pd, dl, g = _case(rng, 1)
    cases.append((x[0], w, None, st, pd, dl, g))  # unbatched
    gen = torch.Generator().manual_seed(5)
    for nd, groups in ((1, 1), (2, 1), (2, 2)):  # several channels per group: im2col
        x = torch.randn(2, 4, *[6] * nd, generator=gen)
        w = torch.randn(6, 4 // groups, *[3] * nd, generator=gen)
        cases.append((x, w, None, [1] * nd, [1] * nd, [1] * nd, groups))
    calls = count_calls(monkeypatch, CK, "bias_rows32")
    grouped = count_calls(monkeypatch, CK, "grouped32")
    for i, (x, w, b, st, pd, dl, g) in enumerate(cases):
        b = torch.randn(w.shape[0], generator=torch.Generator().manual_seed(i))
        if i % 3 == 0:
            b[0] = 2.0 ** 60
        if i % 4 == 1 and b.numel() > 2:
            b[1], b[2] = float("inf"), float("nan")
        if i % 5 == 2:
            b[-1] = -0.0
        case = (x, w, b, st, pd, dl, g)
        monkeypatch.setattr(CK, "BIAS_KERNEL", True)
        fast = _run(monkeypatch, True, case, mode=mode, seed=4)
        assert len(calls) == i + 1  # the kernel added the bias
        monkeypatch.setattr(CK, "BIAS_KERNEL", False)
        ref = _run(monkeypatch, True, case, mode=mode, seed=4)
        assert len(calls) == i + 1
        assert same(fast[0], ref[0]), i
        assert fast[1:] == ref[1:]
    if mode != "up":  # (grouped32 serves sr, ieee, ud and random: up takes im2col alone)
        assert 0 < len(grouped) < 2 * len(cases)  # both routes computed the products
