"""Spatial view: where an image or segmentation output varies, as arrays and a PNG.

The output's last two axes are taken as the image plane (H, W); every leading axis
(batch, channels) is reduced by the worst case:

- ``digits[h, w]``: the minimum significant digits over the leading axes at that pixel
  (everything perturbed);
- ``flips[h, w]`` (segmentations, ``class_dim`` given): the share of (realization, batch
  item) pairs whose label ``argmax`` over ``class_dim`` differs from the IEEE reference's
  label at that pixel; 0 where every realization agrees.

This is how the background instability of FastSurfer shows up in the Fuzzy PyTorch
paper: low digits / frequent flips away from the brain.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass
class SpatialMap:
    """Per-pixel maps (H, W) of an output of shape ``shape``; see the module docstring."""

    digits: np.ndarray
    cap: float
    shape: tuple[int, ...]
    flips: np.ndarray | None = None
    class_dim: int | None = None

    def summary(self) -> dict:
        """JSON-able: shape, the worst pixel and the share of pixels below the cap."""
        d = self.digits
        worst = np.unravel_index(int(np.argmin(d)), d.shape)
        out = {
            "shape": list(self.shape),
            "map_shape": list(d.shape),
            "min_digits": round(float(d.min()), 6),
            "median_digits": round(float(np.median(d)), 6),
            "worst_pixel": [int(i) for i in worst],
            "share_below_cap": round(float(np.mean(d < self.cap)), 6),
        }
        if self.flips is not None:
            out["class_dim"] = self.class_dim
            out["max_flip_rate"] = round(float(self.flips.max()), 6)
            out["share_flipping"] = round(float(np.mean(self.flips > 0)), 6)
        return out


def spatial_map(digits: np.ndarray, *, cap: float, samples=None, reference=None,
                class_dim: int | None = None) -> SpatialMap:
    """Build a :class:`SpatialMap` from per-element digits of an output.

    ``digits``: per-element significant digits, the output's shape (at least 2-D).
    ``samples`` (R, *shape) and ``reference`` (shape) are needed for ``class_dim`` (an
    axis of the output, e.g. 1 for (B, C, H, W) logits).
    """
    d = np.asarray(digits, dtype=np.float64)
    check_axes(tuple(d.shape), class_dim)
    H, W = d.shape[-2:]
    dmap = d.reshape(-1, H, W).min(axis=0)
    flips = None
    if class_dim is not None:
        if samples is None or reference is None:
            raise ConfigError("class_dim needs the realizations and the reference")
        s = np.asarray(samples)
        ref = np.asarray(reference)
        cd = class_dim % d.ndim
        lab = s.argmax(axis=cd + 1)                      # (R, *shape without class axis)
        rlab = ref.argmax(axis=cd)
        differ = lab != rlab[None]
        flips = differ.reshape(-1, H, W).mean(axis=0)
    return SpatialMap(digits=dmap, cap=float(cap), shape=tuple(int(s) for s in d.shape),
                      flips=flips, class_dim=class_dim)


def check_axes(shape: tuple[int, ...], class_dim: int | None) -> None:
    """ConfigError unless an output of ``shape`` has a spatial view (at least 2 axes) and
    ``class_dim`` (if given) is one of its axes other than the last two (the image)."""
    nd = len(shape)
    if nd < 2:
        raise ConfigError(f"the spatial view needs an output with at least 2 axes, "
                          f"got shape {shape}")
    if class_dim is not None:
        if isinstance(class_dim, bool) or not isinstance(class_dim, int) \
                or not -nd <= class_dim < nd:
            raise ConfigError(f"--class-dim {class_dim!r} is not an axis of the output "
                              f"(shape {shape})")
        if class_dim % nd >= nd - 2:
            raise ConfigError(f"--class-dim {class_dim} is an image axis of the output "
                              f"(shape {shape}; the last two axes are the image)")


def render_png(m: SpatialMap, *, title: str = "where the output varies") -> bytes:
    """The map(s) as PNG bytes (matplotlib, Agg backend; nothing global is changed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = 1 if m.flips is None else 2
    fig = Figure(figsize=(4.2 * panels, 3.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, panels, 1)
    im = ax.imshow(m.digits, cmap="magma", vmin=0.0, vmax=m.cap, interpolation="nearest")
    ax.set_title("significant digits (min over batch/channels)", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if m.flips is not None:
        ax2 = fig.add_subplot(1, panels, 2)
        im2 = ax2.imshow(m.flips, cmap="viridis", vmin=0.0, vmax=max(1e-12, float(m.flips.max())),
                         interpolation="nearest")
        ax2.set_title("label flip rate vs IEEE", fontsize=8)
        fig.colorbar(im2, ax=ax2, fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def save_png(m: SpatialMap, path, **kw) -> None:
    """Write :func:`render_png` to ``path`` atomically."""
    from .._io import atomic_write_bytes

    atomic_write_bytes(path, render_png(m, **kw))
