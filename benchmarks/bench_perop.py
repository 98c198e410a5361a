"""What numvar's dispatch costs per op, on tensors small enough that arithmetic is noise.

For each op of a transformer's or MLP's forward (4×4 binary32 tensors), the time per call
of

- **native**: the op as the user calls it;
- **floor**: the same under numvar's code path and a do-nothing dispatch mode
  (:func:`numvar.instrument.codepath.codepath` + ``bench_zoo.IdentityMode``, as
  ``bench_zoo.py``'s floor): what any tool that sees every aten op pays;
- **op SR**, **flop SR**: under ``numvar.fuzzy(mode="sr", granularity=...)``;

and op SR − floor, flop SR − floor: numvar's own work per call (its handlers, float64
re-runs, the rounding calls, the bookkeeping). ``linear`` is two aten ops (``t``,
``addmm``), ``layer_norm`` one (``native_layer_norm``). Wall time per call, best of
``--repeats`` rounds of ``--calls`` calls after a warm-up, one thread, in one process.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_perop.py \
        [--calls 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F

from numvar.instrument import fuzzy
from numvar.instrument.codepath import codepath

from bench_zoo import IdentityMode


def _ops():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    b = torch.randn(4, generator=g)
    return {
        "tanh": lambda: torch.tanh(x),
        "gelu": lambda: F.gelu(x),
        "add": lambda: x + w,
        "mul": lambda: x * w,
        "mul by a number": lambda: x * 0.125,
        "sum over a dim": lambda: x.sum(-1),
        "softmax": lambda: torch.softmax(x, -1),
        "layer_norm": lambda: F.layer_norm(x, (4,)),
        "addmm": lambda: torch.addmm(b, x, w.t()),
        "linear": lambda: F.linear(x, w, b),
        "view (exact)": lambda: x.view(16),
    }


@contextlib.contextmanager
def _floor():
    with codepath(), IdentityMode():
        yield


def _variants():
    return {"native": contextlib.nullcontext, "floor": _floor,
            "op SR": lambda: fuzzy(mode="sr", granularity="op", seed=0),
            "flop SR": lambda: fuzzy(mode="sr", granularity="flop", seed=0)}


def per_call(fn, ctx, calls: int, repeats: int) -> float:
    """Best time per call (s) of ``fn`` inside one ``ctx()`` block."""
    with ctx():
        for _ in range(50):
            fn()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    variants = _variants()
    print("µs per call (4×4 binary32 operands, one thread, best of "
          f"{args.repeats} × {args.calls} calls)")
    print("| op | native | floor | op SR | flop SR | op SR − floor | flop SR − floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for name, fn in _ops().items():
            t = {k: per_call(fn, v, args.calls, args.repeats) * 1e6
                 for k, v in variants.items()}
            print(f"| {name} | {t['native']:.1f} | {t['floor']:.1f} | {t['op SR']:.1f} | "
                  f"{t['flop SR']:.1f} | {t['op SR'] - t['floor']:.1f} | "
                  f"{t['flop SR'] - t['floor']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
