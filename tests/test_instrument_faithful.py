"""No floating-point op escapes perturbation silently (issue 13, the mode's part).

inference_mode keeps flop granularity; LSTM is perturbed (forward and backward); fused
optimizers run per tensor; data movement stays exact under UD; ops with a scalar
multiplier round once at op granularity (checked with Fractions); the IEEE reference
follows the realizations' code path; strict mode, the per-block summary, the stored
escapes and the ops table.
"""

import ast
import json
import logging
import math
import pathlib
from fractions import Fraction

import numba
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import numvar
from numvar.errors import ConfigError, UninstrumentedOpError
from numvar.instrument import FuzzyConfig, fuzzy, reference_path

torch.set_num_threads(1)
numba.set_num_threads(1)
ROOT = pathlib.Path(__file__).resolve().parents[1]

# custom ops numvar knows nothing about: one computes (no flop handler: rounded once at
# flop granularity, an escape), one fails on the float64 re-run (runs natively)
_LIB = torch.library.Library("numvar_faithful", "DEF")
_LIB.define("scale(Tensor x) -> Tensor")
_LIB.define("f32only(Tensor x) -> Tensor")
_LIB.impl("scale", lambda x: x * 1.5 + 0.1, "CPU")


def _f32only(x):
    if x.dtype != torch.float32:
        raise RuntimeError("f32only: float32 only")
    return x * 3.0


_LIB.impl("f32only", _f32only, "CPU")
SCALE = torch.ops.numvar_faithful.scale
F32ONLY = torch.ops.numvar_faithful.f32only


def gen(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


# ------------------------------------------------------------- defect 1: inference_mode
class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        h = F.avg_pool2d(h, 2).flatten(1)
        return torch.matmul(self.fc(h), torch.ones(5, 2))


def test_inference_mode_is_flop_granularity_like_no_grad():
    torch.manual_seed(0)
    net = SmallNet().eval()
    x = gen(2, 2, 4, 4, seed=1)
    outs = {}
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx(), fuzzy(mode="sr", seed=3) as fz:
            outs[ctx.__name__] = net(x).clone()
        rep = fz.report()
        assert not rep.escaped, rep.escaped
        assert rep.how.get("aten.addmm.default") == "flop"
        assert rep.how.get("aten.convolution.default") == "flop"
    # the same flop-level pieces in the same order: bit for bit the same realization
    assert torch.equal(outs["no_grad"], outs["inference_mode"])
    assert "aten.linear.default" in rep.decomposed and "aten.conv2d.default" in rep.decomposed
    with torch.inference_mode(), fuzzy(mode="sr", seed=4):
        other = net(x)
    assert not torch.equal(other, outs["no_grad"])


# ------------------------------------------------------------------ defect 2: LSTM / GRU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lstm_perturbed_forward_and_backward(dtype):
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4).to(dtype)
    x = gen(3, 2, 3, seed=2, dtype=dtype)

    def run(seed=None, mode="sr"):
        lstm.zero_grad()
        if seed is None:
            y = lstm(x)[0]
            y.float().sum().backward()
            rep = None
        else:
            with fuzzy(mode=mode, seed=seed) as fz:
                y = lstm(x)[0]
                y.float().sum().backward()
            rep = fz.report()
        return y.detach(), [p.grad.clone() for p in lstm.parameters()], rep

    y0, g0, rep = run(0)
    y0b, g0b, _ = run(0)
    y1, g1, _ = run(1)
    yn, gn, _ = run(None)
    yi, gi, _ = run(0, mode="ieee")
    assert y0.dtype == yn.dtype == dtype
    assert torch.equal(y0, y0b) and all(torch.equal(a, b) for a, b in zip(g0, g0b))
    assert not torch.equal(y0, y1) and not torch.equal(y0, yn)
    assert any(not torch.equal(a, b) for a, b in zip(g0, g1))
    assert any(not torch.equal(a, b) for a, b in zip(g0, gn))
    names = set(rep.instrumented) | set(rep.decomposed) | set(rep.exact)
    assert not any("mkldnn" in n for n in names) and not rep.escaped and not rep.native
    assert "aten.mm.default" in rep.instrumented  # backward matmuls at flop level
    # ieee follows the native arithmetic up to summation order: a few roundings of the
    # format per gate through 3 steps; |y| <= 1 (tanh·sigmoid): 32 u absolute
    u = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    assert (yi.double() - yn.double()).abs().max() <= 32 * u


def test_gru_unsafe_chunks_are_exact_and_gru_perturbed():
    torch.manual_seed(0)
    gru = nn.GRU(3, 4)
    x = gen(2, 1, 3, seed=5)
    with fuzzy(mode="ud", seed=0) as fz:
        y = gru(x)[0]
    rep = fz.report()
    assert not rep.escaped and not torch.equal(y, gru(x)[0])
    assert all("unsafe" not in n for n in rep.instrumented)


# ----------------------------------------------------------- defect 3: fused optimizers
OPTIMS = {
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.01, fused=True),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1, amsgrad=True, fused=True),
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True,
                                      weight_decay=0.01, fused=True),
    "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.01, fused=True),
}


@pytest.mark.parametrize("granularity", ["flop", "op"])
@pytest.mark.parametrize("name", sorted(OPTIMS))
def test_fused_optimizers_write_back_every_list(name, granularity):
    x = gen(6, 3, seed=7)

    def train(mode, seed=0):
        torch.manual_seed(0)
        m = nn.Linear(3, 2)
        opt = OPTIMS[name](m.parameters())
        rep = None
        for _ in range(3):
            if mode is None:
                loss = m(x).pow(2).sum()
                loss.backward()
                opt.step()
            else:
                with fuzzy(mode=mode, seed=seed, granularity=granularity) as fz:
                    loss = m(x).pow(2).sum()
                    loss.backward()
                    opt.step()
                rep = fz.report()
            opt.zero_grad()
        state = [t.clone() for s in opt.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0]
        return [p.detach().clone() for p in m.parameters()], state, rep

    pn, sn, _ = train(None)
    pi, si, rep = train("ieee")
    p0, s0, _ = train("sr", 0)
    p1, _, _ = train("sr", 1)
    assert not rep.escaped and not rep.native
    fused = [k for k in rep.decomposed if k.startswith("aten._fused_")]
    assert fused, rep.decomposed
    # every list was written: params and state moved, and agree with the native fused
    # kernel up to a few roundings per update (3 steps of ~12 ops, each ≤ 1 ulp of its
    # result; values O(1)): 64 u relative to max(|p|, 1)
    u = 2.0 ** -24
    assert len(si) == len(sn) > 0
    for a, b in zip(pi + si, pn + sn):
        assert (a - b).abs().max() <= 64 * u * max(1.0, b.abs().max().item()), name
    assert any(not torch.equal(a, b) for a, b in zip(p0, p1))


def test_fused_adam_grad_scale_unscales_grads_in_place():
    p = [gen(4, seed=1)]
    g = [gen(4, seed=2) * 8]
    ea, es, mx = [torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)]
    steps = [torch.tensor(1.0)]
    gs = torch.tensor(8.0)
    ref = [t[0].clone() for t in (p, g)]
    with fuzzy(mode="ieee", seed=0):
        torch._fused_adam_(p, g, ea, es, mx, steps, lr=0.1, beta1=0.9, beta2=0.999,
                           weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
                           grad_scale=gs)
    assert torch.equal(g[0], ref[1] / 8)  # exact: a power of two
    assert not torch.equal(p[0], ref[0]) and ea[0].abs().sum() > 0 and es[0].abs().sum() > 0
    p2 = [ref[0].clone()]
    with fuzzy(mode="ieee", seed=0):
        torch._fused_adam_(p2, [ref[1].clone()], [torch.zeros(4)], [torch.zeros(4)],
                           [torch.zeros(4)], steps, lr=0.1, beta1=0.9, beta2=0.999,
                           weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
                           grad_scale=gs, found_inf=torch.tensor(1.0))
    assert torch.equal(p2[0], ref[0])  # found_inf: the step is skipped


# ------------------------------------------------------------ defect 8: data movement
@pytest.mark.parametrize("granularity", ["flop", "op"])
def test_unsafe_split_and_narrow_copy_are_exact_under_ud(granularity):
    x = gen(3, 4, seed=9)
    with fuzzy(mode="ud", granularity=granularity, seed=3) as fz:
        p = x.unsafe_split(2, 1)
        c = x.unsafe_chunk(2, 1)
        s = torch.ops.aten.unsafe_split_with_sizes(x, [1, 3], 1)
        n = x.narrow_copy(1, 1, 2)
        with torch.inference_mode():  # where conj_physical reaches the mode
            j = torch.conj_physical(x)
    assert torch.equal(p[0], x[:, :2]) and torch.equal(p[1], x[:, 2:])
    assert torch.equal(c[1], x[:, 2:]) and torch.equal(s[1], x[:, 1:])
    assert torch.equal(n, x[:, 1:3]) and torch.equal(j, x)
    rep = fz.report()
    assert not rep.instrumented, rep.instrumented
    assert "aten.conj_physical.default" in rep.exact


# ---------------------------------------------- defect 9: scalar multipliers round once
FORMATS = {torch.float32: (24, -126), torch.bfloat16: (8, -126), torch.float16: (11, -14)}


def rn(x: Fraction, dtype, mode: str = "rn") -> Fraction:
    """x rounded in ``dtype``: to nearest (ties to even), down ("rd") or up ("ru");
    no overflow in these tests."""
    p, emin = FORMATS[dtype]
    if x == 0:
        return x
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (max(e, emin) - p + 1)
    n = math.floor(a / q)
    r = a / q - n
    if mode == "rn":
        n += r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2 == 1)
    else:
        n += r > 0 and (mode == "ru") == (x > 0)
    return (n * q) if x > 0 else -(n * q)


def F_(t):
    return [Fraction(float(v)) for v in t.double().reshape(-1).tolist()]


def s32(v):  # the kernels' opmath: a Python scalar as binary32
    return Fraction(float(torch.tensor(v, dtype=torch.float32)))


def _pointwise_cases(dtype):
    a, b, c = (gen(200, seed=s, dtype=dtype) for s in (11, 12, 13))
    c = c.abs() + 0.5
    w = gen(200, seed=14, dtype=dtype).abs().clamp(max=1)
    return {
        "add alpha": (lambda: torch.add(a, b, alpha=0.8),
                      lambda i: A[i] + s32(0.8) * B[i]),
        "add_ alpha": (lambda: a.clone().add_(b, alpha=-1.3),
                       lambda i: A[i] + s32(-1.3) * B[i]),
        "sub alpha": (lambda: torch.sub(a, b, alpha=0.3), lambda i: A[i] - s32(0.3) * B[i]),
        "rsub alpha": (lambda: torch.rsub(a, b, alpha=0.7), lambda i: B[i] - s32(0.7) * A[i]),
        "addcmul": (lambda: torch.addcmul(a, b, c, value=0.3),
                    lambda i: A[i] + s32(0.3) * B[i] * C[i]),
        "addcdiv": (lambda: torch.addcdiv(a, b, c, value=0.3),
                    lambda i: A[i] + s32(0.3) * B[i] / C[i]),
        "lerp scalar": (lambda: torch.lerp(a, b, 0.3), lambda i: A[i] + s32(0.3) * (B[i] - A[i])),
        "lerp tensor": (lambda: torch.lerp(a, b, w), lambda i: A[i] + W[i] * (B[i] - A[i])),
    }, (F_(a), F_(b), F_(c), F_(w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scalar_multiplier_ops_round_once_at_op_granularity(dtype):
    global A, B, C, W
    cases, (A, B, C, W) = _pointwise_cases(dtype)
    for name, (fn, exact) in cases.items():
        with fuzzy(mode="ieee", granularity="op", seed=0):
            y = fn()
        assert y.dtype == dtype, name
        got = F_(y)
        bad = [i for i in range(len(got)) if got[i] != rn(exact(i), dtype)]
        assert not bad, (name, len(bad))
        # SR: one of the two neighbours of the exact value
        with fuzzy(mode="sr", granularity="op", seed=1):
            ys = fn()
        for i, v in enumerate(F_(ys)):
            assert v in (rn(exact(i), dtype, "rd"), rn(exact(i), dtype, "ru")), (name, i)


def test_add_alpha_ieee_op_is_bitwise_native_binary32():
    a, b = gen(100_000, seed=21), gen(100_000, seed=22)
    for fn in (lambda: torch.add(a, b, alpha=0.8), lambda: torch.sub(a, b, alpha=0.8)):
        with fuzzy(mode="ieee", granularity="op", seed=0):
            y = fn()
        assert torch.equal(y, fn())  # native: one fused multiply-add, correctly rounded


@pytest.mark.parametrize("name", ["addmm", "baddbmm", "addbmm", "addmv", "addr"])
def test_contractions_with_alpha_beta_round_once(name):
    c2, a2, b2 = gen(3, 4, seed=31), gen(3, 5, seed=32), gen(5, 4, seed=33)
    calls = {
        "addmm": (lambda: torch.addmm(c2, a2, b2, beta=0.3, alpha=0.8),
                  lambda: [[C2[i][j] * s32(0.3) + s32(0.8) * sum(A2[i][k] * B2[k][j] for k in range(5))
                            for j in range(4)] for i in range(3)]),
        "baddbmm": (lambda: torch.baddbmm(c2[None], a2[None], b2[None], beta=0.3, alpha=0.8)[0],
                    None),
        "addbmm": (lambda: torch.addbmm(c2, a2[None], b2[None], beta=0.3, alpha=0.8), None),
        "addmv": (lambda: torch.addmv(c2[:, 0], a2, b2[:, 0], beta=0.3, alpha=0.8),
                  lambda: [C2[i][0] * s32(0.3) + s32(0.8) * sum(A2[i][k] * B2[k][0] for k in range(5))
                           for i in range(3)]),
        "addr": (lambda: torch.addr(c2, a2[:, 0], b2[0], beta=0.3, alpha=0.8),
                 lambda: [[C2[i][j] * s32(0.3) + s32(0.8) * A2[i][0] * B2[0][j] for j in range(4)]
                          for i in range(3)]),
    }
    A2, B2, C2 = ([[Fraction(v) for v in row] for row in t.double().tolist()] for t in (a2, b2, c2))
    fn, exact = calls[name]
    if exact is None:
        exact = calls["addmm"][1]
    with fuzzy(mode="ieee", granularity="op", seed=0) as fz:
        y = fn()
    assert not fz.report().escaped
    e = exact()
    flat = [x for row in e for x in row] if isinstance(e[0], list) else e
    assert F_(y) == [rn(v, torch.float32) for v in flat]


# ------------------------------------------------------- defect 6: the reference's path
def test_reference_path_matches_ieee_realizations_transformer_padding():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0,
                                       batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()
    x = gen(2, 5, 8, seed=41)
    mask = torch.tensor([[False, False, False, True, True], [False] * 5])

    def fn():
        with torch.no_grad():
            return enc(x, src_key_padding_mask=mask)

    with reference_path():
        ref = fn()
    native = fn()  # the nested-tensor fast path: 0 at padded positions
    assert (native[0, 3:] - ref[0, 3:]).abs().max() > 0.1  # the defect this guards against
    s = numvar.sample(fn, n=2, mode="ieee")
    assert torch.equal(s.reference["output"], ref)
    r = s.captures["output"]
    assert torch.isfinite(r).all() and torch.isfinite(ref).all()
    # summation order only: contractions of length ≤ 16 through 2 layers, each term
    # ≤ a few units of |x| ~ 1 after layer norm: 2·16·u per contraction, ×4 contractions
    # per layer ×2 layers, amplified ≤ 10× by layer norm: ~ 2.5e-4
    assert (r - ref).abs().max() <= 2.5e-4
    from numvar.analysis import analyze

    d = analyze(s, basis=2)["captures"]["output"]["digits"]
    assert d["undefined"] == 0 and d["min"] > 10, d


# --------------------------------------------------- strict, summary, stored escapes
class Wrap(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        return self.op(x)


def test_strict_raises_naming_op_module_and_fix():
    net = nn.Sequential(nn.Linear(3, 3), Wrap(SCALE))
    x = gen(2, 3, seed=51)
    with pytest.raises(UninstrumentedOpError) as ei:
        with fuzzy(mode="sr", strict=True):
            net(x)
    err = ei.value
    assert err.op == "numvar_faithful.scale.default"
    assert err.module == "module Sequential.1 (Wrap)"
    assert "exclude=['numvar_faithful.scale']" in str(err) and "no flop handler" in str(err)
    with pytest.raises(UninstrumentedOpError, match="runs natively") as ei:
        with fuzzy(mode="sr", granularity="op", strict=True):
            F32ONLY(x)
    assert ei.value.module == "no module (top-level code)"
    # at op granularity rounding once is what was asked; an explicit exclusion is accepted
    with fuzzy(mode="sr", granularity="op", strict=True):
        net(x)
    with fuzzy(mode="sr", strict=True, exclude=("numvar_faithful.*",)):
        net(x)
    # a handler's own fallback below flop (avg_pool2d with ceil_mode) escapes too
    img = gen(1, 1, 5, 5, seed=54)
    with fuzzy(mode="sr") as fz:
        F.avg_pool2d(img, 2, ceil_mode=True)
        F.avg_pool2d(img, 2)
    assert fz.report().escaped == {"aten.avg_pool2d.default": 1}
    assert "ceil_mode" in fz.report().escape_reasons["aten.avg_pool2d.default"]
    with pytest.raises(UninstrumentedOpError, match="ceil_mode"):
        with fuzzy(mode="sr", strict=True):
            Wrap(lambda t: F.avg_pool2d(t, 2, ceil_mode=True))(img)
    assert FuzzyConfig.from_env({"NUMVAR_MODE": "sr", "NUMVAR_STRICT": "1"}).strict
    assert FuzzyConfig.from_env(FuzzyConfig(strict=True).to_env()) == FuzzyConfig(strict=True)
    with pytest.raises(ConfigError, match="NUMVAR_STRICT"):
        FuzzyConfig.from_env({"NUMVAR_MODE": "sr", "NUMVAR_STRICT": "yes"})


def test_every_block_summarises_its_escapes(caplog):
    x = gen(4, seed=52)
    for block in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="numvar.instrument"):
            with fuzzy(mode="sr", seed=block) as fz:
                for _ in range(3):
                    SCALE(x)
                F32ONLY(x)
        msgs = [r.getMessage() for r in caplog.records]
        assert len(msgs) == 1, (block, msgs)
        assert "       3  numvar_faithful.scale.default" in msgs[0]
        assert "       1  numvar_faithful.f32only.default" in msgs[0]
    rep = fz.report()
    assert rep.escaped == {"numvar_faithful.scale.default": 3, "numvar_faithful.f32only.default": 1}
    assert str(rep).splitlines()[1].startswith("ESCAPED")
    assert rep.escapes()["numvar_faithful.f32only.default"]["reason"].startswith("runs natively")


def test_runs_store_escapes_and_the_report_shows_them_first(tmp_path):
    x = gen(3, seed=53)
    s = numvar.sample(lambda: SCALE(x) * 2, n=2, mode="sr", out=tmp_path / "run")
    assert s.escapes["numvar_faithful.scale.default"] == {
        "count": 2, "reason": s.escapes["numvar_faithful.scale.default"]["reason"],
        "realizations": 2}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert all("escapes" in r for r in manifest["realizations"])
    from numvar.analysis import analyze
    from numvar.analysis.html import render_html
    from numvar.runner.store import load_run

    res = analyze(load_run(tmp_path / "run"))
    from rich.console import Console

    from numvar.analysis.text import report_renderables

    con = Console(record=True, width=1000)
    for r in report_renderables(res):
        con.print(r)
    text = con.export_text().splitlines()
    w = next(i for i, line in enumerate(text) if line.startswith("WARNING"))
    assert w <= 2 and "1 op(s) were NOT perturbed" in text[w]
    assert "numvar_faithful.scale.default: 2 calls in 2 realization(s)" in text[w + 1]
    page = render_html(res)
    assert page.index("id='escapes'") < page.index("Run configuration")


# ---------------------------------------------------------------- ops table, structure
def test_ops_table_generated_from_the_handler_table():
    from numvar.instrument.optable import ops_table, render

    rows = {r["op"]: r for r in ops_table()}
    assert rows["aten.linear"]["flop"] == "decomposition"
    assert rows["aten.mm"]["flop"] == "flop kernel" and rows["aten.mm"]["op granularity"] == "rounded once"
    assert rows["aten.unsafe_split"]["flop"] == "exact"
    assert rows["aten.exp"]["flop"] == "rounded once"
    assert rows["aten._fused_adamw_"]["flop"] == "decomposition"
    assert rows["aten.mkldnn_rnn_layer"]["flop"] == "not reached"
    assert rows["aten.add_"]["flop"].startswith("in place")
    assert json.loads(render("json")) == list(rows.values()) == numvar.instrument.ops_table()
    with pytest.raises(ConfigError):
        render("xml")
    doc = (ROOT / "docs" / "ops-table.md").read_text()
    assert doc == render("markdown"), "regenerate: python -m numvar.instrument.optable > docs/ops-table.md"


def test_numvar_ops_cli(capsys):
    from numvar.cli import main

    assert main(["ops", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"op", "flop", "op granularity", "why"} == set(rows[0])


def test_instrument_package_has_no_import_cycle():
    pkg = ROOT / "src" / "numvar" / "instrument"
    graph = {}
    for f in pkg.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps |= {a.name for a in node.names}
        graph[f.stem] = deps & {p.stem for p in pkg.glob("*.py")}
    seen, done = set(), set()

    def visit(n, path):
        assert n not in path, f"import cycle: {' -> '.join(path + [n])}"
        if n in done:
            return
        for d in graph.get(n, ()):
            visit(d, path + [n])
        done.add(n)

    for n in graph:
        if n != "__init__":
            visit(n, [])
    assert "mode" not in graph["config"]


# ------------------------------------------------------------ numvar run: path, strict
SCRIPT = """\
import sys
import torch
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=True).eval()
x = torch.randn(2, 5, 8)
mask = torch.tensor([[False, False, False, True, True], [False] * 5])
with torch.no_grad():
    y = enc(x, src_key_padding_mask=mask)
if len(sys.argv) > 1:
    lib = torch.library.Library("numvar_script", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda t: t * 2.0 + 0.1, "CPU")
    y = torch.ops.numvar_script.twice(y)
import numvar
numvar.capture("y", y)
"""


def test_numvar_run_reference_path_and_strict(tmp_path):
    from numvar.cli import main
    from numvar.runner.store import RunStore

    (tmp_path / "enc.py").write_text(SCRIPT)
    out = tmp_path / "ieee"
    assert main(["run", "-n", "2", "--mode", "ieee", "--jobs", "1", "--capture", "api",
                 "--out", str(out), "--", "python", str(tmp_path / "enc.py")]) == 0
    s = numvar.runner.load_run(out)
    ref, r = s.reference["y"], s.captures["y"][0]
    assert torch.isfinite(ref).all() and (r - ref).abs().max() <= 2.5e-4  # as above
    out2 = tmp_path / "escape"
    assert main(["run", "-n", "2", "--jobs", "1", "--capture", "api", "--out", str(out2),
                 "--", "python", str(tmp_path / "enc.py"), "custom"]) == 0
    rec = RunStore.open(out2).manifest["realizations"][0]
    assert rec["escapes"]["numvar_script.twice.default"]["count"] == 1
    out3 = tmp_path / "strict"
    code = main(["run", "-n", "2", "--jobs", "1", "--strict", "--capture", "api", "--out",
                 str(out3), "--", "python", str(tmp_path / "enc.py"), "custom"])
    assert code != 0
    rec = RunStore.open(out3).manifest["realizations"][0]
    assert rec["status"] == "failed" and "UninstrumentedOpError" in rec.get("stderr_tail", "")
    assert "numvar_script.twice.default" in rec["stderr_tail"]


def test_fused_parts_kernel_equals_its_reference():
    from numvar.instrument import oplevel as OL

    a, b = gen(300, seed=61), gen(300, seed=62)
    c = gen(300, seed=63)
    c[:5] = 0.0  # division by zero: inf quotients carry no residual
    a[5], b[6] = float("inf"), float("nan")
    for op in (OL.OP_AXPY, OL.OP_ADDCMUL, OL.OP_ADDCDIV, OL.OP_LERP):
        s = 1.0 if op == OL.OP_LERP else float(torch.tensor(0.3))
        hi = torch.empty(300, dtype=torch.float64)
        lo = torch.empty(300, dtype=torch.float64)
        OL._parts_kernel(op, a.numpy(), b.numpy(), c.numpy(), s, hi.numpy(), lo.numpy())
        rh, rl = OL.parts_reference(op, a.double(), b.double(), c.double(), s)
        assert torch.equal(hi.isnan(), rh.isnan()), op
        ok = ~hi.isnan()
        assert torch.equal(lo[ok], rl[ok]), op
        odd = OL.round_to_odd(rh, rl)
        assert torch.equal(hi[ok].view(torch.int64), odd[ok].view(torch.int64)), op
        # round to odd: hi when exact, else an odd significand on lo's side of hi
        inexact = ok & (rl != 0)
        assert (odd[inexact].view(torch.int64) & 1 == 1).all()
        assert (((odd - rh) * rl)[inexact] >= 0).all()  # the same side as the exact value
        step = (torch.nextafter(rh, rl.sign() * math.inf) - rh).abs()
        assert ((odd - rh).abs()[inexact] <= step[inexact]).all()
        assert torch.equal(odd[ok & (rl == 0)], rh[ok & (rl == 0)])


def test_adaptive_avg_pool_backward_at_flop_granularity():
    x = gen(2, 3, 4, 6, seed=71).requires_grad_()

    def grad(mode=None, seed=0, size=(2, 2)):  # 2×3 windows: division by 6 is inexact
        x.grad = None
        if mode is None:
            F.adaptive_avg_pool2d(x, size).mul(gen(2, 3, *size, seed=72)).sum().backward()
            return x.grad.clone(), None
        with fuzzy(mode=mode, seed=seed) as fz:
            F.adaptive_avg_pool2d(x, size).mul(gen(2, 3, *size, seed=72)).sum().backward()
        return x.grad.clone(), fz.report()

    native, _ = grad()
    ieee, rep = grad("ieee")
    assert torch.equal(ieee, native) and not rep.escaped  # one division per term, as ATen
    assert not torch.equal(grad("sr", 0)[0], grad("sr", 1)[0])
    _, rep = grad("sr", 0, size=(3, 4))  # overlapping adaptive windows: named
    assert "aten._adaptive_avg_pool2d_backward.default" in rep.escaped
