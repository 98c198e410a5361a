"""Whole models under every mode and granularity: forward, backward, an Adam step."""

import numba
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from numvar.instrument import fuzzy

torch.set_num_threads(1)
numba.set_num_threads(1)  # parallel regions stall on a loaded 2-core CI box
MODES = ("ieee", "sr", "ud", "random")


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 5, padding=2)
        self.c2 = nn.Conv2d(6, 16, 5)
        self.f1 = nn.Linear(16 * 5 * 5, 120)
        self.f2 = nn.Linear(120, 84)
        self.f3 = nn.Linear(84, 10)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = self.drop(F.relu(self.f1(x.flatten(1))))
        return self.f3(F.relu(self.f2(x)))


class Encoder(nn.Module):
    def __init__(self, vocab=40, d=16, heads=2, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 32, dropout=0.1, batch_first=True,
                                           activation="gelu")
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 3)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)).mean(1))


def _data(kind):
    g = torch.Generator().manual_seed(0)
    if kind == "lenet":
        return torch.randn(3, 1, 28, 28, generator=g), torch.randint(0, 10, (3,), generator=g)
    return torch.randint(0, 40, (3, 7), generator=g), torch.randint(0, 3, (3,), generator=g)


def _step(kind, fz_kw):
    """Fresh model (seeded), one forward/backward/Adam step, under fuzzy(**fz_kw) or natively."""
    torch.manual_seed(1)
    model = LeNet() if kind == "lenet" else Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = _data(kind)
    torch.manual_seed(2)  # dropout draws start here
    state_before = torch.get_rng_state()

    def body():
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return out.detach(), loss.detach()

    if fz_kw is None:
        out, loss = body()
        rep = None
    else:
        with fuzzy(**fz_kw) as fz:
            out, loss = body()
        rep = fz.report()
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.detach().clone() for p in model.parameters()]
    return out, loss, params, grads, state_before, torch.get_rng_state(), rep


@pytest.mark.parametrize("kind", ["lenet", "encoder"])
@pytest.mark.parametrize("granularity", ["flop", "op"])
def test_train_step_every_mode(kind, granularity):
    out0, loss0, params0, grads0, _, rng_native, _ = _step(kind, None)
    for mode in MODES:
        kw = dict(mode=mode, granularity=granularity, seed=10)
        out, loss, params, grads, before, after, rep = _step(kind, kw)
        assert all(torch.isfinite(g).all() for g in grads), mode
        assert all(torch.isfinite(p).all() for p in params), mode
        # close to the native step: a sanity check only; the size of the perturbation
        # each mode implies is checked by test_lenet_perturbation_size_matches_the_mode
        # and test_encoder_perturbation_is_of_order_2_to_minus_t below
        assert torch.allclose(out, out0, rtol=1e-3, atol=1e-4), mode
        assert abs(loss.item() - loss0.item()) < 1e-3
        # torch's RNG: only the model's own draws (dropout), identical to the native run
        assert torch.equal(after, rng_native), mode
        assert not rep.native, rep.native
        inst = rep.instrumented
        assert ("aten.convolution_backward.default" in inst) == (kind == "lenet")
        assert "aten.addmm.default" in inst and "aten.mm.default" in inst
        if mode != "ieee":
            assert not torch.equal(out, out0) or not all(
                torch.equal(g, g0) for g, g0 in zip(grads, grads0)), mode
    # seeds: the same seed is bitwise reproducible, another seed differs
    a = _step(kind, dict(mode="sr", granularity=granularity, seed=3))
    b = _step(kind, dict(mode="sr", granularity=granularity, seed=3))
    c = _step(kind, dict(mode="sr", granularity=granularity, seed=4))
    for x, y in zip(a[2] + a[3], b[2] + b[3]):
        assert torch.equal(x, y)
    assert torch.equal(a[0], b[0])
    assert not all(torch.equal(x, y) for x, y in zip(a[3], c[3]))


def test_flop_encoder_report_covers_attention_and_norms():
    *_, rep = _step("encoder", dict(mode="sr", seed=0))
    dec = rep.decomposed
    for op in ("aten.native_layer_norm.default", "aten.native_layer_norm_backward.default",
               "aten._log_softmax.default"):
        assert op in dec, op
    assert "aten.bmm.default" in rep.instrumented  # attention's math path
    assert any("softmax" in n for n in dec)
    assert "aten.gelu.default" in rep.instrumented and "aten.gelu_backward.default" in rep.instrumented
    assert not any("flash" in n or "efficient" in n for n in rep.instrumented)


def test_foreach_adam_is_instrumented_per_tensor():
    res = {}
    for foreach in (False, True):
        torch.manual_seed(0)
        m = nn.Linear(6, 3)
        opt = torch.optim.Adam(m.parameters(), lr=0.1, foreach=foreach)
        x = torch.randn(5, 6)
        with fuzzy(mode="sr", seed=0) as fz:
            for _ in range(2):
                opt.zero_grad()
                m(x).pow(2).sum().backward()
                opt.step()
        rep = fz.report()
        assert not rep.native
        res[foreach] = m.weight.detach().clone()
    assert any(n.startswith("aten._foreach_addcdiv_") for n in rep.decomposed)
    assert "aten.addcdiv.default" in rep.instrumented and "aten.lerp.Scalar" in rep.instrumented
    assert torch.allclose(res[True], res[False], atol=1e-5)


# ------------------------------------------------- size of the perturbation, per mode
def _running_bound(model, x, u):
    """Rigorous bound on |ŷ - y| per logit of LeNet's forward (eval) when every product
    and every add of the convolutions and linear layers errs by at most u relative
    (Higham's gamma_{K+1} for a K-term dot product plus the bias), and the errors of the
    inputs propagate through |W| (ReLU and max-pooling are 1-Lipschitz). Float64."""
    def gamma(n):
        assert n * u < 0.5
        return n * u / (1 - n * u)

    def layer(fn, w, b, h, e, k):
        val = fn(h, w, b)
        mag = fn(h.abs() + e, w.abs(), b.abs())
        return val, fn(e, w.abs(), None) + gamma(k + 1) * mag

    m = {k: v.detach().double() for k, v in model.state_dict().items()}
    h, e = x.double(), torch.zeros_like(x, dtype=torch.float64)
    h, e = layer(lambda a, w, b: F.conv2d(a, w, b, padding=2), m["c1.weight"], m["c1.bias"],
                 h, e, 25)
    h, e = F.max_pool2d(F.relu(h), 2), F.max_pool2d(e, 2)
    h, e = layer(F.conv2d, m["c2.weight"], m["c2.bias"], h, e, 150)
    h, e = F.max_pool2d(F.relu(h), 2).flatten(1), F.max_pool2d(e, 2).flatten(1)
    for name, k in (("f1", 400), ("f2", 120)):
        h, e = layer(F.linear, m[f"{name}.weight"], m[f"{name}.bias"], h, e, k)
        h = F.relu(h)
    h, e = layer(F.linear, m["f3.weight"], m["f3.bias"], h, e, 84)
    return h, e


@pytest.mark.parametrize("mode", ["sr", "ud", "random"])
def test_lenet_perturbation_size_matches_the_mode(mode):
    """At t bits, the logits move by an amount of order 2^-t:
    - above: never more than the rigorous running bound with u = 2^(2-t) (an SR, random
      or UD rounding errs by < 1.5 ulp <= 2^(2-t) relative; at t = 8 this worst-case
      bound exceeds 1 for the 400-term layer, so it is checked at t = 24 and 16), plus
      native's own bound (u = 2^-24);
    - below: two seeds give different logits. Each logit is the sum of >= 84 products
      and adds, each an independent random rounding of an inexact value, so the
      difference between seeds is a multiple of the logit's ulp with a spread of
      several ulps (sigma >= 1.6 ulp): it is 0 with probability about
      1 / (sigma sqrt(2 pi)) <= 0.25, and more than half of 30 logits equal has
      probability < 1e-4 (binomial tail). The mean spread is at least 2^-t / 16 of the
      logits' scale S = |W3| |h| + |b3| (each of those roundings has a spread of order
      2^-t of its partial sum; the factor 16 covers partial sums smaller than S).
    - and of order 2^-t: the worst-case bound above is ~10^5 times the actual error,
      so the mean spread is also bounded above statistically: independent zero-mean
      (SR) or bounded-mean (UD, random) errors of the ~780 roundings on a logit's
      deepest chain accumulate as sqrt(n) u S (Connolly, Higham & Mary, 2021), and the
      layer gains are <= 2 here: sqrt(780) * 2 ~ 56 <= 64, so spread / S <= 64 * 2^-t.
      Measured: 1.6 to 6 times 2^-t for all three modes and t in {8, 16, 24}.
    A mode whose roundings were no-ops, or were applied at the wrong precision, fails."""
    torch.manual_seed(1)
    model = LeNet().eval()
    x, _ = _data("lenet")
    with torch.no_grad():
        native = model(x).double()
        _, native_bound = _running_bound(model, x, 2.0 ** -24)
        h = model.f2(F.relu(model.f1(
            F.max_pool2d(F.relu(model.c2(F.max_pool2d(F.relu(model.c1(x)), 2))), 2)
            .flatten(1)))).relu().double()
        scale = h @ model.f3.weight.double().abs().T + model.f3.bias.double().abs()
        for t in (24, 16, 8):
            outs = []
            for seed in (1, 2):
                with fuzzy(mode=mode, seed=seed, precision=None if t == 24 else t):
                    outs.append(model(x).double())
            if t >= 16:
                _, bound = _running_bound(model, x, 2.0 ** (2 - t))
                for o in outs:
                    assert ((o - native).abs() <= bound + native_bound).all(), (mode, t)
            spread = (outs[0] - outs[1]).abs()
            assert (spread > 0).float().mean() > 0.5, (mode, t)
            assert 2.0 ** -t / 16 <= (spread / scale).mean() <= 64 * 2.0 ** -t, (mode, t)


@pytest.mark.parametrize("mode", ["sr", "ud", "random"])
def test_encoder_perturbation_is_of_order_2_to_minus_t(mode):
    """The transformer encoder (layer norms, softmax, GELU, attention) under the same
    two-sided order check as LeNet's spread (see above): 2^-t / 16 <= mean spread / S
    <= 64 * 2^-t with S = |W_head| |h| + |b_head|. With 9 logits and P(equal) <= 0.25 per
    logit, at least 3 must differ between seeds (binomial tail 1.3e-3; fixed seeds).
    Measured: 0.7 to 3.1 times 2^-t."""
    torch.manual_seed(1)
    model = Encoder().eval()
    x, _ = _data("encoder")
    with torch.no_grad():
        h = model.enc(model.emb(x)).mean(1).double()
        scale = h.abs() @ model.head.weight.double().abs().T + model.head.bias.double().abs()
        for t in (24, 16, 8):
            outs = []
            for seed in (1, 2):
                with fuzzy(mode=mode, seed=seed, precision=None if t == 24 else t):
                    outs.append(model(x).double())
            spread = (outs[0] - outs[1]).abs()
            assert (spread > 0).sum() >= 3, (mode, t)
            assert 2.0 ** -t / 16 <= (spread / scale).mean() <= 64 * 2.0 ** -t, (mode, t)
