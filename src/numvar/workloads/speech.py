"""speech: a small WavLM classifying synthetic voiced signals, steady versus tremor.

The stand-in for the Fuzzy PyTorch paper's WavLM workload (Parkinson's detection from
speech) that runs offline. The model is transformers' ``WavLMForSequenceClassification``
built from a small ``WavLMConfig`` with random initialisation (nothing is downloaded), so
the real WavLM path runs: the convolutional feature encoder with group norm and GELU,
the feature projection with layer norm, the grouped positional convolution with weight
norm, self-attention with gated relative position bias, feed-forward GELU layers, the
projector, mean pooling and the classifier.

Data are synthetic sustained vowels (a "sustained /a/" task): 1 s at 4 kHz, a harmonic
source (amplitudes 1/h up to 1.8 kHz) whose fundamental f0 ∈ [90, 220] Hz either stays
steady (small random jitter, a glide of at most ±1 %, 5 % slow shimmer) or carries a
vocal tremor: a sinusoidal f0 modulation of depth 6–15 % at 4–8 Hz (the range of
parkinsonian and essential tremor) with a co-modulated amplitude (depth 25–50 %);
white noise at 25 dB SNR in both classes.
Each signal is standardised to zero mean and unit variance, as the WavLM feature
extractor does. Label 1 is tremor.

API::

    from numvar.workloads import speech
    trained = speech.load_or_train()
    data = speech.load_data("test")
    logits = speech.infer(trained.model, data.inputs)     # (N, 2)
    speech.evaluate(trained.model, data)                  # {"accuracy", "loss"}

Script: ``python -m numvar.workloads.speech`` prints the test metrics.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._common import (Trained, batches, load_or_train_impl, metrics_from_logits,
                      print_classification, script_setup, train_impl)

NAME = "speech"
TRAIN_VERSION = 1
CLASSES = ("steady", "tremor")


@dataclass(frozen=True)
class SpeechConfig:
    """Signal synthesis, WavLM size and training schedule."""

    seed: int = 0
    sample_rate: int = 4000
    seconds: float = 1.0
    n_train: int = 256
    n_test: int = 128
    # WavLM architecture (a scaled-down wavlm-base)
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    conv_dim: tuple[int, ...] = (32, 32, 32, 32)
    conv_kernel: tuple[int, ...] = (10, 3, 3, 3)
    conv_stride: tuple[int, ...] = (5, 2, 2, 2)
    num_conv_pos_embeddings: int = 16
    num_conv_pos_embedding_groups: int = 4
    num_buckets: int = 32
    max_bucket_distance: int = 100
    classifier_proj_size: int = 32
    # training
    epochs: int = 10
    batch_size: int = 8
    lr: float = 1e-3


@dataclass
class SpeechData:
    """``inputs``: float32 (N, samples) standardised waveforms; ``targets``: int64 (N,)
    (0 steady, 1 tremor); ``f0``: float64 (N,) mean fundamental in Hz."""

    inputs: torch.Tensor
    targets: torch.Tensor
    f0: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)

    def subset(self, n: int | None) -> "SpeechData":
        if n is None:
            return self
        return SpeechData(self.inputs[:n], self.targets[:n], self.f0[:n])


def synthesize(n: int, *, seed: int, sample_rate: int = 4000, seconds: float = 1.0,
               tremor: torch.Tensor | None = None) -> SpeechData:
    """``n`` synthetic sustained vowels (see the module docstring), half of them with
    tremor unless ``tremor`` (bool (n,)) says which. Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.float64

    def u(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, 1, generator=g, dtype=dt)

    if tremor is None:
        tremor = torch.arange(n) % 2 == 1
        tremor = tremor[torch.randperm(n, generator=g)]
    L = int(round(sample_rate * seconds))
    t = torch.arange(L, dtype=dt)[None] / sample_rate
    f0 = u(90.0, 220.0)
    glide = u(-0.01, 0.01) * (2 * t / seconds - 1)
    # jitter: smooth random f0 perturbation (sum of 3 slow sinusoids, ±0.5 %)
    jitter = sum(0.005 / 3 * torch.sin(2 * math.pi * u(0.3, 2.5) * t + u(0, 2 * math.pi))
                 for _ in range(3))
    on = tremor[:, None].to(dt)
    depth = u(0.06, 0.15) * on
    rate = u(4.0, 8.0)
    tphase = 2 * math.pi * rate * t + u(0, 2 * math.pi)
    mod = depth * torch.sin(tphase)
    f = f0 * (1 + glide + jitter + mod)
    phase = 2 * math.pi * torch.cumsum(f, dim=1) / sample_rate + u(0, 2 * math.pi)
    h = torch.arange(1, 40, dtype=dt)[None, :, None]
    amp = (1.0 / h) * (h * f0[:, :, None] < 1800.0)
    x = (amp * torch.sin(h * phase[:, None, :])).sum(1)
    shimmer = 1 + 0.05 * torch.sin(2 * math.pi * u(0.5, 3.0) * t + u(0, 2 * math.pi))
    x = x * shimmer * (1 + u(0.25, 0.5) * on * torch.sin(tphase))
    x = x + x.std(dim=1, keepdim=True) * 10 ** (-25 / 20) * torch.randn(x.shape, generator=g,
                                                                        dtype=dt)
    x = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)
    return SpeechData(x.to(torch.float32).contiguous(), tremor.to(torch.int64), f0[:, 0])


def load_data(split: str = "test", config: SpeechConfig | None = None) -> SpeechData:
    """The ``"train"`` or ``"test"`` set; the two use different synthesis seeds."""
    from ..errors import ConfigError

    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', not {split!r}")
    config = config or SpeechConfig()
    n = config.n_train if split == "train" else config.n_test
    seed = 2 * config.seed + (0 if split == "train" else 1) + 1000
    return synthesize(n, seed=seed, sample_rate=config.sample_rate, seconds=config.seconds)


def wavlm_config(config: SpeechConfig | None = None):
    """The transformers ``WavLMConfig`` for ``config`` (dropout and SpecAugment off:
    the workload measures rounding, not regularisation)."""
    from transformers import WavLMConfig

    config = config or SpeechConfig()
    return WavLMConfig(
        hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        conv_dim=list(config.conv_dim), conv_kernel=list(config.conv_kernel),
        conv_stride=list(config.conv_stride), num_feat_extract_layers=len(config.conv_dim),
        num_conv_pos_embeddings=config.num_conv_pos_embeddings,
        num_conv_pos_embedding_groups=config.num_conv_pos_embedding_groups,
        num_buckets=config.num_buckets, max_bucket_distance=config.max_bucket_distance,
        classifier_proj_size=config.classifier_proj_size, num_labels=len(CLASSES),
        hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0,
        feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
        apply_spec_augment=False, mask_time_prob=0.0,
        feat_extract_norm="group", do_stable_layer_norm=False,
    )


def build_model(config: SpeechConfig | None = None) -> nn.Module:
    """``WavLMForSequenceClassification`` with random initialisation from torch's global
    RNG (nothing downloaded)."""
    from transformers import WavLMForSequenceClassification
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = WavLMForSequenceClassification(wavlm_config(config))
    finally:
        hf_logging.set_verbosity(verbosity)
    return model


def infer(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Logits (N, 2) of standardised waveforms (N, samples), without autograd."""
    with torch.no_grad():
        return model(inputs).logits


def evaluate(model: nn.Module, data: SpeechData) -> dict[str, float]:
    """``{"accuracy", "loss"}`` on ``data``."""
    model.eval()
    return metrics_from_logits(infer(model, data.inputs), data.targets)


def train(config: SpeechConfig | None = None) -> tuple[nn.Module, dict[str, float]]:
    """Fine-tune the randomly initialised WavLM with a fixed seed (AdamW, cosine
    schedule); return the model (eval mode) and its held-out metrics. The caller's torch
    RNG state is left unchanged."""
    config = config or SpeechConfig()

    def fit(model: nn.Module, tr: SpeechData, gen: torch.Generator) -> None:
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
        steps = config.epochs * math.ceil(len(tr) / config.batch_size)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=steps,
                                                    pct_start=0.15)
        model.train()
        for _ in range(config.epochs):
            for idx in batches(len(tr), config.batch_size, gen):
                opt.zero_grad()
                loss = F.cross_entropy(model(tr.inputs[idx]).logits, tr.targets[idx])
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()

    return train_impl(config, load_data, build_model, evaluate, fit)


def load_or_train(config: SpeechConfig | None = None, *,
                  cache_dir: str | os.PathLike | None = None,
                  retrain: bool = False) -> Trained:
    """The cached model for ``config`` (trained and cached on first use)."""
    return load_or_train_impl(NAME, config or SpeechConfig(), TRAIN_VERSION,
                              build_model, train, cache_dir, retrain)


def main(argv: list[str] | None = None, config: SpeechConfig | None = None) -> int:
    """Classify the held-out signals and print the metrics, one per line."""
    trained, data = script_setup(NAME, __doc__, "signals", argv, config, load_or_train,
                                 load_data)
    print_classification("signals", data, infer(trained.model, data.inputs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
