"""Compile numvar's heaviest numba kernels into the on-disk cache before the test workers
start (``tests/conftest.py`` runs this in the pytest-xdist controller).

Why: on a cold cache (a fresh clone, as in CI) the binary32 contraction alone takes
~2 CPU-minutes to compile (``kernels._contract_fast32`` and the vectorised loops it
calls, one copy per rounding mode; ~5 before :mod:`numvar._numba_compile` fixed numba's
IR copies), and every xdist worker that needs it before it is cached compiles it again:
measured on a fresh clone on 2 cores (before that fix), both workers compiled it (306 s
and 309 s), and the README's and formats.md's example tests took 350 s each, waiting on
it. Here each heavy kernel is compiled once, in parallel over the cores,
leaves first (each cached loop on its own core), then the entry points that call them
(which then load the leaves from the cache instead of compiling them again); the
workers find everything in the cache.

Leaves (and bilinear grid sampling, the next heaviest) are compiled from explicit
signatures (:data:`LEAVES`): the types their caller passes (an integer constant in the
caller is a literal type, e.g. ``t`` = 24 of ``_tile32``). A stale signature costs
time, not correctness; :func:`warm` reports a leaf compiled again by its caller so that
the table is kept in step with the kernels.

    python tests/_warmup.py        # what the controller runs, with its timings
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

#: (module, function, argument types) of the cached leaves, each compiled in its own task;
#: types as numba's signature strings spell them (``literal(24)``: the literal 24)
_ROW = ("float64[::1], uint64[::1], {0}[::1], float64[:, ::1], uint64, uint64, {1}, int64, "
        "int64")
#: the binary32 row loops (``_contract_fast32`` passes the column offset as the constant 0)
_ROW32 = _ROW.format("float32", "literal(0)")
_NARROW = ("float64[:, ::1], float64[:, ::1], float64[:, ::1], uint64[::1], uint64[::1], "
           "int64, int64, int64")
_SCAN = "{0}[:, ::1], {0}[:, ::1], uint64, int64, int64, boolean, boolean, boolean"
LEAVES: list[tuple[str, str, str]] = [
    ("numvar.instrument.kernels", "_tile32",
     "float32[::1], float32[::1], float32[:, ::1], uint64, uint64, int64, int64, int64, "
     "literal(24), boolean[::1]"),
    ("numvar.instrument.kernels", "_cleanfma32", _ROW32 + ", int64"),
    ("numvar.instrument.grid_kernels", "_grid_sample",
     "float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], int64, int64, "
     "boolean, uint64[::1], int64"),
    ("numvar.instrument.kernels", "_cleant32", _ROW32 + ", int64"),
    ("numvar.instrument.kernels", "_clean32", _ROW32),
    ("numvar.instrument.kernels", "_cleanx32", _ROW32),
    ("numvar.instrument.kernels", "_clean64", _ROW.format("float64", "int64")),
    ("numvar.instrument.kernels", "_narrow32", _NARROW),
    ("numvar.instrument.kernels", "_narrow64", _NARROW),
    ("numvar.rounding.kernels", "_wide_block",
     "int64, float64[::1], float64[::1], float64[::1], uint64, int64, int64"),
    # the binary64 row tile, which both binary64 entries call (side by side, each compiled
    # it: 27 s apiece)
    ("numvar.instrument.kernels", "_row64",
     "float64[::1], float64[::1], float64[:, ::1], uint64, uint64, int64, int64, boolean, "
     "int64"),
    # the scans' scalar kernel (directed modes, virtual precisions): 22-25 s cold on one
    # core, and the affine_grid tests and zoo.md's example compiled it side by side
    ("numvar.instrument.kernels", "_scan_kernel", _SCAN.format("float32")),
]
#: compiled beside the second phase's two tasks, where the shorter one (float64) leaves a
#: core idle for longer than this takes
LATE_LEAVES: list[tuple[str, str, str]] = [
    ("numvar.instrument.kernels", "_scan_kernel", _SCAN.format("float64")),
]
#: the elementwise tiles of numvar.instrument.pointwise that the recurrent steps, the
#: short paths, the normalisations and the FFTs all call (op, a, b, o, key, l0, mode),
#: compiled first so that no two tasks compile them side by side (measured: the
#: recurrent steps and the short paths each compiled _tile, _tile_lo, _slow and
#: _roundtile, 28 s each). ``_redo`` calls (and so compiles and caches) ``_tile``,
#: ``_tile_lo`` and ``_slow``: one task for the four, none of them compiled twice
_TILE = "int64, float32[::1], float32[::1], float32[::1], uint64, int64, int64"
SHARED: list[tuple[str, str, str]] = [
    ("numvar.instrument.pointwise", "_redo", _TILE + ", int64"),
    ("numvar.instrument.pointwise", "_roundtile",
     "float64[::1], float32[::1], uint64, int64, int64, int64"),
]
#: what the tasks after :data:`SHARED` must find in the cache
_SHARED_CHECKED = SHARED + [("numvar.instrument.pointwise", name, _TILE)
                            for name in ("_tile", "_tile_lo", "_slow")]


def _contract(dtype: str, t: int, mode: str = "sr", rows: int = 2, k: int = 3) -> None:
    import numpy as np

    from numvar.instrument import kernels as KN
    from numvar.rounding import kernels as K

    a = np.ones((1, rows, k), dtype)
    KN.contract(a, np.ones((1, k, 4), dtype), 1, K.mode_code(mode), t)


#: entry points with no cached leaf of their own (run beside the leaves, one after the
#: other in one task): the scalar contraction kernel (directed modes, virtual precision)
#: for binary32 and binary64, and the few-outputs kernel (2 × 4 outputs, K = FEW_K)
INDEPENDENT = [("float32", 24, "up"), ("float64", 53, "up"), ("float32", 24, "sr", 2, 128)]
#: entry points run once the leaves are cached, per dtype: the fast kernel and the
#: narrow-product kernel (32 rows, 4 columns)
ENTRIES = {"float32": [("float32", 24), ("float32", 24, "sr", 32)],
           "float64": [("float64", 53), ("float64", 53, "sr", 32)]}
#: the granularities of ``numvar run``'s own warm-up (numvar.runner.warmup) run here
RUNNER_GRANULARITIES = ("flop", "op")


def _rnn_steps() -> tuple[str, float]:
    """The recurrent layers' step kernels (``numvar.instrument.rnn_kernels``, ~18 s cold
    on one core), called once each on (B, H) = (2, 3) with the types the layers pass."""
    import numpy as np

    from numvar.instrument import rnn_kernels as RN

    t0 = time.perf_counter()
    B, H, n, mode = 2, 3, 6, 0
    f32 = lambda k: np.zeros(k, np.float32)  # noqa: E731
    f64 = lambda k: np.zeros(k, np.float64)  # noqa: E731
    keys = np.arange(1, 11, dtype=np.uint64)
    RN.bias_rows(f32(9), f32(18), keys[0], mode, f32(18))
    RN.gru_gates(f32(18), f32(18), keys, B, H, mode, f32(2 * n), f64(4 * n))
    RN.gru_new(f64(4 * n), f32(18), f32(18), keys, B, H, mode, f32(2 * n), f32(n), f32(n),
               f64(4 * n))
    RN.gru_hidden(f64(4 * n), f32(n), f32(18), keys, B, H, mode, f32(n), f32(n), f32(n),
                  f32(n))
    RN.lstm_gates(f32(24), f32(24), keys[0], B, H, mode, f32(24), f64(4 * n))
    RN.lstm_cell(f64(4 * n), f32(n), keys, B, H, mode, f32(24), f32(24), f32(n), f32(n),
                 f32(n), f64(4 * n))
    RN.lstm_hidden(f64(4 * n), f32(24), keys, B, H, mode, f32(n), f32(n))
    RN.rnn_pre(f32(n), f32(n), keys[0], mode, f32(n), f64(4 * n))
    return "rnn_kernels", time.perf_counter() - t0


def _short_paths() -> tuple[str, float]:
    """The compiled short paths of linear algebra, FFTs and complex arithmetic
    (``linalg_kernels.lu32``/``trsm32``/``solve32`` and their keys, ``fft_kernels.radix2_32``,
    ``pointwise.cmul32``/``polar32``, ``conv_kernels.bias_rows32``) and the pointwise tiles
    they share (~100 s cold on
    one core: each of the two test workers compiled them before either had cached them),
    called once each with the types their callers pass."""
    import numpy as np

    from numvar.instrument import conv_kernels as CK
    from numvar.instrument import fft_kernels as FK
    from numvar.instrument import linalg_kernels as LK
    from numvar.instrument import pointwise as PW

    t0 = time.perf_counter()
    f32 = np.ones(16, np.float32)
    keys = np.ones((3, 4), np.uint64)  # rows of linalg_kernels.keys' (calls, steps) array
    mode = 0
    PW.cmul32(f32, f32, np.uint64(1), np.uint64(2), mode)
    PW.polar32(f32, np.ones(16), np.ones(16), np.uint64(1), np.uint64(2), mode)
    LK._flagged_keys(np.uint64(1), np.uint64(0), *np.ones((3, 4), np.bool_))
    LK.lu32(f32.copy(), 1, 4, 4, np.zeros(4, np.int32), np.zeros(1, np.int32), *keys, mode)
    LK.trsm32(f32.copy(), f32.copy(), 1, 4, 4, False, False, *keys, mode)
    LK.solve32(f32.copy(), f32.copy(), 1, 4, 4, np.zeros(4, np.int32), np.zeros(1, np.int32),
               np.ones((3, 12), np.uint64), mode)
    twr, twi = FK.stage_twiddles32(f32[:8], f32[:8], 2, 8)
    FK.radix2_32(f32, f32, 2, 8, twr, twi, *keys[:, :3].copy(), mode, False, False,
                 np.float32(1.0), np.uint64(0))
    CK.bias_rows32(f32[:8], f32[:2], 2, 2, np.uint64(1), mode)
    return "short paths", time.perf_counter() - t0


def _linear_with_bias() -> None:
    """``dense_kernels.linear32`` (the narrow product kernel's tasks with a linear
    layer's bias; ~20 s cold on one core) with the types ``addmm32`` passes, once the
    narrow kernel's leaves are cached."""
    import numpy as np

    from numvar.instrument import dense_kernels as DK

    f32 = np.ones(12, np.float32)
    DK.linear32(f32[:6].reshape(1, 2, 3), f32.reshape(1, 3, 4), np.ones(12),
                np.ones(2, np.bool_), np.empty((1, 2, 4), np.float32), np.uint64(1), 1,
                f32[:4], np.uint64(2))


def _entries_and_runner_model(dtype: str) -> tuple[str, float]:
    """The :data:`ENTRIES` of ``dtype`` (and for float32 :func:`_linear_with_bias`), then
    ``numvar run``'s warm-up model in that dtype
    (:func:`numvar.runner.warmup.warm_kernels`, sr, at each of
    :data:`RUNNER_GRANULARITIES`): the dense, convolution, pointwise, normalisation and
    recurrent kernels that most tests reach. Why here: every ``numvar run`` of the
    documentation's examples ran that warm-up (137 s of compile at flop, one core, after
    this file's other tasks) until one had finished and recorded it, two or three of
    them side by side on a cold CI cache; and the two dtypes' models share few kernels,
    so they run in two processes side by side."""
    from numvar.runner import warmup as RW

    t0 = time.perf_counter()
    _timed_contract(*ENTRIES[dtype])
    if dtype == "float32":
        _linear_with_bias()
    t1 = time.perf_counter()
    for granularity in RUNNER_GRANULARITIES:
        RW.warm_kernels("sr", granularity, dtypes=(dtype,))
    t2 = time.perf_counter()
    return (f"{dtype} entries {t1 - t0:.1f} s, numvar run's warm-up model {t2 - t1:.1f} s",
            t2 - t0)


def _compile_leaf(module: str, name: str, sig: str) -> tuple[str, float]:
    import importlib

    from numba.core.sigutils import normalize_signature

    t0 = time.perf_counter()
    # the types as a tuple: the on-disk cache keys an overload on the signature as given,
    # and the caller's lookup gives a tuple (a signature string would be a key of its own,
    # which the caller never finds: measured, every leaf compiled twice)
    args, _ = normalize_signature(f"({sig})")
    getattr(importlib.import_module(module), name).compile(args)
    # a kernel warmed for two dtypes is logged with its first argument's
    label = name
    if sum(leaf[1] == name for leaf in LEAVES + LATE_LEAVES) > 1:
        label = f"{name} ({sig.split('[', 1)[0]})"
    return label, time.perf_counter() - t0


def _timed_contract(*calls) -> tuple[str, float]:
    """:func:`_contract` on each argument tuple of ``calls``, one after the other (the
    scalar kernels of :data:`INDEPENDENT` share the rounding core's compiled functions:
    the second finds them cached, where side by side both compiled them)."""
    t0 = time.perf_counter()
    for args in calls:
        _contract(*args)
    return "contract" + " ".join(map(repr, calls)), time.perf_counter() - t0


def _checked(task, table, *args) -> tuple[str, float, list[str]]:
    """``task(*args)``, and the leaves of ``table`` it compiled again (a signature in
    this file that no longer matches the caller's)."""
    import importlib

    leaves = {name: getattr(importlib.import_module(module), name)
              for module, name, _ in table}
    before = {name: sum(leaf.stats.cache_misses.values()) for name, leaf in leaves.items()}
    name, dt = task(*args)
    again = [name for name, leaf in leaves.items()
             if sum(leaf.stats.cache_misses.values()) > before[name]]
    return name, dt, again


def _report(future, log) -> bool:
    """Log a task's time (or its failure) and any leaf it compiled again; whether it
    finished."""
    try:
        name, dt, *again = future.result()
    except Exception as e:  # a stale table entry must not stop the tests
        log(f"  warning: a warm-up task failed ({type(e).__name__}: {e}); the tests "
            f"compile what it would have")
        return False
    log(f"  {name:<32} {dt:6.1f} s")
    for leaf in again[0] if again else ():
        log(f"  warning: {name} compiled {leaf} again: its signature in tests/_warmup.py "
            f"no longer matches its caller")
    return True


def warm(workers: int | None = None, log=print) -> float:
    """Compile :data:`SHARED` and :data:`LEAVES` and run :data:`INDEPENDENT`,
    :func:`_rnn_steps` and :func:`_short_paths`, then :data:`ENTRIES` and ``numvar run``'s
    warm-up model (:func:`_entries_and_runner_model`) with :data:`LATE_LEAVES` beside
    them, over ``workers`` processes, and record that warm-up as done (``numvar run``
    then skips it). Returns the wall time; logs one line per task and any leaf a task
    compiled again."""
    workers = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    import multiprocessing as mp

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        # the shared tiles (short), then longest first: three leaves, the independent
        # entries, the recurrent steps and the short paths, the other leaves
        first = [pool.submit(_compile_leaf, *leaf) for leaf in SHARED + LEAVES[:3]]
        first.append(pool.submit(_checked, _timed_contract, _SHARED_CHECKED, *INDEPENDENT))
        first.append(pool.submit(_checked, _rnn_steps, _SHARED_CHECKED))
        first.append(pool.submit(_checked, _short_paths, _SHARED_CHECKED))
        first += [pool.submit(_compile_leaf, *leaf) for leaf in LEAVES[3:]]
        for f in first:
            _report(f, log)
        # the leaves' callers, then numvar run's warm-up model, one process per dtype
        second = [pool.submit(_checked, _entries_and_runner_model, LEAVES, dtype)
                  for dtype in ENTRIES]
        late = [pool.submit(_compile_leaf, *leaf) for leaf in LATE_LEAVES]
        done = [_report(f, log) for f in second]
        for f in late:
            _report(f, log)
    if all(done):  # later `numvar run`s (the documentation's examples) skip their warm-up
        from numvar.runner import warmup as RW

        for granularity in RUNNER_GRANULARITIES:
            RW.remember(granularity)
    return time.perf_counter() - t0


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else None
    print(f"warm-up: {warm(n):.1f} s")
