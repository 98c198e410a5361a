"""`numvar determinism record|check` on a small training-step script."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from numvar.cli import main

SCRIPT = '''
import os, sys
import torch
torch.manual_seed(int(os.environ.get("STEP_SEED", "0")))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                            torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
if os.environ.get("STEP_EXTRA"):
    x = x.abs()
loss = model(x).pow(2).mean()  # LOSS-LINE
loss.backward()
if not os.environ.get("STEP_SHORT"):
    opt.step()
print("args", sys.argv[1:])
'''


@pytest.fixture
def in_process(monkeypatch):
    """Run the launcher in this interpreter instead of a child process: the same
    ``launch.main`` on the same arguments, minus an interpreter start and a torch import
    per call. The real child launch is covered by ``test_record_then_check_in_children``."""
    from numvar.determinism import launch, script

    calls = []

    def run(cmd, env=None, **kw):
        calls.append(cmd)
        i = cmd.index("numvar.determinism.launch")
        argv, path = sys.argv[:], sys.path[:]
        try:
            rc = launch.main(cmd[i + 1:])
        finally:
            sys.argv[:], sys.path[:] = argv, path
        return subprocess.CompletedProcess(cmd, rc)

    monkeypatch.setattr(script, "subprocess", types.SimpleNamespace(run=run))
    monkeypatch.delenv("STEP_SEED", raising=False)
    monkeypatch.delenv("STEP_EXTRA", raising=False)
    monkeypatch.delenv("STEP_SHORT", raising=False)
    return calls


def test_record_then_check_in_children(tmp_path, monkeypatch, capfd):
    script = tmp_path / "train_step.py"
    script.write_text(SCRIPT)
    ref = tmp_path / "ref"
    monkeypatch.delenv("STEP_SEED", raising=False)
    monkeypatch.delenv("STEP_EXTRA", raising=False)
    monkeypatch.delenv("STEP_SHORT", raising=False)
    cmd = ["--", sys.executable, str(script), "--flag", "x"]
    assert main(["determinism", "record", "-o", str(ref), *cmd]) == 0
    out = capfd.readouterr().out
    rec = json.loads((ref / "hashes.json").read_text())
    n = rec["hash_mode"]["n_ops"]
    assert n > 30 and f"recorded {n} ops" in out and "args ['--flag', 'x']" in out
    assert rec["hash_mode"]["counts"]["aten.addmm.default"] == 2

    assert main(["determinism", "check", str(ref), *cmd]) == 0
    assert f"bitwise identical ({n} ops)" in capfd.readouterr().out


def test_divergences_are_reported_with_stacks(tmp_path, monkeypatch, capfd, in_process):
    script = tmp_path / "train_step.py"
    script.write_text(SCRIPT)
    ref = tmp_path / "ref"
    cmd = ["--", sys.executable, str(script), "--flag", "x"]
    assert main(["determinism", "record", "-o", str(ref), *cmd]) == 0
    n = json.loads((ref / "hashes.json").read_text())["hash_mode"]["n_ops"]
    assert f"recorded {n} ops" in capfd.readouterr().out
    assert main(["determinism", "check", str(ref), *cmd]) == 0
    assert f"bitwise identical ({n} ops)" in capfd.readouterr().out
    assert len(in_process) == 2  # no child was started

    # Same op sequence, other seed: the first divergent op is the first random draw
    # (the weight init, uniform_), reported with this script's line.
    monkeypatch.setenv("STEP_SEED", "1")
    assert main(["determinism", "check", str(ref), *cmd]) == 1
    out = capfd.readouterr().out
    assert "not bitwise identical" in out and "first divergent op" in out
    assert "aten.uniform_.default (call #0 of it)" in out and "differ bitwise" in out
    assert "train_step.py" in out and "torch.nn.Linear(4, 8)" in out

    # A different op sequence: reported as such, with both stacks.
    monkeypatch.setenv("STEP_SEED", "0")
    monkeypatch.setenv("STEP_EXTRA", "1")
    assert main(["determinism", "check", str(ref), *cmd]) == 1
    out = capfd.readouterr().out
    assert "this run called aten.abs.default" in out and "op sequences diverge" in out
    assert "x = x.abs()" in out and "LOSS-LINE" in out  # this run's and the reference's stack

    # A run that stops early: the reference's next op is reported missing.
    monkeypatch.delenv("STEP_EXTRA")
    monkeypatch.setenv("STEP_SHORT", "1")
    assert main(["determinism", "check", str(ref), *cmd]) == 1
    out = capfd.readouterr().out
    assert "missing, this run ended before it" in out and "opt.step()" in out


def test_check_errors_are_clear(tmp_path, capfd, in_process):
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit(3)\n")
    assert main(["determinism", "check", str(tmp_path / "none"), "--", "python", str(script)]) == 2
    assert "no recording at" in capfd.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "hashes.json").write_text("{not json")
    assert main(["determinism", "check", str(bad), "--", "python", str(script)]) == 2
    assert "corrupt JSON" in capfd.readouterr().err
    (bad / "hashes.json").write_text('{"format": "numvar.determinism.hashes", "version": 1}')
    assert main(["determinism", "check", str(bad), "--", "python", str(script)]) == 2
    assert "corrupt or unsupported recording" in capfd.readouterr().err
    assert main(["determinism", "record", "-o", str(tmp_path / "r"), "--", "python",
                 str(script)]) == 2
    assert "exited with status 3" in capfd.readouterr().err
    assert not (tmp_path / "r" / "hashes.json").exists()
    assert len(in_process) == 1  # the failures above were caught before any launch
    for bad_cmd, culprit in ((["ls"], "cannot run 'ls'"),
                             (["python", str(tmp_path / "no.py")], "script not found"),
                             (["python", "-c", "pass"], "-c CODE` is not supported"),
                             ([], "no command given")):
        assert main(["determinism", "record", "-o", str(tmp_path / "r"), "--", *bad_cmd]) == 2
        err = capfd.readouterr().err
        assert culprit in err and len(err.strip().splitlines()) == 1, err
    assert main(["determinism", "record", "-o", str(script), "--", "python", str(script)]) == 2
    err = capfd.readouterr().err
    assert "exists and is not a folder" in err and len(err.strip().splitlines()) == 1
    assert len(in_process) == 1


def test_launcher_command_parsing(tmp_path):
    from numvar.determinism.script import launcher_command
    from numvar.errors import ConfigError

    s = tmp_path / "t.py"
    s.write_text("")
    head, target = launcher_command(["python", "-u", "-W", "ignore", str(s), "a", "--b"])
    assert head[1:] == ["-u", "-W", "ignore", "-m", "numvar.determinism.launch"]
    assert target == ["--script", str(s), "--", "a", "--b"]
    head, target = launcher_command(["python3", "-m", "pkg.mod", "x"])
    assert target == ["--module", "pkg.mod", "--", "x"]
    head, target = launcher_command([str(s)])
    assert head[0] == sys.executable and target == ["--script", str(s), "--"]
    for bad in ([], ["ls"], ["python"], ["python", "-m"], ["python", str(tmp_path / "no.py")],
                ["python", "-c", "pass"]):
        with pytest.raises(ConfigError):
            launcher_command(bad)


def test_record_without_stacks(tmp_path, capfd, in_process):
    script = tmp_path / "s.py"
    script.write_text("import torch\ny = torch.ones(3) * 2  # MUL-LINE\n")
    ref = tmp_path / "ref"
    assert main(["determinism", "record", "--no-stacks", "-o", str(ref), "--", "python",
                 str(script)]) == 0
    hm = json.loads((ref / "hashes.json").read_text())["hash_mode"]
    assert hm["stacks"] == [] and all(op["stack"] is None for op in hm["ops"])
    assert [op["op"] for op in hm["ops"]] == ["aten.ones.default", "aten.mul.Tensor"]
    capfd.readouterr()
    script.write_text("import torch\ny = torch.ones(3) * 3  # MUL-LINE\n")
    assert main(["determinism", "check", str(ref), "--", "python", str(script)]) == 1
    out = capfd.readouterr().out
    # this run's stack is still shown (taken live); the reference has none to show
    assert "op #1 aten.mul.Tensor" in out and "MUL-LINE" in out and "(no user frames)" in out
