"""Where a binary32 SR clean-row step's cycles go: the term-bits loop and the accumulating
loop of ``kernels._clean_loops`` timed apart, and the accumulating loop without its
exactness test.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_clean_loops.py \\
        [--k 288] [--n 320] [--repeats 15]

Every k ≥ 1 step of a clean row tile (``kernels._clean_loops``, SR, 24 bits) runs, where
``kernels.CLEAN_LOOPS_BITS_APART`` holds (no AVX-512DQ, or AMD Zen 4), two vectorised
loops over the tile's n columns: ``_term_bits_row`` (the terms' random bits into a row
buffer) and the accumulating loop (``_clean_step``: the product rounded, the float64
sum, its exactness test ``s − c == p and s − p == c``, the sum rounded, a NaN where the
test fails); elsewhere (Intel's AVX-512DQ cores) one loop, the bits drawn inside the
accumulating one (``kernels._term_r``), and the two split rows below price the parts of
the split form. This script runs, on one row tile held in L1 (K × n, values in [0.5,
1)), one thread, the best of ``--repeats`` rounds by thread CPU time, in cycles per 8
terms at the clock ``bench_pipes.clock_hz`` measures:

- **both loops**: the shipped ``_clean_loops`` (``contract`` spends its time here; one
  fused loop where ``CLEAN_LOOPS_BITS_APART`` is false);
- **term bits**: ``_term_bits_row``'s loop for every step;
- **accumulating**: the accumulating loop for every step, on fixed bits;
- **accumulating, one comparison**: the same with only ``s − c == p`` (not a valid test:
  it misses inexact sums where ``|p| > |c|``; timed to price the second comparison);
- **accumulating, no test**: the same with neither comparison nor the NaN: what the
  rounding arithmetic alone costs.

Each loop's port-bound ceiling (``bench_kernels.port_bound_cycles``: its instructions
with their dependencies cut) is printed beside it where the loop is found in the
kernel's machine code. The script checks that "both loops" gives the kernel's bits
(against ``_clean_loops`` compiled for the kernel) and that no lane was declined.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit

from numvar.instrument import kernels as KN

_SR, _UD_MIN = KN._SR, KN._UD_MIN
_f64_bits, _bits_f64 = KN._f64_bits, KN._bits_f64


@njit(cache=True)
def both_loops(acc, jg, arow, bmat, ukey, base, n):  # pragma: no cover - compiled
    KN._wide_vectors()  # as the kernel (_clean32): 512-bit vectors where the CPU has them
    KN._clean_loops(acc, jg, arow, bmat, ukey, base, 0, n, _SR, 24)


@njit(cache=True)
def kernel_step(acc, jg, arow, bmat, ukey, base, n, mode):  # pragma: no cover - compiled
    # the kernel's clean step as contract calls it: the column offset as the constant 0
    # (typed literal(0), the signature tests/_warmup.py caches; called from Python the
    # 0 would be an int64 and compile a second copy of _clean32, 33 s on a cold cache)
    KN._clean32(acc, jg, arow, bmat, ukey, base, 0, n, mode)


@njit(cache=True)
def term_bits(rb, jg, arow, ukey, base, n):  # pragma: no cover - compiled
    KN._wide_vectors()
    for k in range(1, arow.size):
        hk = KN._bits(ukey, base + np.uint64(k))
        for jj in range(n):  # _term_bits_row's loop (a no-op where the kernel fuses it)
            rb[jj] = KN._mix(hk + jg[jj])


@njit(inline="always")
def _full_step(c, p, r):
    """The kernel's step (``kernels._clean_step``)."""
    return KN._clean_step(c, p, r, _SR, 24, False, _UD_MIN)


@njit(inline="always")
def _one_comparison_step(c, p, r):
    """The step with only ``s − c == p`` (not a valid test: it misses inexact sums where
    ``|p| > |c|``)."""
    p = KN._round_term(p, r, _SR, 24, False)
    s = c + p
    v = KN._round_term(s, r, _SR, 24, True)
    return v if s - c == p else np.nan


@njit(inline="always")
def _untested_step(c, p, r):
    """The step's roundings alone: no exactness test, no NaN."""
    return KN._round_term(c + KN._round_term(p, r, _SR, 24, False), r, _SR, 24, True)


def _accumulating(step):
    """The accumulating loop of every k ≥ 1 step with ``step`` (one of the above) on the
    fixed bits ``rb``."""
    @njit
    def loop(acc, rb, arow, bmat, n):  # pragma: no cover - compiled
        KN._wide_vectors()
        for k in range(1, arow.size):
            ak = np.float64(arow[k])
            bk = bmat[k, 0:n]
            for jj in range(n):
                acc[jj] = step(acc[jj], ak * np.float64(bk[jj]), rb[jj])
    return loop


accumulating = _accumulating(_full_step)
accumulating_one_comparison = _accumulating(_one_comparison_step)
accumulating_no_test = _accumulating(_untested_step)


def _cycles(fn, terms: int, clock: float, repeats: int, reps: int = 20) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.thread_time() - t0) / reps)
    return best * clock / terms * 8


LOOPS = ("both loops (the kernel's step)", "term bits", "accumulating",
         "accumulating, one comparison", "accumulating, no test")


def measure(K: int = 288, n: int = 320, repeats: int = 15, clock: float | None = None,
            loops=LOOPS):
    """Rows (label, cycles per 8 terms) of ``loops`` (labels of :data:`LOOPS`), and
    whether "both loops" gave the kernel's bits with no lane declined (checked whatever
    ``loops`` holds)."""
    if clock is None:
        from bench_pipes import clock_hz

        clock = clock_hz()
    rng = np.random.default_rng(0)
    arow = rng.uniform(0.5, 1.0, K).astype(np.float32)
    bmat = rng.uniform(0.5, 1.0, (K, n))  # b widened to float64, as contract passes it
    jg = np.arange(n, dtype=np.uint64) * np.uint64(KN._G)
    ukey, base = np.uint64(7), np.uint64(0)
    rb = np.empty(n, np.uint64)
    KN._term_bits_row(rb, KN._bits(ukey, base + np.uint64(1)), jg, n, _SR, True)
    mine, ref = np.empty(n), np.empty(n)
    both_loops(mine, jg, arow, bmat, ukey, base, n)
    kernel_step(ref, jg, arow, bmat, ukey, base, n, _SR)
    ok = np.array_equal(mine.view(np.uint64), ref.view(np.uint64)) and not np.isnan(mine).any()
    acc = np.ones(n)

    def accumulate(fn):
        def run():
            acc.fill(1.0)
            fn(acc, rb, arow, bmat, n)
        return run

    runs = dict(zip(LOOPS, (
        lambda: both_loops(acc, jg, arow, bmat, ukey, base, n),
        lambda: term_bits(rb, jg, arow, ukey, base, n),
        accumulate(accumulating), accumulate(accumulating_one_comparison),
        accumulate(accumulating_no_test))))
    terms = (K - 1) * n
    return [(label, _cycles(runs[label], terms, clock, repeats)) for label in loops], ok


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=288, help="steps (K) of the row tile")
    ap.add_argument("--n", type=int, default=320, help="columns of the row tile")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    numba.set_num_threads(1)
    from bench_kernels import clean_loop_asm, port_bound_cycles, step_loops, \
        terms_per_iteration
    from bench_pipes import clock_hz

    clock = clock_hz()
    rows, ok = measure(args.k, args.n, args.repeats, clock)
    bound = {}
    try:
        loops = step_loops(clean_loop_asm())  # [term bits, accumulating], or one fused loop
        per8 = [port_bound_cycles(b) * 8 / terms_per_iteration(b) for b in loops]
        bound["both loops (the kernel's step)"] = sum(per8)
        if len(per8) == 2:
            bound["term bits"], bound["accumulating"] = per8
    except (RuntimeError, AttributeError, SystemExit) as e:  # no AVX2 / AVX-512 loop
        print(f"(no port-bound ceiling on this host: {e})")
    print(f"clock {clock / 1e9:.2f} GHz; one row tile of K = {args.k} × n = {args.n}, "
          f"one thread, best of {args.repeats}; same bits as the kernel, no lane declined: "
          f"{'yes' if ok else 'NO'}")
    print("| loop | cycles per 8 terms | port-bound ceiling | of ceiling |")
    print("|---|---:|---:|---:|")
    for label, cyc in rows:
        b = bound.get(label)
        extra = f"{b:.2f} | {100 * b / cyc:.0f} %" if b else "— | —"
        print(f"| {label} | {cyc:.2f} | {extra} |")


if __name__ == "__main__":
    main()
