"""Depthwise convolutions at op granularity: PyTorch's float64 convolution against
numvar's float64 kernel (``numvar.instrument.depthwise``), the same value; with
``--flop``, at flop granularity: the im2col route against the group products without
the matrix (``numvar.instrument.conv_kernels``), the same bits.

Op SR rounds each convolution's float64 result once; for a depthwise convolution that
result came from PyTorch's CPU float64 path, one ``slow_conv2d`` per channel. Per layer
shape of the zoo's EfficientNet and MobileNet blocks (batch 2), one forward each, the
best of ``--repeats`` rounds (CPU time of the calling thread at one thread, wall time
otherwise):

- **native**: the binary32 convolution (oneDNN);
- **torch f64**: the float64 copies and PyTorch's float64 convolution (op SR's route
  before, ``USE_KERNEL = False``), and **value64**: ``depthwise.value64`` (its route now),
  both as ratios to native;
- **op SR before / now**: the convolution under ``fuzzy(mode="sr", granularity="op")``
  with ``USE_KERNEL`` off and on, ratios to native, and whether the two give the same
  bits.

With ``--flop``: **native**, then **flop SR before / now**: the convolution under
``fuzzy(mode="sr", granularity="flop")`` with ``conv_kernels.USE_KERNEL`` off (the
im2col matrix, ``flop._group_cols``, then ``kernels.contract``) and on, ratios to native,
and whether the two give the same bits.

    python benchmarks/bench_depthwise.py [--repeats 7] [--threads 1] [--flop]
"""

from __future__ import annotations

import argparse
import time

import numba
import torch

from numvar.instrument import conv_kernels as CK
from numvar.instrument import depthwise as DW
from numvar.instrument import fuzzy

CONV = torch.ops.aten.convolution.default
#: (channels, map size, kernel, stride) of the zoo's depthwise layers
SHAPES = ((32, 32, 3, 1), (96, 32, 3, 2), (144, 16, 3, 1), (144, 16, 5, 2), (240, 8, 3, 1),
          (480, 4, 5, 1), (672, 4, 5, 1))


def _best(fn, repeats: int, clock) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        for _ in range(5):
            fn()
        best = min(best, (clock() - t0) / 5)
    return best


def _sr(args, use: bool, granularity: str = "op"):
    """The convolution under ``fuzzy(mode="sr")`` at ``granularity`` with its kernel
    (op: ``depthwise.USE_KERNEL``; flop: ``conv_kernels.USE_KERNEL``) on or off."""
    owner = DW if granularity == "op" else CK
    owner.USE_KERNEL = use
    try:
        with torch.no_grad(), fuzzy(mode="sr", granularity=granularity, seed=0):
            return CONV(*args)
    finally:
        owner.USE_KERNEL = True


def _times(x, w, args, repeats: int, clock, flop: bool) -> list[float]:
    """native, then torch f64, value64, op SR before, op SR now; or (``flop``) flop SR
    before, flop SR now (seconds)."""
    native = _best(lambda: CONV(*args), repeats, clock)
    if flop:
        return [native, _best(lambda: _sr(args, False, "flop"), repeats, clock),
                _best(lambda: _sr(args, True, "flop"), repeats, clock)]
    return [native,
            _best(lambda: CONV(x.double(), w.double(), *args[2:]), repeats, clock),
            _best(lambda: DW.value64(*args), repeats, clock),
            _best(lambda: _sr(args, False), repeats, clock),
            _best(lambda: _sr(args, True), repeats, clock)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch and numba threads")
    ap.add_argument("--flop", action="store_true",
                    help="flop granularity: the im2col route against conv_kernels")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    g = torch.Generator().manual_seed(0)
    gran = "flop" if a.flop else "op"
    print(f"threads {a.threads}; times in µs, ratios to native\n")
    if a.flop:
        print("| channels, map, kernel, stride | native µs | flop SR before | flop SR now |"
              " same bits |")
        print("|---|---:|---:|---:|---|")
    else:
        print("| channels, map, kernel, stride | native µs | torch f64 | value64 |"
              " op SR before | op SR now | same bits |")
        print("|---|---:|---:|---:|---:|---:|---|")
    tot = None
    for c, h, k, s in SHAPES:
        x = torch.randn(2, c, h, h, generator=g)
        w = torch.randn(c, 1, k, k, generator=g)
        args = (x, w, None, [s, s], [k // 2, k // 2], [1, 1], False, [0, 0], c)
        nat, *t = _times(x, w, args, a.repeats, clock, a.flop)
        same = torch.equal(_sr(args, False, gran), _sr(args, True, gran))
        tot = [u + v for u, v in zip(tot, [nat, *t])] if tot else [nat, *t]
        print(f"| {c}, {h}×{h}, {k}×{k}, {s} | {nat * 1e6:.0f} | "
              + " | ".join(f"{v / nat:.1f}×" for v in t) + f" | {'yes' if same else 'NO'} |")
    print(f"| all | {tot[0] * 1e6:.0f} | " + " | ".join(f"{v / tot[0]:.1f}×" for v in tot[1:])
          + " | |")


if __name__ == "__main__":
    main()
