"""Stream keys drawn for many rounding calls at once: the compiled draws against the numpy
and Python ones they replaced, and whole flop forwards with either.

Compiled paths that stand for many rounding calls (the FFT, LU and triangular-solve
kernels; the fused layer norm, softmax and grid sampling; complex products) draw those
calls' stream keys beforehand. This script times, one thread, thread CPU time:

- ``Stream.keys(n)`` (one compiled call, ``rounding.kernels.keys64``, from two keys on)
  against the draw it replaced (a Python loop of ``next_key`` up to 12 keys, numpy's
  wrapping uint64 arithmetic above), µs per call, best of ``--repeats`` rounds of 2 000
  calls;
- ``linalg_kernels.keys`` (one compiled call, ``_flagged_keys``) against the reference
  ``linalg_kernels.stream_keys`` on the stacked flags (the shipped draw before
  2026-12-05), for a 256-point FFT's stage flags and a 64 × 64 LU's column flags;
- with ``--models``, whole flop SR forwards of zoo entries with the old draws and the new
  ones swapped in and out of one process, interleaved, best (median) of ``--rounds``,
  against native in the same process; the outputs are compared bit for bit.

Every row checks that both draws return the same keys and leave the stream at the same
counter. Time is not asserted anywhere: this prints.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_keys.py \
        [--repeats 5] [--models fft_filter linear_solve] [--rounds 40]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numba
import numpy as np
import torch

import numvar
from numvar.instrument import fft as FT
from numvar.instrument import linalg_kernels as LK
from numvar.rounding import _stream as S

_G, _M1, _M2 = np.uint64(S.GAMMA), np.uint64(S.MIX1), np.uint64(S.MIX2)


def old_stream_keys(self, n: int) -> np.ndarray:
    """``Stream.keys`` before 2026-12-05: ``next_key`` in a loop up to 12 keys, numpy's
    wrapping uint64 arithmetic above."""
    if n <= 12:
        return np.array([self.next_key() for _ in range(n)], dtype=np.uint64)
    i = np.arange(self.counter + 1, self.counter + 1 + n, dtype=np.uint64)
    self.counter += n
    with np.errstate(over="ignore"):
        z = np.uint64(self._base) + i * _G
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def old_flagged_keys(ctx, *flags) -> np.ndarray:
    """``linalg_kernels.keys`` before 2026-12-05: the reference on the stacked flags, with
    the old ``Stream.keys``."""
    flags = np.stack(flags, 1).astype(bool, copy=False)
    out = np.zeros(flags.shape[::-1], np.uint64)
    out.T[flags] = old_stream_keys(ctx.stream, int(np.count_nonzero(flags)))
    return out


class _Ctx:
    def __init__(self, seed: int) -> None:
        self.stream = S.Stream(seed)


def _per_call(fn, repeats: int, calls: int = 2000) -> float:
    """µs per call, best of ``repeats`` rounds of ``calls`` (thread CPU time)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / calls / 1e3)
    return best


def draws_table(repeats: int) -> None:
    print("| draw | keys | before, µs | after, µs | speed-up | same keys |")
    print("|---|---:|---:|---:|---:|---|")
    for n in (2, 6, 14, 22, 192):
        a, b = S.Stream(7), S.Stream(7)
        same = (S.Stream.keys(a, n).tolist() == old_stream_keys(b, n).tolist()
                and a.counter == b.counter)
        new = _per_call(lambda: S.Stream.keys(a, n), repeats)
        old = _per_call(lambda: old_stream_keys(b, n), repeats)
        print(f"| `Stream.keys` | {n} | {old:.2f} | {new:.2f} | {old / new:.2f} | "
              f"{'yes' if same else 'NO'} |")
    h1, every = FT._stage_flags(256)
    j = np.arange(64)
    upd = j + 1 < 64
    for name, flags in (("a 256-point FFT's stages", (h1, h1, every)),
                        ("a 64 × 64 LU's columns", (j + 1 < 64, upd, upd))):
        n = int(sum(np.count_nonzero(f) for f in flags))
        a, b = _Ctx(7), _Ctx(7)
        same = (LK.keys(a, *flags).tolist() == old_flagged_keys(b, *flags).tolist()
                and a.stream.counter == b.stream.counter)
        new = _per_call(lambda: LK.keys(a, *flags), repeats)
        old = _per_call(lambda: old_flagged_keys(b, *flags), repeats)
        print(f"| `linalg_kernels.keys`, {name} | {n} | {old:.2f} | {new:.2f} | "
              f"{old / new:.2f} | {'yes' if same else 'NO'} |")


@contextlib.contextmanager
def _draws(old: bool):
    saved = S.Stream.keys, LK.keys
    if old:
        S.Stream.keys, LK.keys = old_stream_keys, old_flagged_keys
    try:
        yield
    finally:
        S.Stream.keys, LK.keys = saved


def models_table(names, rounds: int) -> None:
    from numvar.workloads import zoo

    print()
    print("| model | native ms | old draws ms | new draws ms | saved ms | saved ÷ native | "
          "same bits |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in names:
        built = zoo.build(name, "bench")
        model, inputs = built.model.eval(), built.inputs

        def flop():
            with torch.no_grad(), numvar.fuzzy(mode="sr", granularity="flop", seed=0):
                out = model(*inputs)
            return out if isinstance(out, torch.Tensor) else out[0]

        def native():
            with torch.no_grad():
                model(*inputs)

        with _draws(True):
            o_old = flop()
        o_new = flop()
        same = torch.equal(o_old, o_new)
        times = {"old": [], "new": [], "native": []}
        for _ in range(rounds):
            for k in times:
                t0 = time.thread_time_ns()
                if k == "native":
                    native()
                else:
                    with _draws(k == "old"):
                        flop()
                times[k].append((time.thread_time_ns() - t0) / 1e6)
        q = {k: (min(v), sorted(v)[len(v) // 2]) for k, v in times.items()}
        saved = q["old"][0] - q["new"][0]
        print(f"| {name} | {q['native'][0]:.3f} | {q['old'][0]:.3f} ({q['old'][1]:.3f}) | "
              f"{q['new'][0]:.3f} ({q['new'][1]:.3f}) | {saved:.3f} | "
              f"{saved / q['native'][0]:.2f} | {'yes' if same else 'NO'} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=[],
                    help="zoo entries to time whole flop forwards of (e.g. fft_filter "
                    "linear_solve transformer_encoder norms)")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    draws_table(args.repeats)
    if args.models:
        models_table(args.models, args.rounds)


if __name__ == "__main__":
    main()
