"""Operands and bitwise comparison shared by the Triton kernel tests (interpreter and
CUDA): rows that take every path of the flop kernels."""

import numpy as np

from numvar.rounding import kernels as RK

MODES = (RK.MODE_IEEE, RK.MODE_SR, RK.MODE_UD, RK.MODE_RANDOM)
#: (dtype, t): binary32 at 24, 8 (bf16), 11 (fp16) and 5 bits; binary64 at 53 and 30
PRECISIONS = ((np.float32, 24), (np.float32, 8), (np.float32, 11), (np.float32, 5),
              (np.float64, 53), (np.float64, 30))


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape and dtype, identical bits; NaNs equal NaNs (payloads and the sign of a
    NaN are not compared: IEEE 754 gives them no meaning)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    it = np.uint32 if a.dtype == np.float32 else np.uint64
    return np.array_equal(na, nb) and np.array_equal(a.view(it)[~na], b.view(it)[~nb])


def operands(dt, seed: int):
    """a (1, 5, 4) and b (1, 4, 5) whose rows cover both paths of the kernels (one tile:
    the interpreter's cost is per program): row 0 plain normal values (the integer fast
    path), row 1 scaled towards the subnormal range, row 2 towards overflow, row 3 with a
    zero and an infinity, row 4 binary32 sums inexact in float64 (magnitudes 2**±60) or
    binary64 products outside TwoProduct's safe range; b holds a signed zero."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, 5, 4))
    b = rng.standard_normal((1, 4, 5))
    if dt == np.float32:
        a[:, 1] *= 2.0 ** -130  # products and partial sums below 2**-126: subnormal grid
        a[:, 2] = 1.5 * 2.0 ** 126  # column 0 sums past 2**128: overflow to inf
        a[:, 4] *= 2.0 ** np.array([60, -60, 0, 30])  # TwoSum residuals != 0
    else:
        a[:, 1] *= 2.0 ** -1070  # products and sums on binary64's subnormal grid
        a[:, 2] = 1.5 * 2.0 ** 1022  # column 0: a finite sum past 2**1024 (k = -1)
        a[:, 4] *= 2.0 ** -540  # TwoProduct outside [2**-480, 2**480]: scaled path
    b[0, :, 0] = 1.0
    a[0, 3, 1] = 0.0
    b[0, 2, 3] = -0.0
    a[0, 3, 2] = np.inf
    return a.astype(dt), b.astype(dt)


def scan_input(dt, seed: int) -> np.ndarray:
    """x (5, 3): column 0 plain (with a zero), column 1 with subnormal partial sums and
    products, column 2 near overflow."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((5, 3))
    if dt == np.float32:
        x[:, 1] *= 2.0 ** -128
        x[:, 2] *= 2.0 ** 126
    else:
        x[:, 1] *= 2.0 ** -1030
        x[:, 2] *= 2.0 ** 1022
    x[2, 0] = 0.0
    return x.astype(dt)
