"""Observer: matching by name#k, extra/missing/reordered, files, hash mode, substitution."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import numvar.determinism as nd
from numvar.determinism import ObserverContext, load_observer_run
from numvar.errors import ConfigError, NondeterminismError


def _obs_run(tmp, name, names, reference=None, scale=1.0, **kw):
    with ObserverContext(tmp, name, reference=reference, **kw) as obs:
        for n in names:
            nd.observe(n, torch.arange(3.0) * scale + len(n))
    return obs


def test_extra_missing_reordered_are_reported_as_such(tmp_path):
    _obs_run(tmp_path, "ref", ["a", "b", "a", "c"])
    ok = _obs_run(tmp_path, "ok", ["a", "b", "a", "c"], reference="ref")
    assert ok.mismatches == []
    for ref in (tmp_path / "ref.json", tmp_path / "ref"):  # a path, with or without .json
        assert _obs_run(tmp_path, "ok2", ["a", "b", "a", "c"], reference=ref).mismatches == []
    got = _obs_run(tmp_path, "run", ["b", "a", "c", "d"], reference="ref")
    kinds = sorted((m.kind, m.key) for m in got.mismatches)
    assert kinds == [("extra", "d#0"), ("missing", "a#1"), ("reordered", "a#0")]
    report = got.report()
    assert "first divergence" in report and report.index("a#0") < report.index("d#0")
    saved = json.loads((tmp_path / "run.json").read_text())
    assert sorted(m["kind"] for m in saved["mismatches"]) == ["extra", "missing", "reordered"]


def test_dump_dir_created_and_files_loadable_without_pickle(tmp_path):
    d = tmp_path / "deep" / "er"
    with ObserverContext(d, "ref") as obs:
        nd.observe("tree", {"w": torch.ones(2, dtype=torch.bfloat16), "n": 3, "t": (1.5, None)})
        nd.observe_non_deterministic("py", (random.random(), 7, "s", True))
        nd.observe_non_deterministic("wide", torch.arange(4.0).to(torch.complex128))
    assert obs.json_path == d / "ref.json" and (d / "ref.safetensors").is_file()
    assert not list(d.glob("*.tmp"))
    run = load_observer_run(d / "ref.json")
    assert [o.key for o in run.observations] == ["tree#0", "py#0", "wide#0"]
    assert run.tensors["wide#0/0"].dtype == torch.complex128  # stored raw, restored exactly
    assert torch.equal(run.tensors["wide#0/0"], torch.arange(4.0).to(torch.complex128))
    # Python leaves are substituted too, with the same structure.
    with ObserverContext(d, "ver", reference="ref") as ver:
        nd.observe("tree", {"w": torch.ones(2, dtype=torch.bfloat16), "n": 3, "t": (1.5, None)})
        val = nd.observe_non_deterministic("py", (random.random(), 7, "s", True))
        w = nd.observe_non_deterministic("wide", torch.zeros(4, dtype=torch.complex128))
    assert ver.mismatches == []
    assert val[1:] == (7, "s", True)
    assert val[0] == float.fromhex(run.observations[1].saved[0]["value"])
    assert torch.equal(w, torch.arange(4.0).to(torch.complex128))


def test_structure_change_and_verification_name_clash(tmp_path):
    with ObserverContext(tmp_path, "ref"):
        nd.observe("x", (torch.ones(2), torch.ones(2)))
        nd.observe_non_deterministic("n", torch.ones(3))
    with ObserverContext(tmp_path, "v", reference="ref") as v:
        nd.observe("x", [torch.ones(2), torch.ones(2)])
        out = nd.observe_non_deterministic("n", torch.ones(4))
    assert [(m.kind, m.key) for m in v.mismatches] == [("structure", "x#0"), ("structure", "n#0")]
    assert out.shape == (4,)  # nothing sound to substitute: value returned unchanged
    with pytest.raises(ConfigError):
        ObserverContext(tmp_path, "ref", reference="ref")


def test_raise_on_mismatch_raises_at_the_observation(tmp_path):
    _obs_run(tmp_path, "ref", ["a", "b"])
    with pytest.raises(NondeterminismError) as ei:
        _obs_run(tmp_path, "v", ["a", "b"], reference="ref", scale=2.0, raise_on_mismatch=True)
    assert ei.value.record.key == "a#0" and ei.value.record.kind == "value"
    saved = load_observer_run(tmp_path / "v.json")  # the partial run was still saved
    assert not saved.complete and not saved.is_reference
    with pytest.raises(NondeterminismError):  # missing ones raise at exit
        _obs_run(tmp_path, "v2", ["a"], reference="ref", raise_on_mismatch=True)


def test_save_values_reports_element_differences(tmp_path):
    _obs_run(tmp_path, "ref", ["a"], save_values=True)
    v = _obs_run(tmp_path, "v", ["a"], reference="ref", scale=1.5, save_values=True)
    (m,) = v.mismatches
    assert "2 element(s), max |diff| 1" in m.detail  # arange(3)*1.5 vs arange(3): 0, .5, 1


def test_non_deterministic_grad_is_substituted(tmp_path):
    def run(name, noise, reference=None):
        w = torch.ones(3, requires_grad=True)
        with ObserverContext(tmp_path, name, reference=reference) as obs:
            h = w * 2
            nd.observe_non_deterministic_grad("h", h)
            (h * noise).sum().backward()
        return obs, w.grad

    ref, g0 = run("ref", torch.tensor([1.0, 2.0, 3.0]))
    ver, g1 = run("ver", torch.tensor([5.0, 5.0, 5.0]), reference="ref")
    assert ver.mismatches == [] and ver.substituted == ["h#0"]
    assert torch.equal(g0, g1) and torch.equal(g0, torch.tensor([2.0, 4.0, 6.0]))


class _Counting(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def test_hash_mode_enable_disable_under_another_mode_and_op_divergence(tmp_path):
    def run(name, reference=None, bump=0.0):
        with ObserverContext(tmp_path, name, reference=reference) as obs:
            x = torch.ones(4)
            hm = nd.enable_hash_mode()
            y = (x * 3 + bump).exp()
            with _Counting() as counting:  # entered after the hash mode
                nd.disable_hash_mode()     # removed from below it
                assert [type(m) for m in _get_current_dispatch_mode_stack()] == [_Counting]
                z = y.sin()
                nd.enable_hash_mode()      # back on, now above _Counting
                z.cos()
                nd.disable_hash_mode()     # (a mode pushed inside a with-block must be
            assert _get_current_dispatch_mode_stack() == []  # off before the block ends)
            nd.enable_hash_mode()
            nd.observe("y", y)
            assert _get_current_dispatch_mode_stack() == [hm]
        assert _get_current_dispatch_mode_stack() == []  # the context turned it off
        return obs, hm, counting

    ref, hm, counting = run("ref")
    assert hm.sequence == ["aten.mul.Tensor", "aten.add.Tensor", "aten.exp.default",
                           "aten.cos.default"]
    assert counting.n == 2  # sin, cos; none of the observer's own hashing ops
    same, _, _ = run("same", reference="ref")
    assert same.mismatches == []
    diff, _, _ = run("diff", reference="ref", bump=1e-6)
    kinds = [(m.kind, m.key) for m in diff.sorted_mismatches()]
    assert kinds == [("value", "y#0"), ("op", "op #1")]
    op_m = diff.sorted_mismatches()[1]
    assert "aten.add.Tensor" in op_m.detail and op_m.stack[-1].function == "run"


def test_module_functions_are_no_ops_outside_a_context():
    t = torch.ones(2, requires_grad=True)
    assert nd.observe("a", t) is t and nd.observe_non_deterministic("b", t) is t
    assert nd.observe_grad("c", t) is t and nd.observe_non_deterministic_grad("d", t) is t
    assert nd.enable_hash_mode() is None and nd.current_observer() is None
    nd.disable_hash_mode()


def test_saved_values_are_clones_taken_at_observation_time(tmp_path):
    t = torch.ones(3)
    with ObserverContext(tmp_path, "ref"):
        nd.observe_non_deterministic("n", t)
        nd.observe("o", t)
        t.add_(1)  # later in-place changes do not leak into the reference
    run = load_observer_run(tmp_path / "ref.json")
    assert torch.equal(run.tensors["n#0/0"], torch.ones(3))
    with ObserverContext(tmp_path, "ver", reference="ref") as ver:
        nd.observe("o", torch.ones(3))
        got = nd.observe_non_deterministic("n", torch.zeros(3))
    assert torch.equal(got, torch.ones(3))
    assert [(m.kind, m.key) for m in ver.mismatches] == [("reordered", "n#0")]
