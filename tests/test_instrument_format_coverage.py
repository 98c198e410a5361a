"""fuzzy(format=...) reaches every instrumented module, not only the contractions and the
elementwise ops: under format="bfloat16" and "e4m3fn" on float32 tensors, at op and
flop granularity, in ieee mode, the outputs of the accumulating index ops (index_add,
scatter_add, index_put(accumulate=True), embedding backward), linalg.solve, linalg.eigh,
torch.fft.rfft, a fused AdamW step and add with alpha lie on the format's grid (every element equals its own ieee
rounding to the format), or the op is reported as an escape (strict=True raises).

The any-format scatter kernel is checked against its slow reference bit for bit; index_add
against a float32/float64 model of the two accumulation policies; the Jacobi stopping
tolerance against the format's unit roundoff.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numvar
import numvar.rounding as R
from numvar.errors import UninstrumentedOpError
from numvar.instrument import linalg as LA
from numvar.instrument import scatter as SC
from numvar.instrument._core import Ctx
from numvar.rounding.formats import NAMED
from numvar.rounding.kernels import MODE_SR, mode_code

FORMATS = ("bfloat16", "e4m3fn")
GRANS = ("op", "flop")


def _on_grid(t: torch.Tensor, fmt: str) -> bool:
    """Every element of ``t`` (real or complex) equals its ieee rounding to ``fmt``."""
    if t.is_complex():
        return _on_grid(t.real, fmt) and _on_grid(t.imag, fmt)
    x = t.detach().to(torch.float64)
    r = R.round(x, format=fmt, mode="ieee", stream=R.Stream(0), dtype=torch.float64)
    return bool(torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(r, nan=7.0)))


def _data():
    g = torch.Generator().manual_seed(3)
    return lambda *s: torch.randn(*s, generator=g)  # float32 values off the format's grid


def _index_add(rnd):
    return torch.index_add(rnd(4, 3), 0, torch.tensor([0, 2, 0, 1, 2]), rnd(5, 3))


def _scatter_add(rnd):
    idx = torch.tensor([[0, 1, 0], [2, 0, 1], [0, 0, 2]])
    return torch.scatter_add(rnd(3, 3), 0, idx, rnd(3, 3))


def _index_put(rnd):
    x = rnd(5, 2)
    return x.index_put((torch.tensor([1, 3, 1, 4, 1]),), rnd(5, 2), accumulate=True)


def _embedding_backward(rnd):
    w = rnd(5, 3).requires_grad_()
    torch.nn.functional.embedding(torch.tensor([1, 3, 1, 0]), w).backward(rnd(4, 3))
    return w.grad


def _solve(rnd):
    a = rnd(3, 3) + 3 * torch.eye(3)
    return torch.linalg.solve(a, rnd(3, 2))


def _eigh(rnd):
    a = rnd(4, 4)
    return list(torch.linalg.eigh(a + a.T))


def _rfft(rnd):
    return torch.fft.rfft(rnd(2, 8))


def _adamw(rnd):
    p = torch.nn.Parameter(rnd(4, 3))
    p.grad = rnd(4, 3)
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    opt.step()
    st = opt.state[p]
    return [p.detach(), st["exp_avg"], st["exp_avg_sq"]]


def _add_alpha(rnd):
    return torch.add(rnd(4, 3), rnd(4, 3), alpha=0.3)


CASES = {"index_add": _index_add, "scatter_add": _scatter_add, "index_put": _index_put,
         "embedding_backward": _embedding_backward,
         "linalg.solve": _solve, "linalg.eigh": _eigh, "rfft": _rfft, "adamw_fused": _adamw, "add_alpha": _add_alpha}


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_on_format_grid_or_escaped(case, fmt, gran):
    rnd = _data()
    with numvar.fuzzy(mode="ieee", granularity=gran, format=fmt) as fz:
        out = CASES[case](rnd)
    outs = out if isinstance(out, list) else [out]
    escaped = fz.report().escaped
    for o in outs:
        assert o.dtype in (torch.float32, torch.complex64)  # tensors keep their dtype
    if escaped:
        # an escape must be loud: strict=True raises on the same op
        with pytest.raises(UninstrumentedOpError):
            with numvar.fuzzy(mode="ieee", granularity=gran, format=fmt, strict=True):
                CASES[case](_data())
        return
    for o in outs:
        assert _on_grid(o, fmt), (case, fmt, gran, o)


@pytest.mark.parametrize("fmt", FORMATS)
def test_native_and_same_policies_of_the_scatter_kernels(fmt):
    """index_add at flop granularity: accumulate="native" equals a binary32 accumulation
    in source order rounded once to the format (ieee: float32 adds are correctly rounded
    in numpy, the final rounding by numvar.rounding.round); accumulate="same" equals
    the same order with every add rounded to the format."""
    rnd = _data()
    x, src = rnd(3, 2), rnd(6, 2)
    idx = torch.tensor([0, 2, 0, 0, 1, 2])
    ieee = lambda v: R.round(torch.as_tensor(v, dtype=torch.float64), format=fmt,  # noqa: E731
                             mode="ieee", stream=R.Stream(0), dtype=torch.float64)
    native = x.numpy().astype(np.float32).copy()
    same = x.to(torch.float64).numpy().copy()
    for k in range(6):
        native[idx[k]] = native[idx[k]] + src[k].numpy()
        same[idx[k]] = ieee(same[idx[k]] + src[k].to(torch.float64).numpy()).numpy()
    for acc, want in (("native", ieee(native.astype(np.float64))),
                      ("same", ieee(same))):  # untouched rows: one rounding of self
        with numvar.fuzzy(mode="ieee", granularity="flop", format=fmt, accumulate=acc):
            got = torch.index_add(x, 0, idx, src)
        assert got.dtype is torch.float32
        assert torch.equal(got.to(torch.float64), torch.as_tensor(want)), acc


@pytest.mark.parametrize(("fmt", "t"), [("bfloat16", 8), ("e4m3fn", 4)])
def test_jacobi_tolerance_follows_the_format(fmt, t):
    """The Jacobi sweeps of eigh/svd stop at the unit roundoff of the format the results
    are rounded to (not binary32's, which a bf16 or fp8 rotation can never reach)."""
    ctx = Ctx("ieee", "flop", None, R.Stream(0), format=R.formats.NAMED[fmt])
    assert LA._eps(ctx, torch.float32) == 2.0 ** (1 - t)
    assert LA._eps(Ctx("ieee", "flop", None, R.Stream(0)), torch.float32) == 2.0 ** -23


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_accumulate_matches_reference(fmt):
    """The any-format scatter kernel equals its slow reference bit for bit under SR."""
    rng = np.random.default_rng(5)
    spec = NAMED[fmt].spec()
    out0 = rng.standard_normal(7)
    pos = rng.integers(0, 7, 40).astype(np.int64)
    src = rng.standard_normal(40)
    for include_self in (True, False):
        for op in (SC.ADD, SC.MUL):
            a = SC.accumulate(out0.copy(), pos, src, 11, mode_code("sr"), spec[0], op=op,
                              include_self=include_self, spec=spec)
            b = SC.accumulate_reference(out0.copy(), pos, src, 11, MODE_SR, spec[0], op=op,
                                        include_self=include_self, spec=spec)
            assert np.array_equal(a, b)
