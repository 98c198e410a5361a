"""Realizations of real scripts (issue 14, issue 15 §2/§6): the same program state in
every realization, threads as the manifest says, differing capture sets kept, bounded
captures, exact zero std, compilation kept apart, resume that checks every file."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from numvar.cli import main
from numvar.runner import load_run, zygote
from numvar.runner.store import RunStore

# An unseeded script: torch, numpy and Python's random all drawn without a seed.
UNSEEDED = """\
import random
import numpy as np
import torch
x = torch.randn(6, 6)
net = torch.nn.Linear(6, 3)
with torch.no_grad():
    y = net(x)
print(f"draws {random.random()!r} {np.random.rand()!r} {x[0, 0].item()!r}")
print(f"set {hash('numvar') % 1000}.5 order {''.join(sorted({'a', 'b', 'c'}, key=hash))}")
print(f"sum {y.sum().item()!r}")
"""

THREADS = """\
import torch, numba
with open("threads.txt", "w") as f:
    f.write(f"{torch.get_num_threads()} {numba.get_num_threads()}")
print(f"{torch.ones(3).sum().item():.1f}")
"""


def run_cli(*args):
    return main(["run", *map(str, args)])


def files_of(path):
    m = RunStore.open(path).manifest
    return {r["index"]: (Path(path) / r["file"]).read_bytes()
            for r in m["realizations"] if r["status"] == "ok"}


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("NUMVAR_WARMUP", "0")  # the warm-up has its own test


def test_forked_realizations_use_the_manifest_thread_count(tmp_path, monkeypatch):
    """Defect 1: numba's OpenMP layer reset torch to all cores in forked realizations."""
    (tmp_path / "t.py").write_text(THREADS.replace('open("threads.txt", "w")',
                                                   'open(__import__("os").environ["OUT"] + '
                                                   '__import__("os").environ["NUMVAR_REALIZATION"], "w")'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OUT", str(tmp_path / "threads-"))
    assert run_cli("-n", 2, "--jobs", 2, "--mode", "ieee", "--granularity", "op",
                   "--capture", "stdout", "--out", "runs/t2", "--", "t.py") == 0
    m = RunStore.open(tmp_path / "runs/t2").manifest
    want = m["config"]["threads"]
    assert want == max(1, len(os.sched_getaffinity(0)) // 2)
    for i in (0, 1):
        assert (tmp_path / f"threads-{i}").read_text() == f"{want} {want}"
        assert m["realizations"][i]["threads"] == {"torch": want, "numba": want}


def test_unseeded_script_is_identical_everywhere(tmp_path, monkeypatch, capsys):
    """Defect 2 + README: forked, fresh (NUMVAR_ZYGOTE=0), resumed with a new zygote and
    on Dask, an unseeded script starts from the manifest's random state: ieee
    realizations are bitwise identical, and the draws equal the reference's."""
    (tmp_path / "unseeded.py").write_text(UNSEEDED)
    monkeypatch.chdir(tmp_path)
    assert run_cli("-n", 2, "--jobs", 2, "--mode", "ieee", "--granularity", "op",
                   "--out", "runs/u", "--", "unseeded.py") == 0
    base = tmp_path / "runs/u"
    files = files_of(base)
    assert files[0] == files[1]
    s = load_run(base)
    ref = s.reference["stdout"]
    assert torch.equal(s["stdout"][0][:4], ref[:4])  # random draws and hash order
    m = RunStore.open(base).manifest
    assert m["config"]["rng"]["torch"]["seed"] == 67280421310721
    for r in m["realizations"]:
        assert r["rng"] == {k: m["config"]["rng"][k]["sha256"] for k in ("python", "numpy", "torch")}
    # std of bitwise-identical realizations: exactly 0 (defect 5)
    capsys.readouterr()
    assert main(["report", str(base), "--format", "json", "--task", "none"]) == 0
    rep = json.loads(capsys.readouterr().out)
    for name, e in rep["captures"].items():
        assert e["varying_elements"] == 0 and e["std"] == 0.0 and e["std_max"] == 0.0, name

    # fresh interpreters, and a resume that adds realizations with a new zygote
    zygote.close_all()
    monkeypatch.setenv("NUMVAR_ZYGOTE", "0")
    assert run_cli("--resume", base, "-n", 3) == 0
    monkeypatch.delenv("NUMVAR_ZYGOTE")
    assert run_cli("--resume", base, "-n", 4) == 0
    files = files_of(base)
    assert sorted(files) == [0, 1, 2, 3] and len(set(files.values())) == 1
    # Dask
    assert run_cli("-n", 2, "--jobs", 2, "--mode", "ieee", "--granularity", "op",
                   "--executor", "dask", "--out", "runs/d", "--", "unseeded.py") == 0
    assert set(files_of(tmp_path / "runs/d").values()) == set(files.values())


CONVERGES = """\
import os
import torch
torch.manual_seed(0)
net = torch.nn.Linear(4, 2)
seed = os.environ.get("NUMVAR_SEED")
steps = 5 if seed is None else 3 + int(seed) % 2   # stands for "until the loss is small"
with torch.no_grad():
    for _ in range(steps):
        y = net(torch.ones(3, 4))
    print(f"loss {y.square().mean().item():.9e}")
"""


def test_differing_capture_sets_are_kept_and_reported(tmp_path, monkeypatch, capsys):
    """Defect 3: a loop that runs until convergence calls its modules a different number
    of times; the realizations are kept, the shared captures analysed, the others
    reported as present in k of R, the varying count as a finding."""
    (tmp_path / "conv.py").write_text(CONVERGES)
    monkeypatch.chdir(tmp_path)
    assert run_cli("-n", 3, "--jobs", 2, "--mode", "ieee", "--granularity", "op",
                   "--out", "runs/c", "--", "conv.py") == 0
    out = capsys.readouterr().err
    assert "3 of 3 realizations stored" in out and "next: numvar report" in out
    s = load_run(tmp_path / "runs/c")
    assert s.indices == [0, 1, 2]
    assert [c["modules"] for c in s.counts] == [3, 4, 3] and s.reference_counts["modules"] == 5
    assert s.partial["modules/003.Linear"] == {"present": 1, "of": 3, "reference": True,
                                               "shapes": {"(3, 2) float32": 1}}
    assert "modules/002.Linear" in s.captures and "stdout" in s.captures
    assert main(["report", str(tmp_path / "runs/c"), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["iterations"]["modules"] == [3, 4, 3] and rep["iterations"]["varies"]
    assert {p["name"]: p["present"] for p in rep["presence"]} == {
        "modules/003.Linear": 1, "modules/004.Linear": 0}
    notes = " ".join(rep["notes"])
    assert "modules/003.Linear (present in 1 of 3)" in notes
    assert "number of top-level module calls varies under rounding: 3, 4, 3 (IEEE reference 5)" in notes


BIG = """\
import os
import torch
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
lin = torch.nn.Linear(64, 4096, bias=False)     # 256 x 4096 float32 = 4 MiB per call
x = torch.ones(256, 64)
start = rss()
with torch.no_grad():
    for _ in range(40):
        lin(x)
with open(os.environ["RSS"] + os.environ["NUMVAR_REALIZATION"], "w") as f:
    f.write(str(rss() - start))
print("done 1.0")
"""


def test_capture_limit_bounds_memory_and_says_what_it_dropped(tmp_path, monkeypatch, capsys):
    """Defect 4: 40 module outputs of 4 MiB (160 MiB) under a 10 MB cap: two are kept,
    38 dropped and counted; the process grows by the cap, not by 160 MiB."""
    (tmp_path / "big.py").write_text(BIG)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RSS", str(tmp_path / "rss-"))
    assert run_cli("-n", 2, "--jobs", 1, "--mode", "ieee", "--granularity", "op",
                   "--capture-limit", "10MB", "--out", "runs/b", "--", "big.py") == 0
    err = capsys.readouterr().err
    assert "the capture limit (10 MiB per realization) dropped 76 capture call(s)" in err
    m = RunStore.open(tmp_path / "runs/b").manifest
    assert m["config"]["capture_limit"] == 10 * 10**6
    for r in m["realizations"]:
        assert r["dropped"] == {"module": {"calls": 38, "bytes": 38 * 4 * 2**20,
                                           "first": "modules/002.Linear",
                                           "last": "modules/039.Linear"}}
    for who in ("reference", "0", "1"):
        grew = int((tmp_path / f"rss-{who}").read_text())
        # uncapped, the 40 kept outputs alone are 160 MiB; capped: 8 MiB kept plus the
        # instrumentation's temporaries the allocator keeps (50–77 MiB measured alone,
        # 97 MiB once in CI beside the other tests' worker): well under 160 either way
        assert grew < 136 * 2**20, (who, grew)
    s = load_run(tmp_path / "runs/b")
    assert [c["modules"] for c in s.counts] == [40, 40]  # dropped calls still counted
    assert list(s.captures) == ["modules/000.Linear", "modules/001.Linear", "stdout"]


def test_std_of_identical_realizations_is_exactly_zero():
    """Defect 5: numpy's one-pass std gives ~1e-17 for identical rows; ours gives 0."""
    from numvar.analysis import analyze
    from numvar.runner.store import Samples

    g = torch.Generator().manual_seed(0)
    row = torch.rand(50, generator=g, dtype=torch.float64) * 0.3 + 0.1
    x = row.expand(7, 50).clone()
    loss = torch.full((7,), 0.1, dtype=torch.float64)
    assert np.std(x.numpy(), axis=0, ddof=1).max() > 0  # the bug this guards against
    assert np.std(loss.numpy(), ddof=1) > 0
    s = Samples(captures={"y": x, "loss": loss},
                reference={"y": row, "loss": torch.tensor(0.1, dtype=torch.float64)},
                kinds={"y": "api", "loss": "api"}, indices=list(range(7)), seeds=list(range(7)))
    res = analyze(s, task="none")
    for name in ("y", "loss"):
        e = res["captures"][name]
        assert e["std"] == 0.0 and e["std_max"] == 0.0 and e["sem"] == 0.0, name
        assert e["max_abs_dev_ref"] == 0.0
    # and a varying capture still gets the float64 sample std
    from numvar.analysis._util import centred_moments

    v = torch.randn(7, 5, generator=g, dtype=torch.float64).numpy() + 1e6
    assert np.allclose(centred_moments(v)[1], np.std(v, axis=0, ddof=1), rtol=1e-9)


def test_warm_kernels_runs_the_model_in_each_dtype_asked(monkeypatch):
    """``warm_kernels(dtypes=...)`` runs the warm-up model in those dtypes only, in order,
    under the mode and granularity asked (the test suite's warm-up runs one dtype per
    process, tests/_warmup.py), and both by default."""
    from numvar.runner import warmup as RW

    calls = []
    monkeypatch.setattr(RW, "_warm_model", lambda *a: calls.append(a))
    RW.warm_kernels("ud", "op", dtypes=("float64",))
    assert calls == [("float64", "ud", "op")]
    calls.clear()
    RW.warm_kernels()
    assert calls == [("float32", "sr", "flop"), ("float64", "sr", "flop")]


def test_compilation_runs_first_and_is_timed_apart(tmp_path, monkeypatch):
    """Defect 6 / issue 15 §3: the warm-up runs before the reference and says so; each
    realization reports numba's compile time apart, and its time excludes it; an ETA
    follows the first realization."""
    from numvar.runner.script import run_script
    from numvar.runner.store import realization_seconds

    monkeypatch.setenv("NUMVAR_WARMUP", "1")
    (tmp_path / "u.py").write_text(UNSEEDED)
    events = []
    res = run_script(["u.py"], n=2, jobs=1, mode="sr", granularity="op", out=tmp_path / "r",
                     invoke_dir=tmp_path, progress=lambda e, p: events.append((e, p)))
    kinds = [e for e, _ in events]
    assert kinds.index("compile") < kinds.index("done")
    start, end = [p for e, p in events if e == "compile"]
    assert start["estimate_s"] > 0 and end["compile_s"] is not None and end["seconds"] > 0
    eta = [p for e, p in events if e == "eta"]
    assert len(eta) == 1 and eta[0]["remaining"] == 1 and eta[0]["reference_s"] > 0
    for r in res.store.manifest["realizations"]:
        assert r["compile_s"] >= 0 and r["script_s"] > 0
        assert realization_seconds(r) == pytest.approx(r["script_s"] - r["compile_s"])
    assert load_run(tmp_path / "r").timings == [realization_seconds(r)
                                                for r in res.store.manifest["realizations"]]


def test_compile_timer_counts_compilation():
    import numba

    from numvar.runner.warmup import CompileTimer

    with CompileTimer() as t:
        @numba.njit(cache=False)
        def twice(x):
            return 2.0 * x

        twice(1.5)
    assert t.seconds > 0
    with CompileTimer() as t2:
        twice(2.5)  # compiled already
    assert t2.seconds == 0.0


def test_resume_reruns_missing_and_corrupt_files_and_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "u.py").write_text(UNSEEDED)
    monkeypatch.chdir(tmp_path)
    assert run_cli("-n", 3, "--jobs", 2, "--mode", "ieee", "--granularity", "op",
                   "--out", "runs/v", "--", "u.py") == 0
    base = tmp_path / "runs/v"
    good = {p.name: p.read_bytes() for p in base.glob("*.safetensors")}
    (base / "reference.safetensors").unlink()
    data = bytearray((base / "r0001.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one flipped bit of a value: the header still parses
    (base / "r0001.safetensors").write_bytes(bytes(data))
    capsys.readouterr()
    assert run_cli("--resume", base) == 0
    err = capsys.readouterr().err
    assert "reference: file missing; running it again" in err
    assert "r0001: file corrupt (checksum differs from the manifest's); running it again" in err
    assert "3 of 3 realizations stored" in err
    assert {p.name: p.read_bytes() for p in base.glob("*.safetensors")} == good
    assert run_cli("--resume", base) == 0  # all verified: nothing runs
    assert "running it again" not in capsys.readouterr().err


def test_options_are_checked_before_any_work(tmp_path, monkeypatch, capsys):
    (tmp_path / "u.py").write_text(UNSEEDED)
    monkeypatch.chdir(tmp_path)
    assert run_cli("-n", 1, "--out", "runs/one", "--", "u.py") == 2
    assert "-n must be at least 2" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert run_cli("--capture-limit", "lots", "--", "u.py") == 2
    assert "--capture-limit 'lots'" in capsys.readouterr().err
    assert main(["demo", "--modes", "sr,foo", "--out", "d", "-n", "2"]) == 2
    assert "unknown mode 'foo'" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


FAILS = """\
import os
if os.environ.get("NUMVAR_SEED") is not None:
    raise SystemExit("realizations fail")
print("1.5")
"""


def test_no_report_suggested_without_usable_realizations(tmp_path, monkeypatch, capsys):
    (tmp_path / "f.py").write_text(FAILS)
    monkeypatch.chdir(tmp_path)
    assert run_cli("-n", 2, "--mode", "ieee", "--granularity", "op", "--out", "runs/f",
                   "--", "f.py") == 1
    err = capsys.readouterr().err
    assert "numvar report" not in err and "0 usable realization(s)" in err


def test_compare_refuses_unrelated_runs(tmp_path, monkeypatch, capsys):
    from numvar.runner.store import RunStore as RS

    for name, shape in (("a", (45, 10)), ("b", (5, 3))):
        st = RS.create(tmp_path / name, config={"kind": "script", "argv": [f"{name}.py"]},
                       seeds=[0, 1])
        st.save_reference({"logits": torch.zeros(shape)})
        for i in (0, 1):
            st.save_realization(i, {"logits": torch.rand(shape)})
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "no capture of the same name and shape" in err
    assert "script a.py vs script b.py" in err and "logits (45, 10) vs (5, 3)" in err


def test_leftover_temporary_folders_are_removed(tmp_path):
    import subprocess
    import sys

    from numvar.runner.script import cleanup_leftovers

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name, pid in (("numvar-zygote-abc", dead.pid), ("numvar-r0002-xyz", dead.pid),
                      ("numvar-r0003-live", os.getpid()), ("numvar-reports", dead.pid)):
        d = tmp_path / name
        d.mkdir()
        (d / zygote.OWNER_FILE).write_text(str(pid))
    removed = {p.name for p in cleanup_leftovers(str(tmp_path))}
    assert removed == {"numvar-zygote-abc", "numvar-r0002-xyz"}
    assert (tmp_path / "numvar-r0003-live").is_dir() and (tmp_path / "numvar-reports").is_dir()


def test_workload_training_is_not_captured_nor_instrumented(tmp_path):
    """Issue 15 §2: on an empty model cache the reference trained the digits model
    (269 module captures) and the realizations loaded it (1 capture)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from numvar.runner.collect import Collector, ModuleHooks, collecting
    from numvar.workloads import _common

    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    in_training = []

    def train(config):
        before = len(seen)
        net = torch.nn.Linear(3, 2)
        net(torch.ones(4, 3)).sum().backward()
        _common.capture("train_loss", 1.0)
        in_training.append(len(seen) - before)
        return net, {"accuracy": 1.0}

    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Cfg:
        seed: int = 0

    c = Collector()
    with collecting(c), ModuleHooks(c, top_level=True), Spy():
        trained = _common.load_or_train_impl("toy", Cfg(), 1, lambda cfg: torch.nn.Linear(3, 2),
                                             train, tmp_path, retrain=False)
        n_ops = len(seen)
        trained.model(torch.ones(1, 3))
    assert in_training == [0] and len(seen) > n_ops  # the mode sees inference only
    tensors, _ = c.finish()
    assert list(tensors) == ["modules/000.Linear"]  # the inference, not the training


def test_sample_gives_every_realization_the_callers_random_state():
    """numvar.sample: realizations of a function that draws random numbers draw the same
    ones (the caller's state when sample was called), and that state is put back."""
    import random

    from numvar.runner import sample

    def fn():
        return {"t": torch.rand(3), "p": torch.tensor(random.random()),
                "n": torch.from_numpy(np.random.rand(2))}

    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    s = sample(fn, n=3, mode="ieee", granularity="op")
    for name in ("output.t", "output.p", "output.n"):
        x = s[name]
        assert torch.equal(x, x[:1].expand_as(x)) and torch.equal(x[0], s.reference[name])
    after = (torch.rand(3), random.random(), np.random.rand(2))
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    assert torch.equal(after[0], torch.rand(3)) and after[1] == random.random()
    assert np.array_equal(after[2], np.random.rand(2))
    assert torch.equal(s["output.t"][0], after[0])
