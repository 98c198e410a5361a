"""Flop-granularity fast paths outside the contractions, each against the path it
replaces, in one process.

For each zoo model (default: the ones these paths serve), one forward under ``no_grad`` at
its bench size under ``numvar.fuzzy(mode="sr", granularity="flop")``, with the compiled
paths on and off (``bag_kernels.USE_KERNEL``: ``nn.EmbeddingBag`` sum/mean in one call;
``flop.USE_ROWVAR``: the two-pass variance of LayerNorm/GroupNorm statistics in one call;
``norm_kernels.USE_KERNEL``: LayerNorm, eval BatchNorm and last-dim softmax in one or
two calls instead of their decompositions op by op),
best of ``--repeats`` interleaved rounds after a warm-up, each timed by the thread's CPU
time (``time.thread_time``, as ``bench_opoverhead.py``: one torch and one numba thread do
all the work, and a loaded machine's descheduling would otherwise dominate), ratios to
native in the same run. Both settings give the same bits (``tests/test_instrument_bag_kernels.py``,
``tests/test_instrument_rowvar.py``, ``tests/test_instrument_norm_kernels.py``); this
measures only the time.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_flopops.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from numvar.instrument import bag_kernels, flop, norm_kernels
from numvar.workloads import zoo

from bench_zoo import _variants, best_of

MODELS = ["embedding_bag", "norms", "vit", "multihead_attention", "whisper", "bert",
          "transformer_encoder", "mobilenet_se", "efficientnet_mbconv"]


def _switch(on: bool) -> None:
    bag_kernels.USE_KERNEL = on
    flop.USE_ROWVAR = on
    norm_kernels.USE_KERNEL = on


def measure(name: str, repeats: int) -> tuple[float, float, float]:
    """(native seconds, flop SR ratio with the fast paths, without them)."""
    v = _variants(zoo.build(name, "bench"))
    fns = {"native": v["native"], "on": v["flop SR"], "off": v["flop SR"]}
    try:
        best = best_of(fns, repeats, time.thread_time, setup=lambda k: _switch(k != "off"))
    finally:
        _switch(True)
    n = best["native"]
    return n, best["on"] / n, best["off"] / n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--models", nargs="+", default=MODELS)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print("| model | native ms | flop SR, fast paths | flop SR, tensor paths | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for name in args.models:
        n, on, off = measure(name, args.repeats)
        print(f"| {name} | {n * 1e3:.2f} | {on:.1f}× | {off:.1f}× | {off / on:.2f} |", flush=True)


if __name__ == "__main__":
    main()
