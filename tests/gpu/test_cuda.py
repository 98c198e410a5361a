"""numvar on a CUDA device: the compiled Triton flop kernels, whole models under flop and op
granularity, and the determinism toolkit. Every result is compared bit for bit with the
same computation on the CPU (numba kernels).

Run on a machine with a CUDA GPU and ``pip install 'numvar[gpu,test]'``:
``pytest -q tests/gpu``. Without a GPU the whole module is skipped (the one legitimate
skip: there is nothing to run it on).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers

import numvar  # noqa: E402
from numvar.determinism import BitwiseEquivalenceMode, hash_tensor  # noqa: E402
from numvar.instrument import flop  # noqa: E402
from numvar.instrument import kernels as KN  # noqa: E402
from numvar.instrument import triton_kernels as TK  # noqa: E402

from _bitwise import same  # noqa: E402
from _flop_cases import MODES, PRECISIONS, bits_equal, operands, scan_input  # noqa: E402

CUDA = torch.device("cuda")
MODE_NAMES = ("ieee", "sr", "ud", "random")


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.delenv(flop.FLOP_BACKEND_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def test_backend_is_triton_on_cuda():
    assert not TK.interpreted()
    assert flop.flop_backend(CUDA) == "triton"


# ---------------------------------------------------------------- compiled kernels
@pytest.mark.parametrize("dt,t", PRECISIONS)
@pytest.mark.parametrize("mode", MODES)
def test_compiled_contract_and_scan_match_numba(dt, t, mode):
    """The compiled kernels (no FMA contraction, device float64 arithmetic) on the rows
    of every path, and a larger random product (many tiles), against numba."""
    a, b = operands(dt, 100 + mode)
    key = 0x9E3779B97F4A7C15 + 17 * mode
    got = TK.contract(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), key, mode, t)
    assert bits_equal(got.cpu().numpy(), KN.contract(a, b, key, mode, t))
    rng = np.random.default_rng(mode)
    a = rng.standard_normal((3, 70, 45)).astype(dt)
    b = rng.standard_normal((1, 45, 66)).astype(dt)
    got = TK.contract(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), 11, mode, t)
    assert bits_equal(got.cpu().numpy(), KN.contract(a, b, 11, mode, t))
    x = scan_input(dt, 200 + mode)
    for mul, cumulative in ((False, False), (False, True), (True, False), (True, True)):
        got = TK.scan(torch.from_numpy(x).cuda(), 5, mode, t, mul=mul, cumulative=cumulative)
        want = KN.scan(x, 5, mode, t, mul=mul, cumulative=cumulative)
        assert bits_equal(got.cpu().numpy(), want)


# ------------------------------------------------------------------- whole models
class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.c2 = torch.nn.Conv2d(4, 8, 3, stride=2, groups=2)
        self.fc = torch.nn.Linear(8 * 3 * 3, 5)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.relu(self.c2(x))
        return self.fc(x.flatten(1))


def _tiny_transformer():
    return torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                            dropout=0.0, batch_first=True)


def _forward(make, x, device, mode, granularity="flop", seed=3):
    torch.manual_seed(0)
    model = make().to(device)
    with numvar.fuzzy(mode=mode, granularity=granularity, seed=seed):
        y = model(x.to(device))
    return y.detach().cpu()


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_cnn_flop_cuda_equals_cpu(mode):
    x = torch.randn(2, 1, 14, 14, generator=torch.Generator().manual_seed(1))
    cpu = _forward(SmallCNN, x, "cpu", mode)
    gpu = _forward(SmallCNN, x, CUDA, mode)
    assert same(gpu, cpu)
    assert not same(cpu, _forward(SmallCNN, x, "cpu", mode, seed=4)) or mode == "ieee"


def test_transformer_flop_sr_cuda_equals_cpu():
    """Transcendentals (softmax's exp) are rounded once from the device's float64 result:
    equal to the CPU's unless a float64 ulp difference crosses a rounding threshold
    (probability about 2**-29 per element)."""
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    cpu = _forward(_tiny_transformer, x, "cpu", "sr")
    gpu = _forward(_tiny_transformer, x, CUDA, "sr")
    assert same(gpu, cpu)


def _train_step(device, seed=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 6, generator=g).to(device), torch.tensor([0, 2, 1, 2]).to(device)
    with numvar.fuzzy(mode="sr", granularity="flop", seed=seed):
        for _ in range(2):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    return [p.detach().cpu() for p in model.parameters()] + [loss.detach().cpu()]


def test_training_step_flop_sr_cuda_equals_cpu():
    for g, c in zip(_train_step(CUDA), _train_step("cpu")):
        assert same(g, c)


@pytest.mark.parametrize("mode", ["sr", "ud"])
def test_cnn_op_granularity_cuda_equals_cpu(mode):
    """op granularity: the rounding core's torch path on CUDA (float64 results of the
    device rounded once) against numba on the CPU."""
    x = torch.randn(2, 1, 14, 14, generator=torch.Generator().manual_seed(1))
    cpu = _forward(SmallCNN, x, "cpu", mode, "op")
    gpu = _forward(SmallCNN, x, CUDA, mode, "op")
    assert same(gpu, cpu)


def test_rounding_core_on_cuda():
    from numvar.rounding import Stream, add, div, round, sqrt

    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, generator=g, dtype=torch.float64) * 1e-30
    b = torch.randn(1000, generator=g, dtype=torch.float64)
    for mode in MODE_NAMES:
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            cpu = round(a / b, dtype=dtype, mode=mode, stream=Stream(1))
            gpu = round((a / b).cuda(), dtype=dtype, mode=mode, stream=Stream(1))
            assert gpu.device.type == "cuda" and same(gpu.cpu(), cpu)
        x, y = a.float() * 1e30, b.float()
        for fn in (add, div):
            cpu = fn(x, y, mode=mode, stream=Stream(2))
            assert same(fn(x.cuda(), y.cuda(), mode=mode, stream=Stream(2)).cpu(), cpu)
        cpu = sqrt(y.abs(), mode=mode, stream=Stream(3))
        assert same(sqrt(y.abs().cuda(), mode=mode, stream=Stream(3)).cpu(), cpu)


# ------------------------------------------------------------------ determinism
def test_index_add_float_atomics_caught():
    """index_add_ on CUDA accumulates with float atomics: its result depends on the
    order the atomics land, and BitwiseEquivalenceMode sees two runs differ. (Each try
    adds 2**20 random values into 8 bins; the chance that two runs agree bitwise on all
    bins is negligible, and five tries are allowed.)"""
    g = torch.Generator(device=CUDA).manual_seed(0)
    idx = torch.randint(0, 8, (1 << 20,), device=CUDA, generator=g)
    src = torch.randn(1 << 20, device=CUDA, generator=g)
    found = []
    for _ in range(5):
        with BitwiseEquivalenceMode() as m:
            torch.zeros(8, device=CUDA).index_add_(0, idx, src)
        found = m.get_mismatches()
        if found:
            break
    assert found and "index_add" in found[0].op


def test_deterministic_ops_pass_and_cuda_rng_is_restored():
    """Deterministic CUDA ops (a matmul, dropout drawing from the CUDA generator) run
    twice without mismatch, and the CUDA generator ends where a plain run leaves it."""
    torch.cuda.manual_seed(7)
    x = torch.randn(64, 64, device=CUDA)
    torch.cuda.manual_seed(7)
    plain = torch.nn.functional.dropout(x @ x, 0.5)
    after_plain = torch.cuda.get_rng_state()
    torch.cuda.manual_seed(7)
    with BitwiseEquivalenceMode() as m:
        out = torch.nn.functional.dropout(x @ x, 0.5)
    assert not m.get_mismatches(), m.report()
    assert same(out, plain)
    assert torch.equal(torch.cuda.get_rng_state(), after_plain)


def test_hash_is_device_independent():
    t = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert hash_tensor(t.cuda()) == hash_tensor(t)
    assert hash_tensor(t.cuda().t()) == hash_tensor(t.t())
