"""Zoo forwards with glibc's malloc keeping freed memory (numvar's default) and as it was.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_heap.py \
        [--models efficientnet_mbconv unet] [--granularity op] [--repeats 15] [--pairs 2]

A fuzzy block's entry sets glibc's mmap and trim thresholds once per process
(``numvar.instrument.heap``), which cannot be undone in that process; so each side runs
in processes of its own, with ``NUMVAR_KEEP_FREED_MEMORY=0`` (malloc as it was) and
without it, alternating, ``--pairs`` times. Each process builds the named zoo entries
(bench size, ``no_grad``, one thread), runs three warm-up forwards under
``fuzzy(mode="sr", granularity=...)``, then times the best of ``--repeats`` forwards by the
thread's CPU time (which counts the system time of page faults), then as many native
forwards, and counts the minor page faults per fuzzy forward. Prints one row per model
and process: the fuzzy and native times, their ratio, faults per forward and the system
time per forward.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

DEFAULT_MODELS = ("efficientnet_mbconv", "unet")


def _best_forward(model, x, repeats: int) -> float:
    """The best of ``repeats`` forwards, seconds of the thread's CPU time."""
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        model(*x)
        best = min(best, time.thread_time() - t)
    return best


def measure(names, granularity: str, repeats: int) -> list[dict]:
    """One process's rows (see the module docstring)."""
    import numba
    import torch

    import numvar
    from numvar.instrument import heap
    from numvar.workloads import zoo

    torch.set_num_threads(1)
    numba.set_num_threads(1)
    rows = []
    with torch.no_grad():
        for name in names:
            built = zoo.build(name, "bench")
            model, x = built.model.eval(), built.inputs
            with numvar.fuzzy(mode="sr", granularity=granularity, seed=0):
                for _ in range(3):
                    model(*x)
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                best = _best_forward(model, x, repeats)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
            native = _best_forward(model, x, repeats)
            rows.append({"model": name, "kept": heap.keep_freed_memory(), "ms": best * 1e3,
                         "native_ms": native * 1e3,
                         "faults": (r1.ru_minflt - r0.ru_minflt) / repeats,
                         "sys_ms": (r1.ru_stime - r0.ru_stime) / repeats * 1e3})
    return rows


def _child(names, granularity: str, repeats: int, keep: bool) -> list[dict]:
    env = dict(os.environ)
    env.pop("NUMVAR_KEEP_FREED_MEMORY", None)
    if not keep:
        env["NUMVAR_KEEP_FREED_MEMORY"] = "0"
    out = subprocess.run([sys.executable, __file__, "--child", "--granularity", granularity,
                          "--repeats", str(repeats), "--models", *names], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--granularity", choices=("op", "flop"), default="op")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.models, args.granularity, args.repeats)))
        return
    print(f"| model | malloc | {args.granularity} SR ms | native ms | ratio | minor faults "
          "per forward | system ms per forward |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for _ in range(args.pairs):
        for keep in (False, True):
            for r in _child(args.models, args.granularity, args.repeats, keep):
                side = "freed memory kept" if r["kept"] else "as it was"
                print(f"| {r['model']} | {side} | {r['ms']:.2f} | {r['native_ms']:.2f} | "
                      f"{r['ms'] / r['native_ms']:.2f} | {r['faults']:.0f} | "
                      f"{r['sys_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
