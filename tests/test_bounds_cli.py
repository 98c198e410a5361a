"""``numvar bounds``: table, JSON, plot, inputs, run directories and clean errors."""

import json

import pytest
import torch

from numvar import _io
from numvar.cli import main

MODEL = """
import torch.nn as nn

def build():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 3 * 3, 10))

def bad():
    return nn.Sequential(nn.Linear(4, 4), nn.GELU())

def notmodel():
    return 3

def boom():
    raise RuntimeError("user code failed")
"""


def _model(tmp_path):
    f = tmp_path / "model.py"
    f.write_text(MODEL)
    return f


def test_json_and_plot(tmp_path, capsys):
    f = _model(tmp_path)
    rc = main(["bounds", f"{f}:build", "--input-shape", "2,1,8,8", "--precision", "bf16-mixed",
               "--format", "json", "--plot", str(tmp_path / "p.png")])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["precision"] == "bf16-mixed" and d["input_shape"] == [2, 1, 8, 8]
    assert d["input_bound"] == 1.0
    assert [r["kind"] for r in d["layers"]] == ["conv2d", "relu", "maxpool", "linear"]
    assert d["layers"][0]["fan_in"] == 9 and d["layers"][3]["fan_in"] == 36
    fin = d["final"]
    assert 0 < fin["measured"] <= fin["data_dependent"] <= fin["apriori"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_table_with_input_file_and_run(tmp_path, capsys):
    from numvar.runner.store import RunStore

    f = _model(tmp_path)
    x = torch.rand(1, 1, 8, 8) * 3
    _io.save_tensors(tmp_path / "x.safetensors", {"x": x})
    store = RunStore.create(tmp_path / "run", config={}, seeds=[0, 1])
    for i in range(2):
        store.save_realization(i, {"layers/0#0": torch.full((1, 4, 6, 6), float(i))})
    rc = main(["bounds", f"{f}:build", "--input", str(tmp_path / "x.safetensors"),
               "--run", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "a-priori" in out and "bound/measured" in out and "conv2d" in out
    assert "|input| <= " + f"{float(x.abs().max()):g}" in out
    assert "0.707" in out          # std of (0, 1) with ddof 1, layer "0"


def test_errors_exit_2(tmp_path, capsys):
    f = _model(tmp_path)
    assert main(["bounds", f"{f}:bad", "--input-shape", "2,4"]) == 2
    assert "cannot bound" in capsys.readouterr().err
    assert main(["bounds", f"{f}:build", "--input-shape", "1,1,8,8", "--precision", "fp16"]) == 2
    assert "precision" in capsys.readouterr().err
    assert main(["bounds", f"{f}:build"]) == 2
    assert "--input-shape" in capsys.readouterr().err
    assert main(["bounds", f"{f}:notmodel", "--input-shape", "1,4"]) == 2
    assert "not a torch.nn.Module" in capsys.readouterr().err


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    """Every user mistake is one line naming the culprit, exit status 2, no traceback."""
    f = _model(tmp_path)
    two = tmp_path / "two.safetensors"
    _io.save_tensors(two, {"x": torch.rand(1, 1, 8, 8), "y": torch.rand(1, 1, 8, 8)})
    cases = [
        ([f"{f}:boom", "--input-shape", "1,1,8,8"], "RuntimeError: user code failed"),
        ([f"{f}:build", "--input-shape", "1,1,5"], "layer '0' (Conv2d) fails on an input of "
                                                   "shape (1, 1, 5)"),
        ([f"{f}:build", "--input-shape", "1,2,8,8"], "layer '0' (Conv2d)"),
        ([f"{f}:build", "--input-shape", "1,1,8,8", "--plot", str(tmp_path)],
         f"--plot {tmp_path}: cannot write"),
        ([f"{f}:build", "--input-shape", "1,1,8,8", "--input-bound", "nan"], "--input-bound"),
        ([f"{f}:build", "--input-shape", "1,1,8,8", "--input-bound", "-1"], "--input-bound"),
        ([f"{f}:build", "--input-shape", "1,1,8,8", "--run", str(tmp_path / "none")],
         f"no run directory at {tmp_path / 'none'}"),
        ([f"{f}:build", "--input-shape", "1,1,8,8", "--run", str(f)], "no run directory"),
        ([f"{f}:build", "--input", str(f)], "corrupt tensor file"),
        ([f"{f}:build", "--input", str(two)], "holds 2 tensors"),
        ([f"{f}:build", "--input", str(two), "--input-key", "z"], "no tensor named 'z'"),
    ]
    for argv, want in cases:
        assert main(["bounds", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err, (argv, err)
        assert err.startswith("error: ") and err.count("\n") == 1, err


def test_run_of_another_model_is_left_out(tmp_path, capsys, caplog):
    """Captures whose shape does not fit the layer (beyond the batch size) are not
    reported as that layer's SR std."""
    from numvar.runner.store import RunStore

    f = _model(tmp_path)
    store = RunStore.create(tmp_path / "run", config={}, seeds=[0, 1])
    for i in range(2):
        store.save_realization(i, {"layers/0#0": torch.full((3, 4, 6, 6), float(i)),  # batch 3
                                   "layers/4#0": torch.full((3, 7), float(i)),      # not (., 10)
                                   "output": torch.full((3, 7), float(i))})
    rc = main(["bounds", f"{f}:build", "--input-shape", "1,1,8,8", "--run",
               str(tmp_path / "run"), "--format", "json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layers"][0]["sr_std"] == pytest.approx(0.5 ** 0.5)
    assert d["layers"][0]["shape"] == [1, 4, 6, 6]
    assert d["layers"][3]["sr_std"] is None and d["final"]["sr_std"] is None
    assert "capture layers/4#0 has shape (3, 7), layer 4 outputs (1, 10)" in caplog.text


def test_input_key_picks_a_tensor(tmp_path, capsys):
    f = _model(tmp_path)
    _io.save_tensors(tmp_path / "two.safetensors", {"a": torch.rand(1, 1, 8, 8),
                                                    "b": torch.full((1, 1, 8, 8), 3.0)})
    rc = main(["bounds", f"{f}:build", "--input", str(tmp_path / "two.safetensors"),
               "--input-key", "b", "--format", "json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["input_bound"] == 3.0
