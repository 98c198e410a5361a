"""``analyze``: every statistic of a :class:`~numvar.runner.store.Samples`, as one JSON-able dict.

Result keys (schema ``numvar.analysis/1``; documented in the README):

- ``run``: path, config, n, seeds, failed, has_reference
- ``settings``: method, basis, error, against, probability, confidence, minimum_trials,
  enough_trials, task
- ``captures[name]``: kind, dtype, shape, numel, against, mean, mean_abs, std, std_max,
  sem, rel_std, reference, max_abs_dev_ref, varying_elements, digits{...} (None for integer
  captures)
- ``layers``: [{name, path, call, numel, std, digits_median, digits_min, digits_mean,
  digits_p05, digits_median_varying, no_variation_share, all_no_variation, cap}] in
  network order
- ``series``: [{name, steps, captures, mean, std, min, max, reference, digits_median}]
- ``weights``: [{layer, tensors, numel, std, rel_std, digits_median, digits_min}]
- ``classification`` / ``segmentation``: {capture name: see classify() / segment()}
- ``presence``: [{name, present, of, reference, shapes}] captures not in every
  realization with one shape and dtype (not analysed)
- ``iterations``: {modules: [top-level module calls per realization], reference_modules,
  series: {base: {steps, reference}}, varies}: a training loop that runs until it
  converges takes a different number of steps under rounding (a finding, in ``notes``)
- ``dropped``: per realization, what the capture limit dropped
- ``notes``: human-readable remarks (too few realizations, missing reference, ...)
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import numpy as np
import torch

from ..errors import AnalysisError
from ..runner.store import SERIES_RE, Samples
from ._util import centred_moments, fnum, gnum, to_numpy
from .classification import classify, is_label_name, is_score_name
from .digits import (SigDigits, _check, minimum_trials, precision_of, significant_digits,
                     summarize_digits)
from .segmentation import label_maps, segment

log = logging.getLogger(__name__)

SCHEMA = "numvar.analysis/1"
TASKS = ("auto", "classification", "segmentation", "none")
WEIGHT_PREFIXES = ("weights.", "params.", "state_dict.")
LAYER_RE = re.compile(r"^layers/(?P<path>.*?)(#(?P<call>\d+))?$")


class AnalysisResult(dict):
    """The result of :func:`analyze`: a plain JSON-able dict that also renders as the HTML
    report in a notebook (``_repr_html_``)."""

    def _repr_html_(self) -> str:
        from .html import notebook_html, render_html

        return notebook_html(render_html(self))


class CompareResult(dict):
    """The result of :func:`compare`: a dict that renders as HTML in a notebook."""

    def _repr_html_(self) -> str:
        from .html import notebook_html, render_compare_html

        return notebook_html(render_compare_html(self), height=480)


def printed_precision_bits(values: np.ndarray) -> int:
    """Bits a printed number can hold: the most significant decimal digits among
    ``values`` (each the float a script printed, read back), in bits, at most 53.

    ``print(0.1234)`` carries 4 significant digits, i.e. 14 bits: digits beyond that are
    not in the text, so a stdout capture cannot keep more. Values that are all binary32
    numbers (``print(loss.item())`` of a float32 loss) hold at most 24 bits."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = values[np.isfinite(values)]
    fmt_bits = 24 if finite.size and np.all(finite.astype(np.float32) == finite) else 53
    digits = 1
    for v in values:
        if not math.isfinite(v) or v == 0.0:
            continue
        mant = repr(float(v)).lower().split("e")[0].replace("-", "").replace(".", "")
        digits = max(digits, len(mant.strip("0")) or 1)
    return min(fmt_bits, math.ceil(digits * math.log2(10)))


def _moments(x: np.ndarray, ref: np.ndarray | None) -> dict:
    """Mean, std (R−1) and standard error s/√R over realizations, summarised over elements.

    ``std`` is the mean over elements of the per-element sample standard deviation (the
    dispersion of one execution); ``sem`` = ``std/√R`` only describes the estimated mean.
    Both come from :func:`centred_moments` (identical realizations: exactly 0).
    """
    R = x.shape[0]
    flat = x.reshape(R, -1)
    mean, std = centred_moments(flat)
    nz = mean != 0
    rel = np.abs(std[nz] / mean[nz])
    out = {
        "mean": gnum(mean.mean()),
        "mean_abs": gnum(np.abs(mean).mean()),
        "std": gnum(std.mean()),
        "std_max": gnum(std.max()),
        "sem": gnum(std.mean() / np.sqrt(R)),
        "rel_std": gnum(np.median(rel)) if rel.size else None,
        "reference": None,
        "max_abs_dev_ref": None,
        "varying_elements": int((~np.all(flat == flat[:1], axis=0)).sum()),
    }
    if ref is not None:
        r = ref.reshape(-1)
        if r.size == 1:
            out["reference"] = gnum(r[0])
        out["max_abs_dev_ref"] = gnum(np.abs(flat - r[None, :]).max())
    return out


def _cap_for(t: torch.Tensor, config: dict, precision_bits: int | None) -> int:
    if precision_bits is not None:
        return int(precision_bits)
    bits = precision_of(t.dtype)
    virt = config.get("precision")
    if isinstance(virt, int) and 0 < virt < bits:
        bits = virt
    return bits


def _pick_scores(samples: Samples, task: str, scores) -> list[str]:
    names = list(samples.captures)
    if scores is not None:
        missing = [s for s in scores if s not in samples.captures]
        if missing:
            raise AnalysisError(f"no capture named {missing}; captures are {names}")
        return list(scores)
    skip = ("layer", "module", "series")
    found = [n for n in names if is_score_name(n) and samples.kinds.get(n) not in skip]
    if task == "segmentation":
        found += [n for n in names if n not in found and samples.kinds.get(n) not in skip
                  and not samples.captures[n].is_floating_point() and not is_label_name(n)
                  and samples.captures[n].ndim >= 3]
    if not found and task in ("classification", "segmentation"):
        found = [n for n in ("output", "output.0") if n in samples.captures][:1]
        if not found:
            raise AnalysisError(f"--task {task}: no capture named like logits/probs and no "
                                f"'output'; captures are {names}")
    return found


def _pick_labels(samples: Samples, labels: str | None) -> str | None:
    if labels is not None:
        if labels not in samples.captures:
            raise AnalysisError(f"no labels capture {labels!r}")
        return labels
    found = [n for n in samples.captures if is_label_name(n)]
    return found[0] if found else None


def _label_values(samples: Samples, refs: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name in refs:
        return refs[name]
    x = samples.captures[name]
    if not torch.equal(x, x[:1].expand_as(x)):
        log.warning("labels %r differ between realizations; using realization 0", name)
    return x[0]


def analyze(samples: Samples, *, task: str | None = None, method: str = "cnh", basis: int = 10,
            error: str = "relative", against: str = "reference", probability: float = 0.95,
            confidence: float = 0.95, scores: list[str] | None = None,
            labels: str | None = None, precision_bits: int | None = None,
            path: str | None = None) -> dict[str, Any]:
    """Analyse realizations: moments, significant digits, decisions, layers, training.

    ``task``: None/"auto" (classification when a capture name contains logits/probs),
    "classification", "segmentation", "none". ``against``: "reference" (IEEE; the sample
    mean for captures without one, noted) or "mean". ``scores``/``labels`` override the
    capture-name conventions. ``basis``: significant digits in decimal digits (10, the
    default) or bits (2). Returns an :class:`AnalysisResult`: a JSON-able dict (keys in
    the module docstring) that renders as an HTML report in a notebook.
    """
    task = task or "auto"
    if task not in TASKS:
        raise AnalysisError(f"task must be one of {TASKS}, not {task!r}")
    if against not in ("reference", "mean"):
        raise AnalysisError(f"against must be 'reference' or 'mean', not {against!r}")
    _check(method, basis, error, probability, confidence)
    R = samples.n
    if R < 2:
        raise AnalysisError(f"need at least 2 realizations, the run has {R}")
    mt = minimum_trials(probability, confidence)
    notes: list[str] = []
    if R < mt:
        notes.append(f"{R} realizations: the General method needs at least {mt} for "
                     f"p={probability}, confidence={confidence}")
    if against == "reference" and not samples.reference:
        notes.append("no IEEE reference stored: digits are against the sample mean")
    result: dict[str, Any] = AnalysisResult({
        "schema": SCHEMA,
        "run": {"path": path, "config": samples.config, "n": R, "seeds": list(samples.seeds),
                "failed": len(samples.failed), "has_reference": bool(samples.reference),
                "escapes": dict(getattr(samples, "escapes", None) or {})},
        "settings": {"method": method, "basis": basis, "error": error, "against": against,
                     "probability": probability, "confidence": confidence,
                     "minimum_trials": mt, "enough_trials": R >= mt, "task": task},
        "captures": {}, "layers": [], "series": [], "weights": [],
        "classification": {}, "segmentation": {}, "notes": notes,
    })
    # IEEE references that fit their capture; the others are ignored everywhere (noted)
    refs: dict[str, torch.Tensor] = {}
    for name, ref_t in samples.reference.items():
        x = samples.captures.get(name)
        if x is not None and tuple(ref_t.shape) != tuple(x.shape[1:]):
            notes.append(f"{name}: reference shape {tuple(ref_t.shape)} differs from the "
                         f"realizations' {tuple(x.shape[1:])}; ignored")
        elif x is not None:
            refs[name] = ref_t
    sds: dict[str, SigDigits] = {}
    for name, x in samples.captures.items():
        ref_t = refs.get(name)
        xa = to_numpy(x).astype(np.float64)
        ref = to_numpy(ref_t).astype(np.float64) if ref_t is not None else None
        entry: dict[str, Any] = {
            "kind": samples.kinds.get(name, "api"), "dtype": str(x.dtype).replace("torch.", ""),
            "shape": list(x.shape[1:]), "numel": int(x[0].numel()),
        }
        if x[0].numel() == 0:
            entry.update(dict.fromkeys(("mean", "mean_abs", "std", "std_max", "sem", "rel_std",
                                        "reference", "max_abs_dev_ref")), varying_elements=0)
        else:
            entry.update(_moments(xa, ref))
        use_ref = against == "reference" and ref_t is not None
        entry["against"] = "reference" if use_ref else "mean"
        if x.is_floating_point() and x[0].numel() > 0:
            cap = _cap_for(x, samples.config, precision_bits)
            if entry["kind"] == "stdout" and precision_bits is None:
                # printed numbers hold only the digits printed: cap at those
                cap = min(cap, printed_precision_bits(ref if ref is not None else xa))
            sd = significant_digits(x, ref_t if use_ref else "mean", method=method, basis=basis,
                                    error=error, probability=probability, confidence=confidence,
                                    precision_bits=cap)
            if name.split("@")[0].startswith(WEIGHT_PREFIXES):
                sds[name] = sd  # per-element digits kept only where the weights table needs them
            entry["digits"] = summarize_digits(sd)
        else:
            entry["digits"] = None
        result["captures"][name] = entry

    if against == "reference" and samples.reference:
        noref = [n for n, e in result["captures"].items()
                 if e["digits"] is not None and e["against"] == "mean"]
        if noref:
            notes.append(f"{len(noref)} capture(s) without an IEEE reference, digits against "
                         f"the sample mean: {', '.join(noref[:10])}{' …' if len(noref) > 10 else ''}")
    if samples.failed:
        notes.append(f"{len(samples.failed)} realization(s) failed and are left out: indices "
                     f"{[f.get('index') for f in samples.failed]}")
    _presence_and_iterations(samples, result)

    # layers, in network order (manifest order)
    for name, e in result["captures"].items():
        if e["kind"] != "layer" or e["digits"] is None:
            continue
        m = LAYER_RE.match(name)
        d = e["digits"]
        result["layers"].append({
            "name": name, "path": m["path"] if m else name,
            "call": int(m["call"]) if m and m["call"] else 0, "numel": e["numel"],
            "std": e["std"], "digits_median": d["median"], "digits_min": d["min"],
            "digits_mean": d["mean"], "digits_p05": d["p05"],
            "digits_median_varying": d["median_varying"],
            "no_variation_share": d["no_variation_share"],
            "all_no_variation": d["all_no_variation"], "cap": d["cap"]})

    # series (e.g. a loss per step): band across realizations per step
    for base, names in samples.series().items():
        vals = np.stack([to_numpy(samples.captures[n]).astype(np.float64).reshape(R, -1).mean(axis=1)
                         for n in names], axis=1)  # (R, steps)
        sref = [refs.get(n) for n in names]
        result["series"].append({
            "name": base, "steps": [int(SERIES_RE.match(n)["step"]) for n in names],
            "captures": names, "scalar": all(samples.captures[n][0].numel() == 1 for n in names),
            "mean": [gnum(v) for v in vals.mean(axis=0)],
            "std": [gnum(v) for v in centred_moments(vals)[1]],
            "min": [gnum(v) for v in vals.min(axis=0)],
            "max": [gnum(v) for v in vals.max(axis=0)],
            "reference": ([gnum(to_numpy(r).astype(np.float64).mean()) for r in sref]
                          if all(r is not None for r in sref) else None),
            "digits_median": [(result["captures"][n]["digits"] or {}).get("median") for n in names],
        })

    # final weights per layer: captures weights.<param path> (last step if a series)
    final: dict[str, tuple[int, str]] = {}
    for name in samples.captures:
        m = SERIES_RE.match(name)
        base, step = (m["base"], int(m["step"])) if m else (name, -1)
        if base.startswith(WEIGHT_PREFIXES) and name in sds:
            if base not in final or step > final[base][0]:
                final[base] = (step, name)
    layers_w: dict[str, list[str]] = {}
    for base, (_, name) in final.items():
        param = base.split(".", 1)[1]
        layer = param.rsplit(".", 1)[0] if "." in param else param
        layers_w.setdefault(layer, []).append(name)
    for layer, names in layers_w.items():
        d = np.concatenate([sds[n].digits.reshape(-1) for n in names])
        xs = [to_numpy(samples.captures[n]).astype(np.float64).reshape(R, -1) for n in names]
        flat = np.concatenate(xs, axis=1)
        mean_w, std = centred_moments(flat)
        mabs = np.abs(mean_w)
        result["weights"].append({
            "layer": layer, "tensors": names, "numel": int(flat.shape[1]),
            "std": gnum(std.mean()),
            "rel_std": gnum(std.mean() / mabs.mean()) if mabs.mean() > 0 else None,
            "digits_median": fnum(np.median(d)), "digits_min": fnum(d.min())})

    # decisions
    if task in ("auto", "classification"):
        lab = _pick_labels(samples, labels)
        for name in _pick_scores(samples, "classification" if task == "classification" else "auto",
                                 scores):
            x = samples.captures[name]
            if not x.is_floating_point():
                continue
            lv = _label_values(samples, refs, lab) if lab else None
            ref_s = refs.get(name)
            try:
                c = classify(x, ref_s, lv, name=name)
            except AnalysisError as exc:
                if lv is None or labels is not None:  # the user named the labels: an error
                    raise
                notes.append(f"{name}: labels {lab!r} not used ({exc})")
                c, lab_used = classify(x, ref_s, None, name=name), None
            else:
                lab_used = lab
            c["labels"] = lab_used
            result["classification"][name] = c
        if lab is None and result["classification"]:
            notes.append("no 'labels'/'targets' capture: accuracy not computed")
    if task == "segmentation":
        for name in _pick_scores(samples, "segmentation", scores):
            maps = label_maps(samples.captures[name], name)
            ref = refs.get(name)
            refmap = label_maps(ref, name, per_realization=False) if ref is not None else None
            result["segmentation"][name] = segment(maps, refmap)
    for name, c in result["classification"].items():
        if c["decision_never_flips_while_scores_vary"]:
            notes.append(f"{name}: the decision never flips while the scores vary "
                         f"(score std up to {c['score_std_max']:.3g})")
    return result


def _presence_and_iterations(samples: Samples, result: dict[str, Any]) -> None:
    """Captures not present in every realization (``presence``), the number of module
    calls and series steps per realization (``iterations``), what the capture limit
    dropped (``dropped``); a note for each."""
    notes = result["notes"]
    partial = getattr(samples, "partial", None) or {}
    result["presence"] = [{"name": n, **p} for n, p in partial.items()]
    if partial:
        shown = ", ".join(f"{n} (present in {p['present']} of {p['of']}"
                          + (", shapes differ" if len(p["shapes"]) > 1 else "") + ")"
                          for n, p in list(partial.items())[:6])
        notes.append(f"{len(partial)} capture(s) not in every realization with one shape are "
                     f"not analysed: {shown}{' …' if len(partial) > 6 else ''}; the "
                     f"{len(samples.captures)} present in all are")
    counts = list(getattr(samples, "counts", None) or [])
    ref = getattr(samples, "reference_counts", None)
    it: dict[str, Any] = {"modules": [c["modules"] for c in counts],
                          "reference_modules": None if ref is None else ref["modules"],
                          "series": {}, "varies": False}
    bases = sorted({b for c in counts for b in c["series"]})
    for b in bases:
        it["series"][b] = {"steps": [c["series"].get(b, 0) for c in counts],
                           "reference": None if ref is None else ref["series"].get(b, 0)}
    for what, vals, rv in [("top-level module calls", it["modules"], it["reference_modules"])] + [
            (f"steps of series {b!r}", v["steps"], v["reference"]) for b, v in it["series"].items()]:
        if len(set(vals)) > 1 or (rv is not None and vals and any(v != rv for v in vals)):
            it["varies"] = True
            notes.append(f"finding: the number of {what} varies under rounding: "
                         f"{', '.join(map(str, vals))}"
                         + ("" if rv is None else f" (IEEE reference {rv})")
                         + f"; min {min(vals)}, max {max(vals)} over {len(vals)} realizations")
    result["iterations"] = it
    dropped = list(getattr(samples, "dropped", None) or [])
    result["dropped"] = dropped
    if dropped:
        calls = sum(d["calls"] for r in dropped for k, d in r.items() if k != "index")
        notes.append(f"the capture limit dropped {calls} capture call(s) in {len(dropped)} "
                     f"realization(s) (first: "
                     f"{next(d['first'] for k, d in dropped[0].items() if k != 'index')}); "
                     f"raise it with numvar run --capture-limit")


def median_output_digits(samples: Samples, names: list[str] | None = None, **kw) -> float:
    """Median significant digits over the elements of the output captures.

    ``names`` defaults to ``output`` and ``output.*`` (else every api capture); ``kw`` go to
    :func:`significant_digits` (method, basis, error, ...). Against the IEEE reference when
    stored, else the sample mean.
    """
    if names is None:
        names = [n for n in samples.captures if n == "output" or n.startswith("output.")]
        names = names or [n for n in samples.captures if samples.kinds.get(n) == "api"]
    ds = []
    for n in names:
        x = samples.captures[n]
        if not x.is_floating_point():
            continue
        ref = samples.reference.get(n)
        ds.append(significant_digits(x, ref if ref is not None else "mean", **kw).digits.reshape(-1))
    if not ds:
        raise AnalysisError("no floating-point output capture to measure")
    return float(np.median(np.concatenate(ds)))


def compare(a: dict, b: dict) -> dict:
    """Side-by-side digits of two :func:`analyze` results (captures, layers, decisions).

    Keys: ``runs`` [path a, path b], ``settings`` [a, b], ``captures`` [{name, a, b,
    delta_median}], ``layers`` [{name, a, b, a_varying, b_varying, cap}] (median digits
    of all elements, and of the elements that vary), ``classification`` [{name, a, b}],
    ``only_a``, ``only_b``, ``shape_differs`` (same name, other shape: not compared),
    ``program_differs`` (the two scripts or functions, when they differ); each side holds
    digits_median, digits_min, std (or flip_rate,
    agreement_with_ieee for decisions). ``delta_median`` = b − a.
    """
    def side(e):
        if e is None:
            return None
        d = e.get("digits") or {}
        return {"digits_median": d.get("median"), "digits_min": d.get("min"), "std": e.get("std"),
                "no_variation": d.get("all_no_variation")}

    ca, cb = a["captures"], b["captures"]
    differs = [n for n in ca if n in cb and ca[n].get("shape") != cb[n].get("shape")]
    names = [n for n in ca if n in cb and n not in differs]
    caps = []
    for n in names:
        sa, sb = side(ca[n]), side(cb[n])
        dm = (None if sa["digits_median"] is None or sb["digits_median"] is None
              else fnum(sb["digits_median"] - sa["digits_median"]))
        caps.append({"name": n, "kind": ca[n]["kind"], "a": sa, "b": sb, "delta_median": dm})
    la = {x["name"]: x for x in a["layers"]}
    lb = {x["name"]: x for x in b["layers"]}
    layers = [{"name": n, "a": la[n]["digits_median"], "b": lb[n]["digits_median"],
               "a_varying": la[n].get("digits_median_varying"),
               "b_varying": lb[n].get("digits_median_varying"),
               "cap": la[n].get("cap")} for n in la if n in lb]
    cls = []
    for n, x in a["classification"].items():
        y = b["classification"].get(n)
        if y is not None:
            cls.append({"name": n,
                        "a": {"flip_rate": x["flip_rate"], "agreement_with_ieee": x["agreement_with_ieee"]},
                        "b": {"flip_rate": y["flip_rate"], "agreement_with_ieee": y["agreement_with_ieee"]}})
    return CompareResult({"schema": "numvar.compare/1", "runs": [a["run"]["path"], b["run"]["path"]],
            "configs": [a["run"]["config"], b["run"]["config"]],
            "settings": [a["settings"], b["settings"]], "captures": caps, "layers": layers,
            "classification": cls, "only_a": [n for n in ca if n not in cb],
            "only_b": [n for n in cb if n not in ca],
            "shape_differs": [{"name": n, "a": ca[n].get("shape"), "b": cb[n].get("shape")}
                              for n in differs],
            "program_differs": program_difference(a["run"]["config"], b["run"]["config"])})


def program_difference(a: dict, b: dict) -> str | None:
    """How the programs behind two runs' configs differ (script and arguments, or
    function), or None when they ran the same one."""
    def program(c: dict) -> str:
        if c.get("argv"):
            return "script " + " ".join(map(str, c["argv"]))
        return f"function {c.get('function', '?')}"
    pa, pb = program(a or {}), program(b or {})
    return None if pa == pb else f"{pa} vs {pb}"
