"""The algorithms of ``numvar locate``, independent of PyTorch.

Everything here works on *candidate names* (module paths such as ``features.3``, or op
kinds such as ``conv``) and an injected evaluator::

    evaluate(subset: frozenset[str]) -> Measurement

that perturbs exactly the candidates in ``subset`` (everything else IEEE) over R
realizations and returns the significant digits of the output (and, optionally, of each
layer's output). :class:`Evaluator` wraps it with a cache, a run counter and a budget,
so that every algorithm below reports the realizations it spent.

- :func:`sensitivity`: each candidate alone, and everything except each candidate.
- :func:`rank`: most harmful first; candidates with no measurable effect are not ranked.
- :func:`ddmin`: Zeller and Hildebrandt's minimizing delta debugging ("Simplifying and
  Isolating Failure-Inducing Input", IEEE TSE 28(2), 2002, Fig. 5), the algorithm Verrou's
  ``verrou_dd_sym`` applies to symbols, here over modules or op kinds.
- :func:`propagation`: per layer, digits with everything perturbed versus with only that
  layer perturbed: precision lost in the layer versus inherited from its inputs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class Measurement:
    """What one evaluation of a perturbed set returns.

    ``digits``: the output's significant digits (a summary over its elements, e.g. the
    median). ``layers``: candidate path -> digits of that layer's output (module mode,
    optional). ``realizations``: realizations this evaluation ran. ``elements``: optional
    per-element digits of the output (kept for the spatial view).
    """

    digits: float
    layers: dict[str, float] = field(default_factory=dict)
    realizations: int = 0
    elements: object | None = None
    extra: dict[str, object] = field(default_factory=dict)


class BudgetExhausted(Exception):
    """Internal: the evaluation budget ran out (ddmin then returns what it has)."""


class Evaluator:
    """Cache, count and bound evaluations of an injected ``evaluate(subset)``.

    The empty set is never run: with nothing perturbed every realization is the IEEE
    result, so its digits are the format's cap ``cap`` by definition. Each distinct
    non-empty subset is evaluated once (``evaluations``), and the realizations the
    evaluator reports are summed (``realizations``). ``max_evaluations`` (None: no limit)
    bounds the distinct evaluations; past it :class:`BudgetExhausted` is raised.
    ``progress(k, subset)`` is called before the k-th evaluation.
    """

    def __init__(self, evaluate: Callable[[frozenset[str]], Measurement], *, cap: float,
                 max_evaluations: int | None = None,
                 progress: Callable[[int, frozenset[str]], None] | None = None) -> None:
        self._evaluate = evaluate
        self.progress = progress
        self.cap = float(cap)
        self.max_evaluations = max_evaluations
        self.cache: dict[frozenset[str], Measurement] = {}
        self.evaluations = 0
        self.realizations = 0
        self.history: list[tuple[frozenset[str], float]] = []

    def __call__(self, subset: Iterable[str]) -> Measurement:
        key = frozenset(subset)
        if not key:
            return Measurement(digits=self.cap)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        if self.max_evaluations is not None and self.evaluations >= self.max_evaluations:
            raise BudgetExhausted(f"evaluation budget of {self.max_evaluations} spent")
        if self.progress is not None:
            self.progress(self.evaluations + 1, key)
        m = self._evaluate(key)
        self.cache[key] = m
        self.evaluations += 1
        self.realizations += int(m.realizations)
        self.history.append((key, float(m.digits)))
        log.info("evaluated %d candidate(s): %.3f digits", len(key), m.digits)
        return m

    def digits(self, subset: Iterable[str]) -> float:
        return float(self(subset).digits)


@dataclass
class Row:
    """One candidate's sensitivity.

    ``alone``: output digits when only this candidate is perturbed; ``lost`` = cap −
    alone. ``without``: output digits when every candidate but this one is perturbed;
    ``necessity`` = without − all (digits regained by keeping this one IEEE).
    """

    name: str
    alone: float
    lost: float
    without: float | None = None
    necessity: float | None = None
    order: int = 0


def sensitivity(candidates: Sequence[str], ev: Evaluator, *,
                necessity: bool = True) -> tuple[float, list[Row]]:
    """Digits of the output with all candidates perturbed, and one :class:`Row` each.

    Runs (distinct evaluations): 1 + n alone + n all-but-one (the all-but-one set of a
    single candidate is empty and costs nothing).
    """
    everything = frozenset(candidates)
    if len(everything) != len(candidates):
        raise ConfigError("duplicate candidate names")
    d_all = ev.digits(everything)
    rows = []
    for i, name in enumerate(candidates):
        alone = ev.digits({name})
        row = Row(name=name, alone=alone, lost=ev.cap - alone, order=i)
        if necessity:
            row.without = ev.digits(everything - {name})
            row.necessity = row.without - d_all
        rows.append(row)
    return d_all, rows


def rank(rows: Sequence[Row], *, tolerance: float = 0.0) -> tuple[list[Row], list[Row]]:
    """(ranked, no_effect): most harmful first.

    Order: digits lost alone (descending), then necessity (descending), then network
    order. A candidate whose ``lost`` and ``necessity`` are both ≤ ``tolerance`` has no
    measurable effect: it goes to ``no_effect`` (network order) and is not ranked, so a
    model where nothing matters gets an empty ranking rather than an arbitrary one.
    """
    def effect(r: Row) -> bool:
        return r.lost > tolerance or (r.necessity is not None and r.necessity > tolerance)

    ranked = sorted((r for r in rows if effect(r)),
                    key=lambda r: (-r.lost, -(r.necessity or 0.0), r.order))
    quiet = [r for r in rows if not effect(r)]
    return ranked, quiet


@dataclass
class DDResult:
    """Result of :func:`ddmin`.

    ``minimal``: the set found (candidate order preserved); ``complete``: False when the
    budget ran out first (then ``minimal`` still fails the test but may not be
    1-minimal); ``tests``: distinct subsets evaluated during ddmin (cache hits from
    earlier phases excluded); ``digits``: output digits of ``minimal``.
    """

    minimal: list[str]
    digits: float
    tests: int
    complete: bool = True


def ddmin_bound(n: int) -> int:
    """The test budget of ddmin on n elements: n² + 3n, the quadratic worst case of
    Zeller and Hildebrandt's ddmin. :func:`numvar.locate.api.run_locate` enforces it as
    a budget (so the documented cost bound holds unconditionally); the exhaustive and
    randomized tests of this module never reach it (at most 0.63 of it, n ≤ 9)."""
    return n * n + 3 * n


def _split(items: list[str], k: int) -> list[list[str]]:
    """k nearly equal consecutive chunks (sizes differ by at most one)."""
    q, r = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        size = q + (1 if i < r else 0)
        out.append(items[start:start + size])
        start += size
    return [c for c in out if c]


def ddmin(candidates: Sequence[str], fails: Callable[[frozenset[str]], bool],
          *, counter: Callable[[], int] | None = None) -> tuple[list[str], int, bool]:
    """Zeller's ddmin: a 1-minimal failing subset of ``candidates``.

    ``fails(S)`` must be True for the full set (checked by the caller). Returns
    (minimal, tests, complete) where ``tests`` counts calls to ``fails`` (or the
    ``counter`` difference, for cached evaluators) and ``complete`` is False when
    :class:`BudgetExhausted` stopped the search. 1-minimal: removing any single element
    of the result makes the test pass (for the evaluations actually made).
    """
    calls = 0

    def test(s: Sequence[str]) -> bool:
        nonlocal calls
        calls += 1
        return fails(frozenset(s))

    start = counter() if counter else 0
    current = list(candidates)
    k = 2
    complete = True
    try:
        while len(current) >= 2:
            chunks = _split(current, min(k, len(current)))
            k = len(chunks)
            reduced = False
            for c in chunks:                       # reduce to subset
                if test(c):
                    current, k, reduced = c, 2, True
                    break
            if not reduced and k > 2:              # reduce to complement
                for c in chunks:
                    comp = [x for x in current if x not in set(c)]
                    if test(comp):
                        current, k, reduced = comp, max(k - 1, 2), True
                        break
            if reduced:
                continue
            if k >= len(current):
                break
            k = min(2 * k, len(current))           # increase granularity
    except BudgetExhausted:
        complete = False
    tests = (counter() - start) if counter else calls
    return current, tests, complete


def run_ddmin(candidates: Sequence[str], ev: Evaluator, threshold: float) -> DDResult | None:
    """ddmin over ``candidates`` with the test "output digits < threshold".

    Returns None when the full set does not fail (nothing crosses the threshold).
    Raises ConfigError when the threshold is above the cap (the unperturbed model would
    already fail it).
    """
    if threshold > ev.cap:
        raise ConfigError(f"threshold {threshold:g} is above the format's precision "
                          f"({ev.cap:g} digits): even the IEEE result would fail it")

    def fails(s: frozenset[str]) -> bool:
        return ev.digits(s) < threshold

    if not candidates or not fails(frozenset(candidates)):
        return None
    minimal, tests, complete = ddmin(candidates, fails, counter=lambda: ev.evaluations)
    return DDResult(minimal=minimal, digits=ev.digits(minimal), tests=tests,
                    complete=complete)


@dataclass
class LayerRow:
    """Error-propagation view of one layer (digits of the layer's own output).

    ``all``: with every candidate perturbed; ``alone``: with only this layer perturbed.
    ``lost_in_layer`` = cap − alone (precision this layer's arithmetic loses on exact
    inputs); ``inherited`` = alone − all (precision already missing from its inputs and
    carried through). The two add up to cap − all.
    """

    name: str
    all: float
    alone: float
    lost_in_layer: float
    inherited: float


def propagation(layers: Sequence[str], ev: Evaluator) -> list[LayerRow]:
    """Per-layer digits, all perturbed vs only that layer, in network order.

    Uses the evaluations :func:`sensitivity` already made (the full set and each
    singleton), so it costs no extra runs when called after it.
    """
    full = ev(frozenset(layers))
    rows = []
    for name in layers:
        d_all = float(full.layers.get(name, ev.cap))
        d_alone = float(ev({name}).layers.get(name, ev.cap))
        rows.append(LayerRow(name=name, all=d_all, alone=d_alone,
                             lost_in_layer=ev.cap - d_alone, inherited=d_alone - d_all))
    return rows


def default_threshold(d_all: float, cap: float) -> float:
    """Halfway between the digits kept with everything perturbed and the cap.

    ddmin then looks for a minimal set that alone costs at least half of the digits the
    whole model loses. With nothing lost (d_all = cap) the threshold is the cap, which no
    set can cross.
    """
    if not math.isfinite(d_all):
        return cap
    return (d_all + cap) / 2.0
