"""Ops at flop SR whose float64 sums are inexact, against the same ops on ordinary data.

A binary32 sum computed in float64 is exact unless one term lies more than 29 binades
below the other: a product of an activation's tiny tail (GELU's left tail, a saturated
sigmoid, a softmax probability) added to an O(1) sum, or an FFT's products by the tiny
parts of its twiddles. The fast paths decline such sums, and what declines takes a slower
path: the residual loop of the elementwise tiles, or, in a contraction, the full path for
each output element whose sum gave up. Each case is timed under
``numvar.fuzzy(mode="sr", granularity="flop", seed=0)`` and natively, best of
``--repeats`` rounds of ``--calls`` calls, by the thread's CPU time (one thread); ratios
to native in the same run. Run it on two trees (``PYTHONPATH=TREE/src``) to compare them.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_inexact.py [--repeats 9]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from bench_declines import _best  # (thread CPU time per call, best of repeats)

from numvar.instrument import fuzzy

g = torch.Generator().manual_seed(0)
_W = torch.randn(128, 512, generator=g) * 0.05
_B = torch.randn(128, generator=g) * 0.05
_A = torch.randn(128, 512, generator=g)
_A_TINY = _A.clone()
_A_TINY[:, 7] = 1e-12  # one tiny activation in every row: every output of the row
_A_GELU = F.gelu(torch.randn(128, 512, generator=g) * 3 - 3)  # tails down to ~1e-30
_X = torch.randn(32, 4096, generator=g)
_Y = torch.randn(32, 4096, generator=g)
_Y_TINY = _Y * 1e-12  # every sum inexact
_S = torch.randn(32, 256, generator=g)

CASES = {
    "linear (128, 512) @ (512, 128), normal activations": lambda: F.linear(_A, _W, _B),
    "the same, one activation of 1e-12 in every row": lambda: F.linear(_A_TINY, _W, _B),
    "the same, GELU(3·N(0,1) − 3) activations": lambda: F.linear(_A_GELU, _W, _B),
    "add (32, 4096), normal": lambda: _X + _Y,
    "add (32, 4096), the second 1e-12 times smaller": lambda: _X + _Y_TINY,
    "rfft of 32 real rows of 256": lambda: torch.fft.rfft(_S),
    "rfft of 32 complex rows of 256 (fft)": lambda: torch.fft.fft(_S.to(torch.complex64)),
}


def measure(op, repeats: int, calls: int) -> tuple[float, float]:
    """(native, flop SR) seconds per call."""
    with torch.no_grad():
        native = _best(op, repeats, calls)
        with fuzzy(mode="sr", granularity="flop", seed=0):
            flop = _best(op, repeats, calls)
    return native, flop


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=5, help="calls per timed round")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("| op | native µs | flop SR µs | flop ÷ native |")
    print("|---|---:|---:|---:|")
    for name, op in CASES.items():
        n, f = measure(op, args.repeats, args.calls)
        print(f"| {name} | {n * 1e6:.1f} | {f * 1e6:.1f} | {f / n:.1f}× |")


if __name__ == "__main__":
    main()
