"""log10 of the bound curves against depth, as a PNG (a bare matplotlib Figure, rendered
by Agg; pyplot and the user's backend are left alone)."""

from __future__ import annotations

import io
import math
from typing import Any

from .._io import atomic_write_bytes


def _log10(values: list[float | None]) -> list[float]:
    return [math.log10(v) if v is not None and v > 0 and math.isfinite(v) else math.nan
            for v in values]


def plot_bounds(result: Any, path) -> None:
    """Plot a-priori, data-dependent, measured error (and SR std) per layer; write ``path``."""
    from matplotlib.figure import Figure   # no pyplot: the user's backend stays untouched

    rows = result.layers
    depth = [r.index for r in rows]
    fig = Figure(figsize=(max(6.0, 0.35 * len(rows) + 3), 4.5))
    ax = fig.add_subplot(1, 1, 1)
    curves = [("a-priori bound", [r.apriori for r in rows], "o-"),
              ("data-dependent bound", [r.data_dependent for r in rows], "s-"),
              ("measured |computed - float64|", [r.measured for r in rows], "^-")]
    if any(r.sr_std is not None for r in rows):
        curves.append(("SR std", [r.sr_std for r in rows], "d--"))
    for label, vals, style in curves:
        ax.plot(depth, _log10(vals), style, label=label, markersize=4)
    ax.set_xlabel("depth (layer)")
    ax.set_ylabel("log10 error")
    ax.set_title(f"rounding error per layer ({result.precision})")
    ax.set_xticks(depth)
    ax.set_xticklabels([f"{r.name} ({r.kind})" for r in rows], rotation=70, fontsize=7)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(path, buf.getvalue())
