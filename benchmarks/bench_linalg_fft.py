"""Slowdown of numvar.fuzzy on linear algebra and FFTs versus plain PyTorch (fp32).

For each workload (batched solve, Cholesky, QR, eigh, svd, rfft of power-of-two and
other lengths, irfft of power-of-two lengths): the best time over repeats of plain
PyTorch, of ``fuzzy(mode="sr", granularity="op")`` and of ``fuzzy(mode="sr",
granularity="flop")``, measured interleaved in one process, and the ratios to native.
A warm-up call per configuration compiles the numba kernels first.

    python benchmarks/bench_linalg_fft.py [--repeats 3] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import time

import numba
import torch

from numvar.instrument import fuzzy


def workloads(quick: bool):
    g = torch.Generator().manual_seed(0)
    out = []
    for n in ((8,) if quick else (8, 32)):
        A = torch.randn(16, n, n, generator=g) + n ** 0.5 * torch.eye(n)
        b = torch.randn(16, n, 1, generator=g)
        S = A @ A.mT
        out += [(f"solve 16x{n}x{n}", lambda A=A, b=b: torch.linalg.solve(A, b)),
                (f"cholesky 16x{n}x{n}", lambda S=S: torch.linalg.cholesky(S)),
                (f"qr 16x{n}x{n}", lambda A=A: torch.linalg.qr(A))]
    m = 8 if quick else 16
    A = torch.randn(16, m, m, generator=g)
    S = A @ A.mT + m * torch.eye(m)
    out += [(f"eigh 16x{m}x{m}", lambda: torch.linalg.eigh(S)),
            (f"svd 16x{m}x{m}", lambda: torch.linalg.svd(A))]
    for n in ((256, 400) if quick else (256, 1024, 400, 1000)):
        x = torch.randn(64, n, generator=g)
        out.append((f"rfft 64x{n}", lambda x=x: torch.fft.rfft(x)))
        if n & (n - 1) == 0:  # the inverse (aten._fft_c2r) of a power-of-two length
            X = torch.fft.rfft(x)
            out.append((f"irfft 64x{n}", lambda X=X, n=n: torch.fft.irfft(X, n=n)))
    return out


def _time(fn, gran):
    if gran is None:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    with fuzzy(mode="sr", granularity=gran, seed=0):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    print("| workload | native ms | op ×native | flop ×native |")
    print("|---|---|---|---|")
    for name, fn in workloads(args.quick):
        for gran in (None, "op", "flop"):
            _time(fn, gran)  # warm-up (numba compilation, classification caches)
        best = {None: 1e9, "op": 1e9, "flop": 1e9}
        for _ in range(args.repeats):
            for gran in best:
                best[gran] = min(best[gran], _time(fn, gran))
        nat = best[None]
        print(f"| {name} | {nat * 1e3:.3f} | {best['op'] / nat:.1f} | {best['flop'] / nat:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
