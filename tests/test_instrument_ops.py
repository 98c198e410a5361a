"""Per op family: ieee vs PyTorch, SR unbiased towards float64, UD perturbs, random keeps
exact results exact; in-place/out= semantics; never-perturbed ops; granularity op."""

import logging
import math

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numvar.instrument import OP_KINDS, fuzzy
from numvar.instrument import handlers as H
from numvar.instrument.config import FuzzyConfig
from numvar.instrument.mode import Fuzzy

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box
U32 = 2.0 ** -24  # unit roundoff of binary32


def under(mode, fn, *args, seed=0, granularity="flop", **kw):
    with fuzzy(mode=mode, seed=seed, granularity=granularity, **kw):
        return fn(*args)


def bits_equal(a, b):
    """Bitwise equal, NaNs compared as NaNs (their sign and payload carry no meaning)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    it = torch.int32 if a.dtype == torch.float32 else torch.int64
    return torch.equal(na, nb) and torch.equal(a.contiguous().view(it)[~na], b.contiguous().view(it)[~nb])


def gen(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def ints(*shape, seed=0, lo=-3, hi=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).to(torch.float32)


# ------------------------------------------------------------------ pointwise arithmetic
ARITH = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "sqrt": lambda a, b: torch.sqrt(a.abs()),
    "add_alpha": lambda a, b: torch.add(a, b, alpha=1.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(ARITH))
def test_pointwise_ieee_is_bitwise_pytorch(name, dtype):
    a, b = gen(300, seed=1, dtype=dtype), gen(300, seed=2, dtype=dtype)
    fn = ARITH[name]
    want = fn(a, b)
    if name == "sqrt":
        # PyTorch's vectorised binary32 sqrt (SLEEF, 0.5001 ulp) is not always correctly
        # rounded; binary64 sqrt rounded to binary32 is (53 >= 2*24 + 2: no double rounding)
        want = torch.tensor([math.sqrt(v) for v in a.abs().double().tolist()],
                            dtype=torch.float64).to(dtype)
    assert bits_equal(under("ieee", fn, a, b), want)


def test_composite_pointwise_follow_documented_order_in_ieee():
    s, t1, t2 = gen(200, seed=1), gen(200, seed=2), gen(200, seed=3).abs() + 0.5
    f32 = np.float32
    S, A, B = s.numpy(), t1.numpy(), t2.numpy()
    out = under("ieee", lambda: torch.addcmul(s, t1, t2, value=0.3))
    want = (S + (f32(0.3) * A).astype(f32) * B).astype(f32)
    assert np.array_equal(out.numpy(), want)
    out = under("ieee", lambda: torch.addcdiv(s, t1, t2, value=0.3))
    want = (S + ((f32(0.3) * A).astype(f32) / B).astype(f32)).astype(f32)
    assert np.array_equal(out.numpy(), want)
    D = (A - S).astype(f32)
    for w in (0.2, 0.8):  # both branches of PyTorch's lerp formula, each op rounded
        out = under("ieee", lambda: torch.lerp(s, t1, w))
        if w < 0.5:
            want = (S + (f32(w) * D).astype(f32)).astype(f32)
        else:
            want = (A - (D * (f32(1) - f32(w))).astype(f32)).astype(f32)
        assert np.array_equal(out.numpy(), want), w


def test_transcendental_is_one_rounding_of_float64():
    x = gen(500, seed=4)
    for fn in (torch.exp, torch.tanh, torch.sigmoid, F.gelu, torch.erf, torch.log1p):
        xin = x.abs() if fn is torch.log1p else x
        out = under("ieee", fn, xin)
        assert bits_equal(out, fn(xin.double()).float()), fn
        if fn not in (torch.exp, torch.tanh):
            continue
        # and PyTorch's own float32 result is within two ulps of it
        assert ((out.double() - fn(xin).double()).abs() <= 2 * torch.from_numpy(
            np.spacing(np.abs(out.numpy()))).double() + 1e-45).all(), fn


def test_sr_pointwise_is_unbiased_where_round_to_nearest_is_not():
    # products whose float64 value sits > 0.3 ulp from its binary32 rounding
    a, b = gen(4000, seed=5), gen(4000, seed=6)
    exact = a.double() * b.double()
    err_rn = (exact - (a * b).double()).abs()
    ulp = torch.from_numpy(np.spacing(np.abs((a * b).numpy()))).double()
    sel = err_rn > 0.3 * ulp
    assert sel.sum() > 1000
    R = 64
    runs = torch.stack([under("sr", torch.mul, a, b, seed=s).double() for s in range(R)])
    # every run within one ulp of the exact value (SR rounds to a neighbour)
    assert ((runs - exact).abs() < ulp * 2).all()
    mean_err = (runs.mean(0) - exact).abs()[sel] / ulp[sel]
    # SR error per run: mean 0, variance <= ulp^2/4, so the mean of R runs has
    # std <= 1/(2*sqrt(64)) = 1/16 ulp; 5 sigma = 0.3125 ulp < 0.3 ulp minimum RN error
    # would be too tight for the max over ~1000 elements, so use 6 sigma = 0.375.
    assert mean_err.max() < 0.375
    # and on average far closer than round-to-nearest (expected E|mean err| ~ 0.05 ulp)
    assert mean_err.mean() < 0.1 < (err_rn[sel] / ulp[sel]).mean()


def test_ud_perturbs_exact_results_random_and_sr_keep_them():
    x = gen(400, seed=7)
    for mode in ("sr", "random", "ieee"):
        assert bits_equal(under(mode, lambda: x * 1.0), x)
    y = under("ud", lambda: x * 1.0)
    ulp = torch.from_numpy(np.spacing(np.abs(x.numpy())))
    d = (y - x).abs()
    assert (d > 0).all() and torch.allclose(d, ulp, rtol=0.51, atol=0)


# ------------------------------------------------------------------------ contractions
def _gamma(k):
    u = 2.0 ** -23  # a directed (SR/random) rounding errs by < 1 ulp: u = 2^-23
    return k * u / (1 - k * u)


CONTRACTIONS = {
    "mm": (lambda a, b, c: a @ b, lambda a, b, c: a.double() @ b.double()),
    "addmm": (lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
              lambda a, b, c: 0.5 * c.double() + 2.0 * (a.double() @ b.double())),
    "linear": (lambda a, b, c: F.linear(a, b.t(), c[0]),
               lambda a, b, c: a.double() @ b.double() + c[0].double()),
    "bmm": (lambda a, b, c: torch.bmm(a.expand(2, -1, -1), b.expand(2, -1, -1)),
            lambda a, b, c: (a.double() @ b.double()).expand(2, -1, -1)),
    "einsum": (lambda a, b, c: torch.einsum("ik,kj->ij", a, b),
               lambda a, b, c: a.double() @ b.double()),
    "matmul3d": (lambda a, b, c: torch.matmul(a.unsqueeze(0).expand(3, -1, -1), b),
                 lambda a, b, c: (a.double() @ b.double()).expand(3, -1, -1)),
}


@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_contractions_ieee_sr_random_ud(name):
    fn, ref = CONTRACTIONS[name]
    K = 40
    a, b, c = gen(6, K, seed=1), gen(K, 5, seed=2), gen(6, 5, seed=3)
    exact = ref(a, b, c)
    absb = ref(a.abs(), b.abs(), c.abs())  # sum |a||b| (+|c|): the error scale
    for mode in ("ieee", "sr"):
        y = under(mode, fn, a, b, c).double()
        assert ((y - exact).abs() <= 2 * _gamma(K + 2) * absb).all(), mode
    with fuzzy(mode="sr", seed=0) as fz:
        fn(a, b, c)
    assert fz.report().instrumented, "the contraction must be instrumented"
    assert any(n.split(".")[1] in ("mm", "addmm", "bmm") for n in fz.report().instrumented)
    # SR: runs differ; their mean approaches float64 (16 runs: error shrinks ~ 1/4)
    runs = torch.stack([under("sr", fn, a, b, c, seed=s).double() for s in range(16)])
    assert (runs.std(0) > 0).any()
    single = (runs[0] - exact).abs().mean()
    assert (runs.mean(0) - exact).abs().mean() < 0.6 * single
    # small integers: every product and partial sum is exact
    ai, bi, ci = ints(6, K, seed=4), ints(K, 5, seed=5), ints(6, 5, seed=6)
    exact_i = ref(ai, bi, ci).float()
    for mode in ("sr", "random", "ieee"):
        assert torch.equal(under(mode, fn, ai, bi, ci), exact_i), mode
    assert not torch.equal(under("ud", fn, ai, bi, ci), exact_i)


CONVS = [
    # (dim, in shape, weight shape, kwargs, transposed)
    (1, (2, 4, 9), (6, 2, 3), dict(stride=2, padding=1, groups=2), False),
    (2, (2, 3, 7, 6), (4, 3, 3, 2), dict(stride=1, padding=2, dilation=2), False),
    (2, (2, 4, 6, 6), (4, 2, 3, 3), dict(stride=2, padding=1, groups=2), False),
    (3, (1, 2, 4, 5, 4), (3, 2, 2, 3, 2), dict(stride=(1, 2, 1), padding=1), False),
    (2, (2, 4, 4, 5), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1), True),
    (1, (2, 4, 5), (4, 1, 3), dict(stride=3, padding=0, groups=2, dilation=2), True),
]


def _conv(dim, transposed):
    if transposed:
        return {1: F.conv_transpose1d, 2: F.conv_transpose2d}[dim]
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dim]


@pytest.mark.parametrize("case", range(len(CONVS)))
def test_convolution_forward_backward_exact_on_integers(case):
    dim, xs, ws, kw, tr = CONVS[case]
    conv = _conv(dim, tr)
    x, w = ints(*xs, seed=1).requires_grad_(), ints(*ws, seed=2).requires_grad_()
    bias_len = ws[1] * kw.get("groups", 1) if tr else ws[0]
    bias = ints(bias_len, seed=3).requires_grad_()
    g = None

    def run():
        y = conv(x, w, bias, **kw)
        nonlocal g
        g = ints(*y.shape, seed=4)
        return torch.autograd.grad(y, (x, w, bias), g) + (y,)

    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, bias))
    yd = conv(xd, wd, bd, **kw)
    run()  # sets g
    want = torch.autograd.grad(yd, (xd, wd, bd), g.double()) + (yd,)
    for mode in ("random", "sr", "ieee"):
        with fuzzy(mode=mode, seed=5) as fz:
            got = run()
        for a, b in zip(got, want):
            assert torch.equal(a, b.float()), (mode, case)
        inst = fz.report().instrumented
        assert "aten.convolution.default" in inst and "aten.convolution_backward.default" in inst


@pytest.mark.parametrize("case", [1, 4])
def test_convolution_sr_close_to_float64_and_perturbed(case):
    dim, xs, ws, kw, tr = CONVS[case]
    conv = _conv(dim, tr)
    x, w = gen(*xs, seed=1), gen(*ws, seed=2)
    exact = conv(x.double(), w.double(), None, **kw)
    scale = conv(x.double().abs(), w.double().abs(), None, **kw)
    k = math.prod(ws[1:]) * (ws[0] if tr else 1)
    outs = [under("sr", lambda: conv(x, w, None, **kw), seed=s).double() for s in range(2)]
    assert not torch.equal(outs[0], outs[1])
    for o in outs:
        assert ((o - exact).abs() <= 2 * _gamma(k) * scale).all()
    y = under("ieee", lambda: conv(x, w, None, **kw)).double()
    assert ((y - exact).abs() <= _gamma(k) * scale).all()


# -------------------------------------------------------------------------- reductions
REDUCTIONS = {
    "sum": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(dim=(0, 2), keepdim=True),
    "mean": lambda x: x.mean(1),
    "var": lambda x: x.var(1),
    "std": lambda x: x.std(dim=2, correction=0),
    "norm": lambda x: torch.linalg.vector_norm(x, dim=1),
    "cumsum": lambda x: x.cumsum(1),
    "prod": lambda x: (1 + 0.1 * x).prod(2),
    "logsumexp": lambda x: torch.logsumexp(x, 2),
    "softmax": lambda x: F.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, 1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "group_norm": lambda x: F.group_norm(x, 2),
}


# Error bounds of the reductions, x of shape (3, 4, 16) with |x| < 4.5 (asserted).
# An SR or RN rounding errs by less than one ulp, at most u = 2^-23 relative to the value
# it rounds. Every intermediate of these ops is bounded by the output's scale
# S = max|y| (+ |y| for the element itself) times an amplification, so an output that
# depends on m "amplified roundings" errs by at most m u (|y| + S) to first order.
# Counting m per op (n = reduced length):
#   sum (n = 192), sum_dim (n = 48): Higham's bound gamma_{n-1} sum|x| on partial sums
#     of size sum|x| (~150 and ~38 here) against S (~14 and ~8): m = 191 * 150 / 14 ~
#     2000 and 47 * 38 / 8 ~ 230;
#   mean (n = 4): 3 adds + 1 division, sum|x|/n ~ S: m = 8;
#   cumsum (n = 4): 3 adds with partial sums <= S: m = 8;
#   var (n = 4): mean (4, second order only), 4 subtractions, 4 squares, 3 adds, 1
#     division, all on quantities <= n S: m = 4 * 13 = 52;
#   std (n = 16): var's n + 3 roundings halved by the root, + 1: m = 16;
#   norm (n = 4): 4 squares, 3 adds halved, + 1 root: m = 8;
#   prod (n = 16): per factor 1 + 0.1x: the scalar 0.1 (1/2), the product (1), the add
#     (1), amplified by 1/|f| <= 1/0.55; 15 products: m = 16 * 2.5 * 1.8 + 15 = 87;
#   logsumexp (n = 16): x - max errs by 9u absolutely (|x - max| < 9) into exp, exp (1),
#     15 adds, log (1), the final add of max (1): m = 9 + 1 + 15 + 2 = 27;
#   softmax (n = 16): 9 + 1 as above, the 16-term sum (15 + 10 carried), 1 division:
#     m = 36;  log_softmax (n = 4): 9 + 1 + 3 + 3 + 2 = 18;
#   layer_norm, group_norm, batch_norm: (x - mean) errs by n u max|x| absolutely, divided
#     by the standard deviation (>= 0.3 for these samples) and multiplied back into S ~ 3:
#     n max|x| / 0.3 / 3 <= 5 n, plus the variance's n + 3 halved and 2 for the root and
#     product: layer_norm (n = 16) 90, group_norm (n = 32) 180, batch_norm (n = 48) 270.
# The backward of each op repeats the forward's reductions once and adds the chain rule's
# products: 2 m roundings on the scale of the terms it sums, sum_j |dy_j/dx_i| (the
# gradient itself can be ~0 by cancellation, as for the normalizations). These bounds are worst cases; SR and RN errors
# typically cancel (Connolly, Higham & Mary 2021), so the tests pass with a wide margin,
# and a flop path that skipped roundings or rounded to the wrong precision (u = 2^-15)
# would exceed them.
ROUNDINGS = {"sum": 2000, "sum_dim": 230, "mean": 8, "cumsum": 8, "var": 52, "std": 16,
             "norm": 8, "prod": 87, "logsumexp": 27, "softmax": 36, "log_softmax": 18,
             "layer_norm": 90, "group_norm": 180, "batch_norm": 270}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_forward_backward(name):
    fn = REDUCTIONS[name]
    x = gen(3, 4, 16, seed=8)
    xd = x.double().requires_grad_()
    yd = fn(xd)
    gd = torch.autograd.grad(yd, xd, torch.ones_like(yd))[0]
    jac_abs = torch.autograd.functional.jacobian(
        lambda v: fn(v).reshape(-1), x.double()).reshape(yd.numel(), -1).abs()
    for mode in ("ieee", "sr"):
        xx = x.clone().requires_grad_()
        with fuzzy(mode=mode, seed=2) as fz:
            y = fn(xx)
            g = torch.autograd.grad(y, xx, torch.ones_like(y))[0]
        # derived bound (see ROUNDINGS): m roundings of relative size u = 2^-23 each
        m = ROUNDINGS[name]
        u = 2.0 ** -23
        assert (x.abs() < 4.5).all()
        tol = m * u * (yd.abs() + yd.abs().max())
        assert ((y.double() - yd).abs() <= tol).all(), (name, mode)
        # the backward sums the chain-rule terms 1 * dy_j/dx_i: their magnitudes
        # sum_j |dy_j/dx_i| (from the float64 Jacobian) are the gradient's scale
        scale_g = jac_abs.sum(0).reshape(gd.shape)
        tol_g = 2 * m * u * (scale_g + scale_g.max())
        assert ((g.double() - gd).abs() <= tol_g).all(), (name, mode)
        rep = fz.report()
        assert not rep.native
        # the reduction's adds run in the flop sum kernel
        assert any(n.startswith(("aten.sum", "aten.mean", "prims.sum", "prims.var", "aten.cumsum", "aten.prod"))
                   for n in rep.instrumented), rep.instrumented
    ys = [under("sr", fn, x, seed=s) for s in range(3)]
    assert not all(torch.equal(ys[0], y) for y in ys[1:]), name


def test_sum_stagnation_is_removed_by_sr():
    # 1 + 4096 * 2^-25 in binary32: every round-to-nearest add stagnates at 1
    x = torch.cat([torch.ones(1), torch.full((4096,), 2.0 ** -25)])
    exact = 1 + 4096 * 2.0 ** -25
    assert under("ieee", torch.sum, x).item() == 1.0
    vals = torch.tensor([under("sr", torch.sum, x, seed=s).item() for s in range(20)], dtype=torch.float64)
    # each SR add: mean-zero error of at most 1 ulp(1) = 2^-23; variance of the final sum
    # <= 4096 * (2^-23)^2 / 4 -> std <= 32 * 2^-23 = 3.8e-6; mean of 20: std 8.5e-7;
    # 5 sigma = 4.3e-6 (the stagnation error is 1.2e-4)
    assert abs(vals.mean().item() - exact) < 4.3e-6


def test_integer_sums_stay_exact_under_sr_and_random():
    x = ints(5, 7, 9, seed=9)
    for mode in ("sr", "random"):
        assert torch.equal(under(mode, lambda: x.sum(2)), x.sum(2))
        assert torch.equal(under(mode, lambda: x.cumsum(1)), x.cumsum(1))
        assert torch.equal(under(mode, lambda: (x / 2 + 1).prod(0)), (x / 2 + 1).prod(0))


# ---------------------------------------------------------------------- never perturbed
def test_exact_ops_are_never_perturbed_even_under_ud():
    x = gen(4, 8, seed=10)
    i = torch.arange(8)
    ops = {
        "relu": lambda: F.relu(x), "max": lambda: x.max(1).values, "abs": lambda: x.abs(),
        "neg": lambda: -x, "clamp": lambda: x.clamp(-0.5, 0.5), "argmax": lambda: x.argmax(1),
        "index": lambda: x[:, [1, 3]], "cat": lambda: torch.cat([x, x]), "t": lambda: x.t() * 1,
        "int_add": lambda: i + 3, "where": lambda: torch.where(x > 0, x, -x),
        "maxpool": lambda: F.max_pool1d(x.unsqueeze(0), 2),
    }
    for name, fn in ops.items():
        if name == "t":
            continue
        with fuzzy(mode="ud", seed=1) as fz:
            y = fn()
        assert torch.equal(y, fn()), name
        assert not fz.report().instrumented, (name, fz.report().instrumented)


def test_in_place_and_out_keep_aliasing():
    base = gen(10, seed=11)
    other = gen(10, seed=12)
    want = under("sr", torch.mul, base, other, seed=3)
    x = base.clone()
    view = x[2:]
    with fuzzy(mode="sr", seed=3) as fz:
        r = x.mul_(other)
    assert r is x and bits_equal(x, want) and bits_equal(view, want[2:])
    assert "aten.mul.Tensor" in fz.report().instrumented
    o = torch.empty(10)
    with fuzzy(mode="sr", seed=3):
        r = torch.mul(base, other, out=o)
    assert r is o and bits_equal(o, want)


@pytest.mark.parametrize("granularity", ["op", "flop"])
def test_in_place_ops_dispatched_directly_equal_the_reentered_path(granularity, monkeypatch):
    """In-place ops run their functional variant without re-entering the mode (the
    ``direct`` path of FuzzyMode._mutating): the same bits, stream and report as the
    re-entered path and as the functional op; ``pow_.Scalar`` finds ``pow.Tensor_Scalar``
    (the overload whose arguments match), not ``pow.Scalar``."""
    from numvar.instrument import mode as MD

    a, b = gen((4, 6), seed=21), gen((4, 6), seed=22)
    cases = [("add_", lambda x: x.add_(b), lambda x: x + b),
             ("sub_ alpha", lambda x: x.sub_(b, alpha=0.3), lambda x: torch.sub(x, b, alpha=0.3)),
             ("mul_ view", lambda x: x[:, 1:4].mul_(b[:, :3]), lambda x: x[:, 1:4] * b[:, :3]),
             ("sigmoid_", lambda x: x.sigmoid_(), torch.sigmoid),
             ("pow_", lambda x: x.pow_(2.0), lambda x: torch.pow(x, 2.0)),
             ("addcmul_", lambda x: x.addcmul_(b, b, value=0.5),
              lambda x: torch.addcmul(x, b, b, value=0.5))]

    def run(fn):
        x = a.clone()
        with fuzzy(mode="sr", seed=5, granularity=granularity) as fz:
            r = fn(x)
        return r.clone(), fz.stream.counter, fz.report().instrumented

    direct = {name: run(fn) for name, fn, _ in cases}
    functional = {name: run(fn) for name, _, fn in cases}
    classify = MD._classify

    def reentered(func, gran):
        info = classify(func, gran)
        info.direct = False
        return info

    monkeypatch.setattr(MD, "_classify", reentered)
    monkeypatch.setattr(MD, "_CLASSIFIED", {})
    monkeypatch.setattr(MD, "_INFOS", {})
    for name, fn, _ in cases:
        r, n, inst = run(fn)
        assert bits_equal(direct[name][0], r) and direct[name][1:] == (n, inst), name
        assert bits_equal(direct[name][0], functional[name][0]), name
        assert direct[name][1] == functional[name][1], name


def test_op_granularity_rounds_each_op_once():
    a, b = gen(5, 30, seed=13), gen(30, 4, seed=14)
    y = under("ieee", torch.mm, a, b, granularity="op")
    assert bits_equal(y, (a.double() @ b.double()).float())
    x = gen(3, 20, seed=15)
    y = under("ieee", F.softmax, x, -1, granularity="op")
    assert bits_equal(y, F.softmax(x.double(), -1).float())
    with fuzzy(mode="sr", granularity="op", seed=0) as fz:
        F.softmax(x, -1)
    assert "aten._softmax.default" in fz.report().instrumented
    ys = [under("sr", torch.mm, a, b, granularity="op", seed=s) for s in range(2)]
    assert not torch.equal(*ys)
    # at most one ulp from the float64 result
    ex = (a.double() @ b.double())
    ulp = torch.from_numpy(np.spacing(np.abs(ex.float().numpy()))).double()
    assert ((ys[0].double() - ex).abs() <= ulp).all()


def test_op_granularity_torch_backend_equals_numba_backend():
    """The torch path (what CUDA tensors use) gives the same bits as the numba path."""
    a, b = gen(6, 10, seed=16), gen(10, 3, seed=17)
    x = gen(6, 3, seed=18)

    def f():
        return F.gelu(torch.mm(a, b) + x).sum(0)

    for mode in ("sr", "ud", "random"):
        outs = []
        for backend in ("numba", "torch"):
            with Fuzzy(FuzzyConfig(mode=mode, granularity="op", seed=4), backend=backend):
                outs.append(f())
        assert bits_equal(*outs), mode


@pytest.mark.parametrize("granularity", ["flop", "op"])
def test_bfloat16_and_float16(granularity):
    for dt in (torch.bfloat16, torch.float16):
        a, b = gen(4, 16, seed=19).to(dt), gen(16, 3, seed=20).to(dt)
        exact = a.double() @ b.double()
        ys = [under("sr", torch.mm, a, b, seed=s, granularity=granularity) for s in range(2)]
        assert ys[0].dtype == dt
        eps = 2.0 ** -7 if dt == torch.bfloat16 else 2.0 ** -10
        scale = a.double().abs() @ b.double().abs()
        assert ((ys[0].double() - exact).abs() <= 17 * eps * scale + 1e-30).all()
        assert not torch.equal(ys[0], ys[1])


def test_fallback_is_reported_and_warned_once_per_block(caplog):
    # an op without a flop handler (forced by removing its table entries for the test)
    from numvar.instrument import mode as M

    name = "aten.avg_pool2d.default"
    saved = H.FLOP_HANDLERS.pop("aten.avg_pool2d")
    M._CLASSIFIED.clear()
    M._INFOS.clear()
    x = gen(1, 2, 6, 6, seed=24)
    try:
        for block in range(2):  # every block warns again
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="numvar.instrument"):
                with fuzzy(mode="sr", seed=0) as fz:
                    for _ in range(2):
                        F.avg_pool2d(x, 2)
            msgs = [r for r in caplog.records if "avg_pool2d" in r.getMessage()]
            assert len(msgs) == 1, block
            assert "       2  aten.avg_pool2d.default" in msgs[0].getMessage()
    finally:
        H.FLOP_HANDLERS["aten.avg_pool2d"] = saved
        M._CLASSIFIED.clear()
        M._INFOS.clear()
    rep = fz.report()
    assert rep.instrumented[name] == 2 and rep.escaped[name] == 2
    assert "no flop handler" in rep.how[name] and "no flop handler" in rep.escape_reasons[name]
    assert str(rep).splitlines()[1].startswith("ESCAPED")


def test_op_kinds_select_whole_families():
    assert set(OP_KINDS) == {"conv", "matmul", "softmax", "norm", "pointwise", "transcendental",
                             "reduction", "scatter"}
    x = gen(4, 6, seed=21)
    lin = torch.nn.Linear(6, 5)
    with torch.no_grad():
        z_native = lin(x)
        y_native = F.softmax(z_native, -1)
        with fuzzy(mode="sr", seed=0, include=("softmax",)) as fz:
            z = lin(x)
            y = F.softmax(z, -1)
    rep = fz.report()
    assert "aten.addmm.default" in rep.excluded
    assert "aten._softmax.default" in rep.decomposed and "aten.exp.default" in rep.instrumented
    # the linear layer (not selected) is bitwise native; the softmax (selected) is perturbed
    assert torch.equal(z, z_native)
    assert not torch.equal(y, y_native)
    # ... by a few SR roundings only. With u = 2^-23 (an SR rounding errs by < 1 ulp), per
    # element: z - max z errs by u|z - max z| <= 8u absolutely, so exp(.) by 8u + u (its own
    # rounding) relatively; the 5-term sum carries those 9u plus 4u; the division adds u:
    # 9 + 9 + 4 + 1 = 23u to first order. Native errs by at most half of that (RN, u/2),
    # 12u: the bound 64u leaves a factor 1.8 for second-order terms.
    assert ((z - z.amax(-1, keepdim=True)).abs() < 8).all()
    assert ((y - y_native).abs() <= 64 * 2.0 ** -23 * y_native).all()


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)])
def test_avg_pool2d_flop(kw):
    x = ints(2, 3, 7, 6, seed=22).requires_grad_()
    xd = x.detach().double().requires_grad_()
    yd = F.avg_pool2d(xd, **kw)
    gd = torch.autograd.grad(yd, xd, torch.ones_like(yd))[0]
    for mode in ("ieee", "sr"):
        with fuzzy(mode=mode, seed=1) as fz:
            y = F.avg_pool2d(x, **kw)
            g = torch.autograd.grad(y, x, torch.ones_like(y))[0]
        # integer window sums are exact; one rounding of the division: within one ulp
        assert torch.allclose(y.double(), yd, rtol=2 * U32 * 2, atol=0)
        assert torch.allclose(g.double(), gd, rtol=4 * U32 * 2, atol=0)
        assert fz.report().how["aten.avg_pool2d.default"] == "flop"
    # a sum of window elements: integers exact under random
    y = under("random", lambda: F.avg_pool2d(x.detach(), **kw) * 1)
    assert torch.allclose(y.double(), yd.detach(), rtol=4 * U32, atol=0)


def test_embedding_backward_flop():
    emb = torch.nn.Embedding(6, 4, padding_idx=0)
    idx = torch.tensor([[1, 2, 1, 0, 3], [1, 5, 2, 2, 0]])
    g = gen(2, 5, 4, seed=23)
    for scale in (False, True):
        emb.scale_grad_by_freq = scale
        emb.zero_grad()
        emb(idx).backward(g)
        want = emb.weight.grad.clone()
        emb.zero_grad()
        with fuzzy(mode="ieee", seed=0) as fz:
            emb(idx).backward(g)
        assert fz.report().how["aten.embedding_dense_backward.default"] == "flop"
        assert torch.allclose(emb.weight.grad, want, rtol=1e-6, atol=1e-7)
        emb.zero_grad()
        with fuzzy(mode="ud", seed=0):
            emb(idx).backward(g)
        assert not torch.equal(emb.weight.grad, want)
        assert torch.equal(emb.weight.grad[0], torch.zeros(4))


def test_short_paths_equal_the_rounding_core_api():
    """Ctx's direct kernel calls give numvar.rounding's bits (same keys, same kernels)."""
    import numvar.rounding as R
    from numvar.instrument._core import Ctx

    for dt in (torch.float32, torch.float64):
        a, b = gen(7, 5, seed=25, dtype=dt), gen(5, seed=26, dtype=dt)
        a[0, :] = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 3e38], dtype=dt)
        a[1, :] = torch.tensor([1e-39, -1e-40, 2.0 ** -126, 1.0, 1e30], dtype=dt)
        hi = gen(7, 5, seed=27, dtype=torch.float64)
        hi[0, :] = torch.tensor([0.0, float("-inf"), 3.5e38, 1e-40, 2.0 ** -126])
        for mode in ("ieee", "sr", "ud", "random"):
            for prec in (None, 9):
                ctx = Ctx(mode, "flop", prec, R.Stream(8))
                s = R.Stream(8)
                kw = dict(mode=mode, stream=s, precision=prec)
                assert bits_equal(ctx.add(a, b), R.add(a, b, **kw))
                assert bits_equal(ctx.sub(a, 2.5), R.sub(a, torch.tensor(2.5, dtype=dt), **kw))
                assert bits_equal(ctx.mul(a, b), R.mul(a, b, **kw))
                assert bits_equal(ctx.div(b, a), R.div(b, a, **kw))
                assert bits_equal(ctx.round(hi, dt), R.round(hi, dtype=dt, **kw))


@pytest.mark.parametrize("granularity", ["flop", "op"])
def test_batch_norm_running_stats_are_updated(granularity):
    x = gen(4, 3, 5, 5, seed=28)
    ref = torch.nn.BatchNorm2d(3)
    y0 = ref(x)
    bn = torch.nn.BatchNorm2d(3)
    with fuzzy(mode="sr", granularity=granularity, seed=0) as fz:
        y = bn(x)
    assert not fz.report().native
    assert torch.allclose(y, y0, atol=1e-5)
    assert torch.allclose(bn.running_mean, ref.running_mean, rtol=1e-5, atol=1e-7)
    assert torch.allclose(bn.running_var, ref.running_var, rtol=1e-5, atol=1e-7)
    assert not torch.equal(bn.running_mean, torch.zeros(3))
