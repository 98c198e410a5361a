"""Speed of the analysis, as ratios against plain PyTorch reductions in the same run.

    PYTHONPATH=src python benchmarks/bench_analysis.py [--elements 1000000] [--r 10]

Prints the time of ``significant_digits`` and ``analyze`` on one float32 capture of R
realizations, relative to ``torch.std(dim=0)`` over the same tensor, and the time of
the segmentation statistics and of ``render_html``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def best(fn, reps=3):
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1_000_000)
    ap.add_argument("--r", type=int, default=10)
    a = ap.parse_args()
    from numvar.analysis import analyze, render_html, significant_digits
    from numvar.runner.store import Samples

    g = torch.Generator().manual_seed(0)
    R, M = a.r, a.elements
    x = 1 + 1e-4 * torch.randn(R, M, generator=g)
    ref = torch.ones(M)
    s = Samples(captures={"y": x}, reference={"y": ref}, indices=list(range(R)),
                seeds=list(range(R)))
    t_std = best(lambda: torch.std(x, dim=0))
    t_sd = best(lambda: significant_digits(x, ref))
    t_an = best(lambda: analyze(s))
    print(f"capture {R}x{M} float32: torch.std {t_std * 1e3:.1f} ms; "
          f"significant_digits {t_sd:.2f} s ({t_sd / t_std:.0f}x); analyze {t_an:.2f} s "
          f"({t_an / t_std:.0f}x)")
    seg = torch.randint(0, 20, (R, 64, 64, 64), generator=g)
    ss = Samples(captures={"aseg": seg}, reference={"aseg": seg[0]}, indices=list(range(R)),
                 seeds=list(range(R)))
    t_bc = best(lambda: torch.bincount(seg.reshape(-1), minlength=20))
    t_seg = best(lambda: analyze(ss, task="segmentation"))
    print(f"segmentation {R}x64^3, 20 labels: analyze {t_seg:.2f} s "
          f"({t_seg / t_bc:.0f}x one torch.bincount over all voxels)")
    res = analyze(ss, task="segmentation")
    with tempfile.TemporaryDirectory() as d:
        t_html = best(lambda: render_html(res, ss, Path(d) / "r.html"), reps=1)
    print(f"render_html (segmentation report): {t_html:.2f} s")


if __name__ == "__main__":
    main()
