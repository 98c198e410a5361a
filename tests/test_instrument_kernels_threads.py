"""The contraction kernel's parallel pieces give the same bits at every thread count."""

import numba
import numpy as np
import pytest

from numvar.instrument import kernels as KN
from numvar.rounding import kernels as RK

THREADS = sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)})


def _inputs(rng, BA, BB, M, Kd, N):
    """Normal values, plus rows that stress the clean-row test: an all-zero row, a row
    with a subnormal, one with an infinity, one with a NaN, one of bfloat16 values."""
    a = rng.standard_normal((BA, M, Kd)).astype(np.float32)
    b = rng.standard_normal((BB, Kd, N)).astype(np.float32)
    a[0, 0] = 0.0
    a[0, 1, 1] = 1e-40
    a[-1, 2, 0] = np.inf
    a[-1, 3, 2] = np.nan
    a[0, 4] = (a[0, 4].view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return a, b


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("shapes", [(1, 1, 6, 5, 7), (2, 1, 6, 3, 9), (1, 3, 6, 4, 2),
                                    (1, 2, 5, 400, 600), (1, 1, 5, 5, 1300)])
def test_prepare32_matches_serial_pieces(threads, shapes):
    """One parallel pass = b widened in tiled64's layout, clean_rows and narrow_products,
    at 1 and 2 threads (rows with zeros, subnormals, inf, NaN; bf16-valued and huge
    inputs; products of one column tile and of several, the last one narrower)."""
    rng = np.random.default_rng(sum(shapes))
    BA, BB = shapes[:2]
    BO = max(BA, BB)
    a, b = _inputs(rng, *shapes)
    cases = [(a, b), (np.abs(a) * 2.0 ** 100, b),
             ((a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32),
              (b.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))]
    n0 = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        for x, y in cases:
            for t in (24, 12):
                b64 = np.empty(y.size)
                clean, pab = KN._prepare32(x, y, b64, BO, t)
                assert np.array_equal(clean, KN.clean_rows(x, y, BO, t))
                assert (pab <= t) == KN.narrow_products(x, y, t)
                assert np.array_equal(b64.view(np.uint64), KN.tiled64(y).view(np.uint64))
    finally:
        numba.set_num_threads(n0)


@pytest.mark.parametrize("mode", ["sr", "ud"])
def test_contract_same_bits_at_every_thread_count(monkeypatch, mode):
    """A narrow product (many rows, few columns) and a batched one, every call sent down
    the parallel path: the same bits at 1 and 2 threads, and equal to the reference."""
    monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", 0)
    rng = np.random.default_rng(5)
    code = RK.mode_code(mode)
    n0 = numba.get_num_threads()
    for shapes in [(1, 1, 37, 11, 8), (3, 1, 5, 6, 3)]:
        a, b = _inputs(rng, *shapes)
        a[-1, 2, 0] = 1.0  # keep the result finite: bits compared with array_equal
        a[-1, 3, 2] = 2.0
        outs = []
        for th in THREADS:
            numba.set_num_threads(th)
            try:
                outs.append(KN.contract(a, b, 9, code, 24))
            finally:
                numba.set_num_threads(n0)
        ref = KN.contract_reference(a, b, 9, code, 24)
        for o in outs:
            assert np.array_equal(o.view(np.uint32), ref.view(np.uint32))


def test_tiled64_is_each_column_tile_as_its_own_block():
    """Element (k, j) of batch bb, j in the tile starting at j0 of width w, sits at
    bb·K·N + j0·K + k·w + (j − j0): written out element by element (3 tiles of 256, 256
    and 88 columns at K = 400; one tile, the plain layout, at K = 3)."""
    rng = np.random.default_rng(5)
    for BB, Kd, N in ((2, 400, 600), (1, 3, 7)):
        b = rng.standard_normal((BB, Kd, N)).astype(np.float32)
        tw = KN.clean_tile(Kd)
        out = KN.tiled64(b)
        assert out.shape == (BB * Kd * N,) and out.dtype == np.float64
        expect = np.empty(BB * Kd * N)
        for bb in range(BB):
            for j in range(N):
                j0 = j // tw * tw
                w = min(tw, N - j0)
                for k in range(Kd):
                    expect[bb * Kd * N + j0 * Kd + k * w + (j - j0)] = float(b[bb, k, j])
        assert np.array_equal(out, expect)
    assert KN.clean_tile(400) == 256 and KN.clean_tile(3) == 1024
    assert np.array_equal(KN.tiled64(b), b.astype(np.float64).reshape(-1))  # one tile

