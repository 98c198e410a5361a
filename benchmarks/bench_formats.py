"""Speed of the rounding modes and formats in the flop contraction kernel.

The binary32 contraction (numvar.instrument.kernels.contract, t = 24) has vectorised
fast paths for ieee, sr, ud and random; up, down, zero and farthest run on its scalar
path (numvar.rounding's scalar functions, the same bits as the references). Any other
format with accumulate="same" runs the any-format kernel (contract_format); with the
default accumulate="native" a low-precision format runs the binary32 kernel and one
rounding of the result. Throughput in rounded terms (one product and one add) per
second, interleaved, best of 5, one thread; the ratio is against sr in the same run.

    python benchmarks/bench_formats.py [--m 64 --k 256 --n 128]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import numba

    numba.set_num_threads(1)
    from numvar.instrument import kernels as KN
    from numvar.rounding.formats import NAMED
    from numvar.rounding.kernels import mode_code

    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, args.m, args.k)).astype(np.float32)
    b = rng.standard_normal((1, args.k, args.n)).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    e4 = NAMED["e4m3fn"]
    cases = {f"binary32 {m}": (lambda m=m: KN.contract(a, b, 1, mode_code(m), 24))
             for m in ("sr", "ieee", "ud", "random", "up", "down", "zero", "farthest")}
    for m in ("sr", "up"):
        cases[f"e4m3fn same {m}"] = (lambda m=m: KN.contract_format(
            a64, b64, 1, mode_code(m), e4.precision, e4.spec()))
    for fn in cases.values():
        fn()  # compile
    best = {name: float("inf") for name in cases}
    for _ in range(args.repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    terms = args.m * args.k * args.n
    print(f"contraction {args.m}x{args.k} @ {args.k}x{args.n}, one thread")
    print(f"{'kernel, mode':24s} {'M terms/s':>10s} {'time / sr':>10s}")
    for name, t in best.items():
        print(f"{name:24s} {terms / t / 1e6:10.1f} {t / best['binary32 sr']:10.1f}")


if __name__ == "__main__":
    main()
