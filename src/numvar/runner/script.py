"""``numvar run``: realizations of an unmodified script, one fresh process each.

Each realization is ``python -m numvar.exec SCRIPT ARGS`` (see :mod:`numvar.exec`)
with the NUMVAR_* variables of its seed. A task (:func:`run_script_task`) runs the
process in a temporary folder, parses the numbers it printed, loads the files it
wrote (``--files``, never unpickled) and returns everything as bytes; the client
(:class:`~numvar.runner.engine.Recorder`) stores them. The same task function runs in
local threads (``--executor local``: each thread waits on its own process) or as a Dask
task (``--executor dask``), so stores do not depend on the executor.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import glob
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..errors import CaptureError, ConfigError, RunError
from . import rng, zygote
from .collect import DEFAULT_CAPTURE_LIMIT, parse_globs
from .engine import Recorder, default_jobs, failure_summary, tag_of, thread_share
from .store import RunStore, Samples
from .transport import pack, stdout_numbers, unpack

log = logging.getLogger(__name__)

CAPTURE_KINDS = ("api", "modules", "stdout")
DEFAULT_CAPTURE = ("api", "modules", "stdout")
LOG_LIMIT = 1 << 20  # bytes of each stdout/stderr log kept (the tail)
_PYTHON_RE = re.compile(r"^python[\d.]*(\.exe)?$")

#: what a realization process reports about itself, kept in its manifest record
CHILD_FIELDS = ("threads", "rng", "script_s", "compile_s", "dropped")

_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


# -- command parsing ---------------------------------------------------------------
def parse_command(command: list[str], invoke_dir: str | os.PathLike) -> list[str]:
    """``python x.py a`` / ``x.py a`` / ``-m pkg.mod a`` / ``python -m pkg.mod a`` →
    launcher argv (script path made absolute). ConfigError on anything else."""
    cmd = list(command or [])
    if cmd and _PYTHON_RE.match(os.path.basename(cmd[0])):
        cmd = cmd[1:]
    while cmd and cmd[0] in ("-u", "-B"):  # harmless interpreter flags
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("no script given: numvar run [OPTIONS] -- python SCRIPT.py [ARGS] "
                          "(or -- -m package.module [ARGS])")
    if cmd[0] == "-m":
        if len(cmd) < 2 or not cmd[1] or cmd[1].startswith("-"):
            raise ConfigError("-m needs a module name: numvar run -- -m package.module [ARGS]")
        top = cmd[1].split(".")[0]
        sys.path.insert(0, str(invoke_dir))
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise ConfigError(f"module not found: {cmd[1]} (searched from {invoke_dir})")
        return cmd
    if cmd[0].startswith("-"):
        raise ConfigError(f"unsupported interpreter option {cmd[0]!r}: numvar run runs "
                          f"'python SCRIPT.py ARGS' or '-m package.module ARGS'")
    path = Path(invoke_dir, cmd[0])
    if not path.is_file():
        raise ConfigError(f"script not found: {cmd[0]} (looked in {invoke_dir})")
    return [str(path.resolve()), *cmd[1:]]


def parse_capture(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """``'api,modules'`` → ``['api', 'modules']``; ``'none'`` → ``[]``."""
    if spec is None:
        return list(DEFAULT_CAPTURE)
    items = parse_globs(spec)
    if items == ["none"]:
        return []
    bad = [c for c in items if c not in CAPTURE_KINDS]
    if bad:
        raise ConfigError(f"--capture: unknown kind {bad[0]!r} "
                          f"(choose from {', '.join(CAPTURE_KINDS)}, or none)")
    return [c for c in CAPTURE_KINDS if c in items]


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(spec: int | str | None) -> int | None:
    """``--capture-limit``: ``"1GB"``/``"512MiB"``/``"200M"``/bytes → bytes; ``"none"``
    or 0 → None (no cap); None → :data:`DEFAULT_CAPTURE_LIMIT` (1 GiB)."""
    if spec is None:
        return DEFAULT_CAPTURE_LIMIT
    if isinstance(spec, int):
        value = spec
    elif str(spec).strip().lower() in ("none", "0"):
        return None
    else:
        m = _SIZE_RE.match(str(spec))
        if not m:
            raise ConfigError(f"--capture-limit {spec!r}: expected a size such as 1GB, "
                              f"500MB, 64MiB, a number of bytes, or none")
        unit = (m[2] or "").lower().rstrip("b")
        value = int(float(m[1]) * _UNITS[unit])
    if value < 0:
        raise ConfigError(f"--capture-limit must not be negative, got {spec!r}")
    return value or None


def _check_files(patterns: list[str]) -> list[str]:
    for p in patterns:
        if os.path.isabs(p) or ".." in Path(p).parts:
            raise ConfigError(f"--files {p!r}: patterns are relative to each realization's "
                              f"working directory (no absolute paths, no '..')")
    return patterns


def fuzzy_env(config: dict[str, Any], seed: int) -> dict[str, str]:
    """NUMVAR_* variables for a realization with ``seed`` (via ``FuzzyConfig.to_env``)."""
    from ..instrument import FuzzyConfig

    kw = {k: config[k] for k in ("granularity", "precision", "exclude", "include", "modules",
                                 "strict", "contraction", "format", "accumulate")
          if config.get(k) not in (None, [], ())}
    for k in ("exclude", "include", "modules"):
        if k in kw:
            kw[k] = tuple(kw[k])
    try:
        cfg = FuzzyConfig(mode=config["mode"], seed=seed, **kw)
    except TypeError as exc:
        raise ConfigError(f"bad instrumentation option: {exc}") from exc
    return {k: str(v) for k, v in cfg.to_env().items()}


# -- the task (runs on the client's threads or on a Dask worker) ---------------------
def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


def _load_file(path: Path, rel: str) -> dict[str, torch.Tensor]:
    """Load a file a script wrote: .npy/.npz (allow_pickle=False) or .safetensors."""
    name = "files/" + rel.replace(os.sep, "/")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        import numpy as np

        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise CaptureError(f"{name}: cannot load without unpickling ({exc})") from exc
        if arr.dtype.kind not in "biufc":
            raise CaptureError(f"{name}: non-numeric array of dtype {arr.dtype}")
        return {name: torch.from_numpy(np.ascontiguousarray(arr).copy())}
    if suffix == ".npz":
        import numpy as np

        out = {}
        try:
            with np.load(path, allow_pickle=False) as z:
                for key in z.files:
                    arr = z[key]
                    if arr.dtype.kind not in "biufc":
                        raise CaptureError(f"{name}/{key}: non-numeric array of dtype {arr.dtype}")
                    out[f"{name}/{key}"] = torch.from_numpy(np.ascontiguousarray(arr).copy())
        except ValueError as exc:
            raise CaptureError(f"{name}: cannot load without unpickling ({exc})") from exc
        return out
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return {f"{name}/{k}": v for k, v in load_file(str(path)).items()}
        except Exception as exc:
            raise CaptureError(f"{name}: not a valid safetensors file ({exc})") from exc
    raise CaptureError(f"{name}: unsupported file type {suffix or '(none)'!r}; --files loads "
                       f".npy, .npz and .safetensors (nothing is ever unpickled)")


def _collect_files(workdir: Path, patterns: list[str]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for pattern in patterns:
        rels = sorted(r for r in glob.glob(pattern, root_dir=workdir, recursive=True)
                      if (workdir / r).is_file())
        if not rels:
            raise CaptureError(f"--files {pattern!r} matched no file in the working directory")
        for rel in rels:
            for k, v in _load_file(workdir / rel, rel).items():
                out.setdefault(k, v)
    return out


def _numvar_src() -> str:
    """The folder holding the numvar package this process runs (children import the
    same one)."""
    import numvar

    return str(Path(numvar.__file__).resolve().parent.parent)


def _start(argv: list[str], *, env: dict[str, str], cwd: str, stdout: Path,
           stderr: Path) -> Any:
    """Start ``python -m numvar.exec ARGV``: forked by the zygote when available."""
    z = zygote.get(env)
    if z is not None:
        try:
            return z.spawn(argv, env=env, cwd=cwd, stdout=str(stdout), stderr=str(stderr))
        except OSError as exc:
            log.warning("zygote failed (%s); starting the realization from scratch", exc)
    with open(stdout, "wb") as fo, open(stderr, "wb") as fe:
        return subprocess.Popen([sys.executable, "-m", "numvar.exec", *argv],
                                stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, env=env, cwd=cwd)


def run_script_task(task: dict[str, Any]) -> bytes:
    """Run one realization of a script (task built by :func:`make_tasks`) → bytes."""
    tag = task["tag"]
    tmp = Path(tempfile.mkdtemp(prefix=f"numvar-{tag}-"))
    zygote.mark_owner(tmp)
    workdir = tmp / "work"
    workdir.mkdir()
    result = tmp / "result.safetensors"
    env = zygote.inheritable_env(dict(os.environ))
    env.update(task["env"])
    threads = str(task["threads"])
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    rng = task.get("rng")
    if rng:  # the string-hash seed is fixed at interpreter start (the zygote's too)
        env["PYTHONHASHSEED"] = str(rng["hash_seed"])
    src = _numvar_src()
    if Path(src).name not in ("site-packages", "dist-packages"):  # a source checkout
        env["PYTHONPATH"] = os.pathsep.join(
            [src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    invoke_dir = task["invoke_dir"]
    env["NUMVAR_RUNNER"] = json.dumps({
        "result": str(result), "capture": task["capture"], "layers": task["layers"],
        "threads": task["threads"], "invoke_dir": invoke_dir, "parent_pid": os.getpid(),
        "rng": rng, "capture_limit": task.get("capture_limit")})
    env["NUMVAR_REALIZATION"] = "reference" if task["index"] is None else str(task["index"])
    env["NUMVAR_WORKDIR"] = str(workdir)
    env["NUMVAR_INVOKE_DIR"] = invoke_dir
    cwd = str(workdir) if task["files"] else invoke_dir
    info: dict[str, Any] = {"tag": tag, "index": task["index"], "seed": task["seed"],
                            "host": socket.gethostname()}
    tensors: dict[str, torch.Tensor] = {}
    t0 = time.perf_counter()
    try:
        proc = _start(task["argv"], env=env, cwd=cwd, stdout=tmp / "stdout",
                      stderr=tmp / "stderr")
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            code = proc.wait()
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
        info["wall_s"] = time.perf_counter() - t0
        out_text = (tmp / "stdout").read_text(encoding="utf-8", errors="replace")
        err_text = (tmp / "stderr").read_text(encoding="utf-8", errors="replace")
        info["exit_code"] = code
        info["stdout_log"] = _tail(out_text, LOG_LIMIT)
        info["stderr_log"] = _tail(err_text, LOG_LIMIT)
        info["stderr_tail"] = "\n".join(err_text.rstrip().splitlines()[-20:])[-4000:]
        child_info: dict[str, Any] = {}
        if result.is_file():
            tensors, child_info = unpack(result.read_bytes())
        info.update({k: child_info[k] for k in CHILD_FIELDS if k in child_info})
        if code < 0:
            info.update(status="failed", error=f"killed by signal {signal.Signals(-code).name}")
        elif code != 0:
            info.update(status="failed", error=child_info.get("error"))
        elif not result.is_file():
            info.update(status="failed", error="the script ended without numvar's result "
                                               "(did it call os._exit?)")
        elif child_info.get("status") != "ok":
            info.update(status="failed", error=child_info.get("error") or "capture failed")
        else:
            kinds = dict(child_info.get("kinds") or {})
            if child_info.get("escapes"):
                info["escapes"] = child_info["escapes"]
            if "stdout" in task["capture"]:
                tensors["stdout"] = torch.tensor(stdout_numbers(out_text), dtype=torch.float64)
                kinds["stdout"] = "stdout"
            files = _collect_files(workdir, task["files"])
            tensors.update(files)
            kinds.update({k: "file" for k in files})
            info.update(status="ok", kinds=kinds)
    except CaptureError as exc:
        info.update(status="failed", error=str(exc))
        tensors = {}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if info.get("status") != "ok":
        tensors = {}
    return pack(tensors, info)


def kill_running() -> None:
    """Kill every realization process this process started (Ctrl-C of the client)."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for p in procs:
        try:
            p.kill()
        except OSError:
            pass


# -- the client ---------------------------------------------------------------------
def make_tasks(config: dict[str, Any], indices: list[int | None],
               seeds: list[int]) -> list[dict[str, Any]]:
    """One task dict (JSON-able) per realization index (None: the IEEE reference)."""
    tasks = []
    for i in indices:
        seed = config["seed"] if i is None else seeds[i]
        # the reference: natively, along the realizations' code path (numvar.exec)
        env = {"NUMVAR_REFERENCE": "1"} if i is None else fuzzy_env(config, seed)
        tasks.append({"tag": tag_of(i), "index": i, "seed": seed, "env": env,
                      "argv": config["argv"], "invoke_dir": config["invoke_dir"],
                      "capture": config["capture"], "layers": config["capture_layers"],
                      "files": config["files"], "threads": config["threads"],
                      "rng": config.get("rng"), "capture_limit": config.get("capture_limit")})
    return tasks


@contextlib.contextmanager
def open_executor(executor: str, jobs: int, scheduler: str | None) -> Iterator[Any]:
    """None for the local executor, a ``distributed.Client`` for Dask (a LocalCluster
    on 127.0.0.1 with one in-process worker of ``jobs`` threads when no scheduler)."""
    if executor != "dask":
        yield None
        return
    from .sampling import dask_client

    with dask_client(scheduler, n_workers=1, threads_per_worker=jobs, processes=False) as c:
        yield c


def execute(tasks: list[dict[str, Any]], rec: Recorder, *, jobs: int, client: Any = None) -> None:
    """Run ``tasks`` (in order of submission) and record each result as it arrives."""
    if not tasks:
        return
    if client is not None:
        from distributed import as_completed

        stamp = f"{os.getpid()}-{time.time_ns()}"
        futs = {client.submit(run_script_task, t, pure=False,
                              key=f"numvar-{t['tag']}-{stamp}"): t for t in tasks}
        try:
            for fut in as_completed(futs):
                rec.record(futs[fut]["index"], fut.result())
        except BaseException:
            client.cancel(list(futs))
            kill_running()
            raise
        return
    from concurrent.futures import ThreadPoolExecutor, as_completed as done

    pool = ThreadPoolExecutor(max_workers=min(jobs, len(tasks)),
                              thread_name_prefix="numvar-run")
    futs = {}
    try:
        futs = {pool.submit(run_script_task, t): t for t in tasks}
        for fut in done(futs):
            rec.record(futs[fut]["index"], fut.result())
    except BaseException:
        for f in futs:
            f.cancel()
        kill_running()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_script(command: list[str], *, n: int = 10, mode: str = "sr",
               granularity: str = "flop", seed: int = 0, jobs: int | None = None,
               out: str | os.PathLike | None = None,
               capture: str | list[str] | None = None,
               capture_layers: str | list[str] | None = None,
               files: str | list[str] | None = None, executor: str = "local",
               scheduler: str | None = None, precision: int | None = None,
               exclude: str | list[str] | None = None, include: str | list[str] | None = None,
               modules: str | list[str] | None = None, strict: bool = False,
               contraction: str = "separate",
               format: str | None = None, accumulate: str = "native",
               invoke_dir: str | os.PathLike | None = None,
               capture_limit: int | str | None = None,
               progress: Callable[[str, Any], None] | None = None) -> "RunResult":
    """Create ``out`` and run the IEEE reference, then ``n`` realizations of ``command``.

    ``strict``: each realization raises (and fails) at the first op that numvar cannot
    perturb as asked (``NUMVAR_STRICT=1``). ``capture_limit``: bytes one realization may
    capture (``"1GB"``, ``"200MB"``, an int; ``0`` or ``"none"``: no cap); default
    :data:`DEFAULT_CAPTURE_LIMIT`."""
    invoke_dir = str(Path(invoke_dir or os.getcwd()).resolve())
    if n < 2:
        raise ConfigError(f"-n must be at least 2 (variability needs two realizations to "
                          f"compare), got {n}")
    if executor not in ("local", "dask"):
        raise ConfigError(f"--executor must be 'local' or 'dask', got {executor!r}")
    if scheduler and executor != "dask":
        raise ConfigError("--scheduler needs --executor dask")
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    argv = parse_command(command, invoke_dir)
    from ..rounding.formats import format_token

    if out is None:
        stem = Path(argv[1] if argv[0] == "-m" else argv[0]).stem
        out = Path("runs") / f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    config = {
        "kind": "script", "argv": argv, "invoke_dir": invoke_dir,
        "mode": mode, "granularity": granularity, "precision": precision, "seed": seed,
        "contraction": contraction, "format": format_token(format), "accumulate": accumulate,
        "n": n, "exclude": parse_globs(exclude), "include": parse_globs(include),
        "modules": parse_globs(modules), "strict": bool(strict),
        "capture": parse_capture(capture),
        "capture_layers": parse_globs(capture_layers),
        "files": _check_files(parse_globs(files)), "jobs": jobs, "executor": executor,
        "threads": thread_share(min(jobs, n)),
        "capture_limit": parse_size(capture_limit),
        "rng": rng.spec(),
    }
    seeds = [seed + i for i in range(n)]
    fuzzy_env(config, seed)  # validates mode, granularity, ... before anything runs
    store = RunStore.create(out, config=config, seeds=seeds,
                            command=_canonical_command(config, out, command))
    return _drive(store, jobs=jobs, executor=executor, scheduler=scheduler, progress=progress)


def _canonical_command(config: dict[str, Any], out: Any, command: list[str]) -> list[str]:
    """The ``numvar run`` command line that reproduces this run."""
    cmd = ["numvar", "run", "-n", str(config["n"]), "--mode", config["mode"],
           "--granularity", config["granularity"], "--seed", str(config["seed"]),
           "--jobs", str(config["jobs"]), "--out", str(out),
           "--capture", ",".join(config["capture"]) or "none"]
    if config["precision"] is not None:
        cmd += ["--precision", str(config["precision"])]
    if config.get("contraction", "separate") != "separate":
        cmd += ["--contraction", config["contraction"]]
    if config.get("format") is not None:
        cmd += ["--format", config["format"]]
    if config.get("accumulate", "native") != "native":
        cmd += ["--accumulate", config["accumulate"]]
    for key, opt in (("exclude", "--exclude"), ("include", "--include"),
                     ("modules", "--modules")):
        if config[key]:
            cmd += [opt, ",".join(config[key])]
    for g in config["capture_layers"]:
        cmd += ["--capture-layers", g]
    for g in config["files"]:
        cmd += ["--files", g]
    if config["executor"] != "local":
        cmd += ["--executor", config["executor"]]
    if config.get("capture_limit") != DEFAULT_CAPTURE_LIMIT:
        cmd += ["--capture-limit", str(config.get("capture_limit") or "none")]
    return cmd + ["--", *command]


def resume_script(path: str | os.PathLike, *, n: int | None = None, jobs: int | None = None,
                  executor: str | None = None, scheduler: str | None = None,
                  progress: Callable[[str, Any], None] | None = None) -> "RunResult":
    """Run what ``path`` is missing: the reference, pending and failed realizations,
    and every stored file that is missing or corrupt (checked against the manifest's
    checksums). ``n`` larger than the run's adds realizations (seeds continue)."""
    store = RunStore.open(path)
    cfg = store.manifest["config"]
    if cfg.get("kind") != "script":
        raise ConfigError(f"{path} was not made by numvar run (kind {cfg.get('kind')!r})")
    if n is not None:
        added = store.extend(int(n))
        if added and progress is not None:
            progress("added", added)
    jobs = int(jobs) if jobs is not None else int(cfg.get("jobs") or default_jobs())
    executor = executor or cfg.get("executor", "local")
    return _drive(store, jobs=jobs, executor=executor, scheduler=scheduler, progress=progress)


class RunResult:
    """What ``numvar run`` did: the store, what ran, what failed."""

    def __init__(self, store: RunStore, ran: list[int | None], failed: list[dict[str, Any]],
                 wall_s: float) -> None:
        self.store, self.ran, self.failed, self.wall_s = store, ran, failed, wall_s

    @property
    def total(self) -> int:
        """Realizations attempted (the reference not counted)."""
        return sum(i is not None for i in self.ran)

    @property
    def path(self) -> Path:
        return self.store.path

    def samples(self) -> Samples:
        return self.store.load()

    def check(self) -> None:
        """Raise RunError listing the failed realizations, if any."""
        if self.failed:
            err = RunError(failure_summary(self.failed, self.total))
            err.failed = self.failed  # type: ignore[attr-defined]
            raise err


def _drive(store: RunStore, *, jobs: int, executor: str, scheduler: str | None,
           progress: Callable[[str, Any], None] | None) -> RunResult:
    cfg = store.manifest["config"]
    cleanup_leftovers()
    problems = store.verify()  # missing or corrupt files run again
    if problems and progress is not None:
        progress("problems", problems)
    seeds = [r["seed"] for r in store.manifest["realizations"]]
    timing = _Eta(jobs, progress)
    rec = Recorder(store, seeds, config=cfg, progress=timing)
    pending = store.pending()
    need_ref = store.manifest["reference"].get("status") != "ok"
    t0 = time.perf_counter()
    ran: list[int | None] = ([None] if need_ref else []) + pending
    timing.remaining = len(pending)
    if progress is not None:
        progress("store", store.path)
        progress("total", len(ran))
    tasks = make_tasks(cfg, pending, seeds)  # builds every env first: errors come early
    if ran and cfg.get("mode") and (executor != "dask" or not scheduler):
        from .warmup import needed

        if needed(cfg.get("granularity") or "flop"):
            warm_up(cfg, progress)
    # the zygote stays up for later runs in this process (closed at exit)
    with open_executor(executor, jobs, scheduler) as client:
        if need_ref:  # the IEEE reference always comes first, alone
            execute(make_tasks(cfg, [None], seeds), rec, jobs=1, client=client)
            ref = rec.reference_record or {}
            if ref.get("status") != "ok":
                code = ref.get("exit_code")
                why = ref.get("error") or (ref.get("stderr_tail") or "").strip() or "no stderr"
                raise RunError(
                    f"the IEEE reference run failed"
                    + (f" (exit code {code})" if code is not None else "")
                    + f"; no realization was run. Logs: {store.path / 'logs'}\n{why}")
        execute(tasks, rec, jobs=jobs, client=client)
    return RunResult(store, ran, list(rec.failed), time.perf_counter() - t0)


class _Eta:
    """Passes progress events on and, once the reference and the first realization are
    in, announces an estimate of the time left (event ``"eta"``)."""

    def __init__(self, jobs: int, progress: Callable[[str, Any], None] | None) -> None:
        self.jobs, self.progress = max(1, jobs), progress
        self.remaining = 0
        self.reference_s: float | None = None
        self.sent = False

    def __call__(self, event: str, rec: Any) -> None:
        if self.progress is None:
            return
        self.progress(event, rec)
        if event != "done":
            return
        if rec["index"] is None:
            self.reference_s = rec.get("wall_s")
            return
        self.remaining -= 1
        if not self.sent and rec.get("status") == "ok" and rec.get("wall_s") is not None:
            self.sent = True
            per = float(rec["wall_s"])
            left = per * -(-max(self.remaining, 0) // self.jobs)
            self.progress("eta", {"reference_s": self.reference_s, "first_s": per,
                                  "compile_s": rec.get("compile_s") or 0.0,
                                  "remaining": max(self.remaining, 0), "jobs": self.jobs,
                                  "seconds": left})


def warm_up(cfg: dict[str, Any], progress: Callable[[str, Any], None] | None) -> None:
    """Compile (or load from numba's cache) numvar's kernels in a process of their own,
    before the reference: see :mod:`numvar.runner.warmup` (done once per installation;
    ``NUMVAR_WARMUP=0`` skips it, realizations then compile what they need, still timed
    apart). Events ``"compile"`` with
    ``{"estimate_s"}`` before and ``{"seconds", "compile_s"}`` after."""
    from .warmup import COLD_ESTIMATE_S, remember

    gran = cfg.get("granularity") or "flop"
    if progress is not None:
        progress("compile", {"estimate_s": COLD_ESTIMATE_S.get(gran, 60)})
    tmp = Path(tempfile.mkdtemp(prefix="numvar-warmup-"))
    zygote.mark_owner(tmp)
    t0 = time.perf_counter()
    compile_s = None
    try:
        env = zygote.inheritable_env(dict(os.environ))
        src = _numvar_src()
        if Path(src).name not in ("site-packages", "dist-packages"):
            env["PYTHONPATH"] = os.pathsep.join(
                [src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        if cfg.get("rng"):
            env["PYTHONHASHSEED"] = str(cfg["rng"]["hash_seed"])
        threads = str(cfg.get("threads") or 1)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        proc = _start(["-m", "numvar.runner.warmup", cfg["mode"], gran], env=env,
                      cwd=str(tmp), stdout=tmp / "stdout", stderr=tmp / "stderr")
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            code = proc.wait()
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
        if code == 0:
            remember(gran)
            try:
                compile_s = json.loads((tmp / "stdout").read_text().strip().splitlines()[-1])[
                    "compile_s"]
            except (ValueError, IndexError, KeyError):
                pass
        else:  # the realizations will compile what they need (timed apart all the same)
            log.warning("compiling numvar's kernels ahead failed (exit code %s): %s", code,
                        (tmp / "stderr").read_text(errors="replace")[-2000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if progress is not None:
        progress("compile", {"seconds": time.perf_counter() - t0, "compile_s": compile_s})


_LEFTOVER_PREFIXES = ("numvar-zygote-", "numvar-warmup-", "numvar-reference-", "numvar-r")
def cleanup_leftovers(tmpdir: str | None = None) -> list[Path]:
    """Remove numvar's temporary folders left behind by runs that were killed (kill -9
    leaves no chance to clean up): those whose owner process is gone, and unmarked
    ones older than a day. Returns what was removed."""
    base = Path(tmpdir or tempfile.gettempdir())
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for d in entries:
        name = d.name
        if not name.startswith(_LEFTOVER_PREFIXES) or not d.is_dir() or d.is_symlink():
            continue
        if name.startswith("numvar-r") and not re.match(r"numvar-r\d{4,}-", name):
            continue
        try:
            if d.stat().st_uid != os.getuid():
                continue
            owner = d / zygote.OWNER_FILE
            if owner.is_file():
                pid = int(owner.read_text().strip() or 0)
                if pid and _alive(pid):
                    continue
            elif time.time() - d.stat().st_mtime < 86400:
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    if removed:
        log.info("removed %d temporary folder(s) left by killed runs", len(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
