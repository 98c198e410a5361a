"""The compiled embedding_bag kernel (numvar.instrument.bag_kernels) gives the bits of the
tensor path it replaces (USE_KERNEL = False), in every mode, with per-sample weights,
padding, include_last_offset, empty bags, repeated indices and special values, and
leaves the stream where the tensor path leaves it (the op after it draws the same bits)."""

import numba
import pytest
import torch
import torch.nn.functional as F

from numvar.instrument import bag_kernels as BK
from numvar.instrument import fuzzy
from _spy import count_calls  # noqa: E402

torch.set_num_threads(1)
numba.set_num_threads(1)


def _table(special: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(10, 5, generator=g)
    if special:
        w[1, 0] = float("inf")
        w[2, 1] = float("nan")
        w[3, 2] = 1e-40  # subnormal
        w[4, :] = 3.0e38  # the sums overflow
        w[5, 3] = -0.0
    return w


def _run(mode: str, bag_mode: str, special: bool, psw: bool, padding: int | None,
         last: bool, kernel: bool, monkeypatch):
    monkeypatch.setattr(BK, "USE_KERNEL", kernel)
    w = _table(special)
    idx = torch.tensor([1, 2, 4, 1, 4, 3, 2, 9, 0, 5, 5, 7])
    offsets = torch.tensor([0, 4, 4, 7, 12] if last else [0, 4, 4, 7])  # bag 1 empty
    g = torch.Generator().manual_seed(4)
    p = torch.rand(idx.numel(), generator=g) * 3 if psw else None
    with torch.no_grad(), fuzzy(mode=mode, granularity="flop", seed=11):
        out = F.embedding_bag(idx, w, offsets, mode=bag_mode, per_sample_weights=p,
                              include_last_offset=last, padding_idx=padding)
        after = out * 1.3  # same stream position after the op
    return out, after


@pytest.mark.parametrize("mode", ["sr", "ud", "random", "ieee", "up"])
@pytest.mark.parametrize("bag_mode,psw", [("sum", False), ("sum", True), ("mean", False)])
def test_kernel_matches_tensor_path(mode, bag_mode, psw, monkeypatch):
    """Bags of 4, 0, 3 and 5 indices; with the kernel's runs cut at 2 rows too (a bag's
    rows over several calls)."""
    for special, padding, last in [(False, None, False), (True, 4, True)]:
        fast = _run(mode, bag_mode, special, psw, padding, last, True, monkeypatch)
        ref = _run(mode, bag_mode, special, psw, padding, last, False, monkeypatch)
        for a, b in zip(fast, ref):
            assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (special, padding)
    monkeypatch.setattr(BK, "BAG_ROWS", 2)
    short = _run(mode, bag_mode, True, psw, 4, True, True, monkeypatch)
    for a, b in zip(short, ref):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_kernel_is_taken_and_rounds(monkeypatch):
    """The switch selects the kernel (the results would be the tensor path's otherwise:
    counted calls), and SR moves the sums off the float64 result by at most one ulp."""
    calls = count_calls(monkeypatch, BK, "bag32")
    out, _ = _run("sr", "sum", False, True, None, False, True, monkeypatch)
    assert calls, "the kernel was not taken"
    calls.clear()
    _run("sr", "sum", False, True, None, False, False, monkeypatch)
    assert not calls
    w = _table(False).double()
    idx = torch.tensor([1, 2, 4, 1, 4, 3, 2, 9, 0, 5, 5, 7])
    p = torch.rand(idx.numel(), generator=torch.Generator().manual_seed(4)).double() * 3
    exact = F.embedding_bag(idx, w, torch.tensor([0, 4, 4, 7]), mode="sum",
                            per_sample_weights=p)
    # 5 roundings at most per element (products and adds), each within one binary32 ulp of
    # values below 4·max|row·p|: |out - exact| ≤ 5 · 2^-23 · max|exact-ish| (loose, derived)
    bound = 5 * 2.0 ** -23 * (w.abs().max() * p.max() * 5)
    assert (out.double() - exact).abs().max() <= bound
    assert not torch.equal(out, exact.float())  # SR moved at least one element


@pytest.mark.parametrize("kernel", [True, False])
def test_bags_without_padding_or_last_offset_skip_the_mask_with_the_same_bits(kernel,
                                                                               monkeypatch):
    """Without padding_idx and include_last_offset every index lies in a bag and the
    handler takes the indices as they are (no mask); with include_last_offset and a last
    offset at the end the bags are the same and the masked path runs: same bits."""
    for mode in ("sr", "ud"):
        for bag_mode, psw in (("sum", True), ("mean", False)):
            plain = _run(mode, bag_mode, True, psw, None, False, kernel, monkeypatch)
            masked = _run(mode, bag_mode, True, psw, None, True, kernel, monkeypatch)
            for a, b in zip(plain, masked):
                assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (mode, bag_mode)
