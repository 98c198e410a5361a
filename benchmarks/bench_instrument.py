"""Slowdown of numvar.fuzzy versus plain PyTorch (fp32), ratios measured in one run.

Workloads: a LeNet-style CNN inference (batch 64, 1x28x28) and a small transformer
encoder inference (batch 16, 32 tokens, d=64, 4 heads, 2 layers). For each mode
(ieee, sr, ud, random) and granularity (op, flop): the best time over ``--repeats``
interleaved rounds after a warm-up round (every configuration of a workload once per
round, ``bench_zoo.best_of``; one thread: the thread's CPU time, ``bench_zoo.clock_for``),
divided by the best native time of the same rounds. (Timed one configuration after
another by wall time, as before 2026-12-07, the encoder's native forward moved between
1.8 and 3.1 ms from run to run on a shared 2-core host, and every ratio with it.)
The ``floor`` column is an identity dispatch mode with the fused transformer fast path
off and attention on its math path: what any tool that sees every op pays before doing
any work.

    python benchmarks/bench_instrument.py [--repeats 5] [--threads 1] [--precision BITS]
                                          [--profile] [--wide-vectors]

``--precision`` runs every instrumented configuration at that virtual precision.
The ``LeNet b64 bf16`` row is the same LeNet in bfloat16 (its products round at 8 bits),
against native bfloat16. ``--threads`` sets both torch's and numba's thread counts (default: 1, a per-core
comparison that stays meaningful on a shared machine). ``--profile`` prints where the
time goes (cProfile, top entries) for flop SR. ``--wide-vectors`` re-runs the script with
``NUMBA_CPU_FEATURES`` set to the host's features minus ``prefer-256-bit``, so that LLVM
uses 512-bit vectors in every numba function on AVX-512 CPUs (it prefers 256-bit ones on
Intel server parts); numvar's hot kernels already ask for them per function
(``numvar.rounding.kernels.wide_vectors``), so this mostly changes the rest.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import sys

import numba
import torch
import torch.nn as nn
import torch.nn.functional as F
from bench_zoo import best_of, clock_for

from numvar.instrument import fuzzy
from numvar.instrument.codepath import IdentityMode, codepath

MODES = ("ieee", "sr", "ud", "random")
GRANULARITIES = ("op", "flop")


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 5)
        self.c2 = nn.Conv2d(6, 16, 5)
        self.f1 = nn.Linear(256, 120)
        self.f2 = nn.Linear(120, 84)
        self.f3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.relu(self.f1(x.flatten(1)))
        return self.f3(F.relu(self.f2(x)))


class Encoder(nn.Module):
    def __init__(self, vocab=100, d=64, heads=4, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)).mean(1))


def _floor_run(model, x):
    """The model under an identity dispatch mode on numvar's code path
    (:mod:`numvar.instrument.codepath`): what any tool that sees every op pays."""
    with codepath(), IdentityMode():
        model(x)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", type=int, default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--wide-vectors", action="store_true")
    args = ap.parse_args(argv)
    if args.wide_vectors and "NUMBA_CPU_FEATURES" not in os.environ:
        import llvmlite.binding as ll

        feats = ll.get_host_cpu_features().flatten() + ",-prefer-256-bit"
        os.environ["NUMBA_CPU_FEATURES"] = feats
        os.execv(sys.executable, [sys.executable, *sys.argv])
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    torch.manual_seed(0)
    lenet, img = LeNet().eval(), torch.randn(64, 1, 28, 28)
    work = {
        "LeNet b64": (lenet, img),
        "encoder b16x32": (Encoder().eval(), torch.randint(0, 100, (16, 32))),
        "LeNet b64 bf16": (copy.deepcopy(lenet).to(torch.bfloat16), img.to(torch.bfloat16)),
    }
    wide = "prefer-256-bit" in os.environ.get("NUMBA_CPU_FEATURES", "")
    print(f"torch {torch.__version__}, threads {args.threads}, best of {args.repeats}"
          + (", 512-bit vectors" if wide else "")
          + (f", precision {args.precision}" if args.precision else ""))
    header = f"{'workload':16s} {'native ms':>10s} {'floor':>7s} " + " ".join(
        f"{g + ' ' + m:>12s}" for g in GRANULARITIES for m in MODES)
    print(header)
    for name, (model, x) in work.items():
        fns = {"native": lambda model=model, x=x: model(x),
               "floor": lambda model=model, x=x: _floor_run(model, x)}
        for g in GRANULARITIES:
            for m in MODES:
                def run(m=m, g=g, model=model, x=x):
                    with fuzzy(mode=m, granularity=g, seed=0, precision=args.precision):
                        model(x)
                fns[g, m] = run
        # interleaved rounds after a warm-up round (numba compilation, caches), the best of
        # each; one thread: the thread's CPU time (bench_zoo.clock_for)
        best = best_of(fns, args.repeats, clock_for(args.threads))
        native, floor = best.pop("native"), best.pop("floor")
        cells = [t / native for t in best.values()]  # (in GRANULARITIES × MODES order)
        print(f"{name:16s} {native * 1e3:10.2f} {floor / native:6.1f}x "
              + " ".join(f"{c:11.1f}x" for c in cells))
    if args.profile:
        for name, (model, x) in work.items():
            print(f"\n--- profile: {name}, flop sr ---")
            pr = cProfile.Profile()
            with torch.no_grad():
                pr.enable()
                for _ in range(args.repeats):
                    with fuzzy(mode="sr", granularity="flop", seed=0):
                        model(x)
                pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
