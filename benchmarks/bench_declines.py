"""Elementwise binary32 SR rounding when the vectorised path declines a few elements.

``pointwise.binary32`` rounds an add in tiles of 1024 elements on a vectorised fast path;
an element it declines (here: a sum inexact in float64, ``x + 1e-12·x``) is redone
(``pointwise._redo``: the residual loop ``_tile_lo``, then 32-element sub-tiles and the
scalar ``pointwise._slow`` for what still declines). This prints the rate in
G roundings/s for exact sums, for one declined sum per tile and for every sum inexact,
and the time of each against ``torch.add`` on the same arrays (native, one thread),
best of ``--repeats`` samples of 20 calls each, thread CPU time.

To compare two versions of numvar, run it in each tree alternately:

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 PYTHONPATH=TREE/src python benchmarks/bench_declines.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from numvar.instrument import pointwise as PW
from numvar.rounding import kernels as K


def _best(fn, repeats: int, inner: int = 20) -> float:
    """Best over ``repeats`` samples of the thread CPU time per call, each sample timing
    ``inner`` calls (one torch.add of 65 536 floats is below the clock's resolution)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(inner):
            fn()
        best = min(best, (time.thread_time() - t0) / inner)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 16, help="elements (default 65536)")
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(a.n).astype(np.float32)
    y = rng.standard_normal(a.n).astype(np.float32)
    y_declined = y.copy()
    y_declined[::PW.TILE] = x[::PW.TILE] * np.float32(1e-12)  # one inexact sum per tile
    # every sum inexact in float64: a term 2**-30..2**-60 times the other, both signs (as
    # the parts of complex products: vr·wr − vi·wi with products of unlike exponents)
    tiny = rng.standard_normal(a.n) * np.exp2(-rng.integers(30, 60, a.n).astype(float))
    y_all = (x.astype(np.float64) * tiny).astype(np.float32)
    out = np.empty(a.n, np.float32)
    print(f"| operands ({a.n} elements) | G roundings/s | × torch.add |")
    print("|---|---:|---:|")
    for name, yy in (("exact sums", y), (f"one inexact sum per {PW.TILE}", y_declined),
                     ("every sum inexact", y_all)):
        tx, ty = torch.from_numpy(x), torch.from_numpy(yy)
        native = _best(lambda: torch.add(tx, ty), a.repeats)
        t = _best(lambda: PW.binary32(K.OP_ADD, x, (0, 0, 1), yy, (0, 0, 1), out,
                                      (1, 1, a.n), 7, K.MODE_SR), a.repeats)
        print(f"| {name} | {a.n / t / 1e9:.2f} | {t / native:.1f} |")


if __name__ == "__main__":
    main()
