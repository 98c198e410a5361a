"""Run-directory storage: manifest, atomic realizations, resume bookkeeping, loading."""

import pytest
import torch

from numvar.errors import StoreError
from numvar.runner.store import RunStore, load_run


def test_create_save_load(tmp_path):
    s = RunStore.create(tmp_path / "run", config={"mode": "sr"}, seeds=[10, 11, 12])
    s.save_reference({"y": torch.zeros(3), "loss@0": torch.tensor(1.0)})
    s.save_realization(0, {"y": torch.ones(3), "loss@0": torch.tensor(1.5)}, wall_s=0.1)
    s.mark_failed(1, exit_code=3, stderr_tail="boom")
    s.save_realization(2, {"y": 2 * torch.ones(3), "loss@0": torch.tensor(2.0)}, wall_s=0.2)
    assert RunStore.open(tmp_path / "run").pending() == [1]
    smp = load_run(tmp_path / "run")
    assert smp.indices == [0, 2] and smp.seeds == [10, 12] and smp.n == 2
    assert smp["y"].shape == (2, 3) and torch.equal(smp["y"][1], 2 * torch.ones(3))
    assert torch.equal(smp.reference["y"], torch.zeros(3))
    assert smp.kinds == {"y": "api", "loss@0": "series"}
    assert smp.series() == {"loss": ["loss@0"]}
    assert smp.failed[0]["exit_code"] == 3


def test_errors(tmp_path):
    with pytest.raises(StoreError):
        RunStore.open(tmp_path / "none")
    s = RunStore.create(tmp_path / "r", config={}, seeds=[0, 1])
    with pytest.raises(StoreError, match="already"):
        RunStore.create(tmp_path / "r", config={}, seeds=[0])
    s.save_realization(0, {"y": torch.ones(3)})
    s.save_realization(1, {"y": torch.ones(4)})
    smp = s.load()  # differing shapes: kept, described, not stacked
    assert smp.indices == [0, 1] and "y" not in smp.captures
    assert smp.partial["y"]["shapes"] == {"(3,) float32": 1, "(4,) float32": 1}
    (tmp_path / "r" / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="corrupt"):
        RunStore.open(tmp_path / "r")
