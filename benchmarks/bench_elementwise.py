"""The elementwise rounding loops of flop granularity: their rates, and the term bits
drawn in a loop of their own (measured, not kept).

Every elementwise rounding at flop granularity (``pointwise.round_into``'s tiles, and the
FFT and LU kernels built on them) draws one full ``bits64`` hash per rounding; the fused
LU / triangular-solve update ``pointwise.mulsub_rows`` draws two per term. This script
times, one thread, best of ``--repeats`` rounds of 50 calls (20 for ``_mulsub``):

- the SR loops as numvar compiles them (``_tile`` product, sum, quotient on 1 024
  elements; ``_mulsub`` on 64 × 64 and 16 × 1 024), in G roundings (terms) per second,
  and the same arithmetic in plain PyTorch (``torch.mul``/``add``/``div`` into an
  ``out=``; for ``_mulsub`` ``torch.addcmul(x, s, v, value=-1)``) with the ratio;
- the same loops with the hashes drawn first into a buffer, the rounding loop reading
  them (what made the contraction kernel 1.2× faster: docs/speed.md), its rate ÷ the
  shipped loop's, and whether the bits agree.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_elementwise.py [--repeats 300]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
import torch
from numba import njit

from numvar.instrument import pointwise as P
from numvar.instrument.kernels import _bits, _fast32
from numvar.rounding import kernels as K

SR = K.MODE_SR


@njit(error_model="numpy")
def _tile_split(op, a, b, o, ukey, l0, rb):  # pragma: no cover - compiled
    """``pointwise._mulloop`` / ``_addloop`` in SR with the hashes in a loop of their own."""
    K.wide_vectors()
    n = o.size
    for jj in range(n):
        rb[jj] = _bits(ukey, np.uint64(l0 + jj))
    nbad = 0
    if op == K.OP_MUL:
        for jj in range(n):
            v, ok = _fast32(np.float64(a[jj]) * np.float64(b[jj]), rb[jj], SR)
            o[jj] = v
            nbad += 0 if ok else 1
        return nbad
    for jj in range(n):
        s, e = P._sum_at(a, b, jj, False)
        v, ok = _fast32(s, rb[jj], SR)
        o[jj] = v
        nbad += 0 if (ok and (e == 0.0 or not (abs(s) < np.inf))) else 1
    return nbad


@njit(error_model="numpy")
def _mulsub_split(s, v, X, O, kmul, ksub, l0, bad, rm, rs):  # pragma: no cover - compiled
    """``pointwise._mulsubloop`` in SR with each row's hashes in a loop of their own."""
    K.wide_vectors()
    R, N = O.shape
    nbad = 0
    for i in range(R):
        sf = np.float64(s[i])
        x = X[i]
        o = O[i]
        li = l0 + i * N
        for c in range(N):
            r = np.uint64(li + c)
            rm[c] = _bits(kmul, r)
            rs[c] = _bits(ksub, r)
        nb = 0
        for c in range(N):
            q, ok = P.mulsub_term(sf, v[c], x[c], rm[c], rs[c], SR)
            o[c] = q
            nb += 0 if ok else 1
        bad[i] = nb != 0
        nbad += nb
    return nbad


def _best(fn, repeats: int, inner: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t) / inner)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    key = np.uint64(5)
    print("| loop (sr, binary32) | size | numvar G/s | torch G/s | numvar ÷ torch time "
          "| split G/s | split ÷ shipped time | same bits |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    n = 1024
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.empty(n)
    rb = np.empty(n, np.uint64)
    for name, op, tf in (("_tile product", K.OP_MUL, torch.mul), ("_tile sum", K.OP_ADD, torch.add),
                         ("_tile quotient", K.OP_DIV, torch.div)):
        o1, o2 = np.empty_like(a), np.empty_like(a)
        t1 = _best(lambda: P._tile(op, a, b, o1, key, 7, SR), args.repeats, 50)
        tt = _best(lambda: tf(ta, tb, out=tout), args.repeats, 50)
        if op == K.OP_DIV:  # no split variant of the quotient loop
            split, same = "—", "—"
            ratio = "—"
        else:
            t2 = _best(lambda: _tile_split(op, a, b, o2, key, 7, rb), args.repeats, 50)
            split, ratio = f"{n / t2 / 1e9:.3f}", f"{t2 / t1:.2f}"
            same = "yes" if np.array_equal(o1.view(np.uint32), o2.view(np.uint32)) else "**no**"
        print(f"| {name} | {n} | {n / t1 / 1e9:.3f} | {n / tt / 1e9:.3f} | {t1 / tt:.1f} | "
              f"{split} | {ratio} | {same} |")
    for R, N in ((64, 64), (16, 1024)):
        s = rng.standard_normal(R).astype(np.float32)
        v = rng.standard_normal(N).astype(np.float32)
        X = rng.standard_normal((R, N)).astype(np.float32)
        O1, O2 = np.empty_like(X), np.empty_like(X)
        bad = np.empty(R, np.bool_)
        rm, rs = np.empty(N, np.uint64), np.empty(N, np.uint64)
        k1, k2 = np.uint64(1), np.uint64(2)
        t1 = _best(lambda: P._mulsub(s, v, X, O1, k1, k2, 3, SR, bad), args.repeats, 20)
        t2 = _best(lambda: _mulsub_split(s, v, X, O2, k1, k2, 3, bad, rm, rs), args.repeats, 20)
        tx, ts, tv, to = (torch.from_numpy(X), torch.from_numpy(s)[:, None],
                          torch.from_numpy(v)[None, :], torch.empty(R, N))
        tt = _best(lambda: torch.addcmul(tx, ts, tv, value=-1, out=to), args.repeats, 20)
        same = "yes" if np.array_equal(O1.view(np.uint32), O2.view(np.uint32)) else "**no**"
        w = R * N
        print(f"| _mulsub | {R} × {N} | {w / t1 / 1e9:.3f} | {w / tt / 1e9:.3f} | "
              f"{t1 / tt:.1f} | {w / t2 / 1e9:.3f} | {t2 / t1:.2f} | {same} |")


if __name__ == "__main__":
    main()
