"""Package-level checks: the entry point, the error hierarchy, atomic I/O."""

import json

import pytest
import torch

import numvar
from numvar import _io, errors
from numvar.cli import main


def test_version_and_errors():
    assert isinstance(numvar.__version__, str)
    for cls in (errors.ConfigError, errors.StoreError, errors.CaptureError,
                errors.NondeterminismError, errors.BoundsError, errors.RunError):
        assert issubclass(cls, errors.NumvarError)


def test_cli_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "determinism" in out


def test_atomic_json_roundtrip(tmp_path):
    p = _io.atomic_write_json(tmp_path / "a" / "b.json", {"x": [1, 2]})
    assert json.loads(p.read_text()) == {"x": [1, 2]}
    assert [f.name for f in p.parent.iterdir()] == ["b.json"]  # no temp file left


def test_tensors_roundtrip_and_errors(tmp_path):
    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3).t()}  # non-contiguous
    _io.save_tensors(tmp_path / "t.safetensors", t)
    back = _io.load_tensors(tmp_path / "t.safetensors")
    assert torch.equal(back["a"], t["a"])
    with pytest.raises(errors.StoreError, match="missing"):
        _io.load_tensors(tmp_path / "nope.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(errors.StoreError, match="corrupt"):
        _io.load_tensors(tmp_path / "bad.safetensors")


def test_save_tensors_that_share_memory(tmp_path):
    base = torch.arange(4.0)
    _io.save_tensors(tmp_path / "v.safetensors", {"a": base, "b": base[:2]})
    back = _io.load_tensors(tmp_path / "v.safetensors")
    assert torch.equal(back["b"], torch.tensor([0.0, 1.0]))


def test_cli_usage_errors_are_one_line_exit_2(capsys):
    assert main(["report"]) == 2                       # missing argument
    assert "Missing argument" in capsys.readouterr().err
    assert main(["report", "--basis", "x", "r"]) == 2  # bad option value
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "No such command" in err


def test_atomic_files_get_the_usual_permissions(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        p = _io.atomic_write_text(tmp_path / "r.html", "x")
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o644
