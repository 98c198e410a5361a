"""digits: a LeNet-style CNN on scikit-learn's bundled handwritten digits.

The stand-in for the Fuzzy PyTorch paper's MNIST workload that runs offline: the
1797 8×8 images of ``sklearn.datasets.load_digits`` (pixel values 0..16) are upsampled
bilinearly to 28×28 (MNIST's size) and split, stratified with a fixed seed, into a
training and a test split. LeNet-5 (LeCun et al., 1998; ReLU and max pooling instead of
tanh and subsampling) trains in a few seconds on a CPU and reaches ≈ 98 % test accuracy.

API::

    from numvar.workloads import digits
    trained = digits.load_or_train()          # cached in the user cache dir
    data = digits.load_data("test")
    logits = digits.infer(trained.model, data.inputs)
    digits.evaluate(trained.model, data)      # {"accuracy": ..., "loss": ...}

Script: ``python -m numvar.workloads.digits [--limit N] [--retrain]`` prints the test
metrics (an unmodified script for ``numvar run``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._common import (Trained, batches, load_or_train_impl, metrics_from_logits,
                      print_classification, script_setup, train_impl)

NAME = "digits"
TRAIN_VERSION = 1
CLASSES = 10


@dataclass(frozen=True)
class DigitsConfig:
    """Data split, model width and training schedule. Defaults train in seconds."""

    seed: int = 0
    size: int = 28                # side of the upsampled images
    test_fraction: float = 0.25   # 450 of 1797 images
    channels: tuple[int, int] = (6, 16)
    hidden: tuple[int, int] = (120, 84)
    epochs: int = 12
    batch_size: int = 64
    lr: float = 2e-3


@dataclass
class DigitsData:
    """``inputs``: float32 (N, 1, size, size), standardised; ``targets``: int64 (N,)."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)

    def subset(self, n: int | None) -> "DigitsData":
        """The first ``n`` examples (all when ``n`` is None)."""
        if n is None:
            return self
        return DigitsData(self.inputs[:n], self.targets[:n])


# Pixel statistics of sklearn's digits after scaling to [0, 1]; fixed so that the
# standardisation does not depend on the split.
_MEAN, _STD = 0.3, 0.4


def load_data(split: str = "test", config: DigitsConfig | None = None) -> DigitsData:
    """The ``"train"`` or ``"test"`` split (stratified, ``config.seed``), upsampled."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from ..errors import ConfigError

    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', not {split!r}")
    config = config or DigitsConfig()
    ds = load_digits()
    idx_train, idx_test = train_test_split(
        list(range(len(ds.target))), test_size=config.test_fraction,
        random_state=config.seed, stratify=ds.target)
    idx = torch.tensor(idx_train if split == "train" else idx_test)
    images = torch.as_tensor(ds.images, dtype=torch.float32)[idx] / 16.0
    x = F.interpolate(images[:, None], size=(config.size, config.size),
                      mode="bilinear", align_corners=False)
    x = (x - _MEAN) / _STD
    y = torch.as_tensor(ds.target, dtype=torch.int64)[idx]
    return DigitsData(x.contiguous(), y)


def build_model(config: DigitsConfig | None = None) -> nn.Sequential:
    """LeNet-5: conv5×5 → ReLU → maxpool → conv5×5 → ReLU → maxpool → 3 dense layers.

    Layers are named (``conv1``, ``relu1``, ``pool1``, ..., ``fc3``) so per-layer
    captures read well. Initialisation uses torch's global RNG (seed it, or use
    :func:`train`, which does).
    """
    config = config or DigitsConfig()
    c1, c2 = config.channels
    h1, h2 = config.hidden
    side = ((config.size // 2) - 4) // 2   # 28 → 14 → 10 → 5
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(1, c1, 5, padding=2)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(c1, c2, 5)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(c2 * side * side, h1)),
        ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(h1, h2)),
        ("relu4", nn.ReLU()),
        ("fc3", nn.Linear(h2, CLASSES)),
    ]))


def infer(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Logits (N, 10) of ``inputs`` (N, 1, size, size), without autograd."""
    with torch.no_grad():
        return model(inputs)


def evaluate(model: nn.Module, data: DigitsData) -> dict[str, float]:
    """``{"accuracy", "loss"}`` of ``model`` on ``data``."""
    model.eval()
    return metrics_from_logits(infer(model, data.inputs), data.targets)


def train(config: DigitsConfig | None = None) -> tuple[nn.Module, dict[str, float]]:
    """Train from scratch with a fixed seed (Adam, cross-entropy); return the model in
    eval mode and its test metrics. The caller's torch RNG state is left unchanged."""
    config = config or DigitsConfig()

    def fit(model: nn.Module, train_data: DigitsData, gen: torch.Generator) -> None:
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
        model.train()
        for _ in range(config.epochs):
            for idx in batches(len(train_data), config.batch_size, gen):
                opt.zero_grad()
                loss = F.cross_entropy(model(train_data.inputs[idx]), train_data.targets[idx])
                loss.backward()
                opt.step()

    return train_impl(config, load_data, build_model, evaluate, fit)


def load_or_train(config: DigitsConfig | None = None, *,
                  cache_dir: str | os.PathLike | None = None,
                  retrain: bool = False) -> Trained:
    """The cached model for ``config`` (trained and cached on first use)."""
    return load_or_train_impl(NAME, config or DigitsConfig(), TRAIN_VERSION,
                              build_model, train, cache_dir, retrain)


def main(argv: list[str] | None = None, config: DigitsConfig | None = None) -> int:
    """Run inference on the test split and print its metrics, one per line."""
    trained, data = script_setup(NAME, __doc__, "images", argv, config, load_or_train,
                                 load_data)
    print_classification("images", data, infer(trained.model, data.inputs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
