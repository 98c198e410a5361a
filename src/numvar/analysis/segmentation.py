"""Segmentations under variability: per-label Dice, disagreement map, label volumes.

Label maps are integer captures ``(R, *spatial)``; score captures (name containing
``logits``/``probs``) are turned into label maps by an argmax over the class axis, which
is axis 1 of a batched ``(N, C, *spatial)`` map (per-realization ndim ≥ 4) and axis 0 of
a ``(C, H, W)`` map (ndim 3), the PyTorch layout.

Sørensen–Dice of label l between a realization A and the IEEE map B:
``2|A_l ∩ B_l| / (|A_l| + |B_l|)`` (1 when the label is absent from both). The
disagreement map is, per voxel, the share of realizations whose label differs from the
voxel's majority label (``1 - count(mode)/R``; ties go to the smallest label).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import AnalysisError
from ._util import centred_moments, fnum, gnum, mode_along0, to_numpy


def label_maps(x: torch.Tensor, name: str = "", *, per_realization: bool = True) -> np.ndarray:
    """Integer label maps from a capture (``(R, ...)`` when ``per_realization``)."""
    a = to_numpy(x)
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    if np.all(np.isfinite(a)) and np.all(a == np.round(a)) and not any(
            w in name.lower() for w in ("logits", "probs")):
        return a.astype(np.int64)
    nd = a.ndim - (1 if per_realization else 0)
    if nd < 3:
        raise AnalysisError(f"{name!r}: floating scores need a class axis "
                            f"((C, H, W) or (N, C, ...)), got shape {tuple(a.shape)}")
    axis = (1 if nd >= 4 else 0) + (1 if per_realization else 0)
    return np.argmax(a, axis=axis).astype(np.int64)


def disagreement_map(maps: np.ndarray) -> np.ndarray:
    """Per voxel, the share of realizations disagreeing with the majority label."""
    _, count = mode_along0(maps)
    return 1.0 - count / maps.shape[0]


def segment(maps: np.ndarray, reference: np.ndarray | None = None, *,
            background: int | None = 0) -> dict:
    """Dice, disagreement and volume statistics of label maps ``(R, *spatial)``.

    Keys: ``n against voxels labels{label: {dice_mean dice_min dice_per_realization
    volume_mean volume_std volume_cv volume_ieee}} dice_mean dice_min
    disagreement{voxels share max mean}``. ``background`` is left out of the per-label
    statistics (None keeps every label).
    """
    R = maps.shape[0]
    flat = maps.reshape(R, -1)
    base = mode_along0(flat)[0] if reference is None else reference.reshape(-1).astype(np.int64)
    if base.shape[0] != flat.shape[1]:
        raise AnalysisError(f"reference map has {base.shape[0]} voxels, realizations {flat.shape[1]}")
    labels = np.unique(np.concatenate([np.unique(flat), np.unique(base)]))
    K = labels.size
    bi = np.searchsorted(labels, base)
    inter = np.zeros((R, K), dtype=np.int64)
    vol = np.zeros((R, K), dtype=np.int64)
    for r in range(R):
        ri = np.searchsorted(labels, flat[r])
        conf = np.bincount(bi * K + ri, minlength=K * K).reshape(K, K)
        inter[r] = np.diag(conf)
        vol[r] = conf.sum(axis=0)
    bvol = np.bincount(bi, minlength=K)
    denom = vol + bvol[None, :]
    dice = np.where(denom > 0, 2.0 * inter / np.where(denom > 0, denom, 1), 1.0)
    keep = [j for j in range(K) if background is None or labels[j] != background]
    dis = disagreement_map(flat)
    per = {}
    for j in keep:
        v = vol[:, j].astype(np.float64)
        m = v.mean()
        s = float(centred_moments(v)[1]) if R > 1 else 0.0
        per[str(int(labels[j]))] = {
            "dice_mean": fnum(dice[:, j].mean()), "dice_min": fnum(dice[:, j].min()),
            "dice_per_realization": [fnum(d) for d in dice[:, j]],
            "volume_mean": gnum(m), "volume_std": gnum(s),
            "volume_cv": gnum(s / m) if m > 0 else None,
            "volume_ieee": int(bvol[j]) if reference is not None else None,
        }
    dk = dice[:, keep] if keep else dice
    return {
        "n": int(R), "against": "reference" if reference is not None else "majority",
        "voxels": int(flat.shape[1]),
        "labels": per,
        "dice_mean": fnum(dk.mean()) if dk.size else None,
        "dice_min": fnum(dk.min()) if dk.size else None,
        "disagreement": {"voxels": int((dis > 0).sum()), "share": fnum((dis > 0).mean()),
                         "max": fnum(dis.max()), "mean": gnum(dis.mean())},
    }
