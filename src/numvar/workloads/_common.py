"""Shared plumbing of the workloads: the cache folder, cached weights, seeded training.

A trained model is cached as two files in the cache folder, both written atomically
(:mod:`numvar._io`)::

    <name>-<key>.safetensors   the state dict (never a pickle)
    <name>-<key>.json          {"workload", "config", "metrics", "versions", ...}

``key`` is a hash of the workload's configuration and its ``TRAIN_VERSION``, so a
changed configuration trains a new model instead of loading a stale one. The folder
is ``platformdirs.user_cache_dir("numvar")/workloads`` unless the environment
variable ``NUMVAR_CACHE_DIR`` names another one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from .._io import atomic_write_json, load_tensors, read_json, save_tensors
from ..errors import StoreError

log = logging.getLogger("numvar.workloads")

CACHE_ENV = "NUMVAR_CACHE_DIR"


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The folder cached workload models live in: ``override``, else ``$NUMVAR_CACHE_DIR``,
    else ``<user cache dir>/numvar/workloads``."""
    if override is not None:
        return Path(override)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("numvar")) / "workloads"


def _jsonable(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(obj))


def config_key(name: str, config: Any, version: int) -> str:
    """A short stable hash of (workload, configuration dataclass, training code version)."""
    payload = json.dumps({"workload": name, "version": version,
                          "config": dataclasses.asdict(config)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def cache_paths(name: str, config: Any, version: int,
                directory: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(weights, metadata) paths of a cached model."""
    d = cache_dir(directory)
    stem = f"{name}-{config_key(name, config, version)}"
    return d / f"{stem}.safetensors", d / f"{stem}.json"


def save_cached(name: str, config: Any, version: int, model: torch.nn.Module,
                metrics: dict[str, float], directory: str | os.PathLike | None = None,
                extra: dict[str, Any] | None = None) -> Path:
    """Write the model's state dict and a JSON of config + metrics atomically.

    The weights go first and the JSON last, so a JSON on disk always names complete
    weights. Returns the weights' path.
    """
    weights, meta = cache_paths(name, config, version, directory)
    save_tensors(weights, model.state_dict())
    info = {"workload": name, "train_version": version, "config": dataclasses.asdict(config),
            "metrics": metrics, "versions": {"torch": torch.__version__}}
    if extra:
        info.update(extra)
    atomic_write_json(meta, info)
    log.info("cached %s model in %s", name, weights)
    return weights


def load_cached(name: str, config: Any, version: int, model: torch.nn.Module,
                directory: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """Load cached weights into ``model``; return the JSON metadata, or None when absent.

    A corrupt or mismatching cache entry is logged and treated as absent (the caller
    retrains and overwrites it).
    """
    weights, meta = cache_paths(name, config, version, directory)
    if not (weights.is_file() and meta.is_file()):
        return None
    try:
        info = read_json(meta)
        state = load_tensors(weights)
        model.load_state_dict(state, strict=True)
    except (StoreError, RuntimeError, KeyError) as exc:
        log.warning("ignoring unusable cached %s model %s: %s", name, weights, exc)
        return None
    if info.get("config") != _jsonable(dataclasses.asdict(config)):
        log.warning("ignoring cached %s model %s: configuration differs", name, weights)
        return None
    return info


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with torch's global RNG seeded to ``seed``, restoring the caller's
    RNG state afterwards (training never disturbs the user's random stream)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def outside_measurement() -> Iterator[None]:
    """Set-up work that is not part of what realizations compare: nothing is captured
    (``numvar.runner.collect.paused``) and nothing is instrumented (torch dispatch modes
    are switched off) inside the block.

    Training a workload's model is such work: under ``numvar run`` on an empty cache the
    IEEE reference trains and caches the model, and the realizations load it; with the
    training captured (269 module calls) every realization differed from the reference."""
    from torch.utils._python_dispatch import _disable_current_modes

    from ..runner.collect import paused

    with paused(), _disable_current_modes():
        yield


def batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Shuffled index batches covering ``range(n)`` once."""
    perm = torch.randperm(n, generator=generator)
    for i in range(0, n, batch_size):
        yield perm[i:i + batch_size]


def capture(name: str, value: Any) -> None:
    """Forward ``value`` to ``numvar.runner.capture`` (a no-op outside a numvar run)."""
    from ..runner import capture as _capture

    _capture(name, value)


@dataclasses.dataclass
class Trained:
    """A workload model ready for inference, with where it came from.

    ``metrics`` are the held-out metrics measured right after training (stored in the
    cache JSON); ``from_cache`` says whether the weights were loaded instead of trained.
    """

    model: torch.nn.Module
    config: Any
    metrics: dict[str, float]
    path: Path | None
    from_cache: bool


def load_or_train_impl(name: str, config: Any, version: int, build, train,
                       directory: str | os.PathLike | None, retrain: bool,
                       save: bool = True) -> Trained:
    """Shared body of each workload's ``load_or_train``."""
    if not retrain:
        with seeded(getattr(config, "seed", 0)):   # init is overwritten; keep caller's RNG
            model = build(config)
        info = load_cached(name, config, version, model, directory)
        if info is not None:
            model.eval()
            weights, _ = cache_paths(name, config, version, directory)
            return Trained(model, config, dict(info.get("metrics", {})), weights, True)
    with outside_measurement():
        model, metrics = train(config)
    model.eval()
    path = save_cached(name, config, version, model, metrics, directory) if save else None
    return Trained(model, config, metrics, path, False)


def train_impl(config: Any, load_data, build, evaluate,
               fit: Callable[[torch.nn.Module, Any, torch.Generator], None]
               ) -> tuple[torch.nn.Module, dict[str, float]]:
    """Shared body of each workload's ``train``: under :func:`seeded` (``config.seed``),
    build the model and run ``fit(model, train_data, generator)`` (the generator seeded
    with ``config.seed``); return the model in eval mode and ``evaluate`` on the test
    split, plus ``train_seconds``."""
    train_data = load_data("train", config)
    test_data = load_data("test", config)
    t0 = time.perf_counter()
    with seeded(config.seed):
        model = build(config)
        gen = torch.Generator().manual_seed(config.seed)
        fit(model, train_data, gen)
    model.eval()
    metrics = evaluate(model, test_data)
    metrics["train_seconds"] = time.perf_counter() - t0
    return model, metrics


def metrics_from_logits(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Accuracy and mean cross-entropy of logits against integer targets."""
    return {"accuracy": float((logits.argmax(1) == targets).double().mean()),
            "loss": float(F.cross_entropy(logits.double(), targets))}


def script_setup(name: str, doc: str, items: str, argv: list[str] | None, config: Any,
                 load_or_train, load_data) -> tuple[Trained, Any]:
    """Shared start of each workload script's ``main``: parse ``--limit``, ``--retrain``
    and ``--cache-dir``, then return the (cached or trained) model and the test split's
    first ``--limit`` examples."""
    p = argparse.ArgumentParser(prog=f"python -m numvar.workloads.{name}",
                                description=doc.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=None, help=f"first N test {items} only")
    p.add_argument("--retrain", action="store_true", help="ignore the cached model")
    p.add_argument("--cache-dir", default=None, help="model cache folder")
    args = p.parse_args(argv)
    trained = load_or_train(config, cache_dir=args.cache_dir, retrain=args.retrain)
    return trained, load_data("test", trained.config).subset(args.limit)


def print_classification(items: str, data: Any, logits: torch.Tensor) -> None:
    """Capture ``logits`` and ``data.targets`` (for flips under ``numvar run``; no-op
    otherwise) and print the example count, accuracy and loss, one per line."""
    m = metrics_from_logits(logits, data.targets)
    capture("logits", logits)
    capture("targets", data.targets)
    print(f"{items} {len(data)}")
    print(f"accuracy {m['accuracy']:.6f}")
    print(f"loss {m['loss']:.9g}")
