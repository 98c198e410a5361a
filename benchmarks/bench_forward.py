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
"""

from __future__ import annotations

import argparse
import time

import torch

from numvar.instrument import fuzzy
from numvar.workloads import zoo


def best_forward(name: str, repeats: int) -> tuple[float, float]:
    """(best flop SR seconds, best native seconds) per forward of zoo entry ``name``."""
    built = zoo.build(name, "bench")
    model, x = built.model.eval(), built.inputs

    def flop() -> float:
        with fuzzy(mode="sr", granularity="flop", seed=0):
            t = time.perf_counter()
            model(*x)
            return time.perf_counter() - t

    def native() -> float:
        t = time.perf_counter()
        model(*x)
        return time.perf_counter() - t

    with torch.no_grad():
        for _ in range(3):
            flop()
        tf = min(flop() for _ in range(repeats))
        tn = min(native() for _ in range(repeats))
    return tf, tn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="zoo entries (numvar.workloads.zoo.ZOO)")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    unknown = [m for m in args.models if m not in zoo.ZOO]
    if unknown:
        ap.error(f"unknown zoo entries: {', '.join(unknown)} (known: {', '.join(zoo.ZOO)})")
    for name in args.models:
        tf, tn = best_forward(name, args.repeats)
        print(f"{name} {tf * 1e3:.3f} {tn * 1e3:.3f} {tf / tn:.1f}", flush=True)


if __name__ == "__main__":
    main()
