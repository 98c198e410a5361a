"""Small helpers shared by the analysis modules."""

from __future__ import annotations

import math

import numpy as np
import torch


def to_numpy(t) -> np.ndarray:
    """A CPU numpy copy/view of a tensor (bfloat16/float16 widened to float32)."""
    if isinstance(t, torch.Tensor):
        t = t.detach().to("cpu")
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.numpy()
    return np.asarray(t)


def fnum(v, nd: int = 6):
    """A JSON-safe float rounded to ``nd`` decimals (None for NaN/inf/None)."""
    if v is None:
        return None
    v = float(v)
    return round(v, nd) if math.isfinite(v) else None


def gnum(v, sig: int = 6):
    """A JSON-safe float kept to ``sig`` significant figures (None for NaN/inf)."""
    if v is None:
        return None
    v = float(v)
    if not math.isfinite(v):
        return None
    return float(f"{v:.{sig}g}")


def mode_along0(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Most frequent value along axis 0 and its count; ties go to the smallest value.

    Vectorised over the trailing axes in O(R·M) after one sort along axis 0.
    """
    s = np.sort(a, axis=0)
    best = s[0].copy()
    bestc = np.ones(s.shape[1:], dtype=np.int64)
    run = np.ones(s.shape[1:], dtype=np.int64)
    for i in range(1, s.shape[0]):
        same = s[i] == s[i - 1]
        run = np.where(same, run + 1, 1)
        better = run > bestc
        best = np.where(better, s[i], best)
        bestc = np.where(better, run, bestc)
    return best, bestc


def centred_moments(x: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample standard deviation (R−1) along ``axis``, in float64, two-pass and
    centred on the first realization: ``d = x - x[0]``, ``mean = x[0] + mean(d)``,
    ``std = sqrt(sum((d - mean(d))**2) / (R-1))``.

    Bitwise-identical realizations give ``d = 0`` exactly, hence std exactly 0 and the
    mean exactly the common value (``numpy.std`` gives ~1e-16 there: the rounding error
    of its own mean); centring also keeps the tiny spread of large values accurate."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, 0)
    R = x.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        d = x - x[:1]
        md = d.mean(axis=0)
        var = ((d - md) ** 2).sum(axis=0) / max(R - 1, 1)
    return x[0] + md, np.sqrt(var)
