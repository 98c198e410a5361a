"""The harmonic series in binary32 under each rounding mode (Fuzzy PyTorch's table).

``s = 0; for k in 1..n: s = s + 1/k`` sequentially in binary32, where both the division
and the addition are rounded under the mode (as Verificarlo instruments every flop).
In round-to-nearest the sum stagnates once 1/k falls below half an ulp of s (near
k = 2**21 in binary32, s ~ 15.40); SR stays unbiased and tracks the binary64 sum; UD
perturbs the stagnated round-to-nearest result by +-1 ulp, a zero-mean random walk that
stays near the stagnation point; random rounding rounds the tiny increments up half the
time and drifts upwards.

Figures of the paper's artifact at n = 10**7 are in :data:`PAPER`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..rounding import Stream
from ..rounding.kernels import OP_ADD, OP_DIV, bits64, mode_code
from ..rounding.kernels import call_narrow_binary as narrow_binary

#: Fuzzy PyTorch artifact, n = 10**7 (value, +- std over samples where given)
PAPER = {
    "ieee binary32": (15.4037, None),
    "ieee binary64": (16.6953, None),
    "sr": (16.6951, 0.0014),
    "ud": (15.4030, None),
    "random": (21.57, None),  # Verrou's random rounding
}


@njit(cache=True, error_model="numpy")
def _harmonic_f32(n, mode, t, key):
    """Sequential binary32 sum of 1/k, k = 1..n; division and addition both rounded
    under ``mode`` at t bits; element indices 2k, 2k+1 of the call's random stream."""
    s = 0.0
    for k in range(1, n + 1):
        q = narrow_binary(OP_DIV, 1.0, np.float64(k), mode, t, 24, -126, 127,
                          bits64(key, 2 * k))
        s = narrow_binary(OP_ADD, s, q, mode, t, 24, -126, 127, bits64(key, 2 * k + 1))
    return s


@njit(cache=True)
def _harmonic_f64(n):
    s = 0.0
    for k in range(1, n + 1):
        s += 1.0 / k
    return s


def harmonic(n: int, mode: str = "sr", *, seed: int = 0, precision: int | None = None) -> float:
    """Sum 1/k for k = 1..n sequentially in binary32 under ``mode`` (``"ieee"``, ``"sr"``,
    ``"ud"``, ``"random"``) at ``precision`` bits (default 24); one Stream(seed) key."""
    from ..errors import RoundingError

    if n < 0:
        raise RoundingError("n must be >= 0")
    t = 24 if precision is None else int(precision)
    if not 1 <= t <= 24:
        raise RoundingError(f"precision must be in [1, 24] for binary32, got {precision}")
    m = mode_code(mode)
    key = Stream(seed).next_key()
    return float(_harmonic_f32(int(n), m, t, np.uint64(key)))


def harmonic_f64(n: int) -> float:
    """The plain binary64 sequential sum (the paper's "IEEE binary64" row)."""
    return float(_harmonic_f64(int(n)))


@dataclass
class HarmonicRow:
    label: str
    mean: float
    std: float | None
    samples: list[float]
    paper: tuple[float, float | None] | None


def harmonic_table(n: int = 10_000_000, samples: int = 3, seed: int = 0,
                   precision: int | None = None, progress=None) -> list[HarmonicRow]:
    """Rows of the demo table: IEEE binary32, IEEE binary64, then SR, UD and random
    rounding over ``samples`` seeds seed..seed+samples-1 (mean and sample std)."""
    rows = [HarmonicRow("ieee binary32", v := harmonic(n, "ieee", precision=precision), None,
                        [v], PAPER["ieee binary32"] if precision is None else None)]
    v = harmonic_f64(n)
    rows.append(HarmonicRow("ieee binary64", v, None, [v], PAPER["ieee binary64"]))
    for mode in ("sr", "ud", "random"):
        vals = []
        for i in range(samples):
            vals.append(harmonic(n, mode, seed=seed + i, precision=precision))
            if progress is not None:
                progress()
        mean = math.fsum(vals) / len(vals)
        std = (math.sqrt(math.fsum((x - mean) ** 2 for x in vals) / (len(vals) - 1))
               if len(vals) > 1 else None)
        rows.append(HarmonicRow(mode, mean, std, vals,
                                PAPER[mode] if precision is None else None))
    return rows
