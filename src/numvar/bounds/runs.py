"""SR standard deviation per layer, read from a run directory.

Layer captures are stored as ``layers/<module path>#k`` (output of submodule ``path`` on
its k-th call; :mod:`numvar.runner.store`). The i-th call of a module in the analysed
graph is matched with the i-th capture of that path in increasing k.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch

from ..analysis.core import LAYER_RE   # layers/<module path>#k, parsed as the report does

log = logging.getLogger(__name__)


def sr_std(values: torch.Tensor) -> float | None:
    """Max over elements of the per-element standard deviation across realizations
    (axis 0, unbiased); None with fewer than two realizations."""
    if values.shape[0] < 2:
        return None
    v = values.detach().to(torch.float64)
    finite = torch.isfinite(v).all(dim=0)
    std = v.std(dim=0, unbiased=True)
    std = torch.where(finite, std, torch.zeros_like(std))
    return float(std.max()) if std.numel() else 0.0


def layer_captures(captures: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Module path → its ``layers/path#k`` capture names, ordered by k (a bare
    ``layers/path`` counts as the first call)."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in captures:
        m = LAYER_RE.match(name)
        if m:
            k = int(m["call"]) if m["call"] is not None else -1   # bare path: first
            groups.setdefault(m["path"], []).append((k, name))
    return {p: [n for _, n in sorted(v)] for p, v in groups.items()}


def _fits(capture: torch.Tensor, shape: tuple[int, ...] | None) -> bool:
    """A capture ``(R, *s)`` fits a layer output of ``shape`` when all but the leading
    (batch) dimension agree: the run may have used another batch size, not another model."""
    s = tuple(capture.shape[1:])
    return shape is None or (len(s) == len(shape) and s[1:] == tuple(shape)[1:])


def attach_sr_std(result: Any, run: Any) -> None:
    """Fill ``sr_std`` of each module row of ``result`` (a NetworkBounds) from ``run``:
    a run directory path or a :class:`~numvar.runner.store.Samples`. A capture whose
    shape does not fit the layer's output (other than in the batch dimension) is left
    out with a warning: it comes from another model."""
    from ..runner.store import Samples, load_run

    samples = run if isinstance(run, Samples) else load_run(Path(run))
    where = "the run" if isinstance(run, Samples) else f"run {run}"
    groups = layer_captures(samples.captures)
    calls: dict[str, int] = {}
    matched = 0
    for row in result.layers:
        if not row.module:
            continue
        i = calls.get(row.name, 0)
        calls[row.name] = i + 1
        names = groups.get(row.name, [])
        if i < len(names):
            cap = samples.captures[names[i]]
            if not _fits(cap, row.shape):
                log.warning("%s: capture %s has shape %s, layer %s outputs %s; left out",
                            where, names[i], tuple(cap.shape[1:]), row.name, row.shape)
                continue
            row.sr_std = sr_std(cap)
            matched += 1
    if not matched:
        log.warning("%s has no layer captures matching the model's layers "
                    "(expected names like layers/<module path>#k)", where)
    out_name = next((n for n in ("output", "output.0") if n in samples.captures), None)
    if out_name is not None and not _fits(samples.captures[out_name], result.output_shape):
        log.warning("%s: capture %s has shape %s, the model outputs %s; left out", where,
                    out_name, tuple(samples.captures[out_name].shape[1:]), result.output_shape)
        result.output_sr_std = None
    elif out_name is not None:
        result.output_sr_std = sr_std(samples.captures[out_name])
    else:
        last = [r.sr_std for r in result.layers if r.sr_std is not None]
        result.output_sr_std = last[-1] if last else None
    if result.output_sr_std is not None and math.isnan(result.output_sr_std):
        result.output_sr_std = None
