"""Row sums at flop granularity (binary32, SR): the row-block kernel against the column
scan of a transposed copy, and against PyTorch's sum, in one process.

``numvar.instrument.pointwise.rowsum32`` sums the rows of an (M, K) array in the order
and with the bits of ``numvar.instrument.kernels.scan`` on its transpose (the (K, M)
scan that ``flop.reduce`` runs on a permuted copy otherwise): blocks of rows transposed in
cache by 8 × 8 tiles, then one tile of the block's rows per step of k
(``pointwise.block_rows``: at least ``RBLOCK_MIN`` rows per block). The same sums run
inside the compiled norms (layer norm, group norm, ``torch.var``'s statistics). For each
shape: ns per element of ``rowsum32``, of ``np.ascontiguousarray(x.T)`` + ``scan`` (the
reference), of ``torch.sum(x, 1)`` (native), the ratio of ``rowsum32`` to native, and
whether the two numvar paths give the same bits. Best of ``--repeats`` rounds, each
timed by the thread's CPU time.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_rowsums.py [--repeats 15]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from bench_declines import _best  # (thread CPU time per call, best of repeats)

from numvar.instrument import kernels as KN
from numvar.instrument import pointwise as PW
from numvar.rounding import kernels as RK

#: (rows, row length): long rows (group norm, the variance of a few long rows), a layer
#: norm's rows, short rows, odd sizes (8 × 8 tiles with edges)
SHAPES = [(16, 4096), (64, 8192), (96, 2048), (512, 768), (256, 128), (512, 64), (40, 100)]


def measure(M: int, K: int, repeats: int) -> tuple[float, float, float, bool]:
    """(rowsum32, transpose + scan, torch.sum seconds; the same bits) for (M, K)."""
    x = np.random.default_rng(M * K).standard_normal((M, K)).astype(np.float32)
    xt = torch.from_numpy(x)
    sr = RK.mode_code("sr")
    inner = max(1, 2_000_000 // x.size)
    rows = _best(lambda: PW.rowsum32(x, 5, sr), repeats, inner)
    scan = _best(lambda: KN.scan(np.ascontiguousarray(x.T), 5, sr, 24), repeats, inner)
    native = _best(lambda: torch.sum(xt, 1), repeats, inner)
    same = np.array_equal(PW.rowsum32(x, 5, sr).view(np.int32),
                          KN.scan(np.ascontiguousarray(x.T), 5, sr, 24)[0].view(np.int32))
    return rows, scan, native, same


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("| rows × length | rowsum32 ns/element | transpose + scan | torch.sum | "
          "rowsum32 ÷ native | same bits |")
    print("|---|---:|---:|---:|---:|---|")
    for M, K in SHAPES:
        rows, scan, native, same = measure(M, K, args.repeats)
        n = M * K / 1e9
        print(f"| {M} × {K} | {rows / n:.2f} | {scan / n:.2f} | {native / n:.2f} | "
              f"{rows / native:.1f}× | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
