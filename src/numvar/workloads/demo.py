"""The digits demo behind ``numvar demo``: SR and UD realizations of a trained CNN.

Steps: load (or train, a few seconds) the :mod:`~numvar.workloads.digits` LeNet; run
``n`` stochastic-rounding and ``n`` up-down realizations of its inference over the test
images at ``flop`` granularity (every scalar add and multiply, also inside convolution and
the dense layers, is randomly rounded), plus one IEEE reference; analyse each set with
:func:`numvar.analysis.analyze`; write::

    OUT/report.html          the demo page: digits of logits, probabilities and loss,
                             class flips and accuracy, the per-layer curve, SR beside UD
    OUT/sr.html, OUT/ud.html the full analysis report of each mode
    OUT/sr.json, OUT/ud.json the analysis results (``analyze`` output, JSON)
    OUT/runs/sr, OUT/runs/ud the run directories (``numvar report OUT/runs/sr`` reads them)

Each realization returns ``{"logits", "probs", "loss", "targets"}`` (captured as
``output.logits``, ...) for every test image, and the output of every layer on the first
``layer_images`` (32) images (``layers/conv1#0``, ...): the per-layer statistics use
those, which keeps the demo's folder at ~40 MB instead of ~570 MB. numvar's kernels
are compiled (first run) or loaded before the realizations start; realization times
exclude compilation.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .._io import atomic_write_json, atomic_write_text
from ..analysis.html import CSS as _CSS  # one stylesheet for every numvar page
from ..analysis.text import unit_name
from ..errors import ConfigError
from . import digits

log = logging.getLogger("numvar.workloads.demo")

#: test images per realization by default: the whole test split (450 images)
DEFAULT_IMAGES: int | None = None
#: the values the demo page summarises: (capture name, label)
SUMMARY_CAPTURES = (("output.logits", "logits"), ("output.probs", "probabilities"),
                    ("output.loss", "loss"))

Progress = Callable[[str, str, Any], None]


@dataclass
class DemoConfig:
    """Options of :func:`run_demo` (the ``numvar demo`` options)."""

    out: str | os.PathLike = "numvar-demo"
    n: int = 10                               # realizations per mode
    modes: tuple[str, ...] = ("sr", "ud")
    granularity: str = "flop"
    images: int | None = DEFAULT_IMAGES       # first N test images (None: all 450)
    seed: int = 0
    jobs: int | None = None                   # worker processes (None: in this process)
    basis: int = 10                           # significant digits in base 10 (the paper's)
    cache_dir: str | os.PathLike | None = None
    layer_images: int = 32                    # per-layer captures: the first N images


@dataclass
class DemoResult:
    """What the demo produced: paths, analysis results per mode, timings."""

    config: DemoConfig
    report: Path
    results: dict[str, dict] = field(default_factory=dict)      # mode -> analyze() result
    seconds: dict[str, float] = field(default_factory=dict)     # mode -> wall time
    per_realization: dict[str, float] = field(default_factory=dict)  # mode -> mean s
    images: int = 0
    model_from_cache: bool = False
    model_metrics: dict[str, float] = field(default_factory=dict)
    compile_s: float = 0.0                    # numba compiling/loading kernels (warm-up)
    warmup_s: float = 0.0                     # the whole warm-up
    written: dict[str, int] = field(default_factory=dict)  # what the demo wrote: bytes

    def summary(self) -> list[dict[str, Any]]:
        """One row per mode: the numbers the demo page and the CLI table show."""
        return [summary_row(mode, res) for mode, res in self.results.items()]


def summary_row(mode: str, result: dict) -> dict[str, Any]:
    """Digits (median, min) of logits, probabilities and loss, flips and accuracy of one
    mode, read from an :func:`~numvar.analysis.analyze` result."""
    row: dict[str, Any] = {"mode": mode}
    for name, label in SUMMARY_CAPTURES:
        d = result["captures"][name]["digits"]
        row[f"{label}_median"] = d["median"]
        row[f"{label}_min"] = d["min"]
    c = result["classification"]["output.logits"]
    row["flipped"] = c["flipped_samples"]
    row["samples"] = c["samples"]
    row["flip_rate"] = c["flip_rate"]
    acc = c["accuracy"] or {}
    row["accuracy_mean"] = acc.get("mean")
    row["accuracy_min"] = acc.get("min")
    row["accuracy_max"] = acc.get("max")
    row["accuracy_ieee"] = acc.get("ieee")
    row["loss_std"] = result["captures"]["output.loss"]["std"]
    return row


def _forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        logits = model(x)
        probs = torch.softmax(logits, dim=1)
        loss = F.cross_entropy(logits, y)
    return {"logits": logits, "probs": probs, "loss": loss, "targets": y}


def _clear_run(path: Path) -> None:
    """Remove a previous demo run directory (only one holding a numvar manifest)."""
    if path.exists():
        if not (path / "manifest.json").is_file():
            raise ConfigError(f"{path} exists and is not a numvar run directory; "
                              f"choose another --out")
        log.info("replacing the previous demo run %s", path)
        shutil.rmtree(path)


def run_demo(config: DemoConfig | None = None, *, progress: Progress | None = None) -> DemoResult:
    """Run the demo (see the module docstring); returns where the report is and the
    analysis results. ``progress(mode, event, payload)`` receives ``numvar.sample``'s
    progress events ("total", "start", "done") per mode."""
    config = config or DemoConfig()
    if config.n < 2:
        raise ConfigError(f"-n must be at least 2 (significant digits need 2 realizations), "
                          f"got {config.n}")
    if config.images is not None and config.images < 1:
        raise ConfigError(f"--images must be positive, got {config.images}")
    if not config.modes:
        raise ConfigError("at least one rounding mode is needed")
    from ..instrument import GRANULARITIES, MODES

    bad = [m for m in config.modes if m not in MODES]
    if bad:  # before any work: a typo must not cost the other modes' realizations
        raise ConfigError(f"--modes: unknown mode {bad[0]!r} (choose from {', '.join(MODES)})")
    if config.granularity not in GRANULARITIES:
        raise ConfigError(f"--granularity {config.granularity!r}: expected "
                          f"{' or '.join(GRANULARITIES)}")
    if config.layer_images < 1:
        raise ConfigError(f"layer_images must be positive, got {config.layer_images}")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)

    trained = digits.load_or_train(cache_dir=config.cache_dir)
    model = trained.model.eval()
    data = digits.load_data("test", trained.config).subset(config.images)
    x, y = data.inputs, data.targets
    fn = lambda: _forward(model, x, y)  # noqa: E731
    fn.__qualname__ = "numvar.workloads.demo.digits_forward"

    result = DemoResult(config=config, report=out / "report.html", images=len(data),
                        model_from_cache=trained.from_cache, model_metrics=trained.metrics)
    _warm_up(config, progress, result, lambda: _forward(model, x[:2], y[:2]))
    handles = _layer_hooks(model, config.layer_images)
    try:
        _run_modes(config, fn, model, out, result, progress)
    finally:
        for h in handles:
            h.remove()
    atomic_write_text(result.report, render_demo_html(result))
    result.written = written_files(out, config.modes)
    return result


def _warm_up(config: DemoConfig, progress: Progress | None, result: DemoResult,
             forward: Callable[[], Any]) -> None:
    """Compile numvar's kernels (first run only; loaded from numba's cache later) and
    load them into this process before the realizations: the demo's own forward on two
    images reaches exactly the kernel variants the realizations use. Events ("kernels",
    "compile", {"estimate_s"}) and then {"seconds", "compile_s"}; realization timings
    exclude compilation in any case."""
    from ..instrument import fuzzy
    from ..runner.warmup import COLD_ESTIMATE_S, CompileTimer, needed, remember, warm_kernels

    first = needed(config.granularity)
    if progress is not None and first:
        progress("kernels", "compile", {"estimate_s": COLD_ESTIMATE_S.get(config.granularity, 60)})
    t0 = time.perf_counter()
    result.compile_s = warm_kernels(config.modes[0], config.granularity) if first else 0.0
    with CompileTimer() as timer, fuzzy(mode=config.modes[0], granularity=config.granularity,
                                        seed=config.seed):
        forward()
    result.compile_s += timer.seconds
    result.warmup_s = time.perf_counter() - t0
    if not first:
        return
    remember(config.granularity)
    if progress is not None:
        progress("kernels", "compile", {"seconds": result.warmup_s, "compile_s": result.compile_s})


def _layer_hooks(model: torch.nn.Module, images: int) -> list[Any]:
    """Capture each layer's output on the first ``images`` images only (``layers/PATH#0``):
    all 450 would store ~27 MB per realization (568 MB for the demo); 32 images hold
    ~300 000 elements in the largest layer, plenty for a median of significant digits."""
    from ..runner.collect import active

    handles = []
    for path, module in model.named_modules():
        if not path:
            continue

        def hook(mod: torch.nn.Module, args: Any, out: Any, _path: str = path) -> None:
            c = active()
            if c is not None and isinstance(out, torch.Tensor):
                c.add(f"layers/{_path}#0", out[:images], kind="layer", strict=False)

        handles.append(module.register_forward_hook(hook))
    return handles


def written_files(out: Path, modes: tuple[str, ...]) -> dict[str, int]:
    """Bytes of each thing the demo wrote under ``out`` (run folders summed)."""
    sizes: dict[str, int] = {}
    for name in ["report.html"] + [f"{m}.{ext}" for m in modes for ext in ("html", "json")]:
        if (out / name).is_file():
            sizes[name] = (out / name).stat().st_size
    for m in modes:
        run = out / "runs" / m
        if run.is_dir():
            sizes[f"runs/{m}"] = sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
    return sizes


def _run_modes(config: DemoConfig, fn: Callable[[], Any], model: torch.nn.Module, out: Path,
               result: DemoResult, progress: Progress | None) -> None:
    from ..analysis import analyze, render_html
    from ..runner import sample

    for mode in config.modes:
        run_dir = out / "runs" / mode
        _clear_run(run_dir)
        cb = (lambda event, payload, _m=mode: progress(_m, event, payload)) if progress else None
        t0 = time.perf_counter()
        samples = sample(fn, n=config.n, mode=mode, granularity=config.granularity,
                         seed=config.seed, jobs=config.jobs, out=run_dir, reference=True,
                         model=model, progress=cb)
        result.seconds[mode] = time.perf_counter() - t0
        log.info("%s: %d realizations + reference in %.1f s", mode, config.n,
                 result.seconds[mode])
        if samples.timings:
            result.per_realization[mode] = sum(samples.timings) / len(samples.timings)
        res = analyze(samples, basis=config.basis, path=str(run_dir))
        result.results[mode] = res
        atomic_write_json(out / f"{mode}.json", res)
        render_html(res, samples, out / f"{mode}.html")


# ---------------------------------------------------------------- the demo page
def _fmt(v: Any, kind: str = "d") -> str:
    """The text of a number in the demo page (tests parse it back): digits with 2
    decimals, rates as percentages with 2 decimals, counts as integers."""
    if v is None:
        return "—"
    if kind == "d":
        return f"{float(v):.2f}"
    if kind == "p":
        return f"{100 * float(v):.2f} %"
    if kind == "i":
        return str(int(v))
    return f"{float(v):.3g}"


def _cell(ident: str, v: Any, kind: str = "d") -> str:
    return f"<td id='{html.escape(ident)}'>{html.escape(_fmt(v, kind))}</td>"


def _curve_value(layer: dict) -> float | None:
    """A layer's point on the curve: the median digits over its elements that varied
    (ReLU zeros never vary and would pull the median to the format's cap), or the median
    over all elements when none varied."""
    v = layer.get("digits_median_varying")
    return layer["digits_median"] if v is None else v


def _layer_png(result: DemoResult) -> str | None:
    """Median digits of the varying elements per layer, per mode, on a 0…cap axis with
    the cap drawn (a zoomed axis would exaggerate differences of a tenth of a digit)."""
    from matplotlib.figure import Figure

    curves = {m: r["layers"] for m, r in result.results.items() if r["layers"]}
    if not curves:
        return None
    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    names = None
    cap = 0.0
    for mode, layers in curves.items():
        names = [la["path"] for la in layers]
        cap = max([cap] + [la.get("cap") or 0 for la in layers])
        ax.plot(range(len(layers)), [_curve_value(la) for la in layers], "o-",
                label=mode.upper())
    if cap:
        ax.axhline(cap, color="r", ls="--", lw=1, label=f"cap: binary32 ({cap:.2f})")
        ax.set_ylim(0, cap * 1.1)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(f"median significant digits ({unit_name(result.config.basis)})", fontsize=9)
    ax.set_title("significant digits of each layer's output (median over the elements "
                 "that vary), in network order", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def render_demo_html(result: DemoResult) -> str:
    """The demo page: a summary table per mode, the per-layer curve and table, links to
    the full reports. Every number has an ``id`` (``MODE-FIELD``, ``MODE-layer-PATH``)."""
    cfg = result.config
    unit = unit_name(cfg.basis)
    p = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>numvar demo: digits CNN"
         f"</title><style>{_CSS}</style></head><body>",
         "<h1>numvar demo: how many digits of a digits CNN can you trust?</h1>",
         f"<p>A LeNet-5 trained on scikit-learn's handwritten digits "
         f"({'loaded from the cache' if result.model_from_cache else 'trained just now'}; "
         f"IEEE test accuracy {_fmt(result.model_metrics.get('accuracy'), 'p')}) classified "
         f"{result.images} test images in {cfg.n} realizations per "
         f"rounding mode at <code>{html.escape(cfg.granularity)}</code> granularity: every "
         f"scalar addition and multiplication, also inside the convolutions and dense "
         f"layers, was rounded randomly. <b>SR</b> (stochastic rounding) rounds up or down "
         f"with probability proportional to the distance; <b>UD</b> (up-down) moves each "
         f"round-to-nearest result one ulp up or down with probability ½. Significant "
         f"digits (Sohier et al. 2021, CNH, relative error, probability 0.95, confidence "
         f"0.95) are in {unit}, against the IEEE reference; binary32 holds at most "
         f"{'24 bits' if cfg.basis == 2 else '7.22 decimal digits'}.</p>"]
    st = next(iter(result.results.values()))["settings"] if result.results else None
    if st is not None and not st["enough_trials"]:
        p.append(f"<p class='note'>With {cfg.n} realizations the digits are an estimate "
                 f"(CNH assumes normal errors); the distribution-free General method needs "
                 f"at least {st['minimum_trials']} realizations for p = {st['probability']} "
                 f"at confidence {st['confidence']}.</p>")

    # two narrow tables rather than one of 15 columns: digits, then decisions and time
    p.append(f"<h2>Outputs</h2><h3>Significant digits ({unit})</h3><table><tr><th>mode</th>"
             + "".join(f"<th>{lab} median</th><th>{lab} min</th>"
                       for _, lab in SUMMARY_CAPTURES if lab != "loss")
             + "<th>loss (one scalar)</th></tr>")
    for row in result.summary():
        m = row["mode"]
        cells = "".join(_cell(f"{m}-{lab}_{s}", row[f"{lab}_{s}"])
                        for _, lab in SUMMARY_CAPTURES if lab != "loss"
                        for s in ("median", "min"))
        cells += _cell(f"{m}-loss_median", row["loss_median"])
        p.append(f"<tr><td>{m.upper()}</td>{cells}</tr>")
    p.append("</table><p class='note'>median and min over the elements of each capture "
             "(images × classes for logits and probabilities); the loss is one number per "
             "realization, so it has a single value.</p>")
    p.append("<h3>Decisions and time</h3><table><tr><th>mode</th><th>loss std</th>"
             "<th>flipped images</th><th>flip rate</th><th>accuracy mean</th>"
             "<th>accuracy min</th><th>accuracy max</th><th>accuracy IEEE</th>"
             "<th>s / realization</th></tr>")
    for row in result.summary():
        m = row["mode"]
        cells = _cell(f"{m}-loss_std", row["loss_std"], "g")
        cells += _cell(f"{m}-flipped", row["flipped"], "i")
        cells += _cell(f"{m}-flip_rate", row["flip_rate"], "p")
        for k in ("mean", "min", "max", "ieee"):
            cells += _cell(f"{m}-accuracy_{k}", row[f"accuracy_{k}"], "p")
        cells += _cell(f"{m}-seconds", result.per_realization.get(m), "g")
        p.append(f"<tr><td>{m.upper()}</td>{cells}</tr>")
    p.append("</table><p class='note'>An image <i>flips</i> when at least one realization "
             "predicts another class than the IEEE run. Accuracy is over the images above, "
             "per realization.</p>")

    png = _layer_png(result)
    if png:
        p.append("<h2>Per layer</h2>")
        p.append(f"<img alt='significant digits per layer' src='data:image/png;base64,{png}'>")
        modes = [m for m in result.results if result.results[m]["layers"]]
        p.append("<table><tr><th>layer</th>"
                 + "".join(f"<th>{m.upper()} median (varying)</th><th>{m.upper()} median "
                           f"(all)</th><th>{m.upper()} min</th>" for m in modes)
                 + "</tr>")
        first = result.results[modes[0]]["layers"]
        by_mode = {m: {la["name"]: la for la in result.results[m]["layers"]} for m in modes}
        for la in first:
            cells = ""
            for m in modes:
                e = by_mode[m].get(la["name"], {})
                cells += _cell(f"{m}-layer-{la['path']}-varying",
                               _curve_value(e) if e else None)
                cells += _cell(f"{m}-layer-{la['path']}-median", e.get("digits_median"))
                cells += _cell(f"{m}-layer-{la['path']}-min", e.get("digits_min"))
            p.append(f"<tr><td>{html.escape(la['path'])}</td>{cells}</tr>")
        p.append("</table><p class='note'>median (varying): the median over the elements "
                 "that vary; elements that never vary (the zeros after a ReLU) are exact, sit "
                 "at the cap and would pull the plain median up to it. min: the worst "
                 "element; a min near 0 comes from elements whose IEEE value is (close to) "
                 "zero, where the relative error is large however small the absolute one."
                 "</p>")

    p.append("<h2>Full reports</h2><ul>")
    for m in result.results:
        p.append(f"<li><a href='{m}.html'>{m.upper()}: every capture, histograms, flips</a> "
                 f"(run directory <code>runs/{m}</code>, "
                 f"<code>numvar report {html.escape(str(Path(cfg.out) / 'runs' / m))}</code>)"
                 f"</li>")
    p.append("</ul>")
    p.append("<p class='note'>Fuzzy PyTorch (the paper this follows) reported for its MNIST "
             "CNN: loss significant digits (base 10) SR 5.70, UD 5.43.</p>")
    p.append("<details><summary>Settings (JSON)</summary><pre>"
             + html.escape(_settings_text(result)) + "</pre></details></body></html>\n")
    return "\n".join(p)


def _settings_text(result: DemoResult) -> str:
    import json

    cfg = asdict(result.config)
    cfg["out"] = str(cfg["out"])
    cfg["cache_dir"] = None if cfg["cache_dir"] is None else str(cfg["cache_dir"])
    cfg["seconds_per_mode"] = {m: round(s, 2) for m, s in result.seconds.items()}
    return json.dumps(cfg, indent=2)
