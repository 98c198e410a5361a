"""`numvar run` end to end: unmodified scripts, resume, failures, Dask, clear errors.

Each realization is a real `python -m numvar.exec` process running the real
instrumentation; models are tiny so that process start-up dominates.
"""

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from numvar.cli import main
from numvar.runner import load_run
from numvar.runner.store import RunStore

SRC = str(Path(__file__).resolve().parents[1] / "src")

# An unmodified inference script: it imports nothing from numvar.
NET = """\
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
with torch.no_grad():
    y = net(x)
    loss = torch.nn.functional.mse_loss(y, torch.zeros_like(y))
print(f"epoch 1 loss {loss.item():.9e}")
print(f"mean {y.mean().item():.9e} max {y.max().item():.9e}")
"""


@pytest.fixture(scope="module", autouse=True)
def _no_warmup():
    """The kernels' warm-up has its own test (test_runner_realizations); here it would
    only add a compilation on a cold CI cache to the kill/Ctrl-C tests' deadlines."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NUMVAR_WARMUP", "0")
        yield


def run_cli(*args):
    return main(["run", *map(str, args)])


def realization_files(path):
    m = RunStore.open(path).manifest
    return {r["index"]: (Path(path) / r["file"]).read_bytes()
            for r in m["realizations"] if r["status"] == "ok"}


@pytest.fixture(scope="module")
def net_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("net")
    (d / "net.py").write_text(NET)
    return d


@pytest.fixture(scope="module")
def sr_run(net_dir):
    """One local SR run shared by the tests below (3 realizations, 2 jobs)."""
    from numvar.instrument import fuzzy

    with fuzzy(mode="sr"):  # compile numba kernels here once, not in 2 realizations at once
        exec(NET.replace("print(", "str("), {})
    cwd = os.getcwd()
    os.chdir(net_dir)
    try:
        rc = run_cli("-n", 3, "--mode", "sr", "--seed", 7, "--jobs", 2, "--out", "runs/sr",
                     "--capture-layers", "1", "--", "python", "net.py")
    finally:
        os.chdir(cwd)
    assert rc == 0
    return net_dir / "runs/sr"


def test_unmodified_script_varies_under_sr(sr_run, net_dir):
    assert "numvar" not in NET
    s = load_run(sr_run)
    assert s.indices == [0, 1, 2] and s.seeds == [7, 8, 9]
    assert list(s.kinds.items()) == [("layers/1#0", "layer"), ("modules/000.Sequential", "module"),
                                     ("stdout", "stdout")]
    y = s["modules/000.Sequential"]
    assert y.shape == (3, 8, 4) and y.dtype == torch.float32
    assert s["stdout"].shape == (3, 3)  # loss, mean, max (integers like "epoch 1" are not numbers)
    # SR moves results: realizations differ pairwise, each by a few float32 ulps at most
    for i in range(3):
        for j in range(i):
            assert not torch.equal(y[i], y[j])
            assert not torch.equal(s["stdout"][i], s["stdout"][j])
    assert torch.allclose(y, s.reference["modules/000.Sequential"].expand_as(y), rtol=1e-5,
                          atol=1e-6)
    # the reference is a plain (uninstrumented) run: identical to running the model here
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with torch.no_grad():
        assert torch.equal(s.reference["modules/000.Sequential"], net(x))
        assert torch.equal(s.reference["layers/1#0"], net[1](net[0](x)))
    m = RunStore.open(sr_run).manifest
    assert m["config"]["mode"] == "sr" and m["config"]["argv"][0].endswith("net.py")
    assert m["command"] == ["numvar", "run", "-n", "3", "--mode", "sr", "--granularity", "flop",
                            "--seed", "7", "--jobs", "2", "--out", "runs/sr", "--capture",
                            "api,modules,stdout", "--capture-layers", "1", "--", "python",
                            "net.py"]
    assert (sr_run / "logs" / "r0001.stdout").read_text().startswith("epoch 1 loss")


def test_unmodified_script_identical_under_ieee(net_dir, monkeypatch):
    monkeypatch.chdir(net_dir)
    assert run_cli("-n", 2, "--mode", "ieee", "--jobs", 2, "--out", "runs/ieee",
                   "--", "python", "-m", "net") == 0  # the module form, this time
    m = RunStore.open(net_dir / "runs/ieee").manifest
    assert m["config"]["argv"] == ["-m", "net"]
    s = load_run(net_dir / "runs/ieee")
    for name in ("modules/000.Sequential", "stdout"):
        assert torch.equal(s[name][0], s[name][1]), name
    assert torch.allclose(s["modules/000.Sequential"][0], s.reference["modules/000.Sequential"],
                          rtol=1e-6, atol=1e-7)


def test_local_and_dask_stores_are_bitwise_identical(sr_run, net_dir, monkeypatch):
    monkeypatch.chdir(net_dir)
    assert run_cli("-n", 3, "--mode", "sr", "--seed", 7, "--jobs", 2, "--out", "runs/dask",
                   "--capture-layers", "1", "--executor", "dask", "--", "python", "net.py") == 0
    local, dask = realization_files(sr_run), realization_files(net_dir / "runs/dask")
    assert sorted(local) == sorted(dask) == [0, 1, 2]
    for i in local:
        assert local[i] == dask[i], f"realization {i} differs between executors"
    assert ((sr_run / "reference.safetensors").read_bytes()
            == (net_dir / "runs/dask/reference.safetensors").read_bytes())


def test_zygote_and_fresh_interpreters_agree(sr_run, net_dir, monkeypatch):
    """A realization forked by the zygote equals one run by a fresh `python -m numvar.exec`."""
    import shutil

    plain = net_dir / "runs/plain"
    shutil.copytree(sr_run, plain)
    store = RunStore.open(plain)
    store.manifest["realizations"][1]["status"] = "pending"
    store.flush()
    (plain / "r0001.safetensors").unlink()
    monkeypatch.chdir(net_dir)
    monkeypatch.setenv("NUMVAR_ZYGOTE", "0")
    assert main(["run", "--resume", str(plain)]) == 0  # reruns r0001 only, from scratch
    assert (plain / "r0001.safetensors").read_bytes() == (sr_run / "r0001.safetensors").read_bytes()


HANGS = """\
import os, time
import torch
who = os.environ.get("NUMVAR_REALIZATION", "?")
with open(os.environ["ATTEMPTS"], "a") as f:
    f.write(who + "\\n")
if who == "2":
    while not os.path.exists(os.environ["RELEASE"]):
        time.sleep(0.05)
torch.manual_seed(0)
lin = torch.nn.Linear(8, 3)
with torch.no_grad():
    print(f"{lin(torch.randn(4, 8)).sum().item():.9e}")
"""


def test_resume_after_kill_runs_exactly_the_missing(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    attempts, release = tmp_path / "attempts.txt", tmp_path / "release"
    env = dict(os.environ, PYTHONPATH=SRC, ATTEMPTS=str(attempts), RELEASE=str(release))
    out = tmp_path / "runs/h"
    proc = subprocess.Popen(
        [sys.executable, "-m", "numvar.cli", "run", "-n", "4", "--jobs", "1", "--out", str(out),
         "--", "python", "hangs.py"], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    def r1_stored_and_r2_running():
        if not (attempts.exists() and "2" in attempts.read_text().split()):
            return False
        try:  # realization 2 hangs until released, so r1's record can only come in
            return RunStore.open(out).manifest["realizations"][1]["status"] == "ok"
        except Exception:  # manifest not written yet
            return False

    deadline = time.monotonic() + 120
    while not r1_stored_and_r2_running():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "realization 2 never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole numvar run, children included
    proc.wait()
    proc.stderr.close()
    store = RunStore.open(out)
    status = [r["status"] for r in store.manifest["realizations"]]
    assert store.manifest["reference"]["status"] == "ok"
    assert status == ["ok", "ok", "pending", "pending"] and store.pending() == [2, 3]
    before = {i: (out / f"r{i:04d}.safetensors").stat() for i in (0, 1)}

    release.touch()
    old = dict(os.environ)
    os.environ.update(ATTEMPTS=str(attempts), RELEASE=str(release))
    try:
        assert main(["run", "--resume", str(out), "--jobs", "2"]) == 0
    finally:
        os.environ.clear()
        os.environ.update(old)
    counts = collections.Counter(attempts.read_text().split())
    assert counts == {"reference": 1, "0": 1, "1": 1, "2": 2, "3": 1}  # 2 was killed once
    for i, st in before.items():
        now = (out / f"r{i:04d}.safetensors").stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    s = load_run(out)
    assert s.indices == [0, 1, 2, 3] and s["stdout"].shape == (4, 1)
    assert main(["run", "--resume", str(out)]) == 0  # nothing left: runs nothing
    assert collections.Counter(attempts.read_text().split()) == counts


def test_ctrl_c_keeps_what_finished(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    attempts = tmp_path / "attempts.txt"
    env = dict(os.environ, PYTHONPATH=SRC, ATTEMPTS=str(attempts),
               RELEASE=str(tmp_path / "never"))
    out = tmp_path / "runs/i"
    proc = subprocess.Popen(
        [sys.executable, "-m", "numvar.cli", "run", "-n", "3", "--jobs", "1", "--out", str(out),
         "--", "python", "hangs.py"], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (attempts.exists() and "2" in attempts.read_text().split()
               and RunStore.open(out).manifest["realizations"][1]["status"] == "ok"):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"interrupted: what finished is stored; complete it with numvar run --resume {out}" in err
    m = RunStore.open(out).manifest  # the interrupted realization is pending, not failed
    assert [r["status"] for r in m["realizations"]] == ["ok", "ok", "pending"]


CRASHES = """\
import os
import torch
torch.manual_seed(0)
w = torch.randn(6, 6)
if os.environ.get("NUMVAR_SEED") == "3":
    raise ValueError("unlucky seed 3")
print(f"{(w @ w).trace().item():.9e}")
"""


def test_crash_in_one_of_five_keeps_the_other_four(tmp_path, monkeypatch, capsys):
    (tmp_path / "crashes.py").write_text(CRASHES)
    monkeypatch.chdir(tmp_path)
    rc = run_cli("-n", 5, "--jobs", 2, "--capture", "stdout", "--out", "runs/c",
                 "--", "python", "crashes.py")
    err = capsys.readouterr().err
    assert rc == 1
    assert "1 of 5 realizations failed" in err and "r0003 (exit code 1): ValueError: unlucky seed 3" in err
    m = RunStore.open(tmp_path / "runs/c").manifest
    assert [r["status"] for r in m["realizations"]] == ["ok", "ok", "ok", "failed", "ok"]
    bad = m["realizations"][3]
    assert bad["exit_code"] == 1 and "ValueError: unlucky seed 3" in bad["stderr_tail"]
    assert "Traceback" in (tmp_path / "runs/c/logs/r0003.stderr").read_text()
    s = load_run(tmp_path / "runs/c")
    assert s.indices == [0, 1, 2, 4] and s.seeds == [0, 1, 2, 4] and s["stdout"].shape == (4, 1)
    assert [f["index"] for f in s.failed] == [3]


EDGES = """\
import os
import numpy as np
import torch
from safetensors.torch import save_file
seed = os.environ.get("NUMVAR_SEED", "0")
os.makedirs("out", exist_ok=True)
x = torch.linspace(0, 1, 5)
save_file({"w": x * 2}, "out/t.safetensors")
np.save("out/pred.npy", np.array([object()]) if seed == "3" else x.numpy())
print(f"{x.sum().item():.6f}")
if seed == "1":
    print("extra 0.5")
if seed == "2":
    import numvar
    from numvar.runner import capture
    capture("label", "a string")
"""


def test_files_and_clear_capture_errors(tmp_path, monkeypatch, capsys):
    (tmp_path / "edges.py").write_text(EDGES)
    monkeypatch.chdir(tmp_path)
    rc = run_cli("-n", 4, "--mode", "ieee", "--jobs", 2, "--files", "out/*", "--out", "runs/e",
                 "--", "edges.py")
    err = capsys.readouterr().err
    assert rc == 1 and "2 of 4 realizations failed" in err
    m = RunStore.open(tmp_path / "runs/e").manifest
    r = m["realizations"]
    # r1 printed one number more: kept (differing captures are reported, not rejected)
    assert [x["status"] for x in r] == ["ok", "ok", "failed", "failed"]
    assert "capture 'label': non-numeric value of type str" in r[2]["stderr_tail"]
    assert "files/out/pred.npy: cannot load without unpickling" in r[3]["error"]
    s = load_run(tmp_path / "runs/e")
    assert s.kinds == {"files/out/pred.npy": "file", "files/out/t.safetensors/w": "file"}
    assert s.partial["stdout"] == {"present": 2, "of": 2, "reference": True,
                                   "shapes": {"(1,) float64": 1, "(2,) float64": 1}}
    assert torch.equal(s["files/out/pred.npy"][0], torch.linspace(0, 1, 5))
    assert torch.equal(s["files/out/t.safetensors/w"][0], 2 * torch.linspace(0, 1, 5))
    assert not list(tmp_path.glob("out"))  # the script wrote into its own working directory


@pytest.mark.parametrize("args, message", [
    (["--", "python", "missing.py"], "script not found: missing.py"),
    (["--", "-m", "no_such_module_xyz"], "module not found: no_such_module_xyz"),
    ([], "no script given"),
    (["--capture", "api,weights", "--", "x.py"], "--capture: unknown kind 'weights'"),
    (["--files", "/abs/*.npy", "--", "x.py"], "relative to each realization's working"),
    (["--mode", "fast", "--", "x.py"], "mode must be one of"),
    (["--scheduler", "tcp://127.0.0.1:1", "--", "x.py"], "--scheduler needs --executor dask"),
    (["--resume", "runs/none", "--mode", "ud"], "drop --mode"),
    (["--resume", "runs/none"], "no run directory at runs/none"),
])
def test_user_errors_are_clear(tmp_path, monkeypatch, capsys, args, message):
    (tmp_path / "x.py").write_text("print(1.0)\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli(*args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or args[0] == "--resume"


def test_unknown_option_and_existing_out(tmp_path, monkeypatch, capsys):
    from typer.testing import CliRunner

    from numvar.cli import app

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", "--frobnicate", "--", "x.py"])
    assert res.exit_code == 2 and "No such option: --frobnicate" in res.output
    RunStore.create(tmp_path / "runs/a", config={}, seeds=[0])
    (tmp_path / "x.py").write_text("print(1.0)\n")
    assert run_cli("--out", "runs/a", "--", "x.py") == 2
    assert "already holds a run; use --resume" in capsys.readouterr().err
