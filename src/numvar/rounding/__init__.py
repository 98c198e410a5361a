"""numvar.rounding: the stochastic arithmetic core (SR, UD, random rounding, ieee).

Elementwise, broadcasting operations on tensors, each rounded once to the result dtype
(binary32, binary64, bfloat16, float16) under a rounding mode, optionally at a virtual
precision of ``t`` significand bits::

    from numvar.rounding import Stream, add, mul, round
    s = Stream(0)
    y = add(a, b, mode="sr", stream=s)            # float32 a, b -> SR-rounded float32
    z = round(x64, dtype=torch.float32, mode="ud", stream=s)

Semantics (DESIGN.md): SR returns the upper neighbour b of the exact x with probability
(x-a)/(b-a) (53 random bits), ``random`` up or down with probability 1/2, ``ud``
perturbs the round-to-nearest result by one grid step up or down (an inexact x whose
nearest value is 0 becomes the smallest grid value of its sign or stays 0, probability
1/2 each), ``ieee`` rounds to nearest even, ``up``/``down``/``zero`` toward +inf/-inf/0,
``farthest`` to the neighbour ieee does not pick. Exact results stay exact (except under
``ud``). NaN stays NaN, +-inf stays, signed zeros and overflow follow IEEE 754,
subnormals are rounded on the subnormal grid.

Formats: ``format=`` (a :class:`Format`, or a name: ``"e4m3fn"``, ``"e5m2"``, ``"tf32"``,
``"custom:7,5"``, ...) rounds to any format (precision, exponent range, subnormals or
not, overflow to inf / saturate / NaN); results are stored in the smallest torch dtype
that holds the format (torch's float8 dtypes included)::

    y8 = round(x64, format="e4m3fn", mode="sr", stream=s)   # torch.float8_e4m3fn

Virtual precision ``t``: for |x| in [2**e, 2**(e+1)) the grid spacing is
``2**max(e - t + 1, emin - p + 1)``: t bits relative precision, never finer than the
format's subnormal spacing (Verificarlo's convention); the exponent range stays the
format's.

Randomness: each call takes one ``stream.next_key()``; element j of the C-order output
uses ``bits(key, j)`` (splitmix64), identical on the numba and torch backends.
"""

from ._api import BACKENDS, FORMATS, MODES, add, div, fma, mul, round, sqrt, sub, target_format
from ._stream import Stream, bits, mix64
from .formats import NAMED, Format, get_format

__all__ = ["MODES", "BACKENDS", "FORMATS", "NAMED", "Format", "get_format", "Stream", "bits",
           "mix64", "add", "sub", "mul", "div", "sqrt", "fma", "round", "target_format"]
