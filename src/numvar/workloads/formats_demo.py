"""``numvar demo formats``: the digits CNN across number formats and rounding modes.

The trained LeNet of :mod:`numvar.workloads.digits` runs on the first ``images`` test
images under ``numvar.fuzzy(format=F, mode=M)`` for every format F (binary32, tf32,
bfloat16, float16, e5m2, e4m3fn and a 12-bit custom format by default) and every mode M:
each op's flops (``granularity="flop"``) rounded to F, contractions accumulated as
``accumulate`` says, the tensors staying float32. The deterministic modes (ieee, up,
down, zero, farthest) run once, the random ones (sr, ud, random) ``samples`` times with
seeds ``seed, seed+1, ...``. Against the native binary32 model it reports:

* **accuracy**: mean test accuracy over the realizations;
* **loss digits**: significant decimal digits of the mean cross-entropy loss that every
  realization shares with the native binary32 loss, ``-log10(max_r |L_r - L| / |L|)``
  (capped at 16; 0 when a loss is not finite);
* **flips**: test images whose predicted class differs from the native prediction in at
  least one realization.

Outputs in ``out``: ``formats.json`` (the rows), ``formats.md`` (the table) and
``formats.png`` (loss digits and flips per format, one bar per mode).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .._io import atomic_write_json, atomic_write_text
from ..errors import ConfigError
from . import digits

DEFAULT_FORMATS = ("binary32", "tf32", "bfloat16", "float16", "e5m2", "e4m3fn", "custom:7,5")
DEFAULT_MODES = ("ieee", "sr", "ud", "up", "down", "farthest")
RANDOM_MODES = frozenset({"sr", "ud", "random"})
DIGITS_CAP = 16.0


@dataclass
class FormatsDemoConfig:
    """Options of :func:`run_formats_demo` (the ``numvar demo formats`` options)."""

    out: str | os.PathLike = "numvar-formats"
    formats: tuple[str, ...] = DEFAULT_FORMATS
    modes: tuple[str, ...] = DEFAULT_MODES
    samples: int = 3             # realizations of each random mode
    images: int | None = 200     # first N test images (None: all 450)
    granularity: str = "flop"
    accumulate: str = "native"
    seed: int = 0
    cache_dir: str | os.PathLike | None = None


@dataclass
class FormatsDemoResult:
    config: FormatsDemoConfig
    rows: list[dict[str, Any]] = field(default_factory=list)
    reference: dict[str, float] = field(default_factory=dict)
    images: int = 0
    paths: dict[str, Path] = field(default_factory=dict)


def parse_formats(text: str) -> tuple[str, ...]:
    """A comma-separated list of formats, where ``custom:P,E`` keeps its own comma."""
    out: list[str] = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if out and out[-1].lower().startswith("custom:") and "," not in out[-1]:
            out[-1] += "," + tok
        else:
            out.append(tok)
    return tuple(out)


def loss_digits(losses: list[float], reference: float) -> float:
    """Decimal digits every loss shares with ``reference``: ``-log10(max |L - ref| / |ref|)``,
    capped at :data:`DIGITS_CAP`; 0 when a loss is not finite."""
    if not all(math.isfinite(v) for v in losses):
        return 0.0
    worst = max(abs(v - reference) for v in losses) / abs(reference)
    if worst == 0.0:
        return DIGITS_CAP
    return max(0.0, min(DIGITS_CAP, -math.log10(worst)))


def run_formats_demo(config: FormatsDemoConfig | None = None, *,
                     progress: Callable[[str, str], None] | None = None) -> FormatsDemoResult:
    """Run the demo (module docstring); ``progress(format, mode)`` after each cell."""
    import numvar
    from numvar.rounding.formats import get_format

    config = config or FormatsDemoConfig()
    if config.samples < 1:
        raise ConfigError(f"--samples must be >= 1, got {config.samples}")
    if config.images is not None and config.images < 1:
        raise ConfigError(f"--images must be positive, got {config.images}")
    if not config.formats or not config.modes:
        raise ConfigError("at least one format and one mode are needed")
    fmts = [get_format(f) for f in config.formats]
    numvar.FuzzyConfig(mode=config.modes[0], granularity=config.granularity,
                       accumulate=config.accumulate)  # validates before the long part
    for m in config.modes:
        numvar.FuzzyConfig(mode=m)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)

    trained = digits.load_or_train(cache_dir=config.cache_dir)
    model = trained.model.eval()
    data = digits.load_data("test", trained.config).subset(config.images)
    x, y = data.inputs, data.targets
    with torch.no_grad():
        ref_logits = model(x)
    ref_loss = float(F.cross_entropy(ref_logits.double(), y))
    ref_pred = ref_logits.argmax(1)
    result = FormatsDemoResult(config=config, images=len(data), reference={
        "loss": ref_loss, "accuracy": float((ref_pred == y).double().mean())})
    for fmt in fmts:
        for mode in config.modes:
            n = config.samples if mode in RANDOM_MODES else 1
            losses, accs = [], []
            flipped = torch.zeros(len(y), dtype=torch.bool)
            t0 = time.perf_counter()
            for i in range(n):
                with torch.no_grad(), numvar.fuzzy(mode=mode, format=fmt,
                                                   granularity=config.granularity,
                                                   accumulate=config.accumulate,
                                                   seed=config.seed + i):
                    logits = model(x)
                pred = logits.argmax(1)
                losses.append(float(F.cross_entropy(logits.double(), y)))
                accs.append(float((pred == y).double().mean()))
                flipped |= pred != ref_pred
            result.rows.append({
                "format": fmt.label, "format_spec": fmt.token, "bits": _bits(fmt), "mode": mode,
                "realizations": n, "accuracy": sum(accs) / n,
                "loss": sum(losses) / n, "loss_digits": loss_digits(losses, ref_loss),
                "flips": int(flipped.sum()), "seconds": time.perf_counter() - t0})
            if progress is not None:
                progress(fmt.label, mode)
    result.paths["json"] = out / "formats.json"
    atomic_write_json(result.paths["json"], {
        "images": result.images, "reference": result.reference, "rows": result.rows,
        "config": {"formats": list(config.formats), "modes": list(config.modes),
                   "samples": config.samples, "granularity": config.granularity,
                   "accumulate": config.accumulate, "seed": config.seed}})
    result.paths["markdown"] = out / "formats.md"
    atomic_write_text(result.paths["markdown"], markdown_table(result))
    png = _plot(result, out / "formats.png")
    if png is not None:
        result.paths["plot"] = png
    return result


def _bits(fmt) -> int:
    """Storage bits of a format: sign + exponent + fraction (IEEE-style encodings)."""
    ebits = max(1, math.ceil(math.log2(fmt.emax - fmt.emin + 2)))
    return 1 + ebits + fmt.precision - 1


def markdown_table(result: FormatsDemoResult) -> str:
    """The rows as a Markdown table (the docs page quotes it)."""
    ref = result.reference
    lines = [f"digits CNN, {result.images} test images, granularity "
             f"{result.config.granularity}, accumulate {result.config.accumulate}; native "
             f"binary32: accuracy {ref['accuracy']:.4f}, loss {ref['loss']:.6f}", "",
             "| format | bits | mode | runs | accuracy | loss | loss digits | flips |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in result.rows:
        lines.append(f"| {r['format']} | {r['bits']} | {r['mode']} | {r['realizations']} | "
                     f"{r['accuracy']:.4f} | {r['loss']:.5f} | {r['loss_digits']:.2f} | "
                     f"{r['flips']} |")
    return "\n".join(lines) + "\n"


def _plot(result: FormatsDemoResult, path: Path) -> Path | None:
    """Loss digits and flips per format, one bar per mode (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency of the docs/demo
        return None
    formats = list(dict.fromkeys(r["format"] for r in result.rows))
    modes = list(dict.fromkeys(r["mode"] for r in result.rows))
    cell = {(r["format"], r["mode"]): r for r in result.rows}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(modes)
    for k, mode in enumerate(modes):
        xs = [i + (k - (len(modes) - 1) / 2) * width for i in range(len(formats))]
        axes[0].bar(xs, [cell[(f, mode)]["loss_digits"] for f in formats], width, label=mode)
        axes[1].bar(xs, [cell[(f, mode)]["flips"] for f in formats], width, label=mode)
    for ax, title in zip(axes, ("loss digits shared with native binary32",
                                f"flipped predictions (of {result.images})")):
        ax.set_xticks(range(len(formats)))
        ax.set_xticklabels(formats, rotation=30, ha="right")
        ax.set_title(title)
    axes[0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
