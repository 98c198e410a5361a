"""The elementwise rounding loops of flop granularity: their rates, the term bits drawn
in a loop of their own (measured, not kept), and each hash from its index (the form
before the Weyl value became an induction).

Every elementwise rounding at flop granularity (``pointwise.round_into``'s tiles, and the
FFT and LU kernels built on them) draws one full ``bits64`` hash per rounding; the fused
LU / triangular-solve update ``pointwise.mulsub_rows`` draws two per term. This script
times, one thread, best of ``--repeats`` rounds of 50 calls (20 for ``_mulsub``):

- the SR loops as numvar compiles them (``_tile`` product, sum, quotient on 1 024
  elements; ``_roundtile``, float64 to binary32, on 1 024; ``_mulsub`` on 64 × 64 and
  16 × 1 024), in G roundings (terms) per second, and the same arithmetic in plain
  PyTorch (``torch.mul``/``add``/``div`` into an ``out=``; for the rounding a float64 to
  float32 ``copy_``; for ``_mulsub`` ``torch.addcmul(x, s, v, value=-1)``) with the
  ratio;
- the same loops with the hashes drawn first into a buffer, the rounding loop reading
  them (what made the contraction kernel 1.2× faster: docs/speed.md), its rate ÷ the
  shipped loop's, and whether the bits agree;
- the same loops with each element's hash from its index, ``bits64(key, l0 + j)`` (the
  form before the Weyl value became an induction stepped by γ, ``kernels._weyl``): its
  rate, the shipped loop's speed-up over it, and whether the bits agree.
- in a second table, the sum tile against the same loop with its decline flag combined
  by ``and``/``or`` (as it was before 2026-12-04), on 1 024 and 16 384 elements (on
  1 024 the call's own overhead, about 1 µs from Python, is a third to a half of it).
- in a third table, ``_mulsub`` (each row in two passes, products then differences, since
  2026-12-05) against the one-pass loop it replaced (both roundings of a term in one
  vectorised body, which needs more constants than AVX2's sixteen vector registers
  hold), on the trailing-block shapes of a 64 × 64 LU and triangular solve, and whether
  the bits agree;
- in a fourth table, the SR product of ``pointwise.binary32_tensors`` (and
  ``scalar32_tensor`` for a Python number) over 65 536 elements in the layouts a model's
  elementwise ops take: both operands contiguous of one shape (the reference: no copy),
  a number, one element expanded, a bias row (N < a tile), a column (one value per
  row), a sliced operand; each layout's time ÷ the reference's, torch's ``mul`` on the
  same operands, and whether the result has the bits of the materialised operands'.
  Broadcast operands are copied tile by tile into a buffer (``pointwise._block``); until
  2026-12-05 those copies did not vectorise and a constant was copied into every tile
  again (a number's product took 1.5× the reference's time; docs/speed.md).

The variants of a row are timed interleaved (one round of each, ``--repeats`` times), so
that a shared host's slow spells fall on all of them.

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
from numvar.instrument.kernels import _G, _bits, _bits_weyl, _fast32, _weyl
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
        nbad += 0 if (ok & ((e == 0.0) | (not (abs(s) < np.inf)))) else 1
    return nbad


@njit(inline="always", error_model="numpy")
def _mul_indexed(a, b, o, ukey, l0):
    """``pointwise._mulloop`` in SR with each hash from its element's index (one 64-bit
    index product per element), as the tiles were before the Weyl value became an
    induction (``kernels._weyl``); :func:`_add_indexed` and :func:`_div_indexed` alike."""
    nbad = 0
    for jj in range(o.size):
        v, ok = _fast32(np.float64(a[jj]) * np.float64(b[jj]), _bits(ukey, np.uint64(l0 + jj)),
                        SR)
        o[jj] = v
        nbad += 0 if ok else 1
    return nbad


@njit(inline="always", error_model="numpy")
def _add_indexed(a, b, o, ukey, l0):
    nbad = 0
    for jj in range(o.size):
        s, e = P._sum_at(a, b, jj, False)
        v, ok = _fast32(s, _bits(ukey, np.uint64(l0 + jj)), SR)
        o[jj] = v
        nbad += 0 if (ok & ((e == 0.0) | (not (abs(s) < np.inf)))) else 1
    return nbad


@njit(inline="always", error_model="numpy")
def _div_indexed(a, b, o, ukey, l0):
    nbad = 0
    for jj in range(o.size):
        q, e = P._quot_at(a, b, jj)
        v, ok = P._lo32(q, e, _bits(ukey, np.uint64(l0 + jj)), SR)
        o[jj] = v
        nbad += 0 if ok else 1
    return nbad


@njit(error_model="numpy")
def _add_andor(a, b, o, ukey, l0):  # pragma: no cover - compiled
    """``pointwise._addloop`` in SR (Weyl value stepped by γ) with its decline flag
    combined by ``and``/``or``, as it was before 2026-12-04: short-circuit operators are
    branches in numba's IR, which LLVM did not fold back into selects here."""
    K.wide_vectors()
    nbad = 0
    z = _weyl(ukey, np.uint64(l0))
    for jj in range(o.size):
        s, e = P._sum_at(a, b, jj, False)
        v, ok = _fast32(s, _bits_weyl(z), SR)
        z += _G
        o[jj] = v
        nbad += 0 if (ok and (e == 0.0 or not (abs(s) < np.inf))) else 1
    return nbad


@njit(error_model="numpy")
def _round_indexed(h, o, ukey, l0):  # pragma: no cover - compiled
    """``pointwise._roundloop`` (float64 to binary32, op granularity's one rounding per
    op) in SR with each hash from its element's index."""
    K.wide_vectors()
    nbad = 0
    for jj in range(o.size):
        v, ok = _fast32(h[jj], _bits(ukey, np.uint64(l0 + jj)), SR)
        o[jj] = v
        nbad += 0 if ok else 1
    return nbad


@njit(error_model="numpy")
def _tile_indexed(op, a, b, o, ukey, l0):  # pragma: no cover - compiled
    """The indexed loops specialised by operation, as ``pointwise._tile`` is."""
    K.wide_vectors()
    if op == K.OP_MUL:
        return _mul_indexed(a, b, o, ukey, l0)
    if op == K.OP_ADD:
        return _add_indexed(a, b, o, ukey, l0)
    return _div_indexed(a, b, o, ukey, l0)


@njit(inline="always", error_model="numpy")
def _mulsub_term(sf, vc, xc, rmul, rsub):
    """``RND(xc − RND(sf·vc))`` in SR on the fast path, both roundings in one expression
    (``pointwise._fast32`` then ``pointwise.sub_term``): one element of the one-pass
    loops below, as ``pointwise.mulsub_term`` computed it until 2026-12-05."""
    p, okp = _fast32(sf * np.float64(vc), rmul, SR)
    q, oks = P.sub_term(xc, p, rsub, SR)
    return q, okp & oks


@njit(inline="always", error_model="numpy")
def _mulsub_variant(s, v, X, O, kmul, ksub, l0, bad, rm, rs, split):
    """``pointwise._mulsubloop`` in SR with both hashes from the element's index: drawn
    in the accumulating loop (``split`` False, as the loop was before the Weyl value
    became an induction) or first into the row buffers ``rm``, ``rs`` (``split`` True,
    a constant once inlined)."""
    R, N = O.shape
    nbad = 0
    for i in range(R):
        sf = np.float64(s[i])
        x = X[i]
        o = O[i]
        li = l0 + i * N
        if split:
            for c in range(N):
                r = np.uint64(li + c)
                rm[c] = _bits(kmul, r)
                rs[c] = _bits(ksub, r)
        nb = 0
        for c in range(N):
            if split:
                hm, hs = rm[c], rs[c]
            else:
                r = np.uint64(li + c)
                hm, hs = _bits(kmul, r), _bits(ksub, r)
            q, ok = _mulsub_term(sf, v[c], x[c], hm, hs)
            o[c] = q
            nb += 0 if ok else 1
        bad[i] = nb != 0
        nbad += nb
    return nbad


@njit(error_model="numpy")
def _mulsub_onepass(s, v, X, O, kmul, ksub, l0, bad):  # pragma: no cover - compiled
    """``pointwise._mulsub`` in SR as it was until 2026-12-05: each row in one pass, both
    roundings of a term (:func:`_mulsub_term`) with both Weyl values stepped by γ."""
    K.wide_vectors()
    R, N = O.shape
    nbad = 0
    for i in range(R):
        sf = np.float64(s[i])
        x = X[i]
        o = O[i]
        li = np.uint64(l0 + i * N)
        zm = _weyl(kmul, li)
        zs = _weyl(ksub, li)
        nb = 0
        for c in range(N):
            q, ok = _mulsub_term(sf, v[c], x[c], _bits_weyl(zm), _bits_weyl(zs))
            zm += _G
            zs += _G
            o[c] = q
            nb += 0 if ok else 1
        bad[i] = nb != 0
        nbad += nb
    return nbad


@njit(error_model="numpy")
def _mulsub_indexed(s, v, X, O, kmul, ksub, l0, bad, rm, rs):  # pragma: no cover - compiled
    K.wide_vectors()
    return _mulsub_variant(s, v, X, O, kmul, ksub, l0, bad, rm, rs, False)


@njit(error_model="numpy")
def _mulsub_split(s, v, X, O, kmul, ksub, l0, bad, rm, rs):  # pragma: no cover - compiled
    K.wide_vectors()
    return _mulsub_variant(s, v, X, O, kmul, ksub, l0, bad, rm, rs, True)


def _best(fns: dict, repeats: int, inner: int) -> dict:
    """Best time per call of each of ``fns``, interleaved: ``repeats`` rounds of ``inner``
    calls of each in turn."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t) / inner)
    return best


def _same(x, y) -> str:
    return "yes" if np.array_equal(x.view(np.uint32), y.view(np.uint32)) else "**no**"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    key = np.uint64(5)
    print("| loop (sr, binary32) | size | numvar G/s | torch G/s | numvar ÷ torch time "
          "| split G/s | split ÷ shipped time | same bits | indexed G/s "
          "| shipped speed-up | same bits |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|")
    n = 1024
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.empty(n)
    rb = np.empty(n, np.uint64)
    for name, op, tf in (("_tile product", K.OP_MUL, torch.mul), ("_tile sum", K.OP_ADD, torch.add),
                         ("_tile quotient", K.OP_DIV, torch.div)):
        o1, o2, o3 = np.empty_like(a), np.empty_like(a), np.empty_like(a)
        fns = {"shipped": lambda: P._tile(op, a, b, o1, key, 7, SR),
               "torch": lambda: tf(ta, tb, out=tout),
               "indexed": lambda: _tile_indexed(op, a, b, o3, key, 7)}
        if op != K.OP_DIV:  # no split variant of the quotient loop
            fns["split"] = lambda: _tile_split(op, a, b, o2, key, 7, rb)
        t = _best(fns, args.repeats, 50)
        t1 = t["shipped"]
        if op == K.OP_DIV:
            split = ratio = same = "—"
        else:
            split, ratio, same = f"{n / t['split'] / 1e9:.3f}", f"{t['split'] / t1:.2f}", _same(o1, o2)
        print(f"| {name} | {n} | {n / t1 / 1e9:.3f} | {n / t['torch'] / 1e9:.3f} | "
              f"{t1 / t['torch']:.1f} | {split} | {ratio} | {same} | "
              f"{n / t['indexed'] / 1e9:.3f} | {t['indexed'] / t1:.2f} | {_same(o1, o3)} |")
    h = (a.astype(np.float64) * b).astype(np.float64) / 3.0  # float64 values to round
    o1, o3 = np.empty_like(a), np.empty_like(a)
    th = torch.from_numpy(h)
    t = _best({"shipped": lambda: P._roundtile(h, o1, key, 7, 1, SR),
               "torch": lambda: tout.copy_(th),
               "indexed": lambda: _round_indexed(h, o3, key, 7)}, args.repeats, 50)
    t1 = t["shipped"]
    print(f"| _roundtile (float64 to binary32) | {n} | {n / t1 / 1e9:.3f} | "
          f"{n / t['torch'] / 1e9:.3f} | {t1 / t['torch']:.1f} | — | — | — | "
          f"{n / t['indexed'] / 1e9:.3f} | {t['indexed'] / t1:.2f} | {_same(o1, o3)} |")
    for R, N in ((64, 64), (16, 1024)):
        s = rng.standard_normal(R).astype(np.float32)
        v = rng.standard_normal(N).astype(np.float32)
        X = rng.standard_normal((R, N)).astype(np.float32)
        O1, O2, O3 = np.empty_like(X), np.empty_like(X), np.empty_like(X)
        bad = np.empty(R, np.bool_)
        rm, rs = np.empty(N, np.uint64), np.empty(N, np.uint64)
        pr = np.empty(N, np.float32)
        k1, k2 = np.uint64(1), np.uint64(2)
        tx, ts, tv, to = (torch.from_numpy(X), torch.from_numpy(s)[:, None],
                          torch.from_numpy(v)[None, :], torch.empty(R, N))
        t = _best({"shipped": lambda: P._mulsub(s, v, X, O1, k1, k2, 3, SR, bad, pr),
                   "split": lambda: _mulsub_split(s, v, X, O2, k1, k2, 3, bad, rm, rs),
                   "indexed": lambda: _mulsub_indexed(s, v, X, O3, k1, k2, 3, bad, rm, rs),
                   "torch": lambda: torch.addcmul(tx, ts, tv, value=-1, out=to)},
                  args.repeats, 20)
        t1, w = t["shipped"], R * N
        print(f"| _mulsub | {R} × {N} | {w / t1 / 1e9:.3f} | {w / t['torch'] / 1e9:.3f} | "
              f"{t1 / t['torch']:.1f} | {w / t['split'] / 1e9:.3f} | {t['split'] / t1:.2f} | "
              f"{_same(O1, O2)} | {w / t['indexed'] / 1e9:.3f} | {t['indexed'] / t1:.2f} | "
              f"{_same(O1, O3)} |")
    print()
    print("| sum tile (sr, binary32) | size | bitwise flags (shipped) G/s | and/or flags G/s "
          "| shipped speed-up | same bits |")
    print("|---|---:|---:|---:|---:|---|")
    for n in (1024, 16384):  # (on 1 024 elements a call's own overhead is a large part)
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        o1, o2 = np.empty_like(a), np.empty_like(a)
        inner = max(1, 50 * 1024 // n)
        t = _best({"shipped": lambda: P._tile(K.OP_ADD, a, b, o1, key, 7, SR),
                   "andor": lambda: _add_andor(a, b, o2, key, 7)}, args.repeats, inner)
        print(f"| sum | {n} | {n / t['shipped'] / 1e9:.3f} | {n / t['andor'] / 1e9:.3f} | "
              f"{t['andor'] / t['shipped']:.2f} | {_same(o1, o2)} |")
    _passes_table(rng, args.repeats)
    _broadcast_table(rng, args.repeats, key)


def _passes_table(rng, repeats: int) -> None:
    """:func:`main`'s third table: ``pointwise._mulsub`` (two passes per row) against the
    one-pass loop it replaced, on the block shapes of a 64 × 64 LU and triangular solve."""
    print()
    print("| _mulsub (sr, binary32) | rows × columns | one pass G/s | two passes (shipped) G/s "
          "| speed-up | same bits |")
    print("|---|---|---:|---:|---:|---|")
    for R, N in ((64, 64), (16, 1024), (63, 20), (20, 40), (40, 8)):
        s = rng.standard_normal(R).astype(np.float32)
        v = rng.standard_normal(N).astype(np.float32)
        X = rng.standard_normal((R, N)).astype(np.float32)
        O1, O2 = np.empty_like(X), np.empty_like(X)
        bad1, bad2 = np.empty(R, np.bool_), np.empty(R, np.bool_)
        pr = np.empty(N, np.float32)
        k1, k2 = np.uint64(1), np.uint64(2)
        t = _best({"two": lambda: P._mulsub(s, v, X, O1, k1, k2, 3, SR, bad1, pr),
                   "one": lambda: _mulsub_onepass(s, v, X, O2, k1, k2, 3, bad2)}, repeats, 20)
        w = R * N
        same = _same(O1, O2) if np.array_equal(bad1, bad2) else "**no**"
        print(f"| _mulsub | {R} × {N} | {w / t['one'] / 1e9:.3f} | {w / t['two'] / 1e9:.3f} | "
              f"{t['one'] / t['two']:.2f} | {same} |")


def _layouts(rng, n: int) -> list:
    """(name, operands as binary32_tensors takes them (a Python number for the scalar
    kernel), their materialised form) for :func:`main`'s fourth table, n elements each."""
    M = n // 256
    a = torch.from_numpy(rng.standard_normal((M, 256)).astype(np.float32))
    row = torch.from_numpy(rng.standard_normal(192).astype(np.float32))
    col = torch.from_numpy(rng.standard_normal((M, 1)).astype(np.float32))
    wide = torch.from_numpy(rng.standard_normal((M, 300)).astype(np.float32))
    x192 = torch.from_numpy(rng.standard_normal((n // 192, 192)).astype(np.float32))
    one = torch.tensor(0.7)
    return [
        ("same shape, contiguous", (a, a.flip(0).contiguous()), None),
        ("a number", (a, 0.7), (a, torch.full_like(a, 0.7))),
        ("one element expanded", (a, one.expand(M, 256)), (a, torch.full_like(a, 0.7))),
        ("a bias row (N = 192)", (x192, row), (x192, row.expand_as(x192).contiguous())),
        ("a column (M, 1)", (a, col), (a, col.expand_as(a).contiguous())),
        ("sliced rows", (wide[:, 20:276], a), (wide[:, 20:276].contiguous(), a)),
    ]


def _broadcast_table(rng, repeats: int, key) -> None:
    """:func:`main`'s fourth table (module docstring)."""
    n = 1 << 16
    print()
    print("| layout (sr, binary32 product) | numvar G/s | ÷ same-shape time | torch G/s "
          "| numvar ÷ torch time | same bits as materialised |")
    print("|---|---:|---:|---:|---:|---|")
    ref = None
    for name, (x, y), full in _layouts(rng, n):
        out = torch.empty(torch.broadcast_shapes(x.shape, getattr(y, "shape", ())))
        if isinstance(y, float):
            def fn(x=x, y=y, out=out):
                P.scalar32_tensor(K.OP_MUL, x, y, True, out, int(key), SR)
        else:
            def fn(x=x, y=y, out=out):
                P.binary32_tensors(K.OP_MUL, x, y, out, int(key), SR)
        tout = torch.empty_like(out)
        t = _best({"numvar": fn, "torch": lambda x=x, y=y, o=tout: torch.mul(x, y, out=o)},
                  repeats, 5)
        fn()
        if full is None:
            ref, same = t["numvar"], "—"
        else:
            want = torch.empty_like(out)
            P.binary32_tensors(K.OP_MUL, full[0], full[1], want, int(key), SR)
            same = _same(out.numpy(), want.numpy())
        print(f"| {name} | {n / t['numvar'] / 1e9:.3f} | {t['numvar'] / ref:.2f} | "
              f"{n / t['torch'] / 1e9:.3f} | {t['numvar'] / t['torch']:.1f} | {same} |")


if __name__ == "__main__":
    main()
