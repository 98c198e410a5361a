"""Rich tables of an :func:`analyze` / :func:`compare` result (the terminal report).

Every number printed is a value of the result dict passed through :func:`fmt`, so the
terminal report, the JSON and the API agree by construction (tests check it).

Tables never split a number across lines: numeric columns do not wrap, and a table
that does not fit the terminal is printed as one key/value block per row instead
(:class:`FitTable`); ``wide=True`` (``numvar report --wide``) keeps every column and
lets the lines run as long as they need.
"""

from __future__ import annotations

from typing import Any

NO_VARIATION = "no variation observed"
WEIGHT_PREFIXES = ("weights.", "params.", "state_dict.")


def unit_name(basis: int, short: bool = False) -> str:
    """The unit of significant digits in ``basis``: bits, decimal digits, base-b digits."""
    if basis == 2:
        return "bits"
    if basis == 10:
        return "decimal" if short else "decimal digits"
    return f"base {basis}" if short else f"base-{basis} digits"


def fmt(v: Any, kind: str = "g") -> str:
    """One formatting rule for the whole report: ``g`` → 4 significant figures, ``d`` →
    digits with 2 decimals, ``p`` → a share as a percentage with 2 decimals; None → ``—``."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) and kind == "g":
        return str(v)
    if kind == "d":
        return f"{v:.2f}"
    if kind == "p":
        return f"{100 * v:.2f}%"
    return f"{v:.4g}"


def digits_cell(d: dict | None) -> tuple[str, str]:
    """(min, median) cells; a capture with no variation at all is labelled as such."""
    if d is None:
        return "exact", "exact"
    if d["all_no_variation"]:
        return NO_VARIATION, f"cap {fmt(d['cap'], 'd')}"
    return fmt(d["min"], "d"), fmt(d["median"], "d")


def decision_cell(result: dict, name: str) -> str:
    """Flips (classification) or minimum Dice (segmentation) of a capture, else empty."""
    parts = []
    c = result["classification"].get(name)
    if c is not None:
        parts.append(f"{c['flipped_samples']}/{c['samples']} flipped")
    s = result["segmentation"].get(name)
    if s is not None:
        parts.append(f"Dice min {fmt(s['dice_min'])}")
    return "; ".join(parts)


def is_report_capture(name: str, e: dict) -> bool:
    """Captures listed in the captures table (layers, series and weights have their own)."""
    return e["kind"] not in ("layer", "series") and not name.split("@")[0].startswith(
        WEIGHT_PREFIXES)


def capture_row(result: dict, name: str, e: dict) -> dict[str, str]:
    """The formatted cells of one capture, by column key (terminal and HTML share them).

    ``mean|x|`` is left empty for integer captures (labels, targets): for them it means
    nothing."""
    dmin, dmed = digits_cell(e["digits"])
    is_float = e["digits"] is not None
    return {
        "capture": name, "kind": e["kind"],
        "shape": "×".join(map(str, e["shape"])) or "scalar",
        "mean_abs": fmt(e["mean_abs"]) if is_float else "—",
        "std": fmt(e["std"]), "sem": fmt(e["sem"]), "rel_std": fmt(e["rel_std"]),
        "max_dev": fmt(e["max_abs_dev_ref"]),
        "dmin": dmin, "dmed": dmed,
        "novar": fmt(e["digits"]["no_variation_share"], "p") if is_float else "—",
        "decision": decision_cell(result, name),
    }


def capture_columns(basis: int, wide: bool) -> list[tuple[str, str]]:
    """(key, header) of the captures table; ``wide`` adds kind, mean|x|, sem, max|dev|."""
    u = unit_name(basis, short=True)
    cols = [("capture", "capture"), ("kind", "kind"), ("shape", "shape"),
            ("mean_abs", "mean|x|"), ("std", "std (R−1)"), ("sem", "sem"),
            ("rel_std", "rel std"), ("max_dev", "max|x−IEEE|"),
            ("dmin", f"digits min ({u})"), ("dmed", f"digits median ({u})"),
            ("novar", "no variation"), ("decision", "flips / Dice")]
    if not wide:
        cols = [c for c in cols if c[0] not in ("kind", "mean_abs", "sem", "max_dev")]
    return cols


class FitTable:
    """A table that never splits a number.

    Rendered as a rich Table when its narrowest layout fits the console (numeric cells
    never wrap); otherwise as one key/value block per row, titled by the row's first
    cell. ``wide=True`` always renders the table, as wide as its content needs.
    """

    def __init__(self, title: str, headers: list[str], rows: list[list[str]], *,
                 caption: str | None = None, left: int = 1, wide: bool = False) -> None:
        self.title, self.headers, self.rows = title, headers, rows
        self.caption, self.left, self.wide = caption, left, wide

    def _widths(self) -> list[int]:
        """Each column's narrowest width: numeric columns hold their longest cell whole;
        text columns may fold, down to their longest word (at most 16 characters)."""
        from rich.cells import cell_len

        out = []
        for i, h in enumerate(self.headers):
            cells = [str(r[i]) for r in self.rows]
            words = [w for c in cells + [h] for w in c.split()] or [""]
            longest_word = max(cell_len(w) for w in words)
            if i < self.left:
                out.append(min(longest_word, 16))
            else:
                out.append(max([longest_word] + [cell_len(c) for c in cells]))
        return out

    def table(self):
        import textwrap

        from rich.table import Table

        t = Table(title=self.title, caption=self.caption)
        for i, (h, w) in enumerate(zip(self.headers, self._widths())):
            if i >= self.left:  # headers break between words, never inside a number's column
                h = "\n".join(textwrap.wrap(h, width=max(w, 1), break_long_words=False))
            t.add_column(h, justify="left" if i < self.left else "right",
                         no_wrap=i >= self.left, overflow="fold",
                         min_width=None if i < self.left else w)
        for r in self.rows:
            t.add_row(*r)
        return t

    def width_needed(self) -> int:
        """Columns at their narrowest, plus padding and borders."""
        return sum(self._widths()) + 3 * len(self.headers) + 1

    def records(self):
        """The key/value layout: one block per row."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        out: list = [Text(self.title, style="bold")]
        for r in self.rows:
            out.append(Text(r[0], style="bold cyan"))
            g = Table.grid(padding=(0, 2))
            g.add_column(style="dim", no_wrap=False)
            g.add_column(justify="left", no_wrap=True, overflow="fold")
            for h, v in zip(self.headers[1:], r[1:]):
                if v not in ("", None):
                    g.add_row("  " + h.replace("\n", " "), v)
            out.append(g)
        if self.caption:
            out.append(Text(self.caption, style="dim"))
        return Group(*out)

    def __rich_console__(self, console, options):
        table = self.table()
        if self.wide:
            from rich.measure import Measurement

            need = Measurement.get(console, options.update_width(10_000), table).maximum
            yield from console.render(table, options.update_width(max(need, options.max_width)))
        elif self.width_needed() <= options.max_width:
            yield table
        else:
            yield self.records()


def report_header(result: dict) -> str:
    """One sentence: the run, R, the digits method and their unit."""
    st, run = result["settings"], result["run"]
    return (f"{run.get('path') or 'samples'}: R = {run['n']} realizations"
            f"{', ' + str(run['failed']) + ' failed' if run['failed'] else ''}; "
            f"significant digits in {unit_name(st['basis'])} ({st['method'].upper()}, "
            f"{st['error']} error, p = {st['probability']}, confidence = "
            f"{st['confidence']}, against {st['against']})")


def escapes_text(escapes: dict, granularity: str) -> str:
    """The warning at the top of a report: ops not perturbed as asked, with counts."""
    lines = [f"WARNING: {len(escapes)} op(s) were NOT perturbed at {granularity} granularity "
             f"(ran natively or rounded once); the variability they cause is missing:"]
    for op, e in escapes.items():
        lines.append(f"  {op}: {e['count']} calls in {e['realizations']} realization(s): "
                     f"{e['reason']}")
    return "\n".join(lines)


def report_renderables(result: dict, wide: bool = False) -> list:
    """Rich renderables (tables and notes) for one analysis result.

    ``wide``: every column, lines as long as needed; otherwise tables that do not fit the
    terminal become key/value blocks (numbers are never split)."""
    from rich.text import Text

    out: list = []
    st = result["settings"]
    u = unit_name(st["basis"], short=True)
    out.append(Text(report_header(result)))
    run = result["run"]
    if run.get("escapes"):  # first: parts of the model these numbers do NOT cover
        out.append(Text(escapes_text(run["escapes"], run.get("config", {}).get("granularity",
                                                                               "flop")),
                        style="bold red"))

    cols = capture_columns(st["basis"], wide)
    rows = []
    for name, e in result["captures"].items():
        if is_report_capture(name, e):
            cells = capture_row(result, name, e)
            rows.append([cells[k] for k, _ in cols])
    if rows:
        out.append(FitTable("Captures", [h for _, h in cols], rows, wide=wide,
                            caption="std: dispersion of one execution (R−1); sem = std/√R: "
                                    "uncertainty of the estimated mean only"))

    if result["layers"]:
        rows = []
        for i, la in enumerate(result["layers"]):
            if la["all_no_variation"]:
                cells = [NO_VARIATION, "—", f"cap {fmt(la['digits_median'], 'd')}", "—"]
            else:
                cells = [fmt(la["digits_min"], "d"), fmt(la["digits_p05"], "d"),
                         fmt(la["digits_median"], "d"), fmt(la["digits_median_varying"], "d")]
            rows.append([la["name"], str(i), str(la["numel"]), fmt(la["std"]), *cells,
                         fmt(la["no_variation_share"], "p")])
        out.append(FitTable("Layers (network order)",
                            ["layer", "#", "numel", "std (R−1)", f"digits min ({u})",
                             f"digits p05 ({u})", f"digits median ({u})",
                             f"median of varying ({u})", "no variation"], rows, wide=wide,
                            caption="elements that never vary (e.g. ReLU zeros) sit at the "
                                    "format's cap; the median of varying elements leaves "
                                    "them out"))

    for name, c in result["classification"].items():
        rows = [("flipped samples", fmt(c["flipped_samples"])),
                ("flip rate", fmt(c["flip_rate"], "p")),
                ("unstable across realizations", fmt(c["unstable_samples"])),
                ("agreement with IEEE", fmt(c["agreement_with_ieee"], "p")),
                ("score std (mean)", fmt(c["score_std_mean"])),
                ("score std (max)", fmt(c["score_std_max"])),
                ("samples with varying scores", fmt(c["samples_with_varying_scores"])),
                ("stable decision, varying scores", fmt(c["stable_but_varying"])),
                ("smallest mean margin", fmt(c["margin"]["mean_min"])),
                ("smallest margin / its std", fmt(c["margin"]["z_min"]))]
        acc = c.get("accuracy")
        if acc:
            rows += [("accuracy mean", fmt(acc["mean"], "p")),
                     ("accuracy std (R−1)", fmt(acc["std"], "p")),
                     ("accuracy min", fmt(acc["min"], "p")), ("accuracy max", fmt(acc["max"], "p")),
                     ("accuracy IEEE", fmt(acc["ieee"], "p"))]
        out.append(FitTable(f"Decisions: {name} ({c['samples']} samples, {c['classes']} "
                            f"classes, against {c['against']})", ["measure", "value"],
                            [list(r) for r in rows], wide=wide,
                            caption="the decision never flips while the scores vary"
                            if c["decision_never_flips_while_scores_vary"] else None))

    for name, s in result["segmentation"].items():
        rows = [[lab, fmt(v["dice_mean"]), fmt(v["dice_min"]), fmt(v["volume_mean"]),
                 fmt(v["volume_std"]), fmt(v["volume_cv"]), fmt(v["volume_ieee"])]
                for lab, v in s["labels"].items()]
        out.append(FitTable(
            f"Segmentation: {name} (against {s['against']}); disagreeing voxels "
            f"{fmt(s['disagreement']['voxels'])} ({fmt(s['disagreement']['share'], 'p')}), "
            f"Dice mean {fmt(s['dice_mean'])}, min {fmt(s['dice_min'])}",
            ["label", "Dice mean", "Dice min", "volume mean (voxels)", "volume std (voxels)",
             "volume CV", "IEEE volume (voxels)"], rows, wide=wide))

    for s in result["series"]:
        idx: list[int | None] = list(range(len(s["steps"])))
        if len(idx) > 12:  # first 5, last 5
            idx = idx[:5] + [None] + idx[-5:]
        rows = []
        for i in idx:
            if i is None:
                rows.append(["…", "", "", "", "", "", ""])
                continue
            ref = s["reference"][i] if s["reference"] else None
            rows.append([str(s["steps"][i]), fmt(s["mean"][i]), fmt(s["std"][i]),
                         fmt(s["min"][i]), fmt(s["max"][i]), fmt(ref),
                         fmt(s["digits_median"][i], "d")])
        out.append(FitTable(f"Series {s['name']} (band across realizations)",
                            ["step", "mean", "std (R−1)", "min", "max", "IEEE",
                             f"digits median ({u})"], rows, wide=wide))

    if result["weights"]:
        rows = [[w["layer"], str(w["numel"]), fmt(w["std"]), fmt(w["rel_std"]),
                 fmt(w["digits_min"], "d"), fmt(w["digits_median"], "d")]
                for w in result["weights"]]
        out.append(FitTable("Final weights per layer",
                            ["layer", "numel", "std (R−1)", "rel std", f"digits min ({u})",
                             f"digits median ({u})"], rows, wide=wide))
    for n in result["notes"]:
        out.append(Text(f"note: {n}", style="yellow"))
    return out


def compare_renderables(cmp: dict, wide: bool = False) -> list:
    """Rich tables for a :func:`compare` result: digits side by side."""
    from rich.text import Text

    a, b = (p or "a" for p in cmp["runs"])
    u = unit_name(cmp["settings"][0]["basis"], short=True)
    out: list = []
    for i, (p, cfg) in enumerate(zip((a, b), cmp["configs"])):
        short = ", ".join(f"{k}={cfg[k]}" for k in ("mode", "granularity", "precision", "n")
                          if k in cfg)
        out.append(Text(f"{'AB'[i]}: {p} {short}"))

    def dcell(s):
        return "no var." if s["no_variation"] else fmt(s["digits_median"], "d")

    rows = [[c["name"], dcell(c["a"]), dcell(c["b"]), fmt(c["delta_median"], "d"),
             fmt(c["a"]["digits_min"], "d"), fmt(c["b"]["digits_min"], "d")]
            + ([fmt(c["a"]["std"]), fmt(c["b"]["std"])] if wide else [])
            for c in cmp["captures"]
            if c["a"]["digits_median"] is not None or c["b"]["digits_median"] is not None]
    out.append(FitTable(f"Significant digits ({unit_name(cmp['settings'][0]['basis'])}), "
                        "A vs B",
                        ["capture", f"A median ({u})", f"B median ({u})", f"B − A ({u})",
                         f"A min ({u})", f"B min ({u})"] + (["A std", "B std"] if wide else []),
                        rows, wide=wide))
    if cmp["classification"]:
        rows = [[c["name"], fmt(c["a"]["flip_rate"], "p"), fmt(c["b"]["flip_rate"], "p"),
                 fmt(c["a"]["agreement_with_ieee"], "p"), fmt(c["b"]["agreement_with_ieee"], "p")]
                for c in cmp["classification"]]
        out.append(FitTable("Decisions, A vs B", ["scores", "A flip rate", "B flip rate",
                                                  "A agreement", "B agreement"], rows,
                            wide=wide))
    for side, names in (("A", cmp["only_a"]), ("B", cmp["only_b"])):
        if names:
            out.append(Text(f"only in {side}: {', '.join(names[:20])}"
                            f"{' …' if len(names) > 20 else ''}", style="yellow"))
    return out
