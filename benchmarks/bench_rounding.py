"""Throughput of the rounding core vs a plain float64 -> float32 cast (same run).

    PYTHONPATH=src python benchmarks/bench_rounding.py [--n 10000000] [--repeat 5]

Prints elements/s of SR, UD, random and ieee rounding of n float64 values to binary32
(round), of binary32 and binary64 additions, numba backend (``--torch``: also the torch
backend), and the ratio of each time to a plain cast; best of ``repeat`` runs.
"""

from __future__ import annotations

import argparse
import time

import torch

import numvar.rounding as R


def best(fn, repeat: int) -> float:
    fn()  # warm-up (numba compile / page faults)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="also time the torch backend")
    args = ap.parse_args()
    n = args.n
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dtype=torch.float64, generator=g)
    y = torch.randn(n, dtype=torch.float64, generator=g)
    x32, y32 = x.float(), y.float()
    out32 = torch.empty(n, dtype=torch.float32)
    s = R.Stream(0)
    print(f"n = {n:.0e}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    t_cast = best(lambda: out32.copy_(x), args.repeat)
    t_new = best(lambda: x.to(torch.float32), args.repeat)
    t_add = best(lambda: torch.add(x32, y32), args.repeat)
    print("ratios: time / plain cast into a preallocated tensor (first column) and / plain")
    print("cast into a new tensor (second column; numvar's ops return new tensors)")
    print(f"{'plain float64->float32 cast, preallocated':44s} {n / t_cast / 1e6:8.0f} M/s "
          f"{1.0:6.2f}x {t_cast / t_new:6.2f}x")
    print(f"{'plain float64->float32 cast, new tensor':44s} {n / t_new / 1e6:8.0f} M/s "
          f"{t_new / t_cast:6.2f}x {1.0:6.2f}x")
    print(f"{'plain float32 add (torch), new tensor':44s} {n / t_add / 1e6:8.0f} M/s "
          f"{t_add / t_cast:6.2f}x {t_add / t_new:6.2f}x")
    backends = ["numba"] + (["torch"] if args.torch else [])
    for backend in backends:
        for mode in ("sr", "ud", "random", "ieee"):
            cases = [
                (f"round f64->f32 {mode} [{backend}]",
                 lambda: R.round(x, dtype=torch.float32, mode=mode, stream=s, backend=backend)),
                (f"round f64->f32 {mode}, out= [{backend}]",
                 lambda: R.round(x, dtype=torch.float32, mode=mode, stream=s, backend=backend,
                                 out=out32)),
                (f"add f32 {mode} [{backend}]",
                 lambda: R.add(x32, y32, mode=mode, stream=s, backend=backend)),
                (f"add f64 {mode} [{backend}]",
                 lambda: R.add(x, y, mode=mode, stream=s, backend=backend)),
            ]
            for name, fn in cases:
                t = best(fn, args.repeat if backend == "numba" else 1)
                print(f"{name:44s} {n / t / 1e6:8.0f} M/s {t / t_cast:6.2f}x {t / t_new:6.2f}x")


if __name__ == "__main__":
    main()
