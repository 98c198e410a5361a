"""Cost of ``network_bounds`` against one plain PyTorch forward, in the same run.

    PYTHONPATH=src python benchmarks/bench_bounds.py

network_bounds runs, per layer, the computed value, a float64 reference and the
data-dependent bound (two float64 |W| convolutions): a few plain forwards' worth.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_bounds_network import TinyResNet, mlp_784_512_512_10  # noqa: E402

from numvar.bounds import network_bounds  # noqa: E402


def best(fn, reps=5):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    torch.manual_seed(0)
    cases = [("MLP 784-512-512-10, batch 128", mlp_784_512_512_10(),
              torch.rand(128, 1, 28, 28)),
             ("tiny ResNet, 8x3x64x64", TinyResNet(), torch.rand(8, 3, 64, 64))]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for name, model, x in cases:
        model.eval()
        with torch.no_grad():
            t_plain = best(lambda: model(x))
        for prec in ("fp32", "bf16-mixed"):
            t_b = best(lambda: network_bounds(model, x, precision=prec, input_bound=1.0), 3)
            print(f"{name:32s} {prec:10s} plain {t_plain * 1e3:8.2f} ms  bounds "
                  f"{t_b * 1e3:8.2f} ms  ratio {t_b / t_plain:6.1f}x")


if __name__ == "__main__":
    main()
