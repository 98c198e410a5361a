"""Presenting a :class:`~numvar.locate.api.LocateResult`: rich tables and an HTML section.

:func:`renderables` feeds ``rich.console.Console.print`` (the CLI); :func:`html_section`
returns a self-contained ``<section>`` fragment (inline styles, the spatial map as a
base64 PNG) that the analysis HTML report, or any page, can embed as is.
"""

from __future__ import annotations

import base64
import html
from typing import Any

from .spatial import render_png


def _f(v: Any, nd: int = 2) -> str:
    if v is None:
        return "–"
    v = round(float(v), nd)
    return f"{v + 0.0 if v != 0 else 0.0:.{nd}f}"          # never "-0.00"


def _unit(res, short: bool = False) -> str:
    from ..analysis.text import unit_name

    return unit_name(res.config.get("basis", 2), short=short)


def headline(res) -> str:
    """One sentence: what the output keeps, the threshold, whether anything crosses it."""
    unit = _unit(res)
    s = (f"Output keeps {res.digits_all:.2f} of {res.cap:.2f} {unit} ({res.config.get('stat')}) "
         f"with every {'module' if res.by == 'module' else 'op kind'} perturbed "
         f"({res.config.get('mode')}, {res.config.get('granularity')}); threshold "
         f"{res.threshold:.2f} ({res.threshold_source}).")
    if not res.crosses:
        s += " Nothing crosses the threshold: no set of candidates breaks it."
    return s


def dd_sentence(res) -> str:
    if res.dd is None:
        return "Delta debugging: nothing to minimize (the full set keeps the threshold)." \
            if res.config.get("ddmin") else "Delta debugging: skipped."
    names = ", ".join(res.dd.minimal)
    s = (f"Delta debugging (ddmin): minimal set {{{names}}} keeps {res.dd.digits:.2f} "
         f"< {res.threshold:.2f}; {res.dd.tests} new evaluation(s) "
         f"(bound {res.dd_bound}).")
    if not res.dd.complete:
        s += " Budget exhausted: the set fails the threshold but may not be minimal."
    return s


def cost_sentence(res) -> str:
    return (f"Spent {res.evaluations} evaluations × {res.config.get('n')} realizations = "
            f"{res.realizations} realizations (+{res.reference_runs} IEEE reference run); "
            f"documented bound {res.bound}.")


def ranking_table(res):
    """The ranked rich table, most harmful first, numbered."""
    from rich.table import Table

    dd_set = set(res.dd.minimal) if res.dd else set()
    what = "module" if res.by == "module" else "op kind"
    t = Table(title=f"Where the digits go (by {what})", title_justify="left")
    w_name = max([len(what)] + [len(r.name or "(model)") for r in res.ranked])
    w_cls = max([5] + [len(res.candidate(r.name).cls) for r in res.ranked])
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column(what, min_width=w_name, no_wrap=True)
    t.add_column("class" if res.by == "module" else "ops", min_width=w_cls, no_wrap=True)
    u = _unit(res, short=True)
    t.add_column(f"digits alone ({u})", justify="right")
    t.add_column(f"lost alone ({u})", justify="right")
    if res.config.get("necessity"):
        t.add_column(f"digits w/o it ({u})", justify="right")
        t.add_column(f"necessity ({u})", justify="right", min_width=9)
    t.add_column("ddmin", justify="center")
    for i, row in enumerate(res.ranked, 1):
        c = res.candidate(row.name)
        cls = c.cls if res.by == "module" else str(sum(c.ops.values()))
        cells = [str(i), row.name or "(model)", cls, _f(row.alone), _f(row.lost)]
        if res.config.get("necessity"):
            cells += [_f(row.without), _f(row.necessity)]
        cells.append("●" if row.name in dd_set else "")
        t.add_row(*cells)
    return t


def propagation_table(res):
    from rich.table import Table

    t = Table(title="Error propagation (digits of each layer's own output)",
              title_justify="left")
    w_name = max([5] + [len(lr.name) for lr in res.layers])
    w_cls = max([5] + [len(res.candidate(lr.name).cls) for lr in res.layers])
    t.add_column("layer", min_width=w_name, no_wrap=True)
    t.add_column("class", min_width=w_cls, no_wrap=True)
    for col in ("all perturbed", "only this layer", "lost in layer", "inherited"):
        t.add_column(f"{col} ({_unit(res, short=True)})", justify="right")
    for lr in res.layers:
        t.add_row(lr.name, res.candidate(lr.name).cls, _f(lr.all), _f(lr.alone),
                  _f(lr.lost_in_layer), _f(lr.inherited))
    return t


def renderables(res) -> list:
    """What ``numvar locate`` prints, in order."""
    out: list[Any] = [headline(res)]
    if res.ranked:
        out.append(ranking_table(res))
    else:
        out.append("No candidate loses any digit at the output: nothing to rank.")
    if res.no_effect and res.ranked:
        out.append(f"No measurable effect on the {res.config.get('stat', 'mean')} output "
                   f"digits: " + ", ".join(r.name or "(model)" for r in res.no_effect))
    out.append(dd_sentence(res))
    if res.layers:
        out.append(propagation_table(res))
    if res.unattributed:
        ops = sum(res.unattributed.values())
        out.append(f"{ops} float op call(s) ran outside every leaf module (containers' own "
                   f"forward code); they stayed IEEE in every evaluation.")
    if res.spatial is not None:
        s = res.spatial.summary()
        out.append(f"Spatial view: min {s['min_digits']:.2f} digits at pixel "
                   f"{tuple(s['worst_pixel'])}; {100 * s['share_below_cap']:.1f}% of pixels "
                   f"vary.")
    out.append(cost_sentence(res))
    return out


_CSS = ("font-family:sans-serif;border-collapse:collapse;margin:0.5em 0;",
        "border:1px solid #ccc;padding:2px 6px;text-align:right;")


def _table_html(headers: list[str], rows: list[list[str]]) -> str:
    th = "".join(f'<th style="{_CSS[1]}">{html.escape(h)}</th>' for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td style="{_CSS[1]}">{html.escape(c)}</td>' for c in r) + "</tr>"
        for r in rows)
    return f'<table style="{_CSS[0]}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def html_section(res) -> str:
    """A ``<section class="numvar-locate">`` fragment: headline, ranking, ddmin,
    propagation, spatial map (inline PNG) and cost. Every text is HTML-escaped."""
    parts = ['<section class="numvar-locate">', "<h2>Locating instability</h2>",
             f"<p>{html.escape(headline(res))}</p>"]
    dd_set = set(res.dd.minimal) if res.dd else set()
    if res.ranked:
        u = _unit(res, short=True)
        headers = ["#", "module" if res.by == "module" else "op kind", "class",
                   f"digits alone ({u})", f"lost alone ({u})", f"digits w/o it ({u})",
                   f"necessity ({u})", "ddmin"]
        rows = [[str(i), r.name or "(model)", res.candidate(r.name).cls, _f(r.alone),
                 _f(r.lost), _f(r.without), _f(r.necessity),
                 "yes" if r.name in dd_set else ""] for i, r in enumerate(res.ranked, 1)]
        parts.append(_table_html(headers, rows))
    else:
        parts.append("<p>No candidate loses any digit at the output: nothing to rank.</p>")
    if res.no_effect and res.ranked:
        parts.append(f"<p>No measurable effect on the {html.escape(str(res.config.get('stat')))} "
                     "output digits: "
                     + html.escape(", ".join(r.name or "(model)" for r in res.no_effect)) + "</p>")
    parts.append(f"<p>{html.escape(dd_sentence(res))}</p>")
    if res.layers:
        rows = [[lr.name, res.candidate(lr.name).cls, _f(lr.all), _f(lr.alone),
                 _f(lr.lost_in_layer), _f(lr.inherited)] for lr in res.layers]
        parts.append("<h3>Error propagation</h3>")
        u = _unit(res, short=True)
        parts.append(_table_html(["layer", "class", f"all perturbed ({u})",
                                  f"only this layer ({u})", f"lost in layer ({u})",
                                  f"inherited ({u})"], rows))
    if res.spatial is not None:
        png = base64.b64encode(render_png(res.spatial)).decode("ascii")
        parts.append("<h3>Where the output varies</h3>")
        parts.append(f'<img alt="spatial map of significant digits" '
                     f'src="data:image/png;base64,{png}"/>')
    parts.append(f"<p>{html.escape(cost_sentence(res))}</p>")
    parts.append("</section>")
    return "\n".join(parts)


def html_page(res) -> str:
    """A standalone page around :func:`html_section` (``numvar locate --html``), with the
    stylesheet of numvar's other HTML reports."""
    from ..analysis.html import CSS

    what = "modules" if res.by == "module" else "op kinds"
    title = f"numvar locate: where the digits go (by {what})"
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            + html_section(res) + "</body></html>\n")
