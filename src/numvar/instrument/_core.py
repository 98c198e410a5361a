"""The rounding context shared by the handlers, and thin wrappers over numvar.rounding."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Number

import numpy as np
import torch

import numvar.rounding as R
from numvar.rounding import kernels as RK

from .kernels import _binary_fast32, _round_fast32, launch

#: (p, emin, emax) of the formats whose rounding has a numba carrier of their own dtype
_LEAN = {torch.float32: (24, -126, 127), torch.float64: (53, -1022, 1023)}

#: significand bits of each float format (the implicit bit included)
NATIVE_BITS = {torch.float32: 24, torch.float64: 53, torch.bfloat16: 8, torch.float16: 11}
FLOATS = frozenset(NATIVE_BITS)


@dataclass
class Ctx:
    """Mode, granularity, virtual precision and the random stream of one fuzzy block."""

    mode: str
    granularity: str
    precision: int | None
    stream: R.Stream
    backend: str = "auto"

    def __post_init__(self) -> None:
        self.code = RK.mode_code(self.mode)

    def prec(self, dtype: torch.dtype) -> int | None:
        """Virtual precision to pass to numvar.rounding for ``dtype`` (None: the format's own).

        A precision above the format's own is clamped to it.
        """
        p = self.precision
        if p is None or p >= NATIVE_BITS[dtype]:
            return None
        return p

    def bits(self, dtype: torch.dtype) -> int:
        """Significand bits t used by the flop kernels for ``dtype``."""
        n = NATIVE_BITS[dtype]
        return n if self.precision is None else min(n, self.precision)

    # -- elementwise roundings (one stream key per call) ---------------------------
    # CPU binary32/binary64 operands take a short path that calls the rounding core's
    # array kernel directly: the same kernel, key and bits as numvar.rounding.add & co
    # (tested bit for bit), without the tensor API's per-call overhead.
    def _lean(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return (self.backend in ("auto", "numba") and a.dtype in _LEAN
                and a.device.type == "cpu" and b.device.type == "cpu")

    def _binary(self, op: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        p, emin, emax = _LEAN[a.dtype]
        if a.shape != b.shape:
            a, b = torch.broadcast_tensors(a, b)
        key = self.stream.next_key()
        out = torch.empty(a.shape, dtype=a.dtype)
        if out.numel():
            an = a.detach().contiguous().view(-1).numpy()
            bn = b.detach().contiguous().view(-1).numpy()
            if a.dtype == torch.float32 and self.bits(a.dtype) == 24 and op != RK.OP_DIV:
                launch(an.size, _binary_fast32, op, an, bn, out.view(-1).numpy(),
                       np.uint64(key), self.code)
            else:
                launch(an.size, RK.k_binary, op, an, bn, out.view(-1).numpy(), p, emin, emax,
                       self.code, self.bits(a.dtype), np.uint64(key))
        return out

    def add(self, a, b):
        a, b = operands(a, b)
        if self._lean(a, b):
            return self._binary(RK.OP_ADD, a, b)
        return launch(max(a.numel(), b.numel()), R.add, a, b, mode=self.mode,
                      stream=self.stream, precision=self.prec(a.dtype), backend=self.backend)

    def sub(self, a, b):
        a, b = operands(a, b)
        if self._lean(a, b):
            return self._binary(RK.OP_SUB, a, b)
        return launch(max(a.numel(), b.numel()), R.sub, a, b, mode=self.mode,
                      stream=self.stream, precision=self.prec(a.dtype), backend=self.backend)

    def mul(self, a, b):
        a, b = operands(a, b)
        if self._lean(a, b):
            return self._binary(RK.OP_MUL, a, b)
        return launch(max(a.numel(), b.numel()), R.mul, a, b, mode=self.mode,
                      stream=self.stream, precision=self.prec(a.dtype), backend=self.backend)

    def div(self, a, b):
        a, b = operands(a, b)
        if self._lean(a, b):
            return self._binary(RK.OP_DIV, a, b)
        return launch(max(a.numel(), b.numel()), R.div, a, b, mode=self.mode,
                      stream=self.stream, precision=self.prec(a.dtype), backend=self.backend)

    def sqrt(self, a):
        (a,) = operands(a)
        return launch(a.numel(), R.sqrt, a, mode=self.mode, stream=self.stream,
                      precision=self.prec(a.dtype), backend=self.backend)

    def round(self, hi: torch.Tensor, dtype: torch.dtype, lo: torch.Tensor | None = None):
        """Round the exact value ``hi + lo`` (float64 tensors) to ``dtype``.

        CPU tensors without ``lo`` take a short path that calls the rounding core's array
        kernel directly (same kernel, same key, same bits as numvar.rounding.round: tested
        bit for bit); everything else goes through numvar.rounding.round.
        """
        if hi.dtype != torch.float64:
            hi = hi.to(torch.float64)
        if (lo is None and self.backend in ("auto", "numba") and hi.device.type == "cpu"
                and dtype in _LEAN):
            p, emin, emax = _LEAN[dtype]
            key = self.stream.next_key()
            out = torch.empty(hi.shape, dtype=dtype)
            if out.numel():
                h = hi.detach().contiguous().view(-1).numpy()
                if dtype == torch.float32 and self.bits(dtype) == 24:
                    launch(h.size, _round_fast32, h, out.view(-1).numpy(), np.uint64(key),
                           self.code)
                else:
                    launch(h.size, RK.k_round, h, h[:0], out.view(-1).numpy(), False, p, emin,
                           emax, self.code, self.bits(dtype), np.uint64(key))
            return out
        return launch(hi.numel(), R.round, hi, lo, dtype=dtype, mode=self.mode,
                      stream=self.stream, precision=self.prec(dtype), backend=self.backend)


def result_dtype(*xs) -> torch.dtype:
    """PyTorch's type promotion over any number of tensors and Python numbers."""
    if len(xs) == 2:
        return torch.result_type(*xs)
    if len(xs) == 1:
        x = xs[0]
        return x.dtype if isinstance(x, torch.Tensor) else torch.result_type(x, x)
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    return elementwise_dtypes(*xs, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def operands(*xs) -> list[torch.Tensor]:
    """Tensors of one dtype (PyTorch's type promotion) on one device; scalars become 0-dim."""
    dtype = result_dtype(*xs)
    device = next((x.device for x in xs if isinstance(x, torch.Tensor) and x.dim() > 0),
                  next((x.device for x in xs if isinstance(x, torch.Tensor)), torch.device("cpu")))
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            if x.dtype != dtype or x.device != device:
                x = x.to(device=device, dtype=dtype)
        elif isinstance(x, Number):
            x = torch.tensor(x, dtype=dtype, device=device)
        else:
            raise TypeError(f"unexpected operand {type(x).__name__}")
        out.append(x)
    return out


def is_float_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in FLOATS
