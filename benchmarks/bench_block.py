"""What a fuzzy block and each op cost before numvar does any work.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_block.py [--repeats 4000]

Every forward that ``numvar.sample`` or the zoo benchmark times runs in a block of its
own, so the block's set-up and tear-down count once per forward, and the dispatch
mode's entry once per op. Timed in one process, round after round (each variant's
``--repeats`` calls by ``perf_counter``, its tenth percentile over the rounds' calls):

- **blocks**, empty: ``numvar.fuzzy(mode="sr", granularity="op")``; the floor of
  ``bench_zoo.py`` (:class:`~numvar.instrument.codepath.codepath` and
  :class:`~numvar.instrument.codepath.IdentityMode`, entered by
  :func:`~numvar.instrument.codepath.reference_path`); and that floor as it was set up
  until 2026-12-05 (``contextlib`` and ``torch.nn.attention.sdpa_kernel``:
  :func:`legacy_codepath`), against an empty ``with torch.no_grad()``; a block at op SR
  around one add (its first dispatch looks the op up), with the op table shared by the
  blocks of a configuration and with a table of its own, as before 2026-12-07
  (:func:`_block_with_add`);
- **one op**, an add of two 64-element binary32 tensors: native; through
  ``IdentityMode`` (which opts out of the wrapper PyTorch puts around
  ``__torch_dispatch__``: :func:`numvar.instrument.codepath.guards_itself`); through a
  do-nothing mode that keeps that wrapper; at op SR;
- **per kernel call**, what numvar's Python pays around each compiled call: numba's
  thread count read (``numba.get_num_threads`` against ``kernels.num_threads``, which
  reads it from the threading layer, 2026-12-07), a no-op kernel of small work through
  ``kernels.launch`` (at two numba threads where numba has them: the count set to 1 and
  restored) against the same with numba's public calls (:func:`legacy_launch`, as it was
  until 2026-12-07), and the read of ``NUMVAR_FLOP_BACKEND`` (``os.environ.get``
  against ``flop._backend_env``).

Prints microseconds, and each op's time as a multiple of the native add's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import numba
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import numvar
from numvar.instrument import flop
from numvar.instrument import kernels as KN
from numvar.instrument.codepath import IdentityMode, reference_path


@contextlib.contextmanager
def legacy_codepath():
    """:class:`~numvar.instrument.codepath.codepath`'s switches set as they were until
    2026-12-05: a generator, ``torch.nn.attention.sdpa_kernel`` and an ``ExitStack``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with contextlib.ExitStack() as stack:
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        old = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        stack.callback(torch.backends.mha.set_fastpath_enabled, old)
        mkldnn = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        stack.callback(torch._C._set_mkldnn_enabled, mkldnn)
        cudnn = torch.backends.cudnn.enabled
        torch.backends.cudnn.enabled = False
        stack.callback(setattr, torch.backends.cudnn, "enabled", cudnn)
        yield


def legacy_launch(work: int, fn, *args):
    """``kernels.launch`` as it was until 2026-12-07: numba's public thread-count calls
    (each takes the start-up check's two locks)."""
    if work >= KN.PARALLEL_MIN_WORK:
        return fn(*args)
    n = numba.get_num_threads()
    if n == 1:
        return fn(*args)
    numba.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        numba.set_num_threads(n)


def _noop():
    return None


class WrappedMode(TorchDispatchMode):
    """A do-nothing mode with the wrapper PyTorch puts around ``__torch_dispatch__``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _block(make):
    def run():
        with make():
            pass
    return run


def _block_with_add(a, b, shared: bool):
    """A fuzzy block at op SR around one add: the block, and the first dispatch of an op
    in it. ``shared=False`` gives the block a table of its own, as every block had until
    2026-12-07 (``mode._INFOS``: now one per configuration, shared by its blocks), so its
    first dispatch classifies the op again."""
    def run():
        fz = numvar.fuzzy(mode="sr", granularity="op")
        if not shared:
            fz._infos = {}
        with fz:
            a + b
    return run


def _percentile(calls: list[float]) -> float:
    calls = sorted(calls)
    return calls[len(calls) // 10] * 1e6


def measure(repeats: int, rounds: int = 5) -> dict[str, float]:
    """Microseconds per call of each variant (see the module docstring)."""
    a, b = torch.randn(64), torch.randn(64)

    def add():
        return a + b

    def in_block(make):
        def run():
            with make():
                return _time(add, repeats)
        return run

    blocks = {
        "block: torch.no_grad()": _block(torch.no_grad),
        "block: fuzzy(sr, op)": _block(lambda: numvar.fuzzy(mode="sr", granularity="op")),
        "block: floor (codepath + IdentityMode)": _block(reference_path),
        "block: floor as set up before (legacy_codepath + IdentityMode)": _block(_legacy_floor),
        "block: fuzzy(sr, op) around one add": _block_with_add(a, b, shared=True),
        "block: the same, the block's own op table (as before)": _block_with_add(a, b,
                                                                                 shared=False),
    }
    ops = {
        "op: native add": lambda: _time(add, repeats),
        "op: add through IdentityMode": in_block(IdentityMode),
        "op: add through a mode with PyTorch's wrapper": in_block(WrappedMode),
        "op: add at op SR": in_block(lambda: numvar.fuzzy(mode="sr", granularity="op")),
    }
    pieces = {
        "kernel call: numba.get_num_threads()": numba.get_num_threads,
        "kernel call: kernels.num_threads()": KN.num_threads,
        "kernel call: a small no-op through launch as before": lambda: legacy_launch(1, _noop),
        "kernel call: a small no-op through kernels.launch": lambda: KN.launch(1, _noop),
        "kernel call: os.environ.get(NUMVAR_FLOP_BACKEND)":
            lambda: os.environ.get(flop.FLOP_BACKEND_ENV),
        "kernel call: flop._backend_env()": flop._backend_env,
    }
    calls: dict[str, list[float]] = {k: [] for k in (*blocks, *ops, *pieces)}
    n0 = numba.get_num_threads()
    with torch.no_grad():
        for name, f in blocks.items():  # warm-up
            f()
        for _ in range(rounds):
            for name, f in blocks.items():
                calls[name] += _time(f, repeats)
            for name, f in ops.items():
                calls[name] += f()
            numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
            try:
                for name, f in pieces.items():
                    calls[name] += _time(f, repeats)
            finally:
                numba.set_num_threads(n0)
    return {k: _percentile(v) for k, v in calls.items()}


def _time(f, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out


@contextlib.contextmanager
def _legacy_floor():
    with legacy_codepath(), IdentityMode():
        yield


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=4000, help="calls per variant and round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if args.repeats < 10 or args.rounds < 1:
        p.error("--repeats must be at least 10 and --rounds at least 1")
    t = measure(args.repeats, args.rounds)
    native = t["op: native add"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), kernel calls at "
          f"{min(2, numba.config.NUMBA_NUM_THREADS)} numba thread(s); "
          f"tenth percentile of {args.rounds} x {args.repeats} calls")
    for k, v in t.items():
        ratio = f"  {v / native:5.2f}x native add" if k.startswith("op:") else ""
        print(f"{k:66s} {v:8.2f} us{ratio}")


if __name__ == "__main__":
    main()
