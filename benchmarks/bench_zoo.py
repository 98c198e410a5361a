"""numvar over the model zoo: native, floor, contraction time, op SR, flop SR.

Every entry of :data:`numvar.workloads.zoo.ZOO` at its ``bench`` size, one forward
under ``no_grad`` (model in eval mode), at 1 thread and at all threads (torch's and
numba's thread counts set alike), in one run. Per model, five numbers:

- **native**: the plain forward, ms (what the user runs);
- **floor**: the forward under a do-nothing dispatch mode on numvar's code path
  (:func:`numvar.instrument.codepath.codepath` + :class:`~numvar.instrument.codepath.IdentityMode`:
  SDPA math backend, transformer fast path off): what any tool that sees every op pays;
- **contraction**: the model's rounded contraction terms (matmul and convolution terms
  the flop kernels compute, counted with :func:`numvar.workloads.zoo.count_contractions`
  in one flop SR forward) divided by the SR contraction kernel's rate measured in this
  run at the same thread count and in the same kernel dtype (``kernels.contract`` on
  256×256×256, binary32 and binary64; the better of a measurement before and one after
  the models, so that a load spike does not inflate it): the time the arithmetic alone
  needs at the kernel's speed;
- **op SR** and **flop SR**: the forward under ``numvar.fuzzy(mode="sr", granularity=...)``;
- **kernels**: the time the flop SR forward spends inside numvar's compiled kernels
  (every numba dispatcher of numvar's modules timed, as ``bench_threads.py`` does; the
  best of ``--repeats`` forwards), contraction kernels and all others (FFT stages, LU,
  normalisations, elementwise roundings).

Floor, contraction, op, flop and kernels are ratios to native. The goals of the speed
issue are checked per row at one thread: flop SR ≤ floor + contraction + 5 and op SR ≤
floor + 2 (in units of native). Where the flop goal is missed, the cell gives a lower
bound, ``floor − 1 + kernels``: the dispatch that every op pays under a dispatch mode
(the floor less the native forward) plus the compiled kernels, with no Python of
numvar's at all. A bound above the goal says that the goal is out of reach while the
kernels are as fast as they are (their own limits: docs/speed.md). The bound assumes
numvar dispatches every op the floor does, which holds except for recurrent layers run
as compiled steps (``lstm``, ``gru``), which meet their goal. Where the op goal is missed,
the cell gives the bound of ``bench_opcnn.py``: **f64 ref** (the floor's forward with
every op whose float64 result op SR rounds re-run on float64 copies of its operands and
cast back, timed in the same rounds as the variants: the float64 re-run the semantics
needs, :func:`float64_reference`) plus **op kernels** (the SR rounding kernel over the
elements op SR rounds from float64 and the SR elementwise kernels over its binary32
add/sub/mul/div, each above the plain cast or torch op it stands for, at their rate on
64 Ki elements: :func:`round_cost`, :func:`elementwise_cost`), with no numvar Python. A
bound above the measured ratio itself bounds nothing for that entry (its parts ran slower
than numvar's own path: the float64 re-runs take the floor's code path, where a bfloat16
ResNet's float64 convolutions ran without oneDNN): the cell says so
(:func:`bound_text`) rather than "out of reach". Two more tables check the other goals of
the issue:

- **formats**: a low-precision or float64 entry (``X_bf16``, ``X_fp16``, ``X_f64``) against
  its binary32 twin ``X``: its flop SR and op SR ratios divided by the twin's, goal ≤ 1.5
  for bf16/fp16 and ≤ 3 for float64 (not judged where the entry's native forward takes
  over its format's :data:`SLOW_NATIVE` times its twin's, 1.5 for bf16/fp16 and 4 for
  float64: the CPU has no native kernels for the
  format, and ratios to that slow native run say nothing; the cell then gives
  :func:`native_for_goal`, the least native time, as a multiple of the twin's, at which
  the goal would hold with numvar's times as measured; a missed goal shows, for each
  side that misses, the bound above ÷ the twin's ratio, :func:`format_bounds`, "out of
  reach" where it exceeds the goal);
- **threads**: flop SR time at 1 thread ÷ at the largest thread count measured (goal
  ≥ 1.7 on 2 cores for ``resnet_basic``, ResNet-18's layout, and ``bert``), and whether the
  flop SR outputs are bitwise identical across the thread counts. A missed goal shows
  ``bench_threads.py``'s bound: the time at 1 thread ÷ (the time outside the compiled
  kernels at n threads + the kernels' time at 1 thread ÷ n), the speed-up if every
  kernel scaled perfectly and the rest stayed as it is; below the goal, no kernel work
  alone reaches it. Times are the best of ``--repeats`` rounds after a warm-up round
(numba compilation, recorded decompositions); rounds interleave the variants so that a
load spike on a shared machine hits them alike. One-thread rows, and the kernel rate at
one thread, are timed by the calling thread's CPU time (:func:`clock_for`: every op runs
on that thread, and what a shared host's other jobs take from it does not count); the
thread table compares wall times of native and flop SR measured again, after the
per-thread blocks, in rounds that each time every thread count in turn
(:func:`thread_pairs`: both sides under the same load), and its bound takes the kernels
at one thread by CPU time (on that thread, their wall time less preemption). The
machine line says which ``OMP_WAIT_POLICY`` the run had (docs/speed.md, "Threads").

    python benchmarks/bench_zoo.py [--repeats 3] [--models resnet_basic bert ...]
                                   [--threads 1 all] [--no-write]

Writes its table to its own section of ``benchmarks/results.md`` (between the
``bench_zoo`` markers; the rest of the file is kept) and to ``docs/benchmarks-zoo.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
from collections import Counter
from pathlib import Path

import numba
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numvar._io import atomic_write_text
from numvar.instrument import _core as C
from numvar.instrument import depthwise as DW
from numvar.instrument import fuzzy
from numvar.instrument import kernels as KN
from numvar.instrument import mode as MD
from numvar.instrument import pointwise as PW
from numvar.instrument.codepath import IdentityMode, codepath, dynamo_running, guards_itself
from numvar.rounding import kernels as RK
from numvar.workloads import zoo

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- bench_zoo:begin -->", "<!-- bench_zoo:end -->"
VARIANTS = ("native", "floor", "op SR", "flop SR")


KERNEL_DTYPES = {"float32": 24, "float64": 53}  # kernel dtype -> significand bits


def clock_for(threads: int):
    """The clock of the rows measured at ``threads``: the calling thread's CPU time at one
    thread (every op, torch's and numba's, runs on it there; time a shared host's other
    jobs take from it does not count, as in ``bench_opcnn.py``), wall time above."""
    return time.thread_time if threads == 1 else time.perf_counter


def kernel_rate(repeats: int, dtype: str = "float32", n: int = 256,
                clock=time.perf_counter) -> float:
    """Terms per second of the SR contraction kernel on an n×n×n product in ``dtype``
    (the float32 kernel also serves bfloat16/float16 models)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, n, n)).astype(dtype)
    b = rng.standard_normal((1, n, n)).astype(dtype)
    code, t = RK.mode_code("sr"), KERNEL_DTYPES[dtype]
    KN.contract(a, b, 1, code, t)  # compile / warm
    best = min(_timed(lambda: KN.contract(a, b, 1, code, t), clock) for _ in range(repeats))
    return n ** 3 / best


def _timed(fn, clock=time.perf_counter) -> float:
    t = clock()
    fn()
    return clock() - t


def best_of(fns: dict, repeats: int, clock=time.perf_counter, setup=None) -> dict[str, float]:
    """Best time (s) of each of ``fns`` over ``repeats`` interleaved rounds after a warm-up
    round, under ``no_grad``; ``setup(name)``, if given, runs (untimed) before each call."""
    best = {k: float("inf") for k in fns}
    with torch.no_grad():
        for rnd in range(repeats + 1):
            for k, fn in fns.items():
                if setup is not None:
                    setup(k)
                dt_ = _timed(fn, clock)
                if rnd:
                    best[k] = min(best[k], dt_)
    return best


def _variants(built: zoo.Built) -> dict:
    model, x = built.model.eval(), built.inputs

    def native():
        model(*x)

    def floor():
        with codepath(), IdentityMode():
            model(*x)

    def op():
        with fuzzy(mode="sr", granularity="op", seed=0):
            model(*x)

    def flop():
        with fuzzy(mode="sr", granularity="flop", seed=0):
            model(*x)
    return dict(zip(VARIANTS, (native, floor, op, flop)))


def flop_output_digest(built: zoo.Built) -> str:
    """SHA-256 of the flop SR forward's output bits (seed 0): equal across thread counts."""
    import hashlib

    with torch.no_grad(), fuzzy(mode="sr", granularity="flop", seed=0):
        out = built.model.eval()(*built.inputs)
    h = hashlib.sha256()
    for t in _flat(out):
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes() if t.numel()
                 else b"")
    return h.hexdigest()


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return []


def measure(built: zoo.Built, repeats: int, clock=time.perf_counter) -> dict[str, float]:
    """Best time (s) of each variant over ``repeats`` interleaved rounds, after a warm-up,
    by ``clock``. With the thread's CPU time (the one-thread rows), also the wall time of
    native and flop SR (``wall native``, ``wall flop SR``: the thread table's one-thread
    side) and the parts of the op goal's bound (:func:`op_bound`): ``f64 ref``
    (:func:`float64_reference`) timed in the same rounds as the variants, and ``op
    kernels`` (:func:`round_cost` + :func:`elementwise_cost`)."""
    v = _variants(built)
    if clock is not time.thread_time:
        return best_of(v, repeats, clock)
    f64ref, elems, pointwise = float64_reference(built)
    best = best_of({**v, "f64 ref": f64ref}, repeats, clock)
    wall = best_of({k: v[k] for k in ("native", "flop SR")}, repeats)
    best.update({f"wall {k}": t for k, t in wall.items()})
    best["op kernels"] = round_cost(elems, repeats, clock) + elementwise_cost(
        pointwise, repeats, clock)
    return best


def kernel_time(built: zoo.Built, repeats: int, clock=time.perf_counter) -> float:
    """Seconds the best of ``repeats`` flop SR forwards spends inside numvar's compiled
    kernels, by ``clock``, with every numba dispatcher of numvar's modules timed
    (``bench_threads.timed_dispatchers``: numba-to-numba calls are part of their
    caller); the dispatchers are plain again after it. Run a forward first: it loads
    the modules and compiles."""
    from bench_threads import _Clock, timed_dispatchers

    flop = _variants(built)["flop SR"]
    spent = _Clock(clock)
    best = float("inf")
    with timed_dispatchers(spent):
        for _ in range(max(1, repeats)):
            spent.reset()
            flop()
            best = min(best, spent.par + spent.ser)
    return best


def flop_bound(floor: float, kernels: float) -> float:
    """Least flop SR (× native) with these kernels and no numvar Python: the floor's
    dispatch (floor − 1) plus the kernels' time."""
    return floor - 1 + kernels


def thread_bound(one: dict, many: dict, n: int) -> float:
    """Speed-up from 1 to ``n`` threads if every compiled kernel scaled perfectly and the
    rest of the flop forward stayed as measured at ``n`` threads (rows of one model, times
    in seconds: ``flop SR`` and ``kernels``)."""
    rest = _wall(many, "flop SR") - many["kernels"]
    return _wall(one, "flop SR") / (rest + one["kernels"] / n)


def _wall(row: dict, key: str) -> float:
    """A row's wall time of ``key`` (``native`` or ``flop SR``) for the thread table: the
    paired measurement (:func:`thread_pairs`) where the run made one, else the one-thread
    row's wall-clock timing (its ``key`` is CPU time: :func:`clock_for`), else ``key``."""
    return row.get(f"paired {key}", row.get(f"wall {key}", row[key]))


def thread_pairs(built: zoo.Built, threads: list[int], repeats: int) -> dict:
    """Wall time (s) of native and flop SR at each of ``threads``: ``{n: {"native": s,
    "flop SR": s}}``, the best of ``repeats`` rounds after a warm-up round, every round
    timing each thread count in turn (torch's and numba's counts set, one untimed native
    forward, then native and flop SR timed). The two sides of a speed-up are so measured
    under the same load: the run's blocks per thread count lie a minute or more apart,
    and a shared host's speed moves by 10–20 % over such spans (bert's native forward at
    2.16 and 2.59 ms in two runs minutes apart)."""
    v = _variants(built)
    best = {n: {"native": float("inf"), "flop SR": float("inf")} for n in threads}
    with torch.no_grad():
        for rnd in range(repeats + 1):
            for n in threads:
                torch.set_num_threads(n)
                numba.set_num_threads(n)
                v["native"]()
                for k in ("native", "flop SR"):
                    t = _timed(v[k])
                    if rnd:
                        best[n][k] = min(best[n][k], t)
    return best


# ------------------------------------------------------------ the op goal's bound
def recorded_once(model, x) -> tuple[set, int, Counter]:
    """The ops whose float64 result op SR rounds in one forward (every top-level op during
    whose dispatch ``Ctx.round`` receives a float64 tensor: ``op_once`` wherever a
    handler calls it, ``oplevel``'s scaled contractions, ``_safe_softmax``'s float64
    softmax), the elements those roundings produce, and the elements of the binary32
    elementwise roundings (per operation code: ``pointwise.binary32_tensors`` where it
    computes, ``scalar32_tensor``). Recurrent layers run as compiled steps are not seen
    (their roundings happen outside a dispatch): the bound then leaves them out."""
    funcs, elems, pointwise = set(), [0], Counter()
    current: list = []
    real_dispatch, real_round = MD.FuzzyMode._dispatch, C.Ctx.round
    real_tensors, real_scalar = PW.binary32_tensors, PW.scalar32_tensor

    def tensors(op, a, b, out, key, mode):
        done = real_tensors(op, a, b, out, key, mode)
        if done:
            pointwise[op] += out.numel()
        return done

    def scalar(op, t, x, left, out, key, mode):
        pointwise[op] += out.numel()
        return real_scalar(op, t, x, left, out, key, mode)

    def dispatch(self, func, args, kwargs):
        current.append(func)
        try:
            return real_dispatch(self, func, args, kwargs)
        finally:
            current.pop()

    def round_(self, hi, dtype, lo=None):
        if current and hi.dtype is torch.float64 and dtype is not torch.float64:
            funcs.add(current[0])
            elems[0] += hi.numel()
        return real_round(self, hi, dtype, lo)

    MD.FuzzyMode._dispatch, C.Ctx.round = dispatch, round_
    PW.binary32_tensors, PW.scalar32_tensor = tensors, scalar
    try:
        with fuzzy(mode="sr", granularity="op", seed=0):
            model(*x)
    finally:
        MD.FuzzyMode._dispatch, C.Ctx.round = real_dispatch, real_round
        PW.binary32_tensors, PW.scalar32_tensor = real_tensors, real_scalar
    return funcs, elems[0], pointwise


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    return x


def _up(t):
    return t.to(torch.float64) if t.dtype is torch.float32 else t


def _down(t):
    return t.to(torch.float32) if t.dtype is torch.float64 else t


_CONVOLUTION = torch.ops.aten.convolution.default


@guards_itself
class Float64Rerun(TorchDispatchMode):
    """Runs the ops in ``funcs`` on float64 copies of their float32 arguments and casts
    the results back to float32; every other op as it is. A depthwise convolution's
    float64 result comes from ``depthwise.value64``, as op SR computes it (the same
    value as PyTorch's float64 convolution, 4–10× sooner). It meets dynamo as numvar's
    modes and the floor do (``codepath.guards_itself``), so that it pays what they pay
    per op."""

    def __init__(self, funcs) -> None:
        super().__init__()
        self.funcs = funcs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if dynamo_running():
            return self._guarded(func, types, args, kwargs)
        kwargs = kwargs or {}
        if func not in self.funcs:
            return func(*args, **kwargs)
        if func is _CONVOLUTION and not kwargs and args[0].dtype is torch.float32:
            out = DW.value64(*args)
            if out is not None:
                return _down(out)
        out = func(*_map(args, _up), **{k: _map(v, _up) for k, v in kwargs.items()})
        return _map(out, _down)


def float64_reference(built: zoo.Built):
    """``(f64 ref, elements, elementwise)``: a forward on the floor's code path with every
    op whose float64 result op SR rounds (:func:`recorded_once`) re-run on float64
    copies and cast back (no rounding, no numvar Python: what the float64 re-run alone
    costs), the elements op SR rounds from float64, and its binary32 elementwise
    roundings' elements per operation."""
    model, x = built.model.eval(), built.inputs
    with torch.no_grad():
        funcs, elems, pointwise = recorded_once(model, x)

    def f64ref():
        with codepath(), Float64Rerun(funcs):
            model(*x)
    return f64ref, elems, pointwise


def _best(fn, repeats: int, clock=time.thread_time) -> float:
    b = float("inf")
    for _ in range(max(repeats, 20)):
        b = min(b, _timed(fn, clock))
    return b


def round_cost(elems: int, repeats: int, clock=time.thread_time) -> float:
    """Seconds the SR rounding kernel takes over ``elems`` elements above a plain cast
    (in 64 Ki-element tensors, the size of a typical CNN activation here)."""
    n = 1 << 16
    h = torch.randn(n, dtype=torch.float64)
    out = torch.empty(n, dtype=torch.float32)
    PW.round32(h.numpy(), out.numpy(), 1, 1)
    rnd = _best(lambda: PW.round32(h.numpy(), out.numpy(), 1, 1), repeats, clock)
    cast = _best(lambda: h.to(torch.float32), repeats, clock)
    return max(0.0, rnd - cast) * elems / n


def elementwise_cost(pointwise: Counter, repeats: int, clock=time.thread_time) -> float:
    """Seconds numvar's SR elementwise kernels (``pointwise.binary32_tensors``) take over
    the elements of ``pointwise`` (per operation code) above torch's own op on them, per
    element as measured on two 64 Ki-element binary32 tensors (ten calls per sample)."""
    n = 1 << 16
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=g)
    b = torch.randn(n, generator=g).abs() + 0.5
    out = torch.empty(n)
    native = {PW.OP_ADD: torch.add, PW.OP_SUB: torch.sub, PW.OP_MUL: torch.mul,
              PW.OP_DIV: torch.div}
    total = 0.0
    for op, elems in pointwise.items():
        def sr(op=op):
            for _ in range(10):
                PW.binary32_tensors(op, a, b, out, 1, RK.MODE_SR)

        def torch_op(op=op):
            for _ in range(10):
                native[op](a, b, out=out)
        sr()
        per = max(0.0, _best(sr, repeats, clock) - _best(torch_op, repeats, clock)) / (10 * n)
        total += per * elems
    return total


def op_bound(row: dict) -> float | None:
    """Least op SR (× native) with these kernels and no numvar Python, for a one-thread
    row measured with the bound's parts: the float64 re-runs on the floor's code path
    (``f64 ref``) plus the rounding and elementwise kernels above the casts and torch ops
    they stand for (``op kernels``). None for rows measured without them."""
    if "f64 ref" not in row or "op kernels" not in row:
        return None
    return (row["f64 ref"] + row["op kernels"]) / row["native"]


def contraction_terms(built: zoo.Built) -> dict[str, int]:
    """The contraction terms of one flop SR forward, per kernel dtype."""
    with torch.no_grad(), zoo.count_contractions() as cc:
        with fuzzy(mode="sr", granularity="flop", seed=0):
            built.model.eval()(*built.inputs)
    return dict(cc.terms_by_dtype)


def contraction_time(terms: dict[str, int], rates: dict[str, float]) -> float:
    return sum(n / rates[d] for d, n in terms.items())


def _machine(threads) -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       platform.processor())
    except OSError:
        cpu = platform.processor()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return [f"cpu: {cpu}, {os.cpu_count()} cores; threads measured: {', '.join(map(str, threads))}",
            f"torch {torch.__version__}, numba {numba.__version__}, "
            f"python {platform.python_version()}, OMP_WAIT_POLICY="
            f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}",
            f"load average at start: {', '.join(f'{v:.1f}' for v in load)}" if load else "",
            f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"]


def render(rows, rates, args, machine) -> str:
    lines = ["## Model zoo: native, floor, contraction time, op SR, flop SR", "",
             "Generated by `python benchmarks/bench_zoo.py"
             + (f" --repeats {args.repeats}" if args.repeats != 3 else "") + "`: every entry of "
             "`numvar.workloads.zoo` at its bench size, one forward under `no_grad`; best of "
             f"{args.repeats} interleaved rounds after a warm-up, ratios to native in the same "
             "run (one thread: the thread's CPU time; more: wall time). floor: a do-nothing "
             "dispatch mode on numvar's code path; contraction: the "
             "model's rounded contraction terms ÷ the SR contraction kernel's rate measured in "
             "this run, the better of before and after the models (G terms/s, " + "; ".join(
                 f"{t} thread{'s' if t > 1 else ''}: " + ", ".join(
                     f"{d} {r / 1e9:.2f}" for d, r in rs.items()) for t, rs in rates.items())
             + "); kernels: the flop SR forward's time inside numvar's compiled kernels. "
             "Goals (1 thread): flop SR ≤ floor + contraction + 5, op SR ≤ "
             "floor + 2; a missed flop goal shows the bound floor − 1 + kernels (the "
             "dispatch every op pays plus the kernels, no numvar Python), a missed op goal "
             "the bound f64 ref + rounding and elementwise kernels (the floor with the ops "
             "op SR rounds from float64 re-run in float64, plus the SR kernels above the "
             "casts and torch ops they replace, no numvar Python); out of reach where a "
             "bound exceeds its goal, and no bound where it exceeds the measured ratio "
             "itself (its parts ran slower than numvar's path).", ""]
    lines += [f"- {m}" for m in machine if m] + [""]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1) and any(t > 1 for t in rates):
        lines += [f"The load average ({load:.1f}) exceeded the core count during this run: "
                  "the multi-thread rows are not meaningful (OpenMP and numba workers wait "
                  "for descheduled siblings; native times grow 10-100×). Rerun them on an "
                  "otherwise idle machine.", ""]
    lines += ["| model | threads | native ms | floor | contraction | op SR | flop SR | "
              "kernels | flop goal | op goal |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    slow = _slow_natives(rows)
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['threads']} | error: {r['error']} |||||||| ")
            continue
        nat = r["native"]
        fl, ct = r["floor"] / nat, r["contraction"] / nat
        op, fp = r["op SR"] / nat, r["flop SR"] / nat
        fg = "✓" if fp <= fl + ct + 5 else f"✗ (> {fl + ct + 5:.1f})"
        kern = r.get("kernels")
        kc = "—" if kern is None else f"{kern / nat:.1f}×"
        if kern is not None and fg != "✓":
            fg = fg[:-1] + bound_text(flop_bound(fl, kern / nat), fp, fl + ct + 5, 1) + ")"
        og = "✓" if op <= fl + 2 else f"✗ (> {fl + 2:.1f})"
        obound = op_bound(r)
        if obound is not None and og != "✓":
            og = og[:-1] + bound_text(obound, op, fl + 2, 1) + ")"
        if r["threads"] != 1:
            fg = og = "—"
        elif r["model"] in slow:
            fg = og = "n/a (slow native, see formats)"
        lines.append(f"| {r['model']} | {r['threads']} | {nat * 1e3:.2f} | {fl:.1f}× | "
                     f"{ct:.1f}× | {op:.1f}× | {fp:.1f}× | {kc} | {fg} | {og} |")
    lines += _format_rows(rows) + _thread_rows(rows)
    return "\n".join(lines) + "\n"


#: suffix of a zoo entry -> (what it is, goal on its ratios ÷ its binary32 twin's)
TWIN_GOALS = {"_bf16": ("bfloat16", 1.5), "_fp16": ("float16", 1.5), "_f64": ("float64", 3.0)}
#: models whose flop SR must speed up ≥ THREAD_GOAL from 1 to 2 threads
THREAD_MODELS, THREAD_GOAL = ("resnet_basic", "bert"), 1.7


def _ratios(r) -> tuple[float, float]:
    return r["flop SR"] / r["native"], r["op SR"] / r["native"]


#: per format, an entry whose native forward takes more than this many times its binary32
#: twin's has no native kernels for its format on this CPU: its ratios, taken against that
#: slow native run, are small for that reason alone, so its goal is not judged. Native
#: 16-bit kernels (AVX-512 BF16/FP16, AMX, GPUs) run a forward in at most about binary32's
#: time (half the bytes); here float16 convolutions ran 15× slower than binary32 on a core
#: without AVX-512 FP16 (AMD Zen 4), and BERT tiny in bfloat16 3.3–5× (Zen 3, its matmuls
#: without native bfloat16 kernels: at 3.3× a limit of 4 judged it, and its ratio ÷ the
#: twin's, 0.25, passed for that reason alone). float64's native time is about twice
#: binary32's where both have native kernels.
SLOW_NATIVE = {"bfloat16": 1.5, "float16": 1.5, "float64": 4.0}


def _twins(rows):
    """(entry, its binary32 twin, format name, goal, entry's native time ÷ the twin's)
    for the one-thread rows."""
    one = {r["model"]: r for r in rows if r["threads"] == 1 and "error" not in r}
    for name, r in one.items():
        for suffix, (what, goal) in TWIN_GOALS.items():
            twin = one.get(name[: -len(suffix)]) if name.endswith(suffix) else None
            if twin is not None:
                yield r, twin, what, goal, r["native"] / twin["native"]


def _slow_natives(rows) -> set[str]:
    """Entries whose native forward takes over their format's SLOW_NATIVE times their
    twin's."""
    return {r["model"] for r, _, what, _, slow in _twins(rows) if slow > SLOW_NATIVE[what]}


def native_for_goal(r: dict, twin: dict, goal: float) -> float:
    """The least native time of entry ``r``, as a multiple of its binary32 twin's, at which
    its goal holds with numvar's times as measured: the ratio goal ``t / n ≤ goal · T / N``
    (numvar's time t over native n, the twin's T over N) is ``n / N ≥ (t / T) / goal``,
    the larger over flop SR and op SR. Where this CPU has no native kernels for the
    format, numvar's own times still compare: this says how fast a native run may be
    (1: as fast as binary32's) for the goal to hold."""
    return max(r["flop SR"] / twin["flop SR"], r["op SR"] / twin["op SR"]) / goal


def format_bounds(r: dict, twin: dict, goal: float) -> str:
    """For an entry that misses its format goal: each missing side's bound ÷ the twin's
    measured ratio (flop: :func:`flop_bound` of the entry's floor and kernels; op:
    :func:`op_bound`, the float64 re-runs and the rounding kernels), and "out of reach"
    where one exceeds ``goal``. The twin's ratio is taken as measured (speeding the twin
    up only lowers it), so a bound above the goal means no change to the entry's numvar
    Python can meet it. Empty where the rows lack the bound's parts."""
    (f, o), (tf, to) = _ratios(r), _ratios(twin)
    nat, parts = r["native"], []
    if f / tf > goal and r.get("kernels") is not None:
        parts.append(("flop", flop_bound(r["floor"] / nat, r["kernels"] / nat) / tf, f / tf))
    if o / to > goal and (ob := op_bound(r)) is not None:
        parts.append(("op", ob / to, o / to))
    return "".join(bound_text(b, m, goal, 2, side) for side, b, m in parts)


def bound_text(bound: float, measured: float, goal: float, digits: int,
               side: str = "") -> str:
    """A missed goal's bound as its cell shows it: ``; bound B``, with ``: out of reach``
    where B exceeds the goal. A bound above the measured ratio itself is no lower bound
    for this entry (its parts ran slower than numvar's own path: the float64 re-runs of
    ``f64 ref`` take the floor's code path, where a bfloat16 ResNet's float64
    convolutions ran without oneDNN at 24× native while numvar's op SR took 6×), so it
    neither proves nor disproves the goal: the cell says so instead of "out of reach"."""
    name = f"{side} bound" if side else "bound"
    text = f"; {name} {bound:.{digits}f}"
    if bound > measured:
        return text + " above the measure: no bound here"
    return text + (": out of reach" if bound > goal else "")


def _format_rows(rows) -> list[str]:
    out = []
    for r, twin, what, goal, slow in _twins(rows):
        name = r["model"]
        (f, o), (tf, to) = _ratios(r), _ratios(twin)
        if slow > SLOW_NATIVE[what]:
            ok = (f"n/a (native {slow:.0f}× the twin's: no native {what} kernels here); "
                  f"holds where native {what} takes ≥ {native_for_goal(r, twin, goal):.2f}× "
                  f"the twin's native time")
        else:
            ok = ("✓" if max(f / tf, o / to) <= goal
                  else f"✗ (> {goal}{format_bounds(r, twin, goal)})")
        out.append(f"| {name} | {what} | {slow:.2f} | {f:.1f}× | {tf:.1f}× | {f / tf:.2f} | "
                   f"{o:.1f}× | {to:.1f}× | {o / to:.2f} | {ok} |")
    if not out:
        return []
    return ["", "**Formats** (one thread): each entry's ratios ÷ its binary32 twin's; goal ≤ 1.5 "
            "for bfloat16/float16, ≤ 3 for float64; native ÷: the entry's native time ÷ "
            "the twin's (above " + ", ".join(f"{v:g} for {k}" for k, v in SLOW_NATIVE.items())
            + " the CPU lacks native kernels for the format "
            "and the goal is not judged: the cell says instead how fast a native run of the "
            "entry, as a multiple of the twin's native time, may be for the goal to hold "
            "with numvar's times as measured here); a missed goal shows each missing "
            "side's bound (as in the table above) ÷ the twin's ratio.", "",
            "| model | format | native ÷ | flop SR | twin flop SR | ÷ | op SR | twin op SR | ÷ "
            "| goal |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|", *out]


def _thread_rows(rows) -> list[str]:
    by = {}
    for r in rows:
        if "error" not in r:
            by.setdefault(r["model"], {})[r["threads"]] = r
    out = []
    for name, rs in by.items():
        if 1 not in rs or len(rs) < 2:
            continue
        top = max(rs)
        speed = _wall(rs[1], "flop SR") / _wall(rs[top], "flop SR")
        same = "yes" if len({x.get("digest") for x in rs.values()}) == 1 else "**no**"
        goal = ("✓" if speed >= THREAD_GOAL else f"✗ (< {THREAD_GOAL})") \
            if name in THREAD_MODELS and top == 2 else "—"
        if goal.startswith("✗") and "kernels" in rs[1] and "kernels" in rs[top]:
            bound = thread_bound(rs[1], rs[top], top)
            goal = goal[:-1] + f"; bound {bound:.2f}" + (
                ": out of reach)" if bound < THREAD_GOAL else ")")
        native = _wall(rs[1], "native") / _wall(rs[top], "native")
        out.append(f"| {name} | {top} | {native:.2f} | {speed:.2f} | {same} | {goal} |")
    if not out:
        return []
    return ["", "**Threads**: speed-up from 1 thread to the most measured (time at 1 ÷ time "
            "at n, wall time, every round timing each thread count in turn), native and flop "
            "SR; flop SR outputs bitwise identical across thread counts; "
            f"goal ≥ {THREAD_GOAL} on 2 threads for {' and '.join(THREAD_MODELS)}; a missed "
            "goal shows the bound time at 1 ÷ (time outside the compiled kernels at n + "
            "kernels at 1 ÷ n): every kernel scaling perfectly, the rest as measured.", "",
            "| model | n threads | native speed-up | flop SR speed-up | same bits | goal |",
            "|---|---:|---:|---:|---|---|", *out]


def write_results(section: str, path: Path) -> None:
    """Put ``section`` between the bench_zoo markers of ``path`` (appended if absent)."""
    text = path.read_text() if path.exists() else "# numvar benchmarks\n"
    block = f"{BEGIN}\n{section}{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    atomic_write_text(path, text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--threads", nargs="*", default=["1", "all"])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results.md"))
    ap.add_argument("--docs", default=str(HERE.parent / "docs" / "benchmarks-zoo.md"))
    args = ap.parse_args(argv)
    import logging

    logging.getLogger("numvar").setLevel(logging.ERROR)
    threads = [numba.config.NUMBA_NUM_THREADS if t == "all" else int(t) for t in args.threads]
    threads = list(dict.fromkeys(threads))
    machine = _machine(threads)
    names = args.models or list(zoo.ZOO)
    built = {n: zoo.build(n, "bench") for n in names}
    terms = {}
    for n in names:
        try:
            terms[n] = contraction_terms(built[n])
        except Exception as e:  # noqa: BLE001 - reported in the table
            terms[n] = e
    rows, rates = [], {}
    for t in threads:
        torch.set_num_threads(t)
        numba.set_num_threads(t)
        clock = clock_for(t)
        first = {d: kernel_rate(args.repeats, d, clock=clock) for d in KERNEL_DTYPES}
        block = []
        for n in names:
            if isinstance(terms[n], Exception):
                block.append({"model": n, "threads": t, "error": type(terms[n]).__name__})
                continue
            try:
                best = measure(built[n], args.repeats, clock)
            except Exception as e:  # noqa: BLE001
                block.append({"model": n, "threads": t, "error": f"{type(e).__name__}: {e}"[:60]})
                continue
            best["kernels"] = kernel_time(built[n], args.repeats, clock)
            block.append({"model": n, "threads": t, **best,
                          "digest": flop_output_digest(built[n])})
        # the kernel's rate before and after the models, the better of the two: a load
        # spike during one measurement would otherwise inflate every contraction time
        rates[t] = {d: max(r, kernel_rate(args.repeats, d, clock=clock))
                    for d, r in first.items()}
        print(f"threads {t}: SR contraction kernel " + ", ".join(
            f"{d} {r / 1e9:.2f}" for d, r in rates[t].items()) + " G terms/s", flush=True)
        for row in block:
            if "error" not in row:
                row["contraction"] = ctime = contraction_time(terms[row["model"]], rates[t])
                nat = row["native"]
                print(f"  {row['model']:22s} native {nat * 1e3:8.2f} ms  floor "
                      f"{row['floor'] / nat:5.1f}x  contraction {ctime / nat:5.1f}x  op "
                      f"{row['op SR'] / nat:5.1f}x  flop {row['flop SR'] / nat:5.1f}x"
                      + (f"  kernels {row['kernels'] / nat:5.1f}x" if "kernels" in row else ""),
                      flush=True)
        rows += block
    if len(threads) > 1:  # the thread table's times, every thread count in each round
        for n in names:
            if isinstance(terms[n], Exception):
                continue
            try:
                pairs = thread_pairs(built[n], threads, args.repeats)
            except Exception:  # noqa: BLE001 - its rows fall back to the per-thread times
                continue
            for row in rows:
                if row["model"] == n and "error" not in row:
                    row.update({f"paired {k}": t for k, t in pairs[row["threads"]].items()})
    rows.sort(key=lambda r: (names.index(r["model"]), r["threads"]))
    section = render(rows, rates, args, machine)
    print(section)
    if not args.no_write:
        write_results(section, Path(args.out))
        doc = ("# Benchmarks: the model zoo\n\n"
               "What numvar costs on every model of [the zoo](zoo.md), measured by "
               "`benchmarks/bench_zoo.py`. Ratios are to native PyTorch in the same run; "
               "on a shared machine they move with load (up to 2×), so compare rows of one "
               "run, not runs.\n" + section.split("\n", 1)[1])
        atomic_write_text(Path(args.docs), doc)


if __name__ == "__main__":
    main()
