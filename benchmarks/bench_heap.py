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

``--large HW`` compares instead the two ways of serving blocks above glibc's largest mmap
threshold (32 MB) on the zoo's U-Net (``zoo_models.UNet(1, 16)``, as the ``unet`` entry)
over two HW × HW images, whose op-granularity forwards re-run convolutions in float64
with im2col buffers of tens of MB: each block mapped on its own and unmapped when freed
(the setting before 2026-12-07: ``heap.LARGE_BLOCKS_FROM_HEAP`` false, trim threshold
256 MB) and every block from the heap (numvar's default while a fuzzy block is
active), each side in processes of its own, alternating. Each process runs ``--warmup`` fuzzy forwards (the heap settles), then
``--repeats`` more, and prints the best and the median of those by the thread's CPU
time, the minor faults and system time per forward, and the process's peak and final
resident memory (what keeping large blocks costs)::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_heap.py --large 192 \
        [--granularity op] [--warmup 12] [--repeats 5] [--pairs 2]
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


def _resident_mb() -> float:
    """The process's resident memory now, MB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure_large(hw: int, granularity: str, warmup: int, repeats: int,
                  mapped: bool) -> dict:
    """One process's row of ``--large`` (module docstring); ``mapped``: large blocks
    mapped on their own, as before 2026-12-07."""
    import statistics

    import numba
    import torch

    import numvar
    from numvar.instrument import heap
    from numvar.workloads import zoo_models

    if mapped:
        heap.LARGE_BLOCKS_FROM_HEAP = False
        heap.TRIM_THRESHOLD = 256 << 20
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    torch.manual_seed(0)
    model = zoo_models.UNet(1, 16).eval()
    x = torch.randn(2, 1, hw, hw, generator=torch.Generator().manual_seed(0))
    times = []
    with torch.no_grad():
        native = _best_forward(model, (x,), 3)
        for i in range(warmup + repeats):
            if i == warmup:
                r0 = resource.getrusage(resource.RUSAGE_SELF)
            t = time.thread_time()
            with numvar.fuzzy(mode="sr", granularity=granularity, seed=0):
                model(x)
            times.append(time.thread_time() - t)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    timed = times[warmup:]
    return {"mapped": mapped, "kept": heap.keep_freed_memory(), "best_ms": min(timed) * 1e3,
            "median_ms": statistics.median(timed) * 1e3, "native_ms": native * 1e3,
            "faults": (r1.ru_minflt - r0.ru_minflt) / repeats,
            "sys_ms": (r1.ru_stime - r0.ru_stime) / repeats * 1e3,
            "peak_mb": r1.ru_maxrss / 1024, "final_mb": _resident_mb()}


def _large_child(args, mapped: bool) -> dict:
    env = dict(os.environ)
    env.pop("NUMVAR_KEEP_FREED_MEMORY", None)
    out = subprocess.run([sys.executable, __file__, "--child", "--large", str(args.large),
                          "--granularity", args.granularity, "--warmup", str(args.warmup),
                          "--repeats", str(args.repeats)] + (["--mapped"] if mapped else []),
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def large_table(args) -> None:
    """``--large``: the rows of both sides, alternating (module docstring)."""
    print(f"U-Net, 2 × 1 × {args.large} × {args.large}, {args.granularity} SR, one thread, "
          f"{args.warmup} forwards, then {args.repeats} timed")
    print(f"| blocks of 32 MB and more | {args.granularity} SR best ms | median ms | "
          "native ms | median ÷ native | minor faults per forward | system ms per forward "
          "| peak resident MB | final resident MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for _ in range(args.pairs):
        for mapped in (True, False):
            r = _large_child(args, mapped)
            side = ("mapped on their own (before)" if r["mapped"] else
                    "from the heap (default)" if r["kept"] else "malloc as it is (not glibc)")
            print(f"| {side} | {r['best_ms']:.2f} | {r['median_ms']:.2f} | "
                  f"{r['native_ms']:.2f} | {r['median_ms'] / r['native_ms']:.2f} | "
                  f"{r['faults']:.0f} | {r['sys_ms']:.1f} | {r['peak_mb']:.0f} | "
                  f"{r['final_mb']:.0f} |", flush=True)


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
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed forwards per process (default 15; with --large 5)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--large", type=int, default=0, metavar="HW",
                    help="compare large blocks mapped and from the heap on a U-Net over "
                         "HW × HW images (module docstring)")
    ap.add_argument("--warmup", type=int, default=12,
                    help="--large: fuzzy forwards before the timed ones")
    ap.add_argument("--mapped", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 5 if args.large else 15
    if args.repeats < 1 or args.pairs < 1 or args.warmup < 0:
        ap.error("--repeats and --pairs must be at least 1, --warmup at least 0")
    if args.large and args.child:
        print(json.dumps(measure_large(args.large, args.granularity, args.warmup,
                                       args.repeats, args.mapped)))
        return
    if args.child:
        print(json.dumps(measure(args.models, args.granularity, args.repeats)))
        return
    if args.large:
        large_table(args)
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
