"""A saved ``numvar locate`` result: reload it, embed it in the analysis report.

``numvar locate ... --json locate.json`` writes :meth:`numvar.locate.LocateResult.to_dict`.
:func:`load_locate` rebuilds a :class:`~numvar.locate.LocateResult` from that JSON with
locate's own classes, so that :func:`numvar.locate.html_section` (HTML) and
:func:`numvar.locate.renderables` (terminal) present it exactly as ``numvar locate`` does.

What the JSON does not hold comes back as follows: the spatial map's pixels (only its
summary is saved; :func:`locate_sections` shows the summary, and the PNG that
``numvar locate --map`` wrote when given), and the digits of candidates with no measurable
effect (taken from the saved evaluation of that candidate alone, or the cap).
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

from ..errors import AnalysisError, ConfigError

LOCATE_SCHEMA = 1
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _num(v: Any) -> float:
    """A JSON number, or NaN for null (non-finite values are saved as null)."""
    return math.nan if v is None else float(v)


def _read(source: Any) -> tuple[Any, str]:
    from .._io import read_json
    from ..errors import StoreError

    if isinstance(source, (str, Path)):
        try:
            return read_json(source), str(source)
        except StoreError as exc:
            raise ConfigError(f"--locate: {exc}") from exc
    return source, "locate result"


def load_locate(source: Any):
    """A :class:`~numvar.locate.LocateResult` from a locate JSON file path or its dict.

    AnalysisError names the file when it is not a numvar locate result of schema 1.
    """
    return _build(*_read(source))


def _build(d: Any, where: str):
    from .api import LocateResult
    from .core import DDResult, LayerRow, Row
    from .discover import Candidate

    if not isinstance(d, dict) or "ranking" not in d or "by" not in d:
        raise AnalysisError(f"{where}: not a numvar locate JSON (numvar locate --json)")
    if d.get("schema") != LOCATE_SCHEMA:
        raise AnalysisError(f"{where}: locate schema {d.get('schema')!r}, expected "
                            f"{LOCATE_SCHEMA}")
    try:
        cap = float(d["cap"])
        cands = [Candidate(name=c["name"], kind=c["kind"], cls=c["class"],
                           ops=dict(c.get("ops") or {})) for c in d["candidates"]]
        history = [(list(e["set"]), _num(e["digits"])) for e in d.get("evaluations", [])]
        alone = {s[0]: v for s, v in history if len(s) == 1}
        ranked = [Row(name=r["name"], alone=_num(r["alone"]), lost=_num(r["lost"]),
                      without=r.get("without"), necessity=r.get("necessity"), order=i)
                  for i, r in enumerate(d["ranking"])]
        quiet = [Row(name=r["name"], alone=alone.get(r["name"], cap),
                     lost=cap - alone.get(r["name"], cap), order=len(ranked) + i)
                 for i, r in enumerate(d["no_effect"])]
        dd = d.get("ddmin")
        layers = d.get("propagation")
        cost = d["cost"]
        res = LocateResult(
            by=d["by"], config=dict(d["config"]), cap=cap, candidates=cands,
            digits_all=_num(d["output_digits"]["all_perturbed"]),
            threshold=_num(d["threshold"]["value"]), threshold_source=d["threshold"]["source"],
            rows=ranked + quiet, ranked=ranked, no_effect=quiet,
            dd=None if dd is None else DDResult(minimal=list(dd["set"]), digits=_num(dd["digits"]),
                                                tests=int(dd["tests"]),
                                                complete=bool(dd["complete"])),
            layers=None if layers is None else [
                LayerRow(name=x["name"], all=_num(x["all"]), alone=_num(x["alone"]),
                         lost_in_layer=_num(x["lost_in_layer"]), inherited=_num(x["inherited"]))
                for x in layers],
            spatial=None, evaluations=int(cost["evaluations"]),
            realizations=int(cost["realizations"]), reference_runs=int(cost["reference_runs"]),
            bound=int(cost["bound_realizations"]),
            unattributed=dict(d.get("unattributed_ops") or {}), history=history,
            dd_bound=0 if dd is None else int(dd.get("bound", 0)))
        for r in res.ranked + res.no_effect:      # every ranked name must be a candidate
            res.candidate(r.name)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnalysisError(f"{where}: malformed locate JSON ({type(exc).__name__}: {exc})") \
            from exc
    return res


def read_png(path: Any) -> bytes:
    """The bytes of a PNG file (ConfigError when missing or not a PNG)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--locate-map {p}: cannot read: {exc.strerror or exc}") from exc
    if not data.startswith(_PNG_MAGIC):
        raise ConfigError(f"--locate-map {p}: not a PNG file")
    return data


def locate_sections(source: Any, map_png: Any = None) -> list[str]:
    """``source``: a locate JSON path or its dict. Self-contained HTML fragments for :func:`~numvar.analysis.render_html`'s
    ``extra_sections``: :func:`numvar.locate.html_section` of the saved result, then,
    when it has a spatial view, a ``<section class="numvar-locate-map">`` with its summary
    and the PNG ``map_png`` (``numvar locate --map``) embedded as base64."""
    from .report import html_section

    d, where = _read(source)
    out = [html_section(_build(d, where))]
    summ = d.get("spatial")
    if summ is not None or map_png is not None:
        parts = ['<section class="numvar-locate-map">', "<h3>Where the output varies</h3>"]
        if summ is not None:
            text = (f"Spatial view of an output of shape {tuple(summ['shape'])}: min "
                    f"{summ['min_digits']:.2f} digits at pixel {tuple(summ['worst_pixel'])}, "
                    f"median {summ['median_digits']:.2f}; "
                    f"{100 * summ['share_below_cap']:.1f}% of pixels vary.")
            if summ.get("max_flip_rate") is not None and summ["share_flipping"] > 0:
                text += (f" Labels (class axis {summ.get('class_dim')}) differ from IEEE "
                         f"at {100 * summ['share_flipping']:.1f}% of pixels, at most in "
                         f"{100 * summ['max_flip_rate']:.1f}% of (realization, batch item) "
                         "pairs.")
            elif summ.get("max_flip_rate") is not None:
                text += f" No label (class axis {summ.get('class_dim')}) differs from IEEE."
            parts.append(f"<p>{html.escape(text)}</p>")
        if map_png is not None:
            b64 = base64.b64encode(read_png(map_png)).decode("ascii")
            parts.append('<img alt="locate: where the output varies" '
                         f'src="data:image/png;base64,{b64}"/>')
        parts.append("</section>")
        out.append("\n".join(parts))
    return out
