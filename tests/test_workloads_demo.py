"""The digits demo end to end: realizations, analysis, and a report whose numbers are
exactly those of the analysis API applied to the stored runs."""

from __future__ import annotations

import html
import json
import os
import re

import pytest
import torch

from numvar.workloads import _common, digits
from numvar.workloads.demo import SUMMARY_CAPTURES, DemoConfig, _fmt, run_demo

N = 3
IMAGES = 40


@pytest.fixture(scope="module", autouse=True)
def env(tmp_path_factory):
    """One torch thread (shared 2-core CI) and a private model cache shared with
    test_workloads_models (same session folder: the digits model is trained once)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    d = tmp_path_factory.getbasetemp() / "numvar-workloads-cache"
    old = os.environ.get(_common.CACHE_ENV)
    os.environ[_common.CACHE_ENV] = str(d)
    yield d
    torch.set_num_threads(n)
    if old is None:
        del os.environ[_common.CACHE_ENV]
    else:
        os.environ[_common.CACHE_ENV] = old


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "numvar-demo"
    events: list[tuple[str, str]] = []
    res = run_demo(DemoConfig(out=out, n=N, images=IMAGES),
                   progress=lambda mode, ev, payload: events.append((mode, ev)))
    return out, res, events


def cells(text: str) -> dict[str, str]:
    return {html.unescape(k): html.unescape(v)
            for k, v in re.findall(r"<td id='([^']+)'>([^<]*)</td>", text)}


def test_demo_writes_everything(demo):
    out, res, events = demo
    assert res.report == out / "report.html" and res.report.is_file()
    for mode in ("sr", "ud"):
        assert (out / f"{mode}.html").is_file() and (out / f"{mode}.json").is_file()
        assert (out / "runs" / mode / "manifest.json").is_file()
        # progress: the reference and N realizations announced and finished
        assert (mode, "total") in events
        assert sum(1 for e in events if e == (mode, "done")) == N + 1
    assert res.images == IMAGES
    # what it wrote, as printed: every file under out counted once
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert sum(res.written.values()) == total
    assert set(res.written) == {"report.html", "sr.html", "ud.html", "sr.json", "ud.json",
                                "runs/sr", "runs/ud"}
    # layers are stored for the first layer_images images only (the footprint)
    from numvar.runner import load_run

    s = load_run(out / "runs" / "sr")
    assert s["layers/conv1#0"].shape[1] == min(IMAGES, DemoConfig().layer_images)
    assert s["output.logits"].shape[1] == IMAGES


def test_demo_report_numbers_equal_analysis_api(demo):
    from numvar.analysis import analyze
    from numvar.runner import load_run

    out, res, _ = demo
    got = cells(res.report.read_text(encoding="utf-8"))
    for mode in ("sr", "ud"):
        run = out / "runs" / mode
        samples = load_run(run)
        assert samples.n == N
        a = analyze(samples, basis=10, path=str(run))
        # the JSON next to the report is the analysis result itself
        assert json.loads((out / f"{mode}.json").read_text()) == json.loads(json.dumps(a))
        for name, label in SUMMARY_CAPTURES:
            d = a["captures"][name]["digits"]
            assert got[f"{mode}-{label}_median"] == _fmt(d["median"])
            if label == "loss":  # a scalar: one value, not a median and a min that repeat it
                assert f"{mode}-loss_min" not in got and d["min"] == d["median"]
            else:
                assert got[f"{mode}-{label}_min"] == _fmt(d["min"])
        c = a["classification"]["output.logits"]
        assert got[f"{mode}-flipped"] == _fmt(c["flipped_samples"], "i")
        assert got[f"{mode}-flip_rate"] == _fmt(c["flip_rate"], "p")
        for k in ("mean", "min", "max", "ieee"):
            assert got[f"{mode}-accuracy_{k}"] == _fmt(c["accuracy"][k], "p")
        assert got[f"{mode}-loss_std"] == _fmt(a["captures"]["output.loss"]["std"], "g")
        # the per-layer curve: every layer of the LeNet, in network order
        paths = [la["path"] for la in a["layers"]]
        assert paths[:3] == ["conv1", "relu1", "pool1"] and paths[-1] == "fc3"
        for la in a["layers"]:
            assert got[f"{mode}-layer-{la['path']}-median"] == _fmt(la["digits_median"])
            varying = la["digits_median_varying"]
            assert got[f"{mode}-layer-{la['path']}-varying"] == _fmt(
                la["digits_median"] if varying is None else varying)
            assert got[f"{mode}-layer-{la['path']}-min"] == _fmt(la["digits_min"])


def test_demo_measures_real_variability(demo):
    out, res, _ = demo
    trained = digits.load_or_train()
    data = digits.load_data("test", trained.config).subset(IMAGES)
    ieee_acc = digits.evaluate(trained.model, data)["accuracy"]
    for row in res.summary():
        # the IEEE accuracy in the report is the plain model's accuracy on those images
        assert row["accuracy_ieee"] == pytest.approx(ieee_acc, abs=1e-6)
        # flop-level SR/UD moves the logits: fewer digits than binary32's 7.22 (base 10)
        # but far more than none (one rounding error per flop, ~10^3 flops per logit)
        assert 2.0 < row["logits_median"] < 7.2
        assert row["loss_min"] < 7.2


def test_demo_cli(demo, capsys):
    from numvar.cli import main

    out, _, _ = demo
    # a second run into the same folder replaces the previous runs
    assert main(["demo", "-n", "2", "--samples", "8", "--modes", "sr", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "report:" in text and "report.html" in text
    assert json.loads((out / "sr.json").read_text())["run"]["n"] == 2
    assert main(["demo", "-n", "1", "--out", str(out)]) == 2  # a user error, exit 2


def test_digits_script_under_numvar_run(env, tmp_path):
    """The workload script runs unmodified under ``numvar run``: its printed metrics and
    its ``capture`` calls come back per realization."""
    from numvar.runner import run_script

    digits.load_or_train()  # cached in `env`; the script is pointed at it explicitly
    res = run_script(["-m", "numvar.workloads.digits", "--limit", "20", "--cache-dir",
                      str(env)], n=2, mode="sr", granularity="flop", out=tmp_path / "run",
                     jobs=1)
    res.check()
    s = res.samples()
    assert s.n == 2
    assert tuple(s["logits"].shape) == (2, 20, 10)
    assert torch.equal(s.reference["targets"], digits.load_data("test").targets[:20])
    # stdout's floating-point numbers, by position: accuracy, loss (integers are skipped),
    # as the script computed them from the logits it captured (loss printed with 9
    # significant digits: relative error at most 5e-9; accuracy k/20 printed exactly)
    ref = s.reference["logits"]
    m = _common.metrics_from_logits(ref, s.reference["targets"])
    assert s.reference["stdout"].tolist() == pytest.approx([m["accuracy"], m["loss"]],
                                                           rel=1e-8)
    # the reference is the native model, run along the fuzzy code path (mkldnn off) with
    # the child's thread count: the same logits as a native forward here up to float32
    # summation order (a few ulps of the partial sums), not necessarily the same bits
    trained = digits.load_or_train()
    native = digits.infer(trained.model.eval(), digits.load_data("test").subset(20).inputs)
    assert torch.allclose(ref, native, rtol=1e-4, atol=1e-4)
    # SR realizations differ from each other, yet stay close to the IEEE logits
    assert not torch.equal(s["logits"][0], s["logits"][1])
    assert torch.allclose(s["logits"][0], s.reference["logits"], rtol=1e-4, atol=1e-4)
