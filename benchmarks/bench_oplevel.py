"""Op granularity: ops with a scalar multiplier rounded once, and fused optimizer steps.

Ratios versus plain PyTorch in the same run (best of ``--repeats``): ``add(alpha)``,
``addcmul``, ``addcdiv``, ``lerp`` on 10^6 binary32 elements under ``fuzzy(mode="sr",
granularity="op")`` (the exact result by :mod:`numvar.instrument.oplevel`'s kernel, rounded
once), and one ``Adam(fused=True)`` / ``SGD(momentum, fused=True)`` step on 10^6
parameters at both granularities (per tensor, :mod:`numvar.instrument.optim`).

    python benchmarks/bench_oplevel.py [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numba
import torch

from numvar.instrument import fuzzy


def best(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(1_000_000, generator=g) for _ in range(3))
    c = c.abs() + 0.5
    ops = {
        "add alpha": lambda: torch.add(a, b, alpha=0.8),
        "addcmul": lambda: torch.addcmul(a, b, c, value=0.3),
        "addcdiv": lambda: torch.addcdiv(a, b, c, value=0.3),
        "lerp": lambda: torch.lerp(a, b, 0.3),
    }
    print(f"{'workload':28s} {'native ms':>10s} {'numvar ms':>10s} {'ratio':>7s}")
    for name, fn in ops.items():
        def inst(fn=fn):
            with fuzzy(mode="sr", granularity="op"):
                fn()
        tn, ti = best(fn, args.repeats), best(inst, args.repeats)
        print(f"{name + ' (op, 1e6)':28s} {tn * 1e3:10.2f} {ti * 1e3:10.2f} {ti / tn:7.1f}")
    for oname in ("Adam", "SGD"):
        for gran in ("op", "flop"):
            p = torch.nn.Parameter(torch.randn(1_000_000, generator=g))
            p.grad = torch.randn(1_000_000, generator=g)
            kw = {"momentum": 0.9} if oname == "SGD" else {}
            opt = getattr(torch.optim, oname)([p], lr=1e-3, fused=True, **kw)

            def inst(opt=opt, gran=gran):
                with fuzzy(mode="sr", granularity=gran):
                    opt.step()
            tn, ti = best(opt.step, args.repeats), best(inst, args.repeats)
            label = f"{oname} fused step ({gran}, 1e6)"
            print(f"{label:28s} {tn * 1e3:10.2f} {ti * 1e3:10.2f} {ti / tn:7.1f}")


if __name__ == "__main__":
    main()
