"""Cost of ``numvar locate`` on a small MLP with one ill-conditioned layer.

Prints, per granularity: candidates, evaluations, realizations spent vs the documented
bound, wall time, and the time per realization as a ratio to one plain PyTorch forward
measured in the same run. Usage: ``python benchmarks/bench_locate.py [--n 6]``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from numvar.locate import locate


class Cancel(nn.Module):
    def forward(self, x):
        return (x + 2.0**14) - 2.0**14


def build(width: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), Cancel(), nn.Linear(width, width),
                         nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, 10)).eval()


def plain_forward_s(model: nn.Module, x: torch.Tensor, reps: int = 200) -> float:
    with torch.no_grad():
        for _ in range(10):
            model(x)
        t0 = time.perf_counter()
        for _ in range(reps):
            model(x)
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    model = build()
    x = torch.randn(args.batch, 64, generator=torch.Generator().manual_seed(0))
    base = plain_forward_s(model, x)
    print(f"plain forward: {base * 1e6:.1f} us (batch {args.batch}, 8 layers)")
    for gran in ("op", "flop"):
        # warm-up (numba compilation / cache loading), not timed
        locate(model, x, n=2, granularity=gran, ddmin=False, necessity=False, layers=False)
        t0 = time.perf_counter()
        res = locate(model, x, n=args.n, granularity=gran)
        wall = time.perf_counter() - t0
        per = wall / max(1, res.realizations + res.reference_runs)
        print(f"{gran:>4}: {len(res.candidates)} candidates, top {res.ranked[0].name} "
              f"({res.candidate(res.ranked[0].name).cls}), ddmin {res.dd.minimal if res.dd else None}, "
              f"{res.evaluations} evaluations, {res.realizations} realizations "
              f"(bound {res.bound}), {wall:.2f} s, {per * 1e3:.2f} ms/realization = "
              f"{per / base:.0f}x a plain forward")


if __name__ == "__main__":
    main()
