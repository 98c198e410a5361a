"""FuzzyConfig and its environment form; include/exclude/modules restrict provably."""

import numba
import pytest
import torch
import torch.nn as nn

from numvar.errors import ConfigError
from numvar.instrument import ENV_VARS, OP_KINDS, Fuzzy, FuzzyConfig, fuzzy

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box


def test_from_env_unset_is_none():
    assert FuzzyConfig.from_env({}) is None
    assert FuzzyConfig.from_env({"NUMVAR_SEED": "3"}) is None


def test_env_round_trip():
    c = FuzzyConfig(mode="ud", granularity="op", precision=12, seed=7,
                    exclude=("aten.exp*", "aten.nll_loss*"), include=("matmul", "aten.convolution"),
                    modules=("encoder.layers.0*",))
    env = c.to_env()
    assert set(env) <= set(ENV_VARS)
    assert FuzzyConfig.from_env(env) == c
    d = FuzzyConfig.from_env({"NUMVAR_MODE": "SR"})
    assert d == FuzzyConfig(mode="sr") and d.granularity == "flop" and d.seed == 0
    assert FuzzyConfig.from_env(FuzzyConfig().to_env()) == FuzzyConfig()


@pytest.mark.parametrize("var,value", [
    ("NUMVAR_MODE", "stochastic"), ("NUMVAR_GRANULARITY", "tensor"), ("NUMVAR_PRECISION", "x"),
    ("NUMVAR_PRECISION", "0"), ("NUMVAR_PRECISION", "60"), ("NUMVAR_SEED", "-1"),
    ("NUMVAR_SEED", "1.5"), ("NUMVAR_EXCLUDE", "aten.exp ,aten log"),
])
def test_bad_env_value_names_the_variable(var, value):
    env = {"NUMVAR_MODE": "sr", var: value}
    with pytest.raises(ConfigError, match=var):
        FuzzyConfig.from_env(env)


def test_bad_arguments():
    for kw in (dict(mode="rn"), dict(granularity="x"), dict(precision=0), dict(seed=-2),
               dict(precision=True), dict(include=("relu_kind",))):
        with pytest.raises(ConfigError):
            with fuzzy(**kw):
                pass
    with pytest.raises(ConfigError, match="model"):
        with fuzzy(modules=("a",), model=object()):
            pass


def test_config_fuzzy_context():
    c = FuzzyConfig(mode="sr", seed=5)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with Fuzzy(c) as fz:
        y1 = a @ b
    with Fuzzy(c.replace(seed=6)):
        y2 = a @ b
    with Fuzzy(c):
        y3 = a @ b
    assert torch.equal(y1, y3) and not torch.equal(y1, y2)
    assert fz.report().instrumented["aten.mm.default"] == 1


def test_precision_reduces_accuracy():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(8, 64, generator=g), torch.randn(64, 8, generator=g)
    exact = a.double() @ b.double()
    err = {}
    for p in (None, 10):
        with fuzzy(mode="sr", precision=p, seed=1):
            err[p] = ((a @ b).double() - exact).abs().max().item()
    # Each of the 64 outputs is 64 products and 63 adds, each SR-rounded at t bits: its
    # error is a sum of 127 independent zero-mean terms of size < 2^(1-t) times the
    # rounded value, i.e. sigma_t * Z with sigma_t proportional to 2^-t and Z of unit
    # variance (same values, same magnitudes at both precisions). err[p] is the max over
    # 64 outputs of |sigma_t Z_i|, so err[10] / err[24] = 2^14 * M10 / M24 with M the max
    # of 64 |Z_i|. For Gaussian Z, P(M < 0.5) < 0.4^64 and P(M > 6) < 64 * 2e-9: the ratio
    # M10 / M24 lies in [1/12, 12] outside probability 1e-7, so the ratio lies in
    # [2^14 / 12, 2^14 * 12] ⊂ [2^10, 2^18] (the seeds are fixed: deterministic).
    ratio = err[10] / err[None]
    assert 2 ** 10 < ratio < 2 ** 18, ratio


def test_exclude_keeps_an_op_bitwise_native():
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        h = lin(x)
        native = torch.tanh(h)
        with fuzzy(mode="ud", seed=0, exclude=("aten.addmm",)) as fz:
            hf = lin(x)
            y = torch.tanh(hf)
    assert "aten.addmm.default" in fz.report().excluded
    assert torch.equal(hf, h)  # the excluded layer's output is bitwise native
    assert not torch.equal(y, native)  # tanh is still perturbed
    with torch.no_grad(), fuzzy(mode="ud", seed=0, exclude=("transcendental",)):
        z = lin(x)
    assert not torch.equal(z, h)
    with torch.no_grad(), fuzzy(mode="ud", seed=0, exclude=("aten.addmm", "aten.tanh")):
        w = torch.tanh(lin(x))
    assert torch.equal(w, native)


def test_blocks_share_the_op_table_of_their_configuration(monkeypatch):
    """Each op is classified once per (granularity, include, exclude), not once per block
    (``mode._INFOS``), and blocks of other selections, interleaved, keep their own."""
    from numvar.instrument import mode as MD

    calls = []
    classified = MD._classified

    def counted(func, gran):
        calls.append((str(func), gran))
        return classified(func, gran)

    monkeypatch.setattr(MD, "_classified", counted)
    monkeypatch.setattr(MD, "_INFOS", {})
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        native = lin(x)
        outs = []
        for exclude in ((), ("aten.addmm",), (), ("aten.addmm",)):
            with fuzzy(mode="ud", seed=0, exclude=exclude) as fz:
                outs.append(lin(x))
            assert ("aten.addmm.default" in fz.report().excluded) == bool(exclude)
        with fuzzy(mode="ud", seed=0, granularity="op") as fz:
            outs.append(lin(x))
    assert torch.equal(outs[1], native) and torch.equal(outs[3], native)
    assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], native)
    assert not torch.equal(outs[4], native)
    # once per configuration (the two flop selections and op), not once per block
    assert sorted(calls) == [("aten.addmm.default", "flop")] * 2 + [
        ("aten.addmm.default", "op")] + [("aten.t.default", "flop")] * 2 + [
        ("aten.t.default", "op")], calls
    assert len(MD._INFOS) == 3  # (flop, all), (flop, without addmm), (op, all)
    assert all(len(table) == 2 for table in MD._INFOS.values())


def test_include_only_conv():
    conv = nn.Conv2d(2, 3, 3)
    lin = nn.Linear(12, 4)
    x = torch.randn(2, 2, 4, 4)
    with torch.no_grad():
        c_native = conv(x)
        y_native = lin(c_native.flatten(1))
        with fuzzy(mode="sr", seed=0, include=OP_KINDS["conv"]) as fz:
            c = conv(x)
            y = lin(c.flatten(1))
        assert not torch.equal(c, c_native)
        assert torch.equal(y, lin(c.flatten(1)))  # the linear layer ran natively
    assert set(fz.report().instrumented) == {"aten.convolution.default"}
    assert not torch.equal(y, y_native)


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
        self.b = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))

    def forward(self, x1, x2):
        return self.a(x1), self.b(x2)


def _grads(m, x1, x2, ctx=None):
    m.zero_grad()
    if ctx is None:
        ya, yb = m(x1, x2)
        (ya.sum() + yb.sum()).backward()
    else:
        with ctx as fz:
            ya, yb = m(x1, x2)
            (ya.sum() + yb.sum()).backward()
    ga = [p.grad.clone() for p in m.a.parameters()]
    gb = [p.grad.clone() for p in m.b.parameters()]
    return ya.detach(), yb.detach(), ga, gb


@pytest.mark.parametrize("with_model", [True, False])
def test_modules_restrict_forward_and_backward(with_model):
    torch.manual_seed(0)
    m = Two()
    x1, x2 = torch.randn(5, 8), torch.randn(5, 8)
    ya0, yb0, ga0, gb0 = _grads(m, x1, x2)
    ctx = fuzzy(mode="ud", seed=1, modules=("a",), model=m if with_model else None)
    ya, yb, ga, gb = _grads(m, x1, x2, ctx)
    # b: forward and backward outside the selection -> bitwise native
    assert torch.equal(yb, yb0)
    assert all(torch.equal(g, g0) for g, g0 in zip(gb, gb0))
    # a: forward and backward perturbed
    assert not torch.equal(ya, ya0)
    assert not any(torch.equal(g, g0) for g, g0 in zip(ga[:2], ga0[:2]))
    assert ctx.matched_modules == {"a"}
    rep = ctx.report()
    assert rep.outside_modules and rep.instrumented
    # a child glob selects only that layer
    seen = []
    hook = m.a[1].register_forward_hook(lambda mod, i, o: seen.append(o.detach().clone()))
    ctx2 = fuzzy(mode="ud", seed=1, modules=("a.2",), model=m if with_model else None)
    ya2, yb2, _, _ = _grads(m, x1, x2, ctx2)
    hook.remove()
    with torch.no_grad():
        h = m.a[1](m.a[0](x1))
    assert torch.equal(seen[0], h)  # a.0 and a.1 ran natively
    assert torch.equal(yb2, yb0) and not torch.equal(ya2, ya0)  # a.2 perturbed
    assert ctx2.matched_modules == {"a.2"}


def test_nested_blocks_are_refused():
    with fuzzy(mode="sr"):
        with pytest.raises(ConfigError, match="nested"):
            with fuzzy(mode="ud"):
                pass
    with fuzzy(mode="ud"):  # usable again after the refusal
        pass


def test_exclusions_apply_inside_decompositions():
    x = torch.randn(4, 9)
    with fuzzy(mode="ud", seed=0, exclude=("aten.exp",)) as fz:
        torch.softmax(x, -1)
    rep = fz.report()
    assert "aten._softmax.default" in rep.decomposed
    assert "aten.exp.default" in rep.excluded and "aten.exp.default" not in rep.instrumented
    assert "aten.div.Tensor" in rep.instrumented
