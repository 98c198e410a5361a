"""bfloat16/float16 models against their binary32 twins, with and without numvar's
low-precision fast paths, in one process.

For each zoo entry (default: ``resnet_basic``, ``resnet_basic_bf16``, ``bert``,
``bert_bf16``), one forward under ``no_grad`` at its bench size: native, the floor (a
do-nothing dispatch mode on numvar's code path), op SR and flop SR, the last two
**before** (the bf16/fp16 fast paths switched off in this process: the exact-product
contraction loop, ``kernels.EXACT_PRODUCTS``, and the binary32-carrier roundings and binary ops of
``Ctx``, ``_core._NARROW``) and **after** (on). Both give the same bits (tests/test_instrument_lowp.py);
only the time differs. Best of ``--repeats`` interleaved rounds after a warm-up, ratios
to native in the same run.

``--cpu`` times with the process CPU clock instead of the wall clock: on a shared,
oversubscribed machine (other jobs time-slice this one) it measures what the work itself
costs; at one thread it matched a quiet machine's wall-clock numbers within a few %.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_lowp.py --cpu --repeats 7 \\
        [--models resnet_basic resnet_basic_bf16 ...]
"""

from __future__ import annotations

import argparse
import time

import torch

from numvar.instrument import _core
from numvar.instrument import kernels as KN
from numvar.workloads import zoo

from bench_zoo import _variants, best_of

_NARROW = dict(_core._NARROW)


def fast_paths(on: bool) -> None:
    """Switch the bf16/fp16 fast paths on or off (same bits either way)."""
    _core._NARROW.clear()
    if on:
        _core._NARROW.update(_NARROW)
    KN.EXACT_PRODUCTS = on


def measure(name: str, repeats: int, clock) -> dict[str, float]:
    v = _variants(zoo.build(name, "bench"))
    variants = {"native": (v["native"], True), "floor": (v["floor"], True),
                "op before": (v["op SR"], False), "op after": (v["op SR"], True),
                "flop before": (v["flop SR"], False), "flop after": (v["flop SR"], True)}
    try:
        return best_of({k: fn for k, (fn, _) in variants.items()}, repeats, clock,
                       setup=lambda k: fast_paths(variants[k][1]))
    finally:
        fast_paths(True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+",
                    default=["resnet_basic", "resnet_basic_bf16", "bert", "bert_bf16"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="process CPU clock (shared machines)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    clock = time.process_time if args.cpu else time.perf_counter
    print("| model | native ms | floor | op before | op after | flop before | flop after |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        b = measure(name, args.repeats, clock)
        n = b["native"]
        cells = " | ".join(f"{b[k] / n:.1f}×" for k in
                           ("floor", "op before", "op after", "flop before", "flop after"))
        print(f"| {name} | {n * 1e3:.2f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
