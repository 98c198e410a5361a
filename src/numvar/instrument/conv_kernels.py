"""Convolutions with one input channel per group at ``flop`` granularity without their
im2col matrix.

:func:`numvar.instrument.flop.conv` computes a convolution as one product per group,
``(O/g, C/g·∏k) @ (C/g·∏k, N·∏L)``, the right operand the group's im2col matrix
(:func:`numvar.instrument.flop._group_cols`: one permuted copy of the input's sliding
windows). For a depthwise convolution that copy, not the arithmetic, took the time:
PyTorch copies a seven-dimensional strided view whose inner runs are one output row (4
elements on EfficientNet's last maps) at about 2 ns an element, 1.2 ms of a 2.2 ms flop
SR convolution of 672 channels of 5 × 5 on 4 × 4 maps (Intel Xeon, one thread;
docs/speed.md, "Depthwise convolutions at flop without the im2col matrix"). Each
group's product has one row per output channel of the group, so
:func:`numvar.instrument.kernels.contract` gives it to its column kernel
(:func:`numvar.instrument.kernels._contract_fast32`), which reads each element of the
matrix once.

:func:`grouped32` runs that column kernel on the same products with each group's
matrix built in a block that stays in cache: the group's input is staged
(:func:`_stage`: a zero, then its channel of each batch) and a gather table shared by
all groups (:func:`offsets`) builds the block from it; the group's clean rows are
decided from the magnitudes of its weights and of its staged input (see
:func:`_grouped32`), and each (row, column tile) task is
:func:`numvar.instrument.kernels._fast32_task` itself. Same keys, lines (``row·K + k``),
columns, arithmetic and paths: the same bits, by construction, and tested against the
im2col route in every mode it serves (``tests/test_instrument_conv_kernels.py``).

It serves convolutions with one input channel per group (depthwise ones, with any
channel multiplier, and those of a one-channel input) on binary32 carriers (binary32,
bfloat16 and float16 operands) on the CPU in sr, ieee, ud and random at 1–24 bits,
``"separate"`` or ``"fma"``, 1-, 2- and 3-D, any stride, padding and dilation, where
:func:`numvar.instrument.kernels.contract` would run the column kernel (:func:`serves`).
Everything else takes the im2col route unchanged.

:func:`bias_rows32` adds a convolution's bias to its products, whichever route computed
them: ``Ctx.add``'s key, element indices and values on the (N, O, L) result, in one
compiled call.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np
from numba import njit, prange

from numvar.rounding import kernels as K

from . import kernels as KN
from .pointwise import fill, round_into

#: False: every convolution through the im2col matrix and :func:`kernels.contract` (the
#: route the tests compare :func:`grouped32` with)
USE_KERNEL = True
#: False: a convolution's bias added by ``Ctx.add`` on the permuted products (the path
#: the tests compare :func:`bias_rows32` with)
BIAS_KERNEL = True


@njit(cache=True)
def offsets(N, cg, S, ks, st, pad, dil, L):  # pragma: no cover - compiled
    """The gather table of a group's im2col matrix, (cg·∏ks, N·∏L) int32: element
    (row, column) of the matrix is element ``table[row, column]`` of the group's staged
    input (:func:`_stage`: a zero at 0, then the group's cg channels of each of the N
    batches, contiguous), 0 (the zero) for padding. Rows (channel of the group, kernel
    position) and columns (batch, output position), each in C order, as
    :func:`numvar.instrument.flop._group_cols`.
    ``S``, ``ks``, ``st``, ``pad``, ``dil``, ``L``: three spatial sizes each (1-D and 2-D
    padded with leading 1s, stride 1, padding 0, dilation 1). The same for every group."""
    D, H, W = S[0], S[1], S[2]
    kd, kh, kw = ks[0], ks[1], ks[2]
    Lo = L[0] * L[1] * L[2]
    plane = D * H * W
    K = cg * kd * kh * kw
    out = np.empty((K, N * Lo), np.int32)
    for ci in range(cg):
        for kz in range(kd):
            for ky in range(kh):
                for kx in range(kw):
                    row = out[((ci * kd + kz) * kh + ky) * kw + kx]
                    for n in range(N):
                        nb = 1 + (n * cg + ci) * plane
                        for oz in range(L[0]):
                            iz = oz * st[0] - pad[0] + kz * dil[0]
                            for oy in range(L[1]):
                                iy = oy * st[1] - pad[1] + ky * dil[1]
                                c0 = ((n * L[0] + oz) * L[1] + oy) * L[2]
                                inside = 0 <= iz < D and 0 <= iy < H
                                for ox in range(L[2]):
                                    ix = ox * st[2] - pad[2] + kx * dil[2]
                                    if inside and 0 <= ix < W:
                                        row[c0 + ox] = nb + (iz * H + iy) * W + ix
                                    else:
                                        row[c0 + ox] = 0
    return out


@njit(inline="always")
def _stage(ext, x, g, N, C, cg, plane):
    """Group g's input, staged: ``ext[0] = 0``, then its cg channels of each of the N
    batches of the flat (N, C, plane) input ``x`` (exact copies)."""
    ext[0] = 0.0
    run = cg * plane
    for n in range(N):
        src = x[(n * C + g * cg) * plane:(n * C + (g + 1) * cg) * plane]
        dst = ext[1 + n * run:1 + (n + 1) * run]
        for i in range(run):
            dst[i] = src[i]


@njit(inline="always")
def _gather(block, ext, off):
    """``block[e] = ext[off[e]]`` (exact copies)."""
    for e in range(off.size):
        block[e] = ext[off[e]]


@njit(parallel=True, cache=True)
def _grouped32(x, off, a, N, C, plane, out, key, mode, t, fma, nchunk):  # pragma: no cover
    """:func:`numvar.instrument.kernels._contract_fast32` on ``a`` (G, M, K) and the
    groups' im2col matrices, each built from its staged input (:func:`_stage`) by the
    table ``off`` ((K, NL), :func:`offsets`) into a block in cache, into ``out``
    (G, M, NL); ``x`` the flat (N, C, plane) input. Groups in ``nchunk`` contiguous
    chunks (one per thread), each with its own buffers; the order and the chunks change no
    bit.

    A row is clean (:func:`numvar.instrument.kernels._is_clean`) by the magnitudes of its
    weights and of the group's staged input, where :func:`numvar.instrument.kernels.
    _prepare32` takes those of the matrix: the same elements where the windows cover the
    input (the padding zeros do not count), else a superset, whose bounds make fewer rows
    clean. The clean loops and the checked path give the same bits; only the speed
    depends on it. Likewise the products' exactness bound is taken over all of ``x``."""
    G, M, NL = out.shape
    Kd = a.shape[2]
    cg = C // G
    pab = KN._sig_bits(KN._fraction_or(a.reshape(-1))) + KN._sig_bits(KN._fraction_or(x))
    exact = KN.EXACT_PRODUCTS and not fma and t == 24 and mode != KN._UD and pab <= t
    tw = KN.clean_tile(Kd)
    ntile = (NL + tw - 1) // tw
    ukey = np.uint64(key)
    clean = np.empty(G * M, dtype=np.bool_)
    offf = off.reshape(-1)
    nch = max(1, min(nchunk, G))
    wmax = min(NL, tw)
    for c in prange(nch):
        ext = np.empty(1 + N * cg * plane, np.float32)
        block = np.empty((1, Kd, NL), np.float32)
        bflat = block.reshape(-1)
        acc = np.empty(wmax)
        jg = np.empty(wmax, dtype=np.uint64)
        bad = np.empty(wmax, dtype=np.bool_)
        bt = np.empty(Kd * wmax)
        jg_j0 = -1
        for g in range(c * G // nch, (c + 1) * G // nch):
            _stage(ext, x, g, N, C, cg, plane)
            _gather(bflat, ext, offf)
            bhi, blo, _ = KN._row_stats(ext[1:].view(np.uint32))
            for i in range(M):
                ahi, alo, _ = KN._row_stats(a[g, i].view(np.uint32))
                clean[g * M + i] = KN._is_clean(ahi, alo, bhi, blo, Kd, t)
            held = (jg_j0, -1)  # the block is new: no widened tile of it yet
            for tile in range(ntile):
                for i in range(M):
                    held = KN._fast32_task(a, block, clean, out, ukey, mode, t, fma, exact,
                                           (g * ntile + tile) * M + i, ntile, tw, acc, jg,
                                           bad, bt, held)
            jg_j0 = held[0]


def serves(mode: int, t: int, contraction: str, cg: int, groups: int, m: int, nl: int,
           k: int, staged: int) -> bool:
    """Whether :func:`grouped32` computes the group products of a convolution with ``cg``
    input channels per group, ``m`` output channels per group and ``nl`` columns (batch ×
    output positions) over ``k`` terms, ``staged`` elements of input per group (batch ×
    channels of the group × spatial: :func:`offsets`' int32 table indexes them): one
    input channel per group (depthwise, with any
    channel multiplier, or a one-channel input: measured faster than the im2col route on
    every such shape of the zoo and its benchmarks; with 3 to 16 channels per group the
    block, the whole im2col matrix of a group, no longer fits in cache, and the gather was
    0.9–1.0× the route's copy), sr, ieee, ud or random at 1–24 bits, a non-empty result,
    and the column kernel where :func:`kernels.contract` would choose it (not the narrow
    kernel: ``kernels._narrow32_serves``, with the products taken as inexact, so that
    the im2col route runs wherever the narrow kernel might serve)."""
    if not (USE_KERNEL and cg == 1 and mode <= KN._RANDOM and 1 <= t <= 24
            and groups * m * nl and staged < 2**31 - 1):
        return False
    if contraction == "fma" or t != 24 or not KN.NARROW_KERNEL:
        return True  # (contract's narrow kernel takes neither)
    return not KN._narrow32_serves((groups, m, nl), groups * m * nl * k, False)


def _three(v, fill: int = 1) -> np.ndarray:
    """Spatial sizes as :func:`offsets` takes them: padded to three with leading ``fill``s
    (1-D and 2-D convolutions as 3-D ones)."""
    return np.array((fill,) * (3 - len(v)) + tuple(v), np.int64)


def grouped32(x: np.ndarray, w: np.ndarray, ks, stride, padding, dilation, groups: int,
              ls, key: int, mode: int, t: int, contraction: str) -> np.ndarray:
    """The group products of a convolution of the contiguous binary32 input ``x``
    (N, C, *S) by the weights ``w`` (O, C/g, *k), ``(g, O/g, N·∏L)`` binary32, with the bits
    of ``kernels.contract(w.reshape(g, O/g, C/g·∏k), im2col, key, mode, t, contraction)``
    (see the module docstring); ``ls`` the output's spatial shape. Call where
    :func:`serves`."""
    n, c = x.shape[:2]
    cg = c // groups
    o = w.shape[0]
    off = _table(n, cg, tuple(x.shape[2:]), tuple(ks), tuple(stride), tuple(padding),
                 tuple(dilation), tuple(ls))
    K, NL = off.shape
    a = w.reshape(groups, o // groups, K)
    out = np.empty((groups, o // groups, NL), np.float32)
    work = out.size * K
    KN.launch(work, _grouped32, x.reshape(-1), off, a, n, c, math.prod(x.shape[2:]), out,
              np.uint64(key), mode, t, contraction == "fma", KN._threads(work))
    return out


#: bytes of gather tables kept in all (:func:`_table`), the least recently used dropped
#: first; a table above it is built on every call. 64 MiB: the table of the paper's
#: digits LeNet at batch 64 (its one-channel first layer, 5 × 5 over 28 × 28 padded by
#: 2: 25 × 50 176 entries, 4.8 MiB) is kept, and its flop SR forward went from 6.5× to
#: 5.9× native (one thread, Zen 4: ``offsets`` took 1.8 ms of each 19 ms forward; a
#: count of 2**18 entries had kept tables of up to 1 MiB); a 3 × 3 one-channel or
#: depthwise layer over more than 1.8 M output positions (batch × height × width, e.g.
#: 32 × 256 × 256) is built per call, as before.
TABLE_BYTES = 64 << 20

_TABLES: OrderedDict[tuple, np.ndarray] = OrderedDict()
_TABLES_LOCK = threading.Lock()
_tables_bytes = 0


def _table(n: int, cg: int, sp, ks, stride, padding, dilation, ls) -> np.ndarray:
    """:func:`offsets` for a convolution's geometry (tuples of its spatial sizes), kept up
    to :data:`TABLE_BYTES` in all so that a model's later calls skip building it (about
    8 µs a call for a small table: the padded size arrays, the compiled call; then 1.4 ns
    an entry, one thread, Zen 4). The kernels only read it."""
    global _tables_bytes
    key = (n, cg, sp, ks, stride, padding, dilation, ls)
    if 4 * cg * math.prod(ks) * n * math.prod(ls) > TABLE_BYTES:
        return _new_table(*key)
    with _TABLES_LOCK:
        off = _TABLES.get(key)
        if off is not None:
            _TABLES.move_to_end(key)
            return off
    off = _new_table(*key)
    with _TABLES_LOCK:
        if key not in _TABLES:
            _TABLES[key] = off
            _tables_bytes += off.nbytes
            while _tables_bytes > TABLE_BYTES:
                _tables_bytes -= _TABLES.popitem(last=False)[1].nbytes
    return off


def _clear_tables() -> None:
    """Drop every kept gather table (tests)."""
    global _tables_bytes
    with _TABLES_LOCK:
        _TABLES.clear()
        _tables_bytes = 0


def _new_table(n, cg, sp, ks, stride, padding, dilation, ls) -> np.ndarray:
    return offsets(n, cg, _three(sp), _three(ks), _three(stride), _three(padding, 0),
                   _three(dilation), _three(ls))


@njit(cache=True, error_model="numpy")
def bias_rows32(y, bias, n, L, key, mode):  # pragma: no cover - compiled
    """A convolution's result ``RND(y + bias)`` as the (n·O·L,) binary32 array of its
    (n, O, L) tensor, from its products ``y`` ((O·n·L,) binary32: output channels, then
    batch and output position, as the group products give them) and ``bias`` ((O,)
    binary32): element (b, c, l) rounded with the bits of ``key`` at its C-order index, as
    ``Ctx.add(products.permute(...), bias.reshape(1, O, 1, ...))`` rounds it (the binary32
    tiles of :func:`numvar.instrument.pointwise.round_into`): the same values without
    that call's broadcast plan and strided reads (fft_filter's convolution of 16
    channels of 2 × 256 with bias: 125 → 105 µs under fuzzy, one thread, Zen 4). The runs
    are slices of 1-D arrays: numba types a row of a 2-D array's slice as any-layout, and
    the tiles compiled for that layout do not vectorise; ``key`` is a uint64 (a Python
    int above 2**63 sends numba's dispatcher to its slow typing, 60 µs a call)."""
    O = bias.size
    ukey = np.uint64(key)
    out = np.empty(n * O * L, np.float32)
    run = np.empty(L, np.float32)
    for c in range(O):
        fill(run, bias[c])
        for b in range(n):
            src = (c * n + b) * L
            dst = (b * O + c) * L
            round_into(K.OP_ADD, y[src:src + L], run, out[dst:dst + L], ukey, dst, mode)
    return out
