"""Best time per forward of zoo entries at flop SR and native, for A/B runs between trees.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 PYTHONPATH=TREE/src \
        python benchmarks/bench_forward.py fft_filter linear_solve norms [--repeats 30]

For each named entry of :data:`numvar.workloads.zoo.ZOO` (bench size, one forward under
``no_grad``): three warm-up forwards under ``fuzzy(mode="sr", granularity="flop",
seed=0)``, then the best of ``--repeats`` consecutive forwards, then the best of as many
native forwards, in one process. Prints ``name flop_ms native_ms ratio``. Unlike
``bench_zoo.py`` (interleaved rounds, every variant, ratios judged against goals) it
measures only the flop path back to back: what a kernel change moves, run once per tree
in alternating processes, is read off the flop column (the native column shows how
quiet the machine was).

A change behind a boolean module flag (a short path and the general path it stands for,
e.g. ``numvar.instrument.flop.LEAN_BMM``) is measured in one process instead:

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_forward.py \
        --flag numvar.instrument.flop.LEAN_BMM multihead_attention vit [--repeats 25]

interleaves flop SR forwards with the flag off and on, and native ones, timed by the
thread's CPU time (every op runs on it at one thread; a shared host's other jobs do not
count), best of ``--repeats`` each after warm-ups, and checks that both give the same
bits. Prints ``name off_ms on_ms native_ms saved`` (saved: (off − on) ÷ native) and
``same bits`` or ``BITS DIFFER``; the flag is restored after each entry. ``--flag`` given
several times toggles those flags together (a change that spans several paths).

``--lbfgs`` times one ``torch.optim.LBFGS`` step (four iterations: forwards, backwards
and the optimizer's own arithmetic) on each entry's loss, flop SR and native interleaved,
e.g. the float64 sine-wave predictor against its binary32 twin:

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_forward.py --lbfgs \
        sine_mlp_f64 sine_mlp --repeats 10

``--train`` times a training step instead of a forward (the model in training mode:
forward, the entry's loss, backward; no optimizer, so each step does the same work; with
``--flag``, the loss and the gradients are compared), e.g. batch norm's training
kernels on the CNNs:

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_forward.py --train \
        --flag numvar.instrument.norm_kernels.BATCH_NORM_TRAIN \
        --flag numvar.instrument.norm_kernels.BATCH_NORM_BACKWARD mobilenet_se resnet_basic

``--float64`` runs each entry with its parameters and floating-point inputs cast to float64
(a float64 twin of a binary32 model, beside the zoo's own ``*_f64`` entries), e.g. the
binary64 paths on the normalisation layers:

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_forward.py --float64 \
        --flag numvar.rounding.kernels.DIV64_FAST --flag numvar.rounding.kernels.SQRT64_FAST \
        --flag numvar.instrument.kernels.SCAN64_FAST --flag numvar.instrument.flop.ROW_SUMS64 \
        --flag numvar.instrument._core.BINARY64_IN_PLACE norms
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import time

import torch

from numvar.instrument import fuzzy
from numvar.workloads import zoo


def lbfgs_steps(name: str, repeats: int) -> tuple[float, float]:
    """(best flop SR seconds, best native seconds) of one ``torch.optim.LBFGS`` step of zoo
    entry ``name`` on its own loss (four iterations whatever the loss does, history 5:
    forwards, backwards and the optimizer's float arithmetic, its dot products included),
    by the thread's CPU time,
    interleaved, each after a warm-up step; the parameters move on from step to step."""
    built = zoo.build(name, "bench")
    model, x = built.model, built.inputs
    # (tolerances below any value: every step runs its four iterations, the same work)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5,
                            tolerance_grad=-1.0, tolerance_change=-1.0)

    def closure():
        opt.zero_grad()
        loss = built.loss(model(*x))
        loss.backward()
        return loss

    def step(flop: bool) -> float:
        t = time.thread_time()
        if flop:
            with fuzzy(mode="sr", granularity="flop", seed=0):
                opt.step(closure)
        else:
            opt.step(closure)
        return time.thread_time() - t

    best = {True: float("inf"), False: float("inf")}
    for flop in (True, False):
        step(flop)
    for _ in range(repeats):
        for flop in (True, False):
            best[flop] = min(best[flop], step(flop))
    return best[True], best[False]


def _built(name: str, float64: bool, train: bool = False):
    """(the work, under no_grad or not) of zoo entry ``name`` at bench size: a callable
    running one forward of the model in eval mode and returning its output, or with
    ``train`` one training step (the model in training mode: forward, the entry's loss,
    backward; the gradients set to None first, no optimizer, so every step does the same
    work) returning the loss and the gradients. ``float64``: its floating-point
    parameters, buffers and inputs cast to float64."""
    built = zoo.build(name, "bench")
    model, x = built.model.train(train), built.inputs
    if float64:
        model = model.double()
        x = tuple(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                  for t in x)
    if not train:
        return (lambda: model(*x)), torch.no_grad

    def step():
        model.zero_grad(set_to_none=True)
        loss = built.loss(model(*x))
        loss.backward()
        return [loss] + [p.grad for p in model.parameters() if p.grad is not None]
    return step, contextlib.nullcontext


def best_forward(name: str, repeats: int, float64: bool = False,
                 train: bool = False) -> tuple[float, float]:
    """(best flop SR seconds, best native seconds) per forward (or training step) of zoo
    entry ``name``."""
    work, grad_mode = _built(name, float64, train)

    def flop() -> float:
        with fuzzy(mode="sr", granularity="flop", seed=0):
            t = time.perf_counter()
            work()
            return time.perf_counter() - t

    def native() -> float:
        t = time.perf_counter()
        work()
        return time.perf_counter() - t

    with grad_mode():
        for _ in range(3):
            flop()
        tf = min(flop() for _ in range(repeats))
        tn = min(native() for _ in range(repeats))
    return tf, tn


def _flag(path: str):
    """(module, attribute) of a boolean module flag ``package.module.NAME``."""
    mod_name, _, attr = path.rpartition(".")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise SystemExit(f"--flag {path}: cannot import {mod_name!r} ({e})") from None
    if not isinstance(getattr(mod, attr, None), bool):
        raise SystemExit(f"--flag {path}: {mod_name} has no boolean {attr!r}")
    return mod, attr


def toggled_forwards(name: str, flags, repeats: int, float64: bool = False,
                     train: bool = False) -> tuple[float, float, float, bool]:
    """(best flop SR seconds with the ``flags`` (one path, or several) False, with them
    True, best native seconds, whether both outputs have the same bits) per forward (or
    training step: its loss and gradients compared) of zoo entry ``name``, by the
    thread's CPU time over ``repeats`` interleaved rounds; the flags are restored
    after."""
    switches = [_flag(f) for f in ([flags] if isinstance(flags, str) else flags)]
    work, grad_mode = _built(name, float64, train)
    original = [getattr(mod, attr) for mod, attr in switches]

    def flop(on: bool):
        for mod, attr in switches:
            setattr(mod, attr, on)
        with fuzzy(mode="sr", granularity="flop", seed=0):
            t = time.thread_time()
            out = work()
            return time.thread_time() - t, out

    def native() -> float:
        t = time.thread_time()
        work()
        return time.thread_time() - t

    best = {False: float("inf"), True: float("inf"), "native": float("inf")}
    try:
        with grad_mode():
            outs = {on: [flop(on) for _ in range(3)][-1][1] for on in (False, True)}
            same = _bits(outs[False]) == _bits(outs[True])
            for _ in range(repeats):
                for on in (False, True):
                    best[on] = min(best[on], flop(on)[0])
                best["native"] = min(best["native"], native())
    finally:
        for (mod, attr), value in zip(switches, original):
            setattr(mod, attr, value)
    return best[False], best[True], best["native"], same


def _bits(out) -> list[bytes]:
    if isinstance(out, torch.Tensor):
        return [out.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()]
    if isinstance(out, (list, tuple)):
        return [b for o in out for b in _bits(o)]
    if isinstance(out, dict):
        return _bits(list(out.values()))
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="zoo entries (numvar.workloads.zoo.ZOO)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--flag", action="append", help="a boolean module flag "
                    "(package.module.NAME) to time off and on, interleaved in this process; "
                    "given several times, the flags are toggled together")
    ap.add_argument("--float64", action="store_true", help="cast each entry's parameters "
                    "and floating-point inputs to float64")
    ap.add_argument("--lbfgs", action="store_true", help="time one torch.optim.LBFGS step "
                    "(four iterations) on each entry's loss instead of a forward")
    ap.add_argument("--train", action="store_true", help="time a training step (training "
                    "mode: forward, the entry's loss, backward) instead of an eval forward")
    args = ap.parse_args()
    unknown = [m for m in args.models if m not in zoo.ZOO]
    if unknown:
        ap.error(f"unknown zoo entries: {', '.join(unknown)} (known: {', '.join(zoo.ZOO)})")
    if args.lbfgs:
        if args.flag or args.float64 or args.train:
            ap.error("--lbfgs times the entries as they are (no --flag, --float64, --train)")
        for name in args.models:
            tf, tn = lbfgs_steps(name, args.repeats)
            print(f"{name} {tf * 1e3:.3f} {tn * 1e3:.3f} {tf / tn:.1f}", flush=True)
        return
    if args.flag:
        for f in args.flag:
            _flag(f)  # (refused before any model is built)
        for name in args.models:
            off, on, tn, same = toggled_forwards(name, args.flag, args.repeats, args.float64,
                                                 args.train)
            print(f"{name} {off * 1e3:.3f} {on * 1e3:.3f} {tn * 1e3:.3f} "
                  f"{(off - on) / tn:.2f} {'same bits' if same else 'BITS DIFFER'}", flush=True)
        return
    for name in args.models:
        tf, tn = best_forward(name, args.repeats, args.float64, args.train)
        print(f"{name} {tf * 1e3:.3f} {tn * 1e3:.3f} {tf / tn:.1f}", flush=True)


if __name__ == "__main__":
    main()
