"""Recorded decompositions (numvar.instrument.replay): replaying a decomposition gives
the results, the random stream and the report of running it again, bit for bit."""

import math

import numba
import pytest
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box

from numvar.instrument import fuzzy
from numvar.instrument import grid_kernels as GK
from numvar.instrument import norm_kernels as NK
from numvar.instrument import mode as MM
from numvar.instrument import replay as RP
from _bitwise import same  # noqa: E402

aten = torch.ops.aten
MODES = ("ieee", "sr", "ud", "random")


def _gen(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * 2).to(dtype)


_same = same


def _cases(dt):
    x = _gen(4, 6, 8, seed=1, dtype=dt)
    w, b = _gen(8, seed=2, dtype=dt), _gen(8, seed=3, dtype=dt)
    m = x.clone()
    m[0, 1, :] = -math.inf
    g = _gen(4, 6, 8, seed=4, dtype=dt)
    tgt = torch.randint(0, 8, (24,), generator=torch.Generator().manual_seed(5))
    img = _gen(3, 4, 5, 5, seed=6, dtype=dt)
    xt = x.transpose(0, 2)
    return {
        "layer_norm": lambda: aten.native_layer_norm.default(x, [8], w, b, 1e-5),
        "layer_norm_t": lambda: aten.native_layer_norm.default(xt, [4], None, None, 1e-5),
        "layer_norm_bwd": lambda: aten.native_layer_norm_backward.default(
            g, x, [8], *aten.native_layer_norm.default(x, [8], w, b, 1e-5)[1:], w, b,
            [True, True, True]),
        "safe_softmax": lambda: aten._safe_softmax.default(m, -1),
        "softmax": lambda: aten._softmax.default(x, 1, False),
        "log_softmax": lambda: aten._log_softmax.default(xt, 0, False),
        "softmax_bwd": lambda: aten._softmax_backward_data.default(g, x.softmax(-1), -1, dt),
        "nll": lambda: aten.nll_loss_forward.default(x.reshape(24, 8).log_softmax(-1), tgt,
                                                      None, 1, -100),
        "var_mean": lambda: aten.var_mean.correction(x, [0, 2], correction=1, keepdim=False),
        "std": lambda: aten.std.correction(x, [1], correction=0, keepdim=True),
        "mse_same": lambda: aten.mse_loss.default(x, x, 1),
        "mse": lambda: aten.mse_loss.default(x, g, 1),
        "batch_norm": lambda: aten.native_batch_norm.default(
            img, _gen(4, seed=7, dtype=dt), _gen(4, seed=8, dtype=dt), torch.zeros(4, dtype=dt),
            torch.ones(4, dtype=dt), True, 0.1, 1e-5),
        "group_norm": lambda: F.group_norm(img, 2, _gen(4, seed=9, dtype=dt), None),
        "dot": lambda: aten.dot.default(w, b),
        "logsumexp": lambda: aten.logsumexp.default(x, [1], False),
    }


def _run(fn, mode, record: bool, monkeypatch):
    """fn under fuzzy twice (the second call replays when recording is on): outputs,
    stream position, report. The compiled kernels of some decompositions are off (they
    would serve the second call instead of the replay; tests/test_instrument_norm_kernels.py
    and test_instrument_grid_kernels.py compare them with the decomposition)."""
    MM._PROGRAMS.clear()
    monkeypatch.setattr(NK, "USE_KERNEL", False)
    monkeypatch.setattr(GK, "USE_KERNELS", False)
    monkeypatch.setattr(RP, "MAX_PROGRAMS", 4096 if record else 0)
    with fuzzy(mode=mode, seed=4) as fz:
        outs = [fn(), fn()]
    return outs, fz.stream.counter, fz.report().to_dict()


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16])
def test_replay_equals_running_the_decomposition(dt, monkeypatch):
    for name, fn in _cases(dt).items():
        for mode in MODES:
            got = _run(fn, mode, True, monkeypatch)
            programs = dict(MM._PROGRAMS)
            want = _run(fn, mode, False, monkeypatch)
            assert _same(got[0], want[0]), (name, mode)
            assert got[1:] == want[1:], (name, mode)
            assert any(p is not None for p in programs.values()), name
    MM._PROGRAMS.clear()


def test_replay_keeps_in_place_updates_of_inputs(monkeypatch):
    """native_batch_norm's decomposition updates the running statistics in place."""
    res = []
    for record in (True, False):
        MM._PROGRAMS.clear()
        monkeypatch.setattr(RP, "MAX_PROGRAMS", 4096 if record else 0)
        rm, rv = torch.zeros(4), torch.ones(4)
        img = _gen(3, 4, 5, 5, seed=1)
        with fuzzy(mode="sr", seed=2):
            for _ in range(3):
                aten.native_batch_norm.default(img, None, None, rm, rv, True, 0.1, 1e-5)
        res.append((rm, rv))
    assert _same(res[0], res[1])
    MM._PROGRAMS.clear()


def test_signature_separates_layouts_aliasing_and_values():
    x, y = _gen(3, 4), _gen(3, 4)
    sig = RP.signature
    f = aten.mse_loss.default
    assert sig(f, (x, y, 1), {}) == sig(f, (y, x, 1), {})
    assert sig(f, (x, x, 1), {}) != sig(f, (x, y, 1), {})  # the same tensor twice
    assert sig(f, (x, y, 1), {}) != sig(f, (x.t().contiguous().t(), y, 1), {})  # strides
    assert sig(f, (x, y, 1), {}) != sig(f, (x, y, 2), {})
    assert sig(f, (x, y, 1), {}) != sig(f, (x, y, True), {})  # types
    g = aten.add.Tensor
    assert sig(g, (x, 0.0), {}) != sig(g, (x, -0.0), {})
    assert sig(g, (x, math.nan), {}) == sig(g, (x, math.nan), {})
    assert sig(g, (x, y), {"alpha": 2}) != sig(g, (x, y), {"alpha": 3})
    assert sig(g, (x[1:], y[1:]), {}) != sig(g, (x[:2], y[:2]), {})  # storage offset
    assert sig(g, (x, [1, {}]), {}) is None  # unhashable: not recorded


def _branchy(x, dim, half_to_float):
    """A decomposition whose Python branches on the data (through .item())."""
    if float(x.sum()) > 0:
        return torch.exp(x)
    return torch.sin(x)


def test_data_dependent_decompositions_are_not_replayed(monkeypatch):
    monkeypatch.setitem(MM._decomps(), aten._softmax.default, _branchy)
    monkeypatch.setattr(MM, "_CLASSIFIED", {})
    monkeypatch.setattr(MM, "_INFOS", {})
    MM._PROGRAMS.clear()
    pos, neg = torch.ones(3, 4), -torch.ones(3, 4)
    with fuzzy(mode="ieee", seed=0):
        a = aten._softmax.default(pos, 1, False)
        b = aten._softmax.default(neg, 1, False)
    assert torch.equal(a, torch.exp(pos)) and torch.equal(b, torch.sin(neg))
    assert list(MM._PROGRAMS.values()) == [None]
    MM._PROGRAMS.clear()


def test_constants_made_outside_the_dispatcher_are_recorded(monkeypatch):
    def with_constant(x, dim, half_to_float):
        return x * torch.tensor([1.0, 2.0, 3.0, 4.0])

    monkeypatch.setitem(MM._decomps(), aten._softmax.default, with_constant)
    monkeypatch.setattr(MM, "_CLASSIFIED", {})
    monkeypatch.setattr(MM, "_INFOS", {})
    MM._PROGRAMS.clear()
    x = _gen(3, 4)
    with fuzzy(mode="ieee", seed=0):
        a = aten._softmax.default(x, 1, False)
        b = aten._softmax.default(x, 1, False)
    assert torch.equal(a, x * torch.tensor([1.0, 2.0, 3.0, 4.0])) and torch.equal(a, b)
    assert all(p is not None for p in MM._PROGRAMS.values())
    MM._PROGRAMS.clear()
