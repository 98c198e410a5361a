"""The real evaluator: perturb a set of modules or op kinds through the runner.

``ModelEvaluator(subset)`` runs R realizations of ``model(*inputs)`` with
:func:`numvar.runner.sample` (so every executor, Dask included, works), perturbing only
``subset``:

- module candidates -> ``modules=[escaped paths]`` (with ``model=``);
- op-kind candidates -> ``include=[globs of OP_KINDS[kind] ...]``;

everything else runs IEEE. Realization i uses seed ``seed + i`` for every subset (common
random numbers: the comparisons between subsets are not blurred by different draws).
The output's significant digits come from :func:`numvar.analysis.significant_digits`
against the IEEE reference (computed once, by the first evaluation), summarized by
``stat`` over every element of every floating-point output leaf.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import ConfigError, RunError
from .core import Measurement
from .discover import glob_escape

log = logging.getLogger(__name__)

STATS = ("median", "mean", "min")


def summarize(d: np.ndarray, stat: str) -> float:
    """The ``stat`` (median, mean, min) of per-element digits."""
    d = np.asarray(d, dtype=np.float64).reshape(-1)
    if d.size == 0:
        raise ConfigError("the model produced no floating-point output")
    if stat == "median":
        return float(np.median(d))
    if stat == "mean":
        return float(d.mean())
    if stat == "min":
        return float(d.min())
    raise ConfigError(f"stat must be one of {STATS}, not {stat!r}")


def _is_output(name: str) -> bool:
    return name == "output" or name.startswith("output.")


def _layer_path(name: str) -> str | None:
    """``layers/features.3#0`` (or ``layers/features.3#0.1``) -> ``features.3``."""
    if not name.startswith("layers/"):
        return None
    rest = name[len("layers/"):]
    return rest.rpartition("#")[0] if "#" in rest else rest


@dataclass
class EvalConfig:
    """How each evaluation runs (see :func:`numvar.locate.locate`)."""

    n: int = 6
    mode: str = "sr"
    granularity: str = "flop"
    precision: int | None = None
    seed: int = 0
    method: str = "cnh"
    basis: int = 2
    stat: str = "mean"
    executor: str = "local"
    jobs: int | None = None
    scheduler: str | None = None


class ModelEvaluator:
    """``evaluate(subset) -> Measurement`` for a model, its inputs and a candidate kind."""

    def __init__(self, model: torch.nn.Module, inputs: Sequence[Any], *, by: str,
                 candidates: Sequence[str], config: EvalConfig, layers: bool = False,
                 keep_full: bool = False, op_kinds=None) -> None:
        if by not in ("module", "op"):
            raise ConfigError(f"by must be 'module' or 'op', not {by!r}")
        if config.n < 2:
            raise ConfigError(f"-n must be at least 2 realizations, got {config.n}")
        if config.stat not in STATS:
            raise ConfigError(f"stat must be one of {STATS}, not {config.stat!r}")
        self.model = model
        self.inputs = tuple(inputs)
        self.by = by
        self.candidates = list(candidates)
        self.full = frozenset(self.candidates)
        self.config = config
        self.layers = layers and by == "module"
        self.keep_full = keep_full
        if op_kinds is None and by == "op":
            from ..instrument import OP_KINDS as op_kinds  # noqa: N811
        self.op_kinds = op_kinds
        self.reference: dict[str, torch.Tensor] | None = None
        self.reference_runs = 0

    # the perturbation of a subset, as fuzzy()/sample() keywords
    def fuzzy_kwargs(self, subset: frozenset[str]) -> dict[str, Any]:
        ordered = [c for c in self.candidates if c in subset]
        if self.by == "module":
            return {"modules": [glob_escape(p) for p in ordered], "model": self.model}
        globs: list[str] = []
        for k in ordered:
            globs.extend(self.op_kinds[k])
        return {"include": globs, "model": self.model}

    def __call__(self, subset: frozenset[str]) -> Measurement:
        from ..analysis import significant_digits
        from ..runner import sample

        unknown = set(subset) - self.full
        if unknown:
            raise ConfigError(f"not candidates: {sorted(unknown)}")
        cfg = self.config
        need_ref = self.reference is None
        kw = self.fuzzy_kwargs(subset)
        if self.layers:
            kw["capture_layers"] = [glob_escape(p) for p in self.candidates]
        model, inputs = self.model, self.inputs

        def forward():
            with torch.no_grad():
                return model(*inputs)

        samples = sample(forward, n=cfg.n, mode=cfg.mode, granularity=cfg.granularity,
                         precision=cfg.precision, seed=cfg.seed, jobs=cfg.jobs,
                         reference=need_ref, executor=cfg.executor, scheduler=cfg.scheduler,
                         **kw)
        if samples.failed:
            raise RunError(f"{len(samples.failed)} realization(s) failed while perturbing "
                           f"{sorted(subset)}: {samples.failed[0].get('error', '')}")
        if samples.n < 2:
            raise RunError(f"only {samples.n} realization(s) succeeded")
        if need_ref:
            if not samples.reference:
                raise RunError("the runner returned no IEEE reference")
            self.reference = dict(samples.reference)
            self.reference_runs += 1
        ref = self.reference
        outs = [k for k, v in samples.captures.items()
                if _is_output(k) and v.is_floating_point()]
        if not outs:
            raise ConfigError("the model's output holds no floating-point tensor")
        per_elem, first = [], None
        for k in outs:
            sd = significant_digits(samples.captures[k], ref[k], method=cfg.method,
                                    basis=cfg.basis)
            per_elem.append(sd.digits.reshape(-1))
            if first is None:
                first = (k, sd)
        digits = summarize(np.concatenate(per_elem), cfg.stat)
        layers: dict[str, float] = {}
        if self.layers:
            grouped: dict[str, list[np.ndarray]] = {}
            for k, v in samples.captures.items():
                path = _layer_path(k)
                if path is None or not v.is_floating_point() or k not in ref:
                    continue
                sd = significant_digits(v, ref[k], method=cfg.method, basis=cfg.basis)
                grouped.setdefault(path, []).append(sd.digits.reshape(-1))
            layers = {p: summarize(np.concatenate(v), cfg.stat) for p, v in grouped.items()}
        m = Measurement(digits=digits, layers=layers, realizations=samples.n)
        if self.keep_full and frozenset(subset) == self.full:
            k, sd = first
            m.elements = sd.digits
            m.extra = {"output": k, "samples": samples.captures[k].detach().cpu().numpy(),
                       "reference": ref[k].detach().cpu().numpy()}
        return m
