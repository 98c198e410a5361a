"""Single ops on their compiled paths against the routes those replace, in one process.

Each case is one op under ``numvar.fuzzy(mode="sr", seed=0)`` at the granularity it is
served at, with its module flags off (the route before: PyTorch's copy of the pooling
windows, the flop handlers of ``affine_grid``'s sub-ops, the decomposition of the
activations, a row-major copy of a column-major result, binary64's scalar quotients,
roots, scan steps, materialised broadcasts, variances in six tensor steps, layer, group
and instance norms and softmaxes decomposed, training batch norm and batch norm's backward
decomposed, the hard activations', sigmoid's, tanh's, layer norm's and softmax's backward decomposed, the norms of inputs of ``kernels.PARALLEL_MIN_WORK`` elements or more
decomposed, sums over leading dims through the general reduction path) and on, and natively; best of
``--repeats`` interleaved rounds of ``--calls`` calls after a warm-up, each round timed
by the thread's CPU time; ratios to native in the same run, and whether both settings
give the same bits (the tests check that too: this measures the time).

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_oneop.py [--repeats 15]
        [--only TEXT]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from numvar.instrument import (
    _core,
    activation_kernels,
    flop,
    fuzzy,
    grid_kernels,
    norm_kernels,
)
from numvar.instrument import kernels as instrument_kernels
from numvar.rounding import kernels as rounding_kernels

g = torch.Generator().manual_seed(0)
_X = torch.randn(2, 64, 32, 32, generator=g)
_Y = torch.randn(2, 16, 32, 32, generator=g)
_A = torch.randn(2, 16, 16, 16, generator=g) * 4
_THETA = torch.eye(2, 3).expand(2, 2, 3) + 0.1 * torch.randn(2, 2, 3, generator=g)
_M = torch.randn(64, 64, generator=g)
_SPD = _M @ _M.T / 64 + torch.eye(64)
_RHS = torch.randn(64, 64, generator=g).T
_D = torch.randn(256, 128, generator=g, dtype=torch.float64)
_E = torch.randn(256, 128, generator=g, dtype=torch.float64)
_B = torch.randn(128, generator=g, dtype=torch.float64)
_G = torch.randn(2, 16, 16, 16, generator=g, dtype=torch.float64)
#: running mean and variance, weight and bias of a 16-channel eval batch norm
_RUNNING = (torch.randn(16, generator=g, dtype=torch.float64),
            torch.rand(16, generator=g, dtype=torch.float64) + 0.5,
            torch.randn(16, generator=g, dtype=torch.float64),
            torch.randn(16, generator=g, dtype=torch.float64))


def _train_batch_norm(dtype: torch.dtype, backward: bool):
    """A training step of a 16-channel batch norm with running statistics on (8, 16, 8,
    8): the forward (its output), or the forward and the backward of a weighted sum with
    respect to the input, the weight and the bias (the input's gradient)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, 8, 8, generator=gen, dtype=dtype).requires_grad_(backward)
    gy = torch.randn(8, 16, 8, 8, generator=gen, dtype=dtype)
    w = torch.randn(16, generator=gen, dtype=dtype).requires_grad_(backward)
    b = torch.randn(16, generator=gen, dtype=dtype).requires_grad_(backward)
    rm, rv = torch.zeros(16, dtype=dtype), torch.ones(16, dtype=dtype)

    def step():
        if not backward:
            return F.batch_norm(x, rm, rv, w, b, True)
        with torch.enable_grad():
            return torch.autograd.grad(F.batch_norm(x, rm, rv, w, b, True), (x, w, b), gy)[0]
    return step


_TRAIN = ((norm_kernels, "BATCH_NORM_TRAIN"), (norm_kernels, "BATCH_NORM_BACKWARD"))
_AG = _A.clone().requires_grad_()
_GY = torch.randn(2, 16, 16, 16, generator=g)


def _activation_grad_of(fn, x, gy):
    """The input's gradient of ``fn`` at ``x`` (requiring grad) for the gradient ``gy``
    (forward and backward)."""
    def step():
        with torch.enable_grad():
            return torch.autograd.grad(fn(x), x, gy)[0]
    return step


def _activation_grad(fn):
    """The input's gradient of ``fn`` at _A for the gradient _GY."""
    return _activation_grad_of(fn, _AG, _GY)


_GATES = torch.rand(2, 256, generator=g)
_GATE_G = torch.randn(2, 64, generator=g)
_SUM0 = torch.randn(32, 64, generator=g)
_SM_X = (torch.randn(2, 2, 64, 64, generator=g) * 3).requires_grad_()
_SM_GY = torch.randn(2, 2, 64, 64, generator=g)
_LN_X = torch.randn(256, 128, generator=g).requires_grad_()
_LN_W = (torch.randn(128, generator=g).requires_grad_(),
         torch.randn(128, generator=g).requires_grad_())
_LN_GY = torch.randn(256, 128, generator=g)


def _layer_norm_grad():
    """The gradients of a layer norm's input, weight and bias (a transformer's)."""
    with torch.enable_grad():
        y = F.layer_norm(_LN_X, [128], *_LN_W)
        return torch.cat([t.reshape(-1) for t in torch.autograd.grad(y, (_LN_X, *_LN_W),
                                                                      _LN_GY)])


#: inputs of kernels.PARALLEL_MIN_WORK elements or more (norm_kernels.LARGE_INPUTS)
_L = torch.randn(512, 768, generator=g)
_LW = (torch.randn(768, generator=g), torch.randn(768, generator=g))
_GW = (torch.randn(64, generator=g), torch.randn(64, generator=g))
_X64 = torch.randn(8, 64, 32, 32, generator=g)

#: the binary64 paths at flop granularity (the route before: every quotient and root on the
#: rounding core's scalar path, the scans' scalar steps, broadcasts materialised, row sums
#: through a transposed copy)
_DIV64 = ((rounding_kernels, "DIV64_FAST"),)
_SUMS64 = ((instrument_kernels, "SCAN64_FAST"), (flop, "ROW_SUMS64"))
_VAR64 = ((flop, "USE_ROWVAR64"),)
_ALL64 = (*_DIV64, (rounding_kernels, "SQRT64_FAST"), *_SUMS64, (_core, "BINARY64_IN_PLACE"),
          *_VAR64, *((norm_kernels, f) for f in ("LAYER_NORM64", "SOFTMAX64", "GROUP_NORM64",
                                                  "BATCH_NORM_TRAIN64", "BATCH_NORM_EVAL64")))

#: name -> (granularity, the (module, flag) switches, the op)
CASES = {
    "avg_pool2d (2, 64, 32, 32), 2×2": ("flop", ((flop, "WINDOW_SUMS"),),
                                        lambda: F.avg_pool2d(_X, 2)),
    "adaptive_avg_pool2d (2, 16, 32, 32) → 2": ("flop", ((flop, "WINDOW_SUMS"),),
                                                lambda: F.adaptive_avg_pool2d(_Y, 2)),
    "affine_grid θ (2, 2, 3) → 32×32": (
        "flop", ((grid_kernels, "AFFINE_IN_ONE_CALL"),),
        lambda: F.affine_grid(_THETA, [2, 3, 32, 32], align_corners=False)),
    "hardswish (2, 16, 16, 16)": ("flop", ((activation_kernels, "USE_KERNEL"),),
                                  lambda: F.hardswish(_A)),
    "hardsigmoid (2, 16, 16, 16)": ("flop", ((activation_kernels, "USE_KERNEL"),),
                                    lambda: F.hardsigmoid(_A)),
    "hardswish, forward and backward (2, 16, 16, 16)": (
        "flop", ((activation_kernels, "USE_BACKWARD_KERNEL"),), _activation_grad(F.hardswish)),
    "hardsigmoid, forward and backward (2, 16, 16, 16)": (
        "flop", ((activation_kernels, "USE_BACKWARD_KERNEL"),),
        _activation_grad(F.hardsigmoid)),
    "sigmoid, forward and backward (2, 16, 16, 16)": (
        "flop", ((activation_kernels, "USE_BACKWARD_KERNEL"),), _activation_grad(torch.sigmoid)),
    "tanh, forward and backward (2, 16, 16, 16)": (
        "flop", ((activation_kernels, "USE_BACKWARD_KERNEL"),), _activation_grad(torch.tanh)),
    "sigmoid_backward of an LSTM gate, (2, 64) of (2, 256)": (
        "flop", ((activation_kernels, "USE_BACKWARD_KERNEL"),),
        lambda: torch.ops.aten.sigmoid_backward(_GATE_G, _GATES[:, 64:128])),
    "linalg.solve 64×64, 64 right-hand sides": (
        "op", ((_core, "ROUND_COLUMNS_IN_PLACE"),), lambda: torch.linalg.solve(_SPD, _RHS)),
    "float64 x / y (256, 128)": ("flop", _DIV64, lambda: _D / _E),
    "float64 sqrt (256, 128)": ("flop", ((rounding_kernels, "SQRT64_FAST"),),
                                lambda: _D.abs().sqrt()),
    "float64 x + bias (256, 128) + (128,)": ("flop", ((_core, "BINARY64_IN_PLACE"),),
                                             lambda: _D + _B),
    "float64 sum over dim 1 (256, 128)": ("flop", _SUMS64, lambda: _D.sum(1)),
    "float64 dot product, 32 768 terms": ("flop", _SUMS64,
                                          lambda: _D.view(-1).dot(_E.view(-1))),
    "float64 cumsum over dim 1 (256, 128)": ("flop", _SUMS64, lambda: _D.cumsum(1)),
    "float64 var over dim 1 (256, 128)": ("flop", _VAR64, lambda: _D.var(1)),
    "float64 softmax (256, 128)": ("flop", _ALL64, lambda: _D.softmax(1)),
    "float64 layer_norm (256, 128)": ("flop", _ALL64, lambda: F.layer_norm(_D, [128])),
    "float64 group_norm (2, 16, 16, 16), 4 groups": (
        "flop", _ALL64, lambda: F.group_norm(_G, 4, _G[0, :, 0, 0], _G[1, :, 0, 0])),
    "float64 batch_norm, eval (2, 16, 16, 16)": (
        "flop", _ALL64, lambda: F.batch_norm(_G, *_RUNNING[:2], *_RUNNING[2:], False)),
    "batch_norm, training (8, 16, 8, 8)": ("flop", _TRAIN,
                                          _train_batch_norm(torch.float32, False)),
    "batch_norm, training, forward and backward (8, 16, 8, 8)": (
        "flop", _TRAIN, _train_batch_norm(torch.float32, True)),
    "float64 batch_norm, training, forward and backward (8, 16, 8, 8)": (
        "flop", _TRAIN, _train_batch_norm(torch.float64, True)),
    "layer_norm, forward and backward (256, 128)": (
        "flop", ((norm_kernels, "LAYER_NORM_BACKWARD"),), _layer_norm_grad),
    "softmax, forward and backward (2, 2, 64, 64)": (
        "flop", ((norm_kernels, "SOFTMAX_BACKWARD"),), _activation_grad_of(
            lambda t: torch.softmax(t, -1), _SM_X, _SM_GY)),
    "sum over dim 0 (a bias's gradient), (32, 64)": (
        "flop", ((flop, "LEAN_SUMS"),), lambda: _SUM0.sum(0)),
    "layer_norm (512, 768)": ("flop", ((norm_kernels, "LARGE_INPUTS"),),
                              lambda: F.layer_norm(_L, [768], *_LW)),
    "group_norm (8, 64, 32, 32), 8 groups": ("flop", ((norm_kernels, "LARGE_INPUTS"),),
                                             lambda: F.group_norm(_X64, 8, *_GW)),
}


def measure(gran: str, switches: tuple, op, repeats: int, calls: int) -> tuple:
    """(native, off, on seconds per call; the same bits off and on)."""
    best = {"native": float("inf"), "off": float("inf"), "on": float("inf")}
    outs = {}
    try:
        for rnd in range(repeats + 1):
            for k in ("native", "off", "on"):
                for module, flag in switches:
                    setattr(module, flag, k != "off")
                with torch.no_grad():
                    if k == "native":
                        t = time.thread_time()
                        for _ in range(calls):
                            op()
                        dt = time.thread_time() - t
                    else:
                        with fuzzy(mode="sr", granularity=gran, seed=0):
                            outs[k] = op()  # (the first call records a decomposition)
                            t = time.thread_time()
                            for _ in range(calls):
                                op()
                            dt = time.thread_time() - t
                if rnd:
                    best[k] = min(best[k], dt / calls)
    finally:
        for module, flag in switches:
            setattr(module, flag, True)
    same = torch.equal(outs["off"].contiguous().reshape(-1).view(torch.uint8),
                       outs["on"].contiguous().reshape(-1).view(torch.uint8))
    return best["native"], best["off"], best["on"], same


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20, help="calls per timed round")
    ap.add_argument("--only", default="", metavar="TEXT",
                    help="only the cases whose name contains TEXT")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("| op | granularity | native µs | before µs | now µs | before ÷ native | "
          "now ÷ native | same bits |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, (gran, switches, op) in CASES.items():
        if args.only not in name:
            continue
        n, off, on, same = measure(gran, switches, op, args.repeats, args.calls)
        print(f"| {name} | {gran} | {n * 1e6:.1f} | {off * 1e6:.1f} | {on * 1e6:.1f} | "
              f"{off / n:.1f}× | {on / n:.1f}× | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
