"""The broadcasting binary32 kernels of numvar.instrument.pointwise against the rounding
core (numvar.rounding's tensor API and scalar functions), bit for bit."""

import numba
import numpy as np
import pytest
import torch
from numba import njit

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box

import numvar.rounding as R
from numvar.instrument import kernels as KN
from numvar.instrument import pointwise as PW
from numvar.instrument._core import Ctx
from numvar.rounding import kernels as RK

MODES = ("ieee", "sr", "ud", "random")


def _weird(rng, n, dt=np.float32):
    """Normal values with scattered huge/tiny/subnormal magnitudes, zeros, ones and
    specials, so that every decline of the fast paths is exercised."""
    x = rng.standard_normal(n) * np.exp2(rng.integers(-150, 125, n) * (rng.random(n) < 0.3))
    x[rng.random(n) < 0.1] = 0.0
    x[rng.random(n) < 0.05] = 1.0
    x[rng.random(n) < 0.05] = -0.0
    if n > 8:
        x[rng.integers(0, n, 2)] = np.inf
        x[rng.integers(0, n, 1)] = -np.inf
        x[rng.integers(0, n, 1)] = np.nan
    return x.astype(dt)


def _weird64(rng, n):
    """:func:`_weird` in float64, a fifth of the magnitudes scaled by 2**±300 to 2**±990
    (results and factors past the binary64 pass's ranges)."""
    x = _weird(rng, n, np.float64)
    far = rng.random(n) < 0.2
    with np.errstate(over="ignore"):  # (some overflow to infinities: wanted)
        return np.where(far, x * np.exp2(rng.choice([300, -300, 500, -360, 990, -700], n)), x)


def _t(rng, shape, dt=np.float32):
    n = int(np.prod(shape))
    values = _weird64(rng, max(n, 1)) if dt == np.float64 else _weird(rng, max(n, 1), dt)
    return torch.from_numpy(values[:n].reshape(shape))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and dtype, bitwise equal up to the sign of NaNs; signed zeros count."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    x, y = a.detach().numpy(), b.detach().numpy()
    num = ~np.isnan(x)
    return (np.array_equal(x, y, equal_nan=True)
            and np.array_equal(np.signbit(x)[num], np.signbit(y)[num]))


#: (shape of a, shape of b, transform of a): equal shapes, a bias, row-constant columns,
#: scalars and 0-dim tensors, two-sided broadcasts (materialised), rows longer and
#: shorter than a tile, transposed, expanded (stride 0) and offset (sliced) operands
CASES = [
    ((5, 7), (5, 7), None), ((5, 7), (7,), None), ((5, 7), (5, 1), None),
    ((3, 4, 5), (), None), ((), (3, 4), None), ((), (), None), ((1,), (6,), None),
    ((3, 1, 7), (1, 4, 7), None), ((2, 3, 4, 5), (3, 1, 5), None),
    ((64, 32, 40), (64, 32, 1), None), ((3, 2500), (2500,), None), ((2500, 3), (3,), None),
    ((40, 700), (40, 1), None), ((6, 4, 5), (4, 6, 5), "t"), ((6, 4, 5), (5,), "t"),
    ((7, 9), (7, 9), "slice"), ((7, 9), (9,), "expand"), ((0, 3), (3,), None),
    ((4, 6, 5), (1, 6, 1), "perm"), ((2, 400, 7), (400, 1), "slice3"),
    ((3, 40, 700), (40, 1), "perm"), ((5, 4, 3), (5, 1, 1), "perm"),
    ((3000,), (3000,), None), ((2, 3, 1), (2, 3, 1), None), ((5, 7), (7,), "neg"),
    ((5, 7), (5, 7), "neg"),
    # a constant operand held across a chunk's tiles where the chunk's first tile is a
    # row's short last one (tiles 32.. of 3 per row, 16 per chunk), and a row-constant one
    ((12, 2100), (), "slice"), ((12, 2100), (12, 1), None),
]


def _operands(rng, sa, sb, how, dt=np.float32):
    a, b = _t(rng, sa, dt), _t(rng, sb, dt)
    if how == "t":
        a = a.transpose(0, 1)
    elif how == "slice":
        a = _t(rng, (sa[0] + 2, sa[1] + 3), dt)[1:-1, 2:-1]
    elif how == "slice3":  # rows contiguous within the outer dim only
        a = _t(rng, (sa[0], sa[1] + 50, sa[2]), dt)[:, 20:20 + sa[1]]
    elif how == "perm":  # the middle dim outermost in memory (a 3-D plan)
        a = _t(rng, (sa[1], sa[0], *sa[2:]), dt).transpose(0, 1)
    elif how == "expand":
        a = _t(rng, (1, sa[1]), dt).expand(*sa)
    elif how == "neg":  # a negative-bit view: its values differ from its storage's
        a = torch._neg_view(a)
    return a, b


@pytest.mark.parametrize("dt,mode", [(np.float32, m) for m in MODES]
                         + [(np.float64, m) for m in R.MODES])
def test_binary_ops_equal_the_rounding_core(dt, mode):
    """Every layout of :data:`CASES`, both operand orders, the four ops, against
    numvar.rounding's add/sub/mul/div of the same tensors. binary64 (``binary64_tensors``,
    ``_tile64``) in every mode, the directed ones element by element on the scalar path,
    its operands scaled so that the binary64 pass declines some elements in every op
    (results past 2**1000 or below 2**-700, factors past 2**480, zeros, infinities, NaN)."""
    rng = np.random.default_rng(1 if dt == np.float32 else 11)
    for sa, sb, how in CASES:
        a, b = _operands(rng, sa, sb, how, dt)
        for x, y in ((a, b), (b, a)):
            for op in ("add", "sub", "mul", "div"):
                ctx = Ctx(mode, "flop", None, R.Stream(3))
                got = getattr(ctx, op)(x, y)
                want = getattr(R, op)(x, y, mode=mode, stream=R.Stream(3))
                assert _same(got, want), (op, mode, sa, sb, how)
                assert got.is_contiguous()
                assert ctx.stream.counter == 1


def test_binary64_in_place_is_taken_and_equals_the_materialised_route(monkeypatch):
    """The in-place route runs (a bias and a row statistic, folded) and gives the bits of
    the route it replaced (``_core.BINARY64_IN_PLACE`` off), on one and two threads."""
    from numvar.instrument import _core
    rng = np.random.default_rng(12)
    x = torch.from_numpy(rng.standard_normal((300, 130)))
    for y in (torch.from_numpy(rng.standard_normal(130)), torch.from_numpy(rng.random((300, 1)))):
        assert PW.plan(x.shape, x, y) is not None
        for op in ("add", "sub", "mul", "div"):
            outs = []
            for on, threads in ((True, 1), (True, 2), (False, 1)):
                monkeypatch.setattr(_core, "BINARY64_IN_PLACE", on)
                monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", 1 << 10 if threads == 2 else 1 << 18)
                numba.set_num_threads(threads)
                try:
                    outs.append(getattr(Ctx("sr", "flop", None, R.Stream(8)), op)(x, y))
                finally:
                    numba.set_num_threads(1)
            assert _same(outs[0], outs[1]) and _same(outs[0], outs[2]), op


@pytest.mark.parametrize("mode", MODES)
def test_python_numbers_and_mixed_dtypes_equal_the_rounding_core(mode):
    rng = np.random.default_rng(2)
    a = _t(rng, (6, 5))
    for y in (2.5, 3, -0.1, 1e-40, torch.tensor(0.3, dtype=torch.float64),
              torch.tensor(7, dtype=torch.int64)):
        for op in ("add", "sub", "mul", "div"):
            ctx = Ctx(mode, "flop", None, R.Stream(4))
            s = R.Stream(4)
            yy = y if isinstance(y, torch.Tensor) else torch.tensor(y, dtype=torch.float32)
            yt = yy.to(a.dtype)
            assert _same(getattr(ctx, op)(a, y), getattr(R, op)(a, yt, mode=mode, stream=s))
            assert _same(getattr(ctx, op)(y, a), getattr(R, op)(yt, a, mode=mode, stream=s))


def test_keys_of_both_halves_and_both_kernel_paths(monkeypatch):
    """The serial kernels take the stream key as the int64 of its bits: keys below and at
    or above 2**63 (seeds chosen to give both), tensor and number operands, against the
    rounding core; then the parallel path (PARALLEL_MIN_WORK 1) gives the same bits."""
    rng = np.random.default_rng(5)
    a, b = _t(rng, (3, 40)), _t(rng, (40,))
    firsts = {s: R.Stream(s).next_key() >= 1 << 63 for s in range(8)}
    assert set(firsts.values()) == {False, True}
    got = {}
    for parallel in (False, True):
        if parallel:
            monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", 1)
        for seed in firsts:
            for op in ("add", "div"):
                for x, y in ((a, b), (a, 0.3), (2.5, a)):
                    ctx = Ctx("sr", "flop", None, R.Stream(seed))
                    out = getattr(ctx, op)(x, y)
                    xt, yt = (torch.tensor(v, dtype=torch.float32) if isinstance(v, float)
                              else v for v in (x, y))
                    want = getattr(R, op)(xt, yt, mode="sr", stream=R.Stream(seed))
                    assert _same(out, want), (seed, op, parallel)
                    if parallel:
                        assert _same(out, got[seed, op, type(x), type(y)])
                    got[seed, op, type(x), type(y)] = out


@pytest.mark.parametrize("mode", MODES)
def test_sqrt_and_round_equal_the_rounding_core(mode):
    rng = np.random.default_rng(3)
    for shape in ((5, 7), (3000,), (), (0,), (4, 6)):
        a = _t(rng, shape)
        if shape == (4, 6):
            a = a.t()
        ctx = Ctx(mode, "flop", None, R.Stream(5))
        s = R.Stream(5)
        assert _same(ctx.sqrt(a), R.sqrt(a, mode=mode, stream=s))
        assert _same(ctx.sqrt(a.abs()), R.sqrt(a.abs(), mode=mode, stream=s))
        h = _t(rng, shape, np.float64) * 2.0 ** 100
        assert _same(ctx.round(h, torch.float32),
                     R.round(h, dtype=torch.float32, mode=mode, stream=s))
        assert _same(ctx.round(h * 2.0 ** -200, torch.float32),
                     R.round(h * 2.0 ** -200, dtype=torch.float32, mode=mode, stream=s))


@pytest.mark.parametrize("mode", MODES)
def test_sqrt_matches_the_core_on_scattered_magnitudes(mode):
    """The vectorised square root (its residual's product error by one FMA,
    ``pointwise._prod_err``, where the rounding core uses Dekker's TwoProduct) against the
    core on subnormal, tiny, huge and special inputs, perfect squares and their
    neighbours, in the modes it serves."""
    rng = np.random.default_rng(11)
    sq = np.float32(rng.integers(1, 4096, 200)) ** 2
    edge = np.float32([2.0 ** -149, 2.0 ** -126, 2.0 ** -127, 3.4028235e38, 4.0, 2.0])
    a = np.abs(np.concatenate([_weird(rng, 4000), sq, np.nextafter(sq, np.float32(0)),
                               np.nextafter(sq, np.float32(np.inf)), edge]))
    a[:40] = -a[:40]  # negative inputs: NaN
    key = R.Stream(13).next_key()
    out = np.empty_like(a)
    PW.sqrt32(a, out, key, RK.mode_code(mode))
    want = R.sqrt(torch.from_numpy(a), mode=mode, stream=R.Stream(13))
    assert _same(torch.from_numpy(out), want)


@pytest.mark.parametrize("mode", ["up", "down", "zero"])
def test_directed_modes_write_every_element(mode):
    """In the modes the vectorised loops leave to the scalar loop, every element of the
    output is written, exact zero quotients and square roots of ±0 included (they were
    once accepted by the fast path and left as whatever the output memory held): the
    outputs start as a NaN sentinel and must equal the rounding core."""
    rng = np.random.default_rng(7)
    a = _weird(rng, 600)
    a[::3] = 0.0
    a[1::7] = -0.0
    b = _weird(rng, 600)
    b[b == 0] = 3.0
    code, key = RK.mode_code(mode), R.Stream(9).next_key()
    full = np.array([0, 0, 1])
    for op, name in ((RK.OP_DIV, "div"), (RK.OP_MUL, "mul"), (RK.OP_ADD, "add")):
        out = np.full(600, np.nan, np.float32)
        PW.binary32(op, a, full, b, full, out, (1, 1, 600), key, code)
        want = getattr(R, name)(torch.from_numpy(a), torch.from_numpy(b), mode=mode,
                                stream=R.Stream(9))
        assert _same(torch.from_numpy(out), want), name
    out = np.full(600, np.nan, np.float32)
    PW.sqrt32(a, out, key, code)
    assert _same(torch.from_numpy(out), R.sqrt(torch.from_numpy(a), mode=mode,
                                                stream=R.Stream(9)))


def test_binary32_matches_the_scalar_core_on_hard_quotients():
    """Quotients around the binary32 range limits and exact quotients, for every mode."""
    rng = np.random.default_rng(4)
    edge = np.float32([1, 3, 2.0 ** -126, 2.0 ** -127, 3e38, 1e-45])
    x = np.concatenate([_weird(rng, 4000), edge])
    y = np.concatenate([_weird(rng, 4000), np.float32([3, 1, 3, 1.0000001, 0.5, 2])])
    y[::7] = np.float32(2.0) ** rng.integers(-20, 20, y[::7].size).astype(np.float32)
    for mode in MODES:
        m = RK.mode_code(mode)
        key = 0x1234_5678_9ABC_DEF0
        out = np.empty_like(x)
        PW.binary32(RK.OP_DIV, x, (0, 0, 1), y, (0, 0, 1), out, (1, 1, x.size), key, m)
        want = np.empty_like(x)
        _core_binary_all(RK.OP_DIV, x, y, key, m, want)
        assert _same(torch.from_numpy(out), torch.from_numpy(want)), mode


@njit(error_model="numpy")
def _core_binary_all(op, x, y, key, mode, out, l0=0):
    """The rounding core's binary32 ``x op y`` (``div_f32``, ``add_f32``: narrow_binary
    at 24 bits) per element, with ``bits64(key, l0 + j)``."""
    for j in range(x.size):
        out[j] = np.float32(RK.narrow_binary(op, np.float64(x[j]), np.float64(y[j]), mode,
                                             24, 24, -126, 127,
                                             RK.bits64(np.uint64(key), np.uint64(l0 + j))))


@njit(error_model="numpy")
def _lo32_all(h, lo, key, mode, out, ok):
    for j in range(h.size):
        v, good = PW._lo32(h[j], lo[j], RK.bits64(np.uint64(key), np.uint64(j)), mode)
        out[j] = v
        ok[j] = good


@njit(error_model="numpy")
def _core_all(h, lo, key, mode, out):
    for j in range(h.size):
        out[j] = RK.round_f32(h[j], lo[j], mode, 24, RK.bits64(np.uint64(key), np.uint64(j)))


@njit(error_model="numpy")
def _round_into_add(x, y, key, mode, out):
    PW.round_into(RK.OP_ADD, x, y, out, np.uint64(key), 0, mode)


@pytest.mark.parametrize("mode", MODES + ("up", "down"))
def test_inexact_sums_redone_per_subtile_equal_the_rounding_core(mode):
    """Sums whose float64 value is inexact (a term 2**-30..2**-70 times the other, both
    signs, next to powers of two where the grid below is finer), scattered one every few
    elements, in runs and alone in a tile, among ordinary and special values: the
    vectorised loops decline them, :func:`pointwise._redo` redoes the tile through the
    residual loop (``_tile_lo``: sr, ieee, ud, random), then only the sub-tiles that
    still decline (special values) or every sub-tile that holds one (up, down) through
    :func:`pointwise._slow`. Both the tensor path and ``round_into`` must equal the core
    element by element."""
    rng = np.random.default_rng(11)
    n = 4096
    x = _weird(rng, n)
    y = _weird(rng, n)
    clean = slice(1024, 2048)               # one whole tile of ordinary values
    x[clean] = rng.standard_normal(1024)
    y[clean] = rng.standard_normal(1024)
    tiny = rng.standard_normal(n) * np.exp2(-rng.integers(30, 70, n))
    pick = np.zeros(n, bool)
    pick[::5] = True                        # one in five: every sub-tile has some
    pick[clean] = False
    pick[1100:2048:200] = True              # each alone in its sub-tile
    pick[3000:3100] = True                  # a run of them
    x[pick] = rng.standard_normal(pick.sum()).astype(np.float32)
    x[pick & (rng.random(n) < 0.3)] = np.float32(2.0) ** rng.integers(-10, 10)
    y[pick] = (np.abs(x[pick]).astype(np.float64) * tiny[pick]).astype(np.float32)
    code, key = RK.mode_code(mode), 0x0F1E_2D3C_4B5A_6978
    want = np.empty_like(x)
    _core_binary_all(RK.OP_ADD, x, y, key, code, want)
    got = np.full(n, np.nan, np.float32)
    PW.binary32(RK.OP_ADD, x, (0, 0, 1), y, (0, 0, 1), got, (1, 1, n), key, code)
    assert _same(torch.from_numpy(got), torch.from_numpy(want))
    got = np.full(n, np.nan, np.float32)
    _round_into_add(x, y, key, code, got)
    assert _same(torch.from_numpy(got), torch.from_numpy(want))


@njit(error_model="numpy")
def _round_into_op(op, x, y, key, mode, out, residual_first):
    if residual_first:
        PW.round_sum_into(op, x, y, out, np.uint64(key), 0, mode)
    else:
        PW.round_into(op, x, y, out, np.uint64(key), 0, mode)


@pytest.mark.parametrize("residual_first", [False, True])
@pytest.mark.parametrize("op", ["add", "sub"])
@pytest.mark.parametrize("mode", MODES + ("up",))
def test_round_into_switches_to_the_residual_path_with_the_same_values(mode, op,
                                                                       residual_first):
    """:func:`pointwise.round_into` runs a sum's later tiles on the residual path first
    once a tile declined :data:`pointwise.LO_SWITCH` elements or more, and
    :func:`pointwise.round_sum_into` runs every tile so: neither changes a value. Tiles:
    ordinary values with LO_SWITCH − 1 inexact sums (no switch), then one inexact sum in
    four (the switch), an ordinary tile, a tile of special values (inf, NaN, subnormal
    and huge magnitudes: declined by the residual path too) and a short last tile; the
    difference ``x − y`` is checked against the core's ``x − y`` (not a negated copy).
    Every element must equal the rounding core's."""
    T = PW.ROUND_TILE
    rng = np.random.default_rng(5)
    n = 4 * T + 100
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    pick = np.zeros(n, bool)
    pick[rng.choice(T, PW.LO_SWITCH - 1, replace=False)] = True
    pick[T:2 * T:4] = True
    tiny = rng.standard_normal(n) * np.exp2(-rng.integers(30, 70, n))
    y[pick] = (np.abs(x[pick]).astype(np.float64) * tiny[pick]).astype(np.float32)
    x[3 * T:4 * T] = _weird(rng, T)
    y[3 * T:4 * T] = _weird(rng, T)
    code, key = RK.mode_code(mode), 0x1234_5678_9ABC_DEF0
    opc = RK.OP_ADD if op == "add" else RK.OP_SUB
    want = np.empty_like(x)
    _core_binary_all(opc, x, y, key, code, want)
    got = np.full(n, np.nan, np.float32)
    _round_into_op(opc, x, y, key, code, got, residual_first)
    assert _same(torch.from_numpy(got), torch.from_numpy(want))


@njit(error_model="numpy")
def _mulsub_both(s, v, X, key_m, key_s, l0, mode, fused, two):
    R, N = fused.shape
    bad = np.empty(R, np.bool_)
    pa = np.empty(N, np.float32)
    pb = np.empty(N, np.float32)
    prod = np.empty(N, np.float32)
    PW.mulsub_rows(s, v, X, fused, np.uint64(key_m), np.uint64(key_s), l0, mode, bad, pa, pb,
                   prod)
    for i in range(R):  # the two broadcast calls mulsub_rows replaces
        pa[:] = s[i]
        PW.round_into(RK.OP_MUL, pa, v, prod, np.uint64(key_m), l0 + i * N, mode)
        pb[:] = X[i]
        PW.round_into(RK.OP_SUB, pb, prod, two[i], np.uint64(key_s), l0 + i * N, mode)


@pytest.mark.parametrize("mode", MODES + ("up", "down"))
def test_mulsub_rows_equals_the_two_broadcast_calls(mode):
    """:func:`pointwise.mulsub_rows` (the fused trailing update of the LU and triangular
    solve kernels: ``X[i, c] − RND(s[i]·v[c])``) equals ``round_into``'s product into a
    buffer and difference, row by row with the same keys and indices: ordinary rows (the
    fused pass), rows with an inexact difference, products out of range, inf and NaN
    (declined: redone through the two calls), and every row in up and down."""
    rng = np.random.default_rng(8)
    R, N = 12, 70
    s = rng.standard_normal(R).astype(np.float32)
    v = rng.standard_normal(N).astype(np.float32)
    X = rng.standard_normal((R, N)).astype(np.float32)
    X[3, 5] = np.float32(1e30)   # inexact float64 difference
    s[5] = np.float32(1e-30)     # products below the normal range
    X[7] = _weird(rng, N)
    v[9] = np.float32(np.inf)    # an infinite product in every row
    s[11] = np.float32(np.nan)
    fused = np.full((R, N), np.nan, np.float32)
    two = np.full((R, N), np.nan, np.float32)
    _mulsub_both(s, v, X, 0x51, 0x77, 1000, RK.mode_code(mode), fused, two)
    assert _same(torch.from_numpy(fused), torch.from_numpy(two))


@njit(error_model="numpy")
def _accumulate_row_by_row(x, acc, key, l0, mode):
    tmp = np.empty(acc.size, np.float32)
    d = acc.size
    for r in range(x.shape[0]):  # the calls accumulate_rows32 replaces
        PW.round_into(RK.OP_ADD, acc, x[r], tmp, np.uint64(key), l0 + r * d, mode)
        acc[:] = tmp


@pytest.mark.parametrize("mode", MODES + ("up", "down"))
def test_accumulate_rows_equals_round_into_row_after_row(mode):
    """:func:`pointwise.accumulate_rows32` (a bag's rows summed in one call) equals
    :func:`pointwise.round_into` called row after row with the same key and indices
    ``l0 + r·d + j``, and the core element by element: ordinary rows, a row whose sums
    are inexact in float64 (a term 2**-40 times the sum: declined, redone by the
    residual path), a row of special values, rows that overflow, and a row longer than
    a tile (d = 1100 > ROUND_TILE)."""
    rng = np.random.default_rng(9)
    code, key = RK.mode_code(mode), 0x0ACC_0123_4567_89AB
    for d in (5, 64, PW.ROUND_TILE + 76):
        R = 9
        x = rng.standard_normal((R, d)).astype(np.float32)
        x[2] = (x[:2].sum(0).astype(np.float64) * 2.0 ** -40).astype(np.float32)
        x[4] = _weird(rng, d)
        x[6, : d // 2] = np.float32(3e38)
        acc0 = rng.standard_normal(d).astype(np.float32)
        got = acc0.copy()
        PW.accumulate_rows32(x, got, np.uint64(key), 700, code)
        want = acc0.copy()
        _accumulate_row_by_row(x, want, key, 700, code)
        assert _same(torch.from_numpy(got), torch.from_numpy(want)), (mode, d)
        core = acc0.copy()
        for r in range(R):  # the rounding core, one row at a time
            nxt = np.empty_like(core)
            _core_binary_all(RK.OP_ADD, core, x[r], key, code, nxt, 700 + r * d)
            core = nxt
        assert _same(torch.from_numpy(got), torch.from_numpy(core)), (mode, d)


@pytest.mark.parametrize("mode", MODES)
def test_infinities_and_nans_stay_on_the_vectorised_path(mode):
    """±inf and NaN operands (a masked attention score's −inf minus its row maximum,
    products and sums with them, an all-masked row's −inf − (−inf)): every mode keeps
    ±inf and NaN (the core returns them unchanged), so the vectorised loops accept them,
    with the core's values; and float64 infinities and NaNs rounded to binary32."""
    inf, nan = np.inf, np.nan
    x = np.tile(np.array([-inf, inf, nan, 1.5, -inf, 2.0, inf, 0.0], np.float32), 32)
    y = np.tile(np.array([3.0, -2.0, 1.0, nan, -inf, inf, inf, -0.0], np.float32), 32)
    code, key = RK.mode_code(mode), 0x5EED
    for op in (RK.OP_ADD, RK.OP_SUB, RK.OP_MUL):
        got = np.full(x.size, 7.0, np.float32)
        assert PW._tile(op, x, y, got, np.uint64(key), 0, code) == 0, (mode, op)
        want = np.empty_like(x)
        _core_binary_all(op, x, y, key, code, want)
        assert _same(torch.from_numpy(got), torch.from_numpy(want)), (mode, op)
    h = np.tile(np.array([inf, -inf, nan, 0.0, -0.0, 1.0]), 40)
    got = np.full(h.size, 7.0, np.float32)
    assert PW._roundloop(h, got, np.uint64(key), 0, KN._G, code) == 0, mode
    want = np.empty(h.size, np.float32)
    _core_all(h, np.zeros_like(h), key, code, want)
    assert _same(torch.from_numpy(got), torch.from_numpy(want)), mode


def test_lo32_is_round_core_where_it_accepts():
    """(h, lo) pairs with h = RN(h + lo): lo at and inside half an ulp of h, h on and off
    the binary32 grid (on it with lo of both signs: the exact value just above and just
    below a grid point, where the core steps down to the finer grid below a power of
    two), around 2**-126 and 2**128; every accepted value equals round_f32(h, lo);
    declines happen only where documented."""
    rng = np.random.default_rng(5)
    n = 20000
    e = rng.integers(-130, 130, n)
    h = (1 + rng.random(n)) * np.exp2(e.astype(float)) * np.where(rng.random(n) < 0.5, -1, 1)
    grid = rng.random(n) < 0.3
    with np.errstate(over="ignore"):
        h[grid] = h[grid].astype(np.float32).astype(np.float64)
    pow2 = grid & (rng.random(n) < 0.3)  # powers of two: a finer grid below them
    h[pow2] = np.copysign(np.exp2(e[pow2].astype(float)), h[pow2])
    ulp = np.spacing(np.abs(h))
    frac = rng.choice([0.5, -0.5, 0.25, -0.25, 1e-3, -1e-3, 0.0], n)
    lo = frac * ulp
    lo[rng.random(n) < 0.05] = 0.0
    h[:4] = [2.0 ** -126, 2.0 ** 128 - 2.0 ** 104, 0.0, -0.0]
    lo[:4] = [-(2.0 ** -180), 2.0 ** 50, 0.0, 0.0]
    with np.errstate(over="ignore"):
        f32 = h.astype(np.float32)
    for mode in MODES:
        m = RK.mode_code(mode)
        got = np.empty(n, np.float32)
        ok = np.empty(n, np.bool_)
        want = np.empty(n, np.float32)
        _lo32_all(h, lo, 99, m, got, ok)
        _core_all(h, lo, 99, m, want)
        assert _same(torch.from_numpy(got[ok]), torch.from_numpy(want[ok])), mode
        assert ok.mean() > 0.8, mode  # the fast path takes the bulk
        be = (h.view(np.uint64) >> 52) & 0x7FF
        inside = (be >= 1023 - 126 + (mode == "ud")) & (be <= 1023 + 127)
        on_grid_below = (h == f32) & (lo * np.sign(h) < 0)
        lowest = be == 1023 - 126  # below 2**-126 the grid is the subnormal one
        assert ok[inside & ~(on_grid_below & lowest) & (np.abs(lo) <= 0.5 * ulp)].all(), mode
        assert (on_grid_below & inside & ~lowest & ok).sum() > 1000, mode  # taken, not declined


@njit(error_model="numpy")
def _moot_all(h, lo, key, mode, out, ok):
    """The fast path's value of each (h, lo) pair and whether the residual loop of
    :func:`pointwise._tile_lo` accepts it (sr, ieee, ud: :func:`kernels.residual_moot`)."""
    for j in range(h.size):
        r = RK.bits64(np.uint64(key), np.uint64(j))
        v, good = KN._fast32(h[j], r, mode)
        out[j] = v
        ok[j] = good & ((lo[j] == 0.0) | (not (abs(h[j]) < np.inf))
                        | KN.residual_moot(h[j], r, mode))


def test_inexact_sums_on_the_fast_path():
    """:func:`kernels.residual_moot`: where it accepts an inexact float64 sum ``h`` (its
    residual ``lo`` ≠ 0), the fast path's value of ``h`` alone equals the core's rounding
    of ``h + lo`` (``round_f32(h, lo)``). Pairs built around each element's random bits:
    for sr, the low 29 bits of h at ``q + d`` (``q = r >> 35``, d = −2 … 2: d = −1 and 2
    are the closest accepted decisions, 0 and 1 the declined ones), and at 0 (on the
    binary32 grid, with the exact value just above or just below it, below a power of
    two too); residuals of both signs from 2**-40 to 0.49 of a float64 ulp; magnitudes
    across binary32's range and its edges (the lowest binade: declined). For ieee and ud
    the half-way low bits (the tie: declined) and their neighbours. Also the whole
    residual loop against the core on sums of binary32 values with tiny terms."""
    rng = np.random.default_rng(3)
    n = 40000
    key = 0x5151_7A7A_0101_FEFE
    q = np.array([int(RK.bits64(np.uint64(key), np.uint64(j))) >> 35 for j in range(n)],
                 dtype=np.int64)
    e = rng.integers(-126, 128, n)
    e[:200] = -126  # the lowest binade
    e[200:400] = 127
    frac_hi = rng.integers(0, 1 << 23, n, dtype=np.int64)  # the binary32 part of h
    d = rng.integers(-2, 3, n)
    low = (q + d) % (1 << 29)
    kind = rng.random(n)
    low[kind < 0.2] = 0  # on the grid
    frac_hi[kind < 0.05] = 0  # a power of two
    low[(kind >= 0.2) & (kind < 0.3)] = 1 << 28  # half-way
    low[(kind >= 0.3) & (kind < 0.35)] = (1 << 28) + rng.choice([-1, 1], 1)[0]
    bits = ((e + 1023).astype(np.uint64) << np.uint64(52)) | (
        frac_hi.astype(np.uint64) << np.uint64(29)) | low.astype(np.uint64)
    h = bits.view(np.float64) * np.where(rng.random(n) < 0.5, -1.0, 1.0)
    ulp = np.spacing(np.abs(h))
    lo = rng.choice([0.49, 0.25, 2.0 ** -20, 2.0 ** -40], n) * rng.choice([-1.0, 1.0], n) * ulp
    for mode in MODES:
        m = RK.mode_code(mode)
        got = np.empty(n, np.float32)
        ok = np.empty(n, np.bool_)
        want = np.empty(n, np.float32)
        _moot_all(h, lo, key, m, got, ok)
        _core_all(h, lo, key, m, want)
        assert _same(torch.from_numpy(got[ok]), torch.from_numpy(want[ok])), mode
        lowb = (h.view(np.uint64) & np.uint64((1 << 29) - 1)).astype(np.int64)
        lowest = e == -126
        if mode == "sr":
            declined = ((lowb - q) % (1 << 29) <= 1) | lowest
        elif mode == "random":
            declined = lowb == 0
        else:
            declined = lowb == 1 << 28
            if mode == "ud":
                declined |= lowest  # (the fast path's own range for ud)
        assert not ok[declined].any(), mode  # declined exactly where documented
        assert ok[~declined].all(), mode
        assert ok.sum() > n // 2, mode
    # the residual loop itself, against the core, on sums of binary32 values: tiny terms
    # (2**-30 .. 2**-70 of the other) of both signs, on and off the grid, powers of two
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < 0.2] = np.float32(2.0) ** rng.integers(-20, 20)
    tiny = rng.standard_normal(n) * np.exp2(-rng.integers(30, 70, n))
    y = (np.abs(x).astype(np.float64) * tiny).astype(np.float32)
    for mode in MODES:
        m = RK.mode_code(mode)
        for opc in (RK.OP_ADD, RK.OP_SUB):
            want = np.empty_like(x)
            _core_binary_all(opc, x, y, key, m, want)
            got = np.full(n, np.nan, np.float32)
            _round_into_op(opc, x, y, key, m, got, True)
            assert _same(torch.from_numpy(got), torch.from_numpy(want)), (mode, opc)


def test_serial_and_parallel_kernels_agree(monkeypatch):
    rng = np.random.default_rng(6)
    a, b = _t(rng, (300, 70)), _t(rng, (70,))
    a3, c3 = _t(rng, (30, 20, 7)).transpose(0, 1), _t(rng, (20, 1, 1))  # a 3-D plan
    h = _t(rng, (5000,), np.float64)
    res = []
    numba.set_num_threads(2)
    try:
        for min_work in (1 << 40, 0):
            monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", min_work)
            ctx = Ctx("sr", "flop", None, R.Stream(9))
            res.append([ctx.add(a, b), ctx.div(b, a), ctx.sqrt(a), ctx.round(h, torch.float32),
                        ctx.mul(a.t(), b[:, None]), ctx.sub(a3, c3),
                        torch.from_numpy(PW.rowsum32(a.numpy(), 5, RK.MODE_SR))])
            assert numba.get_num_threads() == 2
    finally:
        numba.set_num_threads(1)
    assert all(_same(x, y) for x, y in zip(*res))


def test_plan_folds_layouts():
    a = torch.zeros(4, 5, 6)
    assert PW.plan((4, 5, 6), a, torch.zeros(6))[0] == (1, 20, 6)
    assert PW.plan((4, 5, 6), a, torch.zeros(4, 5, 1))[0] == (1, 20, 6)
    assert PW.plan((4, 5, 6), a, torch.zeros(()))[0] == (1, 1, 120)
    assert PW.plan((4, 5, 6), a.transpose(0, 2).contiguous().transpose(0, 2), a) is None
    p = PW.plan((4, 5, 6), torch.zeros(4, 1, 6), torch.zeros(1, 5, 1))
    assert p[0] == (4, 5, 6) and p[1][1] == (6, 0, 1) and p[2][1] == (0, 1, 0)
    assert PW.plan((2, 3, 4, 5), torch.zeros(2, 3, 4, 5), torch.zeros(2, 1, 4, 1)) is None
    assert PW.broadcast_shape((4, 1, 6), (5, 1)) == (4, 5, 6)
    with pytest.raises(RuntimeError):
        PW.broadcast_shape((4, 2), (3,))


def _same_plan(got, want) -> bool:
    """Two plans read the same elements: equal dims and strides, arrays over the same
    memory (empty ones aside) with the same values."""
    if got is None or want is None:
        return got is None and want is None
    if got[0] != want[0]:
        return False
    for (ga, gs), (wa, ws) in zip(got[1:], want[1:]):
        if gs != ws or ga.size != wa.size or (ga.size and ga.ctypes.data != wa.ctypes.data):
            return False
        if not np.array_equal(ga, wa, equal_nan=True):
            return False
    return True


def test_plan_cache_is_the_uncached_fold_and_keys_on_strides():
    """The layout cache of PW.plan (per shapes and strides) gives what plan_uncached
    derives afresh, on a miss and on a hit, for every layout of CASES and for operands of
    the same shapes but other strides or offsets (transposed, sliced, expanded),
    interleaved so that a stale entry would be read; Ctx.add on them equals the rounding
    core bit for bit."""
    rng = np.random.default_rng(9)
    PW._LAYOUTS.clear()
    base = torch.from_numpy(_weird(rng, 6 * 8 * 5)).reshape(6, 8, 5)
    same_shape = [base[:, :4, :], base[:, 4:, :], base.transpose(0, 1)[:4, :, :].transpose(0, 1),
                  base[:1, :4, :].expand(6, 4, 5), base[:, :4, :].contiguous(),
                  base.permute(2, 1, 0)[:, :4, :].permute(2, 1, 0)]
    other = _t(rng, (6, 4, 5))
    pairs = [_operands(rng, sa, sb, how) for sa, sb, how in CASES]
    pairs += [(x, y) for x in same_shape for y in (other, other[:, :1, :], same_shape[1])]
    for rnd in range(2):  # the second round reads every layout from the cache
        for a, b in pairs:
            shape = PW.broadcast_shape(a.shape, b.shape)
            if not (a.is_neg() or b.is_neg()):  # (a resolved copy each: other memory)
                assert _same_plan(PW.plan(shape, a, b), PW.plan_uncached(shape, a, b))
            ctx = Ctx("sr", "flop", None, R.Stream(rnd))
            want = R.add(a, b, mode="sr", stream=R.Stream(rnd))
            assert _same(ctx.add(a, b), want), (a.shape, a.stride(), b.shape, b.stride())
    assert PW._LAYOUTS


@pytest.mark.parametrize("mode", MODES)
def test_rowsum_is_the_scan_of_the_transpose(mode):
    rng = np.random.default_rng(7)
    m = RK.mode_code(mode)
    # (block_rows: 109-row blocks of 300, 64-row blocks of 1000 (RBLOCK_MIN), one block of
    # 20 × 2049; 8 × 8 transposed tiles with edges of rows and of k)
    for M, Kd in [(512, 64), (37, 5), (1, 7), (1000, 1), (700, 300), (3, 4096), (600, 2),
                  (130, 1000), (20, 2049)]:
        x = _weird(rng, M * Kd).reshape(M, Kd)
        for mul in (False, True):
            got = PW.rowsum32(x, 321, m, mul=mul)
            want = KN.scan(np.ascontiguousarray(x.T), 321, m, 24, mul=mul)[0]
            assert _same(torch.from_numpy(got), torch.from_numpy(want)), (M, Kd, mul)


@pytest.mark.parametrize("mode", (*MODES, "up", "down", "zero", "farthest"))
def test_column_major_results_round_as_their_contiguous_copy(mode):
    """Ctx.round of a float64 result whose last two dims are stored transposed (LAPACK's
    layout: ``h.mT`` contiguous) rounds it in place, column by column
    (pointwise.round32_columns), into a float32 result of the same strides: the bits,
    element by element, and the stream position of rounding ``h.contiguous()``. Matrices
    and batches, one row or column, columns longer than a tile, every kind of value."""
    rng = np.random.default_rng(23)
    for shape in [(64, 64), (3, 5, 7), (1, 9), (9, 1), (2, 1300, 3), (4, 2, 2, 5)]:
        t = torch.from_numpy(_weird(rng, int(np.prod(shape)), np.float64))
        h = t.reshape(*shape[:-2], shape[-1], shape[-2]).mT
        c1, c2 = Ctx(mode, "flop", None, R.Stream(3)), Ctx(mode, "flop", None, R.Stream(3))
        got, want = c1.round(h, torch.float32), c2.round(h.contiguous(), torch.float32)
        assert got.stride() == h.stride() or h.is_contiguous(), shape
        assert _same(got.contiguous(), want), (mode, shape)
        assert c1.stream.counter == c2.stream.counter == 1


#: (input shape, kernel, stride, padding) of pooling windows: 2×2 and 3×3 tiles, overlapping
#: and gapped windows, padding (a padded copy), rectangular windows, one window per plane,
#: 16-row blocks that end inside a window row, and more windows than a block holds
WINDOW_CASES = [((2, 3, 8, 8), (2, 2), (2, 2), (0, 0)), ((1, 4, 9, 7), (3, 3), (2, 2), (1, 1)),
                ((2, 2, 16, 16), (4, 2), (3, 1), (1, 0)), ((3, 1, 17, 5), (1, 5), (4, 1), (0, 2)),
                ((5, 7, 6, 6), (6, 6), (6, 6), (0, 0)), ((2, 8, 40, 36), (2, 2), (2, 2), (0, 0)),
                ((1, 2, 70, 70), (3, 2), (1, 3), (1, 1))]


@pytest.mark.parametrize("mode", (*MODES, "up", "zero"))
def test_window_sums_are_the_row_sums_of_the_windows_copied(mode, monkeypatch):
    """flop.window_sums (the windows summed in place by pointwise.window_sum32) against
    the route it replaces, reduce over the windows' reshape (the row kernels on a copy):
    the same bits and stream position, on strided views of every pooling layout, values
    across the whole range with infinities and NaNs, and the key drawn once per call."""
    from numvar.instrument import flop

    rng = np.random.default_rng(21)
    for shape, ks, st, pad in WINDOW_CASES:
        x = _t(rng, shape).reshape(-1, 1, *shape[-2:])
        if shape[0] == 2 and shape[1] == 8:
            x = x[:, :, 1:, 1:]  # a view with an offset and row gaps: no copy is taken
        win, ls = flop._windows(x, ks, st, pad, (1, 1))
        res = []
        for in_place in (True, False):
            monkeypatch.setattr(flop, "WINDOW_SUMS", in_place)
            ctx = Ctx(mode, "flop", None, R.Stream(9))
            res.append((flop.window_sums(win, ctx), ctx.stream.counter))
        assert res[0][1] == res[1][1] == 1, (mode, shape)
        assert res[0][0].shape == (x.shape[0], int(np.prod(ls)))
        assert _same(res[0][0], res[1][0]), (mode, shape, ks, st, pad)


def test_window_sums_on_two_threads_and_views_they_decline(monkeypatch):
    """A pooling above kernels.PARALLEL_MIN_WORK on two threads (one task per block) gives
    the serial bits; what window_sums leaves to reduce (float64 windows, fewer windows
    than rowsum32 takes, one-element windows) is reduce's own result."""
    from numvar.instrument import flop

    rng = np.random.default_rng(22)
    x = _t(rng, (4, 16, 64, 64)).reshape(-1, 1, 64, 64)
    win, _ = flop._windows(x, (2, 2), (2, 2), (0, 0), (1, 1))
    res = []
    for threads, in_place in ((2, True), (1, True), (1, False)):
        monkeypatch.setattr(flop, "WINDOW_SUMS", in_place)
        numba.set_num_threads(threads)
        try:
            res.append(flop.window_sums(win, Ctx("sr", "flop", None, R.Stream(4))))
        finally:
            numba.set_num_threads(1)
    assert _same(res[0], res[1]) and _same(res[1], res[2])
    calls = []
    real = PW.window_sum32
    monkeypatch.setattr(PW, "window_sum32", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(flop, "WINDOW_SUMS", True)
    for x, ks in [(_t(rng, (2, 1, 8, 8)).double(), (2, 2)), (_t(rng, (1, 1, 6, 6)), (3, 3)),
                  (_t(rng, (2, 1, 8, 8)), (1, 1))]:
        win, ls = flop._windows(x, ks, ks, (0, 0), (1, 1))
        want = flop.reduce(win.reshape(x.shape[0], int(np.prod(ls)), ks[0] * ks[1]), [2],
                           Ctx("sr", "flop", None, R.Stream(4)))
        assert _same(flop.window_sums(win, Ctx("sr", "flop", None, R.Stream(4))), want)
    assert not calls


def test_reduce_over_dims_trailing_but_for_size1_dims_equals_the_scan_path(monkeypatch):
    """flop._trailing leaves reduced dims of size 1 out: those reductions take the row
    path and give the bits of the permuted scan (the condition before: strictly
    trailing dims), keepdim or not."""
    from numvar.instrument import flop

    rng = np.random.default_rng(12)
    cases = [((1, 6, 4, 5), [0, 2, 3]), ((1, 20, 1, 7), [0, 3]), ((3, 1, 8), [1, 2]),
             ((1, 1, 30, 2), [0, 1, 3]), ((2, 1, 9), [0, 1])]
    assert all(flop._trailing(torch.empty(s), d) for s, d in cases[:4])
    assert not flop._trailing(torch.empty(2, 1, 9), [0, 1])
    for mode in MODES:
        for shape, dims in cases:
            x = _t(rng, shape)
            for mul in (False, True):
                for keepdim in (False, True):
                    res = []
                    for rows in (True, False):
                        if not rows:
                            monkeypatch.setattr(flop, "_trailing",
                                                lambda x, d: d[0] == x.dim() - len(d))
                        ctx = Ctx(mode, "flop", None, R.Stream(5))
                        res.append(flop.reduce(x, dims, ctx, keepdim=keepdim, mul=mul))
                        monkeypatch.undo()
                    assert _same(res[0], res[1]), (mode, shape, dims, mul, keepdim)


def test_reduce_over_trailing_dims_equals_the_scan_path(monkeypatch):
    from numvar.instrument import flop

    rng = np.random.default_rng(8)
    cases = [((16, 32, 64), [2]), ((16, 32, 64), [1, 2]), ((40, 30), [-1]), ((20, 5, 6), [0]),
             ((64, 20), [1]), ((8, 3), [1])]
    for mode in MODES:
        for shape, dims in cases:
            x = _t(rng, shape)
            for mul in (False, True):
                res = []
                for m_min in (PW.ROW_M_MIN, 1 << 40):
                    monkeypatch.setattr(PW, "ROW_M_MIN", m_min)
                    ctx = Ctx(mode, "flop", None, R.Stream(5))
                    res.append(flop.reduce(x, dims, ctx, keepdim=True, mul=mul))
                assert _same(res[0], res[1]), (mode, shape, dims, mul)


def test_float64_reduce_over_trailing_dims_by_rows_equals_the_scan(monkeypatch):
    """float64 sums and products over trailing dims by the row kernels (``flop.ROW_SUMS64``:
    ``rowsum32`` on float64 rows, ``_tile64`` steps) against the scan of the transposed
    copy (the flag off), every mode, rows in several blocks, a row longer than a tile,
    values the binary64 pass declines; the row path is taken where the rows fill it."""
    from numvar.instrument import flop

    calls = []
    rowsum = PW.rowsum32
    monkeypatch.setattr(PW, "rowsum32", lambda *a, **k: calls.append(1) or rowsum(*a, **k))
    rng = np.random.default_rng(9)
    cases = [((16, 32, 64), [2]), ((16, 32, 64), [1, 2]), ((40, 30), [-1]), ((20, 5, 6), [0]),
             ((300, 7), [1]), ((17, 1500), [1]), ((8, 3), [1])]
    for mode in R.MODES:
        for shape, dims in cases:
            x = _t(rng, shape, np.float64)
            for mul in (False, True):
                res = []
                for on in (True, False):
                    monkeypatch.setattr(flop, "ROW_SUMS64", on)
                    res.append(flop.reduce(x, dims, Ctx(mode, "flop", None, R.Stream(5)),
                                           keepdim=True, mul=mul))
                assert _same(res[0], res[1]), (mode, shape, dims, mul)
    assert len(calls) == len(R.MODES) * 2 * 5  # (all but the leading dim and the 8 rows)


def test_round_into_with_a_constant_op_compiles_the_tiles_for_any_op():
    """A constant op or mode is a literal type in numba; passed on as it is, numba
    compiles each non-inlined tile function once more per value (a cold-compile cost:
    four ``_tile`` copies, 55 s, measured). ``round_into`` hands its tiles runtime int64s:
    a caller compiled here with constants finds (or compiles) only non-literal copies, and
    computes the same values as the tiles called with the op as a runtime value."""
    @njit
    def mul_then_add(a, b, o1, o2):
        PW.round_into(RK.OP_MUL, a, b, o1, np.uint64(7), 0, 0)
        PW.round_into(RK.OP_ADD, a, b, o2, np.uint64(9), 0, 0)

    rng = np.random.default_rng(3)
    a = rng.standard_normal(300).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    o1, o2 = np.empty_like(a), np.empty_like(a)
    mul_then_add(a, b, o1, o2)
    for fn in (PW._tile, PW._tile_lo, PW._redo, PW._slow):
        literal = [sig for sig in fn.signatures
                   if any(isinstance(t, numba.types.Literal) for t in sig)]
        assert literal == [], f"{fn.__name__} compiled for literal arguments: {literal}"
    assert PW._tile.signatures, "the caller did not reach the tile kernel"
    r1, r2 = np.empty_like(a), np.empty_like(a)
    PW._slow(np.int64(RK.OP_MUL), a, b, r1, np.uint64(7), 0, 0)
    PW._slow(np.int64(RK.OP_ADD), a, b, r2, np.uint64(9), 0, 0)
    assert np.array_equal(o1.view(np.uint32), r1.view(np.uint32))
    assert np.array_equal(o2.view(np.uint32), r2.view(np.uint32))
