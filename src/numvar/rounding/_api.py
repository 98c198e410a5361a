"""Tensor API of the rounding core: dtype/broadcast handling and backend dispatch."""

from __future__ import annotations

import torch

from ..errors import FormatError, RoundingError
from . import _torch as T
from ._stream import Stream
from .formats import IEEE_DTYPES, Format, get_format
from .kernels import KIND_FMA, KIND_ROUND, KIND_ROUND_LO, KIND_SQRT, MODE_NAMES, OP_ADD, \
    OP_DIV, OP_MUL, OP_SUB, mode_code

MODES = MODE_NAMES
BACKENDS = ("auto", "torch", "numba")

#: the formats of the torch dtypes the rounding core computes in (binary64, binary32,
#: bfloat16, float16)
FORMATS: dict[torch.dtype, Format] = IEEE_DTYPES


def target_format(dtype: torch.dtype) -> Format:
    try:
        return FORMATS[dtype]
    except KeyError:
        raise RoundingError(f"unsupported target dtype {dtype}; expected one of "
                            "float32, float64, bfloat16, float16") from None


def _check(mode: str, precision: int | None, fmt: Format, backend: str,
           stream: Stream) -> tuple[int, int]:
    m = mode_code(mode)
    t = fmt.p if precision is None else int(precision)
    if not 1 <= t <= fmt.p:
        raise FormatError(f"precision must be in [1, {fmt.p}] for {fmt.name}, got {precision}")
    if backend not in BACKENDS:
        raise RoundingError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if not isinstance(stream, Stream):
        raise RoundingError("stream must be a numvar.rounding.Stream")
    return m, t


def _result_type(args) -> torch.dtype:
    """torch.result_type extended to any number of operands (pairwise fold; a Python
    number takes the default dtype when no tensor is given)."""
    rep = args[0]
    if len(args) == 1:
        return rep.dtype if isinstance(rep, torch.Tensor) else torch.result_type(rep, rep)
    for b in args[1:]:
        dt = torch.result_type(rep, b)
        dims = any(isinstance(x, torch.Tensor) and x.dim() > 0 for x in (rep, b))
        rep = torch.empty((1,) if dims else (), dtype=dt)
    return rep.dtype


def _as_tensors(args) -> tuple[list[torch.Tensor], torch.dtype]:
    if not all(isinstance(a, (torch.Tensor, int, float)) for a in args):
        raise RoundingError("operands must be tensors or Python numbers")
    dtype = _result_type(args)
    target_format(dtype)
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    ts = [a.to(dtype) if isinstance(a, torch.Tensor)
          else torch.tensor(a, dtype=dtype, device=device) for a in args]
    if len({t.device for t in ts}) > 1:
        raise RoundingError("operands are on different devices")
    return ts, dtype


def _use_numba(backend: str, ts: list[torch.Tensor]) -> bool:
    cpu = all(t.device.type == "cpu" for t in ts)
    if backend == "numba":
        if not cpu:
            raise RoundingError("backend='numba' needs CPU tensors")
        return True
    return backend == "auto" and cpu


def _flat(ts: list[torch.Tensor], carrier: torch.dtype) -> tuple[list[torch.Tensor], torch.Size]:
    bs = torch.broadcast_tensors(*ts)
    shape = bs[0].shape
    # (resolve_neg: a negative-bit view reads as its values, not its storage)
    return [b.to(carrier).resolve_neg().contiguous().reshape(-1) for b in bs], shape


def _numba_call(kernel, pre, flats, fmt: Format, m: int, t: int, key: int, shape, dtype):
    import numpy as np

    carrier = torch.float64 if fmt.p == 53 else torch.float32
    out = torch.empty(shape, dtype=carrier)
    if out.numel():
        kernel(*pre, *[f.detach().numpy() for f in flats], out.view(-1).numpy(),
               fmt.p, fmt.emin, fmt.emax, m, t, np.uint64(key))
    return out if carrier == dtype else out.to(dtype)


def _general(fmt: Format, precision, mode, backend, stream) -> tuple[Format, int, int]:
    """(format at the virtual precision, mode code, t) for a non-IEEE format."""
    m, t = _check(mode, precision, fmt, backend, stream)
    return fmt, m, t


def _format_call(kind: int, flats: list[torch.Tensor], fmt: Format, m: int, t: int,
                 key: int, numba: bool) -> torch.Tensor:
    """Any format: k_format (numba) or the torch functions, float64 in and out."""
    if numba:
        import numpy as np

        from . import kernels as K

        out = torch.empty(flats[0].shape, dtype=torch.float64)
        if out.numel():
            arr = [f.detach().numpy() for f in flats]
            while len(arr) < 3:
                arr.append(arr[0][:0])
            K.k_format(kind, *arr, out.numpy(), t, *fmt.spec(), m, np.uint64(key))
        return out
    r = T.bits_tensor(key, flats[0].numel(), flats[0].device)
    spec = fmt.spec()
    if kind <= OP_DIV:
        return T.wide_binary(kind, flats[0], flats[1], m, t, r, spec)
    if kind == KIND_SQRT:
        return T.wide_sqrt(flats[0], m, t, r, spec)
    if kind == KIND_FMA:
        return T.wide_fma(*flats, m, t, r, spec)
    lo = flats[1] if kind == KIND_ROUND_LO else None
    return T.round_values(flats[0], lo, m, t, *spec[:3], r, maxv=spec[3], flags=spec[4])


_KINDS = {"sqrt": KIND_SQRT, "fma": KIND_FMA}


def _elementwise(kind: int | str, args, mode, stream, precision, backend,
                 format=None) -> torch.Tensor:
    ts, dtype = _as_tensors(list(args))
    if format is not None:
        fmt = get_format(format)
        if fmt.ieee_dtype is not dtype:
            # any other format (or an IEEE one the operands are not in): the exact value
            # from float64 operands, rounded once to the format
            m, t = _check(mode, precision, fmt, backend, stream)
            key = stream.next_key()
            flats, shape = _flat(ts, torch.float64)
            res = _format_call(_KINDS.get(kind, kind), flats, fmt, m, t, key,
                               _use_numba(backend, ts))
            return res.reshape(shape).to(fmt.storage)
    fmt = target_format(dtype)
    m, t = _check(mode, precision, fmt, backend, stream)
    key = stream.next_key()
    if _use_numba(backend, ts):
        from . import kernels as K

        carrier = torch.float64 if fmt.p == 53 else torch.float32
        flats, shape = _flat(ts, carrier)
        if kind == "sqrt":
            return _numba_call(K.k_sqrt, (), flats, fmt, m, t, key, shape, dtype)
        if kind == "fma":
            return _numba_call(K.k_fma, (), flats, fmt, m, t, key, shape, dtype)
        return _numba_call(K.k_binary, (kind,), flats, fmt, m, t, key, shape, dtype)
    flats, shape = _flat(ts, torch.float64)
    device = flats[0].device
    r = T.bits_tensor(key, flats[0].numel(), device)
    pf = (fmt.p, fmt.emin, fmt.emax)
    wide = fmt.p == 53
    if kind == "sqrt":
        res = T.wide_sqrt(*flats, m, t, r) if wide else T.narrow_sqrt(*flats, m, t, *pf, r)
    elif kind == "fma":
        res = T.wide_fma(*flats, m, t, r) if wide else T.narrow_fma(*flats, m, t, *pf, r)
    else:
        res = (T.wide_binary(kind, *flats, m, t, r) if wide
               else T.narrow_binary(kind, *flats, m, t, *pf, r))
    return res.reshape(shape).to(dtype)


def add(a, b, *, mode: str = "sr", stream: Stream, precision: int | None = None,
        backend: str = "auto", format=None) -> torch.Tensor:
    """a + b, rounded once under ``mode`` to ``torch.result_type(a, b)`` at
    ``precision`` significand bits. Exact: binary32/bf16/f16 via float64 TwoSum;
    binary64 via TwoSum (x = s + e exactly)."""
    return _elementwise(OP_ADD, (a, b), mode, stream, precision, backend, format)


def sub(a, b, *, mode: str = "sr", stream: Stream, precision: int | None = None,
        backend: str = "auto", format=None) -> torch.Tensor:
    """a - b, one rounding (as :func:`add` with -b)."""
    return _elementwise(OP_SUB, (a, b), mode, stream, precision, backend, format)


def mul(a, b, *, mode: str = "sr", stream: Stream, precision: int | None = None,
        backend: str = "auto", format=None) -> torch.Tensor:
    """a * b, one rounding. binary32/bf16/f16: the float64 product is exact; binary64:
    Dekker's TwoProduct gives the exact error (inputs scaled by powers of two outside
    [2**-480, 2**480], so also exact near under/overflow)."""
    return _elementwise(OP_MUL, (a, b), mode, stream, precision, backend, format)


def div(a, b, *, mode: str = "sr", stream: Stream, precision: int | None = None,
        backend: str = "auto", format=None) -> torch.Tensor:
    """a / b, one rounding. x = q + r/b with q = RN64(a/b) and the exact residual
    r = a - q*b (TwoProduct); r/b is rounded, so the SR probability is exact to 2**-53
    relative, exactness and ties are decided exactly."""
    return _elementwise(OP_DIV, (a, b), mode, stream, precision, backend, format)


def sqrt(a, *, mode: str = "sr", stream: Stream, precision: int | None = None,
         backend: str = "auto", format=None) -> torch.Tensor:
    """sqrt(a), one rounding. x = s + r/(2s) with s = RN64(sqrt a), exact residual
    r = a - s*s: the sign of x - s and exactness are exact, the SR probability is
    within 2**-52 relative (first-order term of the Taylor expansion)."""
    return _elementwise("sqrt", (a,), mode, stream, precision, backend, format)


def fma(a, b, c, *, mode: str = "sr", stream: Stream, precision: int | None = None,
        backend: str = "auto", format=None) -> torch.Tensor:
    """a * b + c with one rounding. binary32/bf16/f16: exact product + TwoSum;
    binary64: TwoProduct + TwoSums (exact when |a|,|b|,|c| in [2**-300, 2**300] or
    zero; outside, after a common power-of-two scaling)."""
    return _elementwise("fma", (a, b, c), mode, stream, precision, backend, format)


def round(hi, lo=None, *, dtype: torch.dtype | None = None, mode: str = "sr",
          stream: Stream, precision: int | None = None, backend: str = "auto",
          out: torch.Tensor | None = None, format=None) -> torch.Tensor:
    """Round the exact value ``hi + lo`` (float tensors, converted to float64 exactly;
    ``lo`` optional, broadcast) to ``format`` (a :class:`Format`, a name such as
    ``"e4m3fn"``; default: the format of ``dtype``) under ``mode``, stored as ``dtype``
    (default: the format's :attr:`~Format.storage`, the smallest torch dtype that holds
    it; a dtype that cannot hold the format raises FormatError). hi + lo is first
    renormalised by TwoSum (exact barring overflow) where lo != 0. ``out``: an optional
    contiguous tensor of the result's shape and dtype to write into (and return).

    On the numba backend (CPU) float32 operands are read as they are (no float64 copy),
    a bfloat16/float16 result is written by the kernel into its tensor (``out`` or a new
    one) directly, and ``lo`` keeps the fast path where it is zero; the bits are those
    of float64 operands and of the torch backend."""
    if format is None:
        if dtype is None:
            raise RoundingError("round needs dtype or format")
        fmt = target_format(dtype)
    else:
        fmt = get_format(format)
        if dtype is None:
            dtype = fmt.storage
        elif not fmt.fits_in(dtype):
            raise FormatError(f"{dtype} cannot hold the values of {fmt.label}; "
                              f"use {fmt.storage} or wider")
    m, t = _check(mode, precision, fmt, backend, stream)
    if not isinstance(hi, torch.Tensor) or not hi.is_floating_point():
        raise RoundingError("hi must be a floating-point tensor")
    if lo is not None and (not isinstance(lo, torch.Tensor) or not lo.is_floating_point()):
        raise RoundingError("lo must be a floating-point tensor or None")
    ts = [hi] if lo is None else [hi, lo]
    key = stream.next_key()
    if fmt.ieee_dtype is not dtype:
        flats, shape = _flat(ts, torch.float64)
        _check_out(out, shape, dtype, flats[0].device)
        res = _format_call(KIND_ROUND if lo is None else KIND_ROUND_LO, flats, fmt, m, t, key,
                           _use_numba(backend, ts))
        res = res.reshape(shape).to(dtype)
        return res if out is None else out.copy_(res)
    if _use_numba(backend, ts):
        return _round_numba(ts, lo is not None, fmt, dtype, out, m, t, key)
    flats, shape = _flat(ts, torch.float64)
    _check_out(out, shape, dtype, flats[0].device)
    r = T.bits_tensor(key, flats[0].numel(), flats[0].device)
    res = T.round_values(flats[0], flats[1] if lo is not None else None, m, t,
                         fmt.p, fmt.emin, fmt.emax, r)
    res = res.reshape(shape).to(dtype)
    return res if out is None else out.copy_(res)


#: the 16-bit targets whose bit patterns the numba rounding kernel writes directly
_BITS16 = (torch.bfloat16, torch.float16)


def _round_numba(ts: list[torch.Tensor], has_lo: bool, fmt: Format, dtype: torch.dtype,
                 out: torch.Tensor | None, m: int, t: int, key: int) -> torch.Tensor:
    """round() on the numba kernel (an IEEE target). The inputs go in as they are when
    float32 or float64 (narrower ones as float32, both exactly; hi and lo in one dtype;
    float64 for a binary64 target), and the kernel writes the target tensor (``out`` or
    a new one) directly: binary32 / binary64 values, or the bit patterns of bfloat16 /
    float16."""
    import numpy as np

    from . import kernels as K

    # float32 carriers for a narrow target only (a binary64 target from float32 is rare:
    # one kernel specialisation fewer to compile)
    wide = fmt.p == 53 or any(x.dtype == torch.float64 for x in ts)
    flats, shape = _flat(ts, torch.float64 if wide else torch.float32)
    _check_out(out, shape, dtype, flats[0].device)
    res = out if out is not None else torch.empty(shape, dtype=dtype)
    if res.numel():
        h = flats[0].detach().numpy()
        lo = flats[1].detach().numpy() if has_lo else h[:0]
        dst = res.view(-1)
        dst = dst.view(torch.uint16) if dtype in _BITS16 else dst
        K.k_round(h, lo, dst.numpy(), has_lo, fmt.p, fmt.emin, fmt.emax, m, t,
                  np.uint64(key))
    return res


def _check_out(out, shape, dtype, device) -> None:
    if out is None:
        return
    if (not isinstance(out, torch.Tensor) or out.shape != shape or out.dtype != dtype
            or out.device != device or not out.is_contiguous()):
        raise RoundingError(f"out must be a contiguous {dtype} tensor of shape "
                            f"{tuple(shape)} on {device}")
