"""Reports: terminal numbers == JSON == API; HTML structure and embedded PNGs; compare."""

import base64
import json
import struct
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

import numvar.cli as cli
from numvar.analysis import analyze, analyze_run, compare, median_output_digits, render_html
from numvar.analysis import significant_digits
from numvar.analysis.text import NO_VARIATION, fmt
from numvar.runner.store import RunStore, load_run

R = 6


def make_run(path, scale, seed=0, segmentation=False):
    g = torch.Generator().manual_seed(seed)
    st = RunStore.create(path, config={"mode": "sr", "granularity": "flop", "n": R},
                         seeds=list(range(R)), command=["python", "train.py"])
    kinds = {"layers/conv1#0": "layer", "layers/fc#0": "layer", "layers/fc#1": "layer"}
    base = {
        "output": torch.linspace(1, 2, 20),
        "logits": torch.randn(12, 4, generator=g),
        "labels": torch.arange(12) % 4,
        "constant": torch.tensor([1.0, 2.0, 3.0]),
        "layers/conv1#0": torch.randn(2, 3, 3, generator=g),
        "layers/fc#0": torch.randn(8, generator=g),
        "layers/fc#1": torch.randn(8, generator=g),
        "weights.fc.weight": torch.randn(4, 3, generator=g),
        "weights.fc.bias": torch.randn(4, generator=g),
    }
    for k in range(5):
        base[f"loss@{k}"] = torch.tensor(2.0 / (k + 1))
    if segmentation:
        seg = torch.zeros(6, 6, dtype=torch.int64)
        seg[1:4, 1:4] = 1
        seg[4:, 4:] = 2
        base["aseg"] = seg
    st.save_reference({k: v.clone() for k, v in base.items()}, kinds=kinds)
    for i in range(R):
        real = {}
        for k, v in base.items():
            if k in ("labels", "constant", "aseg"):
                real[k] = v.clone()
            else:
                real[k] = v * (1 + scale * (i + 1) * torch.randn(v.shape, generator=g))
        if segmentation and i % 2:
            real["aseg"][1, 1] = 0
        st.save_realization(i, real, kinds=kinds, wall_s=0.1)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    return (make_run(d / "sr", 1e-4), make_run(d / "ud", 1e-2, seed=1),
            make_run(d / "seg", 1e-3, seed=2, segmentation=True))


def run_cli(capsys, monkeypatch, *argv):
    monkeypatch.setenv("COLUMNS", "250")
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def rows_of(text, title):
    """Cells of the rows of the rich table titled ``title`` (box-drawing parsed)."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if title in l)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append([c.strip() for c in line.strip("│").split("│")])
    return rows


def test_table_equals_json_equals_api(runs, capsys, monkeypatch):
    sr = runs[0]
    api = analyze(load_run(sr), path=str(sr))
    rc, out, _ = run_cli(capsys, monkeypatch, "report", str(sr), "--format", "json")
    assert rc == 0
    assert json.loads(out) == json.loads(json.dumps(api))  # JSON == API
    rc, table, _ = run_cli(capsys, monkeypatch, "report", str(sr))
    assert rc == 0
    # -o FILE: the same tables in the file, nothing on stdout
    rc, out, err = run_cli(capsys, monkeypatch, "report", str(sr), "-o", str(sr.parent / "t.txt"))
    assert rc == 0 and out == "" and "wrote" in err
    assert rows_of((sr.parent / "t.txt").read_text(), "Captures") == rows_of(table, "Captures")
    caps = {r[0]: r for r in rows_of(table, "Captures")}
    assert set(caps) == {"output", "logits", "labels", "constant"}
    for name, row in caps.items():
        e = api["captures"][name]
        assert row[2:4] == [fmt(e["std"]), fmt(e["rel_std"])]
        if e["digits"] is None:
            assert row[4:6] == ["exact", "exact"]
        elif e["digits"]["all_no_variation"]:
            assert row[4] == NO_VARIATION and name == "constant"
        else:
            assert row[4:7] == [fmt(e["digits"]["min"], "d"), fmt(e["digits"]["median"], "d"),
                                fmt(e["digits"]["no_variation_share"], "p")]
    c = api["classification"]["logits"]
    assert caps["logits"][7] == f"{c['flipped_samples']}/12 flipped" and caps["output"][7] == ""
    # --wide: every column, mean|x| (not for integer captures) and sem included
    rc, wide, _ = run_cli(capsys, monkeypatch, "report", str(sr), "--wide")
    assert rc == 0
    for row in rows_of(wide, "Captures"):
        e = api["captures"][row[0]]
        mean_abs = "—" if e["digits"] is None else fmt(e["mean_abs"])
        assert row[3:6] == [mean_abs, fmt(e["std"]), fmt(e["sem"])]
    layers = rows_of(table, "Layers (network order)")
    assert [r[0] for r in layers] == ["layers/conv1#0", "layers/fc#0", "layers/fc#1"]
    for r, la in zip(layers, api["layers"]):
        assert r[4:9] == [fmt(la["digits_min"], "d"), fmt(la["digits_p05"], "d"),
                          fmt(la["digits_median"], "d"), fmt(la["digits_median_varying"], "d"),
                          fmt(la["no_variation_share"], "p")]
    dec = dict(rows_of(table, "Decisions: logits"))
    c = api["classification"]["logits"]
    assert dec["flip rate"] == fmt(c["flip_rate"], "p")
    assert dec["accuracy mean"] == fmt(c["accuracy"]["mean"], "p")
    assert dec["score std (max)"] == fmt(c["score_std_max"])
    band = rows_of(table, "Series loss")
    assert [r[0] for r in band] == ["0", "1", "2", "3", "4"]
    s = api["series"][0]
    assert [r[1] for r in band] == [fmt(v) for v in s["mean"]]
    assert [r[2] for r in band] == [fmt(v) for v in s["std"]]
    w = rows_of(table, "Final weights per layer")
    assert w == [["fc", "16", fmt(api["weights"][0]["std"]), fmt(api["weights"][0]["rel_std"]),
                  fmt(api["weights"][0]["digits_min"], "d"),
                  fmt(api["weights"][0]["digits_median"], "d")]]
    # the API's numbers are those of direct significant_digits calls
    smp = load_run(sr)
    sd = significant_digits(smp["output"], smp.reference["output"], basis=10)
    assert api["captures"]["output"]["digits"] == sd.summary()
    assert median_output_digits(smp, basis=10) == pytest.approx(api["captures"]["output"]["digits"]["median"],
                                                      abs=1e-6)


def test_series_and_weights_content(runs):
    res = analyze_run(runs[0], basis=2)
    s = res["series"][0]
    assert s["name"] == "loss" and s["steps"] == [0, 1, 2, 3, 4]
    assert s["reference"] == [pytest.approx(2.0 / (k + 1)) for k in range(5)]
    smp = load_run(runs[0])
    for k in range(5):
        v = smp[f"loss@{k}"].double()
        assert s["mean"][k] == pytest.approx(v.mean().item(), rel=1e-5)
        assert s["std"][k] == pytest.approx(v.std().item(), rel=1e-5)
        assert s["min"][k] <= s["mean"][k] <= s["max"][k]
    w = res["weights"][0]
    assert w["layer"] == "fc" and w["numel"] == 16
    assert w["tensors"] == ["weights.fc.weight", "weights.fc.bias"]
    # the layer's numbers over its concatenated tensors, computed directly in float64
    flat = torch.cat([smp[n].double().reshape(R, -1) for n in w["tensors"]], dim=1)
    std = flat.std(dim=0)
    assert w["std"] == pytest.approx(std.mean().item(), rel=5e-6)
    assert w["rel_std"] == pytest.approx((std.mean() / flat.mean(0).abs().mean()).item(), rel=5e-6)
    d = np.concatenate([significant_digits(smp[n], smp.reference[n]).digits.reshape(-1)
                        for n in w["tensors"]])
    assert w["digits_median"] == pytest.approx(np.median(d), abs=1e-6)
    assert w["digits_min"] == pytest.approx(d.min(), abs=1e-6)


class _Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.ids, self.tags = [], set(), []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(a)
        if "id" in a:
            self.ids.add(a["id"])


def png_size(b64):
    data = base64.b64decode(b64)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), len(data)


def check_html(text, sections):
    p = _Imgs()
    p.feed(text)
    assert sections <= p.ids
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "<script" not in text and "http://" not in text and "https://" not in text
    sizes = []
    for img in p.imgs:
        assert img["src"].startswith("data:image/png;base64,")
        (w, h), n = png_size(img["src"].split(",", 1)[1])
        assert 150 <= w <= 4000 and 100 <= h <= 2000 and n > 2000
        sizes.append((img["alt"], w, h))
    return sizes


def test_html_report(runs, tmp_path, capsys, monkeypatch):
    import matplotlib

    out = tmp_path / "report.html"
    before = matplotlib.get_backend()
    matplotlib.use("pdf")                 # a user's backend: rendering must leave it alone
    try:
        rc, _, err = run_cli(capsys, monkeypatch, "report", str(runs[0]), "-f", "html", "-o",
                             str(out))
        assert matplotlib.get_backend() == "pdf"
    finally:
        matplotlib.use(before)
    assert rc == 0 and "wrote" in err
    text = out.read_text()
    sizes = check_html(text, {"configuration", "captures", "digits", "layers", "decisions",
                              "training", "weights"})
    alts = [a for a, _, _ in sizes]
    assert "digits histogram: output" in alts and "digits histogram: constant" in alts
    assert not any(a.startswith("digits histogram: weights.") for a in alts)
    assert "significant digits per layer" in alts and "flips: logits" in alts
    assert "band: loss" in alts and "final weights per layer" in alts
    assert "&quot;granularity&quot;: &quot;flop&quot;" in text  # run configuration
    assert NO_VARIATION in text
    # segmentation: Dice and the disagreement map
    smp = load_run(runs[2])
    res = analyze(smp, task="segmentation", scores=["aseg"])
    seg = res["segmentation"]["aseg"]
    assert seg["disagreement"]["voxels"] == 1 and seg["disagreement"]["max"] == 0.5
    assert seg["labels"]["1"]["dice_min"] == round(2 * 8 / (8 + 9), 6)
    html = render_html(res, smp, tmp_path / "seg.html")
    assert (tmp_path / "seg.html").read_text() == html
    alts = [a for a, _, _ in check_html(html, {"segmentation"})]
    assert f"<td>Dice min {fmt(seg['dice_min'])}</td>" in html
    assert "disagreement map: aseg" in alts and "Dice: aseg" in alts


def test_compare(runs, tmp_path, capsys, monkeypatch):
    a, b = analyze_run(runs[0], basis=2), analyze_run(runs[1], basis=2)
    cmp = compare(a, b)
    rc, out, _ = run_cli(capsys, monkeypatch, "compare", str(runs[0]), str(runs[1]), "-f", "json",
                         "--basis", "2")
    assert rc == 0 and json.loads(out) == json.loads(json.dumps(cmp))
    row = next(c for c in cmp["captures"] if c["name"] == "output")
    assert row["a"]["digits_median"] == a["captures"]["output"]["digits"]["median"]
    assert row["delta_median"] == pytest.approx(row["b"]["digits_median"] - row["a"]["digits_median"],
                                                abs=2e-6)
    # Realization r of element j is v_j·(1 + s·(r+1)·ε_rj): Z = s·w with w_r = (r+1)·ε_r,
    # so CNH digits are -log2(s) - log2 σ̂(w) - δ(R), δ the same in both runs, and
    # delta = -log2(100) + (median_b - median_a) of T = -log2 σ̂(w) over 20 elements each.
    # A median of 20 iid values lies in [q_.05, q_.95] of T except with probability
    # 2·P(Bin(20, .05) >= 10) < 3e-8, so |delta + log2 100| <= q_.95 - q_.05 (+ slack).
    # The quantiles of T are computed from 200 000 fixed-seed draws (their error is
    # ~0.01 bit; 0.05 bit allowed), float32 storage moves Z by < 1e-3 relative (< 0.01 bit).
    w = np.random.default_rng(0).standard_normal((200_000, R)) * np.arange(1, R + 1)
    q05, q95 = np.quantile(-np.log2(w.std(axis=1)), [0.05, 0.95])
    spread = q95 - q05 + 0.05 + 0.02
    assert abs(row["delta_median"] + np.log2(100)) <= spread
    print(f"delta {row['delta_median']:.3f} bits, expected {-np.log2(100):.3f} ± {spread:.2f}")
    rc, table, _ = run_cli(capsys, monkeypatch, "compare", str(runs[0]), str(runs[1]),
                           "--basis", "2")
    rows = {r[0]: r for r in rows_of(table, "Significant digits (bits), A vs B")}
    assert rows["output"][1:4] == [fmt(row["a"]["digits_median"], "d"),
                                  fmt(row["b"]["digits_median"], "d"), fmt(row["delta_median"], "d")]
    assert rows["constant"][1] == "no var." and "labels" not in rows
    assert rows_of(table, "Decisions, A vs B")[0][0] == "logits"
    out = tmp_path / "cmp.html"
    rc, _, _ = run_cli(capsys, monkeypatch, "compare", str(runs[0]), str(runs[1]), "-f", "html",
                       "-o", str(out), "--basis", "2")
    text = out.read_text()
    assert rc == 0 and [a for a, _, _ in check_html(text, {"configuration", "captures",
                                                           "decisions"})] == [
        "median significant digits, A vs B"]
    assert (f"<td>output</td><td>{fmt(row['a']['digits_median'], 'd')}</td>"
            f"<td>{fmt(row['b']['digits_median'], 'd')}</td>") in text


def test_cli_errors(runs, tmp_path, capsys, monkeypatch):
    rc, _, err = run_cli(capsys, monkeypatch, "report", str(runs[0]), "-f", "html")
    assert rc == 2 and "-o" in err
    rc, _, err = run_cli(capsys, monkeypatch, "report", str(tmp_path / "nothing"))
    assert rc == 2 and "no run directory" in err
    rc, _, err = run_cli(capsys, monkeypatch, "report", str(runs[0]), "--method", "median")
    assert rc == 2 and "method" in err
    rc, _, err = run_cli(capsys, monkeypatch, "report", str(runs[0]), "--task", "segmentation",
                         "--scores", "nope")
    assert rc == 2 and "nope" in err
    rc, out, _ = run_cli(capsys, monkeypatch, "report", str(runs[0]), "-f", "json", "--basis", "10",
                         "--method", "general", "--against", "mean", "-o", str(tmp_path / "r.json"))
    res = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and res["settings"]["basis"] == 10 and res["settings"]["method"] == "general"
    assert res["captures"]["output"]["against"] == "mean"
    assert res["captures"]["output"]["digits"]["cap"] == pytest.approx(24 * 0.30103, abs=1e-4)


def test_notes_failed_and_missing_reference(tmp_path):
    st = RunStore.create(tmp_path / "r", config={"mode": "ud"}, seeds=[0, 1, 2, 3])
    st.save_reference({"y": torch.ones(3)})
    for i in (0, 1, 3):
        st.save_realization(i, {"y": torch.ones(3) * (1 + 1e-3 * i), "extra": torch.full((2,), float(i))})
    st.mark_failed(2, exit_code=1)
    res = analyze_run(tmp_path / "r")
    assert res["run"]["n"] == 3 and res["run"]["failed"] == 1 and res["run"]["seeds"] == [0, 1, 3]
    assert res["captures"]["y"]["against"] == "reference"
    assert res["captures"]["extra"]["against"] == "mean"
    assert any("without an IEEE reference" in n and "extra" in n for n in res["notes"])
    assert any("1 realization(s) failed" in n and "[2]" in n for n in res["notes"])
    # y: values 1, 1.001, 1.003 against 1: the first realization equals the reference
    assert res["captures"]["y"]["max_abs_dev_ref"] == pytest.approx(3e-3, rel=1e-3)


def test_cli_bad_options_name_the_flag_before_reading_runs(runs, tmp_path, capsys, monkeypatch):
    """Bad option values fail first (even with a missing run), one line naming the flag."""
    missing = str(tmp_path / "missing")
    cases = [(["report", missing, "-p", "2"], "--probability 2.0"),
             (["report", missing, "-c", "0"], "--confidence 0.0"),
             (["report", missing, "--task", "foo"], "--task 'foo'"),
             (["report", missing, "--error", "x"], "--error 'x': expected relative or absolute"),
             (["report", missing, "--against", "x"], "--against 'x'"),
             (["report", missing, "-f", "xml"], "--format 'xml': expected table, json or html"),
             (["compare", str(runs[0]), missing, "--basis", "3"], "--basis 3"),
             (["report", str(runs[0]), "-o", str(tmp_path)],
              f"--output {tmp_path}: is a directory"),
             (["compare", str(runs[0]), missing], f"no run directory at {missing}"),
             (["report", str(runs[0] / "r0000.safetensors")], "no run directory")]
    for argv, want in cases:
        rc, out, err = run_cli(capsys, monkeypatch, *argv)
        assert rc == 2 and out == "" and err.startswith("error: ") and want in err, (argv, err)
        assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_tables_never_split_numbers(runs, width):
    """At 80 and 120 columns every figure of the captures, layers, decisions, series and
    weights tables appears whole on one line, and no line is wider than the terminal."""
    import io

    from rich.console import Console

    from numvar.analysis.text import report_renderables

    res = analyze_run(runs[0])
    con = Console(width=width, record=True, file=io.StringIO())
    for r in report_renderables(res):
        con.print(r)
    text = con.export_text()
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= width
    tokens = {t for ln in lines for t in ln.replace("│", " ").split()}
    figures = []
    for name, e in res["captures"].items():
        if e["digits"] and name.split("@")[0] in ("output", "logits"):
            figures += [fmt(e["std"]), fmt(e["rel_std"]), fmt(e["digits"]["min"], "d"),
                        fmt(e["digits"]["median"], "d")]
    for la in res["layers"]:
        figures += [str(la["numel"]), fmt(la["std"]), fmt(la["digits_min"], "d")]
    c = res["classification"]["logits"]
    figures += [fmt(c["score_std_max"]), fmt(c["margin"]["z_min"])]
    figures += [fmt(v) for v in res["series"][0]["mean"]]
    figures += [fmt(res["weights"][0]["std"])]
    missing = [f for f in figures if f not in tokens]
    assert not missing, f"split or missing at width {width}: {missing}\n{text}"
    # the unit is in every digits header; the default unit is decimal digits
    assert "bits" not in text and "decimal" in text
    # --wide keeps the table layout (one row per capture) whatever the width
    con = Console(width=width, record=True, file=io.StringIO())
    for r in report_renderables(res, wide=True):
        con.print(r)
    wide = con.export_text()
    assert any(ln.startswith("│ output ") for ln in wide.splitlines())


def test_narrow_terminal_uses_key_value_blocks(runs):
    import io

    from rich.console import Console

    from numvar.analysis.text import FitTable, report_renderables

    res = analyze_run(runs[0])
    table = next(r for r in report_renderables(res) if isinstance(r, FitTable))
    con = Console(width=table.width_needed() - 1, record=True, file=io.StringIO())
    con.print(table)
    narrow = con.export_text()
    assert "┃" not in narrow and "\n  std (R−1)" in narrow   # key: value, one block per row
    con = Console(width=table.width_needed(), record=True, file=io.StringIO())
    con.print(table)
    assert "┃" in con.export_text()                        # it fits: a table


def test_html_report_is_readable(runs, tmp_path):
    """The items of the HTML review: one stylesheet, numbers that do not wrap, the
    configuration collapsed, the General-method note once, no histogram of a scalar,
    no mean|x| for integer captures, a title naming the run, plots at a sane size."""
    from numvar.analysis.html import CSS, report_title

    res = analyze_run(runs[0])
    # a scalar capture (e.g. a loss): its row, but no one-bar histogram
    res["captures"]["loss"] = dict(res["captures"]["output"], shape=[], numel=1)
    text = render_html(res, load_run(runs[0]))
    assert CSS in text and "white-space:nowrap" in CSS
    assert "<details id='configuration'><summary>" in text
    assert text.count("General method needs at least") == 1
    assert f"<title>numvar report: {runs[0]}</title>" in text
    p = _Imgs()
    p.feed(text)
    alts = [img["alt"] for img in p.imgs]
    assert "digits histogram: output" in alts and "digits histogram: loss" not in alts
    assert "<td>loss</td><td>api</td><td>scalar</td>" in text
    for img in p.imgs:
        (w, h), _ = png_size(img["src"].split(",", 1)[1])
        assert w >= 500 and h >= 300, (img["alt"], w, h)   # 110 dpi: legible text
    # integer captures: no mean |x| (a "—" in its cell)
    assert "<td>labels</td><td>api</td><td>12</td><td>—</td>" in text
    # a run without a path is titled by what ran
    anon = dict(res, run=dict(res["run"], path=None, config={"function": "infer"}))
    assert report_title(anon) == "numvar report: infer"
    # in a notebook: an iframe holding the report
    assert res._repr_html_().startswith("<iframe srcdoc=")


def test_stdout_digits_are_capped_at_what_was_printed(tmp_path):
    """A printed number holds the digits printed: 0.1234 carries 4 decimal digits
    (ceil(4·log2 10) = 14 bits), a float32 value printed in full at most 24 bits."""
    import math

    from numvar.analysis.core import printed_precision_bits

    assert printed_precision_bits([0.1234]) == math.ceil(4 * math.log2(10)) == 14
    assert printed_precision_bits([0.98, 0.0677]) == math.ceil(3 * math.log2(10))
    assert printed_precision_bits([float(np.float32(1.4163012))]) == 24
    assert printed_precision_bits([1 / 3]) == 53
    st = RunStore.create(tmp_path / "r", config={"mode": "sr", "n": R}, seeds=list(range(R)),
                         command=["python", "p.py"])
    kinds = {"stdout": "stdout"}
    st.save_reference({"stdout": torch.tensor([0.98, 0.1234], dtype=torch.float64)}, kinds=kinds)
    for i in range(R):
        st.save_realization(i, {"stdout": torch.tensor([0.98, 0.1234 + 1e-4 * (i % 2)],
                                                       dtype=torch.float64)},
                            kinds=kinds, wall_s=0.1)
    d = analyze_run(tmp_path / "r", basis=10)["captures"]["stdout"]["digits"]
    assert d["cap"] == pytest.approx(14 * math.log10(2), abs=1e-6)   # not 15.95 (float64)
    assert d["max"] <= d["cap"]
