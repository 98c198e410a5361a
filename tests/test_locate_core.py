"""The locate algorithms on synthetic, deterministic evaluators (exact expectations)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from numvar.errors import ConfigError
from numvar.locate.core import (
    Evaluator,
    Measurement,
    _split,
    ddmin,
    ddmin_bound,
    default_threshold,
    propagation,
    rank,
    run_ddmin,
    sensitivity,
)

CAP = 24.0
R = 5


def error_model(errors: dict[str, float], gains: dict[str, float] | None = None):
    """Digits = -log2 of the root-sum-square of the perturbed candidates' errors.

    Candidates form a chain in dict order; ``gains[name]`` multiplies every error entering
    that layer from upstream (an ill-conditioned layer amplifies what it inherits). Layer
    digits are those of that layer's output; the output is the last layer's.
    """
    names = list(errors)
    gains = gains or {}

    def evaluate(subset):
        err2, layers = 0.0, {}
        for name in names:
            err2 *= gains.get(name, 1.0) ** 2
            if name in subset:
                err2 += errors[name] ** 2
            layers[name] = CAP if err2 == 0 else min(CAP, -0.5 * math.log2(err2))
        return Measurement(digits=layers[names[-1]], layers=layers, realizations=R)

    return evaluate


def test_split_chunks():
    assert _split(list("abcde"), 2) == [list("abc"), list("de")]
    assert _split(list("abcde"), 5) == [[c] for c in "abcde"]
    assert sum(_split(list(range(11)), 4), []) == list(range(11))


def test_evaluator_caches_counts_and_skips_empty():
    calls = []

    def evaluate(s):
        calls.append(s)
        return Measurement(digits=10.0, realizations=R)

    ev = Evaluator(evaluate, cap=CAP, max_evaluations=2)
    assert ev.digits(()) == CAP and calls == []          # nothing perturbed: the cap
    ev({"a"}), ev({"a"}), ev(["a"])
    assert ev.evaluations == 1 and ev.realizations == R and len(calls) == 1
    ev({"b"})
    from numvar.locate.core import BudgetExhausted
    with pytest.raises(BudgetExhausted):
        ev({"c"})
    assert ev.evaluations == 2 and ev.realizations == 2 * R


def test_sensitivity_rank_ill_conditioned_first():
    errs = {"0": 2.0**-22, "1": 2.0**-21, "2": 2.0**-10, "3": 2.0**-23}
    ev = Evaluator(error_model(errs), cap=CAP)
    d_all, rows = sensitivity(list(errs), ev)
    expected_all = -0.5 * math.log2(sum(e * e for e in errs.values()))
    assert d_all == pytest.approx(expected_all, abs=1e-12)
    by = {r.name: r for r in rows}
    assert by["2"].alone == pytest.approx(10.0) and by["2"].lost == pytest.approx(14.0)
    assert by["1"].lost == pytest.approx(3.0)
    # necessity: making "2" IEEE regains almost everything
    rest = -0.5 * math.log2(sum(e * e for k, e in errs.items() if k != "2"))
    assert by["2"].necessity == pytest.approx(rest - expected_all, abs=1e-12)
    ranked, quiet = rank(rows)
    assert [r.name for r in ranked] == ["2", "1", "0", "3"] and quiet == []
    # runs: 1 (all) + 4 alone + 4 all-but-one, R realizations each
    assert ev.evaluations == 9 and ev.realizations == 9 * R


def test_nothing_matters_gives_no_ranking_and_no_crossing():
    ev = Evaluator(error_model({"a": 0.0, "b": 0.0, "c": 0.0}), cap=CAP)
    d_all, rows = sensitivity(["a", "b", "c"], ev)
    assert d_all == CAP
    ranked, quiet = rank(rows)
    assert ranked == [] and [r.name for r in quiet] == ["a", "b", "c"]
    thr = default_threshold(d_all, CAP)
    assert thr == CAP
    assert run_ddmin(["a", "b", "c"], ev, thr) is None
    assert run_ddmin(["a", "b", "c"], ev, 20.0) is None
    with pytest.raises(ConfigError, match="above"):
        run_ddmin(["a"], ev, CAP + 1)


def test_ddmin_returns_exactly_the_culprit():
    names = [f"m{i}" for i in range(12)]
    errs = {n: 2.0**-22 for n in names}
    errs["m7"] = 2.0**-9
    ev = Evaluator(error_model(errs), cap=CAP)
    d_all, _ = sensitivity(names, ev, necessity=False)
    res = run_ddmin(names, ev, default_threshold(d_all, CAP))
    assert res is not None and res.minimal == ["m7"] and res.complete
    assert res.digits == pytest.approx(9.0)
    assert 0 < res.tests <= ddmin_bound(len(names))


def test_ddmin_finds_a_pair_that_only_fails_together():
    # two layers each losing 7 bits alone (17 digits), 16.5 together; threshold 17
    names = list("abcdefgh")
    errs = {n: 2.0**-23 for n in names}
    errs["c"] = errs["f"] = 2.0**-17
    ev = Evaluator(error_model(errs), cap=CAP)
    res = run_ddmin(names, ev, 16.9)
    assert res is not None and res.minimal == ["c", "f"]
    # 1-minimal: each single element passes
    assert ev.digits({"c"}) >= 16.9 and ev.digits({"f"}) >= 16.9


def test_ddmin_budget_stops_with_a_failing_set():
    names = [f"m{i}" for i in range(16)]
    errs = {n: 2.0**-23 for n in names}
    errs["m11"] = 2.0**-8
    ev = Evaluator(error_model(errs), cap=CAP, max_evaluations=3)
    res = run_ddmin(names, ev, 12.0)
    assert res is not None and not res.complete
    assert ev.evaluations == 3 and ev.realizations == 3 * R
    assert res.digits < 12.0 and "m11" in res.minimal


def _check_ddmin(n, fails_table):
    items = list(range(n))
    calls = 0

    def fails(s):
        nonlocal calls
        calls += 1
        return fails_table(s)

    minimal, tests, complete = ddmin(items, fails)
    assert complete and tests == calls <= ddmin_bound(n)
    assert fails_table(frozenset(minimal))
    for x in minimal:                          # 1-minimal
        if len(minimal) > 1:
            assert not fails_table(frozenset(minimal) - {x})
    return tests


def test_ddmin_tests_bounded_exhaustive_monotone():
    """Every monotone test on n <= 4 elements (failing on the full set)."""
    for n in range(1, 5):
        subsets = [frozenset(c) for r in range(n + 1) for c in itertools.combinations(range(n), r)]
        # monotone functions = up-sets, generated by antichains of minimal failing sets
        for mask in range(1, 2 ** len(subsets)):
            gens = [s for i, s in enumerate(subsets) if mask >> i & 1]
            if any(a < b for a in gens for b in gens):
                continue                        # not an antichain
            if frozenset() in gens:
                continue                        # the empty set must pass
            _check_ddmin(n, lambda s, g=gens: any(x <= s for x in g))


def test_ddmin_tests_bounded_random_nonmonotone():
    rng = random.Random(1234)
    for _ in range(300):
        n = rng.randint(2, 9)
        table: dict[frozenset, bool] = {}

        def f(s, n=n, table=table):
            if s not in table:
                table[s] = len(s) == n or (len(s) > 0 and rng.random() < 0.3)
            return table[s]

        _check_ddmin(n, f)


def test_propagation_separates_lost_from_inherited():
    # chain a -> b -> c; b amplifies its inputs' error by 2**6 and adds 2**-20 of its own
    errs = {"a": 2.0**-22, "b": 2.0**-20, "c": 0.0}
    ev = Evaluator(error_model(errs, gains={"b": 2.0**6}), cap=CAP)
    sensitivity(list(errs), ev)
    spent = ev.evaluations
    rows = {r.name: r for r in propagation(list(errs), ev)}
    assert ev.evaluations == spent                    # no extra runs
    assert rows["a"].alone == pytest.approx(22) and rows["a"].inherited == pytest.approx(0)
    b_all = -0.5 * math.log2((2.0**-16) ** 2 + (2.0**-20) ** 2)
    assert rows["b"].all == pytest.approx(b_all)
    assert rows["b"].lost_in_layer == pytest.approx(4.0)
    assert rows["b"].inherited == pytest.approx(20.0 - b_all)
    assert rows["c"].lost_in_layer == 0 and rows["c"].inherited == pytest.approx(CAP - b_all)
    for r in rows.values():
        assert r.lost_in_layer + r.inherited == pytest.approx(CAP - r.all)
