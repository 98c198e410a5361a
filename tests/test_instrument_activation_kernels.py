"""numvar.instrument.activation_kernels (hardswish and hardsigmoid at flop granularity in
one compiled call) against torch's decompositions run op by op through the mode: the
same bits, stream position and report."""

import numba
import pytest
import torch
import torch.nn.functional as F

from numvar.instrument import activation_kernels as AK
from numvar.instrument import fuzzy
from numvar.instrument import mode as MO

torch.set_num_threads(1)
numba.set_num_threads(1)

_OPS = {F.hardswish: torch.ops.aten.hardswish.default,
        F.hardsigmoid: torch.ops.aten.hardsigmoid.default}


def _inputs():
    g = torch.Generator().manual_seed(5)
    out = []
    for shape in [(2, 16, 8, 8), (AK.CHUNK + 5,), (3, 3), (2, 3, 40, 40)]:
        x = torch.randn(shape, generator=g) * 4
        # the clamps' corners, a NaN (kept by the clamps), infinities, a subnormal, values
        # whose sum with 3 is inexact in binary32
        x.view(-1)[:9] = torch.tensor([-3.0, 3.0, float("nan"), float("inf"), -float("inf"),
                                       1e-40, -2.9999998, 2.9999998, 1e-8])
        out.append(x)
    out.append(torch.randn(2, 8, 5, 5, generator=g).to(memory_format=torch.channels_last))
    return out


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "up", "down", "zero",
                                  "farthest"])
@pytest.mark.parametrize("fn", [F.hardswish, F.hardsigmoid])
def test_compiled_activation_matches_the_decomposition(monkeypatch, mode, fn):
    """Each input three times (the first call records the decomposition, the others take
    the kernel): outputs, stream position and report equal with and without the kernel;
    the kernel ran for the later calls."""
    monkeypatch.setattr(MO, "_FUSED_SEEN", {})  # (each signature's first call records)
    calls = []
    real = MO._FUSED[_OPS[fn]]
    monkeypatch.setitem(MO._FUSED, _OPS[fn], lambda *a: calls.append(1) or real(*a))
    served = []
    real_kernel = AK._hard32
    monkeypatch.setattr(AK, "_hard32", lambda *a: served.append(1) or real_kernel(*a))
    xs = _inputs()

    def run(use):
        monkeypatch.setattr(AK, "USE_KERNEL", use)
        with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=6) as fz:
            outs = [fn(x) for x in xs for _ in range(3)]
            return outs, fz.stream.counter, fz.report().to_dict()

    fast = run(True)
    assert len(served) == 2 * len(xs)
    ref = run(False)
    assert len(served) == 2 * len(xs) and calls
    for a, b in zip(fast[0], ref[0]):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))
    assert fast[1:] == ref[1:]


def test_declines_leave_the_decomposition(monkeypatch):
    """float64 and bfloat16 inputs, a target format, an empty tensor and a large tensor on
    two threads run the decomposition (the kernel is not called) with its own bits."""
    served = []
    real_kernel = AK._hard32
    monkeypatch.setattr(AK, "_hard32", lambda *a: served.append(1) or real_kernel(*a))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, generator=g)
    for kwargs, inp in [({}, x.double()), ({}, x.bfloat16()), ({"format": "e4m3fn"}, x),
                        ({}, x[:0])]:
        with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=1, **kwargs):
            for _ in range(2):
                F.hardswish(inp)
                F.hardsigmoid(inp)
    assert not served
    big = torch.randn(AK.KN.PARALLEL_MIN_WORK + 1, generator=g)
    outs = []
    for threads, use in ((2, True), (1, False)):
        monkeypatch.setattr(AK, "USE_KERNEL", use)
        numba.set_num_threads(threads)
        try:
            with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=1):
                outs.append([F.hardswish(big) for _ in range(2)])
        finally:
            numba.set_num_threads(1)
    assert not served
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "up", "down", "zero",
                                  "farthest"])
@pytest.mark.parametrize("fn", [F.hardswish, F.hardsigmoid])
def test_compiled_backward_matches_the_decomposition(monkeypatch, mode, fn):
    """The backward ops (hardswish_backward, hardsigmoid_backward), each input's gradient
    twice from a weighted sum (NaN, infinities and a subnormal among the weights) and
    twice from a sum (a stride-0 gradient; the first call of each signature records the
    decomposition); every x of _inputs (the branches' corners ±3, NaN, ±inf). Gradients
    (their strides too), stream position and report equal with and without the kernel,
    which ran for the later calls of each contiguous x (not the channels_last one)."""
    monkeypatch.setattr(MO, "_FUSED_SEEN", {})
    served = []
    real_kernel = AK._hard_backward32
    monkeypatch.setattr(AK, "_hard_backward32",
                        lambda *a: served.append(1) or real_kernel(*a))
    xs = _inputs()
    gen = torch.Generator().manual_seed(9)

    def weights(x):
        w = torch.randn(x.shape, generator=gen) * 3
        w.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -1e-40, 3e38])
        return w
    ws = [weights(x) for x in xs]

    def run(use):
        monkeypatch.setattr(AK, "USE_KERNEL", use)
        grads = []
        with fuzzy(mode=mode, granularity="flop", seed=6) as fz:
            for x, w in zip(xs, ws):
                for rnd in range(4):  # (a weighted sum's gradient twice, a sum's twice)
                    xx = x.detach().clone().requires_grad_()
                    y = fn(xx)
                    (y * w).sum().backward() if rnd < 2 else y.sum().backward()
                    grads.append(xx.grad)
            return grads, fz.stream.counter, fz.report().to_dict()

    fast = run(True)
    contiguous = sum(x.is_contiguous() for x in xs)
    assert len(served) == 2 * contiguous
    ref = run(False)
    assert len(served) == 2 * contiguous
    for a, b in zip(fast[0], ref[0]):
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))
    assert fast[1:] == ref[1:]


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "up", "down", "zero",
                                  "farthest"])
@pytest.mark.parametrize("op", ["sigmoid", "tanh"])
def test_sigmoid_tanh_backward_matches_the_decomposition(monkeypatch, mode, op):
    """aten.sigmoid_backward and aten.tanh_backward: called directly (y anywhere: outside
    the forward's range, NaN, ±inf, subnormal, ±1, 0; gradients with NaN, inf, a
    subnormal; more than one chunk; y, g or both slices of wider tensors; a transposed
    y or g, declined) and through autograd (a weighted sum's and a sum's
    gradient, stride 0), three calls per signature (the first records the
    decomposition). Results (strides too), stream position and report equal with and
    without the kernel, which ran for every later call of a row-major y and g."""
    monkeypatch.setattr(MO, "_FUSED_SEEN", {})
    served = []
    real_kernel = AK._sigmoid_tanh_backward32
    monkeypatch.setattr(AK, "_sigmoid_tanh_backward32",
                        lambda *a: served.append(1) or real_kernel(*a))
    aten = getattr(torch.ops.aten, f"{op}_backward").default
    forward = getattr(torch, op)
    gen = torch.Generator().manual_seed(11)
    ys, gs = [], []
    for shape in [(AK.CHUNK + 7,), (3, 5), (2, 4, 9)]:
        y = torch.rand(shape, generator=gen) * 3 - 1
        y.view(-1)[:10] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40,
                                        -1e-40, 1.0, -1.0, 0.0, 0.99999994, 4097.0])
        g = torch.randn(shape, generator=gen) * 5
        g.view(-1)[10:13] = torch.tensor([float("nan"), -float("inf"), 1e-42])
        ys.append(y)
        gs.append(g)
    # slices of a wider tensor (an LSTM's gate chunks): y, g or both row-major strided
    wide = [torch.rand(5, 24, generator=gen) * 2 - 0.5 for _ in range(2)]
    ys += [wide[0][:, 6:12], wide[0][:, 6:12].contiguous(), wide[1][:, :6]]
    gs += [wide[1][:, 12:18].contiguous(), wide[1][:, 18:], wide[0][:, 18:]]
    declined = [(wide[1][:, :6].t().contiguous().t(), gs[-1]),  # (a transposed y
                (ys[-1], wide[0][:, :6].t().contiguous().t())]  # and g: declined)
    xs = [torch.randn(2, 3, 7, generator=gen) * 4,
          torch.randn(4, 6, generator=gen).t()]  # (y then transposed: declined)

    def run(use):
        monkeypatch.setattr(AK, "USE_KERNEL", use)
        outs = []
        with fuzzy(mode=mode, granularity="flop", seed=4) as fz:
            for g, y in zip(gs, ys):
                outs += [aten(g, y) for _ in range(3)]
            for g, y in declined:
                outs += [aten(g, y) for _ in range(3)]
            for x in xs:
                w = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
                for rnd in range(6):
                    xx = x.detach().clone().requires_grad_()
                    out = forward(xx)
                    (out * w).sum().backward() if rnd < 3 else out.sum().backward()
                    outs.append(xx.grad)
            return outs, fz.stream.counter, fz.report().to_dict()

    fast = run(True)
    assert len(served) == 2 * len(ys) + 4
    ref = run(False)
    assert len(served) == 2 * len(ys) + 4
    for a, b in zip(fast[0], ref[0]):
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))
    assert fast[1:] == ref[1:]


@pytest.mark.parametrize("mode", ["sr", "down"])
def test_hard_backward_of_slices_matches_the_decomposition(monkeypatch, mode):
    """hardswish_backward and hardsigmoid_backward called directly on slices of wider
    tensors (strides in C order, not contiguous: the kernel takes them) and on a
    transposed x (declined): results (strides too), stream position and report equal
    with and without the kernel."""
    monkeypatch.setattr(MO, "_FUSED_SEEN", {})
    served = []
    real_kernel = AK._hard_backward32
    monkeypatch.setattr(AK, "_hard_backward32",
                        lambda *a: served.append(1) or real_kernel(*a))
    gen = torch.Generator().manual_seed(17)
    wide = torch.randn(6, 40, generator=gen) * 4
    wide[0, 10:13] = torch.tensor([-3.0, 3.0, float("nan")])
    gw = torch.randn(6, 40, generator=gen)
    pairs = [(gw[:, 20:30], wide[:, 10:20]), (gw[:, :10].contiguous(), wide[:, 10:20]),
             (gw[:, :10], wide[:, :10].t().contiguous().t())]  # (the last: declined)
    ops = (torch.ops.aten.hardswish_backward.default,
           torch.ops.aten.hardsigmoid_backward.default)

    def run(use):
        monkeypatch.setattr(AK, "USE_KERNEL", use)
        with fuzzy(mode=mode, granularity="flop", seed=3) as fz:
            outs = [op(g, x) for op in ops for g, x in pairs for _ in range(3)]
            return outs, fz.stream.counter, fz.report().to_dict()

    fast = run(True)
    assert len(served) == 2 * 2 * 2
    ref = run(False)
    assert len(served) == 2 * 2 * 2
    for a, b in zip(fast[0], ref[0]):
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))
    assert fast[1:] == ref[1:]
