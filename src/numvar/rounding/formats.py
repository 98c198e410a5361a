"""Floating-point formats as values: :class:`Format` and the named formats.

A format is ``precision`` significand bits (the hidden bit included), a normal exponent
range ``[emin, emax]``, subnormals or not, and an overflow rule. Its finite values are
0 and ``±m·2**(e-precision+1)`` for integers ``2**(precision-1) <= m < 2**precision``
and ``emin <= e <= emax`` (normal), plus ``±m·2**(emin-precision+1)`` with
``0 < m < 2**(precision-1)`` (subnormal, when ``subnormals``), up to ``max_value``
(default ``(2 - 2**(1-precision))·2**emax``; OCP's e4m3fn stops at 448).

Overflow (a result whose rounding exceeds the largest finite value): ``"inf"`` gives
±inf (IEEE 754), ``"saturate"`` the largest finite value of that sign, ``"nan"`` NaN
(torch's fnuz formats; e4m3fn saturates, as torch's casts). Infinite inputs follow the same
rule (inf, ±max, NaN). Rounding toward zero in magnitude never overflows (IEEE 754: the
directed modes ``zero``, ``down`` for positive and ``up`` for negative values give the
largest finite value). ``signed_zero=False`` (torch's fnuz formats) maps -0 to +0.

Values are stored in the smallest torch dtype that holds every value of the format
(:attr:`Format.storage`): torch's float8 dtypes, bfloat16, float16, float32, float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import FormatError
from .kernels import FLAG_FLUSH, FLAG_UNSIGNED_ZERO, OVF_INF, OVF_NAN, OVF_SATURATE

OVERFLOW_RULES = {"inf": OVF_INF, "saturate": OVF_SATURATE, "nan": OVF_NAN}

#: the widest exponent range a non-IEEE format may have: its arithmetic is emulated
#: exactly in binary64 (products of two of its values, and their errors, must stay
#: within binary64's range)
EMAX_LIMIT = 510
SUB_LIMIT = -537


@dataclass(frozen=True)
class Format:
    """A floating-point format: ``precision`` bits, normal exponents ``[emin, emax]``,
    ``subnormals``, ``overflow`` in {"inf", "saturate", "nan"}; ``max_value`` (None:
    ``(2 - 2**(1-precision))·2**emax``), ``signed_zero`` (False: -0 is stored as +0),
    ``name`` (for messages). Bad values raise :class:`numvar.errors.FormatError`."""

    precision: int
    emin: int
    emax: int
    subnormals: bool = True
    overflow: str = "inf"
    max_value: float | None = None
    signed_zero: bool = True
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for attr in ("precision", "emin", "emax"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int):
                raise FormatError(f"{attr} must be an integer, got {v!r}")
        if not 1 <= self.precision <= 53:
            raise FormatError(f"precision must be in [1, 53] (binary64 holds every format "
                              f"numvar emulates), got {self.precision}")
        if self.emax < self.emin:
            raise FormatError(f"emax ({self.emax}) must be >= emin ({self.emin})")
        if self.overflow not in OVERFLOW_RULES:
            raise FormatError(f"overflow must be one of {tuple(OVERFLOW_RULES)}, "
                              f"got {self.overflow!r}")
        if not isinstance(self.subnormals, bool) or not isinstance(self.signed_zero, bool):
            raise FormatError("subnormals and signed_zero must be booleans")
        ieee64 = (self.precision, self.emin, self.emax) == (53, -1022, 1023)
        if not ieee64 and (self.emax > EMAX_LIMIT or self.smallest_exponent < SUB_LIMIT):
            raise FormatError(
                f"format {self.label}: exponent range too wide to emulate exactly in binary64 "
                f"(a format other than binary64 needs emax <= {EMAX_LIMIT} and a smallest "
                f"positive value >= 2**{SUB_LIMIT}; got emax {self.emax}, smallest "
                f"2**{self.smallest_exponent})")
        if self.max_value is not None:
            m = float(self.max_value)
            top = 2.0 ** self.emax * (2.0 - 2.0 ** (1 - self.precision))
            if not (2.0 ** self.emax <= m <= top) or m != _on_grid(m, self.precision):
                raise FormatError(f"max_value {self.max_value!r} is not a value of the top "
                                  f"binade [2**{self.emax}, {top!r}] at {self.precision} bits")
            object.__setattr__(self, "max_value", None if m == top else m)
        if not self.name:
            object.__setattr__(self, "name", self._describe())

    # ------------------------------------------------------------------ properties
    @property
    def p(self) -> int:
        """Alias of ``precision`` (the rounding core's name)."""
        return self.precision

    @property
    def label(self) -> str:
        return self.name or self._describe()

    def _describe(self) -> str:
        extra = "" if self.subnormals else ", no subnormals"
        extra += "" if self.overflow == "inf" else f", overflow {self.overflow}"
        return f"Format(p={self.precision}, emin={self.emin}, emax={self.emax}{extra})"

    @property
    def smallest_exponent(self) -> int:
        """log2 of the smallest positive value (subnormal, or 2**emin without)."""
        return self.emin - self.precision + 1 if self.subnormals else self.emin

    @property
    def max_finite(self) -> float:
        """The largest finite value."""
        if self.max_value is not None:
            return self.max_value
        return 2.0 ** self.emax * (2.0 - 2.0 ** (1 - self.precision))

    @property
    def flags(self) -> int:
        """The rounding core's flag word (overflow rule, flush, unsigned zero)."""
        f = OVERFLOW_RULES[self.overflow]
        if not self.subnormals:
            f |= FLAG_FLUSH
        if not self.signed_zero:
            f |= FLAG_UNSIGNED_ZERO
        return f

    def spec(self) -> tuple[int, int, int, float, int]:
        """(p, emin, emax, maxv, flags) as the kernels take them (maxv 0: the IEEE max)."""
        return (self.precision, self.emin, self.emax,
                0.0 if self.max_value is None else self.max_value, self.flags)

    @property
    def ieee_dtype(self) -> torch.dtype | None:
        """The torch dtype whose arithmetic format this is exactly (binary64, binary32,
        bfloat16, float16), else None: those take the rounding core's own kernels."""
        for dt, f in IEEE_DTYPES.items():
            if f == self:
                return dt
        return None

    def fits_in(self, dtype: torch.dtype) -> bool:
        """Whether every value of this format (and its inf, -0) is a value of ``dtype``."""
        s = STORAGE_FORMATS.get(dtype)
        if s is None:
            return False
        return (self.precision <= s.precision and self.smallest_exponent >= s.smallest_exponent
                and self.max_finite <= s.max_finite
                and (self.overflow != "inf" or s.overflow == "inf")
                and (not self.signed_zero or s.signed_zero))

    @property
    def storage(self) -> torch.dtype:
        """The smallest torch dtype that holds every value of the format."""
        for dt in STORAGE_ORDER:
            if dt in STORAGE_FORMATS and self.fits_in(dt):
                return dt
        return torch.float64  # pragma: no cover - binary64 holds every valid format

    @property
    def token(self) -> str:
        """A string that :func:`get_format` turns back into this format: the name of a
        named format, else ``format:P,EMIN,EMAX,SUBNORMALS,OVERFLOW,MAX,SIGNED_ZERO``
        (MAX ``-`` for the IEEE maximum; booleans 0/1)."""
        if NAMED.get(self.name) == self:
            return self.name
        mx = "-" if self.max_value is None else repr(self.max_value)
        return (f"format:{self.precision},{self.emin},{self.emax},{int(self.subnormals)},"
                f"{self.overflow},{mx},{int(self.signed_zero)}")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def custom(cls, precision: int, exponent_bits: int, *, subnormals: bool = True,
               overflow: str = "inf") -> Format:
        """An IEEE-style format of ``1 + exponent_bits + precision - 1`` bits: bias
        ``2**(exponent_bits-1) - 1``, ``emax = bias``, ``emin = 1 - bias`` (the all-ones
        exponent encodes inf/NaN)."""
        if isinstance(exponent_bits, bool) or not isinstance(exponent_bits, int) or \
                not 2 <= exponent_bits <= 11:
            raise FormatError(f"exponent_bits must be an integer in [2, 11], got "
                              f"{exponent_bits!r}")
        bias = (1 << (exponent_bits - 1)) - 1
        return cls(precision, 1 - bias, bias, subnormals, overflow,
                   name=f"custom(p={precision}, e={exponent_bits})")


def _on_grid(m: float, p: int) -> float:
    import math

    mant, e = math.frexp(m)
    return math.ldexp(round(mant * 2 ** p) / 2 ** p, e)


binary64 = Format(53, -1022, 1023, name="binary64")
binary32 = Format(24, -126, 127, name="binary32")
tf32 = Format(11, -126, 127, name="tf32")
bfloat16 = Format(8, -126, 127, name="bfloat16")
float16 = Format(11, -14, 15, name="float16")
#: OCP FP8 E4M3: no infinities, NaN S.1111.111, max 448; overflow (and ±inf) saturates
#: to ±448 as torch's float8_e4m3fn casts do (OCP's saturating conversion); for OCP's
#: non-saturating rule use ``Format(4, -6, 8, overflow="nan", max_value=448.0)``
e4m3fn = Format(4, -6, 8, overflow="saturate", max_value=448.0, name="e4m3fn")
#: OCP FP8 E5M2: IEEE-like, with infinities
e5m2 = Format(3, -14, 15, name="e5m2")
#: torch's float8_e4m3fnuz / float8_e5m2fnuz: bias 8 / 16, no infinities, no -0
e4m3fnuz = Format(4, -7, 7, overflow="nan", signed_zero=False, name="e4m3fnuz")
e5m2fnuz = Format(3, -15, 15, overflow="nan", signed_zero=False, name="e5m2fnuz")

#: every named format by name ("binary16" and "half" are aliases of float16, "bf16" of
#: bfloat16, "fp32"/"fp64" of binary32/binary64)
NAMED: dict[str, Format] = {f.name: f for f in (binary64, binary32, tf32, bfloat16, float16,
                                                 e4m3fn, e5m2, e4m3fnuz, e5m2fnuz)}
_ALIASES = {"binary16": "float16", "half": "float16", "fp16": "float16", "bf16": "bfloat16",
            "fp32": "binary32", "float32": "binary32", "fp64": "binary64",
            "float64": "binary64", "float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2",
            "float8_e4m3fnuz": "e4m3fnuz", "float8_e5m2fnuz": "e5m2fnuz"}

#: the torch dtypes whose arithmetic the rounding core's own kernels implement
IEEE_DTYPES: dict[torch.dtype, Format] = {torch.float64: binary64, torch.float32: binary32,
                                          torch.bfloat16: bfloat16, torch.float16: float16}

STORAGE_FORMATS: dict[torch.dtype, Format] = dict(IEEE_DTYPES)
for _name, _f in (("float8_e4m3fn", e4m3fn), ("float8_e5m2", e5m2),
                  ("float8_e4m3fnuz", e4m3fnuz), ("float8_e5m2fnuz", e5m2fnuz)):
    if hasattr(torch, _name):
        STORAGE_FORMATS[getattr(torch, _name)] = _f
#: storage candidates, smallest first
STORAGE_ORDER = tuple(dt for dt in (
    getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e4m3fnuz", None),
    getattr(torch, "float8_e5m2", None), getattr(torch, "float8_e5m2fnuz", None),
    torch.bfloat16, torch.float16, torch.float32, torch.float64) if dt is not None)


def get_format(spec) -> Format:
    """A :class:`Format` from a Format, a name (``"e4m3fn"``, ``"bf16"``), a torch float
    dtype, a ``(precision, exponent_bits)`` pair (:meth:`Format.custom`), the string
    ``"custom:P,E"`` or a :attr:`Format.token`."""
    if isinstance(spec, Format):
        return spec
    if isinstance(spec, torch.dtype):
        if spec in STORAGE_FORMATS:
            return STORAGE_FORMATS[spec]
        raise FormatError(f"no format for dtype {spec}")
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return Format.custom(*spec)
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key.startswith("format:"):
            try:
                p, emin, emax, sub, ovf, mx, sz = key[len("format:"):].split(",")
                return Format(int(p), int(emin), int(emax), sub == "1", ovf,
                              None if mx == "-" else float(mx), sz == "1")
            except ValueError:
                raise FormatError(f"bad format token {spec!r}; expected "
                                  "format:P,EMIN,EMAX,SUBNORMALS,OVERFLOW,MAX,SIGNED_ZERO") from None
        if key.startswith("custom:") or key.startswith("custom("):
            body = key.split(":", 1)[1] if ":" in key else key[len("custom("):].rstrip(")")
            try:
                p, e = (int(v) for v in body.split(","))
            except ValueError:
                raise FormatError(f"custom format must read custom:PRECISION,EXPONENT_BITS, "
                                  f"got {spec!r}") from None
            return Format.custom(p, e)
        key = _ALIASES.get(key, key)
        if key in NAMED:
            return NAMED[key]
        raise FormatError(f"unknown format {spec!r}; expected one of {', '.join(NAMED)} "
                          "or custom:PRECISION,EXPONENT_BITS")
    raise FormatError(f"cannot make a format of {spec!r}")


def format_token(spec) -> str | None:
    """A format option (anything :func:`get_format` takes, or None) as the string a run's
    JSON configuration stores (:attr:`Format.token`)."""
    return None if spec is None else get_format(spec).token
