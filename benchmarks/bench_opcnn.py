"""Op granularity on CNNs: what numvar's op SR pays above the floor, and a lower bound.

At ``op`` granularity numvar re-runs every op that has no exact short path in float64
(``handlers.op_once``: convolutions, batch norm, activations, means) and rounds the
float64 result once. That float64 re-run is part of the semantics (the value rounded is
torch's float64 result), so no design that keeps the bits can skip it. This benchmark
measures, per model, one forward under ``no_grad``, one thread:

- **native**, **floor** (``codepath`` + ``IdentityMode``, as ``bench_zoo.py``), **op SR**;
- **f64 ref**: the floor with every op whose float64 result op SR rounds (recorded from
  one op SR forward by ``bench_zoo.recorded_once``: ``op_once`` wherever a handler calls it,
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
  ``bench_zoo.recorded_once``) cost their SR kernels' time above torch's own op, per element
  as measured here on 64 Ki elements; **+ elementwise** = bound + elementwise: what
  numvar's own kernels need at their speed (bound by their instruction count on AVX2:
  docs/speed.md), so op SR above it is numvar's per-op Python. The verdict judges the
  goal against it ("out of reach" where it exceeds floor + 2), as ``bench_zoo.py``'s op
  goal cell does with the same parts (its functions, which this script calls).

Times are CPU time of the (only) thread (``time.thread_time``: preemption on a loaded
machine does not count), best of ``--repeats`` interleaved rounds after a warm-up, as
ratios to native.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_opcnn.py \
        [--repeats 7] [--models efficientnet_mbconv mobilenet_se ...]
"""

from __future__ import annotations

import argparse
import time

from numvar.workloads import zoo

from bench_zoo import (_variants, best_of, elementwise_cost, float64_reference,
                       round_cost)

CNNS = ("efficientnet_mbconv", "mobilenet_se", "densenet", "unet", "resnet_basic",
        "resnet_bottleneck")


def measure(name: str, repeats: int) -> dict:
    built = zoo.ZOO[name].build("bench")
    f64ref, elems, pointwise = float64_reference(built)
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
            f", bound {bound + ew - fl:.1f} above floor" + (
                " > 2: out of reach" if bound + ew > fl + 2 else ""))
        print(f"| {name} | {n * 1e3:.2f} | {fl:.2f}× | {f64:.2f}× | {rnd:.2f}× | {bound:.2f}× "
              f"| {ew:.2f}× ({r['elementwise elems']}) | {bound + ew:.2f}× | {op:.2f}× "
              f"| {verdict} |", flush=True)


if __name__ == "__main__":
    main()
