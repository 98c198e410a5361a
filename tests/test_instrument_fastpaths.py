"""Short paths of the dispatch against the generic paths they stand for, bit for bit:
op_once without argument flattening (and its unary short path), _safe_softmax at op granularity, the result-dtype
short cut of the pointwise handlers, Python numbers in binary32 arithmetic."""

import math

import numba
import numpy as np
import pytest
import torch

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box

import numvar.rounding as R
from numvar.instrument import handlers as H
from numvar.instrument._core import Ctx, operands, result_dtype
from _bitwise import same  # noqa: E402

MODES = ("ieee", "sr", "ud", "random")
aten = torch.ops.aten


_same = same


def _gen(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * 3).to(dtype)


def _generic_op_once(monkeypatch):
    """op_once with every argument list flattened and dtype arguments looked for (its
    general path)."""
    real = H._static

    def flattening(func):
        writes, _, _ = real(func)
        return writes, True, True

    monkeypatch.setattr(H, "_static", flattening)


def _calls(dt):
    x, w, b = _gen(4, 5, 6, seed=1, dtype=dt), _gen(6, seed=2, dtype=dt), _gen(6, seed=3, dtype=dt)
    m1, m2 = _gen(7, 6, seed=4, dtype=dt), _gen(6, 3, seed=5, dtype=dt)
    bn_x = _gen(3, 4, 5, 5, seed=6, dtype=dt)
    return [
        (aten.exp.default, (x,), {}),            # unary: op_once's short path
        (aten.sigmoid.default, (x.transpose(0, 2),), {}),
        (aten.silu.default, (_gen((), seed=11, dtype=dt),), {}),
        (aten.tanh.default, (_gen(0, 3, dtype=dt),), {}),
        (aten.frexp.Tensor, (x,), {}),           # a float and an integer output
        (aten.isnan.default, (x,), {}),          # no float output
        (aten.addmm.default, (_gen(3, seed=7, dtype=dt), m1, m2), {"beta": 0.5, "alpha": 2}),
        (aten.addmm.default, (_gen(3, seed=7), m1, m2), {}),  # mixed dtypes
        (aten.native_layer_norm.default, (x, [6], w, b, 1e-5), {}),
        (aten.native_layer_norm.default, (x, [5, 6], None, None, 1e-5), {}),
        (aten._softmax.default, (x, 1, False), {}),
        (aten._log_softmax.default, (x, -1, False), {}),
        (aten.mean.dim, (x, [0, 2], True), {}),
        (aten.sum.dim_IntList, (x, [1]), {"dtype": torch.float64}),
        (aten.cat.default, ([x, x * 2],), {}),
        (aten.stack.default, ([m1, m1],), {"dim": 1}),
        (aten.pow.Tensor_Scalar, (x, 1.7), {}),
        (aten.gelu.default, (x,), {"approximate": "tanh"}),
        (aten._to_copy.default, (x,), {"dtype": torch.float16}),
        (aten.native_batch_norm.default,
         (bn_x, _gen(4, seed=8, dtype=dt), _gen(4, seed=9, dtype=dt),
          torch.zeros(4, dtype=dt), torch.ones(4, dtype=dt), True, 0.1, 1e-5), {}),
    ]


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_op_once_equals_its_flattening_path(dt, monkeypatch):
    for mode in MODES:
        for prec in (None, 9):
            fast, slow = [], []
            for res, patch in ((fast, False), (slow, True)):
                if patch:
                    _generic_op_once(monkeypatch)
                ctx = Ctx(mode, "op", prec, R.Stream(5))
                for func, args, kwargs in _calls(dt):
                    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
                    out = H.op_once(ctx, func, args, kwargs)
                    res.append((out, [a for a in args if isinstance(a, torch.Tensor)]))
                res.append(ctx.stream.counter)
                monkeypatch.undo()
            assert _same(fast[:-1], slow[:-1]) and fast[-1] == slow[-1], (mode, prec)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_safe_softmax_op_handler_equals_op_once(dt):
    x = _gen(4, 3, 6, seed=10, dtype=dt)
    x[0, 1, :] = -math.inf  # a dead row: 0 everywhere
    x[1, :, 2] = -math.inf  # dead along dim 1
    x[2, 2, 3] = -math.inf
    x[3, 0, :] = torch.tensor([-math.inf, math.nan, -math.inf, 0, 1, 2])  # NaN: not dead
    x[3, 1, 0] = math.inf
    cases = [(x, -1), (x, 1), (x, 0), (x[:, 0], 1), (x.transpose(0, 2), 0),
             (_gen(0, 4, dtype=dt), 1), (_gen((), seed=3, dtype=dt), 0)]
    for mode in MODES:
        for prec in (None, 5):
            for xx, dim in cases:
                c1, c2 = Ctx(mode, "op", prec, R.Stream(2)), Ctx(mode, "op", prec, R.Stream(2))
                got = H._safe_softmax_op(c1, aten._safe_softmax.default, (xx, dim), {})
                want = H.op_once(c2, aten._safe_softmax.default, (xx, dim), {})
                assert _same(got, want), (mode, prec, tuple(xx.shape), dim)
                assert c1.stream.counter == c2.stream.counter
    # the dtype argument takes op_once itself
    c1, c2 = Ctx("sr", "op", None, R.Stream(2)), Ctx("sr", "op", None, R.Stream(2))
    kw = {"dtype": torch.float64}
    assert _same(H._safe_softmax_op(c1, aten._safe_softmax.default, (x, -1), kw),
                 H.op_once(c2, aten._safe_softmax.default, (x, -1), kw))


def test_float_result_short_cut_equals_type_promotion():
    t = {d: torch.ones(2, dtype=d) for d in (torch.float32, torch.float64, torch.float16,
                                              torch.bfloat16, torch.int64, torch.int32,
                                              torch.bool, torch.complex64, torch.uint8)}
    z = {d: torch.ones((), dtype=d) for d in t}
    others = [*t.values(), *z.values(), 1, 2.5, True, 1 + 2j, -0.0]
    for first in [*t.values(), *z.values(), 3, 0.5]:
        for o in others:
            assert H._float_result(first, o) == (result_dtype(first, o) in H.FLOATS), (first, o)
            for o2 in (t[torch.int64], 2.0, z[torch.float64], t[torch.complex64]):
                assert H._float_result(first, o, o2) == (result_dtype(first, o, o2) in H.FLOATS)


@pytest.mark.parametrize("mode", MODES)
def test_python_numbers_take_the_scalar_path_bit_for_bit(mode):
    x = _gen(5, 8, seed=11)
    cases = [x, x.t(), x[:, ::2], x[0, 0], x[:0]]
    nums = [0.5, -3, 1 << 24, -(1 << 24), 1e-45, 2.9e38, -0.0, 1e-40, 7]
    for t in cases:
        for v in nums:
            for op in ("add", "sub", "mul", "div"):
                for left in (True, False):
                    c1 = Ctx(mode, "flop", None, R.Stream(6))
                    c2 = Ctx(mode, "flop", None, R.Stream(6))
                    a, b = (t, v) if left else (v, t)
                    got = getattr(c1, op)(a, b)
                    want = getattr(c2, op)(*operands(a, b))
                    assert _same(got, want), (op, v, left, tuple(t.shape))
                    assert got.is_contiguous()
    assert Ctx(mode, "flop", None, R.Stream(0))._scalar32(x, 0.5)
    for v in (3.1e38, float("inf"), float("nan"), 1 << 25, True, np.float32(0.5)):
        assert not Ctx(mode, "flop", None, R.Stream(0))._scalar32(x, v)


def test_exact_impls_equal_the_ops():
    """Faster implementations of exact ops: same values, dtype, shape, strides, offset."""
    bid = H.EXACT_IMPLS["prims.broadcast_in_dim.default"]
    for shape_in, shape, dims in [((16, 32), [16, 32, 1], [0, 1]), ((16, 32), [16, 32, 5], [0, 1]),
                                  ((1, 32), [4, 32], [0, 1]), ((32,), [4, 32, 3], [1]),
                                  ((), [2, 3], []), ((3, 1), [3, 4, 5], [0, 2]),
                                  ((16, 32), [1, 16, 32], [1, 2])]:
        variants = [_gen(shape_in)]
        if len(shape_in) == 2:
            variants.append(_gen(shape_in[1], shape_in[0], seed=2).t())  # non-contiguous
        for a in variants:
            got = bid(a, shape, dims)
            want = torch.ops.prims.broadcast_in_dim.default(a, shape, dims)
            assert _same(got, want) and got.storage_offset() == want.storage_offset()
            assert got.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    all_dim = H.EXACT_IMPLS["aten.all.dim"]
    g = torch.Generator().manual_seed(1)
    m = torch.rand(4, 5, 6, generator=g) < 0.9
    m[0, 1, :] = True
    for x in (m, m.transpose(0, 2), m[:, ::2], m[..., :1], torch.zeros(0, 3, dtype=torch.bool),
              torch.tensor(True), torch.ones(3, 4), torch.arange(6).reshape(2, 3)):
        for dim in range(-1, max(x.dim(), 1)):
            for keep in (False, True):
                assert _same(all_dim(x, dim, keep), aten.all.dim(x, dim, keep)), (x.shape, dim)

    eq = H.EXACT_IMPLS["aten.eq.Scalar"]
    x = _gen(4, 5, 6, seed=3)
    x[0, 0, :3] = torch.tensor([-math.inf, math.inf, math.nan])
    for t in (x, x.transpose(0, 2), x[:, ::2], x.half(), x.double(), x[0, 0, 0],
              torch.arange(6).reshape(2, 3)):
        for v in (-math.inf, math.inf, 0.0, 1, math.nan):
            assert _same(eq(t, v), aten.eq.Scalar(t, v)), (t.shape, v)


def test_alpha_scaling_of_add_sub_rsub_is_rounded_first():
    """add/sub/rsub with alpha: RND(a ∘ RND(alpha·b)) (rsub: RND(b − RND(alpha·a))), with
    ieee every rounding is binary32 round-to-nearest of the float64 value."""
    from numvar.instrument import fuzzy

    a, b = _gen(50, seed=3), _gen(50, seed=4)
    r32 = lambda t: t.to(torch.float32)  # noqa: E731
    d = lambda t: t.to(torch.float64)  # noqa: E731
    with fuzzy(mode="ieee", seed=0):
        got = (torch.add(a, b, alpha=3.0), torch.sub(a, b, alpha=3.0), torch.rsub(a, b, alpha=3.0))
    want = (r32(d(a) + d(r32(d(b) * 3.0))), r32(d(a) - d(r32(d(b) * 3.0))),
            r32(d(b) - d(r32(d(a) * 3.0))))
    for g, w in zip(got, want):
        assert _same(g, w)


def test_eval_batch_norm_skips_the_identity_write_back_bit_for_bit(monkeypatch):
    """native_batch_norm in eval leaves the running statistics alone: op_once then skips
    their rounded write-back where rounding is the identity (ieee, sr, random at 24 bits)
    and only advances the stream. Outputs, statistics (-0.0, subnormals, NaN, inf kept;
    NaN payloads not compared), the next op's bits and the stream counter match the full
    write-back in every mode and precision, in eval and in training."""
    x = _gen(3, 4, 5, 5, seed=6)
    w, b = _gen(4, seed=8), _gen(4, seed=9)
    rm = torch.tensor([1.5, -0.0, 1e-40, 3.25])
    rv = _gen(4, seed=12).abs() + 0.5
    rm_special = torch.tensor([math.nan, math.inf, -2.0, 0.0])
    for mode in MODES:
        for prec in (None, 9):
            for training in (False, True):
                for mean in (rm, rm_special):
                    res = []
                    for skip in (True, False):
                        monkeypatch.setattr(H, "SKIP_UNWRITTEN_WRITEBACK", skip)
                        ctx = Ctx(mode, "op", prec, R.Stream(5))
                        m, v = mean.clone(), rv.clone()
                        out = H.op_once(ctx, aten.native_batch_norm.default,
                                        (x, w, b, m, v, training, 0.1, 1e-5), {})
                        after = H.op_once(ctx, aten.exp.default, (x,), {})  # the next key
                        res.append((out, after, m, v, ctx.stream.counter))
                    (o1, a1, m1, v1, c1), (o2, a2, m2, v2, c2) = res
                    assert _same((o1, a1, m1, v1), (o2, a2, m2, v2)), (mode, prec, training)
                    assert c1 == c2
                    if not training and prec is None and mode != "ud":  # untouched
                        assert _same(m1, mean) and _same(v1, rv)


def test_binary64_round_to_binary64_equals_the_rounding_api():
    """``Ctx.round`` of a float64 tensor to float64 (op_once's rounding of a binary64 op)
    returns the values themselves, without a kernel call, in the modes that keep exact
    values at 53 bits (ieee, sr, random): the bits of ``numvar.rounding.round`` on the
    same stream (which computes them) for normal, subnormal, signed-zero, infinite and
    NaN values, a new tensor, and the next key alike; ud and a virtual precision go on
    rounding (perturbed values)."""
    hi = _gen(64, seed=21, dtype=torch.float64)
    hi[:6] = torch.tensor([0.0, -0.0, 5e-324, -2.5e-310, math.inf, -math.inf])
    hi[6] = math.nan
    for mode in MODES:
        for prec in (None, 30):
            ctx = Ctx(mode, "flop", prec, R.Stream(7))
            got = ctx.round(hi, torch.float64)
            after = ctx.round(hi * 3, torch.float64)
            st = R.Stream(7)
            want = R.round(hi, dtype=torch.float64, mode=mode, stream=st, precision=prec)
            want_after = R.round(hi * 3, dtype=torch.float64, mode=mode, stream=st,
                                 precision=prec)
            assert _same((got, after), (want, want_after)), (mode, prec)
            assert ctx.stream.counter == st.counter
            assert got.data_ptr() != hi.data_ptr()
            kept = torch.equal(got[7:], hi[7:])
            assert kept == (mode != "ud" and prec is None), (mode, prec)


@pytest.mark.parametrize("mode", MODES + ("up", "down"))
@pytest.mark.parametrize("contraction", ["separate", "fma"])
def test_lean_bmm_equals_the_general_contraction_path(mode, contraction, monkeypatch):
    """flop.bmm's short path for binary32 CPU products at 24 bits (LEAN_BMM) against its
    general path, bit for bit and key for key: broadcast batches, a transposed (strided)
    operand, exact bfloat16-valued operands, inf and NaN, the dtype argument, no rows, the
    empty sum (which the short path leaves to the general one), a virtual precision
    and NUMVAR_FLOP_BACKEND=numba (general path both); and an addmm, a baddbmm and a
    convolution through a fuzzy block."""
    from numvar.instrument import flop as FL

    def case(seed):
        a, b = _gen(3, 5, 7, seed=seed), _gen(1, 7, 4, seed=seed + 1)
        a[0, 1, 2], b[0, 3, 1] = float("inf"), float("nan")
        return [(a, b, None), (_gen(1, 6, 9, seed=seed + 2), _gen(2, 4, 9, seed=seed + 3).mT,
                               torch.float32),
                (a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float(), None),
                (_gen(2, 0, 3, seed=seed + 6), _gen(2, 3, 5, seed=seed + 7), None),
                (_gen(2, 3, 0, seed=seed + 4), _gen(2, 0, 5, seed=seed + 5), None)]

    def run(lean, precision=None):
        monkeypatch.setattr(FL, "LEAN_BMM", lean)
        ctx = Ctx(mode, "flop", precision, R.Stream(11), contraction=contraction)
        outs = [FL.bmm(a, b, ctx, dt) for a, b, dt in case(20)]
        return outs, ctx.stream.counter

    for precision in (None, 12):
        (lean, n1), (general, n2) = run(True, precision), run(False, precision)
        assert n1 == n2 == 4 and all(_same(x, y) for x, y in zip(lean, general))  # (K = 0: no key)
    monkeypatch.setenv("NUMVAR_FLOP_BACKEND", "numba")
    (env, _), (general, _) = run(True), run(False)
    assert all(_same(x, y) for x, y in zip(env, general))
    monkeypatch.delenv("NUMVAR_FLOP_BACKEND")

    import numvar

    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x, m1, m2 = _gen(2, 3, 6, 6, seed=30), _gen(5, 8, seed=31), _gen(8, 6, seed=32)

    def model():
        with torch.no_grad(), numvar.fuzzy(mode=mode, granularity="flop", seed=3,
                                           contraction=contraction):
            return [torch.addmm(_gen(6, seed=33), m1, m2.t().contiguous().t()),
                    torch.baddbmm(_gen(2, 5, 6, seed=34), _gen(2, 5, 8, seed=35),
                                  _gen(2, 8, 6, seed=36), beta=0.5), conv(x)]

    monkeypatch.setattr(FL, "LEAN_BMM", True)
    lean = model()
    monkeypatch.setattr(FL, "LEAN_BMM", False)
    assert all(_same(x, y) for x, y in zip(lean, model()))


@pytest.mark.parametrize("mode", MODES + ("up", "down"))
def test_lean_sums_equal_the_general_reduction_path(mode, monkeypatch):
    """flop.reduce's short path for binary32 sums and products over the leading dims of a
    contiguous CPU tensor (LEAN_SUMS) against its general path, bit for bit and key for
    key: one and two leading dims, keepdim, a product, inf, NaN and NaNs of both signs in
    a column (their bits compared), strided tensors and a virtual precision (the general
    path both), the trailing dims (their own path) in between; and a linear layer's
    gradients (its bias's sum over the batch) through a fuzzy block."""
    from numvar.instrument import flop as FL

    x = _gen(6, 5, 7, seed=40)
    x[0, 1, 2], x[3, 1, 2] = float("inf"), float("nan")
    x[1, 0, 0], x[2, 0, 0] = torch.tensor([-0x400000, 0x7FC00000],
                                          dtype=torch.int32).view(torch.float32)
    calls = [(x, [0], False, False), (x, [0, 1], True, False), (x, [0], False, True),
             (x[:, :, :4], [0], False, False), (x.mT, [0], False, False),
             (x, [2], False, False), (x, [1, 0], False, False)]

    general_calls = []
    real_scan = FL._policy_scan
    monkeypatch.setattr(FL, "_policy_scan",
                        lambda *a, **k: general_calls.append(1) or real_scan(*a, **k))

    def run(lean, precision=None):
        monkeypatch.setattr(FL, "LEAN_SUMS", lean)
        general_calls.clear()
        ctx = Ctx(mode, "flop", precision, R.Stream(12))
        outs = [FL.reduce(t, d, ctx, keepdim=kd, mul=mu) for t, d, kd, mu in calls]
        return outs, ctx.stream.counter, len(general_calls)

    for precision in (None, 12):
        (lean, n1, g1), (general, n2, g2) = run(True, precision), run(False, precision)
        assert n1 == n2 == len(calls)
        assert all(a.shape == b.shape and a.stride() == b.stride()
                   and torch.equal(a.view(torch.int32), b.view(torch.int32))
                   for a, b in zip(lean, general))
        # (the short path: the four calls over leading dims of a contiguous tensor; the
        # strided ones take the general path either way, the trailing dims their own;
        # at a virtual precision every call takes the general path)
        assert (g1, g2) == ((2, 6) if precision is None else (7, 7))

    import numvar

    lin = torch.nn.Linear(7, 3)

    def grads():
        lin.zero_grad()
        with numvar.fuzzy(mode=mode, granularity="flop", seed=3):
            lin(_gen(4, 6, 7, seed=41)).square().sum().backward()
        return [lin.weight.grad.clone(), lin.bias.grad.clone()]

    monkeypatch.setattr(FL, "LEAN_SUMS", True)
    lean = grads()
    monkeypatch.setattr(FL, "LEAN_SUMS", False)
    assert all(_same(a, b) for a, b in zip(lean, grads()))
