"""BitwiseEquivalenceMode: bitwise comparison, in-place/out= ops, RNG, stacks, side effects."""

from __future__ import annotations

import itertools
import json
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numvar.determinism import BitwiseEquivalenceMode, diff_tensors
from numvar.errors import NondeterminismError

_rng = np.random.default_rng()  # OS entropy: fresh noise on every call
_flip = itertools.count()


@torch.library.custom_op("numvar_test_det::noisy", mutates_args=())
def noisy(x: torch.Tensor) -> torch.Tensor:
    """Adds fresh noise each call (not from torch's generators)."""
    return x + torch.from_numpy(_rng.standard_normal(tuple(x.shape)).astype(np.float32)) * 1e-3


@noisy.register_fake
def _(x):
    return torch.empty_like(x)


def _noisy_backward(ctx, g):
    return noisy(g)


noisy.register_autograd(_noisy_backward)


@torch.library.custom_op("numvar_test_det::pair", mutates_args=())
def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Output 0 deterministic, output 1 noisy."""
    return x * 2, noisy(x)


@torch.library.custom_op("numvar_test_det::signed_zero", mutates_args=())
def signed_zero(x: torch.Tensor) -> torch.Tensor:
    """Zeros whose sign alternates between calls (value-equal, not bitwise equal)."""
    out = torch.zeros_like(x)
    return -out if next(_flip) % 2 else out


@torch.library.custom_op("numvar_test_det::nan_payload", mutates_args=())
def nan_payload(x: torch.Tensor) -> torch.Tensor:
    """Quiet NaNs whose payload changes between calls."""
    bits = torch.full(x.shape, 0x7FC00000 + (next(_flip) % 7) + 1, dtype=torch.int32)
    return bits.view(torch.float32)


def test_noisy_custom_op_caught_with_user_stack_forward_and_backward():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).clamp(-3.9, 3.9)
    x.requires_grad_(True)
    with BitwiseEquivalenceMode() as mode:
        y = noisy(x * 2)  # FORWARD-LINE
        y.sum().backward()
    ms = mode.get_mismatches()
    assert [(m.op, m.in_backward) for m in ms] == [("numvar_test_det.noisy.default", False),
                                                  ("numvar_test_det.noisy.default", True)]
    fwd, bwd = ms
    assert fwd.output == 0 and fwd.shapes == ([3, 4], [3, 4])
    assert fwd.dtypes == ("float32", "float32")
    # Two noise draws (sd 1e-3 each) land on the same float32 of |2x| < 8 (ulp <= 2**-20)
    # with p <= 2**-21 / (1.41e-3 * sqrt(2 pi)) < 3e-4 per element: all 12 differ w.p.
    # 0.997 only, 10 or more differ w.p. > 1 - C(12, 3) p**3 > 1 - 1e-8.
    assert fwd.n_differing >= 10
    assert 0 < fwd.max_abs_diff < 1e-2  # |N(0,1)·1e-3 difference| < 1e-2 w.p. > 1 - 1e-12
    for m in ms:  # both name the forward call in this file
        assert m.stack[-1].file == __file__ and "FORWARD-LINE" in m.stack[-1].code
    assert bwd.autograd_node and "noisy" in bwd.autograd_node
    assert "in backward" in bwd.format() and "FORWARD-LINE" in bwd.format()
    js = json.loads(json.dumps(bwd.to_json()))
    assert js["in_backward"] and js["n_differing"] == bwd.n_differing >= 10
    assert js["stack"][-1]["file"] == __file__


def test_raise_on_mismatch_and_restores_global_state():
    torch.set_anomaly_enabled(True, True)
    try:
        filters = list(warnings.filters)
        with pytest.raises(NondeterminismError) as ei:
            with BitwiseEquivalenceMode(raise_on_mismatch=True):
                noisy(torch.ones(5))
        rec = ei.value.record
        assert rec.op == "numvar_test_det.noisy.default" and rec.n_differing == 5
        assert torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled()
        assert warnings.filters == filters
    finally:
        torch.set_anomaly_enabled(False)
    with BitwiseEquivalenceMode():
        assert torch.is_anomaly_enabled() and not torch.is_anomaly_check_nan_enabled()
    assert not torch.is_anomaly_enabled()


def test_multi_output_op_reports_the_differing_output():
    with BitwiseEquivalenceMode() as mode:
        a, b = pair(torch.ones(2, 3))
        torch.sort(torch.randn(10))  # two outputs, deterministic
    (m,) = [m for m in mode.get_mismatches() if m.op == "numvar_test_det.pair.default"]
    assert m.output == 1 and m.n_differing == 6
    assert len(mode.get_mismatches()) == 1  # the inner noisy call runs below the mode


def test_signed_zeros_and_nan_payloads_are_distinguished():
    with BitwiseEquivalenceMode() as mode:
        signed_zero(torch.ones(3))
        nan_payload(torch.ones(4))
    m0, m1 = mode.get_mismatches()
    assert m0.op.endswith("signed_zero.default") and m0.n_differing == 3
    assert m0.max_abs_diff == 0.0  # value-equal, bitwise different
    assert m1.op.endswith("nan_payload.default") and m1.n_differing == 4
    # The comparison itself, element by element.
    a = torch.tensor([0.0, 1.0, float("nan"), 2.0])
    b = torch.tensor([-0.0, 1.0, float("nan"), 2.0])
    b_bits = b.view(torch.int32).clone()
    b_bits[2] += 1  # another NaN payload
    b = b_bits.view(torch.float32)
    assert torch.equal(a[[1, 3]], b[[1, 3]]) and bool(a[0] == b[0])
    d = diff_tensors(a, b)
    assert d.n_differing == 2 and d.max_abs_diff == 0.0
    d = diff_tensors(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0]))
    assert d.n_differing == 1 and d.max_abs_diff == math.inf
    assert diff_tensors(a, a.clone()) is None
    assert diff_tensors(a, a.double()).n_differing == -1  # dtype differs
    c = torch.tensor([1 + 0j, 0j], dtype=torch.complex128)
    c2 = c.clone()
    c2[1] = complex(0.0, -0.0)
    assert diff_tensors(c, c2).n_differing == 1


def test_in_place_and_out_ops_start_from_the_same_state():
    def work():
        base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        v = base[1:, ::2]  # storage offset 6, strides (6, 2)
        v.mul_(3).add_(1)
        w = torch.arange(10, dtype=torch.float64)
        w[:5].add_(w.view(2, 5)[0])  # another tensor viewing the memory it writes
        out = torch.empty(0)
        torch.add(base, 1, out=out)  # out= resized on the first run
        s = torch.ones(3)
        s.add_(s)  # self aliasing other
        torch._foreach_add_([s, out], 1.0)  # mutates, returns nothing
        return base, w, out, s

    plain = work()
    with BitwiseEquivalenceMode() as mode:
        got = work()
    assert mode.get_mismatches() == [], mode.report()
    for a, b in zip(plain, got):
        assert torch.equal(a, b)
    assert torch.equal(got[3], torch.full((3,), 3.0))  # ran once on the user's tensor


def test_random_ops_draw_the_same_numbers_and_leave_the_plain_rng_state():
    def work():
        g = torch.Generator().manual_seed(5)
        x = torch.ones(1000)
        return (F.dropout(x, 0.5), torch.rand(3), torch.randperm(20),
                torch.empty(50).bernoulli_(0.3), torch.empty(4).normal_(generator=g),
                torch.multinomial(torch.ones(10), 5), g.get_state(), torch.get_rng_state())

    torch.manual_seed(11)
    plain = work()
    torch.manual_seed(11)
    with BitwiseEquivalenceMode() as mode:
        got = work()
    assert mode.get_mismatches() == [], mode.report()
    for a, b in zip(plain, got):
        assert torch.equal(a, b)


def test_uninitialised_outputs_are_not_compared(monkeypatch):
    # Two allocations often hold the same bytes, so "no mismatch" alone proves nothing:
    # watch what reaches the comparison.
    import numvar.determinism.bitwise as bitwise

    compared = []

    def spy(a, b):
        compared.append(tuple(a.shape))
        return diff_tensors(a, b)

    monkeypatch.setattr(bitwise, "diff_tensors", spy)
    with BitwiseEquivalenceMode() as mode:
        torch.empty(1000)
        torch.empty_like(torch.ones(7))
        torch.empty_strided((10, 10), (1, 10))
    assert mode.get_mismatches() == []
    assert "bitwise identical" in mode.report()
    assert compared == [(7,)]  # only torch.ones(7); the three empty* outputs never
    assert mode.ops_checked == 4  # but every op still ran twice


@torch.library.custom_op("numvar_test_det::noisy_scalar", mutates_args=())
def noisy_scalar(x: torch.Tensor) -> float:
    """A non-tensor output that changes between calls."""
    return float(x.sum()) + float(_rng.standard_normal())


@torch.library.custom_op("numvar_test_det::greedy", mutates_args=())
def greedy(x: torch.Tensor) -> torch.Tensor:
    """Deterministic output, but draws from torch's generator a varying number of times."""
    for _ in range(next(_flip) % 2 + 1):
        torch.rand(1)
    return x.clone()


def test_non_tensor_outputs_and_generator_advance_are_compared():
    with BitwiseEquivalenceMode() as mode:
        noisy_scalar(torch.ones(3))
        greedy(torch.ones(3))
        torch.ones(3).sum().item()  # _local_scalar_dense: same value twice, no alarm
    m0, m1 = mode.get_mismatches()
    assert m0.op.endswith("noisy_scalar.default") and "values differ" in m0.note
    assert m1.op.endswith("greedy.default") and m1.output == "rng"
    assert "random generator" in m1.note


@torch.library.custom_op("numvar_test_det::both_noisy", mutates_args=())
def both_noisy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return noisy(x), x + 1, noisy(x[:2])


def test_every_differing_output_is_recorded():
    with BitwiseEquivalenceMode() as mode:
        both_noisy(torch.ones(4))
    assert [(m.output, m.n_differing) for m in mode.get_mismatches()] == [(0, 4), (2, 2)]
