"""Capture machinery: numvar.capture, pytrees, series, collisions, module hooks, transport."""

import collections
import math
import struct

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numvar.errors import CaptureError, StoreError
import numvar.runner.collect as capture_api
from numvar.runner.collect import Collector, ModuleHooks, collecting, flatten
from numvar.runner.engine import Recorder
from numvar.runner.transport import pack, stdout_numbers, unpack


class Explodes:
    """Any use of this value fails: proves capture() never looks at it outside a run."""

    def __getattribute__(self, name):
        raise AssertionError(f"touched .{name}")


def test_capture_is_a_noop_outside_a_run():
    assert capture_api.active() is None
    assert capture_api.capture("x", Explodes()) is None
    assert capture_api.capture("bad name@", "text") is None  # not even validated


def test_pytrees_series_and_copies():
    Point = collections.namedtuple("Point", "u v")
    t = torch.arange(3.0)
    c = Collector()
    with collecting(c):
        capture_api.capture("t", t)
        t.add_(100)  # in-place change after capture must not alter the record
        capture_api.capture("tree", {"a": [1, 2.5], "b": Point(np.float32(1.5), None),
                                     "c": np.arange(4, dtype=np.int16)})
        capture_api.capture("loss", torch.tensor(1.0))
        capture_api.capture("loss", torch.tensor(2.0))
        capture_api.capture("loss", torch.tensor(3.0))
    assert capture_api.active() is None
    tensors, kinds = c.finish()
    assert list(tensors) == ["t", "tree.a.0", "tree.a.1", "tree.b.u", "tree.c",
                             "loss@0", "loss@1", "loss@2"]
    assert torch.equal(tensors["t"], torch.arange(3.0))
    assert tensors["tree.a.0"].dtype == torch.int64 and tensors["tree.a.1"].dtype == torch.float64
    assert tensors["tree.b.u"].dtype == torch.float32 and tensors["tree.b.u"].item() == 1.5
    assert tensors["tree.c"].dtype == torch.int16
    assert [tensors[f"loss@{k}"].item() for k in range(3)] == [1.0, 2.0, 3.0]
    assert kinds["t"] == "api" and kinds["loss@1"] == "series"


@pytest.mark.parametrize("value, culprit", [
    ("a string", "'x'"), ({"ok": 1.0, "bad": object()}, "'x.bad'"),
    (np.array(["a", "b"]), "'x'"), ([1.0, [2.0, {"k": "v"}]], "'x.1.1.k'"),
])
def test_non_numeric_values_are_rejected_by_name(value, culprit):
    c = Collector()
    with collecting(c), pytest.raises(CaptureError, match=f"{culprit}.*non-numeric"):
        capture_api.capture("x", value)


def test_name_collisions_and_reserved_names():
    c = Collector()
    with collecting(c):
        capture_api.capture("x", {"a": 1.0})
        capture_api.capture("x.a", 2.0)
    with pytest.raises(CaptureError, match=r"'x\.a'.*'x'.*'x\.a'"):
        c.finish()
    for bad in ("stdout", "modules/000.Net", "layers/fc#0", "files/a.npy", "loss@3"):
        with collecting(Collector()), pytest.raises(CaptureError, match="reserved"):
            capture_api.capture(bad, 1.0)
    c = Collector()
    c.add("output", 1.0)
    with pytest.raises(CaptureError, match="reserved for the function's return value"):
        c.add("output", 2.0, unique=True)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x)), x.sum()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
        self.block = Block()

    def forward(self, x, fail=False):
        h = self.features(x)
        if fail:
            raise RuntimeError("boom")
        h, s = self.block(h)
        h2, _ = self.block(h)  # called twice: layers/block.fc#0 and #1
        return {"out": h2, "sum": s, "note": "text"}


def test_module_hooks_name_top_level_calls_and_layers():
    torch.manual_seed(0)
    net, loss_fn, x = Net(), torch.nn.MSELoss(), torch.randn(2, 4)
    c = Collector()
    with torch.no_grad(), collecting(c), ModuleHooks(c, top_level=True,
                                                     layers=["features.*", "block.fc"]):
        y = net(x)
        with pytest.raises(RuntimeError, match="boom"):
            net(x, fail=True)  # a forward that raises must not confuse the bookkeeping
        loss = loss_fn(y["out"], torch.zeros_like(y["out"]))
    net(x)  # hooks removed: nothing more is captured
    tensors, kinds = c.finish()
    assert list(tensors) == [
        "layers/features.0#0", "layers/features.1#0", "layers/block.fc#0", "layers/block.fc#1",
        "modules/000.Net.out", "modules/000.Net.sum",
        "layers/features.0#1", "layers/features.1#1", "modules/001.MSELoss"]
    assert kinds["modules/001.MSELoss"] == "module" and kinds["layers/block.fc#1"] == "layer"
    assert torch.equal(tensors["modules/000.Net.out"], y["out"])
    assert torch.equal(tensors["modules/001.MSELoss"], loss)
    with torch.no_grad():
        h = net.features(x)
        fc0 = net.block.fc(h)
    assert torch.equal(tensors["layers/features.1#0"], h)
    assert torch.equal(tensors["layers/block.fc#0"], fc0)


class CountingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_capturing_is_invisible_to_dispatch_modes():
    c = Collector()
    x = torch.randn(3)
    with collecting(c), CountingMode() as mode:
        y = x * 2
        capture_api.capture("y", y)
        capture_api.capture("z", {"a": y, "b": 1.0})
    assert mode.ops == ["aten.mul.Tensor"]


def test_stdout_numbers():
    text = ("epoch 3/10 loss 1.5. acc=0.98 lr 1e-05 v1.2.3 r0001 nan -inf Info nanoseconds\n"
            "tensor([1., 2.5000e-01]) -.5 +2.0E+3")
    got = stdout_numbers(text)
    want = [1.5, 0.98, 1e-05, math.nan, -math.inf, 1.0, 0.25, -0.5, 2000.0]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == w


def test_transport_roundtrip_is_bitwise_and_ordered():
    weird = torch.tensor([-0.0, math.inf, 1e-45], dtype=torch.float32)
    nan_payload = torch.tensor([0x7FC00123], dtype=torch.int32).view(torch.float32)
    tensors = {"z": torch.arange(3), "a": torch.cat([weird, nan_payload]),
               "h": torch.ones(2, dtype=torch.bfloat16)}
    back, info = unpack(pack(tensors, {"kinds": {"z": "api", "a": "api", "h": "api"}, "k": 1}))
    assert list(back) == ["z", "a", "h"] and info["k"] == 1
    for k in tensors:
        assert back[k].dtype == tensors[k].dtype
        assert back[k].view(torch.uint8).tolist() == tensors[k].view(torch.uint8).tolist()
    with pytest.raises(StoreError, match="malformed"):
        unpack(struct.pack("<Q", 5) + b"{bad")


def test_recorder_keeps_differing_captures_and_reports_their_presence(tmp_path):
    """Realizations whose captures differ from the reference's are kept (issue 14 #3):
    the shared captures are stacked, the others described by presence and shape."""
    ok = {"y": torch.zeros(3), "stdout": torch.zeros(2, dtype=torch.float64)}
    rec = Recorder(None, seeds=[0, 1, 2, 3])
    blob = lambda t: pack(t, {"status": "ok", "kinds": {k: "api" for k in t}})  # noqa: E731
    assert rec.record(None, blob(ok))["status"] == "ok"
    assert rec.record(0, blob({"y": torch.zeros(4), "stdout": ok["stdout"]}))["status"] == "ok"
    r = rec.record(1, blob({"y": torch.zeros(3, dtype=torch.float64), "stdout": ok["stdout"]}))
    assert r["status"] == "ok"
    assert rec.record(2, blob({"y": torch.zeros(3)}))["status"] == "ok"
    assert rec.record(3, pack({}, {"status": "failed", "error": "boom"}))["status"] == "failed"
    s = rec.samples()
    assert s.indices == [0, 1, 2] and [f["index"] for f in s.failed] == [3]
    assert list(s.captures) == []  # y differs in shape or dtype, stdout is missing in r2
    assert s.partial["y"] == {"present": 3, "of": 3, "reference": True,
                              "shapes": {"(4,) float32": 1, "(3,) float64": 1, "(3,) float32": 1}}
    assert s.partial["stdout"] == {"present": 2, "of": 3, "reference": True,
                                   "shapes": {"(2,) float64": 2}}
