"""Op granularity on CNNs: what numvar's op SR pays above the floor, and a lower bound.

At ``op`` granularity numvar re-runs every op that has no exact short path in float64
(``handlers.op_once``: convolutions, batch norm, activations, means) and rounds the
float64 result once. That float64 re-run is part of the semantics (the value rounded is
torch's float64 result), so no design that keeps the bits can skip it. This benchmark
measures, per model, one forward under ``no_grad``, one thread:

- **native**, **floor** (``codepath`` + ``IdentityMode``, as ``bench_zoo.py``), **op SR**;
- **f64 ref**: the floor with every op whose float64 result op SR rounds (recorded from
  one op SR forward by :func:`recorded_once`: ``op_once`` wherever a handler calls it,
  the scaled contractions, ``_safe_softmax``) upcast to float64, run, and cast back to
  float32 (no rounding, no numvar Python): what the float64 re-run alone costs;
- **round**: the SR rounding kernel (``pointwise.round32``) over as many elements as op
  SR rounds from float64 per forward, minus a plain float64 -> float32 cast of them;
- **bound** = f64 ref + round: about the least any design that re-runs in float64
  through torch and rounds with numvar's kernel pays (whole ops are re-run, so op SR can
  fall slightly below it where numvar's own path for an op is cheaper); the goal is op
  SR <= floor + 2;
- **elementwise**: the ops op SR rounds without a float64 re-run (binary32 add, sub,
  mul, div of two tensors or of a tensor and a Python number: ``pointwise
  .binary32_tensors`` and ``scalar32_tensor``, recorded with their elements by
  :func:`recorded_once`) cost their SR kernels' time above torch's own op, per element
  as measured here on 64 Ki elements; **+ elementwise** = bound + elementwise: what
  numvar's own kernels need at their speed (bound by their instruction count on AVX2:
  docs/speed.md), so op SR above it is numvar's per-op Python.

Times are CPU time of the (only) thread (``time.thread_time``: preemption on a loaded
machine does not count), best of ``--repeats`` interleaved rounds after a warm-up, as
ratios to native.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_opcnn.py \
        [--repeats 7] [--models efficientnet_mbconv mobilenet_se ...]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numvar.instrument import fuzzy
from numvar.instrument import _core as C
from numvar.instrument import mode as MD
from numvar.instrument import pointwise as PW
from numvar.instrument.codepath import codepath
from numvar.rounding import kernels as RK
from numvar.workloads import zoo

from bench_zoo import _variants, best_of

CNNS = ("efficientnet_mbconv", "mobilenet_se", "densenet", "unet", "resnet_basic",
        "resnet_bottleneck")


def _op(model, x):
    with fuzzy(mode="sr", granularity="op", seed=0):
        return model(*x)


def recorded_once(model, x) -> tuple[set, int, Counter]:
    """The ops whose float64 result op SR rounds in one forward (every top-level op during
    whose dispatch ``Ctx.round`` receives a float64 tensor: ``op_once`` wherever a
    handler calls it, ``oplevel``'s scaled contractions, ``_safe_softmax``'s float64
    softmax), the elements those roundings produce, and the elements of the binary32
    elementwise roundings (per operation code: ``pointwise.binary32_tensors`` where it
    computes, ``scalar32_tensor``)."""
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
        _op(model, x)
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


class Float64Rerun(TorchDispatchMode):
    """Runs the ops in ``funcs`` on float64 copies of their float32 arguments and casts
    the results back to float32; every other op as it is."""

    def __init__(self, funcs) -> None:
        super().__init__()
        self.funcs = funcs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.funcs:
            return func(*args, **kwargs)
        out = func(*_map(args, _up), **{k: _map(v, _up) for k, v in kwargs.items()})
        return _map(out, _down)


def _best(fn, repeats: int) -> float:
    b = float("inf")
    for _ in range(max(repeats, 20)):
        t = time.thread_time()
        fn()
        b = min(b, time.thread_time() - t)
    return b


def round_cost(elems: int, repeats: int) -> float:
    """Seconds the SR rounding kernel takes over ``elems`` elements above a plain cast
    (in 64 Ki-element tensors, the size of a typical CNN activation here)."""
    n = 1 << 16
    h = torch.randn(n, dtype=torch.float64)
    out = torch.empty(n, dtype=torch.float32)
    PW.round32(h.numpy(), out.numpy(), 1, 1)
    rnd = _best(lambda: PW.round32(h.numpy(), out.numpy(), 1, 1), repeats)
    cast = _best(lambda: h.to(torch.float32), repeats)
    return max(0.0, rnd - cast) * elems / n


def elementwise_cost(pointwise: Counter, repeats: int) -> float:
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
        per = max(0.0, _best(sr, repeats) - _best(torch_op, repeats)) / (10 * n)
        total += per * elems
    return total


def measure(name: str, repeats: int) -> dict:
    built = zoo.ZOO[name].build("bench")
    model, x = built.model.eval(), built.inputs
    with torch.no_grad():
        funcs, elems, pointwise = recorded_once(model, x)

    def f64ref():
        with codepath(), Float64Rerun(funcs):
            model(*x)
    v = _variants(built)
    fns = {"native": v["native"], "floor": v["floor"], "f64 ref": f64ref, "op SR": v["op SR"]}
    best = best_of(fns, repeats, time.thread_time)
    best["round"] = round_cost(elems, repeats)
    best["elems"] = elems
    best["elementwise"] = elementwise_cost(pointwise, repeats)
    best["elementwise elems"] = sum(pointwise.values())
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--models", nargs="+", default=list(CNNS))
    args = ap.parse_args(argv)
    print("| model | native ms | floor | f64 ref | round | bound | elementwise (elements) "
          "| + elementwise | op SR | goal (floor + 2) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.models:
        r = measure(name, args.repeats)
        n = r["native"]
        fl, f64, rnd, op = r["floor"] / n, r["f64 ref"] / n, r["round"] / n, r["op SR"] / n
        ew = r["elementwise"] / n
        bound = f64 + rnd
        verdict = ("✓" if op <= fl + 2 else "✗") + (
            f", bound {bound - fl:.1f} above floor" + (" > 2: out of reach" if bound > fl + 2
                                                        else ""))
        print(f"| {name} | {n * 1e3:.2f} | {fl:.2f}× | {f64:.2f}× | {rnd:.2f}× | {bound:.2f}× "
              f"| {ew:.2f}× ({r['elementwise elems']}) | {bound + ew:.2f}× | {op:.2f}× "
              f"| {verdict} |", flush=True)


if __name__ == "__main__":
    main()
