"""The float64 value of a depthwise convolution at op granularity
(numvar.instrument.depthwise) against PyTorch's CPU float64 convolution, which op SR ran
before (``op_once`` on float64 copies), and against its slow reference in Python floats:
identical bits over strides, dilations, paddings (wider than the kernel too), 1-D and
2-D, bfloat16/float16 operands, no bias, signed zeros and non-finite values, at one and
several runs of planes. The convolutions it declines (a channel multiplier, one output
per plane, channels-last strides, float64 operands, transposed) go through ``op_once``.
Under ``fuzzy(granularity="op")`` a model's depthwise layers give the same bits, the
same stream position and the same report with the kernel as without it
(``USE_KERNEL = False``), in every rounding mode.

The other convolutions' float64 re-run in runs of samples (``batched64``, where the whole
batch's im2col buffer exceeds ``COLUMN_BYTES``, lowered here to force the split): the
same bits as PyTorch's float64 convolution of the whole batch, 1-D, 2-D and 3-D, groups,
strides, dilations, paddings, with and without bias, at one and two threads, and under
``fuzzy(granularity="op")`` the same bits, stream position and report as unsplit."""

import random

import pytest
import torch
from _bitwise import same
from _spy import count_calls
from torch import nn

from numvar.instrument import depthwise as D
from numvar.instrument import fuzzy

CONV = torch.ops.aten.convolution.default


def _torch64(x, w, b, stride, padding, dilation):
    groups = x.shape[1]
    return CONV(x.double(), w.double(), None if b is None else b.double(), stride, padding,
                dilation, False, [0] * len(stride), groups)


def _args(x, w, b, stride, padding, dilation):
    return (x, w, b, list(stride), list(padding), list(dilation), False, [0] * len(stride),
            x.shape[1])


def _case(rng, dtype):
    kh, kw = rng.randint(1, 5), rng.randint(1, 5)
    s, d = (rng.randint(1, 3), rng.randint(1, 3)), (rng.randint(1, 2), rng.randint(1, 2))
    p = (rng.randint(0, kh * d[0]), rng.randint(0, kw * d[1]))  # (up to wider than the kernel)
    n, c, h, w = rng.randint(1, 2), rng.randint(1, 4), rng.randint(2, 9), rng.randint(2, 11)
    g = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    x = torch.randn(n, c, h, w, generator=g) * 4
    x[x.abs() < 0.4] = 0.0
    x[x.abs() < 0.8] = -0.0  # signed zeros: the bias-first order decides the sign
    x = x.to(dtype)
    wt = torch.randn(c, 1, kh, kw, generator=g).to(dtype)
    b = torch.randn(c, generator=g).to(dtype) if rng.random() < 0.7 else None
    return x, wt, b, s, p, d


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_value_equals_torch_float64_and_the_reference(dtype):
    rng = random.Random(int(dtype.itemsize))
    served = 0
    for _ in range(60):
        x, w, b, s, p, d = _case(rng, dtype)
        v = D.value64(*_args(x, w, b, s, p, d))
        if v is None:  # (one output per plane)
            continue
        served += 1
        assert same(v, _torch64(x, w, b, s, p, d)), (x.shape, w.shape, s, p, d)
        assert same(v, D.reference64(x, w, b, s, p, d)), (x.shape, w.shape, s, p, d)
    assert served >= 40


def test_value_with_non_finite_values_and_a_wide_exponent_range():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 7, 8, generator=g)
    x[0, 0, 2, 3] = float("inf")
    x[0, 1, 4, 4] = float("nan")
    x[1, 2] *= 1e-30  # tiny products beside the bias: sums that round
    w = torch.randn(3, 1, 3, 3, generator=g)
    w[2, 0, 1, 1] = 3e38
    w[1, 0, 0, 0] = -float("inf")  # inf · padding zero = NaN, as im2col computes it
    b = torch.randn(3, generator=g)
    for s, p, d in (((1, 1), (1, 1), (1, 1)), ((2, 1), (2, 3), (1, 2))):
        v = D.value64(*_args(x, w, b, s, p, d))
        assert same(v, _torch64(x, w, b, s, p, d))
        assert same(v, D.reference64(x, w, b, s, p, d))


def test_value_1d_and_models_shapes():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 6, 40, generator=g)
    w = torch.randn(6, 1, 5, generator=g)
    b = torch.randn(6, generator=g)
    for s, p, d in (((1,), (2,), (1,)), ((2,), (0,), (3,))):
        v = D.value64(*_args(x, w, b, s, p, d))
        assert v.shape[:2] == (2, 6) and same(v, _torch64(x, w, b, s, p, d))
    # EfficientNet's shapes: 5×5 on 4×4 maps (padding 2), stride 2 on 16×16
    for c, h, k, s in ((48, 4, 5, 1), (24, 16, 5, 2), (16, 32, 3, 1)):
        x = torch.randn(2, c, h, h, generator=g)
        w = torch.randn(c, 1, k, k, generator=g)
        args = (x, w, None, (s, s), (k // 2, k // 2), (1, 1))
        assert same(D.value64(*_args(*args)), _torch64(*args))


def test_runs_of_planes_give_the_same_bits():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, 9, 10, generator=g)
    w = torch.randn(5, 1, 3, 3, generator=g)
    b = torch.randn(5, generator=g)
    outs = []
    for parts in (1, 2, 7, 15):  # (15: one plane per run)
        out = torch.empty(3, 5, 5, 8, dtype=torch.float64)  # stride (2, 1), padding (1, 0)
        D.depthwise64(x.view(-1).numpy(), w.view(-1).numpy(), b.double().numpy(), 3, 5, 9,
                      10, 3, 3, 2, 1, 1, 0, 1, 1, 5, 8, out.view(-1).numpy(), parts)
        outs.append(out)
    assert all(same(o, outs[0]) for o in outs[1:])
    assert same(outs[0], _torch64(x, w, b, (2, 1), (1, 0), (1, 1)))


def test_declines_what_it_does_not_compute_as_torch_does():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 6, 6, generator=g)
    w = torch.randn(4, 1, 3, 3, generator=g)
    ok = _args(x, w, None, (1, 1), (1, 1), (1, 1))
    assert D.value64(*ok) is not None
    declined = {
        "channel multiplier 2": (x, torch.randn(8, 1, 3, 3, generator=g), *ok[2:]),
        "groups of two channels": (x, torch.randn(2, 2, 3, 3, generator=g), *ok[2:8], 2),
        "one output per plane": _args(x, w, None, (1, 1), (0, 0), (3, 3)),
        "channels-last input": (x.to(memory_format=torch.channels_last), *ok[1:]),
        "channels-last weight": (x, w.to(memory_format=torch.channels_last), *ok[2:]),
        "float64 operands": (x.double(), w.double(), *ok[2:]),
        "mixed dtypes": (x, w.bfloat16(), *ok[2:]),
        "transposed": (*ok[:6], True, *ok[7:]),
        "3-D": (x.unsqueeze(2), w.unsqueeze(2), None, [1] * 3, [1] * 3, [1] * 3, False,
                [0] * 3, 4),
    }
    for why, args in declined.items():
        assert D.value64(*args) is None, why
    # a one-channel channels-last input passes is_contiguous(); PyTorch's float64
    # convolution still takes its channels-last path there, which adds in another order
    x1 = torch.randn(2, 1, 6, 7, generator=g).to(memory_format=torch.channels_last)
    assert x1.is_contiguous()
    assert D.value64(x1, w[:1], *ok[2:8], 1) is None


class _DepthwiseNet(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.pw = nn.Conv2d(3, 8, 1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.dw2 = nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8)
        self.dw1 = nn.Conv1d(8, 8, 3, padding=1, groups=8)
        self.to(dtype)

    def forward(self, x):
        y = self.dw2(torch.relu(self.dw(self.pw(x))))
        return self.dw1(y.flatten(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random", "up"])
def test_fuzzy_op_granularity_same_bits_with_and_without_the_kernel(monkeypatch, mode, dtype):
    torch.manual_seed(0)
    net = _DepthwiseNet(dtype)
    x = torch.randn(2, 3, 9, 9).to(dtype)
    calls = count_calls(monkeypatch, D, "depthwise64")
    results = {}
    for use in (True, False):
        monkeypatch.setattr(D, "USE_KERNEL", use)
        with torch.no_grad(), fuzzy(mode=mode, granularity="op", seed=11) as fz:
            out = net(x)
            results[use] = (out, fz.stream.counter, fz.report().to_dict())
    assert len(calls) == 3, "the kernel did not serve the three depthwise layers"
    fast, ref = results[True], results[False]
    assert same(fast[0], ref[0])
    assert fast[1] == ref[1] and fast[2] == ref[2]
    if mode in ("sr", "ud", "random"):  # (the perturbation is there: another seed moves it)
        with torch.no_grad(), fuzzy(mode=mode, granularity="op", seed=12):
            assert not same(net(x), fast[0])


def _whole64(args):
    return CONV(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])


def _split64(monkeypatch, args, limit_samples: int, threads: int):
    """batched64 with COLUMN_BYTES lowered to ``limit_samples`` samples' buffers, and
    PyTorch's float64 convolution of the whole batch, at ``threads`` threads; the run
    sizes batched64 took."""
    x, w = args[0], args[1]
    per = D.sample_column_bytes(x, w, args[3], args[4], args[5], args[8])
    monkeypatch.setattr(D, "COLUMN_BYTES", limit_samples * per)
    sizes = []

    def conv(*a):
        sizes.append(a[0].shape[0])
        return CONV(*a)

    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return D.batched64(conv, args), _whole64(args), sizes
    finally:
        torch.set_num_threads(n)


# (x shape, w shape, bias, stride, padding, dilation, groups): every sample's input, im2col
# buffer and output whole multiples of 64 bytes, as batched64 requires
_SPLIT_CASES = [
    ((7, 4, 8, 8), (8, 4, 3, 3), True, (1, 1), (1, 1), (1, 1), 1),
    ((6, 4, 16, 8), (8, 2, 3, 2), False, (2, 1), (1, 0), (1, 1), 2),
    ((5, 8, 12, 12), (8, 8, 3, 3), True, (1, 1), (2, 2), (2, 2), 1),
    ((9, 8, 16), (8, 8, 5), True, (1,), (2,), (1,), 1),
    ((5, 2, 4, 8, 8), (8, 2, 3, 3, 3), True, (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(_SPLIT_CASES)))
def test_runs_of_samples_give_the_bits_of_the_whole_batch(monkeypatch, case, threads):
    xs, ws, has_bias, stride, padding, dilation, groups = _SPLIT_CASES[case]
    g = torch.Generator().manual_seed(case)
    x, w = torch.randn(xs, generator=g), torch.randn(ws, generator=g)
    b = torch.randn(ws[0], generator=g) if has_bias else None
    args = (x, w, b, list(stride), list(padding), list(dilation), False, [0] * len(stride),
            groups)
    got, want, sizes = _split64(monkeypatch, args, 2, threads)  # (two samples a run)
    assert sum(sizes) == xs[0] and len(sizes) >= 2  # split, every sample once
    assert min(sizes) >= (2 if threads > 1 else 1) and max(sizes) <= 3
    assert got.dtype is torch.float64 and same(got, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_random_splits_give_the_bits_of_the_whole_batch(monkeypatch, threads):
    """Random 1-D to 3-D convolutions (groups, strides, paddings, dilations, bias or
    not) that batched64 splits, at runs of one to three samples' buffers."""
    rng = random.Random(threads)
    split = 0
    while split < 24:
        d = rng.choice([1, 2, 2, 3])
        groups = rng.choice([1, 1, 2])
        c, oc = groups * rng.randint(1, 12), groups * rng.randint(1, 8)
        k = [rng.randint(1, 3) for _ in range(d)]
        sp = [rng.randint(3, 16 if d < 3 else 6) for _ in range(d)]
        x = torch.randn(rng.randint(3, 7), c, *sp)
        w = torch.randn(oc, c // groups, *k)
        b = torch.randn(oc) if rng.random() < 0.5 else None
        args = (x, w, b, [rng.randint(1, 2) for _ in range(d)],
                [rng.randint(0, 2) for _ in range(d)], [rng.randint(1, 2) for _ in range(d)],
                False, [0] * d, groups)
        try:
            want = _whole64(args)
        except RuntimeError:  # (no output: the kernel larger than the padded input)
            continue
        if not D.sample_column_bytes(x, w, args[3], args[4], args[5], groups):
            continue  # (not split: another test checks the refusal)
        got, want, sizes = _split64(monkeypatch, args, rng.randint(1, 3), threads)
        if got is None:
            continue  # (too few samples for runs of two)
        split += 1
        assert sum(sizes) == x.shape[0] and len(sizes) >= 2
        assert same(got, want), (args[3:], x.shape, w.shape)


def test_sample_runs():
    assert D.sample_runs(4, 10, 100, 1) == [4]  # fits
    assert D.sample_runs(4, 10, 0, 1) == [4]  # splitting off
    assert D.sample_runs(1, 10, 5, 1) == [1]
    assert D.sample_runs(7, 10, 20, 1) == [2, 2, 2, 1]
    assert D.sample_runs(7, 10, 20, 2) == [3, 2, 2]  # at least two samples a run
    assert D.sample_runs(5, 10, 10, 1) == [1] * 5
    assert D.sample_runs(3, 10, 10, 2) == [3]  # no run of two or more fits twice
    assert D.sample_runs(4, 13_271_040, 32 << 20, 2) == [2, 2]  # brain's 24-channel layer


def test_batched64_declines():
    x, w = torch.randn(4, 3, 8, 8), torch.randn(5, 3, 3, 3)
    base = [x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]

    def args(**kw):
        a = list(base)
        for i, v in kw.items():
            a[int(i[1:])] = v
        return tuple(a)

    D.COLUMN_BYTES, old = 1, D.COLUMN_BYTES
    try:
        assert D.batched64(CONV, args()) is not None  # (splits: 3·8·8·8 = 1536 bytes a sample)
        odd = torch.randn(4, 3, 7, 7)  # (a sample's input 3·7·7·8 = 1176 bytes: 64 ∤ 1176)
        assert D.batched64(CONV, args(a0=odd)) is None  # a run would move the samples
        assert D.batched64(CONV, args(a6=True)) is None  # transposed
        assert D.batched64(CONV, args(a0=x.double(), a1=w)) is None  # mixed dtypes
        assert D.batched64(CONV, args(a0=x.to(memory_format=torch.channels_last))) is None
        one = [x, torch.randn(5, 3, 1, 1), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1]
        assert D.batched64(CONV, tuple(one)) is None  # a 1 × 1 kernel takes no buffer
    finally:
        D.COLUMN_BYTES = old
    assert D.batched64(CONV, args()) is None  # 4 × 3·9·64·8 bytes: below the limit


@pytest.mark.parametrize("mode", ["sr", "ud", "up"])
def test_fuzzy_op_granularity_same_bits_with_and_without_the_split(monkeypatch, mode):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 3, stride=2))
    x = torch.randn(6, 3, 10, 10)
    calls = count_calls(monkeypatch, D, "batched64")
    results = {}
    for limit in (1, 0):  # split into runs of samples; never split
        monkeypatch.setattr(D, "COLUMN_BYTES", limit)
        with torch.no_grad(), fuzzy(mode=mode, granularity="op", seed=5) as fz:
            out = net(x)
            results[limit] = (out, fz.stream.counter, fz.report().to_dict())
    assert len(calls) == 4  # (both layers, twice; the first two split)
    split, whole = results[1], results[0]
    assert same(split[0], whole[0])
    assert split[1] == whole[1] and split[2] == whole[2]
