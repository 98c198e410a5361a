"""The HTML report embeds a saved `numvar locate` result (render_html's extra_sections,
`numvar report --locate FILE.json --locate-map FILE.png`). The locate result comes from
locate's own pipeline over a synthetic evaluator (no instrumentation needed)."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math

import numpy as np
import pytest
from rich.console import Console

from numvar.analysis import analyze_run, render_html
from numvar.locate import load_locate, locate_sections
from numvar.errors import AnalysisError
from numvar.locate import Candidate, Measurement, html_section, renderables
from numvar.locate.api import run_locate

from test_analysis_report import check_html, make_run, run_cli

CAP, R = 24.0, 4


def _evaluate(errors):
    names = list(errors)

    def evaluate(subset):
        err2, layers = 0.0, {}
        for name in names:
            if name in subset:
                err2 += errors[name] ** 2
            layers[name] = CAP if err2 == 0 else min(CAP, -0.5 * math.log2(err2))
        elements = np.full((1, 6, 8), CAP)
        if subset:
            elements[:, :3, :] = layers[names[-1]] - 3.0   # only the top half varies
        return Measurement(digits=layers[names[-1]], layers=layers, realizations=R,
                           elements=elements)

    return evaluate


@pytest.fixture(scope="module")
def located(tmp_path_factory):
    """A locate result with a ranking, a ddmin set, a no-effect candidate, propagation and
    a spatial map; saved as `numvar locate --json/--map` save them."""
    d = tmp_path_factory.mktemp("loc")
    errs = {"conv1": 2.0 ** -22, "fc<&>": 2.0 ** -9, "quiet": 0.0, "out": 2.0 ** -21}
    pool = [Candidate(name=n, kind="module", cls="Lin<ear>" if n == "fc<&>" else "Conv2d",
                      ops={"matmul": 1}) for n in errs]
    cfg = {"n": R, "by": "module", "mode": "sr", "granularity": "flop", "basis": 2,
           "stat": "mean", "necessity": True, "ddmin": True, "max_dd_tests": None}
    res = run_locate(pool, _evaluate(errs), cap=CAP, config=cfg, layers=True, spatial=True)
    res.reference_runs = 1
    res.save_json(d / "locate.json")
    res.save_map(d / "map.png")
    run = make_run(d / "run", 1e-4)
    return res, d / "locate.json", d / "map.png", run


def _text(items) -> str:
    con = Console(file=io.StringIO(), width=200, color_system=None)
    for r in items:
        con.print(r)
    return con.file.getvalue()


def test_load_locate_round_trip(located):
    res, js, _, _ = located
    assert [r.name for r in res.ranked][0] == "fc<&>" and res.dd.minimal == ["fc<&>"]
    assert [r.name for r in res.no_effect] == ["quiet"] and res.spatial is not None
    back = load_locate(js)
    # everything the HTML section and the terminal show, rebuilt from the JSON alone
    # (the JSON keeps 6 decimals and the spatial summary, not the map's pixels)
    same = dataclasses.replace(res, spatial=None)
    assert html_section(back) == html_section(same)
    assert _text(renderables(back)) == _text(renderables(same))
    assert back.to_dict() | {"spatial": None} == json.loads(json.dumps(same.to_dict()))
    assert load_locate(json.loads(js.read_text())).to_dict() == back.to_dict()
    assert back.crosses and back.dd_bound == res.dd_bound and back.bound == res.bound
    assert back.no_effect[0].alone == CAP and back.no_effect[0].lost == 0.0


def test_locate_sections_and_render_html_hook(located, tmp_path):
    res, js, png, run = located
    secs = locate_sections(js, png)
    assert len(secs) == 2 and secs[0] == html_section(load_locate(js))
    assert secs[1].startswith('<section class="numvar-locate-map">')
    b64 = secs[1].split("data:image/png;base64,", 1)[1].split('"', 1)[0]
    assert base64.b64decode(b64) == png.read_bytes()
    s = res.spatial.summary()
    assert f"min {s['min_digits']:.2f} digits at pixel {tuple(s['worst_pixel'])}" in secs[1]
    # without the PNG: the summary only
    no_png = locate_sections(js)
    assert len(no_png) == 2 and "<img" not in no_png[1] and "50.0% of pixels vary" in no_png[1]
    # a segmentation's flip summary (class_dim given to locate), from the dict itself
    d = json.loads(js.read_text())
    d["spatial"] |= {"class_dim": 1, "max_flip_rate": 0.25, "share_flipping": 0.125}
    assert "differ from IEEE at 12.5% of pixels, at most in 25.0%" in locate_sections(d)[1]
    d["spatial"] |= {"max_flip_rate": 0.0, "share_flipping": 0.0}
    assert "No label (class axis 1) differs from IEEE." in locate_sections(d)[1]
    d["spatial"] = None
    assert len(locate_sections(d)) == 1
    # the hook: fragments verbatim, in order, after the report's own sections
    result = analyze_run(run)
    plain = render_html(result)
    page = render_html(result, extra_sections=["<section id='x1'><p>one</p></section>", *secs],
                       path=tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text() == page
    assert page.replace("\n".join(["<section id='x1'><p>one</p></section>", *secs]) + "\n",
                        "") == plain
    assert page.index("id='x1'") < page.index("numvar-locate") < page.index("</body>")
    alts = [a for a, _, _ in check_html(page, {"captures", "x1"})]
    assert "locate: where the output varies" in alts
    assert "spatial map of significant digits" not in alts        # pixels are not in the JSON
    # names are escaped by locate's section
    assert "fc&lt;&amp;&gt;" in page and "Lin&lt;ear&gt;" in page and "fc<&>" not in page
    with pytest.raises(TypeError):
        render_html(result, extra_sections="<p>one string</p>")


def test_cli_report_locate(located, tmp_path, capsys, monkeypatch):
    _, js, png, run = located
    out = tmp_path / "report.html"
    rc, _, err = run_cli(capsys, monkeypatch, "report", str(run), "-f", "html", "-o", str(out),
                         "--locate", str(js), "--locate-map", str(png))
    assert rc == 0 and "wrote" in err
    page = out.read_text()
    assert page.count('<section class="numvar-locate">') == 1
    assert html_section(load_locate(js)) in page
    assert "\n".join(locate_sections(js, png)) in page
    check_html(page, {"captures", "layers"})
    # table: the report, then locate's own renderables
    rc, text, _ = run_cli(capsys, monkeypatch, "report", str(run), "--locate", str(js))
    assert rc == 0 and "Locating instability" in text and "Where the digits go" in text
    assert text.index("Captures") < text.index("Final weights per layer") \
        < text.index("Locating instability") < text.index("Where the digits go")
    row = next(line for line in text.splitlines() if "Lin<ear>" in line)
    assert row.split("│")[1].strip() == "1" and "fc<&>" in row


def test_cli_report_locate_errors(located, tmp_path, capsys, monkeypatch):
    _, js, png, run = located
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 2, "by": "module", "ranking": []}))
    broken = tmp_path / "broken.json"
    d = json.loads(js.read_text())
    del d["cost"]
    broken.write_text(json.dumps(d))
    notpng = tmp_path / "x.png"
    notpng.write_bytes(b"GIF89a")
    o = str(tmp_path / "o.html")
    cases = [(["--locate-map", str(png)], "--locate-map needs --locate"),
             (["--locate", str(js), "-f", "json"], "--format json"),
             (["--locate", str(tmp_path / "none.json"), "-f", "html", "-o", o], "missing file"),
             (["--locate", str(bad), "-f", "html", "-o", o], "locate schema 2"),
             (["--locate", str(broken), "-f", "html", "-o", o], "malformed locate JSON"),
             (["--locate", str(run / "manifest.json"), "-f", "html", "-o", o],
              "not a numvar locate JSON"),
             (["--locate", str(js), "--locate-map", str(notpng), "-f", "html", "-o", o],
              "not a PNG")]
    for extra, want in cases:
        rc, out, err = run_cli(capsys, monkeypatch, "report", str(run), *extra)
        assert rc == 2 and err.startswith("error: ") and want in err, (extra, err)
    assert not (tmp_path / "o.html").exists()
    with pytest.raises(AnalysisError, match="not a numvar locate JSON"):
        load_locate([1, 2])
