"""The issue's model: conv -> relu -> dropout -> custom random autograd op -> linear,
under the Observer, HashMode and BitwiseEquivalenceMode."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from numvar.determinism import (
    BitwiseEquivalenceMode,
    HashMode,
    ObserverContext,
    hash_tensor,
    load_observer_run,
    observe,
    observe_grad,
    observe_non_deterministic,
)


class RandomScale(torch.autograd.Function):
    """Multiplies by 1 + 0.1·N(0,1) noise drawn from the global generator."""

    @staticmethod
    def forward(ctx, x):
        noise = 1 + 0.1 * torch.randn_like(x)
        ctx.save_for_backward(noise)
        return x * noise

    @staticmethod
    def backward(ctx, g):
        (noise,) = ctx.saved_tensors
        return g * noise


class Net(nn.Module):
    def __init__(self, substitute: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1234)  # weights independent of the run seed
        self.conv = nn.Conv2d(1, 4, 3)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        self.substitute = substitute

    def forward(self, x):
        observe("input", x)
        observe("conv.weight", self.conv.weight)
        c = observe("conv_output", self.conv(x))
        h = self.drop(F.relu(c))
        if self.substitute:
            h = observe_non_deterministic("dropout", h)
        h = RandomScale.apply(h)
        if self.substitute:
            h = observe_non_deterministic("random_op", h)
        return observe("output", self.fc(h.flatten(1)))


def _input(scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn(2, 1, 8, 8, generator=g) * scale


def _run(tmp, name, *, seed=0, x=None, reference=None, substitute=False, backward=False):
    model = Net(substitute)
    torch.manual_seed(seed)
    with ObserverContext(tmp, name, reference=reference) as obs:
        out = model(_input() if x is None else x)
        if backward:
            out.square().sum().backward()
    return obs, out, model


def test_observations_reproduce_bitwise_and_change_with_input(tmp_path):
    ref, out0, _ = _run(tmp_path, "ref")
    assert [o.key for o in ref.observations] == ["input#0", "conv.weight#0", "conv_output#0",
                                                 "output#0"]
    same, out1, _ = _run(tmp_path, "same", reference="ref")
    assert same.mismatches == []
    assert torch.equal(out0, out1)
    assert "bitwise identical" in same.report()
    other, _, _ = _run(tmp_path, "other", x=_input() + 1e-3, reference="ref")
    bad = {m.key: m.kind for m in other.mismatches}
    assert bad == {"input#0": "value", "conv_output#0": "value", "output#0": "value"}
    first = other.sorted_mismatches()[0]
    assert first.key == "input#0"
    # Both stacks name this test file's model code.
    assert first.stack[-1].function == "forward" and first.reference_stack[-1].function == "forward"
    assert "first divergence" in other.report() and "input#0" in other.report()


def test_non_deterministic_substitution_makes_verification_match(tmp_path):
    # Without substitution, another seed changes dropout mask and noise: outputs differ.
    _run(tmp_path, "plain_ref", seed=0)
    raw, raw_out, _ = _run(tmp_path, "plain_seed1", seed=1, reference="plain_ref")
    assert [m.key for m in raw.mismatches] == ["output#0"]

    ref, out0, _ = _run(tmp_path, "ref", seed=0, substitute=True)
    assert not torch.equal(raw_out, out0)
    x = _input().requires_grad_(True)
    ver, out1, model = _run(tmp_path, "ver", seed=1, x=x, reference="ref", substitute=True,
                            backward=True)
    assert ver.mismatches == []
    assert sorted(ver.substituted) == ["dropout#0", "random_op#0"]
    assert torch.equal(out0, out1.detach())
    # Substitution keeps the autograd graph: gradients reach the input and the conv.
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert model.conv.weight.grad is not None and model.conv.weight.grad.abs().sum() > 0
    # Files: JSON + safetensors, loadable without pickle.
    run = load_observer_run(tmp_path / "ref.json")
    assert run.is_reference and set(run.tensors) == {"dropout#0/0", "random_op#0/0"}
    assert (tmp_path / "ref.safetensors").is_file()


def test_hash_mode_op_sequence_and_counts():
    model = Net()
    x = _input()
    torch.manual_seed(0)
    with HashMode() as hm:
        model(x)
    seq = hm.sequence
    assert seq == ["aten.convolution.default", "aten.relu.default", "aten.detach.default",
                   "aten.empty_like.default", "aten.bernoulli_.float", "aten.div_.Scalar",
                   "aten.mul.Tensor", "aten.randn_like.default", "aten.mul.Tensor",
                   "aten.add.Tensor", "aten.mul.Tensor", "aten.view.default", "aten.t.default",
                   "aten.addmm.default"]
    assert hm.counts == collections.Counter(seq)
    assert hm.counts["aten.mul.Tensor"] == 3
    assert [r.occurrence for r in hm.records if r.op == "aten.mul.Tensor"] == [0, 1, 2]
    assert [r.index for r in hm.records] == list(range(len(seq)))
    # empty_like is uninitialised memory: not hashed; everything else is.
    assert [r.op for r in hm.records if r.hash is None] == ["aten.empty_like.default"]
    # Same seed, same hashes; another seed changes the dropout onwards, not the conv.
    torch.manual_seed(0)
    with HashMode() as hm2:
        model(x)
    assert [r.hash for r in hm2.records] == [r.hash for r in hm.records]
    torch.manual_seed(1)
    with HashMode() as hm3:
        model(x)
    assert hm3.records[0].hash == hm.records[0].hash
    assert hm3.records[4].hash != hm.records[4].hash


def test_observe_grad_sees_gradient_and_changes_nothing(tmp_path):
    def run(name, scale=1.0, reference=None, observe_it=True):
        model = Net()
        model.drop.p = 0.0
        seen = {}
        torch.manual_seed(0)
        with ObserverContext(tmp_path, name, reference=reference) as obs:
            x = _input(scale)
            c = model.conv(x)
            if observe_it:
                observe_grad("conv_output", c)
            c.register_hook(lambda g: seen.setdefault("g", g.clone()))
            model.fc(F.relu(c).flatten(1)).square().sum().backward()
        return obs, seen["g"], model.conv.weight.grad.clone()

    obs, g, wgrad = run("ref")
    (ob,) = obs.observations
    assert ob.key == "conv_output#0" and ob.kind == "grad"
    assert ob.leaves[0]["hash"] == hash_tensor(g)
    assert ob.leaves[0]["shape"] == [2, 4, 6, 6]
    _, g_plain, wgrad_plain = run("plain", observe_it=False)
    assert torch.equal(g, g_plain) and torch.equal(wgrad, wgrad_plain)  # changes nothing
    same, _, _ = run("same", reference="ref")
    assert same.mismatches == []
    scaled, g2, _ = run("scaled", scale=2.0, reference="ref")
    assert not torch.equal(g, g2)
    assert [(m.kind, m.key) for m in scaled.mismatches] == [("value", "conv_output#0")]


def test_bitwise_mode_on_model_forward_backward_no_false_alarm():
    def step(mode):
        model = Net()
        torch.manual_seed(3)
        x = _input().requires_grad_(True)
        if mode is None:
            out = model(x)
            out.square().sum().backward()
        else:
            with mode:
                out = model(x)
                out.square().sum().backward()
        return out.detach(), x.grad, model.conv.weight.grad, torch.rand(4)

    mode = BitwiseEquivalenceMode()
    got = step(mode)
    assert mode.get_mismatches() == [], mode.report()
    assert mode.ops_checked > 20
    # Dropout and the random op drew the same numbers as a plain run; the generator
    # state after the block is the plain run's (the next torch.rand agrees).
    want = step(None)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", ["missing", "corrupt", "not_a_run", "corrupt_tensors",
                                 "missing_tensors"])
def test_missing_or_corrupt_reference_is_a_clear_error(tmp_path, bad):
    from numvar.errors import StoreError

    _run(tmp_path, "ref", substitute=True)
    ref = tmp_path / "ref.json"
    culprit = "ref"
    if bad == "missing":
        ref = culprit = tmp_path / "nothere.json"
    elif bad == "corrupt":
        ref.write_text(ref.read_text()[:50])
    elif bad == "not_a_run":
        ref = culprit = tmp_path / "x.json"
        ref.write_text('{"a": 1}')
    elif bad == "corrupt_tensors":
        st = tmp_path / "ref.safetensors"
        st.write_bytes(st.read_bytes()[:40])
        culprit = st
    else:
        (tmp_path / "ref.safetensors").unlink()
        culprit = tmp_path / "ref.safetensors"
    with pytest.raises(StoreError, match=str(culprit)):
        ObserverContext(tmp_path, "ver", reference=ref)
