"""Throughput of the rounding core vs a plain float64 -> float32 cast (same run).

    PYTHONPATH=src python benchmarks/bench_rounding.py [--n 10000000] [--repeat 5]

Prints elements/s of SR, UD, random and ieee rounding of n float64 values to binary32
(round), of binary32 and binary64 additions, numba backend (``--torch``: also the torch
backend), and the ratio of each time to a plain cast; best of ``repeat`` runs.

``--core``: only the section "the rounding core" (the four cases of issue 16: float32
input, ``out=`` for bf16/fp16 targets, ``lo=zeros``, one out-of-range element), each
case next to its baseline and to the plain torch cast of the same conversion, all timed
in interleaved rounds (best of ``repeat``) so that load on a shared machine hits them
alike::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_rounding.py --core --n 10000000

Both sides allocate fresh tensors of millions of elements per call. The script first sets
glibc's malloc to keep freed memory, as every fuzzy block's entry does
(``numvar.instrument.heap.keep_freed_memory``); with malloc as it was, the top of the heap
was returned to the system between calls now and then, and the next call faulted its
output in page by page: a plain float64 -> float32 cast into a new tensor of 10⁶ elements
took 2.6 ms instead of 0.33, in some processes and not others. It also serves blocks of
every size from the heap, as while a fuzzy block is active (``heap.block_entered``),
where numvar's own roundings run: glibc maps a block of 32 MB or more on its own
otherwise, and every call whose output is that large (a binary32 result of 10⁷
elements: 40 MB) faulted its 9 766 pages in, 2.3 µs each, in the rounding calls and the
torch casts alike, unless a free run of the heap happened to fit it (docs/speed.md,
"Large blocks from the heap"). The first line says which (``NUMVAR_KEEP_FREED_MEMORY=0``
measures with malloc as it was).
"""

from __future__ import annotations

import argparse
import time

import numba
import torch

import numvar.rounding as R
from numvar.instrument import heap


def best(fn, repeat: int) -> float:
    fn()  # warm-up (numba compile / page faults)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def interleaved(fns: dict, repeat: int) -> dict:
    """Best time (s) of each callable over ``repeat`` interleaved rounds, after a warm-up
    round (numba compilation, page faults)."""
    for fn in fns.values():
        fn()
    best_t = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best_t[k] = min(best_t[k], time.perf_counter() - t0)
    return best_t


def core_section(n: int, repeat: int) -> None:
    """The rounding core's four cases (issue 16), SR, numba backend."""
    g = torch.Generator().manual_seed(0)
    x64 = torch.randn(n, dtype=torch.float64, generator=g)
    x32 = x64.float()
    zeros = torch.zeros(n, dtype=torch.float64)
    bad = x64.clone()
    bad[n // 2] = 1e-300  # one value below binary32's normal range
    bf, hf, f32 = torch.bfloat16, torch.float16, torch.float32
    out_bf, out_hf, out_32 = (torch.empty(n, dtype=d) for d in (bf, hf, f32))
    s = R.Stream(0)

    def rnd(x, dtype, **kw):
        return lambda: R.round(x, dtype=dtype, mode="sr", stream=s, backend="numba", **kw)

    fns = {
        "cast f32->bf16": lambda: x32.to(bf),
        "cast f64->bf16": lambda: x64.to(bf),
        "cast f64->f16": lambda: x64.to(hf),
        "cast f64->f32": lambda: x64.to(f32),
        "cast f64->bf16, out=": lambda: out_bf.copy_(x64),
        "cast f64->f16, out=": lambda: out_hf.copy_(x64),
        # 1. float32 input
        "sr f64->bf16": rnd(x64, bf),
        "sr f32->bf16": rnd(x32, bf),
        # 2. out= for bf16/fp16 targets
        "sr f64->bf16, out=": rnd(x64, bf, out=out_bf),
        "sr f64->f16": rnd(x64, hf),
        "sr f64->f16, out=": rnd(x64, hf, out=out_hf),
        # 3. lo given
        "sr f64->f32": rnd(x64, f32),
        "sr f64->f32, lo=zeros": lambda: R.round(x64, zeros, dtype=f32, mode="sr", stream=s,
                                                 backend="numba"),
        "sr f64->bf16, lo=zeros": lambda: R.round(x64, zeros, dtype=bf, mode="sr", stream=s,
                                                  backend="numba"),
        # 4. one out-of-range element
        "sr f64->f32, 1 out of range": rnd(bad, f32),
        "sr f64->bf16, 1 out of range": rnd(bad, bf),
    }
    t = interleaved(fns, repeat)
    print(f"the rounding core: n = {n:.0e}, SR, numba backend, threads "
          f"{torch.get_num_threads()}/{numba.get_num_threads()}, best of {repeat} interleaved")
    rows = [  # (case, baseline, plain torch cast of the same conversion)
        ("sr f64->bf16", None, "cast f64->bf16"),
        ("sr f32->bf16", "sr f64->bf16", "cast f32->bf16"),
        ("sr f64->bf16, out=", "sr f64->bf16", "cast f64->bf16, out="),
        ("sr f64->f16", None, "cast f64->f16"),
        ("sr f64->f16, out=", "sr f64->f16", "cast f64->f16, out="),
        ("sr f64->f32", None, "cast f64->f32"),
        ("sr f64->f32, lo=zeros", "sr f64->f32", "cast f64->f32"),
        ("sr f64->bf16, lo=zeros", "sr f64->bf16", "cast f64->bf16"),
        ("sr f64->f32, 1 out of range", "sr f64->f32", "cast f64->f32"),
        ("sr f64->bf16, 1 out of range", "sr f64->bf16", "cast f64->bf16"),
    ]
    print(f"{'case':30s} {'ms':>8s} {'/ baseline':>11s} {'/ cast':>7s}  cast")
    for case, base, cast in rows:
        rb = f"{t[case] / t[base]:10.2f}x" if base else f"{'':11s}"
        print(f"{case:30s} {t[case] * 1e3:8.2f} {rb} {t[case] / t[cast]:6.2f}x  {cast} "
              f"({t[cast] * 1e3:.2f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="also time the torch backend")
    ap.add_argument("--core", action="store_true",
                    help="only the section 'the rounding core' (issue 16's four cases)")
    args = ap.parse_args()
    kept = heap.keep_freed_memory()
    heap.block_entered()  # (large blocks from the heap, as inside a fuzzy block)
    print("malloc: " + ("freed memory kept for reuse, large blocks from the heap" if kept
                        else "as it was"))
    if args.core:
        core_section(args.n, args.repeat)
        return
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
