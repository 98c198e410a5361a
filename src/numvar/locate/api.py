"""``numvar.locate.locate``: which modules or op kinds cost the output its digits.

Cost, in evaluations of a perturbed set (each = ``n`` realizations through the runner,
plus one uninstrumented IEEE reference run for the whole analysis):

- the full set: 1;
- sensitivity (each candidate alone): n_c;
- necessity (all but each candidate): n_c (skipped with ``necessity=False``; 0 when
  n_c = 1);
- ddmin: at most n_c² + 3n_c further tests (ddmin's quadratic worst case, enforced as
  a budget), or ``max_dd_tests`` if smaller; sets already evaluated above are not run
  again; if the budget runs out the set returned still breaks the threshold but may not
  be minimal (``dd.complete`` is False);
- the error-propagation view reuses the full-set and singleton evaluations: 0 extra.

So ``realizations ≤ n · (1 + 2·n_c + min(n_c² + 3n_c, max_dd_tests))``, reported as
``result.bound`` next to the exact ``result.realizations`` (= n · ``result.evaluations``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..errors import ConfigError, NumvarError, RunError
from .core import (
    DDResult,
    Evaluator,
    LayerRow,
    Row,
    ddmin_bound,
    default_threshold,
    propagation,
    rank,
    run_ddmin,
    sensitivity,
)
from .discover import Candidate, discover
from .evaluate import STATS, EvalConfig, ModelEvaluator
from .spatial import SpatialMap, check_axes, save_png, spatial_map

log = logging.getLogger(__name__)

SCHEMA = 1


@dataclass
class LocateResult:
    """Everything :func:`locate` measured; ``to_dict()`` is the JSON form."""

    by: str
    config: dict[str, Any]
    cap: float
    candidates: list[Candidate]
    digits_all: float
    threshold: float
    threshold_source: str
    rows: list[Row]
    ranked: list[Row]
    no_effect: list[Row]
    dd: DDResult | None
    layers: list[LayerRow] | None
    spatial: SpatialMap | None
    evaluations: int
    realizations: int
    reference_runs: int
    bound: int
    unattributed: dict[str, int] = field(default_factory=dict)
    history: list[tuple[list[str], float]] = field(default_factory=list)
    dd_bound: int = 0

    @property
    def crosses(self) -> bool:
        """Whether perturbing every candidate breaks the threshold."""
        return self.digits_all < self.threshold

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able result; keys documented in the README ("Locating instability")."""
        def r(v):
            return None if v is None or not math.isfinite(v) else round(float(v), 6)

        cls = {c.name: c.cls for c in self.candidates}
        dd_set = set(self.dd.minimal) if self.dd else set()
        return {
            "schema": SCHEMA,
            "by": self.by,
            "config": dict(self.config),
            "cap": r(self.cap),
            "output_digits": {"ieee": r(self.cap), "all_perturbed": r(self.digits_all)},
            "threshold": {"value": r(self.threshold), "source": self.threshold_source},
            "crosses": self.crosses,
            "candidates": [c.to_dict() for c in self.candidates],
            "ranking": [
                {"rank": i + 1, "name": row.name, "class": cls[row.name],
                 "alone": r(row.alone), "lost": r(row.lost), "without": r(row.without),
                 "necessity": r(row.necessity), "in_ddmin": row.name in dd_set}
                for i, row in enumerate(self.ranked)],
            "no_effect": [{"name": row.name, "class": cls[row.name]} for row in self.no_effect],
            "ddmin": None if self.dd is None else {
                "set": list(self.dd.minimal), "digits": r(self.dd.digits),
                "tests": self.dd.tests, "complete": self.dd.complete,
                "bound": self.dd_bound},
            "propagation": None if self.layers is None else [
                {"name": lr.name, "class": cls.get(lr.name, ""), "all": r(lr.all),
                 "alone": r(lr.alone), "lost_in_layer": r(lr.lost_in_layer),
                 "inherited": r(lr.inherited)} for lr in self.layers],
            "spatial": None if self.spatial is None else self.spatial.summary(),
            "unattributed_ops": dict(self.unattributed),
            "cost": {"evaluations": self.evaluations, "realizations": self.realizations,
                     "realizations_per_evaluation": self.config.get("n"),
                     "reference_runs": self.reference_runs,
                     "bound_realizations": self.bound},
            "evaluations": [{"set": s, "digits": r(d)} for s, d in self.history],
        }

    def save_json(self, path) -> None:
        from .._io import atomic_write_json

        atomic_write_json(path, self.to_dict())

    def save_map(self, path) -> None:
        if self.spatial is None:
            raise ConfigError("no spatial view was computed (pass spatial=True / --map)")
        save_png(self.spatial, path)

    def html(self) -> str:
        from .report import html_section

        return html_section(self)


def realization_bound(n: int, n_candidates: int, *, necessity: bool = True,
                      max_dd_tests: int | None = None, ddmin: bool = True) -> int:
    """The documented bound on realizations (reference run excluded); module docstring."""
    c = n_candidates
    sens = 1 + c + (c if necessity and c > 1 else 0)
    dd = 0
    if ddmin:
        dd = ddmin_bound(c) if max_dd_tests is None else min(ddmin_bound(c), max_dd_tests)
    return n * (sens + dd)


def _cap_of(output: Any, basis: int) -> float:
    """Digits of the unperturbed output: each float leaf at its format's cap, summarized
    like the measurements (every element at the cap -> the cap)."""
    from ..analysis.digits import precision_of

    caps = []
    leaves = [output] if isinstance(output, torch.Tensor) else \
        torch.utils._pytree.tree_leaves(output)
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            caps.append(precision_of(t.dtype) * math.log(2) / math.log(basis))
    if not caps:
        raise ConfigError("the model's output holds no floating-point tensor")
    return max(caps)


def locate(model: torch.nn.Module, *inputs: Any, n: int = 6, by: str = "module",
           mode: str = "sr", granularity: str = "flop", precision: int | None = None,
           seed: int = 0, threshold: float | None = None, basis: int = 2,
           method: str = "cnh", stat: str = "mean", necessity: bool = True,
           ddmin: bool = True, layers: bool = True, spatial: bool = False,
           class_dim: int | None = None, max_dd_tests: int | None = None,
           select: Sequence[str] | None = None, executor: str = "local",
           jobs: int | None = None, scheduler: str | None = None,
           progress: Callable[[int, list[str]], None] | None = None) -> LocateResult:
    """Rank the modules (``by="module"``) or op kinds (``by="op"``) of ``model`` by the
    significant digits their perturbation alone costs ``model(*inputs)``.

    ``n`` realizations per evaluated set, in rounding ``mode`` at ``granularity``;
    ``threshold``: output digits (in ``basis``) the model must keep (default: halfway
    between the digits kept with everything perturbed and the format's cap); ddmin then
    finds a minimal set whose perturbation alone breaks it. ``layers``: the error
    propagation view (module mode). ``spatial``: per-pixel maps of the output's last two
    axes (``class_dim``: label-flip map for segmentations). ``select``: globs restricting
    the candidates. ``max_dd_tests``: cap on ddmin's extra evaluations. ``progress(k,
    names)`` is called before the k-th evaluation. The model runs in ``eval()`` mode only
    if you put it there; inputs are used as given.
    """
    if by not in ("module", "op"):
        raise ConfigError(f"--by must be 'module' or 'op', not {by!r}")
    if n < 2:
        raise ConfigError(f"-n must be at least 2 realizations, got {n}")
    if stat not in STATS:
        raise ConfigError(f"--stat must be one of {', '.join(STATS)}, not {stat!r}")
    if max_dd_tests is not None and max_dd_tests < 0:
        raise ConfigError(f"--max-dd-tests must be >= 0, got {max_dd_tests}")
    if isinstance(basis, bool) or not isinstance(basis, int) or basis < 2:
        raise ConfigError(f"--basis must be an integer >= 2, got {basis!r}")
    _check_model(model)
    try:
        found = discover(model, inputs)
    except NumvarError:
        raise
    except Exception as exc:  # the user's model on the user's input: say so in one line
        shapes = ", ".join(str(list(t.shape)) for t in inputs if isinstance(t, torch.Tensor))
        msg = (str(exc).strip().splitlines() or [""])[0]
        log.info("the model raised on its input", exc_info=True)  # `numvar -v`: traceback
        raise RunError(f"the model raised on its input (shape {shapes or '?'}) in the IEEE "
                       f"run: {type(exc).__name__}: {msg}") from exc
    if spatial and isinstance(found.output, torch.Tensor):
        check_axes(tuple(found.output.shape), class_dim)  # before any realization runs
    pool = found.modules if by == "module" else found.op_kinds
    if select:
        pool = [c for c in pool if any(fnmatch.fnmatchcase(c.name, g) for g in select)]
    if not pool:
        what = "leaf module with floating-point compute" if by == "module" else "op kind"
        raise ConfigError(f"no {what} to blame in this model"
                          + (f" matching {list(select)}" if select else "")
                          + ("; try --by op" if by == "module" else ""))
    names = [c.name for c in pool]
    cap = _cap_of(found.output, basis)
    with contextlib.ExitStack() as stack:
        if executor == "dask":  # one client for every evaluation, not one per sample()
            from ..runner.sampling import dask_client

            _pickle_user_code_by_value(model)
            scheduler = stack.enter_context(dask_client(
                scheduler, n_workers=jobs or 1, threads_per_worker=1, processes=True))
        return _locate(model, inputs, found, pool, names, cap, n=n, by=by, mode=mode,
                       granularity=granularity, precision=precision, seed=seed,
                       threshold=threshold, basis=basis, method=method, stat=stat,
                       necessity=necessity, ddmin=ddmin, layers=layers, spatial=spatial,
                       class_dim=class_dim, max_dd_tests=max_dd_tests, select=select,
                       executor=executor, jobs=jobs, scheduler=scheduler, progress=progress)


def _check_model(model: Any) -> None:
    """A module, ideally in eval mode: in training mode every realization of every
    evaluation updates batch-norm statistics and redraws dropout masks, so evaluations
    would not compare like with like."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"locate needs a torch.nn.Module, got {type(model).__name__}")
    if model.training:
        log.warning("the model is in training mode: batch-norm statistics change and "
                    "dropout masks are redrawn in every realization; call model.eval() "
                    "first unless that is what you want to measure")


def _pickle_user_code_by_value(model: torch.nn.Module) -> None:
    """Let Dask workers unpickle classes from a file loaded by ``numvar._spec``.

    ``load_object("model.py:build")`` imports the file under a private module name that
    worker processes cannot import; cloudpickle then has to ship those classes by value.
    """
    import sys

    import cloudpickle

    for mod in model.modules():
        name = type(mod).__module__
        if name.startswith("_numvar_user_") and name in sys.modules:
            cloudpickle.register_pickle_by_value(sys.modules[name])


def _locate(model, inputs, found, pool, names, cap, *, n, by, mode, granularity, precision,
            seed, threshold, basis, method, stat, necessity, ddmin, layers, spatial,
            class_dim, max_dd_tests, select, executor, jobs, scheduler, progress):
    cfg = EvalConfig(n=n, mode=mode, granularity=granularity, precision=precision,
                     seed=seed, method=method, basis=basis, stat=stat, executor=executor,
                     jobs=jobs, scheduler=scheduler)
    from ..instrument import OP_KINDS

    model_ev = ModelEvaluator(model, inputs, by=by, candidates=names, config=cfg,
                              layers=layers, keep_full=spatial,
                              op_kinds=found.kind_globs(OP_KINDS))
    config = {"n": n, "by": by, "mode": mode, "granularity": granularity,
              "precision": precision, "seed": seed, "basis": basis, "method": method,
              "stat": stat, "necessity": necessity, "ddmin": ddmin,
              "max_dd_tests": max_dd_tests, "select": list(select) if select else None,
              "executor": executor, "jobs": jobs}
    res = run_locate(pool, model_ev, cap=cap, config=config, threshold=threshold,
                     layers=layers and by == "module", spatial=spatial, class_dim=class_dim,
                     unattributed=found.unattributed if by == "module" else {},
                     progress=progress)
    res.reference_runs = model_ev.reference_runs
    return res


def run_locate(pool: Sequence[Candidate], evaluate, *, cap: float, config: dict[str, Any],
               threshold: float | None = None, layers: bool = False, spatial: bool = False,
               class_dim: int | None = None,
               unattributed: dict[str, int] | None = None,
               progress: Callable[[int, list[str]], None] | None = None) -> LocateResult:
    """The locate pipeline over any ``evaluate(subset) -> Measurement``.

    ``config`` needs ``n``, ``by``, ``necessity``, ``ddmin``, ``max_dd_tests`` (and, for
    the presentation, ``basis``, ``stat``, ``mode``, ``granularity``).
    """
    names = [c.name for c in pool]
    n = int(config["n"])
    necessity = bool(config.get("necessity", True))
    do_dd = bool(config.get("ddmin", True))
    max_dd_tests = config.get("max_dd_tests")
    order = {c: i for i, c in enumerate(names)}

    def ordered(s) -> list[str]:
        return sorted(s, key=order.__getitem__)

    if threshold is not None and float(threshold) > cap:  # before any evaluation
        raise ConfigError(f"--threshold {float(threshold):g} is above the output format's "
                          f"precision ({cap:.4g} digits in basis {config.get('basis', 2)})")
    ev = Evaluator(evaluate, cap=cap,
                   progress=None if progress is None else lambda k, s: progress(k, ordered(s)))
    d_all, rows = sensitivity(names, ev, necessity=necessity)
    ranked, quiet = rank(rows, tolerance=0.0)
    if threshold is None:
        thr, source = default_threshold(d_all, cap), "default"
    else:
        thr, source = float(threshold), "given"
    dd = None
    dd_b = 0
    if do_dd:
        dd_b = ddmin_bound(len(names)) if max_dd_tests is None else \
            min(ddmin_bound(len(names)), max_dd_tests)
        ev.max_evaluations = ev.evaluations + dd_b
        dd = run_ddmin(names, ev, thr)
        ev.max_evaluations = None
    layer_rows = propagation(names, ev) if layers else None
    smap = None
    if spatial:
        full = ev(frozenset(names))
        if full.elements is None:
            raise ConfigError("no per-element digits kept for the spatial view")
        smap = spatial_map(full.elements, cap=cap, samples=full.extra.get("samples"),
                           reference=full.extra.get("reference"), class_dim=class_dim)
    history = [(ordered(s), d) for s, d in ev.history]
    return LocateResult(
        by=config["by"], config=config, cap=cap, candidates=pool, digits_all=d_all, threshold=thr,
        threshold_source=source, rows=rows, ranked=ranked, no_effect=quiet, dd=dd,
        layers=layer_rows, spatial=smap, evaluations=ev.evaluations,
        realizations=ev.realizations, reference_runs=0,
        bound=realization_bound(n, len(names), necessity=necessity,
                                max_dd_tests=max_dd_tests, ddmin=do_dd),
        unattributed=dict(unattributed or {}), history=history, dd_bound=dd_b)
