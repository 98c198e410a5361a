"""PyTorch's float64 ``gelu`` constants faulted in before numvar re-runs ``gelu`` in
float64 (once per process).

At both granularities numvar computes a binary32 (or 16-bit) ``gelu`` as torch's float64
``gelu`` of the float64 inputs and rounds that once. On CPUs with AVX-512 torch's float64
``gelu`` calls Sleef's vectorised ``erf`` (``Sleef_erfd8_u10``), which reads one constant
by a masked broadcast load (``vmulpd const{1to8}, x, y{k}``) whose mask is on only in
lanes of very small magnitude. A load whose lanes are all masked off is suppressed: it
does not fault its page in, and it costs the core a slow path for as long as the page is
absent. The page is part of ``libtorch_cpu.so``'s mapping, which the kernel maps page by
page (and a few neighbours with each fault) as it is first read: until some other op's
code or constants near it have been read (``sum``, ``arange``, ``cumsum``, ``add_``,
``sort``, ...), every float64 ``gelu`` of ordinary values pays it. Measured on an AMD EPYC
(Zen 4, torch 2.13.0, one thread, 65 536 float64 values of N(0, 1)): 1 170 µs a call
while the page is absent, 202 µs once it is present, whichever way it came to be (one
ordinary read of a byte of that page through ``ctypes`` does it; a read of a page 1 MB
away does not). A GELU MLP (64 → 512 → 64, batch 128) under ``fuzzy`` in a fresh process,
one thread: op granularity 1.84–2.02 → 0.88–0.91 ms a forward, flop 5.24–5.39 →
4.25–4.30 (``benchmarks/bench_prefault.py``; docs/speed.md, "The float64 gelu's constant
page").

:func:`fault_in_gelu_constants` (called by every fuzzy block's entry; once per process)
runs torch's float64 ``gelu`` on :data:`WARM_VALUES`, each value filling whole vectors of
eight lanes, so that every masked branch of the vectorised ``erf`` runs with its lanes
on at least once: its loads are real and fault their pages in. About 30 µs, once per
process: a forked process (a realization forked by the runner's zygote) runs it again,
since a fork does not copy the page-table entries of a file mapping (measured: 201 µs in
the parent, 1 169 in its child until the child ran it, 201 after). No value anywhere
changes and no random state is drawn; the result is discarded. ``NUMVAR_PREFAULT=0`` in
the environment leaves it out.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger("numvar")

#: environment variable: ``0`` leaves the constants' pages as they are
ENV = "NUMVAR_PREFAULT"
#: magnitudes from zero to overflow, both signs, infinities and NaN: every branch of a
#: vectorised ``erf`` (tiny, polynomial ranges, saturated, special values)
WARM_VALUES = (0.0, 5e-324, 1e-300, 1e-20, 1e-9, 1e-4, 0.1, 0.5, 1.0, 1.5, 2.5, 4.0,
               6.0, 10.0, 30.0, 1e10, 1e300, float("inf"), float("nan"))
#: lanes per value: a full 512-bit vector of float64 values
LANES = 8

_done_in: int | None = None  # the process that ran it (os.getpid())


def warm_input() -> torch.Tensor:
    """The float64 values :func:`fault_in_gelu_constants` runs ``gelu`` on: each of
    :data:`WARM_VALUES` and its negation, :data:`LANES` times in a row."""
    vals = [*WARM_VALUES, *(-v for v in WARM_VALUES)]
    return torch.tensor(vals, dtype=torch.float64).repeat_interleave(LANES)


def fault_in_gelu_constants() -> bool:
    """Run torch's float64 ``gelu`` once on :func:`warm_input` (module docstring), once
    per process (a forked child runs it again); whether it ran (False with
    ``NUMVAR_PREFAULT=0``). Call it outside any dispatch mode (numvar's fuzzy entry does,
    before its mode is pushed)."""
    global _done_in
    pid = os.getpid()
    if _done_in == pid:
        return True
    if os.environ.get(ENV, "1").strip() == "0":
        return False
    _done_in = pid
    with torch.no_grad():
        torch.nn.functional.gelu(warm_input())
    logger.debug("numvar: float64 gelu run once on every branch's values")
    return True
