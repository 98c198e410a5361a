"""Significant digits of realizations, through the ``significantdigits`` package.

Sohier et al., "Confidence intervals for stochastic arithmetic", ACM TOMS 47(2), 2021.
Z is the error of each realization against the reference x: relative ``X/x - 1`` or
absolute ``X - x``; R realizations.

- **CNH** (centred normality hypothesis: Z ~ N(0, σ²)): numvar uses the root mean square
  of Z about its hypothesised centre 0, ``ρ̂ = sqrt(mean_i Z_i²)``, as the estimate of σ::

      s = -log2(ρ̂) + (e - 1) - δ,   δ = ½·log2((R-1)/χ²_{(1-c)/2, R-1}) + log2 Φ⁻¹((p+1)/2)

  (e = 1 for the relative error, ``floor(log2|x|) + 1`` for the absolute one, as in the
  package). The package itself (0.6) uses the population standard deviation σ̂ of Z about
  its *sample mean* m, falling back to max|Z| when σ̂ = 0; that drops a common bias m as
  soon as any spread appears, so its digits jump (four realizations with relative bias
  2⁻¹⁰: 7.1 bits; add 2⁻²² to one: 20.3 bits). Since ``ρ̂² = m² + σ̂²``, numvar's value
  is the package's minus ``½·log2(1 + m²/σ̂²)``: equal to it when m = 0 (no bias) and
  when σ̂ = 0 (pure bias, ``ρ̂ = |m|``), continuous in between. Under the CNH, ``R·ρ̂²/σ²``
  follows χ²_R, for which the package's δ (R-1 degrees of freedom) is conservative
  (by 0.38 bits at R = 4, 0.06 at R = 10). With unbiased errors (SR) against the IEEE
  reference the sample mean m still fluctuates (≈ σ/√R): numvar's values then lie on
  average ≈ ½·log2(1 + 1/(R-1)) below the package's (0.08 bits at R = 10). With a
  biased Z ~ N(μ, σ²), ``Φ⁻¹((p+1)/2)·ρ`` (ρ² = μ² + σ²) still bounds the p-quantile of |Z| for every μ/σ whenever p ≥ 0.92
  (the default 0.95 included); for smaller p a pure bias is under-counted.
- **General** (no distribution assumed): ``s = max{k : |Z_i| ≤ 2^-k for every i}``; a bias
  counts fully (it is in every |Z_i|). It holds with probability ``p`` at confidence ``c``
  once ``R ≥ ln(1-c)/ln(p)`` (:func:`minimum_trials`).

The package's ``reference=None`` path is broken (see REFERENCE.md), so a reference is
always passed: the IEEE result, or the sample mean (then m ≈ 0 and both CNH forms agree).
When every error is exactly zero the package returns ≈ 50 bits (the float64 mantissa
minus δ); numvar caps every result at the format's precision (24 bits for binary32) and
flags those elements as *no variation observed* instead.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import AnalysisError
from ._util import fnum

METHODS = ("cnh", "general")
ERRORS = ("relative", "absolute")
_CHUNK = 1 << 21  # elements per call into significantdigits (bounds float64 temporaries)

# significand precision (implicit bit included) of the formats numvar handles
PRECISION_BITS = {
    torch.float64: 53, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11,
}


def precision_of(dtype: torch.dtype) -> int:
    """Significand bits of a floating dtype (53, 24, 11, 8); AnalysisError otherwise."""
    try:
        return PRECISION_BITS[dtype]
    except KeyError:
        raise AnalysisError(f"no significant digits for dtype {dtype}") from None


def minimum_trials(probability: float = 0.95, confidence: float = 0.95) -> int:
    """Realizations needed for the General method: ``ceil(ln(1-c) / ln(p))`` (Sohier et al.)."""
    import significantdigits as sd

    return int(sd.minimum_number_of_trials(probability, confidence))


@dataclass
class SigDigits:
    """Per-element significant digits of realizations ``x`` of shape ``(R, *shape)``.

    ``digits`` (float64, ``shape``) are in ``basis``, clipped to ``[0, cap]`` where ``cap`` is
    the format's precision in that basis. ``no_variation`` marks elements whose every error
    is exactly zero (digits = cap; "no variation observed"). ``undefined`` marks elements
    whose relative error is unbounded (zero reference but varying values, or non-finite
    values): their digits are 0.
    """

    digits: np.ndarray
    no_variation: np.ndarray
    undefined: np.ndarray
    cap: float
    precision_bits: int
    method: str
    basis: int
    error: str
    probability: float
    confidence: float
    n: int

    def summary(self) -> dict:
        """JSON-able summary; see :func:`summarize_digits`."""
        return summarize_digits(self)


def _check(method: str, basis: int, error: str, probability: float, confidence: float):
    if method not in METHODS:
        raise AnalysisError(f"method must be one of {METHODS}, not {method!r}")
    if error not in ERRORS:
        raise AnalysisError(f"error must be one of {ERRORS}, not {error!r}")
    if not isinstance(basis, int) or basis < 2:
        raise AnalysisError(f"basis must be an integer >= 2, not {basis!r}")
    if not (0.0 < probability < 1.0 and 0.0 < confidence < 1.0):
        raise AnalysisError("probability and confidence must lie strictly between 0 and 1")


def _as_f64(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def _cnh_bias_bits(xs: np.ndarray, ref: np.ndarray, error: str) -> np.ndarray:
    """``log2(ρ̂/σ̂) = ½·log2(1 + m²/σ̂²)`` per element (0 where σ̂ = 0): the bits by which
    the root mean square ρ̂ of Z exceeds the package's standard deviation σ̂ of Z about its
    mean m. Z is formed as the package forms it (float64, ``X/x - 1`` or ``X - x``)."""
    z = xs / ref[None, :] - 1.0 if error == "relative" else xs - ref[None, :]
    m = z.mean(axis=0)
    s = z.std(axis=0)
    ok = (s > 0) & np.isfinite(s) & np.isfinite(m)
    safe = np.where(ok, s, 1.0)
    return np.where(ok, np.log2(np.hypot(np.where(ok, m, 0.0), safe)) - np.log2(safe), 0.0)


def significant_digits(x: torch.Tensor, reference, *, method: str = "cnh", basis: int = 2,
                       error: str = "relative", probability: float = 0.95,
                       confidence: float = 0.95, precision_bits: int | None = None
                       ) -> SigDigits:
    """Significant digits of realizations ``x`` (``(R, ...)``) against ``reference``.

    ``reference`` has ``x``'s trailing shape (the IEEE result, or ``x.mean(0)``; pass
    ``"mean"`` for the latter). ``precision_bits`` defaults to ``x``'s format (24 for
    float32). Digits are capped at that precision and clipped below at 0.

    ``method="cnh"`` counts a bias of the realizations against the reference: σ is
    estimated by the root mean square of the errors, ``sqrt(mean Z²)``, not by their
    standard deviation about their mean (which the package uses, and which ignores a
    common bias as soon as anything varies); see the module docstring.
    """
    _check(method, basis, error, probability, confidence)
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    if x.ndim < 1 or x.shape[0] < 2:
        raise AnalysisError(f"need at least 2 realizations along axis 0, got shape {tuple(x.shape)}")
    if precision_bits is None:
        precision_bits = precision_of(x.dtype) if x.is_floating_point() else 53
    R = x.shape[0]
    shape = tuple(x.shape[1:])
    xs = _as_f64(x).reshape(R, -1)
    if isinstance(reference, str):
        if reference != "mean":
            raise AnalysisError(f"reference must be a tensor or 'mean', not {reference!r}")
        same = np.all(xs == xs[:1], axis=0)
        ref = np.where(same, xs[0], xs.mean(axis=0))  # exact when every value is equal
    else:
        ref = _as_f64(reference)
        if ref.shape != shape:
            raise AnalysisError(f"reference shape {ref.shape} differs from the realizations' {shape}")
        ref = ref.reshape(-1)
    import significantdigits as sd

    M = xs.shape[1]
    out = np.empty(M, dtype=np.float64)
    for lo in range(0, M, _CHUNK):
        hi = min(M, lo + _CHUNK)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # relative error at a zero reference: handled below
            out[lo:hi] = sd.significant_digits(
                xs[:, lo:hi], reference=ref[lo:hi], axis=0, basis=2,
                error=sd.Error.Relative if error == "relative" else sd.Error.Absolute,
                method=sd.Method.CNH if method == "cnh" else sd.Method.General,
                probability=probability, confidence=confidence, dtype=np.float64)
            if method == "cnh":
                out[lo:hi] -= _cnh_bias_bits(xs[:, lo:hi], ref[lo:hi], error)
    # No variation observed: every realization equals the reference exactly (all Z = 0).
    no_var = np.all(xs == ref[None, :], axis=0)
    finite = np.all(np.isfinite(xs), axis=0) & np.isfinite(ref)
    undefined = ~no_var & (~finite | ~np.isfinite(out))
    bits = np.clip(np.where(undefined, 0.0, out), 0.0, float(precision_bits))
    bits[no_var] = float(precision_bits)
    factor = math.log(2) / math.log(basis)  # change of basis, as significantdigits.change_basis
    return SigDigits(
        digits=(bits * factor).reshape(shape), no_variation=no_var.reshape(shape),
        undefined=undefined.reshape(shape), cap=precision_bits * factor,
        precision_bits=int(precision_bits), method=method, basis=basis, error=error,
        probability=probability, confidence=confidence, n=R)


def summarize_digits(sd: SigDigits) -> dict:
    """min, median, mean, max, 5th percentile, counts, and a histogram with unit-wide bins.

    Keys: ``min median mean max p05 median_varying cap no_variation no_variation_share
    undefined numel all_no_variation histogram{edges,counts}``; ``median_varying`` is the
    median over the elements that varied (None when none did).
    """
    d = sd.digits.reshape(-1)
    n = d.size
    edges = [float(e) for e in np.arange(0, math.ceil(sd.cap) + 1, 1.0)]
    if edges[-1] < sd.cap:
        edges.append(float(math.ceil(sd.cap)))
    counts, _ = np.histogram(d, bins=np.asarray(edges))
    nv = int(sd.no_variation.sum())
    var = d[~sd.no_variation.reshape(-1)]
    return {
        "min": fnum(d.min()) if n else None,
        "median": fnum(np.median(d)) if n else None,
        "mean": fnum(d.mean()) if n else None,
        "max": fnum(d.max()) if n else None,
        "p05": fnum(np.percentile(d, 5)) if n else None,
        "median_varying": fnum(np.median(var)) if var.size else None,
        "cap": fnum(sd.cap),
        "numel": int(n),
        "no_variation": nv,
        "no_variation_share": fnum(nv / n) if n else None,
        "all_no_variation": bool(n and nv == n),
        "undefined": int(sd.undefined.sum()),
        "histogram": {"edges": [fnum(e) for e in edges], "counts": [int(c) for c in counts]},
    }
