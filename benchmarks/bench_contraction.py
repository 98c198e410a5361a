"""What ``contraction="fma"`` gains on a contraction-bound model (one thread).

    python benchmarks/bench_contraction.py [--repeats 5] [--batch 4] [--threads 1]

A residual CNN (a 3×3 stem to 32 channels, then 3 residual blocks of two 32-channel 3×3
convolutions with ReLU, on 32×32 inputs, global average pool, linear head): almost all of
its flop-level time is in the contraction kernel. Prints native time, then flop SR with
``contraction="separate"`` (the default: every product and add rounded) and ``"fma"``
(one rounding per multiply-add) as ratios to native, best of ``--repeats``, in one run.
"""

from __future__ import annotations

import argparse
import time

import numba
import torch
import torch.nn as nn
import torch.nn.functional as F

from numvar.instrument import fuzzy


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return F.relu(x + self.c2(F.relu(self.c1(x))))


class ResCNN(nn.Module):
    def __init__(self, c=32, blocks=3, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[Block(c) for _ in range(blocks)])
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.blocks(F.relu(self.stem(x)))
        return self.head(x.mean((2, 3)))


def _best(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, x = ResCNN().eval(), torch.randn(args.batch, 3, 32, 32)
    with torch.no_grad():
        native = _best(lambda: model(x), args.repeats)
        cells = {}
        for con in ("separate", "fma"):
            def run(con=con):
                with fuzzy(mode="sr", granularity="flop", seed=0, contraction=con):
                    model(x)
            cells[con] = _best(run, args.repeats)
    print(f"residual CNN b{args.batch}x3x32x32, 32 channels, threads {args.threads}, "
          f"best of {args.repeats}")
    print(f"native {native * 1e3:.2f} ms; flop sr separate {cells['separate'] / native:.1f}x; "
          f"flop sr fma {cells['fma'] / native:.1f}x; fma speed-up "
          f"{cells['separate'] / cells['fma']:.2f}x")


if __name__ == "__main__":
    main()
