"""Op granularity on the brain workload with convolutions re-run whole or in runs of samples.

    python benchmarks/bench_conv_runs.py [--pairs 2] [--repeats 8] [--threads 1]
        [--workload brain] [--batch N]

At op granularity numvar re-runs every convolution in float64 with PyTorch, which
allocates the im2col buffer of the whole batch at once; above glibc's 32 MB mmap
threshold that block is mapped and faulted in afresh on every call.
``numvar.instrument.depthwise.batched64`` splits such a call into runs of whole samples
whose buffers stay below ``COLUMN_BYTES`` (the same bits). Whether the whole call
faults depends on the heap the process already has, so each side runs in fresh
processes of its own, alternating, ``--pairs`` times: ``COLUMN_BYTES = 0`` (re-run
whole, as before) and the default. Each process loads the trained workload (default
brain, the paper's FastSurfer-like U-Net, 4 slices; ``run_all.py``'s workloads and batch
sizes), times the best of ``--repeats`` forwards
under ``fuzzy(mode="sr", granularity="op")`` after one warm-up (thread CPU time at one
thread, wall time at more), counts the minor page faults of that forward, then times
as many native forwards. Prints one row per process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def measure(column_bytes: int | None, repeats: int, threads: int, workload: str,
            batch: int | None) -> dict:
    """One process's row (see the module docstring)."""
    import numba
    import torch

    import numvar
    from numvar.instrument import depthwise

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run_all

    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    if column_bytes is not None:
        depthwise.COLUMN_BYTES = column_bytes
    forward, _ = run_all.workload_inputs(workload, batch)
    clock = time.thread_time if threads == 1 else time.perf_counter

    def fuzzy_forward():
        with torch.no_grad(), numvar.fuzzy(mode="sr", granularity="op", seed=0):
            forward()

    fuzzy_forward()
    best, faults = float("inf"), 0
    for _ in range(repeats):
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, clock()
        fuzzy_forward()
        t, f = clock() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        if t < best:
            best, faults = t, f
    native = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t0 = clock()
            forward()
            native = min(native, clock() - t0)
    return {"column_bytes": depthwise.COLUMN_BYTES, "ms": best * 1e3,
            "native_ms": native * 1e3, "faults": faults}


def _child(column_bytes: int | None, args) -> dict:
    cmd = [sys.executable, __file__, "--child", "--repeats", str(args.repeats), "--threads",
           str(args.threads), "--workload", args.workload]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    if column_bytes is not None:
        cmd += ["--column-bytes", str(column_bytes)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="processes per side, alternated")
    ap.add_argument("--repeats", type=int, default=8, help="forwards timed per process")
    ap.add_argument("--threads", type=int, default=1, help="torch and numba threads")
    ap.add_argument("--workload", choices=("digits", "brain", "speech"), default="brain")
    ap.add_argument("--batch", type=int, default=None,
                    help="inputs per forward (default: run_all.py's)")
    ap.add_argument("--column-bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.column_bytes, args.repeats, args.threads,
                                 args.workload, args.batch)))
        return
    print("| convolutions re-run | op SR ms | native ms | op ÷ native | minor faults per "
          "forward |")
    print("|---|---:|---:|---:|---:|")
    for _ in range(args.pairs):
        for column_bytes in (0, None):
            r = _child(column_bytes, args)
            side = ("whole (COLUMN_BYTES = 0)" if r["column_bytes"] == 0
                    else f"in runs of samples (default, {r['column_bytes'] >> 20} MiB)")
            print(f"| {side} | {r['ms']:.1f} | {r['native_ms']:.2f} | "
                  f"{r['ms'] / r['native_ms']:.1f} | {r['faults']} |", flush=True)


if __name__ == "__main__":
    main()
