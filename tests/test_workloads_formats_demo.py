"""``numvar demo formats`` kept tiny: two formats x three modes on 8 images; the table,
JSON and plot agree with each other and with the definitions of the columns."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from numvar.cli import app
from numvar.workloads import _common
from numvar.workloads.formats_demo import DIGITS_CAP, FormatsDemoConfig, loss_digits, \
    parse_formats, run_formats_demo


@pytest.fixture(scope="module", autouse=True)
def env(tmp_path_factory):
    """One torch thread and the session's private model cache (shared with the other
    workload tests: the digits model is trained once)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    d = tmp_path_factory.getbasetemp() / "numvar-workloads-cache"
    old = os.environ.get(_common.CACHE_ENV)
    os.environ[_common.CACHE_ENV] = str(d)
    yield d
    torch.set_num_threads(n)
    if old is None:
        os.environ.pop(_common.CACHE_ENV, None)
    else:
        os.environ[_common.CACHE_ENV] = old


def test_parse_formats_keeps_custom_commas():
    assert parse_formats("binary32, custom:7,5,e4m3fn") == ("binary32", "custom:7,5", "e4m3fn")


def test_loss_digits_definition():
    assert loss_digits([1.0], 1.0) == DIGITS_CAP
    assert abs(loss_digits([1.001, 0.9999], 1.0) - 3.0) < 1e-9
    assert loss_digits([float("nan")], 1.0) == 0.0


def test_formats_demo_tiny(tmp_path):
    cfg = FormatsDemoConfig(out=tmp_path, formats=("binary32", "e4m3fn"),
                            modes=("ieee", "sr", "up"), samples=2, images=8)
    res = run_formats_demo(cfg)
    assert [(r["format"], r["mode"]) for r in res.rows] == [
        (f, m) for f in ("binary32", "e4m3fn") for m in ("ieee", "sr", "up")]
    for r in res.rows:
        assert r["realizations"] == (2 if r["mode"] == "sr" else 1)
        assert 0 <= r["flips"] <= 8 and 0.0 <= r["accuracy"] <= 1.0
    cell = {(r["format"], r["mode"]): r for r in res.rows}
    # binary32 under ieee differs from native only by summation order (~1e-7 relative)
    assert cell[("binary32", "ieee")]["loss_digits"] >= 5.0
    assert cell[("binary32", "ieee")]["flips"] == 0
    # a 4-bit significand keeps far fewer digits than binary32
    assert cell[("e4m3fn", "ieee")]["loss_digits"] < cell[("binary32", "ieee")]["loss_digits"]
    stored = json.loads((tmp_path / "formats.json").read_text())
    assert stored["rows"] == res.rows
    md = (tmp_path / "formats.md").read_text()
    assert md.count("\n| ") == len(res.rows) + 1
    assert (tmp_path / "formats.png").stat().st_size > 1000


def test_formats_demo_cli_rejects_bad_format(tmp_path):
    r = CliRunner().invoke(app, ["demo", "formats", "--formats", "fp7", "--out",
                                 str(tmp_path)])
    assert r.exit_code != 0
