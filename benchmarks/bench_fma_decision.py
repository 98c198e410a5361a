"""The fma clean loop's SR decision, int64 against float64 spelling (one core).

    python benchmarks/bench_fma_decision.py [--repeats 40] [--shape K N]

``numvar.instrument.kernels._below_trunc`` decides ``q < trunc(thr)`` as an int64
compare where the CPU converts float64 vectors to int64 in one instruction (AVX-512DQ,
``kernels.VECTOR_INT64``) and as ``q + 1 <= thr`` in float64 elsewhere (AVX2). This
script compiles the binary32 fma clean loop (``kernels._cleanfma32``, sr, 24 bits)
both ways in one process, checks that both give the same bits on one row of K terms ×
N columns, and prints each one's rate (terms per second of the calling thread's CPU
time, best of ``--repeats`` interleaved rounds of 10 calls) and their ratio. The
kernels' own choice on this host is printed first.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit

from numvar.instrument import kernels as KN


def compiled(int64: bool):
    """``_cleanfma32`` compiled afresh with the decision spelled as asked (the module's
    flag is a compile-time constant: set around the compile, then restored)."""
    keep = KN.VECTOR_INT64
    KN.VECTOR_INT64 = int64
    try:
        fn = njit(KN._cleanfma32.py_func)
        fn(np.empty(4), np.zeros(4, np.uint64), np.ones(2, np.float32), np.ones((2, 4)),
           np.uint64(1), np.uint64(0), 0, 4, KN._SR, 24)
    finally:
        KN.VECTOR_INT64 = keep
    return fn


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--shape", type=int, nargs=2, default=(288, 1024), metavar=("K", "N"))
    args = ap.parse_args(argv)
    numba.set_num_threads(1)
    k, n = args.shape
    rng = np.random.default_rng(0)
    arow = rng.uniform(0.5, 1, k).astype(np.float32)
    bmat = rng.uniform(0.5, 1, (k, n))
    jg = np.arange(n, dtype=np.uint64) * np.uint64(KN._G)
    call_args = (jg, arow, bmat, np.uint64(1), np.uint64(0), 0, n, KN._SR, 24)
    print(f"this host's kernels decide in {'int64' if KN.VECTOR_INT64 else 'float64'} "
          f"(kernels.VECTOR_INT64 = {KN.VECTOR_INT64})")
    fns = {"int64": compiled(True), "float64": compiled(False)}
    outs = {}
    for name, fn in fns.items():
        outs[name] = np.empty(n)
        fn(outs[name], *call_args)
    same = np.array_equal(outs["int64"].view(np.uint64), outs["float64"].view(np.uint64))
    print(f"same bits: {same} ({int(np.isnan(outs['int64']).sum())} lanes handed over)")
    best = dict.fromkeys(fns, float("inf"))
    acc = np.empty(n)
    for _ in range(args.repeats):
        for name, fn in fns.items():
            t = time.thread_time()
            for _ in range(10):
                fn(acc, *call_args)
            best[name] = min(best[name], (time.thread_time() - t) / 10)
    for name in fns:
        print(f"{name:8s} decision {k * n / best[name] / 1e9:.3f} G terms/s")
    print(f"float64 / int64: {best['int64'] / best['float64']:.2f}x")
    if not same:
        raise SystemExit("the two spellings gave different bits")


if __name__ == "__main__":
    main()
