"""numvar's kernels compiled before realizations start, and compile time kept apart.

numba compiles numvar's kernels on their first call and caches them on disk
(``cache=True``). On a fresh install that first call takes from tens of seconds to
minutes, and it used to land inside the first realizations, which then looked hung and
reported compile time as the script's own time. Two things here:

- :func:`warm_kernels` runs a small model that reaches the kernels an instrumented
  script typically needs (dense, convolution and depthwise layers, matmul, pointwise and
  transcendental functions, reductions, softmax, layer norm, an LSTM; forward and
  backward; float32 and float64) under the run's mode and granularity.
  ``python -m numvar.runner.warmup MODE GRANULARITY`` does it in a process of its own
  (``numvar run`` starts it, forked by the zygote when there is one, before the
  reference) and prints the seconds numba spent compiling or loading from its cache.
  A finished warm-up is remembered per installation (:func:`needed`), so later runs
  skip it; ``NUMVAR_WARMUP=1`` forces it, ``NUMVAR_WARMUP=0`` skips it.
- :class:`CompileTimer` measures the time numba spends compiling (or loading a cached
  kernel) inside a block. Realizations report it (``compile_s``); their timings
  exclude it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

#: Seconds of a cold compilation of the warm-up (numba 0.68.1, empty cache, one core of
#: an AMD EPYC Zen 4, 2026-12-08, ``NUMVAR_WARMUP=1 python -m numvar.runner.warmup sr
#: flop``): 233–245 s at flop, 65 s at op, with numba's IR copies fixed by
#: :mod:`numvar._numba_compile` (the digits demo's announced compile: 497 s without the
#: fixes, 225 s with them), then about 30 s more at flop for the narrow product kernel
#: with a bias (the demo: 275 s); what the "first run only" message announces.
COLD_ESTIMATE_S = {"flop": 270, "op": 65}


class CompileTimer:
    """``with CompileTimer() as t: ...`` then ``t.seconds``: time numba spent compiling
    kernels, or loading them from its on-disk cache, inside the block (0 without numba).

    numba's ``numba:compile`` events leave out loads from the cache (seconds per process
    for numvar's kernels), so the timer wraps ``Dispatcher.compile``, through which both
    go, for the duration of the block (outermost calls only)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._saved: Any = None

    def __enter__(self) -> "CompileTimer":
        try:
            from numba.core.dispatcher import Dispatcher
        except ImportError:  # pragma: no cover - numba is a dependency
            return self
        original = Dispatcher.compile
        depth = [0]
        timer = self

        def compile(disp: Any, sig: Any) -> Any:
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return original(disp, sig)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    timer.seconds += time.perf_counter() - t0

        self._saved = (Dispatcher, original)
        Dispatcher.compile = compile
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            cls, original = self._saved
            cls.compile = original
            self._saved = None


def warm_kernels(mode: str = "sr", granularity: str = "flop",
                 dtypes: tuple[str, ...] = ("float32", "float64")) -> float:
    """Run the warm-up model under ``fuzzy(mode, granularity)`` in each of ``dtypes``;
    returns the seconds numba spent compiling or loading kernels (near 0 once cached).
    (The test suite's warm-up, ``tests/_warmup.py``, runs the two dtypes in two processes
    side by side.)"""
    import logging

    quiet = logging.getLogger("numvar.instrument")  # its notes are about this toy model
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with CompileTimer() as timer:
            for dtype in dtypes:
                _warm_model(dtype, mode, granularity)
    finally:
        quiet.setLevel(level)
    return timer.seconds


def _warm_model(dtype_name: str, mode: str, granularity: str) -> None:
    """Forward, backward and optimizer steps (SGD, Adam) of a toy model touching the
    common op families."""
    import torch
    import torch.nn.functional as F

    from ..instrument import fuzzy

    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)

    w = rand(5, 7, grad=True)
    k = rand(3, 2, 3, 3, grad=True)
    dw = rand(2, 1, 3, 3, grad=True)  # depthwise: conv_kernels' group products
    lstm = torch.nn.LSTM(5, 4, batch_first=True).to(dtype)
    x = rand(3, 7)
    # binary32: 32 rows × 5 columns, the narrow product kernel with a linear layer's bias
    # (a classifier's last layer: the digits demo compiled them in its first realization,
    # 40 s); binary64 models keep a row (its narrow kernel is 11 s more of every first run)
    xb, bias = rand(32 if dtype == torch.float32 else 3, 7), rand(5, grad=True)
    img = rand(2, 2, 6, 6)
    opts = [torch.optim.SGD([w], lr=0.1, momentum=0.9), torch.optim.Adam([k], lr=0.01)]
    with fuzzy(mode=mode, granularity=granularity, seed=0):
        h = torch.tanh(F.linear(x, w) + 0.5) * torch.exp(-x[:, :5] / 3)
        h = F.layer_norm(h, (5,))
        out, _ = lstm(h[None])
        c = F.conv2d(F.conv2d(img, dw, padding=1, groups=2), k, padding=1)
        # (a pooling: pointwise.window_sum32; hardswish twice: a fused path runs from a
        # signature's second call)
        c = F.avg_pool2d(F.hardswish(c) + F.hardswish(c).relu(), 2)
        p = F.log_softmax(out.reshape(3, 4) @ rand(4, 6), dim=1)
        q = torch.softmax(F.linear(xb, w, bias), dim=1)
        loss = (p.mean() + c.pow(2).mean() + torch.sqrt(h.abs() + 1).sum() / h.numel()
                + F.mse_loss(h.sum(1), x[:, 0]) + F.cross_entropy(p, torch.tensor([0, 1, 2]))
                + q[:, 0].mean())
        loss.backward()
        for opt in opts:
            opt.step()


def _marker(granularity: str) -> Path | None:
    """Where a finished warm-up for this installation is remembered: a file named by a
    hash of the numvar, numba and Python versions, ``NUMBA_CACHE_DIR``, the granularity
    and the size and time of every kernel source file (a changed kernel warms again)."""
    import hashlib
    import os

    import numba

    import numvar

    pkg = Path(numvar.__file__).resolve().parent
    h = hashlib.sha256()
    h.update(f"{numvar.__version__}|{numba.__version__}|{sys.version}|"
             f"{os.environ.get('NUMBA_CACHE_DIR', '')}|{granularity}|{pkg}".encode())
    for sub in ("rounding", "instrument"):
        for f in sorted((pkg / sub).glob("*.py")):
            st = f.stat()
            h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    try:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("numvar"))
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        return None
    return base / "kernels-warm" / h.hexdigest()[:24]


def needed(granularity: str) -> bool:
    """Whether ``numvar run`` should warm up first: ``NUMVAR_WARMUP=0`` never, ``=1``
    always, unset: unless a warm-up for this installation finished before."""
    import os

    flag = os.environ.get("NUMVAR_WARMUP")
    if flag in ("0", "1"):
        return flag == "1"
    m = _marker(granularity)
    return m is None or not m.is_file()


def remember(granularity: str) -> None:
    """Record that the warm-up for ``granularity`` finished (see :func:`needed`)."""
    m = _marker(granularity)
    if m is None:
        return
    try:
        m.parent.mkdir(parents=True, exist_ok=True)
        m.write_text("ok\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mode, granularity = (argv + ["sr", "flop"])[:2]
    t0 = time.perf_counter()
    compile_s = warm_kernels(mode, granularity)
    print(json.dumps({"compile_s": compile_s, "wall_s": time.perf_counter() - t0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
