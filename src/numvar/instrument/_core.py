"""The rounding context shared by the handlers, and thin wrappers over numvar.rounding."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Number

import numpy as np
import torch

import numvar.rounding as R
from numvar.rounding import kernels as RK

from ..errors import ConfigError, FormatError
from . import pointwise as PW
from .kernels import launch

#: (p, emin, emax) of the formats whose rounding has a numba carrier of their own dtype
_LEAN = {torch.float32: (24, -126, 127), torch.float64: (53, -1022, 1023)}
#: column-major float64 results rounded to binary32 where they lie (``Ctx.round``,
#: ``pointwise.round32_columns``); False: copied to row-major order first, the same bits
ROUND_COLUMNS_IN_PLACE = True
#: binary64 operands of an add, sub, mul or div at 53 bits read in place by
#: ``pointwise.binary64_tensors`` (broadcasts not materialised: a bias, a row's mean);
#: False: broadcast, copied and handed to ``numvar.rounding.kernels.k_binary`` (the same
#: bits; the tests and ``benchmarks/bench_oneop.py`` compare the two)
BINARY64_IN_PLACE = True

#: (p, emin, emax) of bfloat16 and float16: their roundings take a binary32 carrier
_NARROW = {torch.bfloat16: (8, -126, 127), torch.float16: (11, -14, 15)}
#: the exact cast of a binary32 carrier to each narrow dtype (a method: cheaper per call
#: than ``Tensor.to(dtype)``, whose argument parser tries several signatures)
_NARROW_CAST = {torch.bfloat16: torch.Tensor.bfloat16, torch.float16: torch.Tensor.half}

#: codes of the modes that return a value exact in the target format unchanged
_KEEPS_EXACT = frozenset(RK.mode_code(m) for m in ("ieee", "sr", "random"))

#: significand bits of each float format (the implicit bit included)
NATIVE_BITS = {torch.float32: 24, torch.float64: 53, torch.bfloat16: 8, torch.float16: 11}
FLOATS = frozenset(NATIVE_BITS)


#: accumulation policies of low-precision contractions and reductions (flop granularity)
ACCUMULATE = ("native", "same")


@dataclass(frozen=True)
class Accumulation:
    """How one contraction or reduction with a result of some dtype runs at flop
    granularity: in the IEEE kernels on ``kernel_dtype`` arrays at ``t`` bits, or (when
    ``spec`` is set) in the any-format kernels, every product and add rounded to the
    format ``spec``; ``then_round``: the result is rounded once more, to the target
    format of the result dtype (accumulate="native")."""

    kernel_dtype: torch.dtype | None
    t: int
    spec: tuple | None = None
    then_round: bool = False


_BINARY32_SPEC = R.formats.binary32.spec()


@dataclass
class Ctx:
    """Mode, granularity, virtual precision or format, accumulation policy and the random
    stream of one fuzzy block.

    ``format`` (a :class:`numvar.rounding.Format`, or None): every result is rounded to
    it and kept in its tensor's dtype (which must hold the format). ``accumulate``:
    "native" (contractions and reductions whose target format is below binary32:
    products and partial sums rounded to binary32 under the mode, the result rounded
    once to the target format under the mode) or "same" (every partial sum rounded to
    the target format).
    """

    mode: str
    granularity: str
    precision: int | None
    stream: R.Stream
    backend: str = "auto"
    #: ``on_escape(func, reason)``: set by the fuzzy block; handlers call it (through
    #: :func:`numvar.instrument.handlers.rounded_once`) when they fall back below flop
    on_escape: object = None
    contraction: str = "separate"  # flop contractions: "separate" | "fma"
    format: R.Format | None = None
    accumulate: str = "native"

    def __post_init__(self) -> None:
        self.code = RK.mode_code(self.mode)
        self._numba = self.backend in ("auto", "numba")  # short paths allowed
        # binary32 at its own precision and format
        self._t32 = self.bits(torch.float32) == 24 and (
            self.format is None or self.format.ieee_dtype is torch.float32)
        if self.accumulate not in ACCUMULATE:
            raise ConfigError(f"accumulate must be one of {ACCUMULATE}; got {self.accumulate!r}")

    def target(self, dtype: torch.dtype) -> R.Format | None:
        """The format results of ``dtype`` are rounded to when it is not ``dtype``'s own
        (None: dtype's own format, at the virtual precision). A format ``dtype`` cannot
        hold raises :class:`numvar.errors.FormatError`."""
        f = self.format
        if f is None or f.ieee_dtype is dtype or dtype not in FLOATS:
            return None
        if not f.fits_in(dtype):
            raise FormatError(f"format {f.label} does not fit in {dtype} tensors (they keep "
                              f"their dtype under fuzzy(format=...)); use {f.storage} or a "
                              "wider dtype for the model, or a narrower format")
        return f

    def accumulation(self, dtype: torch.dtype) -> Accumulation:
        """The :class:`Accumulation` of a contraction or reduction whose result is ``dtype``."""
        f = self.target(dtype)
        native = self.accumulate == "native"
        if f is None:
            if native and dtype in (torch.bfloat16, torch.float16):
                return Accumulation(torch.float32, 24, None, True)
            kd = torch.float64 if dtype is torch.float64 else torch.float32
            return Accumulation(kd, self.bits(dtype))
        if native and f.precision < 24 and f.fits_in(torch.float32):
            if dtype is torch.float64:
                return Accumulation(None, 24, _BINARY32_SPEC, True)
            return Accumulation(torch.float32, 24, None, True)
        return Accumulation(None, self.format_bits(f), f.spec())

    def format_bits(self, f: R.Format) -> int:
        """Significand bits t of the rounding to the format ``f`` (its own, or the virtual
        precision when lower)."""
        return f.precision if self.precision is None else min(f.precision, self.precision)

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
    # CPU binary32/binary64 operands take a short path that calls array kernels directly:
    # the same arithmetic, key and bits as numvar.rounding.add & co (tested bit for bit),
    # without the tensor API's per-call overhead. binary32 at 24 bits and binary64 at 53
    # use the broadcasting kernels of numvar.instrument.pointwise (no materialised
    # operands).
    def _lean(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return self._numba and a.dtype in _LEAN and a.is_cpu and b.is_cpu

    def _binary(self, op: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        same = a.shape == b.shape
        shape = a.shape if same else PW.broadcast_shape(a.shape, b.shape)
        key = self.stream.next_key()
        out = _empty(shape, a if same or a.shape == shape else b, a.dtype)
        n = out.numel()
        if not n:
            return out
        if a.dtype is torch.float32 and self._t32:
            # broadcast operands are read in place (PW.plan), never materialised
            code = self.code
            if not (PW.binary32_tensors(op, a, b, out, key, code)
                    or PW.binary32_tensors(op, a.contiguous(), b.contiguous(), out, key, code)):
                a, b = torch.broadcast_tensors(a, b)
                PW.binary32_tensors(op, a.contiguous(), b.contiguous(), out, key, code)
            return out
        if (a.dtype is torch.float64 and BINARY64_IN_PLACE and self.bits(a.dtype) == 53
                and (op != RK.OP_DIV or RK.DIV64_FAST)):
            # binary64: broadcast operands read in place too (the k_binary values below)
            code = self.code
            if (PW.binary64_tensors(op, a, b, out, key, code)
                    or PW.binary64_tensors(op, a.contiguous(), b.contiguous(), out, key, code)):
                return out
        p, emin, emax = _LEAN[a.dtype]
        if not same:
            a, b = torch.broadcast_tensors(a, b)
        an = a.detach().contiguous().view(-1).numpy()
        bn = b.detach().contiguous().view(-1).numpy()
        launch(n, RK.k_binary, op, an, bn, out.view(-1).numpy(), p, emin, emax, self.code,
               self.bits(a.dtype), np.uint64(key))
        return out

    def _arith(self, op: int, a, b, api):
        if self.format is not None:
            ts = operands(a, b)
            f = self.target(ts[0].dtype)
            if f is not None:
                return self._in_format(api, f, ts)
            a, b = ts
        if isinstance(a, torch.Tensor):
            if isinstance(b, torch.Tensor):
                if a.dtype is b.dtype and a.is_cpu and b.is_cpu:
                    # tensors of one dtype on the CPU: operands() would return them as they are
                    if self._numba and a.dtype in _LEAN:
                        return self._binary(op, a, b)
                    if self._numba and a.dtype in _NARROW:
                        return self._binary_narrow(op, a, b)
                    return self._api(api, a, b)
            elif self._scalar32(a, b):
                return self._binary_scalar(op, a, b, True)
        elif isinstance(b, torch.Tensor) and self._scalar32(b, a):
            return self._binary_scalar(op, b, a, False)
        a, b = operands(a, b)
        if self._lean(a, b):
            return self._binary(op, a, b)
        return self._api(api, a, b)

    def _in_format(self, api, f: R.Format, ts: list[torch.Tensor]) -> torch.Tensor:
        """``api`` (numvar.rounding.add & co) rounding to the format ``f``, the result in
        the operands' dtype (which holds f: exact cast)."""
        out = launch(max(t.numel() for t in ts), api, *ts, mode=self.mode,
                     stream=self.stream, backend=self.backend, format=f,
                     precision=self.format_bits(f))
        return out.to(ts[0].dtype)

    def _api(self, api, a, b):
        return launch(max(a.numel(), b.numel()), api, a, b, mode=self.mode,
                      stream=self.stream, precision=self.prec(a.dtype), backend=self.backend)

    def _scalar32(self, t: torch.Tensor, x) -> bool:
        """A binary32 CPU tensor (at 24 bits) and a Python number that binary32 holds as
        torch.tensor(x, dtype=torch.float32) would (floats within range, small ints)."""
        kind = type(x)
        return ((kind is float and -3.0e38 < x < 3.0e38
                 or kind is int and -(1 << 24) <= x <= 1 << 24)
                and t.dtype is torch.float32 and self._t32 and self._numba and t.is_cpu)

    def _binary_scalar(self, op: int, t: torch.Tensor, x, left: bool) -> torch.Tensor:
        """``t op x`` (``left``) or ``x op t`` for a Python number x: as _binary on
        ``operands(t, x)`` (x rounded to binary32 as torch.tensor does), x read once."""
        key = self.stream.next_key()
        out = _empty(t.shape, t, torch.float32)
        n = out.numel()
        if n:
            PW.scalar32_tensor(op, t if t.is_contiguous() else t.contiguous(), x, left, out,
                               key, self.code)
        return out

    def add(self, a, b):
        return self._arith(RK.OP_ADD, a, b, R.add)

    def sub(self, a, b):
        return self._arith(RK.OP_SUB, a, b, R.sub)

    def mul(self, a, b):
        return self._arith(RK.OP_MUL, a, b, R.mul)

    def div(self, a, b):
        return self._arith(RK.OP_DIV, a, b, R.div)

    def sqrt(self, a):
        (a,) = operands(a)
        f = self.target(a.dtype)
        if f is not None:
            return self._in_format(R.sqrt, f, [a])
        if self._lean(a, a) and a.dtype is torch.float32 and self._t32:
            key = self.stream.next_key()
            a = a.contiguous()
            out = _empty(a.shape, a, a.dtype)
            if out.numel():
                PW.sqrt32(PW.array(a), PW.array(out), key, self.code)
            return out
        return launch(a.numel(), R.sqrt, a, mode=self.mode, stream=self.stream,
                      precision=self.prec(a.dtype), backend=self.backend)

    def round(self, hi: torch.Tensor, dtype: torch.dtype, lo: torch.Tensor | None = None):
        """Round the exact value ``hi + lo`` (float64 tensors) to ``dtype``.

        CPU tensors without ``lo`` take a short path that calls an array kernel directly
        (same arithmetic, same key, same bits as numvar.rounding.round: tested bit for
        bit); everything else goes through numvar.rounding.round.
        """
        if (lo is None and dtype is torch.float32 and hi.dtype is torch.float64 and self._t32
                and self._numba and hi.is_cpu):  # (the most frequent case, tested first)
            key = self.stream.next_key()
            if (ROUND_COLUMNS_IN_PLACE and not hi.is_contiguous() and hi.dim() >= 2
                    and hi.mT.is_contiguous() and not hi.is_neg()):
                # column-major (LAPACK's results): rounded in place, the layout kept
                out = torch.empty_like(hi, dtype=dtype)
                if out.numel():
                    PW.round32_columns(hi, out, key, self.code)
                return out
            hi = hi.contiguous()
            out = _empty(hi.shape, hi, dtype)
            if out.numel():
                PW.round32_tensor(hi, out, key, self.code)
            return out
        if (lo is None and dtype in _NARROW and hi.dtype in _LEAN and self._numba
                and hi.is_cpu and self.target(dtype) is None):
            return self._round_narrow(hi, dtype)
        if hi.dtype is not torch.float64 and (dtype in _LEAN or not hi.is_floating_point()):
            hi = hi.double()  # (numvar.rounding.round reads float32 directly)
        f = self.target(dtype)
        if f is not None:
            return launch(hi.numel(), R.round, hi, lo, dtype=dtype, format=f, mode=self.mode,
                          stream=self.stream, backend=self.backend,
                          precision=self.format_bits(f))
        if lo is None and self._numba and hi.is_cpu and dtype in _LEAN:
            key = self.stream.next_key()
            hi = hi.contiguous()
            if dtype is torch.float32 and self._t32:
                out = _empty(hi.shape, hi, dtype)
                if out.numel():
                    PW.round32_tensor(hi, out, key, self.code)
                return out
            out = torch.empty(hi.shape, dtype=dtype)
            if dtype is torch.float64 and self.code in _KEEPS_EXACT and self.bits(dtype) == 53:
                # a binary64 value rounded to binary64 at 53 bits by a mode that keeps exact
                # values: itself (the kernel call would copy it; its key is drawn above)
                return out.copy_(hi)
            p, emin, emax = _LEAN[dtype]
            if out.numel():
                h = hi.detach().view(-1).numpy()
                launch(h.size, RK.k_round, h, h[:0], out.view(-1).numpy(), False, p, emin,
                       emax, self.code, self.bits(dtype), np.uint64(key))
            return out
        return launch(hi.numel(), R.round, hi, lo, dtype=dtype, mode=self.mode,
                      stream=self.stream, precision=self.prec(dtype), backend=self.backend)

    def stream_keys(self, n: int) -> np.ndarray:
        """The next ``n`` stream keys, in order, as a uint64 array (for compiled kernels
        that do the work of n rounding calls in one)."""
        return self.stream.keys(n)

    def round_keeps(self, t: torch.Tensor) -> bool:
        """Whether ``round(t.to(float64), t.dtype)`` returns ``t``'s own values, which
        makes that call skippable: then the stream is advanced by the one key the call
        takes, so that every later key (and bit) stays as if it had run.

        True for binary32 CPU tensors at 24 bits on the short path of :meth:`round`, in
        the modes that return exact values unchanged (ieee, sr, random; not ud, which
        perturbs them). NaNs stay NaN (their payload is not rounded: the float64 round
        trip would quiet a signalling NaN).
        """
        if (t.dtype is torch.float32 and self._t32 and self._numba and t.is_cpu
                and self.code in _KEEPS_EXACT):
            self.stream.next_key()
            return True
        return False

    def _binary_narrow(self, op: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a op b`` for bfloat16 or float16 CPU tensors of one dtype, rounded once: the
        rounding core's kernel (``k_binary``) on binary32 carriers, as
        ``numvar.rounding.add`` & co run it (same key, same bits), without their
        per-call type promotion and checks."""
        p, emin, emax = _NARROW[a.dtype]
        key = self.stream.next_key()
        if a.shape != b.shape:
            a, b = torch.broadcast_tensors(a, b)
        out = torch.empty(a.shape, dtype=torch.float32)
        if out.numel():
            PW.binary_narrow_tensor(op, a.float().contiguous(), b.float().contiguous(), out,
                                    p, emin, emax, self.code, self.bits(a.dtype), key)
        return _NARROW_CAST[a.dtype](out)

    def _round_narrow(self, hi: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """:meth:`round` of a binary32 or binary64 CPU tensor to bfloat16 or float16: the
        rounding core's kernel (``k_round``) reads ``hi`` in its own dtype (a binary32
        value widens to float64 exactly inside the kernel: no float64 copy of a binary32
        contraction result), writes the rounded values into a binary32 carrier (exact:
        binary32 holds every bfloat16 and float16 value) and the carrier is cast (exact).
        Same key, same arithmetic, same bits as ``numvar.rounding.round``."""
        p, emin, emax = _NARROW[dtype]
        key = self.stream.next_key()
        hi = hi.contiguous()
        buf = _empty(hi.shape, hi, torch.float32)
        if buf.numel():
            PW.round_narrow_tensor(hi, buf, p, emin, emax, self.code, self.bits(dtype), key)
        return _NARROW_CAST[dtype](buf)


_CF = torch.contiguous_format


def _empty(shape, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)`` (C-contiguous strides), by the cheaper
    ``empty_like`` when ``like`` (a plain tensor) has that shape."""
    if like.shape == shape and type(like) is torch.Tensor:
        return torch.empty_like(like, dtype=dtype, memory_format=_CF)
    return torch.empty(shape, dtype=dtype)


def result_dtype(*xs) -> torch.dtype:
    """PyTorch's type promotion over any number of tensors and Python numbers."""
    if len(xs) == 2:
        return torch.result_type(*xs)
    if len(xs) == 1:
        x = xs[0]
        return x.dtype if isinstance(x, torch.Tensor) else torch.result_type(x, x)
    first = xs[0]
    if isinstance(first, torch.Tensor):  # tensors of one dtype: that dtype
        dt = first.dtype
        if all(isinstance(x, torch.Tensor) and x.dtype is dt for x in xs):
            return dt
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
