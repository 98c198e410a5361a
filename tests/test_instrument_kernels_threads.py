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
    """One parallel pass = clean_rows and narrow_products, at 1 and 2 threads (rows with
    zeros, subnormals, inf, NaN; bf16-valued and huge inputs; ``b`` of one batch and of
    several, in one chunk of its rows and in many)."""
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
                clean, pab = KN._prepare32(x, y, BO, t)
                assert np.array_equal(clean, KN.clean_rows(x, y, BO, t))
                assert (pab <= t) == KN.narrow_products(x, y, t)
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


@pytest.mark.parametrize("threads", THREADS)
def test_fast32_chunks_widen_each_tile_of_each_batch(threads):
    """``_contract_fast32`` in any number of chunks (numba runs each thread's iterations
    as one contiguous range; ``contract`` passes one chunk per thread): a chunk widens a
    column tile of ``b`` into its own block when the tile or ``b``'s batch changes, for
    its clean rows only. Clean rows next to rows that are not; ``b`` batched with one
    column tile (consecutive tasks of two batches read the same tile of different
    matrices) and with three (256, 256 and 88 columns at K = 400), and broadcast (one
    ``b`` for three batches): the same bits for 1, 2, 3, 5 chunks and more chunks than
    tasks, equal to every row on the full path (which reads ``b`` itself), in sr, ud
    and fma."""
    assert KN.clean_tile(400) == 256
    rng = np.random.default_rng(8)
    n0 = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        for BA, BB, N in ((1, 2, 100), (1, 2, 600), (3, 1, 600)):
            BO = max(BA, BB)
            a = rng.uniform(0.5, 1.0, (BA, 3, 400)).astype(np.float32)
            b = rng.uniform(-1.0, 1.0, (BB, 400, N)).astype(np.float32)
            clean = np.ones(BO * 3, dtype=np.bool_)
            clean[1::3] = False
            for mode, fma in (("sr", False), ("ud", False), ("sr", True)):
                code = RK.mode_code(mode)
                ref = np.empty((BO, 3, N), np.float32)
                KN._contract_fast32(a, b, np.zeros_like(clean), ref, np.uint64(4), code, 24, fma,
                                    False, 1)
                for nchunk in (1, 2, 3, 5, 1000):
                    out = np.empty_like(ref)
                    KN._contract_fast32(a, b, clean, out, np.uint64(4), code, 24, fma, False,
                                        nchunk)
                    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (
                        BA, BB, N, mode, fma, nchunk)
    finally:
        numba.set_num_threads(n0)


@pytest.mark.parametrize("threads", THREADS)
def test_narrow_tail_joins_the_last_block_with_the_same_bits(threads, monkeypatch):
    """A tail of at most NARROW_TAIL rows after whole blocks (ViT's 2 × 65 = 130 rows, and
    65 rows in each of two batches) runs in the task of the batch's last block: every
    row's bits as the column kernel's, binary32 and binary64, at 1 and 2 threads, with
    clean and unclean rows in the tail; the narrow kernel is taken."""
    L = KN.NARROW_ROWS
    rng = np.random.default_rng(31)
    monkeypatch.setattr(KN, "_narrow_rows_fit", lambda M, N: True)
    monkeypatch.setattr(KN, "PARALLEL_MIN_WORK", 0)  # every call on the parallel path
    n0 = numba.get_num_threads()
    for dt, t, name in ((np.float32, 24, "_contract_narrow32"),
                        (np.float64, 53, "_contract_narrow64")):
        for BO, M in ((1, 2 * L + 2), (2, L + 1), (1, L + KN.NARROW_TAIL)):
            a = rng.standard_normal((BO, M, 20)).astype(dt)
            b = rng.standard_normal((1, 20, 6)).astype(dt)
            a[-1, -1, 3] = 1e-40 if dt == np.float32 else 1e-310  # an unclean tail row
            taken = []
            real = getattr(KN, name)

            def spy(*args, real=real, taken=taken):
                taken.append(args[-3].shape)
                return real(*args)

            numba.set_num_threads(threads)
            try:
                with monkeypatch.context() as mp:
                    mp.setattr(KN, name, spy)
                    narrow = KN.contract(a, b, 17, RK.MODE_SR, t)
                with monkeypatch.context() as mp:
                    mp.setattr(KN, "NARROW_KERNEL", False)
                    columns = KN.contract(a, b, 17, RK.MODE_SR, t)
            finally:
                numba.set_num_threads(n0)
            assert taken == [(BO, M, 6)], (name, BO, M)
            bits = np.uint32 if dt == np.float32 else np.uint64
            assert np.array_equal(narrow.view(bits), columns.view(bits)), (name, BO, M)


@pytest.mark.parametrize("layer", ["numba's threading layer", "public functions only"])
def test_launch_sets_and_restores_the_thread_count(monkeypatch, layer):
    """``launch`` runs work below PARALLEL_MIN_WORK on one thread and more on all of this
    thread's, and restores the count after, also when the kernel raises; ``num_threads``
    reads numba's count, straight from the threading layer or (a numba without the
    layer's functions, stood in by an empty table) through numba's public functions."""
    if layer == "public functions only":
        monkeypatch.setattr(KN, "_NUMBA_LAYER", {})
    most = THREADS[-1]
    seen = []

    def kernel(fail=False):
        seen.append((numba.get_num_threads(), KN.num_threads()))
        if fail:
            raise ValueError("kernel failed")
        return "result"

    n0 = numba.get_num_threads()
    try:
        for n in THREADS:
            numba.set_num_threads(n)
            assert KN.num_threads() == n
            assert KN.launch(KN.PARALLEL_MIN_WORK - 1, kernel) == "result"
            assert KN.launch(KN.PARALLEL_MIN_WORK, kernel) == "result"
            with pytest.raises(ValueError, match="kernel failed"):
                KN.launch(1, kernel, fail=True)
            assert numba.get_num_threads() == KN.num_threads() == n
            assert seen[-3:] == [(1, 1), (n, n), (1, 1)]
            assert KN._threads(KN.PARALLEL_MIN_WORK) == n and KN._threads(7) == 1
        assert most in {s[0] for s in seen}
    finally:
        numba.set_num_threads(n0)
