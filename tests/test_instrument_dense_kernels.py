"""A dense layer's product and bias in one compiled call (numvar.instrument.dense_kernels)
against the product followed by ``Ctx.add`` (``FUSED_BIAS = False``, the path it
replaces): under ``fuzzy`` at flop granularity a linear layer gives the same bits,
stream position, report and contraction count either way, in sr, ieee, ud and random,
for products the narrow kernel computes (whole and partial blocks of rows, a tail of a
few rows joined to the last block, two threads), products the column kernel computes
(many columns, few rows) and products the few-outputs kernel computes; with inputs off
the clean path (huge and tiny values, inf, NaN) and biases with inf, NaN, −0 and values
2^60 apart from the products (inexact float64 sums: the residual path). What it does
not serve (directed modes, fma, a virtual precision, float64, no bias, a bias that is not
a row) takes the old path."""

import numba
import pytest
import torch
from _bitwise import same
from _spy import count_calls

from numvar.instrument import dense_kernels as DK
from numvar.instrument import fuzzy
from numvar.instrument import kernels as KN
from numvar.workloads.zoo import count_contractions

torch.set_num_threads(1)
numba.set_num_threads(1)

L = KN.NARROW_ROWS
#: (rows, in, out): narrow blocks whole, partial, and with a joined tail; many columns
#: (the column kernel where N exceeds the narrow kernel's widest); few rows; few outputs
SHAPES = ((2 * L, 40, 24), (L + 7, 33, 130), (L + KN.NARROW_TAIL, 16, 8), (L - 5, 20, 24),
          (20, 24, 1100), (3, 37, 300), (2, KN.FEW_K, 3))


def _layer(rows: int, k: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * 2
    if seed % 2:  # rows off the clean path, non-finite values
        x[1, 2] = 3e38
        x[2, 0] = 1e-40
        x[3 % rows, 1] = float("inf")
        x[0, 3] = float("nan")
    lin = torch.nn.Linear(k, n)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g))
        lin.bias.copy_(torch.randn(n, generator=g))
        lin.bias[0] = 2.0 ** 60
        lin.bias[n // 2] = -0.0
        if n > 3:
            lin.bias[1], lin.bias[2] = float("inf"), float("nan")
    return lin, x


def _run(monkeypatch, fused: bool, lin, x, **config):
    monkeypatch.setattr(DK, "FUSED_BIAS", fused)
    with torch.no_grad(), count_contractions() as cc, fuzzy(granularity="flop",
                                                             **config) as fz:
        out = lin(x)
        again = torch.nn.functional.linear(x[:2], lin.weight, lin.bias)
    return (out, again), fz.stream.counter, fz.report().to_dict(), cc.terms


@pytest.mark.parametrize("mode", ["sr", "ieee", "ud", "random"])
def test_linear_with_its_bias_equals_the_product_then_ctx_add(monkeypatch, mode):
    fused_calls = count_calls(monkeypatch, DK, "linear32")
    served = count_calls(monkeypatch, DK, "addmm32")
    narrow = 0
    for i, (rows, k, n) in enumerate(SHAPES):
        lin, x = _layer(rows, k, n, i)
        before = len(served)
        fast = _run(monkeypatch, True, lin, x, mode=mode, seed=6)
        assert len(served) > before or KN.few_path(rows, n, k, 1, 1, 24, False)
        calls = len(fused_calls)
        ref = _run(monkeypatch, False, lin, x, mode=mode, seed=6)
        assert len(fused_calls) == calls, "FUSED_BIAS off took the fused kernel"
        assert same(fast[0], ref[0]), (mode, rows, k, n)
        assert fast[1:] == ref[1:]
        assert fast[3] == (rows + 2) * k * n  # the product's terms counted once each
        narrow += KN._narrow32_serves((1, rows, n), rows * n * k, False)
    assert 0 < len(fused_calls) < 2 * len(SHAPES)  # fused and product-then-add both ran
    assert narrow > 0


def test_fused_bias_on_two_threads(monkeypatch):
    """The fused kernel's tasks on two threads: the bits of one thread and of the old
    path."""
    lin, x = _layer(4 * L + 3, 48, 40, 1)
    one = _run(monkeypatch, True, lin, x, mode="sr", seed=2)
    numba.set_num_threads(2)
    try:
        two = _run(monkeypatch, True, lin, x, mode="sr", seed=2)
    finally:
        numba.set_num_threads(1)
    ref = _run(monkeypatch, False, lin, x, mode="sr", seed=2)
    assert same(one[0], two[0]) and same(one[0], ref[0])
    assert one[1:] == two[1:] == ref[1:]


def test_what_it_does_not_serve_takes_the_old_path(monkeypatch):
    served = count_calls(monkeypatch, DK, "addmm32")
    lin, x = _layer(2 * L, 40, 24, 0)
    cases = [{"mode": "up"}, {"mode": "sr", "contraction": "fma"},
             {"mode": "sr", "precision": 12}]
    for config in cases:
        fast = _run(monkeypatch, True, lin, x, seed=1, **config)
        ref = _run(monkeypatch, False, lin, x, seed=1, **config)
        assert same(fast[0], ref[0]) and fast[1:] == ref[1:], config
    with torch.no_grad(), fuzzy(granularity="flop", mode="sr", seed=1):
        lin.double()(x.double())  # float64
        torch.nn.functional.linear(x, lin.weight.float())  # no bias
        torch.addmm(torch.zeros(2 * L, 24), x, lin.weight.float().t())  # a full matrix
        torch.addmm(lin.bias.float(), x, lin.weight.float().t(), alpha=2.0)  # a scaling
    assert served == []


def test_serves_reads_the_shapes_and_the_block():
    a, b, c = torch.ones(2 * L, 8), torch.ones(8, 24), torch.ones(24)
    with fuzzy(granularity="flop", mode="sr") as fz:
        ctx = fz._ctx
        assert DK.serves(c, a, b, 1, 1, ctx)
        assert DK.serves(c, a, b, 1.0, 1.0, ctx)
        assert not DK.serves(c, a, b, 1, 0.5, ctx)
        assert not DK.serves(torch.ones(23), a, b, 1, 1, ctx)
        assert not DK.serves(torch.ones(48)[::2], a, b, 1, 1, ctx)  # not contiguous
        assert not DK.serves(c, a[:0], b, 1, 1, ctx)  # no rows
        assert not DK.serves(c.double(), a, b, 1, 1, ctx)
    with fuzzy(granularity="flop", mode="sr", format="bfloat16") as fz:
        assert not DK.serves(c, a, b, 1, 1, fz._ctx)
