"""Overhead of the determinism tools on a small CNN training step (forward + backward),
as ratios against plain PyTorch measured in the same run (best-of-N process CPU time,
one intra-op thread by default, so that a busy machine does not distort the ratios).

    PYTHONPATH=src python benchmarks/bench_determinism.py [--batch 32] [--repeat 20]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from numvar.determinism import BitwiseEquivalenceMode, HashMode, ObserverContext, observe


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = observe("features", F.dropout(x, 0.25, self.training))
        return self.fc(x.flatten(1))


class Identity(TorchDispatchMode):
    """The floor: any Python dispatch mode costs this much per op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def step(model, x, y, ctx) -> None:
    with ctx():
        loss = F.cross_entropy(model(x), y)
        loss.backward()


def timeit(model, x, y, ctx, repeat) -> float:
    step(model, x, y, ctx)  # warm up
    best = float("inf")
    for _ in range(repeat):  # CPU time of this process: robust on a shared machine
        t = time.process_time()
        step(model, x, y, ctx)
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Net()
    x, y = torch.randn(a.batch, 1, 28, 28), torch.randint(0, 10, (a.batch,))
    tmp = tempfile.mkdtemp()
    cases = {
        "plain": contextlib.nullcontext,
        "identity dispatch mode": Identity,
        "HashMode": HashMode,
        "HashMode(record_stacks)": lambda: HashMode(record_stacks=True),
        "BitwiseEquivalenceMode": BitwiseEquivalenceMode,
        "ObserverContext (1 observe)": lambda: ObserverContext(tmp, "bench"),
    }
    base = None
    print(f"small CNN, batch {a.batch}, forward+backward, best of {a.repeat}, "
          f"{torch.get_num_threads()} thread(s), CPU time")
    for name, ctx in cases.items():
        t = timeit(model, x, y, ctx, a.repeat)
        base = base or t
        print(f"  {name:28s} {t * 1e3:8.2f} ms  {t / base:6.2f}x")


if __name__ == "__main__":
    main()
