"""brain: a small 2D U-Net segmenting background / gray matter / white matter.

The stand-in for the Fuzzy PyTorch paper's FastSurfer workload that runs offline. Data
are the MNI152 2009 template and tissue maps that nilearn ships (no download): the T1
template is the input; the label of each voxel inside ``load_mni152_brain_mask`` is the
most probable of background (1 − p_GM − p_WM, CSF included), gray matter
(``load_mni152_gm_template``) and white matter (``load_mni152_wm_template``); outside the
mask it is background. Volumes at 2 mm are cropped to the brain (96×80 in-plane, H×W) and
optionally average-pooled further; axial slices with z % 5 == 2 are held out for testing.

The U-Net (Ronneberger et al., 2015) has conv3×3–BatchNorm–ReLU blocks, max pooling,
nearest upsampling and skip connections. Training uses a fixed seed, Adam, cross-entropy,
and random intensity gain and noise; the default configuration reaches Dice 0.94 for
both GM and WM on the 14 held-out slices.

API::

    from numvar.workloads import brain
    trained = brain.load_or_train()
    data = brain.load_data("test")
    logits = brain.infer(trained.model, data.inputs)     # (N, 3, H, W)
    brain.dice(logits.argmax(1), data.targets)           # {"gm": ..., "wm": ..., "mean": ...}
    brain.volumes(logits.argmax(1), data.voxel_ml)       # mL per tissue
    brain.disagreement(labels_over_realizations)         # per-voxel disagreement map

Script: ``python -m numvar.workloads.brain`` prints Dice and volumes on the test slices.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._common import (Trained, batches, cache_dir, capture, load_or_train_impl, script_setup,
                      train_impl)

NAME = "brain"
TRAIN_VERSION = 1
CLASSES = ("background", "gm", "wm")
DATA_VERSION = 1

# Crop of the 2 mm MNI152 grid (99, 117, 95) that holds the whole brain mask
# (mask extent x 13..85, y 14..103, z 0..77).
_CROP = (slice(9, 89), slice(10, 106), slice(0, 79))
_VOXEL_MM = 2.0


@dataclass(frozen=True)
class BrainConfig:
    """Resolution, model width and training schedule. Defaults train in about a minute
    on 2 cores; tests use ``downsample=2`` and fewer channels."""

    seed: int = 0
    downsample: int = 1            # extra average pooling of the 2 mm grid (1 = none)
    channels: tuple[int, ...] = (8, 16, 32)
    epochs: int = 40
    batch_size: int = 8
    lr: float = 3e-3
    min_brain_voxels: int = 200    # slices with fewer mask voxels (at 2 mm) are dropped
    test_every: int = 5            # hold out slices with z % test_every == test_offset
    test_offset: int = 2
    gain: float = 0.1              # training augmentation: gain in 1 ± gain
    noise: float = 0.02            # training augmentation: Gaussian noise std


@dataclass
class BrainData:
    """``inputs``: float32 (N, 1, H, W) T1 slices; ``targets``: int64 (N, H, W) labels
    (0 background, 1 GM, 2 WM); ``slices``: their z indices on the 2 mm grid;
    ``voxel_ml``: volume of one pixel × slice thickness, in mL."""

    inputs: torch.Tensor
    targets: torch.Tensor
    slices: list[int]
    voxel_ml: float

    def __len__(self) -> int:
        return len(self.targets)

    def subset(self, n: int | None) -> "BrainData":
        if n is None:
            return self
        return BrainData(self.inputs[:n], self.targets[:n], self.slices[:n], self.voxel_ml)


def _volumes_2mm() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(T1, brain mask, p_GM, p_WM) on the cropped 2 mm grid, as float32 (X, Y, Z);
    cached as safetensors in the cache folder (nilearn's resampling takes seconds)."""
    from .._io import load_tensors, save_tensors
    from ..errors import StoreError

    path = cache_dir() / f"brain-mni152-2mm-v{DATA_VERSION}.safetensors"
    try:
        d = load_tensors(path)
        return d["t1"], d["mask"], d["gm"], d["wm"]
    except StoreError:
        pass
    import numpy as np
    from nilearn import datasets

    def get(fn):
        img = fn(resolution=2)
        return torch.from_numpy(np.asarray(img.get_fdata(), dtype=np.float32)[_CROP].copy())

    t1 = get(datasets.load_mni152_template)
    mask = get(datasets.load_mni152_brain_mask)
    gm = get(datasets.load_mni152_gm_template)
    wm = get(datasets.load_mni152_wm_template)
    save_tensors(path, {"t1": t1, "mask": mask, "gm": gm, "wm": wm})
    return t1, mask, gm, wm


def load_data(split: str = "test", config: BrainConfig | None = None) -> BrainData:
    """Axial slices of the ``"train"`` or ``"test"`` split (see the module docstring)."""
    from ..errors import ConfigError

    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', not {split!r}")
    config = config or BrainConfig()
    t1, mask, gm, wm = _volumes_2mm()
    counts = (mask > 0).sum(dim=(0, 1))
    zs = [z for z in range(t1.shape[2]) if counts[z] >= config.min_brain_voxels]
    held = [z for z in zs if z % config.test_every == config.test_offset]
    zs = held if split == "test" else [z for z in zs if z not in held]
    zi = torch.tensor(zs)
    # (X, Y, Z) → (N=Z, 1, H=Y, W=X), pooled by `downsample`
    def take(v: torch.Tensor) -> torch.Tensor:
        s = v[:, :, zi].permute(2, 1, 0)[:, None].contiguous()
        return F.avg_pool2d(s, config.downsample) if config.downsample > 1 else s

    x = take(t1)
    pm = take(mask)
    pg, pw = take(gm), take(wm)
    probs = torch.cat([(1 - pg - pw), pg, pw], dim=1)
    y = probs.argmax(1)
    y[pm[:, 0] < 0.5] = 0
    voxel_ml = (_VOXEL_MM * config.downsample) ** 2 * _VOXEL_MM / 1000.0
    return BrainData(x, y.to(torch.int64), zs, voxel_ml)


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """2D U-Net: ``len(channels)`` levels, each two conv3×3–BN–ReLU, max pooling down,
    nearest upsampling and concatenated skips up, a 1×1 conv to class logits."""

    def __init__(self, channels: tuple[int, ...] = (8, 16, 32), in_channels: int = 1,
                 classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.down = nn.ModuleList()
        cin = in_channels
        for c in channels:
            self.down.append(_block(cin, c))
            cin = c
        self.pool = nn.MaxPool2d(2)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.up = nn.ModuleList(_block(channels[i + 1] + channels[i], channels[i])
                                for i in reversed(range(len(channels) - 1)))
        self.head = nn.Conv2d(channels[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        skips.pop()
        for block in self.up:
            x = block(torch.cat([self.upsample(x), skips.pop()], dim=1))
        return self.head(x)


def build_model(config: BrainConfig | None = None) -> UNet:
    """The U-Net for ``config`` (initialised from torch's global RNG)."""
    config = config or BrainConfig()
    return UNet(tuple(config.channels))


def infer(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Class logits (N, 3, H, W) of T1 slices (N, 1, H, W), without autograd.
    H and W must be divisible by 2**(levels − 1)."""
    with torch.no_grad():
        return model(inputs)


def dice(pred: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Dice 2|A∩B| / (|A| + |B|) of GM and WM over all given slices, and their mean
    (Dice, 1945). An empty class in both counts as 1."""
    out = {}
    for k, name in enumerate(CLASSES[1:], start=1):
        a, b = pred == k, target == k
        denom = int(a.sum()) + int(b.sum())
        out[name] = 1.0 if denom == 0 else 2.0 * int((a & b).sum()) / denom
    out["mean"] = (out["gm"] + out["wm"]) / 2
    return out


def volumes(labels: torch.Tensor, voxel_ml: float) -> dict[str, float]:
    """Volume in mL of GM and WM in a label map (any shape)."""
    return {name: int((labels == k).sum()) * voxel_ml
            for k, name in enumerate(CLASSES) if k > 0}


def disagreement(labels: torch.Tensor) -> torch.Tensor:
    """Per-voxel disagreement of R label maps (R, ...): the fraction of realizations whose
    label differs from the most frequent label at that voxel (0 = all agree)."""
    r = labels.shape[0]
    counts = torch.stack([(labels == k).sum(0) for k in range(len(CLASSES))])
    return (r - counts.max(0).values).to(torch.float64) / r


def evaluate(model: nn.Module, data: BrainData) -> dict[str, float]:
    """Dice (gm, wm, mean) and predicted volumes (vol_gm, vol_wm in mL) on ``data``."""
    model.eval()
    pred = infer(model, data.inputs).argmax(1)
    m = dice(pred, data.targets)
    m.update({f"vol_{k}": v for k, v in volumes(pred, data.voxel_ml).items()})
    return m


def train(config: BrainConfig | None = None) -> tuple[nn.Module, dict[str, float]]:
    """Train with a fixed seed; return the model (eval mode) and its held-out metrics.
    The caller's torch RNG state is left unchanged."""
    config = config or BrainConfig()

    def fit(model: nn.Module, tr: BrainData, gen: torch.Generator) -> None:
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.epochs)
        model.train()
        for _ in range(config.epochs):
            for idx in batches(len(tr), config.batch_size, gen):
                x = tr.inputs[idx]
                gain = 1 + config.gain * (2 * torch.rand(len(idx), 1, 1, 1, generator=gen) - 1)
                x = x * gain + config.noise * torch.randn(x.shape, generator=gen)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), tr.targets[idx])
                loss.backward()
                opt.step()
            sched.step()

    return train_impl(config, load_data, build_model, evaluate, fit)


def load_or_train(config: BrainConfig | None = None, *,
                  cache_dir: str | os.PathLike | None = None,
                  retrain: bool = False) -> Trained:
    """The cached model for ``config`` (trained and cached on first use)."""
    return load_or_train_impl(NAME, config or BrainConfig(), TRAIN_VERSION,
                              build_model, train, cache_dir, retrain)


def main(argv: list[str] | None = None, config: BrainConfig | None = None) -> int:
    """Segment the held-out slices and print Dice and volumes, one per line."""
    trained, data = script_setup(NAME, __doc__, "slices", argv, config, load_or_train,
                                 load_data)
    pred = infer(trained.model, data.inputs).argmax(1)
    d = dice(pred, data.targets)
    v = volumes(pred, data.voxel_ml)
    capture("segmentation", pred)     # label maps for `numvar report --task segmentation`
    print(f"slices {len(data)}")
    for k in ("gm", "wm", "mean"):
        print(f"dice_{k} {d[k]:.6f}")
    for k, val in v.items():
        print(f"volume_{k}_ml {val:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
