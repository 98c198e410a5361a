"""Per-op overhead of the dispatch mode, and a lower bound for per-op Python dispatch.

For each model (default: the recurrent ones of the zoo, whose cost is all per-op
overhead), one forward under ``no_grad`` at its bench size, best of ``--repeats``
interleaved rounds after a warm-up, each variant timed by the thread's CPU time
(``time.thread_time``: a shared, loaded machine deschedules the process, which wall
time would count) and given as a ratio to native:

- **floor**: a do-nothing dispatch mode on numvar's code path (as ``bench_zoo.py``);
- **bound**: :class:`OneCallMode`, the least any design that dispatches each op in
  Python and rounds each float result with one numba call can pay: each op runs natively
  (no float64 re-run, no handler), then every float32 result gets one output tensor and
  one call of numvar's elementwise binary32 kernel (an SR multiplication by 1, exact,
  so the result is the native one) with a fresh stream key;
- **op SR**, **flop SR**: ``numvar.fuzzy(mode="sr", granularity=...)``, with the
  recurrent layers' compiled steps (``numvar.instrument.rnn_kernels``), and again op by
  op (``rnn_kernels.USE_KERNEL = False``, switched in the same rounds).

It prints the ops the mode sees per forward op by op and the µs per such op above the
floor. The goals of the speed issue, op SR ≤ floor + 2 and flop SR ≤ floor + contraction + 5
(× native; contraction = the model's rounded contraction terms ÷ the SR kernel's rate, as in
``bench_zoo.py``), are out of reach for a model run op by op whose ``bound`` already
exceeds them (flop granularity dispatches every op the same way and rounds more inside
each); the compiled steps do not dispatch the layers' ops at all.

``--cells`` and ``--packed`` time, instead of the zoo models, a decoder's loop of 20
``nn.GRUCell`` / ``nn.LSTMCell`` calls and a two-layer bidirectional ``nn.GRU`` /
``nn.LSTM`` on a packed sequence, with the compiled steps and op by op.

    python benchmarks/bench_opoverhead.py [--repeats 5] [--models gru lstm] [--cells] [--packed]
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numvar.instrument import fuzzy
from numvar.instrument import pointwise as PW
from numvar.instrument import rnn_kernels as RN
from numvar.instrument.codepath import codepath, dynamo_running, guards_itself
from numvar.rounding import Stream
from numvar.rounding import kernels as RK
from numvar.workloads import zoo

from bench_zoo import (KERNEL_DTYPES, _variants, best_of, contraction_terms, contraction_time,
                       kernel_rate)

_SR = RK.mode_code("sr")
_ONE = np.ones(1, np.float32)


@guards_itself
class OneCallMode(TorchDispatchMode):
    """Runs each op natively, then one numba call per float32 output (the lower bound).
    It meets dynamo as numvar's modes do (``codepath.guards_itself``)."""

    def __init__(self) -> None:
        super().__init__()
        self.stream = Stream(0)
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if dynamo_running():
            return self._guarded(func, types, args, kwargs)
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if isinstance(out, torch.Tensor) and out.dtype is torch.float32 and out.numel():
            src = out if out.is_contiguous() else out.contiguous()
            res = torch.empty_like(src)
            PW.binary32(RK.OP_MUL, PW.array(src), (0, 0, 1), _ONE, (0, 0, 0), PW.array(res),
                        (1, 1, src.numel()), self.stream.next_key(), _SR)
        return out


def _switched(fns: dict, repeats: int) -> dict:
    """``best_of`` (thread CPU time) with the recurrent layers' compiled steps off for the
    variants named "… op by op" and on for the others, switched before each call."""
    def setup(k: str) -> None:
        RN.USE_KERNEL = not k.endswith("op by op")
    try:
        return best_of(fns, repeats, time.thread_time, setup)
    finally:
        RN.USE_KERNEL = True


def measure(name: str, repeats: int) -> dict:
    built = zoo.build(name, "bench")
    model, x = built.model.eval(), built.inputs

    def bound():
        with codepath(), OneCallMode():
            model(*x)
    variants = _variants(built)
    best = _switched({**variants, "bound": bound, "op SR, op by op": variants["op SR"],
                      "flop SR, op by op": variants["flop SR"]}, repeats)
    counter = OneCallMode()
    with torch.no_grad(), codepath(), counter:
        model(*x)
    best["ops"] = counter.ops
    return best


def _cell_loop(cls):
    """A decoder's loop: 20 calls of ``cls`` (16 → 64, batch 2, the state fed back)."""
    torch.manual_seed(0)
    cell = cls(16, 64)
    xs = [torch.randn(2, 16) for _ in range(20)]

    def loop():
        h = None
        for x in xs:
            h = cell(x) if h is None else cell(x, h)
    return loop


def _packed(cls):
    """A two-layer bidirectional ``cls`` (16 → 64) on a packed batch of 4 sequences of
    lengths 20, 15, 10 and 5."""
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    rnn = cls(16, 64, num_layers=2, bidirectional=True).eval()
    x = pack_padded_sequence(torch.randn(20, 4, 16), torch.tensor([20, 15, 10, 5]))
    return lambda: rnn(x)


def measure_calls(cases: dict, repeats: int) -> None:
    """Native, op SR and flop SR of each of ``cases`` (name -> function), with the
    compiled steps and op by op (switched per round, as :func:`measure`)."""
    print("| case | native ms | op SR | op SR, op by op | flop SR | flop SR, op by op |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, fn in cases.items():
        def under(granularity, fn=fn):
            def run():
                with fuzzy(mode="sr", granularity=granularity, seed=0):
                    fn()
            return run
        b = _switched({"native": fn, "op SR": under("op"), "op SR, op by op": under("op"),
                       "flop SR": under("flop"), "flop SR, op by op": under("flop")}, repeats)
        nat = b.pop("native")
        print(f"| {name} | {nat * 1e3:.2f} | "
              + " | ".join(f"{v / nat:.1f}×" for v in b.values()) + " |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=["gru", "lstm"])
    ap.add_argument("--cells", action="store_true",
                    help="time a loop of nn.GRUCell / nn.LSTMCell calls instead")
    ap.add_argument("--packed", action="store_true",
                    help="time nn.GRU / nn.LSTM on a packed sequence instead")
    args = ap.parse_args(argv)
    logging.getLogger("numvar").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    if args.cells or args.packed:
        cases = {}
        if args.cells:
            cases.update({c.__name__: _cell_loop(c) for c in (torch.nn.GRUCell,
                                                               torch.nn.LSTMCell)})
        if args.packed:
            cases.update({f"{c.__name__}, packed": _packed(c) for c in (torch.nn.GRU,
                                                                         torch.nn.LSTM)})
        measure_calls(cases, args.repeats)
        return
    rates = {d: kernel_rate(args.repeats, d) for d in KERNEL_DTYPES}
    print("| model | native ms | ops | floor | bound | op SR | flop SR | op SR, op by op "
          "| flop SR, op by op | op goal (floor + 2) | flop goal (floor + contraction + 5) "
          "| µs/op above floor: bound, op by op |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.models:
        b = measure(name, args.repeats)
        nat, n = b["native"], b["ops"]
        cols = ("floor", "bound", "op SR", "flop SR", "op SR, op by op", "flop SR, op by op")
        r = {k: b[k] / nat for k in cols}
        ctime = contraction_time(contraction_terms(zoo.build(name, "bench")), rates) / nat
        per = [(b[k] - b["floor"]) / n * 1e6 for k in ("bound", "op SR, op by op")]
        print(f"| {name} | {nat * 1e3:.2f} | {n} | "
              + " | ".join(f"{r[k]:.1f}×" for k in cols)
              + f" | {r['floor'] + 2:.1f}× | {r['floor'] + ctime + 5:.1f}× | "
              f"{per[0]:.1f}, {per[1]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
