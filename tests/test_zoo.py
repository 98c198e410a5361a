"""The model zoo (numvar.workloads.zoo): no floating-point op of a real model escapes.

For every zoo entry and regime (forward under ``no_grad`` and ``inference_mode``, one
training step with SGD and with fused AdamW), at tiny shapes:

(a) under ``strict=True`` (where ``numvar.fuzzy`` has it) nothing escapes, and the
    report lists no escape (:func:`zoo.escapes`: native ops, ops rounded once at flop
    granularity for want of a flop handler);
(b) the coverage probe (:func:`zoo.probe`): at precision 8, SR moves every module's
    output, each module run on its own recorded inputs, by at least ``PROBE_TAU``
    (derivation next to the constant), so one unperturbed layer fails;
(c) ``mode="ieee"`` at flop granularity equals native within the summation-order
    tolerance of :class:`zoo.IeeeCheck` (derivation in its docstring, per model);
(d) the same seed gives the same bits, two seeds differ;
(e) the result dtypes are native's.

bfloat16 entries run the forward regimes only (their training steps add nothing to the
accumulation policy they test, and the time budget is small). Also: results bitwise
identical with 1 and 2 torch/numba threads on two zoo models at the size where the
kernels go parallel, and the checks themselves fail when a layer is left unperturbed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba
import pytest
import torch

from numvar.instrument import FuzzyReport
from numvar.workloads import zoo

try:
    import transformers  # noqa: F401  (the test extra installs it)
    HAS_TRANSFORMERS = True
except ImportError:
    HAS_TRANSFORMERS = False
_NO_HF = pytest.mark.skipif(not HAS_TRANSFORMERS,
                            reason="transformers is not installed (pip install numvar[test])")

BF16 = {name for name in zoo.ZOO if name.endswith(("_bf16", "_fp16"))}  # forward only
CASES = [pytest.param(name, regime, id=f"{name}-{regime}",
                      marks=[_NO_HF] if zoo.ZOO[name].needs == "transformers" else [])
         for name in zoo.ZOO for regime in zoo.REGIMES
         if name not in BF16 or regime in zoo.FORWARD_REGIMES
         and (regime == "no_grad" or not name.endswith("_fp16"))]  # fp16: CI time

_BUILT: dict[str, zoo.Built] = {}


def _built(name: str) -> zoo.Built:
    if name not in _BUILT:
        _BUILT[name] = zoo.build(name, "test")
    return _BUILT[name]


@pytest.mark.parametrize("name,regime", CASES)
def test_zoo(name, regime):
    built = _built(name)
    # (a) strict: the first escaping op raises (a numvar.errors exception), and the report
    # names none
    fz_a = zoo.fuzzy_block(mode="sr", granularity="flop", seed=0, strict=True)()
    first = zoo.run(built, regime, lambda: fz_a)
    esc = zoo.escapes(fz_a.report())
    assert not esc, f"{name} [{regime}] escapes perturbation: {zoo.format_escapes(esc)}"
    # (e) dtypes as native's
    native = zoo.run(built, regime)
    assert zoo.dtypes(first) == zoo.dtypes(native)
    # (d) same seed: same bits; another seed: different bits
    again = zoo.run(built, regime, zoo.fuzzy_block(mode="sr", granularity="flop", seed=0))
    assert zoo.bitwise_equal(first, again) == []
    other = zoo.run(built, regime, zoo.fuzzy_block(mode="sr", granularity="flop", seed=1))
    assert zoo.bitwise_equal(first, other), "seeds 0 and 1 gave the same bits"
    # (c) ieee at flop granularity against native, summation-order tolerance
    chk = zoo.ieee_check(built, regime)
    assert chk.ok, f"{name} [{regime}] ieee: {chk.summary()}"
    # (b) coverage probe at precision 8
    pr = zoo.probe(built, regime)
    assert pr.ok, f"{name} [{regime}] probe: {pr.summary()}"
    assert any(m.status == "moved" for m in pr.modules)


def test_escapes_lists_native_and_rounded_once_ops():
    rep = FuzzyReport(mode="sr", granularity="flop",
                      instrumented={"aten.mm.default": 3, "aten.linear.default": 2,
                                    "aten.exp.default": 1},
                      how={"aten.mm.default": "flop kernel",
                           "aten.linear.default": zoo.NO_FLOP_HANDLER,
                           "aten.exp.default": "float64, rounded once"},
                      native={"aten.mkldnn_rnn_layer.default": 4}, exact={"aten.view.default": 9})
    assert zoo.escapes(rep) == {"aten.mkldnn_rnn_layer.default": 4, "aten.linear.default": 2}
    rep.granularity = "op"  # at op granularity rounding once is what was asked
    assert zoo.escapes(rep) == {"aten.mkldnn_rnn_layer.default": 4}


def test_probe_fails_when_one_layer_is_unperturbed():
    """Leave the convolutions native (``exclude``): the probe names each conv module, in
    forward and in backward, and passes the rest."""
    built = _built("resnet_basic")
    pr = zoo.probe(built, "sgd", exclude=("aten.convolution", "aten.convolution_backward"))
    failed = {(m.path, m.kind) for m in pr.failures}
    convs = {p for p, m in built.model.named_modules() if isinstance(m, torch.nn.Conv2d)}
    assert failed == {(p, k) for p in convs for k in ("forward", "backward")}
    assert zoo.probe(built, "sgd").ok


def test_ieee_check_fails_on_rounding_beyond_reordering():
    """ieee at 16 bits instead of 24 (an error of 2^-16, not a summation order) fails."""
    chk = zoo.ieee_check(_built("resnet_basic"), "no_grad", precision=16)
    assert not chk.ok and chk.k_max >= 9


def test_step_reference_takes_the_optimizer_step_in_float64_from_given_gradients():
    """sgd (momentum, first step): p - lr·g exactly; adamw (first step, bias-corrected
    moments m̂ = g, v̂ = g²): p·(1 - lr·wd) - lr·g/(|g| + ε), to float64 rounding; a
    parameter without a gradient keeps its value. The gradients are made up (not the
    model's), so the step can only have come from them."""
    built = _built("sine_mlp")
    p0 = {f"param.{n}": p.detach().double() for n, p in built.model.named_parameters()}
    gen = torch.Generator().manual_seed(3)
    grads = {f"grad.{n[6:]}": torch.randn(p.shape, generator=gen, dtype=torch.float64)
             * 10.0 ** torch.randint(-12, 0, p.shape, generator=gen)
             for n, p in p0.items()}
    dropped = next(iter(grads))
    del grads[dropped]
    sgd = zoo.step_reference(built, "sgd", grads)
    adamw = zoo.step_reference(built, "adamw_fused", grads)
    assert sgd.keys() == adamw.keys() == p0.keys()
    for k, p in p0.items():
        assert sgd[k].dtype == adamw[k].dtype == torch.float64
        g = grads.get("grad." + k[6:])
        if g is None:
            assert torch.equal(sgd[k], p) and torch.equal(adamw[k], p)
            continue
        assert torch.equal(sgd[k], p - 0.01 * g)
        expect = p * (1 - 1e-3 * 1e-2) - 1e-3 * g / (g.abs() + 1e-8)
        torch.testing.assert_close(adamw[k], expect, rtol=1e-13, atol=1e-16)


def test_builds_are_deterministic():
    a, b = zoo.build("vit", "test"), zoo.build("vit", "test")
    assert zoo.bitwise_equal(dict(a.model.state_dict()), dict(b.model.state_dict())) == []
    assert zoo.bitwise_equal({"x": a.inputs[0]}, {"x": b.inputs[0]}) == []


_THREADS_SCRIPT = ("import json; from numvar.workloads import zoo; "
                   "print(json.dumps(zoo.thread_check()))")


@_NO_HF
def test_bitwise_identical_across_thread_counts():
    """1 vs 2 torch and numba threads, flop SR, a forward and an SGD step of two zoo
    models, with every kernel call sent down the parallel path (the work threshold of
    ``numvar.instrument.kernels`` set to 0): the same bits. numba's pool size is fixed at
    start, so with fewer than 2 threads this runs in a subprocess."""
    if numba.config.NUMBA_NUM_THREADS >= 2:
        res = zoo.thread_check()
    else:
        env = dict(os.environ, NUMBA_NUM_THREADS="2", OMP_NUM_THREADS="2")
        proc = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], env=env,
                              capture_output=True, text=True, timeout=600, check=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(res) == set(zoo.THREAD_MODELS)
    for name, r in res.items():
        assert [list(t) for t in r["threads"]] == [[1, 1], [2, 2]], name
        assert r["min_work"] == 0 and r["work_max"] > 0, name
        assert r["differ"] == [], f"{name}: bits differ across thread counts in {r['differ']}"


def test_codepath_is_what_fuzzy_runs_on():
    """numvar.instrument.codepath: fast path, mkldnn and cudnn off, SDPA on its math
    backend alone inside; every switch restored after, to what it was (also values set
    before entering, and after an exception); a fuzzy block runs on it (the floor of
    bench_zoo.py uses the same)."""
    from numvar.instrument import fuzzy
    from numvar.instrument.codepath import IdentityMode, codepath

    sdp = ("math", "flash", "mem_efficient", "cudnn", "overrideable")

    def state():
        return (torch.backends.mha.get_fastpath_enabled(), torch._C._get_mkldnn_enabled(),
                torch._C._get_cudnn_enabled(),
                *(getattr(torch._C, f"_get_{n}_sdp_enabled")() for n in sdp))

    before = state()
    assert before[:3] == (True, True, True)
    with codepath():
        inside = state()
        with IdentityMode():
            y = torch.ones(2) + 1
    assert inside == (False, False, False, True, False, False, False, False)
    assert y.tolist() == [2.0, 2.0]
    assert state() == before
    with fuzzy(mode="ieee"):
        assert state() == inside
    assert state() == before
    # other values before entering come back as they were, also after an exception
    torch._C._set_sdp_use_flash(False)
    torch._C._set_sdp_use_math(False)
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        changed = state()
        with pytest.raises(ValueError), codepath():
            raise ValueError
        assert state() == changed
    finally:
        torch._C._set_sdp_use_flash(before[4])
        torch._C._set_sdp_use_math(before[3])
        torch.backends.mha.set_fastpath_enabled(True)
    assert state() == before


def test_modes_guard_themselves_while_dynamo_runs(monkeypatch):
    """numvar's modes (codepath.guards_itself) opt out of the wrapper PyTorch puts around
    __torch_dispatch__: outside compiled code no op takes the guarded call; inside a
    ``torch.compile``d function every op does, dynamo never traces the mode (no warning
    of a builtin it cannot trace), and the result has the bits of the same block run
    eagerly (the reference path: native bits)."""
    import warnings

    import numvar
    from numvar.instrument.codepath import IdentityMode, dynamo_running, reference_path
    from numvar.instrument.mode import FuzzyMode

    calls = []
    for cls in (FuzzyMode, IdentityMode):
        assert not getattr(cls.__torch_dispatch__, "_torchdynamo_disable", False), cls
        guarded = cls._guarded

        def spy(self, func, *rest, _guarded=guarded):
            calls.append(str(func))
            return _guarded(self, func, *rest)

        monkeypatch.setattr(cls, "_guarded", spy)

    def g(x, w):
        return torch.tanh(x @ w) * 3 + 1

    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 8, generator=gen), torch.randn(8, 3, generator=gen)
    assert not dynamo_running()
    with numvar.fuzzy(mode="sr", seed=3):
        eager = g(x, w)
    with reference_path():
        ref = g(x, w)
    assert calls == []
    compiled = torch.compile(g, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with numvar.fuzzy(mode="sr", seed=3):
            got = compiled(x, w)
        ops = list(calls)
        with reference_path():
            got_ref = compiled(x, w)
    assert ops == ["aten.mm.default", "aten.tanh.default", "aten.mul.Tensor",
                   "aten.add.Tensor"]
    assert len(calls) == 2 * len(ops)
    assert not [str(c.message) for c in caught if "trace" in str(c.message)]
    assert torch.equal(got, eager) and not torch.equal(got, ref)
    assert torch.equal(got_ref, ref)


def test_count_contractions_counts_every_flop_product():
    """zoo.count_contractions (the zoo benchmark's contraction column) counts the terms of
    every flop-level product, per kernel dtype, on the short path of binary32 products
    (flop.LEAN_BMM) as on the general one: a linear layer (5·6·8), a batched product
    (2·3·4·7), a 3×3 convolution of 2 → 4 channels on 5×5 (1·4·25·18 after im2col) and a
    binary64 product (3·3·3), with their longest sum and largest call."""
    import numvar
    from numvar.instrument import flop as FL

    lin, conv = torch.nn.Linear(8, 6), torch.nn.Conv2d(2, 4, 3, padding=1)
    x, a, b = torch.randn(5, 8), torch.randn(2, 3, 7), torch.randn(2, 7, 4)
    img, d = torch.randn(1, 2, 5, 5), torch.randn(3, 3, dtype=torch.float64)
    for lean in (True, False):
        FL.LEAN_BMM = lean
        try:
            with torch.no_grad(), zoo.count_contractions() as cc:
                with numvar.fuzzy(mode="sr", granularity="flop", seed=0):
                    lin(x), torch.bmm(a, b), conv(img), d @ d
        finally:
            FL.LEAN_BMM = True
        assert cc.terms_by_dtype == {"float32": 240 + 168 + 1800, "float64": 27}
        assert (cc.terms, cc.calls, cc.k_max, cc.work_max) == (2235, 4, 18, 1800)
