"""A GELU MLP under fuzzy in fresh processes, with and without the float64 gelu warm-up.

    python benchmarks/bench_prefault.py [--repeats 20] [--pairs 2]

A fuzzy block's entry runs torch's float64 ``gelu`` once on values that switch every
branch of its vectorised ``erf`` on (``numvar.instrument.prefault``), once per process;
``NUMVAR_PREFAULT=0`` leaves it out. Whether the page it faults in is already present
depends on what the process ran before, so each side runs in processes of its own,
alternating, ``--pairs`` times. Each process (one thread) builds ``Linear(64, 512) →
GELU → Linear(512, 64)`` on a batch of 128 (seed 0), times the best of ``--repeats``
forwards under ``fuzzy(mode="sr")`` at op and at flop granularity by the thread's CPU
time, interleaved with native forwards and torch's float64 ``gelu`` of 65 536 values of
N(0, 1) outside the block (``bench_zoo.best_of``: a warm-up round, then the best of
``--repeats`` rounds). Prints one row per process: the times, each granularity's
ratio to the native forward of the same process, and the float64 ``gelu``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def measure(repeats: int) -> dict:
    """One process's row (see the module docstring)."""
    import numba
    import torch
    from bench_zoo import best_of

    import numvar
    from numvar.instrument import prefault

    torch.set_num_threads(1)
    numba.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 64)).eval()
    x = torch.randn(128, 64)
    v = torch.randn(65536, dtype=torch.float64)

    def under(granularity):
        def forward():
            with numvar.fuzzy(mode="sr", granularity=granularity, seed=0):
                model(x)
        return forward

    best = best_of({"op": under("op"), "flop": under("flop"), "native": lambda: model(x),
                    "gelu64": lambda: torch.nn.functional.gelu(v)}, repeats, time.thread_time)
    return {"warmed": prefault.fault_in_gelu_constants(),  # (a no-op after the blocks')
            "op": best["op"] * 1e3, "flop": best["flop"] * 1e3,
            "native": best["native"] * 1e3, "gelu64_us": best["gelu64"] * 1e6}


def _child(repeats: int, warm: bool) -> dict:
    env = dict(os.environ)
    env.pop("NUMVAR_PREFAULT", None)
    if not warm:
        env["NUMVAR_PREFAULT"] = "0"
    out = subprocess.run([sys.executable, __file__, "--child", "--repeats", str(repeats)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20, help="forwards timed per side")
    ap.add_argument("--pairs", type=int, default=2, help="processes per side, alternated")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.repeats)))
        return
    print("| float64 gelu warm-up | op SR ms | flop SR ms | native ms | op ÷ native | "
          "flop ÷ native | torch float64 gelu, 65 536 values, µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for _ in range(args.pairs):
        for warm in (False, True):
            r = _child(args.repeats, warm)
            side = "run (default)" if r["warmed"] else "left out (NUMVAR_PREFAULT=0)"
            print(f"| {side} | {r['op']:.2f} | {r['flop']:.2f} | {r['native']:.2f} | "
                  f"{r['op'] / r['native']:.1f} | {r['flop'] / r['native']:.1f} | "
                  f"{r['gelu64_us']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
