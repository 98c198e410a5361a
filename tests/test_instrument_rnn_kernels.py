"""Recurrent layers in compiled steps (numvar.instrument.rnn_kernels) against the same
layers run op by op through the mode (their slow reference, ``USE_KERNEL = False``):
the same bits of every output (values, shapes, strides), the same stream position after
the layer (an op after it draws the same bits) and the same report, for ``nn.GRU``,
``nn.LSTM`` and ``nn.RNN`` (tanh, relu), at op and flop granularity, in every rounding
mode, with several layers, both directions, batch first, no biases, given initial
states, one step and one sequence, and inputs holding inf, NaN and values whose sums
overflow (after a first call on finite values: the compiled steps then meet the special
values on their own); packed sequences; and the single-step cells (``nn.GRUCell`` & co)
in a decoder's loop, with their own key order. The paths that must stay op by op
(autograd, dropout between layers, binary64, virtual precisions, formats, op filters,
another dispatch mode on top) are checked not to take the kernels, and a compiled
result that differs from the op-by-op one on the first call keeps that signature op by
op."""

import threading

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from numvar.instrument import fuzzy
from numvar.instrument import mode as MD
from numvar.instrument import rnn_kernels as RN
from _spy import count_calls  # noqa: E402

CELLS = {"gru": lambda *a, **k: torch.nn.GRU(*a, **k),
         "lstm": lambda *a, **k: torch.nn.LSTM(*a, **k),
         "rnn_tanh": lambda *a, **k: torch.nn.RNN(*a, **k),
         "rnn_relu": lambda *a, **k: torch.nn.RNN(*a, nonlinearity="relu", **k)}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Every test starts with no signature seen, so its first call is the comparison."""
    monkeypatch.setattr(MD, "_RECURRENT_SEEN", {})


def _inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*shape, generator=g) * 2 for _ in range(3)]
    special = xs[1].view(-1, shape[-1])
    special[0, 0] = float("inf")
    special[1, 1] = float("nan")
    special[-1, -1] = -3e38  # input projections overflow to -inf
    return xs


def _run(use, monkeypatch, model, xs, mode, gran, hx=None, seed=4):
    monkeypatch.setattr(RN, "USE_KERNEL", use)
    with torch.no_grad(), fuzzy(mode=mode, granularity=gran, seed=seed) as fz:
        outs = [model(x) if hx is None else model(x, hx) for x in xs]
        after = torch.ones(7) / 3 * torch.ones(7)  # an op after the layers
        pos = fz.stream.counter
    return outs, after, pos, fz.report().to_dict()


def _tensors(o):
    if isinstance(o, torch.Tensor):
        return [o]
    return [t for v in o for t in _tensors(v)]


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    assert torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _check(monkeypatch, cell, mode="sr", gran="op", shape=(5, 3, 4), hidden=6, hx=None,
           xs=None, **kw):
    torch.manual_seed(0)
    model = CELLS[cell](shape[-1], hidden, **kw).eval()
    xs = _inputs(shape, 1) if xs is None else xs
    runs = count_calls(monkeypatch, RN, "run")
    fast = _run(True, monkeypatch, model, xs, mode, gran, hx)
    assert len(runs) == len(xs), "the compiled steps did not run on every call"
    assert all(v is not None for v in MD._RECURRENT_SEEN.values())
    ref = _run(False, monkeypatch, model, xs, mode, gran, hx)
    assert len(runs) == len(xs)
    for a, b in zip(_tensors(fast[0]) + [fast[1]], _tensors(ref[0]) + [ref[1]]):
        _same(a, b)
    assert fast[2] == ref[2] and fast[3] == ref[3]
    return fast[0]


@pytest.mark.parametrize("gran", ["op", "flop"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_compiled_steps_match_op_by_op(monkeypatch, cell, gran):
    outs = _check(monkeypatch, cell, gran=gran, num_layers=2)
    y = outs[1][0]
    assert torch.isnan(y).any() and torch.isfinite(outs[0][0]).all()  # specials came through


@pytest.mark.parametrize("mode", ["ud", "random", "ieee", "down"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_every_rounding_mode(monkeypatch, cell, mode):
    _check(monkeypatch, cell, mode=mode, gran="flop" if mode == "down" else "op")


@pytest.mark.parametrize("gran", ["op", "flop"])
@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn_tanh"])
def test_bidirectional_batch_first_without_bias(monkeypatch, cell, gran):
    _check(monkeypatch, cell, gran=gran, num_layers=2, bidirectional=True, batch_first=True,
           shape=(3, 5, 4))
    _check(monkeypatch, cell, gran=gran, bias=False, shape=(2, 1, 3), hidden=5)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_given_states_one_step_and_flop_fma(monkeypatch, cell):
    g = torch.Generator().manual_seed(7)
    h = torch.randn(2, 3, 6, generator=g)
    hx = (h, torch.randn(2, 3, 6, generator=g)) if cell == "lstm" else h
    _check(monkeypatch, cell, hx=hx, num_layers=2)
    _check(monkeypatch, cell, shape=(1, 3, 4), gran="flop")
    monkeypatch.setattr(MD, "_RECURRENT_SEEN", {})
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", contraction="fma", seed=2):
        model = CELLS[cell](4, 6).eval()
        outs = [model(x) for x in _inputs((4, 2, 4), 3)]
    assert all(v is not None for v in MD._RECURRENT_SEEN.values())
    monkeypatch.setattr(RN, "USE_KERNEL", False)
    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", contraction="fma", seed=2):
        ref = [model(x) for x in _inputs((4, 2, 4), 3)]
    for a, b in zip(_tensors(outs), _tensors(ref)):
        _same(a, b)


def test_values_move_with_the_seed_and_stay_close(monkeypatch):
    """The compiled steps perturb: two seeds differ, both stay within a few binary32
    ulps of the IEEE result relative to the output's scale (a 5-step GRU of O(1)
    values: errors of order 2^-24 per op, some tens of ops deep)."""
    torch.manual_seed(0)
    model = torch.nn.GRU(4, 6).eval()
    x = torch.randn(5, 3, 4)
    with torch.no_grad():
        native = model(x)[0].double()
        outs = []
        for seed in (1, 2):
            with fuzzy(mode="sr", granularity="op", seed=seed):
                outs.append([model(x)[0] for _ in range(2)][1])
    assert not torch.equal(outs[0], outs[1])
    for o in outs:
        assert (o.double() - native).abs().max() < 1e-5


def _op_by_op(monkeypatch, model, x, **kw):
    runs = count_calls(monkeypatch, RN, "run")
    with fuzzy(**kw) as fz:
        model(x)
        model(x)
    assert not runs and not any(MD._RECURRENT_SEEN.values())
    return fz.report()


def test_paths_that_stay_op_by_op(monkeypatch):
    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 6, num_layers=2, dropout=0.5)
    x = torch.randn(5, 3, 4)
    # autograd: parameters need gradients
    rep = _op_by_op(monkeypatch, gru.eval(), x, mode="sr", granularity="op", seed=1)
    assert rep.instrumented.get("aten.addmm.default")
    with torch.no_grad():
        # dropout between layers while training
        _op_by_op(monkeypatch, gru.train(), x, mode="sr", granularity="op", seed=1)
        gru.eval()
        # binary64, a virtual precision, a format, an op filter
        _op_by_op(monkeypatch, torch.nn.GRU(4, 6).double(), x.double(), mode="sr",
                  granularity="op", seed=1)
        _op_by_op(monkeypatch, gru, x, mode="sr", granularity="op", precision=12, seed=1)
        _op_by_op(monkeypatch, gru, x, mode="sr", granularity="op", format="bf16", seed=1)
        _op_by_op(monkeypatch, gru, x, mode="sr", granularity="op",
                  exclude=["aten.tanh*"], seed=1)
        # an LSTM with projections
        _op_by_op(monkeypatch, torch.nn.LSTM(4, 6, proj_size=3).eval(), x, mode="sr",
                  granularity="flop", seed=1)


def test_another_mode_on_top_sees_the_ops(monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    gru = torch.nn.GRU(4, 6).eval()
    runs = count_calls(monkeypatch, RN, "run")
    with torch.no_grad(), fuzzy(mode="sr", granularity="op", seed=1), Spy():
        gru(torch.randn(2, 1, 4))
    assert not runs and "aten.sigmoid_.default" in seen


def test_a_differing_compiled_result_keeps_op_by_op(monkeypatch):
    """The comparison on the first call is what lets the compiled steps run: one bit
    off, and that signature runs op by op from then on (same bits as the reference)."""
    real = RN.run

    def off_by_one_bit(*args):
        out = real(*args)
        y = out[0].view(-1)
        y.view(torch.int32)[3] ^= 1
        return out

    monkeypatch.setattr(RN, "run", off_by_one_bit)
    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 6).eval()
    xs = _inputs((5, 3, 4), 2)
    with torch.no_grad(), fuzzy(mode="sr", granularity="op", seed=1) as fz:
        got = [gru(x)[0] for x in xs]
        pos = fz.stream.counter
    assert list(MD._RECURRENT_SEEN.values()) == [None]
    monkeypatch.setattr(RN, "USE_KERNEL", False)
    with torch.no_grad(), fuzzy(mode="sr", granularity="op", seed=1) as fz:
        ref = [gru(x)[0] for x in xs]
    assert fz.stream.counter == pos
    for a, b in zip(got, ref):
        _same(a, b)


def test_torch_vf_restored_and_other_threads_native():
    """``torch._VF`` is patched while a block is open and restored after the last one
    closes; a thread without a block of its own gets PyTorch's result."""
    gru = torch.nn.GRU(4, 6).eval()
    x = torch.randn(3, 2, 4)
    with torch.no_grad():
        native = gru(x)[0]
    inside, done = threading.Event(), threading.Event()

    def block():
        with torch.no_grad(), fuzzy(mode="sr", granularity="op", seed=1):
            inside.set()
            done.wait(30)

    t = threading.Thread(target=block)
    t.start()
    assert inside.wait(30)
    assert "gru" in torch._VF.__dict__
    with torch.no_grad():
        other = gru(x)[0]
    done.set()
    t.join()
    assert torch.equal(other, native)
    assert not any(name in torch._VF.__dict__ for name in RN.GATES)


@pytest.mark.parametrize("gran", ["op", "flop"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_many_rows_and_nans_of_both_signs(monkeypatch, cell, gran):
    """(B, H) results of 1200 elements, more than one tile of the elementwise kernels
    (1024), in rows of 30 (no divisor of 1024): each op must use the tiles the mode's
    op uses, or NaNs of opposite signs meeting in one op come out with the other sign
    where one path runs the vectorised loop and the other its scalar remainder."""
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(3, 40, 5, generator=g) for _ in range(2)]
    for x in xs:
        x[:, ::3, 1] = float("nan")
        x[1, 1::4, 2] = -float("inf")
    _check(monkeypatch, cell, gran=gran, xs=xs, shape=(3, 40, 5), hidden=30)


def test_folds_are_the_modes():
    """The fold the step kernels give each elementwise op is the one ``pointwise.plan``
    gives the mode's op on tensors of those layouts (it sets the tiles)."""
    from numvar.instrument import pointwise as PW

    for B in (1, 2, 5):
        for H in (3, 64):
            for sa in (H, 3 * H, 4 * H):
                for sb in (H, 3 * H):
                    a = torch.zeros(B, sa)[:, :H]
                    b = torch.zeros(B, sb)[:, :H]
                    dims = PW.plan(torch.Size((B, H)), a, b)[0]
                    flat = RN.folds_flat(B, H, sa, sb)
                    assert dims == ((1, 1, B * H) if flat else (1, B, H)), (B, H, sa, sb)
            bias, mm = torch.zeros(3 * H), torch.zeros(B, 3 * H)
            assert PW.plan(torch.Size((B, 3 * H)), bias, mm)[0] == (
                (1, 1, 3 * H) if B == 1 else (1, B, 3 * H))


CELL_MODULES = {"gru": torch.nn.GRUCell, "lstm": torch.nn.LSTMCell, "rnn_tanh": torch.nn.RNNCell,
                "rnn_relu": lambda *a, **k: torch.nn.RNNCell(*a, nonlinearity="relu", **k)}


def _cell_loop(use, monkeypatch, cell, xs, gran, mode, **kw):
    monkeypatch.setattr(RN, "USE_KERNEL", use)
    torch.manual_seed(0)
    m = CELL_MODULES[cell](5, 6, **kw)
    with torch.no_grad(), fuzzy(mode=mode, granularity=gran, seed=3) as fz:
        h, outs = None, []
        for x in xs:  # a decoder's loop: each call one step, its state fed back
            h = m(x) if h is None else m(x, h)
            outs.append(h)
        after = torch.ones(5) / 3 * torch.ones(5)
        pos = fz.stream.counter
    return outs, after, pos, fz.report().to_dict()


@pytest.mark.parametrize("gran", ["op", "flop"])
@pytest.mark.parametrize("cell", list(CELL_MODULES))
def test_cells_match_op_by_op(monkeypatch, cell, gran):
    """``nn.GRUCell`` & co (``torch._VF.gru_cell`` & co): one step per call, with the
    key order of RNN.cpp's cells (a GRU projects its input first, an LSTM and a plain RNN
    their hidden state first); with and without biases, a NaN and an inf in the inputs
    after the first call."""
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(3, 5, generator=g) * 2 for _ in range(4)]
    xs[2][1, 1] = float("nan")
    xs[3][0, 2] = float("inf")
    for kw in ({}, {"bias": False}):
        monkeypatch.setattr(MD, "_RECURRENT_SEEN", {})
        runs = count_calls(monkeypatch, RN, "run")
        fast = _cell_loop(True, monkeypatch, cell, xs, gran, "sr", **kw)
        assert len(runs) == len(xs) and all(v is not None for v in MD._RECURRENT_SEEN.values())
        ref = _cell_loop(False, monkeypatch, cell, xs, gran, "sr", **kw)
        for a, b in zip(_tensors(fast[0]) + [fast[1]], _tensors(ref[0]) + [ref[1]]):
            _same(a, b)
        assert fast[2] == ref[2] and fast[3] == ref[3]


def test_cells_that_stay_op_by_op(monkeypatch):
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(5, 6)
    x = torch.randn(3, 5)
    _op_by_op(monkeypatch, cell, x, mode="sr", granularity="op", seed=1)  # autograd
    with torch.no_grad():
        hx = torch.randn(6, 3).t()  # a state that is not contiguous
        runs = count_calls(monkeypatch, RN, "run")
        with fuzzy(mode="sr", granularity="op", seed=1):
            cell(x, hx)
        assert not runs
        _op_by_op(monkeypatch, torch.nn.LSTMCell(5, 6).double(), x.double(), mode="sr",
                  granularity="flop", seed=1)
        _op_by_op(monkeypatch, cell, x, mode="sr", granularity="op", precision=10, seed=1)


def _packed_run(use, monkeypatch, model, xs, gran, hx):
    monkeypatch.setattr(RN, "USE_KERNEL", use)
    with torch.no_grad(), fuzzy(mode="sr", granularity=gran, seed=6) as fz:
        outs = [model(x, hx) for x in xs]
        after = torch.ones(5) / 3 * torch.ones(5)
        pos = fz.stream.counter
    flat = []
    for y, hidden in outs:
        flat += [y.data] + _tensors(hidden)
    return flat + [after], pos, fz.report().to_dict()


@pytest.mark.parametrize("gran", ["op", "flop"])
@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn_tanh"])
def test_packed_sequences_match_op_by_op(monkeypatch, cell, gran):
    """Packed sequences (RNN.cpp's ``PackedLayer``: each step on the rows of the sequences
    still running; ``ReversedPackedLayer``: sequences joining as the steps go back): two
    layers, both directions; lengths that end at every step, one sequence of length 1,
    another pattern of the same number of steps (other slices, so other counts in the
    report: the signature holds the batch sizes), NaN and inf in the data."""
    torch.manual_seed(0)
    model = CELLS[cell](4, 6, num_layers=2, bidirectional=True).eval()
    g = torch.Generator().manual_seed(8)
    pads = [torch.randn(5, 4, 4, generator=g) for _ in range(3)]
    pads[1][0, 1, 2] = float("nan")
    pads[2][2, 0, 0] = float("inf")
    lengths = ([5, 4, 2, 1], [5, 3, 3, 2], [5, 5, 1, 1])
    xs = [pack_padded_sequence(x, torch.tensor(n)) for x, n in zip(pads, lengths)]
    h0 = torch.randn(4, 4, 6, generator=g)  # given states: rows that join late start there
    hx = (h0, torch.randn(4, 4, 6, generator=g)) if cell == "lstm" else h0
    runs = count_calls(monkeypatch, RN, "run")
    fast = _packed_run(True, monkeypatch, model, xs, gran, hx)
    assert len(runs) == len(xs) and len(MD._RECURRENT_SEEN) == 3
    assert all(v is not None for v in MD._RECURRENT_SEEN.values())
    ref = _packed_run(False, monkeypatch, model, xs, gran, hx)
    for a, b in zip(fast[0], ref[0]):
        _same(a, b)
    assert fast[1:] == ref[1:]
