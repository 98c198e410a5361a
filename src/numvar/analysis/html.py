"""``render_html``: one self-contained HTML report with PNG plots embedded as base64.

Plots are bare matplotlib Figures rendered by Agg (no display, no pyplot: the
user's backend is left alone). Sections: run configuration,
captures table, a significant-digits histogram per capture, the per-layer curve, decision
flips and accuracy, Dice and the disagreement map, training bands, final-weights spread,
then any ``extra_sections`` (e.g. a saved ``numvar locate`` result, see
:mod:`numvar.locate.saved`).
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from .._io import atomic_write_text
from .text import (NO_VARIATION, capture_columns, capture_row, fmt, is_report_capture,
                   unit_name)

MAX_HISTOGRAMS = 24
DPI = 110
#: The one stylesheet of numvar's HTML pages (analysis report, compare, demo, locate).
CSS = """body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.45}h1{font-size:1.6em}
h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;white-space:normal;vertical-align:bottom}
td:first-child,th:first-child{text-align:left}figure{display:inline-block;margin:.5em;
vertical-align:top}figcaption{font-size:13px;color:#555;max-width:640px}
img{max-width:100%;height:auto}.note{color:#8a5a00}.scroll{overflow-x:auto}
code{background:#f3f3f3;padding:1px 3px}details{margin:1em 0}summary{cursor:pointer;
font-weight:600}pre{background:#f6f6f6;padding:.5em;overflow:auto;font-size:13px}"""


def _subplots(*grid: int, figsize: tuple[float, float], **kw):
    """A bare matplotlib Figure and its axes: rendered by Agg on save, without pyplot, so
    the user's backend and pyplot's figure registry are left alone."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kw)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(b64: str, alt: str, caption: str | None = None) -> str:
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{html.escape(caption or alt)}</figcaption></figure>")


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A table in a horizontally scrolling box: numbers never wrap (CSS nowrap)."""
    h = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return (f"<div class='scroll'><table><thead><tr>{h}</tr></thead><tbody>{body}</tbody>"
            "</table></div>")


def _integer_axis(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def digits_histogram_png(name: str, d: dict, unit: str) -> str:
    fig, ax = _subplots(figsize=(5, 3.2))
    edges = d["histogram"]["edges"]
    counts = list(d["histogram"]["counts"])
    nv = d["no_variation"]
    counts[-1] -= nv  # elements with no variation sit at the cap: drawn apart, hatched
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#4878a8",
           edgecolor="k", label="varying elements")
    if nv:
        ax.bar([edges[-1] + 0.5], [nv], width=1, align="edge", color="#ddd", hatch="//",
               edgecolor="k", label=NO_VARIATION)
    ax.axvline(d["cap"], color="r", ls="--", lw=1, label=f"cap: format precision "
               f"({d['cap']:.2f})")
    ax.set_xlim(0, edges[-1] + (2 if nv else 0.5))
    _integer_axis(ax.yaxis)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_xlabel(f"significant digits ({unit})")
    ax.set_ylabel("elements")
    title = name if not d["all_no_variation"] else f"{name}: {NO_VARIATION}"
    ax.set_title(title, fontsize=10)
    return _png(fig)


def layers_png(layers: list[dict], unit: str) -> str:
    """Digits per layer on a 0…cap axis: the median over the elements that vary (solid),
    the 5th percentile and the minimum; elements that never vary (ReLU zeros, max-pool
    losers) sit at the cap and are left out of the solid line, else it would jump to
    the cap at every ReLU."""
    fig, ax = _subplots(figsize=(max(6.5, 0.45 * len(layers)), 3.8))
    i = np.arange(len(layers))
    cap = max(la.get("cap") or la["digits_median"] or 0 for la in layers)
    mv = [la["digits_median"] if la["digits_median_varying"] is None
          else la["digits_median_varying"] for la in layers]
    ax.fill_between(i, [la["digits_min"] for la in layers], mv, color="#9bc", alpha=.35,
                    label="min … median")
    ax.plot(i, [la["digits_p05"] for la in layers], "--", color="#468", lw=1,
            label="5th percentile")
    ax.plot(i, mv, "o-", color="#246", label="median of varying elements")
    ax.plot(i, [la["digits_min"] for la in layers], "v", color="#a40", ms=4, label="min")
    ax.axhline(cap, color="r", ls="--", lw=1, label=f"cap: format precision ({cap:.2f})")
    ax.set_ylim(0, cap * 1.08 if cap > 0 else 1)
    ax.set_xticks(i)
    ax.set_xticklabels([la["path"] + (f"#{la['call']}" if la["call"] else "") for la in layers],
                       rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(f"significant digits ({unit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("significant digits of each layer's output, network order", fontsize=10)
    return _png(fig)


def flips_png(name: str, c: dict) -> str:
    """How many realizations flip each sample (bars labelled with their counts) and
    accuracy (or flips) per realization on an axis that stays within its range."""
    fig, axes = _subplots(1, 2, figsize=(9, 3.2))
    h = c["flip_count_histogram"]
    bars = axes[0].bar(range(len(h)), h, color="#a64")
    axes[0].bar_label(bars, fontsize=8)
    axes[0].set_ylim(0, max(h + [1]) * 1.15)
    _integer_axis(axes[0].xaxis)
    _integer_axis(axes[0].yaxis)
    axes[0].set_xlabel(f"k: realizations differing from {c['against']} (of {c['n']})")
    axes[0].set_ylabel("samples")
    axes[0].set_title(f"{name}: {c['flipped_samples']} of {c['samples']} samples flipped",
                      fontsize=10)
    r = np.arange(len(c["flips_per_realization"]))
    if c.get("accuracy"):
        a = c["accuracy"]
        acc = 100 * np.asarray(a["per_realization"], dtype=float)
        axes[1].plot(r, acc, "o", label="realization")
        lo, hi = float(acc.min()), float(acc.max())
        if a["ieee"] is not None:
            axes[1].axhline(100 * a["ieee"], color="r", ls="--", label="IEEE")
            lo, hi = min(lo, 100 * a["ieee"]), max(hi, 100 * a["ieee"])
        pad = max(0.5, (hi - lo) * 0.2)
        axes[1].set_ylim(max(0.0, lo - pad), min(100.0, hi + pad))
        axes[1].set_ylabel("accuracy (%)")
        axes[1].legend(fontsize=8)
    else:
        f = np.asarray(c["flips_per_realization"], dtype=float)
        axes[1].plot(r, f, "o")
        axes[1].set_ylim(0, max(1.0, float(f.max()) * 1.15))
        _integer_axis(axes[1].yaxis)
        axes[1].set_ylabel("flipped decisions")
    _integer_axis(axes[1].xaxis)
    axes[1].set_xlabel("realization")
    axes[1].set_title("per realization", fontsize=10)
    return _png(fig)


def dice_png(name: str, s: dict) -> str:
    labs = list(s["labels"])
    fig, ax = _subplots(figsize=(max(5.5, 0.4 * len(labs)), 3.2))
    x = np.arange(len(labs))
    ax.plot(x, [s["labels"][k]["dice_mean"] for k in labs], "o", label="mean")
    ax.plot(x, [s["labels"][k]["dice_min"] for k in labs], "v", label="min")
    ax.set_xticks(x)
    ax.set_xticklabels(labs, fontsize=7)
    ax.set_xlabel("label")
    ax.set_ylabel(f"Dice vs {s['against']}")
    ax.legend(fontsize=7)
    ax.set_title(f"{name}: Dice per label", fontsize=9)
    return _png(fig)


def slice_2d(m: np.ndarray) -> tuple[np.ndarray, str]:
    """Reduce a map to 2-D by taking, axis after axis, the slice holding most disagreement."""
    where = []
    while m.ndim > 2:
        tot = m.reshape(m.shape[0], -1).sum(axis=1)
        j = int(np.argmax(tot))
        where.append(str(j))
        m = m[j]
    if m.ndim == 1:
        m = m[None, :]
    return m, ("slice [" + ", ".join(where) + "]") if where else ""


def disagreement_png(name: str, dis: np.ndarray) -> str:
    m, where = slice_2d(dis)
    fig, ax = _subplots(figsize=(5, 4.5))
    im = ax.imshow(m, cmap="magma", vmin=0, vmax=max(0.5, float(m.max())), interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=.046, label="share disagreeing with majority")
    ax.set_title(f"{name} {where}".strip(), fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    return _png(fig)


def series_png(s: dict) -> str:
    fig, (ax, ax2) = _subplots(1, 2, figsize=(9, 3))
    st = s["steps"]
    mean = np.asarray(s["mean"], dtype=float)
    std = np.asarray(s["std"], dtype=float)
    ax.fill_between(st, s["min"], s["max"], color="#cde", label="min … max")
    ax.fill_between(st, mean - std, mean + std, color="#8ab", label="mean ± std")
    ax.plot(st, mean, color="#246", lw=1, label="mean")
    if s["reference"]:
        ax.plot(st, s["reference"], "--", color="r", lw=1, label="IEEE")
    ax.set_xlabel("step")
    ax.set_ylabel(s["name"])
    ax.legend(fontsize=7)
    ax.set_title(f"{s['name']}: band across realizations", fontsize=9)
    # the band is often thinner than a line: its width on its own axis
    ax2.plot(st, std, "o-", ms=3, label="std (R−1)")
    width = np.asarray(s["max"], dtype=float) - np.asarray(s["min"], dtype=float)
    ax2.plot(st, width, "s--", ms=3, label="max − min")
    if np.all(np.concatenate([std, width]) > 0):
        ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_title("spread across realizations", fontsize=9)
    ax2.legend(fontsize=7)
    return _png(fig)


def weights_png(ws: list[dict], unit: str) -> str:
    fig, ax = _subplots(figsize=(max(5.5, 0.5 * len(ws)), 3.2))
    x = np.arange(len(ws))
    ax.bar(x - .2, [w["digits_median"] for w in ws], .4, label="median")
    ax.bar(x + .2, [w["digits_min"] for w in ws], .4, label="min")
    ax.set_xticks(x)
    ax.set_xticklabels([w["layer"] for w in ws], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"digits ({unit})")
    ax.legend(fontsize=7)
    ax.set_title("final weights: significant digits per layer", fontsize=9)
    return _png(fig)


def report_title(result: dict) -> str:
    """The page title: the run directory, else what was run (function or script)."""
    run = result["run"]
    if run.get("path"):
        return f"numvar report: {run['path']}"
    cfg = run.get("config") or {}
    what = cfg.get("function") or " ".join(map(str, cfg.get("argv") or [])) or None
    return f"numvar report: {what}" if what else "numvar report"


def notebook_html(page: str, height: int = 640) -> str:
    """A full HTML page wrapped for a notebook cell: an iframe, so that the report's
    stylesheet does not restyle the notebook."""
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;'
            f'height:{height}px;border:1px solid #ddd"></iframe>')


def render_html(result: dict, samples=None, path=None, *,
                extra_sections: Sequence[str] = ()) -> str:
    """Render ``result`` (from :func:`analyze`) as one self-contained HTML page.

    ``samples`` (the analysed :class:`Samples`) is needed only for the disagreement maps
    of segmentations. ``extra_sections``: HTML fragments appended, in order and verbatim,
    after the report's own sections, e.g. :func:`numvar.locate.html_section` or
    :func:`numvar.locate.locate_sections`; each must be self-contained (inline styles,
    images as ``data:`` URIs) and already escaped: it is trusted as given. Writes
    ``path`` atomically when given; returns the HTML text.
    """
    from .segmentation import disagreement_map, label_maps

    st = result["settings"]
    run = result["run"]
    unit = unit_name(st["basis"])
    title = report_title(result)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    parts.append(f"<p>R = {run['n']} realizations ({run['failed']} failed); significant digits "
                 f"in <b>{unit}</b>: {html.escape(st['method'].upper())}, "
                 f"{html.escape(st['error'])} error, probability {st['probability']}, "
                 f"confidence {st['confidence']}, against {html.escape(st['against'])}.</p>")
    if run.get("escapes"):
        from .text import escapes_text

        text = escapes_text(run["escapes"], run.get("config", {}).get("granularity", "flop"))
        parts.append(f"<pre class='note' id='escapes' style='color:#b00'>{html.escape(text)}</pre>")
    for n in result["notes"]:
        parts.append(f"<p class='note'>note: {html.escape(n)}</p>")

    parts.append("<details id='configuration'><summary>Run configuration (JSON)</summary>"
                 f"<pre>{html.escape(json.dumps(run['config'], indent=2, default=str))}</pre>"
                 "</details>")

    parts.append("<h2 id='captures'>Captures</h2><p>std: the dispersion of one execution "
                 "(R−1); sem = std/√R: the uncertainty of the estimated mean only. "
                 "mean |x| is left out for integer captures (labels, targets).</p>")
    cols = capture_columns(st["basis"], wide=True)
    rows = []
    for name, e in result["captures"].items():
        if is_report_capture(name, e):  # layers, series and weights: their own sections
            cells = capture_row(result, name, e)
            rows.append([cells[k] for k, _ in cols])
    parts.append(_table([h for _, h in cols], rows))

    # histograms of captures with at least 2 elements (a scalar's is one bar: the table says it)
    hist = [(n, e) for n, e in result["captures"].items()
            if e["digits"] and e["numel"] > 1 and is_report_capture(n, e)]
    if hist:
        parts.append("<h2 id='digits'>Significant digits per capture</h2>")
        for n, e in hist[:MAX_HISTOGRAMS]:
            parts.append(_img(digits_histogram_png(n, e["digits"], unit), f"digits histogram: {n}"))
        if len(hist) > MAX_HISTOGRAMS:
            parts.append(f"<p>({len(hist) - MAX_HISTOGRAMS} more captures in the table above)</p>")

    if result["layers"]:
        parts.append("<h2 id='layers'>Layers</h2>")
        u = unit_name(st["basis"], short=True)
        parts.append(_table(
            ["layer", "numel", "std (R−1)", f"digits min ({u})", f"digits p05 ({u})",
             f"digits median ({u})", f"median of varying ({u})", "no variation"],
            [[la["name"], str(la["numel"]), fmt(la["std"]),
              *((NO_VARIATION, "—", f"cap {fmt(la['digits_median'], 'd')}", "—")
                if la["all_no_variation"] else
                (fmt(la["digits_min"], "d"), fmt(la["digits_p05"], "d"),
                 fmt(la["digits_median"], "d"), fmt(la["digits_median_varying"], "d"))),
              fmt(la["no_variation_share"], "p")] for la in result["layers"]]))
        parts.append(_img(layers_png(result["layers"], unit), "significant digits per layer",
                          "Significant digits per layer. Elements that never vary (ReLU "
                          "zeros, for instance) are exact and sit at the cap; the solid line "
                          "is the median over the elements that do vary, the band reaches "
                          "down to the worst element. A minimum near 0 comes from elements "
                          "whose IEEE value is (close to) zero, where a relative error is "
                          "large however small the absolute one."))

    if result["classification"]:
        parts.append("<h2 id='decisions'>Decisions</h2>")
        for n, c in result["classification"].items():
            acc = c.get("accuracy") or {}
            parts.append(_table(["scores", "flipped", "flip rate", "agreement with IEEE",
                                 "accuracy mean", "accuracy std", "accuracy IEEE"],
                                [[n, fmt(c["flipped_samples"]), fmt(c["flip_rate"], "p"),
                                  fmt(c["agreement_with_ieee"], "p"), fmt(acc.get("mean"), "p"),
                                  fmt(acc.get("std"), "p"), fmt(acc.get("ieee"), "p")]]))
            parts.append(_img(flips_png(n, c), f"flips: {n}"))

    if result["segmentation"]:
        parts.append("<h2 id='segmentation'>Segmentation</h2>")
        for n, s in result["segmentation"].items():
            rows = [[lab, fmt(v["dice_mean"]), fmt(v["dice_min"]), fmt(v["volume_mean"]),
                     fmt(v["volume_std"]), fmt(v["volume_cv"])] for lab, v in s["labels"].items()]
            parts.append(_table(["label", "Dice mean", "Dice min", "volume mean", "volume std",
                                 "volume CV"], rows))
            if s["labels"]:
                parts.append(_img(dice_png(n, s), f"Dice: {n}"))
            if samples is not None and n in samples.captures:
                dis = disagreement_map(label_maps(samples.captures[n], n))
                parts.append(_img(disagreement_png(n, dis), f"disagreement map: {n}"))

    if result["series"]:
        parts.append("<h2 id='training'>Training series</h2>")
        for s in result["series"]:
            parts.append(_img(series_png(s), f"band: {s['name']}"))
    if result["weights"]:
        parts.append("<h2 id='weights'>Final weights</h2>")
        parts.append(_table(["layer", "numel", "std", "rel std", "digits min", "digits median"],
                            [[w["layer"], str(w["numel"]), fmt(w["std"]), fmt(w["rel_std"]),
                              fmt(w["digits_min"], "d"), fmt(w["digits_median"], "d")]
                             for w in result["weights"]]))
        parts.append(_img(weights_png(result["weights"], unit), "final weights per layer"))
    if isinstance(extra_sections, str):
        raise TypeError("extra_sections is a sequence of HTML fragments, not one string")
    parts.extend(extra_sections)
    parts.append("</body></html>\n")
    text = "\n".join(parts)
    if path is not None:
        atomic_write_text(Path(path), text)
    return text


def compare_png(cmp: dict) -> str:
    """Median digits per capture for runs A and B; with layers, the two layer curves."""
    caps = [c for c in cmp["captures"] if c["kind"] != "layer"
            and (c["a"]["digits_median"] is not None or c["b"]["digits_median"] is not None)]
    unit = unit_name(cmp["settings"][0]["basis"])
    panels = (1 if caps else 0) + (1 if cmp["layers"] else 0)
    fig, axes = _subplots(1, max(panels, 1), figsize=(6 * max(panels, 1), 3.2), squeeze=False)
    axes = list(axes[0])
    if caps:
        ax = axes.pop(0)
        x = np.arange(len(caps))
        for off, side in ((-0.2, "a"), (0.2, "b")):
            ax.bar(x + off, [c[side]["digits_median"] or 0 for c in caps], 0.4,
                   label=side.upper())
        ax.set_xticks(x)
        ax.set_xticklabels([c["name"] for c in caps], rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(f"median significant digits ({unit})")
        ax.legend(fontsize=8)
        ax.set_title("captures", fontsize=10)
    if cmp["layers"]:
        ax = axes.pop(0)
        i = np.arange(len(cmp["layers"]))
        for side, marker in (("a", "o-"), ("b", "s-")):   # ReLU zeros left out, as in reports
            ax.plot(i, [la[side] if la.get(f"{side}_varying") is None else la[f"{side}_varying"]
                        for la in cmp["layers"]], marker, label=side.upper())
        cap = max((la.get("cap") or 0) for la in cmp["layers"])
        if cap:
            ax.axhline(cap, color="r", ls="--", lw=1, label=f"cap ({cap:.2f})")
            ax.set_ylim(0, cap * 1.08)
        ax.set_xticks(i)
        ax.set_xticklabels([la["name"].removeprefix("layers/") for la in cmp["layers"]],
                           rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(f"median significant digits ({unit})")
        ax.legend(fontsize=8)
        ax.set_title("layers, network order (median of the elements that vary)", fontsize=10)
    return _png(fig)


def render_compare_html(cmp: dict, path=None) -> str:
    """One self-contained HTML page for a :func:`compare` result (tables and a plot)."""
    a, b = (p or "?" for p in cmp["runs"])
    title = f"numvar compare: A = {a}, B = {b}"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    parts.append("<h2 id='configuration'>Run configurations</h2>")
    parts.append(_table(["", "A", "B"], [[k, str(cmp["configs"][0].get(k, "—")),
                                          str(cmp["configs"][1].get(k, "—"))]
                                         for k in dict.fromkeys([*cmp["configs"][0],
                                                                 *cmp["configs"][1]])]))
    parts.append("<h2 id='captures'>Significant digits</h2>")
    rows = [[c["name"], fmt(c["a"]["digits_median"], "d"), fmt(c["b"]["digits_median"], "d"),
             fmt(c["delta_median"], "d"), fmt(c["a"]["digits_min"], "d"),
             fmt(c["b"]["digits_min"], "d"), fmt(c["a"]["std"]), fmt(c["b"]["std"])]
            for c in cmp["captures"]
            if c["a"]["digits_median"] is not None or c["b"]["digits_median"] is not None]
    u = unit_name(cmp["settings"][0]["basis"], short=True)
    parts.append(_table(["capture", f"A median ({u})", f"B median ({u})", f"B − A ({u})",
                         f"A min ({u})", f"B min ({u})", "A std", "B std"], rows))
    if rows or cmp["layers"]:
        parts.append(_img(compare_png(cmp), "median significant digits, A vs B"))
    if cmp["classification"]:
        parts.append("<h2 id='decisions'>Decisions</h2>")
        parts.append(_table(["scores", "A flip rate", "B flip rate", "A agreement", "B agreement"],
                            [[c["name"], fmt(c["a"]["flip_rate"], "p"), fmt(c["b"]["flip_rate"], "p"),
                              fmt(c["a"]["agreement_with_ieee"], "p"),
                              fmt(c["b"]["agreement_with_ieee"], "p")]
                             for c in cmp["classification"]]))
    parts.append("</body></html>\n")
    text = "\n".join(parts)
    if path is not None:
        atomic_write_text(Path(path), text)
    return text
