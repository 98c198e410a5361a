"""The compiled flop kernels of linear algebra, FFTs and grid sampling against the tensor
implementations (or the decomposition) they replace, on the zoo models that use them.

For each model, in one process and interleaved (best of ``--repeats`` rounds after a
warm-up): the native forward, the flop SR forward with the module's ``USE_KERNELS`` off
(the tensor implementation: a vectorised rounding call per column or stage; for grid
sampling the decomposition, op by op) and on (one compiled call); ratios to native, and
whether both give the same bits.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_flop_kernels.py \
        [--repeats 11] [--models spatial_transformer ...]
"""

from __future__ import annotations

import argparse
import time

import torch

from numvar.instrument import fft, fuzzy, grid_kernels, linalg
from numvar.workloads import zoo

#: zoo entry -> the module whose USE_KERNELS switches its kernels
CASES = {"linear_solve": linalg, "fft_filter": fft, "spatial_transformer": grid_kernels}


def _best(fn, rounds: list[float]) -> None:
    t = time.perf_counter()
    fn()
    rounds.append(time.perf_counter() - t)


def measure(name: str, module, repeats: int) -> dict:
    built = zoo.build(name, "bench")
    model, x = built.model.eval(), built.inputs

    def flop():
        with fuzzy(mode="sr", granularity="flop", seed=0):
            return model(*x)

    times: dict = {"native": [], False: [], True: []}
    outs = {}
    with torch.no_grad():
        for use in (False, True):
            module.USE_KERNELS = use
            outs[use] = flop()
        for _ in range(repeats):
            _best(lambda: model(*x), times["native"])
            for use in (False, True):
                module.USE_KERNELS = use
                _best(flop, times[use])
    module.USE_KERNELS = True
    nat = min(times["native"])
    return {"native_ms": nat * 1e3, "tensor": min(times[False]) / nat,
            "kernels": min(times[True]) / nat,
            "same_bits": torch.equal(outs[False].view(torch.int32), outs[True].view(torch.int32))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--models", nargs="+", choices=list(CASES), default=list(CASES))
    args = ap.parse_args()
    print(f"threads: torch {torch.get_num_threads()}; best of {args.repeats}, ratios to native")
    for name in args.models:
        r = measure(name, CASES[name], args.repeats)
        print(f"{name:14s} native {r['native_ms']:.3f} ms | flop SR tensor implementation "
              f"{r['tensor']:.1f}x | compiled kernels {r['kernels']:.1f}x | same bits "
              f"{r['same_bits']}")


if __name__ == "__main__":
    main()
