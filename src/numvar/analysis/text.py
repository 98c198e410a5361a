"""Rich tables of an :func:`analyze` / :func:`compare` result (the terminal report).

Every number printed is a value of the result dict passed through :func:`fmt`, so the
terminal report, the JSON and the API agree by construction (tests check it).
"""

from __future__ import annotations

from typing import Any

NO_VARIATION = "no variation observed"


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


def report_renderables(result: dict) -> list:
    """Rich renderables (tables and notes) for one analysis result."""
    from rich.table import Table
    from rich.text import Text

    out: list = []
    st = result["settings"]
    run = result["run"]
    unit = "bits" if st["basis"] == 2 else f"base-{st['basis']} digits"
    head = (f"{run.get('path') or 'samples'}: R = {run['n']} realizations"
            f"{', ' + str(run['failed']) + ' failed' if run['failed'] else ''}; "
            f"significant digits ({st['method'].upper()}, {st['error']} error, {unit}, "
            f"p={st['probability']}, c={st['confidence']}, against {st['against']}); "
            f"minimum realizations for the General method: {st['minimum_trials']}")
    out.append(Text(head))

    t = Table(title="Captures", caption="std: dispersion of one execution (R−1); "
              "sem = std/√R: uncertainty of the estimated mean only")
    for c in ("capture", "kind", "shape", "mean|x|", "std", "sem", "rel std",
              "dig. min", "dig. median", "no var.", "flips / Dice"):
        t.add_column(c, justify="left" if c in ("capture", "kind", "shape") else "right",
                     overflow="fold")
    for name, e in result["captures"].items():
        if e["kind"] in ("layer", "series") or name.split("@")[0].startswith(
                ("weights.", "params.", "state_dict.")):
            continue
        dmin, dmed = digits_cell(e["digits"])
        nv = fmt(e["digits"]["no_variation_share"], "p") if e["digits"] else "—"
        t.add_row(name, e["kind"], "×".join(map(str, e["shape"])) or "scalar", fmt(e["mean_abs"]),
                  fmt(e["std"]), fmt(e["sem"]), fmt(e["rel_std"]), dmin, dmed, nv,
                  decision_cell(result, name))
    if t.row_count:
        out.append(t)

    if result["layers"]:
        t = Table(title="Layers (network order)")
        for c in ("#", "layer", "numel", "std", "digits min", "digits p05", "digits median",
                  "median (varying)", "no var."):
            t.add_column(c, justify="left" if c == "layer" else "right", overflow="fold")
        for i, la in enumerate(result["layers"]):
            if la["all_no_variation"]:
                cells = (NO_VARIATION, "", f"cap {fmt(la['digits_median'], 'd')}", "—")
            else:
                cells = (fmt(la["digits_min"], "d"), fmt(la["digits_p05"], "d"),
                         fmt(la["digits_median"], "d"), fmt(la["digits_median_varying"], "d"))
            cells += (fmt(la["no_variation_share"], "p"),)
            t.add_row(str(i), la["name"], str(la["numel"]), fmt(la["std"]), *cells)
        out.append(t)

    for name, c in result["classification"].items():
        t = Table(title=f"Decisions: {name} ({c['samples']} samples, {c['classes']} classes, "
                        f"against {c['against']})")
        t.add_column("measure")
        t.add_column("value", justify="right", overflow="fold")
        rows = [("flipped samples", fmt(c["flipped_samples"])), ("flip rate", fmt(c["flip_rate"], "p")),
                ("unstable across realizations", fmt(c["unstable_samples"])),
                ("agreement with IEEE", fmt(c["agreement_with_ieee"], "p")),
                ("score std (mean)", fmt(c["score_std_mean"])), ("score std (max)", fmt(c["score_std_max"])),
                ("samples with varying scores", fmt(c["samples_with_varying_scores"])),
                ("stable decision, varying scores", fmt(c["stable_but_varying"])),
                ("smallest mean margin", fmt(c["margin"]["mean_min"])),
                ("smallest margin / its std", fmt(c["margin"]["z_min"]))]
        acc = c.get("accuracy")
        if acc:
            rows += [("accuracy mean", fmt(acc["mean"], "p")), ("accuracy std (R−1)", fmt(acc["std"], "p")),
                     ("accuracy min", fmt(acc["min"], "p")), ("accuracy max", fmt(acc["max"], "p")),
                     ("accuracy IEEE", fmt(acc["ieee"], "p"))]
        for r in rows:
            t.add_row(*r)
        if c["decision_never_flips_while_scores_vary"]:
            t.caption = "the decision never flips while the scores vary"
        out.append(t)

    for name, s in result["segmentation"].items():
        t = Table(title=f"Segmentation: {name} (against {s['against']}); disagreeing voxels "
                        f"{fmt(s['disagreement']['voxels'])} ({fmt(s['disagreement']['share'], 'p')}), "
                        f"Dice mean {fmt(s['dice_mean'], 'g')}, min {fmt(s['dice_min'], 'g')}")
        for c in ("label", "Dice mean", "Dice min", "volume mean", "volume std", "volume CV", "IEEE volume"):
            t.add_column(c, justify="right", overflow="fold")
        for lab, v in s["labels"].items():
            t.add_row(lab, fmt(v["dice_mean"]), fmt(v["dice_min"]), fmt(v["volume_mean"]),
                      fmt(v["volume_std"]), fmt(v["volume_cv"]), fmt(v["volume_ieee"]))
        out.append(t)

    for s in result["series"]:
        t = Table(title=f"Series {s['name']} (band across realizations)")
        for c in ("step", "mean", "std", "min", "max", "IEEE", "digits median"):
            t.add_column(c, justify="right", overflow="fold")
        idx = list(range(len(s["steps"])))
        if len(idx) > 12:  # first 5, last 5
            idx = idx[:5] + [None] + idx[-5:]
        for i in idx:
            if i is None:
                t.add_row("…", "", "", "", "", "", "")
                continue
            ref = s["reference"][i] if s["reference"] else None
            t.add_row(str(s["steps"][i]), fmt(s["mean"][i]), fmt(s["std"][i]), fmt(s["min"][i]),
                      fmt(s["max"][i]), fmt(ref), fmt(s["digits_median"][i], "d"))
        out.append(t)

    if result["weights"]:
        t = Table(title="Final weights per layer")
        for c in ("layer", "numel", "std", "rel std", "digits min", "digits median"):
            t.add_column(c, justify="left" if c == "layer" else "right", overflow="fold")
        for w in result["weights"]:
            t.add_row(w["layer"], str(w["numel"]), fmt(w["std"]), fmt(w["rel_std"]),
                      fmt(w["digits_min"], "d"), fmt(w["digits_median"], "d"))
        out.append(t)
    for n in result["notes"]:
        out.append(Text(f"note: {n}", style="yellow"))
    return out


def compare_renderables(cmp: dict) -> list:
    """Rich tables for a :func:`compare` result: digits side by side."""
    from rich.table import Table
    from rich.text import Text

    a, b = (p or "a" for p in cmp["runs"])
    out: list = []
    for i, (p, cfg) in enumerate(zip((a, b), cmp["configs"])):
        short = ", ".join(f"{k}={cfg[k]}" for k in ("mode", "granularity", "precision", "n")
                          if k in cfg)
        out.append(Text(f"{'AB'[i]}: {p} {short}"))
    t = Table(title="Significant digits, A vs B")
    for c in ("capture", "A median", "B median", "B − A", "A min", "B min", "A std", "B std"):
        t.add_column(c, justify="left" if c == "capture" else "right", overflow="fold")

    def dcell(s):
        return "no var." if s["no_variation"] else fmt(s["digits_median"], "d")

    for c in cmp["captures"]:
        if c["a"]["digits_median"] is None and c["b"]["digits_median"] is None:
            continue
        t.add_row(c["name"], dcell(c["a"]), dcell(c["b"]), fmt(c["delta_median"], "d"),
                  fmt(c["a"]["digits_min"], "d"), fmt(c["b"]["digits_min"], "d"),
                  fmt(c["a"]["std"]), fmt(c["b"]["std"]))
    out.append(t)
    if cmp["classification"]:
        t = Table(title="Decisions, A vs B")
        for c in ("scores", "A flip rate", "B flip rate", "A agreement", "B agreement"):
            t.add_column(c, justify="left" if c == "scores" else "right", overflow="fold")
        for c in cmp["classification"]:
            t.add_row(c["name"], fmt(c["a"]["flip_rate"], "p"), fmt(c["b"]["flip_rate"], "p"),
                      fmt(c["a"]["agreement_with_ieee"], "p"), fmt(c["b"]["agreement_with_ieee"], "p"))
        out.append(t)
    for side, names in (("A", cmp["only_a"]), ("B", cmp["only_b"])):
        if names:
            out.append(Text(f"only in {side}: {', '.join(names[:20])}"
                            f"{' …' if len(names) > 20 else ''}", style="yellow"))
    return out
