"""Decisions under variability: argmax flips, accuracy per realization, IEEE agreement.

Conventions (documented in the README):

- *score* captures are those whose name contains ``logits`` or ``probs`` (case-insensitive),
  shaped ``(R, N, C)`` (N samples, C classes, class axis last) or ``(R, C)`` (one sample).
  With one column (C = 1) the decision is ``score > 0`` (logits) or ``score > 0.5`` (probs).
- *labels* are a capture named ``labels`` or ``targets`` (or ending in ``.labels``,
  ``.targets``, ``/labels``, ``/targets``) with one integer class per sample.
- A sample *flips* when the decision of at least one realization differs from the IEEE
  decision (from the majority decision when no reference was stored); ``k`` counts those
  realizations, so ``k`` of ``R``.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from ..errors import AnalysisError
from ._util import centred_moments, fnum, gnum, mode_along0, to_numpy

SCORE_RE = re.compile(r"logits|probs", re.IGNORECASE)
LABEL_RE = re.compile(r"(^|[./])(labels|targets)$", re.IGNORECASE)
MAX_LISTED = 100  # flipped samples listed individually in the result


def is_score_name(name: str) -> bool:
    return bool(SCORE_RE.search(name))


def is_label_name(name: str) -> bool:
    return bool(LABEL_RE.search(name))


def decisions(scores: np.ndarray, name: str = "") -> np.ndarray:
    """Argmax over the last axis (first maximum wins); threshold when there is one column."""
    if scores.shape[-1] == 1:
        thr = 0.5 if "prob" in name.lower() else 0.0
        return (scores[..., 0] > thr).astype(np.int64)
    return np.argmax(scores, axis=-1).astype(np.int64)


def classify(scores: torch.Tensor, reference: torch.Tensor | None = None,
             labels: torch.Tensor | None = None, *, name: str = "") -> dict:
    """Flip statistics of score realizations ``(R, N, C)`` or ``(R, C)``.

    More leading axes (``(R, N, T, C)``) are flattened: each position is one decision.

    Keys: ``samples classes n against flipped_samples flip_rate unstable_samples
    flip_count_histogram flips_per_realization agreement_with_ieee
    agreement_per_realization scores_vary score_std_mean score_std_max
    samples_with_varying_scores stable_but_varying decision_never_flips_while_scores_vary
    margin{mean_min, z_min} accuracy flipped``.
    """
    x = to_numpy(scores).astype(np.float64)
    if x.ndim < 1:
        raise AnalysisError(f"classification scores {name!r} need a realization axis")
    R = x.shape[0]
    C = x.shape[-1] if x.ndim >= 2 else 1
    x = x.reshape(R, -1, C)  # (R, *lead, C): every leading position is one decision
    N = x.shape[1]
    preds = decisions(x, name)  # (R, N)
    ref_pred = None
    if reference is not None:
        ref = to_numpy(reference).astype(np.float64).reshape(N, C)
        ref_pred = decisions(ref[None], name)[0]
        base = ref_pred
    else:
        base = mode_along0(preds)[0]
    differ = preds != base[None, :]
    k = differ.sum(axis=0)
    unstable = ~np.all(preds == preds[:1], axis=0)
    varying = ~np.all(x == x[:1], axis=0)  # (N, C)
    vary_sample = varying.any(axis=1)
    std = centred_moments(x)[1] if R > 1 else np.zeros((N, C))
    flipped = k > 0
    # margin of the base decision: its score minus the best other score, per realization
    if C > 1:
        idx = base[None, :, None].repeat(R, 0)
        top = np.take_along_axis(x, idx, axis=2)[..., 0]
        other = np.where(np.arange(C)[None, None, :] == base[None, :, None], -np.inf, x).max(axis=2)
        margin = top - other  # (R, N)
        m_mean = margin.mean(axis=0)
        m_std = centred_moments(margin)[1] if R > 1 else np.zeros(N)
        pos = m_std > 0
        z = np.where(pos, m_mean / np.where(pos, m_std, 1.0), np.inf)
        margin_info = {"mean_min": gnum(m_mean.min()),
                       "z_min": gnum(z.min()) if pos.any() else None}
    else:
        margin_info = {"mean_min": None, "z_min": None}
    out = {
        "samples": int(N), "classes": int(C), "n": int(R),
        "against": "reference" if ref_pred is not None else "majority",
        "flipped_samples": int(flipped.sum()),
        "flip_rate": fnum(flipped.mean()),
        "unstable_samples": int(unstable.sum()),
        "flip_count_histogram": [int(c) for c in np.bincount(k, minlength=R + 1)],
        "flips_per_realization": [int(v) for v in differ.sum(axis=1)],
        "agreement_with_ieee": fnum(1.0 - differ.mean()) if ref_pred is not None else None,
        "agreement_per_realization": ([fnum(1.0 - v) for v in differ.mean(axis=1)]
                                      if ref_pred is not None else None),
        "scores_vary": bool(varying.any()),
        "score_std_mean": gnum(std.mean()),
        "score_std_max": gnum(std.max()),
        "samples_with_varying_scores": int(vary_sample.sum()),
        "stable_but_varying": int((vary_sample & ~flipped & ~unstable).sum()),
        "decision_never_flips_while_scores_vary": bool(varying.any() and not flipped.any()
                                                        and not unstable.any()),
        "margin": margin_info,
        "accuracy": None,
        "flipped": [],
    }
    if labels is not None:
        lab = to_numpy(labels).reshape(-1).astype(np.int64)
        if lab.size != N:
            raise AnalysisError(f"labels hold {lab.size} values for {N} samples of {name!r}")
        acc = (preds == lab[None, :]).mean(axis=1)
        out["accuracy"] = {
            "per_realization": [fnum(a) for a in acc],
            "mean": fnum(acc.mean()), "std": fnum(centred_moments(acc)[1]) if R > 1 else 0.0,
            "min": fnum(acc.min()), "max": fnum(acc.max()),
            "ieee": fnum((ref_pred == lab).mean()) if ref_pred is not None else None,
        }
    for i in np.nonzero(flipped | unstable)[0][:MAX_LISTED]:
        vals, cnt = np.unique(preds[:, i], return_counts=True)
        out["flipped"].append({
            "index": int(i), "k": int(k[i]),
            "ieee": int(ref_pred[i]) if ref_pred is not None else None,
            "label": int(to_numpy(labels).reshape(-1)[i]) if labels is not None else None,
            "decisions": {str(int(v)): int(c) for v, c in zip(vals, cnt)},
        })
    return out
