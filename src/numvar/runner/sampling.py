"""``numvar.sample``: R realizations of a Python function.

Realization ``i`` runs ``fn(*args)`` under ``numvar.instrument.fuzzy(mode, granularity,
seed=seed + i, ...)``; the reference runs it natively along the same code path
(:func:`numvar.instrument.reference_path`: the fast-path switches of a fuzzy block and a
pass-through dispatch mode), so that an ``ieee`` realization matches it up to summation
order.

Every realization (and the reference) starts from the random state (torch, numpy,
Python) the caller had when ``sample`` was called, so dropout masks and sampled inputs are
the same in all of them; the caller's state is put back afterwards.

Executors:

- ``jobs=1`` (the default): in this process, one realization after the other.
- ``jobs>1``: a pool of ``jobs`` worker processes started by multiprocessing's
  ``forkserver`` (``spawn`` where there is none). Plain ``fork`` is not the default:
  once this process has run instrumented code, numba's OpenMP pool refuses to be forked
  ("fork() called from a process already using GNU OpenMP") and CUDA breaks too. The
  fork server is a clean process that has imported torch and numvar once (see
  :mod:`numvar.runner._preload`), so workers start in milliseconds; ``fn`` and ``args``
  travel with cloudpickle (lambdas, closures and ``__main__`` functions work). Each
  worker uses ``cores // jobs`` threads in torch and numba. ``start_method`` overrides.
- ``executor="dask"``: one Dask task per realization (``scheduler`` an address such as
  ``tcp://host:8786`` or a ``distributed.Client``; none starts a ``LocalCluster`` of
  ``jobs`` single-threaded worker processes on 127.0.0.1). ``fn`` and ``args`` travel
  with cloudpickle; results come back as bytes and are stored exactly as local ones.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import traceback
from typing import Any, Callable

import torch

from ..errors import ConfigError, RunError
from .collect import Collector, ModuleHooks, collecting, parse_globs
from .engine import Recorder, limit_threads, raise_if_failed, tag_of, thread_share
from .rng import ProcessState
from .store import RunStore, Samples
from .transport import pack

# fn, args and options of the sample() call being served by this (worker) process
_PAYLOAD: dict[str, Any] | None = None


def fuzzy_context(mode: str | None, **kw: Any):
    """The instrumentation context for one realization (``mode=None``: the IEEE
    reference, :func:`numvar.instrument.reference_path`)."""
    if mode is None:
        from ..instrument import reference_path

        return reference_path()
    from ..instrument import fuzzy

    return fuzzy(mode=mode, **kw)


def realize(fn: Callable[..., Any], args: tuple, *, index: int | None, seed: int,
            mode: str | None, fuzzy_kw: dict[str, Any], capture_layers: list[str],
            model: torch.nn.Module | None, rng_state: Any = None) -> bytes:
    """Run one realization in this process; return its packed result (never raises
    for errors of ``fn``: they become a failed record with the traceback).

    ``rng_state`` (a :class:`~numvar.runner.rng.ProcessState`) is restored first, so
    every realization draws the same random numbers. The time numba spends compiling
    is reported apart (``compile_s``) and left out of the realization's time."""
    from .warmup import CompileTimer

    if rng_state is not None:
        rng_state.restore()
    collector = Collector()
    info: dict[str, Any] = {"tag": tag_of(index), "index": index, "seed": seed,
                            "host": socket.gethostname(), "pid": os.getpid()}
    tensors: dict[str, torch.Tensor] = {}
    t0 = time.perf_counter()
    timer = CompileTimer()
    try:
        with timer, collecting(collector), ModuleHooks(collector, layers=capture_layers,
                                                       model=model):
            kw = dict(fuzzy_kw)
            if model is not None:
                kw["model"] = model
            with fuzzy_context(mode, seed=seed, **kw) as fz:
                out = fn(*args)
            escapes = fz.report().escapes() if fz is not None else None
            if escapes:  # ops not perturbed as asked: stored with the realization
                info["escapes"] = escapes
            collector.add("output", out, kind="api", unique=True)
        tensors, kinds = collector.finish()
        info.update(status="ok", kinds=kinds)
    except Exception as exc:
        tb = traceback.format_exc()
        info.update(status="failed", error=f"{type(exc).__name__}: {exc}", stderr_tail=tb[-4000:])
        tensors = {}
    info["wall_s"] = info["script_s"] = time.perf_counter() - t0
    info["compile_s"] = timer.seconds
    return pack(tensors, info)


# -- worker-process side -----------------------------------------------------------
def _init_worker(threads: int, payload: bytes | None) -> None:
    global _PAYLOAD
    limit_threads(threads)
    if payload is not None:  # spawn: the payload comes pickled; fork inherits it
        import cloudpickle

        _PAYLOAD = cloudpickle.loads(payload)


def _pool_task(index: int | None, seed: int, mode: str | None) -> bytes:
    p = _PAYLOAD
    if p is None:  # pragma: no cover - defensive
        raise RuntimeError("numvar worker started without a payload")
    return realize(p["fn"], p["args"], index=index, seed=seed, mode=mode,
                   fuzzy_kw=p["fuzzy_kw"], capture_layers=p["capture_layers"], model=p["model"],
                   rng_state=p.get("rng_state"))


def _dask_task(payload: bytes, index: int | None, seed: int, mode: str | None,
               threads: int | None) -> bytes:
    import cloudpickle

    p = cloudpickle.loads(payload)
    if threads:
        limit_threads(threads)
    return realize(p["fn"], p["args"], index=index, seed=seed, mode=mode,
                   fuzzy_kw=p["fuzzy_kw"], capture_layers=p["capture_layers"], model=p["model"],
                   rng_state=p.get("rng_state"))


@contextlib.contextmanager
def dask_client(scheduler: Any, *, n_workers: int, threads_per_worker: int, processes: bool):
    """A ``distributed.Client``: the one given, one connected to ``scheduler`` (an
    address), or a fresh LocalCluster on 127.0.0.1 (closed on exit)."""
    import logging

    from distributed import Client, LocalCluster

    if isinstance(scheduler, Client):
        yield scheduler
        return
    if scheduler:
        try:
            client = Client(scheduler, timeout="20s")
        except OSError as exc:
            raise ConfigError(f"--scheduler {scheduler}: cannot connect ({exc})") from exc
        with client:
            yield client
        return
    # tcp on loopback also for in-process workers (whose default would be inproc://)
    with LocalCluster(host="127.0.0.1", protocol="tcp://", n_workers=n_workers,
                      threads_per_worker=threads_per_worker, processes=processes,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        yield client


def notebook_progress() -> Callable[[str, Any], None] | None:
    """A ``progress`` callback drawing a rich progress bar when running in a Jupyter
    kernel (where nothing else would show that realizations are running); None
    elsewhere (scripts and terminals pass their own, or none)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn

    bar = Progress(TextColumn("realizations (+ IEEE reference)"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn())
    state: dict[str, Any] = {}

    def progress(event: str, payload: Any) -> None:
        if event == "total":
            bar.start()
            state["task"] = bar.add_task("", total=payload)
            state["left"] = payload
        elif event == "done" and "task" in state:
            bar.advance(state["task"])
            state["left"] -= 1
            if state["left"] <= 0:
                bar.stop()

    return progress


def sample(fn: Callable[..., Any], *args: Any, n: int = 10, mode: str = "sr",
           granularity: str = "flop", seed: int = 0, jobs: int | None = None,
           out: str | os.PathLike | None = None, reference: bool = True,
           executor: str = "local", scheduler: Any = None,
           capture_layers: str | list[str] | None = None, model: torch.nn.Module | None = None,
           start_method: str | None = None, progress: Callable[[str, Any], None] | None = None,
           **fuzzy_kw: Any) -> Samples:
    """Run ``fn(*args)`` ``n`` times under random rounding and collect what it returns.

    The return value is captured as ``output`` (pytrees flatten to ``output.0``,
    ``output.key``, ...), together with every ``numvar.capture`` call made inside ``fn``
    and, with ``capture_layers`` (fnmatch globs over ``named_modules()`` paths of
    ``model``, or of the outermost module called), the outputs of matching submodules
    (``layers/path#k``). Realization ``i`` uses seed ``seed + i``; ``fuzzy_kw``
    (``precision``, ``exclude``, ``include``, ``modules``, ``contraction``) go to
    ``numvar.fuzzy``.
    With ``reference=True`` one uninstrumented run is stored in ``Samples.reference``.
    With ``out`` everything is also written to that run directory (``load_run`` reads it).

    ``jobs``, ``executor``, ``scheduler`` and ``start_method``: see the module docstring.
    ``progress(event, payload)`` is called with ``("total", count)`` and, per finished
    realization, ``("done", record)``.

    Raises :class:`~numvar.errors.RunError` when a realization fails; its ``samples``
    attribute holds the realizations that succeeded (also stored under ``out``).
    """
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    if executor not in ("local", "dask"):
        raise ConfigError(f"executor must be 'local' or 'dask', got {executor!r}")
    if mode is None:
        raise ConfigError("mode must be one of the rounding modes, not None")
    jobs = 1 if jobs is None else int(jobs)
    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1, got {jobs}")
    layers = parse_globs(capture_layers)
    seeds = [seed + i for i in range(n)]
    from ..rounding.formats import format_token

    config = {"kind": "function", "function": getattr(fn, "__qualname__", repr(fn)),
              "mode": mode, "granularity": granularity, "seed": seed, "n": n,
              "jobs": jobs, "executor": executor, "capture_layers": layers,
              **{k: (format_token(v) if k == "format" else v) for k, v in fuzzy_kw.items()}}
    _check_fuzzy(mode, granularity, fuzzy_kw)
    store = None
    if out is not None:
        store = RunStore.create(out, config=config, seeds=seeds)
    if progress is None:
        progress = notebook_progress()  # a progress bar in Jupyter; None elsewhere
    rec = Recorder(store, seeds, config=config, progress=progress)
    tasks: list[tuple[int | None, int, str | None]] = []
    if reference:
        tasks.append((None, seed, None))
    tasks += [(i, s, mode) for i, s in enumerate(seeds)]
    if progress is not None:
        progress("total", len(tasks))
    fk = dict(fuzzy_kw, granularity=granularity)
    caller_rng = ProcessState()  # every realization starts from it; put back at the end
    payload = {"fn": fn, "args": args, "fuzzy_kw": fk, "capture_layers": layers, "model": model,
               "rng_state": caller_rng}

    if executor == "dask":
        import cloudpickle

        blob = cloudpickle.dumps(payload)
        threads = thread_share(jobs) if scheduler is None else None
        with dask_client(scheduler, n_workers=jobs, threads_per_worker=1, processes=True) as client:
            from distributed import as_completed

            big = client.scatter(blob, broadcast=False) if len(blob) > 1_000_000 else blob
            futs = {client.submit(_dask_task, big, i, s, m, threads, pure=False,
                                  key=f"numvar-{tag_of(i)}-{os.getpid()}-{time.time_ns()}"): i
                    for i, s, m in tasks}
            for fut in as_completed(futs):
                rec.record(futs[fut], fut.result())
    elif jobs == 1:
        try:
            for i, s, m in tasks:
                rec.record(i, realize(fn, args, index=i, seed=s, mode=m, fuzzy_kw=fk,
                                      capture_layers=layers, model=model, rng_state=caller_rng))
        finally:
            caller_rng.restore()
    else:
        _run_pool(payload, tasks, jobs, start_method, rec)

    samples = rec.samples()
    if rec.reference_record is not None and rec.reference_record["status"] != "ok":
        rec.failed.insert(0, rec.reference_record)
    try:
        raise_if_failed(rec, n)
    except RunError as err:
        err.samples = samples  # type: ignore[attr-defined]
        raise
    return samples


def _run_pool(payload: dict[str, Any], tasks: list, jobs: int, start_method: str | None,
              rec: Recorder) -> None:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    global _PAYLOAD
    methods = mp.get_all_start_methods()
    method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
    if method not in methods:
        raise ConfigError(f"start_method {method!r} is not available here ({', '.join(methods)})")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["numvar.runner._preload"])
    blob = None
    if method != "fork":
        import cloudpickle

        blob = cloudpickle.dumps(payload)
    _PAYLOAD = payload  # inherited by forked workers
    try:
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)) or 1, mp_context=ctx,
                                   initializer=_init_worker,
                                   initargs=(thread_share(min(jobs, len(tasks))), blob))
        try:
            with _main_not_reimported(method != "fork"):  # workers start in submit()
                futs = {pool.submit(_pool_task, i, s, m): i for i, s, m in tasks}
            for fut in as_completed(futs):
                rec.record(futs[fut], fut.result())
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        _PAYLOAD = None


@contextlib.contextmanager
def _main_not_reimported(active: bool):
    """Stop multiprocessing from re-running ``__main__`` in spawned/forkserver workers.

    They don't need it (``fn`` travels with cloudpickle, by value for ``__main__``), and a
    script without an ``if __name__ == "__main__":`` guard would run again in every
    worker. Workers are started while the block runs (by ``submit``)."""
    import sys

    main = sys.modules.get("__main__")
    if not active or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _check_fuzzy(mode: str, granularity: str, fuzzy_kw: dict[str, Any]) -> None:
    """Validate the instrumentation options before any realization starts."""
    try:
        from ..instrument import FuzzyConfig
    except ImportError:  # instrumentation not available: realizations will say so
        return
    try:
        FuzzyConfig(mode=mode, granularity=granularity, **fuzzy_kw)
    except TypeError as exc:
        raise ConfigError(f"unknown instrumentation option: {exc}") from exc


__all__ = ["sample", "realize"]
