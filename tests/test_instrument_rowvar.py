"""flop.var's compiled path (scan_kernels.rowvar32, flop.USE_ROWVAR) gives the bits of the
six tensor steps it replaces, in every mode, for few rows (rowscan32 order) and many rows
(row blocks), with correction 0/1, special values, through LayerNorm and GroupNorm, and
leaves the stream where they leave it (the op after draws the same bits)."""

import numba
import pytest
import torch
import torch.nn.functional as F

from numvar.instrument import flop, fuzzy
from _spy import count_calls  # noqa: E402

torch.set_num_threads(1)
numba.set_num_threads(1)


def _x(shape, special):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 3 + 1
    if special:
        x.view(-1)[1] = float("inf")
        x.view(-1)[7] = 1e-41  # subnormal
        x.view(-1)[-1] = 3.0e38  # the squares overflow
    return x


def _run(mode, fn, x, fast, monkeypatch):
    monkeypatch.setattr(flop, "USE_ROWVAR", fast)
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


def test_rowvar_taken_and_close(monkeypatch):
    """The switch selects the kernel, and SR's variance stays within the two-pass bound
    of the float64 one: |err| ≤ (2K + 4)·u·Σ(x − μ)²/(K − 1) (first-order, u = 2^-24,
    K terms per sum, doubled for SR's ≤ 1 ulp per rounding)."""
    calls = count_calls(monkeypatch, flop.SK, "rowvar32")
    x = _x((3, 40), False)
    out, _ = _run("sr", CASES["var_few_rows"][1], x, True, monkeypatch)
    assert calls
    ref = torch.var(x.double(), -1, correction=1)
    bound = 2 * (2 * 40 + 4) * 2.0 ** -24 * ref
    assert ((out.double() - ref).abs() <= bound).all()
