"""The scalar kernels behind the flop references, checked against exact arithmetic.

``instrument.kernels.contract_reference`` / ``scan_reference`` are plain loops, but each
of their roundings is a numba scalar kernel (``mul_f32``, ``add_f32``, ``mul_f64``,
``add_f64``; the pointwise paths also use ``sub``, ``div``, ``sqrt``, ``fma``). A bug in
those kernels would be shared by the fast paths and by the references and pass every
bitwise comparison between them. Here every scalar kernel is compared with
:func:`numvar.rounding.reference.round_exact` (``fractions.Fraction`` arithmetic, the
same 64 random bits) on inputs covering the whole exponent range, subnormal inputs and
results, ties at every tested precision, overflow, signed zeros, infinities and NaN, in
every mode.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from numvar.rounding import kernels as K
from numvar.rounding._stream import bits
from numvar.rounding.reference import ref_op

MODES = {"ieee": K.MODE_IEEE, "sr": K.MODE_SR, "ud": K.MODE_UD, "random": K.MODE_RANDOM}
P = {np.float32: 24, np.float64: 53}
FMT = {np.float32: "binary32", np.float64: "binary64"}
KERNELS = {
    (np.float32, "add"): K.add_f32, (np.float32, "sub"): K.sub_f32,
    (np.float32, "mul"): K.mul_f32, (np.float32, "div"): K.div_f32,
    (np.float32, "sqrt"): K.sqrt_f32, (np.float32, "fma"): K.fma_f32,
    (np.float64, "add"): K.add_f64, (np.float64, "sub"): K.sub_f64,
    (np.float64, "mul"): K.mul_f64, (np.float64, "div"): K.div_f64,
    (np.float64, "sqrt"): K.sqrt_f64, (np.float64, "fma"): K.fma_f64,
}
ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "sqrt": 1, "fma": 3}


def _ieee(op, args, dt):
    """IEEE result in the format (used by the reference for specials and exact zeros)."""
    x = [dt(a) for a in args]
    with np.errstate(all="ignore"):
        if op == "add":
            v = x[0] + x[1]
        elif op == "sub":
            v = x[0] - x[1]
        elif op == "mul":
            v = x[0] * x[1]
        elif op == "div":
            v = x[0] / x[1]
        elif op == "sqrt":
            v = np.sqrt(x[0])
        else:  # a*b+c with one rounding: exact in Fractions, then to the format
            if not all(math.isfinite(a) for a in args):
                v = x[0] * x[1] + x[2]
            else:
                # only its specials and exact zeros are used: a plain conversion will do
                e = Fraction(args[0]) * Fraction(args[1]) + Fraction(args[2])
                try:
                    v = dt(float(e))
                except OverflowError:
                    v = dt(math.inf if e > 0 else -math.inf)
    return float(v)


def _inputs(dt, op, n, seed):
    """n argument tuples: random values over the exponent range (subnormals included),
    ties at precision t, overflow, cancellation to zero, and specials."""
    rng = np.random.default_rng(seed)
    p = P[dt]
    fi = np.finfo(dt)
    emin, emax = int(np.log2(fi.tiny)), int(fi.maxexp) - 1
    lo = emin - p + 1  # smallest subnormal exponent

    def rand(k, elo, ehi):
        m = rng.uniform(1, 2, k) * rng.choice([-1.0, 1.0], k)
        e = rng.integers(elo, ehi + 1, k)
        return [float(dt(v)) for v in np.ldexp(m, e)]

    ar = ARITY[op]
    out = []
    # the whole range, each argument independently
    cols = [rand(n, lo, emax) for _ in range(ar)]
    out += list(zip(*cols))
    # moderate magnitudes, where add/sub/mul results stay normal and inexact
    cols = [rand(n, -20, 20) for _ in range(ar)]
    out += list(zip(*cols))
    # subnormal results: tiny operands
    cols = [rand(n // 2, emin - 4, emin + 4) for _ in range(ar)]
    if op == "mul":
        cols[1] = rand(n // 2, -3, 3)
    out += list(zip(*cols))
    # near overflow
    cols = [rand(n // 4, emax - 2, emax) for _ in range(ar)]
    out += list(zip(*cols))
    # ties and near-ties of every tested precision: 1 + 2**-t (+- one ulp of the format)
    for t in (p, p - 1, 8, 2):
        h = 2.0 ** -t
        u = 2.0 ** (1 - p)
        for s in (1.0, -1.0):
            for extra in (0.0, u, -u / 2):
                if op in ("add", "sub"):
                    out.append((s * 1.0, (h + extra) * (1 if op == "add" else -1)))
                elif op == "mul":
                    out.append((s * (1.0 + 2.0 ** -(t // 2 + 1)), 1.0 + 2.0 ** -(t // 2 + 1)))
                elif op == "fma":
                    out.append((s, 1.0 + extra, h))
    # exact results, cancellation to (signed) zero, specials
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -2.0, float(fi.max),
                float(fi.smallest_subnormal)]
    for a in specials:
        for b in specials[:6]:
            out.append((a, b, 1.0)[:ar])
    out.append((1.5, -1.5, 0.0)[:ar])
    return [tuple(float(dt(v)) for v in a) for a in out]


def _bits(v, dt):
    it = np.uint32 if dt is np.float32 else np.uint64
    return int(np.array([v], dtype=dt).view(it)[0])


@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", list(ARITY))
def test_scalar_kernel_equals_exact_reference(dt, op):
    kern = KERNELS[(dt, op)]
    p = P[dt]
    fmt = FMT[dt]
    rng = np.random.default_rng(7)
    args_list = _inputs(dt, op, 24, seed=list(ARITY).index(op) * 100 + p)
    checked = 0
    for mode_name, mode in MODES.items():
        for t in sorted({p, p - 1, 8, 2}):
            for args in args_list:
                # the reference draws its 64 bits as bits(key, j): hand the kernel the same
                key, j = int(rng.integers(0, 2 ** 62)), int(rng.integers(0, 2 ** 20))
                r = bits(key, j)
                ieee = _ieee(op, args, dt)
                want = ref_op(op, args, fmt, t, mode, key, j, ieee)
                got = kern(*[dt(a) for a in args], mode, t, np.uint64(r))
                got = dt(got)
                if math.isnan(want):
                    assert math.isnan(float(got)), (op, mode_name, t, args)
                    continue
                assert _bits(got, dt) == _bits(dt(want), dt), (
                    op, mode_name, t, args, float(got), want)
                checked += 1
    assert checked > 1000

