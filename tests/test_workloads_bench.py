"""benchmarks/run_all.py runs end to end on a tiny configuration and writes its table
(speed itself is never asserted: only that every measured row is present and sane)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _load_run_all(monkeypatch):
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_all", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_run_all_writes_results(tmp_path_factory, monkeypatch, capsys):
    cache = tmp_path_factory.getbasetemp() / "numvar-workloads-cache"  # shared, see models
    monkeypatch.setenv("NUMVAR_CACHE_DIR", str(cache))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_all = _load_run_all(monkeypatch)
        out = tmp_path_factory.mktemp("bench") / "results.md"
        assert run_all.main(["--workloads", "digits", "--modes", "ieee,sr",
                             "--granularities", "op", "--repeat", "1", "--batch", "8",
                             "--matmul", "32", "--profile", "digits:sr:op",
                             "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(n)
    text = out.read_text()
    assert "## Machine" in text and f"cores: {os.cpu_count()}" in text
    rows = [line for line in text.splitlines() if line.startswith("| digits | 8 images")]
    assert [r.split("|")[3].strip() for r in rows] == ["native", "ieee", "sr"]
    assert "| 32³ |" in text and "profile digits:sr:op" in text
    # the paper's figures sit beside ours
    assert "| digits (MNIST) |" in text and "10.9×" in text
