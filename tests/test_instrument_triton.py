"""The Triton flop kernels, run by Triton's interpreter on the CPU (``TRITON_INTERPRET=1``),
against the numba kernels and the pure-Python references, bit for bit.

Every mode, binary32 at its own precision and at bf16's / fp16's / a virtual precision,
binary64 at its own and a virtual precision; rows in binary32's normal range (the
integer fast path) and rows with subnormal, near-overflow, zero and infinite values (the
general algorithm, and its block-uniform branch). Tiny shapes: the interpreter runs each
block operation through numpy.
"""

import importlib
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch

torch.set_num_threads(1)
numba.set_num_threads(1)

_prev = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates the kernels
try:
    from numvar.instrument import triton_kernels as TK

    if not TK.interpreted() or type(TK._scan_kernel).__name__ != "InterpretedFunction":
        TK = importlib.reload(TK)
finally:
    if _prev is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _prev

from numvar.errors import ConfigError  # noqa: E402
from numvar.instrument import flop, fuzzy  # noqa: E402
from numvar.instrument import kernels as KN  # noqa: E402
from numvar.rounding import kernels as RK  # noqa: E402

from _bitwise import same  # noqa: E402
from _flop_cases import MODES, PRECISIONS, bits_equal, operands, scan_input  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """Triton reads TRITON_INTERPRET when it decorates the kernels and again at launch."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


#: numpy's warnings inside the interpreter (inf·0, overflow) are the IEEE cases under test
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")



@pytest.mark.parametrize("dt,t", PRECISIONS)
@pytest.mark.parametrize("mode", MODES)
def test_contract_matches_numba_and_reference(dt, t, mode):
    a, b = operands(dt, 100 + mode)
    key = 0x9E3779B97F4A7C15 + 17 * mode  # a key above 2**63: the uint64 argument path
    got = TK.contract(torch.from_numpy(a), torch.from_numpy(b), key, mode, t).numpy()
    want = KN.contract(a, b, key, mode, t)
    assert bits_equal(got, want)
    assert bits_equal(got, KN.contract_reference(a, b, key, mode, t))
    # every path was taken: finite results in the plain rows, subnormal and infinite ones
    tiny = np.finfo(dt).tiny
    assert np.isfinite(got[0, 0]).all()
    assert ((np.abs(got[0, 1]) < tiny) & (got[0, 1] != 0)).any()
    assert np.isinf(got[0, 2]).any()
    assert np.isinf(got[0, 3]).any() and np.isnan(got[0, 3]).any()  # inf·b, inf·(-0)


@pytest.mark.parametrize("dt,t", PRECISIONS)
@pytest.mark.parametrize("mode", MODES)
def test_scan_matches_numba_and_reference(dt, t, mode):
    x = scan_input(dt, 200 + mode)
    key = 12345 + mode  # a key below 2**63: the int64 argument path
    xt = torch.from_numpy(x)
    for mul, cumulative in ((False, True), (True, False)):
        got = TK.scan(xt, key, mode, t, mul=mul, cumulative=cumulative).numpy()
        want = KN.scan(x, key, mode, t, mul=mul, cumulative=cumulative)
        assert bits_equal(got, want), (mul, cumulative)
        ref = KN.scan_reference(x, key, mode, t, mul=mul, cumulative=cumulative)
        assert bits_equal(got, ref), (mul, cumulative)


def test_tiles_and_batches():
    """Several programs per output matrix, partial tiles, broadcast batches (BA = 1, BB
    dividing the batch) and K = 1: the same bits as numba's."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 19, 1)).astype(np.float32)
    b = rng.standard_normal((2, 1, 18)).astype(np.float32)
    got = TK.contract(torch.from_numpy(a), torch.from_numpy(b), 5, RK.MODE_SR, 24).numpy()
    assert bits_equal(got, KN.contract(a, b, 5, RK.MODE_SR, 24))
    x = rng.standard_normal((2, TK.BLOCK_SCAN + 3)).astype(np.float32)
    got = TK.scan(torch.from_numpy(x), 6, RK.MODE_SR, 24).numpy()
    assert bits_equal(got, KN.scan(x, 6, RK.MODE_SR, 24))


def test_bad_inputs():
    f = torch.ones(2, 2, 2)
    with pytest.raises(TypeError):
        TK.contract(f.half(), f.half(), 0, 1, 11)
    with pytest.raises(TypeError):
        TK.contract(f, f.double(), 0, 1, 24)
    with pytest.raises(ValueError):
        TK.contract(f, torch.ones(2, 3, 2), 0, 1, 24)
    with pytest.raises(ValueError):
        TK.contract(torch.ones(2, 2, 2), torch.ones(3, 2, 2), 0, 1, 24)
    with pytest.raises(ValueError):
        TK.contract(f, f, 0, 1, 25)
    with pytest.raises(ValueError):
        TK.scan(torch.ones(3), 0, 1, 24)


# ------------------------------------------------------------- backend selection (flop)
@pytest.mark.parametrize("table", [True, False])
def test_backend_variable_read_at_each_call(monkeypatch, table):
    """NUMVAR_FLOP_BACKEND as os.environ holds it at the call: set, changed and removed
    between calls, read from os.environ's table or (a Python without one) os.environ.get."""
    if not table:
        monkeypatch.setattr(flop, "_ENV_KEY", None)
    monkeypatch.delenv(flop.FLOP_BACKEND_ENV, raising=False)
    assert flop._backend_env() is None
    for v in ("numba", "triton", " Numba "):
        monkeypatch.setenv(flop.FLOP_BACKEND_ENV, v)
        assert flop._backend_env() == v
    assert flop.flop_backend(torch.device("cuda")) == "numba"
    monkeypatch.delenv(flop.FLOP_BACKEND_ENV)
    assert flop._backend_env() is None


def test_backend_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(flop.FLOP_BACKEND_ENV, raising=False)
    assert flop.flop_backend(cpu) == "numba"
    assert flop.flop_backend(cuda) == "triton"  # triton is installed here
    monkeypatch.setenv(flop.FLOP_BACKEND_ENV, "numba")
    assert flop.flop_backend(cuda) == "numba"
    monkeypatch.setenv(flop.FLOP_BACKEND_ENV, "cuda")
    with pytest.raises(ConfigError, match="NUMVAR_FLOP_BACKEND"):
        flop.flop_backend(cpu)
    monkeypatch.setenv(flop.FLOP_BACKEND_ENV, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET"):
        flop.flop_backend(cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert flop.flop_backend(cpu) == "triton"


def _count_calls(monkeypatch) -> dict:
    """Count the Triton kernel calls (so a test knows the flop path went through them)."""
    calls = {"contract": 0, "scan": 0}
    for name in calls:
        fn = getattr(TK, name)

        def counted(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(TK, name, counted)
    return calls


def _linear_step(seed: int, mode: str, dtype=torch.float32):
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3).to(dtype)
    x = torch.randn(2, 5, dtype=dtype)
    with fuzzy(mode=mode, granularity="flop", seed=seed):
        y = lin(x)
        y.square().sum().backward()
    return y.detach(), lin.weight.grad, lin.bias.grad


@pytest.mark.parametrize("mode", ["sr", "ud"])
def test_fuzzy_linear_forward_backward_same_bits(mode, monkeypatch):
    """A fuzzy Linear's output and gradients (addmm, mm, sum.dim_IntList through the
    flop kernels) with NUMVAR_FLOP_BACKEND=triton equal numba's bit for bit."""
    monkeypatch.delenv(flop.FLOP_BACKEND_ENV, raising=False)
    want = _linear_step(7, mode)
    monkeypatch.setenv(flop.FLOP_BACKEND_ENV, "triton")
    calls = _count_calls(monkeypatch)
    got = _linear_step(7, mode)
    for g, w in zip(got, want):
        assert same(g, w)
    assert calls["contract"] == 2 and calls["scan"] >= 2  # addmm, mm (grad W); sums
    assert not same(got[0], _linear_step(8, mode)[0])  # the seed matters


def _conv_step(seed: int):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 2, 3, padding=1, groups=2)
    x = torch.randn(1, 2, 3, 3, requires_grad=True)
    with fuzzy(mode="sr", granularity="flop", seed=seed):
        y = conv(x)
        y.square().sum().backward()
    return y.detach(), x.grad, conv.weight.grad, conv.bias.grad


def test_fuzzy_conv_forward_backward_same_bits(monkeypatch):
    """Grouped, padded convolution: forward (im2col product), and backward (grad_input as
    a transposed convolution, grad_weight, grad_bias) through the Triton kernels equal
    numba's bit for bit."""
    monkeypatch.delenv(flop.FLOP_BACKEND_ENV, raising=False)
    want = _conv_step(2)
    monkeypatch.setenv(flop.FLOP_BACKEND_ENV, "triton")
    calls = _count_calls(monkeypatch)
    got = _conv_step(2)
    for g, w in zip(got, want):
        assert same(g, w)
    assert calls == {"contract": 3, "scan": 2}  # fwd, grad_input, grad_weight; sums


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_dtypes_through_flop(dtype, monkeypatch):
    """bf16/fp16 operands of flop.bmm and flop.reduce (binary32 kernels at 8/11 bits, cast
    at the end) give numba's bits on the Triton backend."""
    from numvar.instrument._core import Ctx
    from numvar.rounding import Stream

    g = torch.Generator().manual_seed(1)
    a = torch.randn(1, 3, 4, generator=g).to(dtype)
    b = torch.randn(1, 4, 2, generator=g).to(dtype)

    def run():
        ctx = Ctx("sr", "flop", None, Stream(3))
        return flop.bmm(a, b, ctx), flop.reduce(a, [2], ctx), flop.scan(a, 1, ctx)

    monkeypatch.delenv(flop.FLOP_BACKEND_ENV, raising=False)
    want = run()
    monkeypatch.setenv(flop.FLOP_BACKEND_ENV, "triton")
    got = run()
    for g_, w in zip(got, want):
        assert g_.dtype == dtype and same(g_, w)


def test_cpu_only_install_runs_without_triton():
    """An install without triton (simulated: importing it fails) runs a flop forward and
    backward on CPU tensors, and numvar never loads its Triton module. (torch itself may
    import an installed triton package: torch._dynamo probes for it.)"""
    code = (
        "import importlib.abc, sys\n"
        "class NoTriton(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'triton' or name.startswith('triton.'):\n"
        "            raise ImportError('no triton on this install')\n"
        "sys.meta_path.insert(0, NoTriton())\n"
        "import torch, numvar\n"
        "lin = torch.nn.Linear(3, 2)\n"
        "with numvar.fuzzy(mode='sr', granularity='flop', seed=1):\n"
        "    lin(torch.ones(2, 3)).sum().backward()\n"
        "assert lin.weight.grad is not None\n"
        "assert 'triton' not in sys.modules\n"
        "assert 'numvar.instrument.triton_kernels' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in (flop.FLOP_BACKEND_ENV, "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["OMP_NUM_THREADS"] = env["NUMBA_NUM_THREADS"] = "1"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def test_compiles_for_a_gpu_without_fma_contraction():
    """The interpreter cannot show what the GPU compiler does; compiling for sm_90 needs no
    GPU. The SR binary32 contraction kernel compiles to PTX with no fused multiply-add
    (the error-free transformations need separately rounded products and sums) and with
    correctly rounded float64 division; the same kernel with Triton's default fp fusion
    does contain FMAs, so the check is not vacuous. The ``contraction="fma"`` variant
(``FMA``) has none either: its exact product and TwoSum need separate roundings too. (Subprocess: the kernels must be
    decorated without TRITON_INTERPRET.)"""
    code = (
        "import re, triton\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        "from numvar.instrument import triton_kernels as TK\n"
        "sig = {'a_ptr': '*fp32', 'b_ptr': '*fp32', 'out_ptr': '*fp32', 'BA': 'i32',\n"
        "       'BB': 'i32', 'M': 'i32', 'N': 'i32', 'K': 'i32', 'key': 'u64',\n"
        "       'MODE': 'constexpr', 'T': 'constexpr', 'WIDE': 'constexpr',\n"
        "       'BM': 'constexpr', 'BN': 'constexpr', 'FMA': 'constexpr'}\n"
        "for fusion, fmac in ((False, False), (True, False), (False, True)):\n"
        "    cst = {'MODE': 1, 'T': 24, 'WIDE': False, 'BM': TK.BLOCK_M, 'BN': TK.BLOCK_N,\n"
        "           'FMA': fmac}\n"
        "    k = triton.compile(ASTSource(fn=TK._contract_kernel, signature=sig,\n"
        "                                 constexprs=cst), target=GPUTarget('cuda', 90, 32),\n"
        "                       options={'enable_fp_fusion': fusion})\n"
        "    ptx = k.asm['ptx']\n"
        "    print(fusion, len(re.findall(r'\\bfma\\.', ptx)),\n"
        "          sorted(set(re.findall(r'\\bdiv\\.[a-z]+\\.f64', ptx))))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.split("\n")
    assert lines[0] == "False 0 ['div.rn.f64']", lines
    assert lines[1].startswith("True ") and int(lines[1].split()[1]) > 0, lines
    assert lines[2] == "False 0 ['div.rn.f64']", lines  # contraction="fma"


@pytest.mark.parametrize("t", [24, 8])
@pytest.mark.parametrize("mode", MODES)
def test_fma_contract_matches_numba_and_reference(t, mode):
    """contraction="fma" (binary32 carriers): Triton = numba = the exact reference."""
    a, b = operands(np.float32, 300 + mode)
    a, b = a[:, [0, 1, 2, 4]], b  # finite rows: the exact reference has no inf·0 case
    key = 0x9E3779B97F4A7C15 + 5 * mode
    got = TK.contract(torch.from_numpy(a), torch.from_numpy(b), key, mode, t,
                      "fma").numpy()
    assert bits_equal(got, KN.contract(a, b, key, mode, t, contraction="fma"))
    assert bits_equal(got, KN.contract_reference(a, b, key, mode, t, contraction="fma"))
    with pytest.raises(TypeError):
        TK.contract(torch.ones(1, 2, 2, dtype=torch.float64),
                    torch.ones(1, 2, 2, dtype=torch.float64), key, mode, 53, "fma")
