"""flop.var's compiled path (scan_kernels.rowvar, flop.USE_ROWVAR / USE_ROWVAR64) gives
the bits of the six tensor steps it replaces, binary32 and binary64, in every mode, for
few rows (rowscan32 order; binary64: the rows' chains) and many rows (row blocks), with
correction 0/1, special values, through LayerNorm and GroupNorm, and leaves the stream
where they leave it (the op after draws the same bits)."""

import numba
import pytest
import torch
import torch.nn.functional as F

from numvar.instrument import flop, fuzzy
from numvar.instrument import norm_kernels as NK
from _spy import count_calls  # noqa: E402

torch.set_num_threads(1)
numba.set_num_threads(1)


def _x(shape, special, dtype=torch.float32):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5), dtype=dtype) * 3 + 1
    if special:
        x.view(-1)[1] = float("inf")
        # a subnormal; the squares overflow
        x.view(-1)[7] = 1e-41 if dtype is torch.float32 else 1e-310
        x.view(-1)[-1] = 3.0e38 if dtype is torch.float32 else 1e300
    return x


def _run(mode, fn, x, fast, monkeypatch):
    monkeypatch.setattr(flop, "USE_ROWVAR", fast)
    monkeypatch.setattr(flop, "USE_ROWVAR64", fast)
    with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=9):
        out = fn(x)
        after = out * 1.7
    return out, after


CASES = {
    "var_few_rows": ((3, 40), lambda x: torch.var(x, -1, correction=1)),
    "var_many_rows_keepdim": ((20, 2, 6), lambda x: torch.var(x, (1, 2), correction=0,
                                                              keepdim=True)),
    "layer_norm": ((2, 18, 8), lambda x: F.layer_norm(x, (8,))),
    "group_norm": ((2, 4, 3, 3), lambda x: F.group_norm(x, 2)),
    # reduced dims of size 1 before kept ones (flop._trailing): InstanceNorm's batch norm
    "var_size1_dims": ((1, 6, 4, 5), lambda x: torch.var(x, (0, 2, 3), correction=0)),
    "instance_norm": ((2, 3, 4, 5), lambda x: F.instance_norm(x)),
}


@pytest.mark.parametrize("mode", ["sr", "ud", "random", "ieee"])
@pytest.mark.parametrize("case", list(CASES))
def test_rowvar_matches_tensor_steps(mode, case, monkeypatch):
    shape, fn = CASES[case]
    for special in (False, True):
        x = _x(shape, special)
        fast = _run(mode, fn, x, True, monkeypatch)
        ref = _run(mode, fn, x, False, monkeypatch)
        for a, b in zip(fast, ref):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), special


#: binary64 cases: (shape, op, whether the compiled call serves it): chains for fewer
#: than kernels.SCAN64_MIN_COLUMNS rows, row blocks from pointwise.ROW_M_MIN rows, the
#: tensor steps between (flop._rowvar_dtype)
CASES64 = {
    "var_one_row": ((1, 33), lambda x: torch.var(x, -1), True),
    "var_two_rows_keepdim": ((2, 5, 7), lambda x: torch.var(x, (1, 2), keepdim=True), True),
    "var_few_rows": (*CASES["var_few_rows"], True),
    "var_many_rows_keepdim": (*CASES["var_many_rows_keepdim"], True),
    "layer_norm": (*CASES["layer_norm"], True),
    "group_norm_two_groups": ((1, 4, 3, 3), lambda x: F.group_norm(x, 2), True),
    "group_norm": (*CASES["group_norm"], False),  # 4 rows: reduce's column tiles
    "instance_norm": (*CASES["instance_norm"], False),  # 6 rows
    "instance_norm_many": ((4, 5, 3, 3), lambda x: F.instance_norm(x), True),
}


@pytest.mark.parametrize("mode", ["sr", "ud", "random", "ieee", "up", "farthest"])
@pytest.mark.parametrize("case", list(CASES64))
def test_rowvar64_matches_tensor_steps(mode, case, monkeypatch):
    """binary64: the compiled call (the rows' chains or blocks, pointwise's binary64
    tiles; up and farthest on the scalar functions) against the six float64 tensor
    steps, taken where flop._rowvar_dtype says (the norms through their decompositions:
    their own compiled calls are norm_kernels' tests)."""
    for flag in ("LAYER_NORM64", "GROUP_NORM64", "BATCH_NORM_TRAIN64"):
        monkeypatch.setattr(NK, flag, False)
    calls = count_calls(monkeypatch, flop.SK, "rowvar")
    shape, fn, served = CASES64[case]
    for special in (False, True):
        x = _x(shape, special, torch.float64)
        fast = _run(mode, fn, x, True, monkeypatch)
        taken = len(calls)
        ref = _run(mode, fn, x, False, monkeypatch)
        assert bool(taken) == served and len(calls) == taken  # by the first run only
        for a, b in zip(fast, ref):
            assert a.dtype == b.dtype == torch.float64 and a.shape == b.shape
            assert torch.equal(a.view(torch.int64), b.view(torch.int64)), special
        calls.clear()


def test_rowvar_taken_and_close(monkeypatch):
    """The switch selects the kernel, and SR's variance stays within the two-pass bound
    of the float64 one: |err| ≤ (2K + 4)·u·Σ(x − μ)²/(K − 1) (first-order, u = 2^-24,
    K terms per sum, doubled for SR's ≤ 1 ulp per rounding)."""
    calls = count_calls(monkeypatch, flop.SK, "rowvar")
    x = _x((3, 40), False)
    out, _ = _run("sr", CASES["var_few_rows"][1], x, True, monkeypatch)
    assert calls
    ref = torch.var(x.double(), -1, correction=1)
    bound = 2 * (2 * 40 + 4) * 2.0 ** -24 * ref
    assert ((out.double() - ref).abs() <= bound).all()
