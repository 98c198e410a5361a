import pytest
import torch

from numvar import _io
from numvar._spec import load_input, load_object, parse_shape
from numvar.errors import ConfigError


def test_load_object_file_and_module(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import torch\ndef build():\n    return torch.nn.Linear(2, 3)\n")
    assert isinstance(load_object(f"{f}:build")(), torch.nn.Linear)
    assert load_object("math:sqrt")(4.0) == 2.0
    with pytest.raises(ConfigError, match="no attribute"):
        load_object(f"{f}:nope")
    with pytest.raises(ConfigError, match="no such file"):
        load_object(f"{tmp_path}/x.py:build")
    with pytest.raises(ConfigError):
        load_object("nocolon")


def test_shapes_and_inputs(tmp_path):
    assert parse_shape("1,1,28,28") == (1, 1, 28, 28)
    assert parse_shape("8x16") == (8, 16)
    for bad in ("a,b", "0,3", "", "2,x", "2,,3", "-1,2"):
        with pytest.raises(ConfigError):
            parse_shape(bad)
    _io.save_tensors(tmp_path / "x.safetensors", {"x": torch.ones(2)})
    assert torch.equal(load_input(tmp_path / "x.safetensors"), torch.ones(2))
    _io.save_tensors(tmp_path / "y.safetensors", {"a": torch.ones(1), "b": torch.ones(1)})
    with pytest.raises(ConfigError, match="name one"):
        load_input(tmp_path / "y.safetensors")
