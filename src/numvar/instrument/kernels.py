"""Flop-level numba kernels: a randomly rounded matmul and a randomly rounded scan.

Two kernels serve every contraction and every reduction of the ``flop`` granularity:

* :func:`contract` — ``out[b, i, j] = Σ_k a[b % BA, i, k] · b[b % BB, k, j]``, batched.
  Order (documented, tested bit for bit against :func:`contract_reference`): for each
  output element, ``acc = RND(a[i,0]·b[0,j])`` then for k = 1..K-1 in increasing order
  ``acc = RND(acc + RND(a[i,k]·b[k,j]))``. Every product and every add is rounded. Term
  (b, i, k, j) draws ``r = term_bits(key, line, j)`` with ``line = (b·M + i)·K + k``: the
  line hash ``h = bits64(key, line)`` (once per line), then one multiply-xorshift of the
  Weyl sequence ``z = h + j·γ``: ``z ^= z >> 32; z *= MIX1; r = z ^ (z >> 29)`` (the
  constants of splitmix64 [Steele, Lea, Flood 2014]; one 64-bit multiply per term instead
  of two). Its product is rounded with ``r``, its add with ``r`` rotated left by 29 bits
  (the binary32 fast paths use bits 35..63 and 6..34: disjoint). A counter hash with no
  loop-carried state, so the ikj loop vectorises and rows run in parallel.
* :func:`scan` — ``x`` of shape (K, M) reduced (or scanned) along K with add or mul:
  ``acc = x[0, m]``, then ``acc = RND(acc ∘ x[k, m])`` for k = 1..K-1; random bits
  ``bits64(key, k·M + m)``. With ``cumulative`` every partial result is written.

``contraction="fma"`` (:data:`CONTRACTIONS`) changes :func:`contract` to one rounding per
multiply-add, what fused multiply-add hardware (MKL, oneDNN, GPU kernels) does:
``acc = RND(a[i,0]·b[0,j])``, then ``acc = RND(acc + a[i,k]·b[k,j])`` with the product
exact (``numvar.rounding.kernels.fma_f32`` / ``fma_f64``). Random stream: one draw per
term, ``r = term_bits(key, line, j)`` (the same line and term numbering as above; the
first term's product and every multiply-add are rounded with ``r``; ``rot(r)`` is not
used). Half the random draws and roundings of the default ``"separate"``.

Both compute binary32 arrays with binary32 roundings and binary64 arrays with binary64
roundings, at ``t`` significand bits (24 / 53 for the formats' own precision), using the
scalar functions of :mod:`numvar.rounding.kernels`.

Speed (binary32, any t <= 24): rows whose inputs rule out underflow and overflow up
front ("clean" rows, the usual case) run vectorised loops with no range checks and
512-bit vectors where the CPU has them; other rows run loops that check every term (at
24 bits) or the scalar full path (below). Lanes a fast loop cannot round exactly are
redone on the scalar full path. Products with few columns (at most :data:`NARROW_N`, at
least 32 rows; without 512-bit vectors also up to :data:`NARROW_N_AVX2` with whole blocks
of rows: :func:`_narrow32_serves`; 24 bits, ``"separate"``) run the same steps
vectorised across rows instead (:func:`_contract_narrow32`). Every path gives the same bits (tests compare each
with :func:`contract_reference`).

Speed (binary64, 53 bits, sr / ieee / ud / random, ``"separate"``): clean rows (every
nonzero input magnitude in [2**-300, 2**300], see :func:`clean_rows64`) run a vectorised
loop (:func:`_clean64`): TwoProduct by a hardware FMA (``fma(a, b, -a·b)``, the same
exact error as the rounding core's Dekker TwoProduct), TwoSum, and the rounding core's
binary64 step ``_rn64_fast`` written without branches (:func:`_rn64_step`); lanes whose
sums leave its range are redone on the scalar path, as are other rows. Products with
few columns run the same steps vectorised across rows (:func:`_contract_narrow64`). Virtual
precisions below 53 bits, the directed modes and ``"fma"`` take the scalar kernel.

Port-bound ceiling of the binary32 SR clean loop
------------------------------------------------
One pass of the innermost k >= 1 loop of :func:`_clean_loops` (sr, 24 bits) handles 8
terms in 512-bit vectors of 8 float64 lanes. ``b`` reaches the loop widened to float64
(once per call, :func:`contract`), so the product multiplies from memory. Its machine
code (numba's ``inspect_asm`` of ``_clean32`` on an AMD Zen 4, AVX-512) has 25
instructions, of which 20 are vector micro-ops (loads folded into an arithmetic
instruction count once; the pure load, the store and the three scalar loop-control
instructions go to the load/store and integer ports)::

    random bits  vpaddq(h + j·γ, load jg)  vpsrlq 32  vpxorq  vpmullq  vpsrlq 29
                 vpternlogq (r ^ r>>29, then ~r)                              6
    product      vmulpd (load b)                                              1
    SR product   vpsrlq 35  vpaddq  vpandq                                    3
    TwoSum test  vaddpd  vsubpd  vcmpeqpd  vsubpd  vcmpeqpd                   5
    SR add       vpsrlq 6  vpandq  vmovdqa64  vpaddq  vpandq(masked → NaN)    5
                                                                      total  20

(Before, ``b`` was widened in the loop: a ``vcvtps2pd`` per 8 terms, 21 micro-ops, and
that conversion alone costs 1.33 cycles of a 512-bit pipe pair on Zen 4.)

A 512-bit operation occupies one of Zen 4's four 256-bit vector pipes for two cycles,
so at most two 512-bit micro-ops execute per cycle ("two 512-bit ports"; Intel parts
with two 512-bit FMA units have the same bound). The ceiling is therefore
``2 × clock × 8 / 20`` terms per second per core: 0.8 terms per cycle, 2.95 G terms/s
at the 3.69 GHz measured on the reference machine. Which pipes take which instruction
does not lower it: measured with loops of independent 512-bit instructions
(``benchmarks/bench_pipes.py``), Zen 4 runs vmulpd, vpmullq and vcmpeqpd on one pipe
pair only (1 per cycle), vaddpd/vsubpd, vpsrlq and vcvtps2pd on the other (1 per cycle,
vcvtps2pd 1.33 cycles), vpaddq, vpxorq, vpandq and vpternlogq on either (2 per cycle),
and renames a register-to-register vmovdqa64 away (0.19 cycles each): 4 + 7 + 8 pipe
cycles balance in 9.5 cycles per pass, inside the 10 of the count above (which counts
the eliminated move; without it the ceiling is 3.11 G terms/s, and
``bench_kernels.py`` prints both). What separates the loop from either bound is its
dependency chain (about 25 cycles from the ``jg`` load to the store): the same
instructions run in isolation (the loop body as inline assembly, every operand in L1)
at 12.1 cycles per pass, and at 11.5 when two passes are interleaved by hand, which
LLVM does not do here. Handing it two independent chains per iteration does not help
either: a variant of the loop that runs two rows per pass (each ``b`` element loaded
once for both, two rows' hashes, products and sums interleaved in one vectorised
iteration) measured 13.0 cycles per 8 terms against 12.8 for the one-row loop (16 × 288
@ 288 × 1024, every row through the bare loops, thread CPU time, best of 25 interleaved,
clock 3.68 GHz measured in the same process, load average 8). The measured bound is
therefore the dependency chain's: 12.1 cycles per pass for the loop body alone (83 % of
the 10-cycle ceiling), 11.5 with two passes interleaved by hand (87 %); numba's loop
reaches 12.6–12.8 cycles (78–79 %), the 80 % goal (12.5 cycles) not met by 1–2 %.
(Zen 4 now draws the bits in a loop of their own: "Term bits apart on Zen 4" below,
84 % of that loop's model.)

``benchmarks/bench_kernels.py`` recounts the instructions in the code generated on the
host, measures the clock (a chain of dependent integer register adds, one cycle each on
any x86-64 core) and the port-bound ceiling itself (the loop's vector instructions with
their dependencies cut, run as inline assembly: on an Intel Golden Cove core, which
splits ``vpmullq`` into three micro-ops, 11.3 cycles per 8 terms rather than the 10 of
the count above), and prints the fraction of both ceilings :func:`contract` reaches,
timed by the calling thread's CPU time (one core).
See ``docs/speed.md`` for the measured fractions; outside the loop, :func:`contract`
spends the per-k line hash and loop set-up (K passes over N/8 vectors per row), the
first-product loop, the NaN scan, the clean-row test and the widening of ``b`` (one
column tile at a time, into L2). On the Intel Xeon (Golden Cove cores, 2026-12-05)
:func:`contract` reaches 81–83 % of that measured ceiling at 16 × 288 @ 288 × 1024
(the bare loops 85–86 %); the ``"fma"`` loop 84–88 % of its own.

The same count for the other clean loops (``bench_kernels.py`` prints it on the host):
the ``"fma"`` sr loop (:func:`_clean_fma_loops`: term bits 6, exact product 2, TwoSum 6,
the integer decision of :func:`_fma_sr_step` and its range checks ~20) has 34 vector
micro-ops per 8 terms, ceiling ``2 × clock × 8 / 34`` = 1.74 G terms/s at 3.69 GHz;
the binary64 sr loop (:func:`_clean64_loops`: two :func:`_rn64_step` roundings of ~25
micro-ops each, TwoProduct by one ``vfmsub213pd`` plus a multiply, TwoSum, the sum's
range check) has 68, ceiling 0.87 G terms/s.

AVX2 hosts (no AVX-512; measured on an AMD Zen 3, 2026-12-03)
-------------------------------------------------------------
The same loops compile to 256-bit vectors: 4 float64 lanes per pass, 16 registers, no
``vpmullq`` (the hash's 64-bit multiply becomes three ``vpmuludq`` of 32-bit halves, a
shift and two adds: 6 instructions for 1), no ``vpternlogq`` and no mask registers (a
select is a ``vblendvpd``). The binary32 sr loop has 30 vector instructions per pass of
4 terms, 60 per 8 terms against 20 with AVX-512; the "fma" sr loop 65 per pass, 130 per
8 terms (its float64→int64 decision has no vector instruction there: it was four scalar
``vcvttsd2si`` and the shuffles around them, and is now made in float64,
:func:`_below_trunc`; the loop's constants are reloaded from memory each pass, as 16
registers do not hold them); binary64 sr 125 per pass. Zen 3 has four 256-bit vector
pipes, so no two-port model applies: ``bench_kernels.py`` measures the ceiling (the
loop's instructions with their dependencies cut) instead, 13.6–15.7 cycles per 8 terms
for binary32 sr (1.46–1.77 G terms/s at 2.9–3.0 GHz; the measurement moves on a shared
host), 28.2–32.8 for fma (0.73–0.86 G terms/s), 53 for binary64 (0.45 G terms/s). The
kernels reach 0.70–0.85 G terms/s for binary32 sr (41–58 %: the loop's dependency chain,
as on Zen 4), 0.32–0.40 for fma with the int64 decision and 0.41 with the float64 one
(1.22–1.27× on the bare loop, same bits: ``benchmarks/bench_fma_decision.py``), 0.17–0.19
for binary64 (38–68 % of a ceiling measured at 53–83 cycles). So ``contraction="fma"``
runs at about 0.5–0.6× the speed of ``"separate"`` on such a host, where on Zen 4 it is
faster. The rounding semantics, and so the bits, do not depend on the host's vectors.

The term bits in a loop of their own (:func:`_term_bits_row`, 2026-12-03). Every clean
loop's k >= 1 step now draws the bits of its n terms first, into a row buffer, and the
accumulating loop reads them: the hash's chain (three dependent multiplies with AVX2) no
longer precedes the rounding's in one iteration, so the out-of-order core keeps more
passes in flight. Same instructions (57 vector instructions per 8 terms for binary32 sr,
against 60), same bits. Measured on the Zen 3, one thread, thread CPU time, best of 9,
the previous kernel in its own numba cache in the same session: :func:`contract` on
16 × 288 @ 288 × 1024, 256³, 64 × 256 @ 256 × 1024 and 32 × 144 @ 144 × 4096 went from
0.98–1.06 to 1.16–1.29 G terms/s (1.2×); ``bench_kernels.py`` then printed binary32 sr
1.22 G terms/s, 64 % of a ceiling measured at 13.5 cycles per 8 terms (1.91 G terms/s at
3.22 GHz), fma 0.61 (57 %), binary64 0.238 (51 %). A third loop for the rounded products
(the accumulating loop then only adds) was slower: 1.33 → 1.14 G terms/s on the bare
loops. Not measured on Zen 4, where the fused loop was chain-bound too (above).

Term bits apart or inside (:data:`TERM_BITS_APART`, 2026-12-05). On an Intel Xeon with
AVX-512 (Golden Cove class, AVX-512DQ's ``vpmullq``: the hash's multiply is one
instruction) the separate term-bits loop cost more than it saved: the same clean loops
with the bits drawn inside the accumulating loop (:func:`_term_r`, the one-loop form of
before 2026-12-03) ran, one thread, bare loops, cycles per 8 terms, apart → inside, in
two alternating processes each (a scratch script; the same bits): binary32 sr K × n =
16 × 32 45–47 → 18–19, 64 × 64 25 → 14–15, 128 × 128 17–19 → 15–16, 288 × 320 16 → 14–15,
288 × 1024 17–18 → 14; ``"fma"`` 48–54 → 25–26 at 16 × 32, 22–23 → 20–21 at 288 × 1024;
binary64 64–69 → 49–53 at 16 × 32, 43–44 → 44–47 at 288 × 1024. With few columns the
separate loop's body (32 terms per pass) hardly ran. ``bench_kernels.py --narrow``
(column kernel, G terms/s): 48 × 576 × 32 1.0 → 2.1, 256 × 2304 × 24 0.86 → 2.18,
128 × 128 × 64 1.3–1.6 → 2.2–2.3; the narrow kernel's rule for such hosts follows
(:func:`_narrow_rows_fit`). Hosts without AVX-512DQ keep the bits apart (Zen 3 above).

binary64 products in a loop of their own (:data:`PRODUCTS64_APART`, 2026-12-05). On the
same Xeon the binary64 clean loop ran 44 cycles per 8 terms where its instructions, with
every dependency cut, take 32 (``bench_kernels.py``: 71–75 % of that ceiling), whether or
not ``b`` fits in L2, and with the bits apart or inside alike: one iteration's chain
(hash, TwoProduct, rounding, TwoSum, rounding: well over 100 cycles) with some 68 vector
instructions per 8 terms left the scheduler too few independent passes. Splitting a
k-step into a loop of the terms' bits and rounded products (both kept in row buffers)
and a loop of the adds reading them shortens each chain. Bare loops, one thread, ns per
term, one loop → two (three loops, the bits alone first, in parentheses), the same bits:
K × n = 288 × 1024 1.33 → 1.17 (1.21), 128 × 128 1.32 → 1.17 (1.20), 16 × 32 1.45 →
1.32 (1.32), 288 × 320 1.42 → 1.23 (1.25). ``bench_kernels.py`` (16 × 288 @ 288 × 1024):
binary64 sr 0.725 → 0.862 G terms/s, 85 % of the ceiling measured for the two loops
(32.3 cycles per 8 terms, 67 vector instructions). The narrow kernel's binary64 lanes
split the same way (``bench_kernels.py --narrow``: 512 × 576 × 4 0.64 → 0.71 G terms/s,
256 × 576 × 16 0.76 → 0.82). Hosts that draw the bits apart keep one loop (not measured
there).

Term bits apart on Zen 4 (:data:`CLEAN_LOOPS_BITS_APART`, 2026-12-07). The Intel choice
above (bits inside the loops wherever AVX-512DQ makes the hash's multiply one
instruction) was kept on Zen 4 after a check that forced it for every loop at once
(``docs/speed.md``, "The contraction kernel and the zoo on Zen 4 after these changes":
the narrow kernel's rule, which depends on it, then sent 32-column products to the column
kernel, 25 % slower). Apart for the binary32 ``"separate"`` clean loops alone, the other
loops and the narrow rule unchanged, is faster there. Bare loops
(``benchmarks/bench_clean_loops.py``'s "both loops", one thread, cycles per 8 terms,
inside → apart, two alternating processes each, the constant set before compiling):
K × n = 128 × 128 13.4–13.5 → 12.7, 288 × 320 12.6–12.8 → 11.9, 288 × 1024 12.5–12.7 →
11.7–11.8, 64 × 512 12.9 → 12.1–12.3, 576 × 128 12.7 → 11.9–12.0; 64 × 64 16.3 →
16.1–16.5; 16 × 32 42.5 → 44–54. :func:`contract`, one thread, sr, G terms/s, inside →
apart: 16 × 288 × 1024 2.25–2.28 → 2.36–2.38, 64 × 576 × 2048 2.25–2.32 → 2.38–2.41,
16 × 144 × 8192 2.28 → 2.38–2.40, 32 × 288 × 2048 2.29–2.31 → 2.38–2.41, 3 × 16 × 8192
1.85 → 1.91–1.93, 100 × 128 × 256 2.30–2.33 → 2.41–2.44; 8 × 64 × 100 1.34–1.44 →
1.39–1.42; 16 × 64 × 64 1.59–1.60 → 1.51–1.55, 16 × 32 × 32 0.88–0.89 → 0.74–0.80 (the
bits loop's body takes 32 terms per pass: 32 columns run in its remainder). The same
bits (the outputs compared). The split loop's instructions with their dependencies cut
take 9.9–10.0 cycles per 8 terms (21 vector instructions: the bits loop stores them, the
accumulating loop loads them), the fused one's 9.5: ``bench_kernels.py`` measures
:func:`contract` at 79–81 % of the split loop's ceiling (84 % of its model) where the fused
loop reached 72–73 % (76–78 %). The ``"fma"`` loop (1.51 → 1.48 G terms/s apart) and the
binary64 loops (products apart, as on Intel) keep their forms. One form per host: both
forms in one kernel chosen by the tile's width doubled the cold compile of ``_clean32``
(46 → 86 s) for a few µs on products of 32 or 64 columns.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic, overload
from numba.np.ufunc import parallel as _numba_parallel

from numvar.rounding import kernels as K

#: columns per parallel tile of the kernels (keeps one-row products parallel too)
TILE = 1024

#: Work (rounded terms: output elements × K for a product, elements otherwise) below which
#: a parallel kernel runs on the calling thread alone. Waking numba's worker threads costs
#: 10-50 µs on an idle machine and up to ~20 ms per call on a loaded one (measured: 2-core
#: box shared by 8 jobs, OpenMP layer: a 128-element rounding took 20 ms with 2 threads,
#: 2 µs with 1). 2**18 terms take ~0.1 ms on one core (2**18 elements of a pointwise
#: rounding ~0.5 ms): well above an idle machine's wake-up. (It was 2**22, which left a
#: BERT-tiny layer's Q/K/V/output projections, 128×128×128 = 2**21 terms each, and its
#: attention products serial: 10 of its 27 M contraction terms per layer, capping two
#: threads at 1.44× on the contractions.) Results do not depend on it.
PARALLEL_MIN_WORK = 1 << 18


#: the globals of numba's threading-layer module: ``_is_initialized``, and once the layer is
#: up its C functions ``_get_num_threads`` and ``_set_num_threads``, which numba's public
#: functions call after their start-up check (read with ``.get``: a numba without them
#: takes the public functions)
_NUMBA_LAYER = vars(_numba_parallel)


def num_threads() -> int:
    """``numba.get_num_threads()``: this thread's numba thread count. Once numba's
    threading layer is up, read from the layer directly: the public function takes two
    locks per call (its start-up check), 0.75 µs against 0.12, and the kernels' callers
    ask before every compiled call (:func:`launch`); the same value (numba's own
    function returns the layer's value after that check)."""
    get = _NUMBA_LAYER.get("_get_num_threads") if _NUMBA_LAYER.get("_is_initialized") else None
    if get is not None:
        n = get()
        if n > 0:
            return n
    return numba.get_num_threads()


def _set_num_threads(n: int) -> None:
    """``numba.set_num_threads(n)`` for an ``n`` known to be valid (1, or a value
    :func:`num_threads` returned), straight to the threading layer once it is up
    (1.1 µs against 0.35: :func:`launch` sets and restores it around each small
    kernel)."""
    put = _NUMBA_LAYER.get("_set_num_threads") if _NUMBA_LAYER.get("_is_initialized") else None
    if put is not None:
        put(n)
    else:
        numba.set_num_threads(n)


def launch(work: int, fn, *args, **kwargs):
    """Call ``fn`` (a parallel numba kernel, or code calling one) with numba's thread
    count set to 1 for this thread when ``work < PARALLEL_MIN_WORK``; restored after."""
    if work >= PARALLEL_MIN_WORK:
        return fn(*args, **kwargs)
    n = num_threads()
    if n == 1:
        return fn(*args, **kwargs)
    _set_num_threads(1)
    try:
        return fn(*args, **kwargs)
    finally:
        _set_num_threads(n)


def _threads(work: int) -> int:
    """The threads :func:`launch` runs a kernel of ``work`` on."""
    return num_threads() if work >= PARALLEL_MIN_WORK else 1


# bit casts shared with the rounding core (numba intrinsics, one instruction each)
_f64_bits = K._f64_bits
_bits_f64 = K._bits_f64


_LOW29 = np.uint64((1 << 29) - 1)
_NLOW29 = np.uint64(~((1 << 29) - 1) & ((1 << 64) - 1))
_ULP32 = np.uint64(1 << 29)  # one binary32 ulp in the float64 bit pattern (normal range)
_U35 = np.uint64(35)
_U52 = np.uint64(52)
_U63 = np.uint64(63)
_EXPMASK = np.uint64(0x7FF)
_EMIN32 = np.uint64(1023 - 126)
_EMAX32 = np.uint64(1023 + 127)
_G = np.uint64(K.GAMMA)
_M1 = np.uint64(K.MIX1)
_SR, _IEEE, _UD, _RANDOM = K.MODE_SR, K.MODE_IEEE, K.MODE_UD, K.MODE_RANDOM


#: the stream's hash, the rounding core's own inlined functions (one definition; loops
#: that inline them vectorise): ``_bits(key, index)`` is ``bits64``; a vectorised loop over
#: consecutive indices starts from element ``l0``'s Weyl value ``z = _weyl(key, l0)`` and,
#: per element, takes ``_bits_weyl(z)`` (``mix64``) and steps ``z += _G``: the same bits
#: without the index product, a 64-bit multiply that AVX2 does as three ``vpmuludq`` with
#: their shifts and adds (LLVM widens the stepped value as an induction, four lanes ``z,
#: z + γ, z + 2γ, z + 3γ`` plus ``4γ`` per pass; it does not strength-reduce the product
#: itself). Measured on a Zen 3 (docs/speed.md, "The hash's index product as an
#: induction").
_bits, _weyl, _bits_weyl = K.bits64, K.weyl64, K.mix64


_U32 = np.uint64(32)
_U29 = np.uint64(29)
_MASK64 = (1 << 64) - 1


@njit(inline="always")
def _mix(z):
    """:func:`_term`'s mixing of the Weyl value ``z = h + j·γ`` (one 64-bit multiply)."""
    r = (z ^ (z >> _U32)) * _M1
    return r ^ (r >> _U29)


@njit(inline="always")
def _term(h, j):
    """Random bits of term ``j`` of a contraction line whose hash is ``h`` (module doc)."""
    return _mix(h + j * _G)


def term_bits(key: int, line: int, j: int) -> int:
    """Pure-Python :func:`_term` of ``bits64(key, line)``: the random bits of term (line, j)
    of :func:`contract` (the references and tests use it)."""
    h = int(K.bits64(np.uint64(key), np.uint64(line)))
    z = (h + j * K.GAMMA) & _MASK64
    z = ((z ^ (z >> 32)) * K.MIX1) & _MASK64
    return z ^ (z >> 29)


@njit(inline="always")
def _rot(r):
    """The add's random bits from the product's: r rotated left by 29 (the binary32
    fast paths then draw on disjoint bits: 35..63 for the product, 6..34 for the add)."""
    return (r << np.uint64(29)) | (r >> np.uint64(35))


@njit(inline="always")
def _fast32(x, r, mode):
    """binary32 rounding of the exact float64 value ``x`` at 24 bits: (value, ok).

    ``ok`` is False outside the binary32 normal range (strictly above 2**-126 for UD;
    zeros, infinities and NaNs accepted), and for the modes up, down, zero and farthest,
    where the caller takes numvar.rounding's full path. Inside, the result is identical
    to numvar.rounding.kernels.round_f32(x, 0, mode, 24, r): SR adds a 29-bit random
    integer to the float64 pattern and clears the low 29 bits; ieee is the hardware
    cast; random rounds the pattern down or up by the top bit unless exact; UD moves the
    round-to-nearest result one binary32 step by the top bit unless it is 0 or inf. An
    infinity or NaN is returned as it is, cast (the core returns ``hi`` unchanged before
    any mode is looked at: every mode keeps ±inf and NaN), such as a softmax's
    ``x − max`` on the −inf of a masked attention score.
    """
    b = _f64_bits(x)
    be = (b >> _U52) & _EXPMASK
    special = be == _EXPMASK  # inf or NaN
    # flags combined bitwise: `and`/`or` are branches in numba's IR, which LLVM did not
    # always fold back into selects in the vectorised loops (ud tiles 1.2x slower)
    ok = (((be >= _EMIN32) & (be <= _EMAX32)) | (x == 0.0) | special) & (mode <= _RANDOM)
    top = (r >> _U63) == np.uint64(1)
    if mode == _SR:
        v = np.float32(_bits_f64((b + ((~r) >> _U35)) & _NLOW29))
    elif mode == _RANDOM:
        up = ((b & _LOW29) != np.uint64(0)) & top
        v = np.float32(_bits_f64((b & _NLOW29) + (_ULP32 if up else np.uint64(0))))
    elif mode == _UD:
        ok = ok & (be != _EMIN32)
        y = np.float64(np.float32(x))
        yb = _f64_bits(y)
        fin = (y != 0.0) & (abs(y) < np.inf)
        yb = (yb + _ULP32 if top else yb - _ULP32) if fin else yb
        v = np.float32(_bits_f64(yb))
    else:
        v = np.float32(x)
    if special:
        v = np.float32(x)
    return v, ok


_HALF29 = np.uint64(1 << 28)  # half a binary32 ulp in the low bits of a float64 pattern


@njit(inline="always")
def residual_moot(x, r, mode):
    """Whether :func:`_fast32`'s value of the float64 ``x`` with the bits ``r`` (sr, ieee,
    ud, random) is also the rounding core's value of the exact ``x + e`` for every
    residual ``0 < |e| <= ulp64(x)/2``: the TwoSum residual of an inexact float64 sum
    ``x`` of two binary32 values, which the core rounds with ``lo32_fast(x, e)``. So an
    inexact sum need not be declined where this holds (sums of values of very different
    magnitudes: an FFT's products by cos(π/2) added to O(1) parts).

    Proof, for ``H = |x|`` in binary32's normal range, the low 29 bits ``low`` of its
    pattern (the part below a binary32 ulp ``u``: ``H = A + low·u·2**-29``) and ``L`` the
    residual with x's sign taken off (``|L| <= u·2**-30``):

    * sr: ``_fast32`` adds ``w = 2**29 − 1 − q`` (``q = r >> 35``) to the pattern and
      clears the low bits, so it rounds up iff ``low > q``. The core (``lo32_fast``)
      rounds up iff ``(r >> 11) + 1 <= (D + L)/u·2**53`` with ``D = low·u·2**-29``, the
      right side within ``2**23`` of ``low·2**24``: the same decision for ``q <= low − 2``
      and ``q >= low + 1``. For ``low = 0`` and ``L < 0`` the core starts from the
      binary32 predecessor ``A'`` (spacing ``u' = u`` or ``u/2``) with ``(D + L)/u'`` within
      ``2**-29`` of 1: it rounds up (to A, ``_fast32``'s value) unless ``q = 2**29 − 1``.
      So declined: ``q ≡ low`` or ``q ≡ low − 1`` (mod 2**29), i.e. the low 29 bits of
      ``pattern + w`` are 0 or all ones; and, to leave the grid below ``2**-126`` to the
      core, the lowest binade.
    * random (up by the top bit unless exact): the same decision unless ``low = 0``.
    * ieee and ud (round to nearest, ud then one step by the top bit): ``D + L`` is below
      ``u/2`` for ``low < 2**28`` and above it for ``low > 2**28`` (``|L|`` is below half
      a float64 ulp of H), and for ``low = 0`` rounds to A from either side; declined: the
      tie ``low = 2**28``.

    ``tests/test_instrument_pointwise.py::test_inexact_sums_on_the_fast_path`` compares
    the values with the core's at and around every declined case."""
    return _moot(x, (~r) >> _U35, mode)


@njit(inline="always")
def _moot(x, w, mode):
    """:func:`residual_moot` with sr's added 29-bit integer ``w`` (``(~r) >> 35`` for the
    bits ``r`` of :func:`_fast32`; a contraction's sum draws it from other bits of its
    term's, :func:`_round_term`)."""
    b = _f64_bits(x)
    low = b & _LOW29
    if mode == _SR:
        m = (b + w) & _LOW29
        return (m != np.uint64(0)) & (m != _LOW29) & (((b >> _U52) & _EXPMASK) != _EMIN32)
    if mode == _RANDOM:
        return low != np.uint64(0)
    return low != _HALF29


@njit(inline="always")
def _loop32(o, bb, aik, hk, jb, first, mode, bad):
    nbad = 0
    if first:
        for jj in range(o.size):
            p, okp = _fast32(aik * np.float64(bb[jj]), _term(hk, jb + np.uint64(jj)), mode)
            o[jj] = p if okp else o[jj]
            bad[jj] = not okp
            nbad += 0 if okp else 1
        return nbad
    for jj in range(o.size):
        r = _term(hk, jb + np.uint64(jj))
        p, okp = _fast32(aik * np.float64(bb[jj]), r, mode)
        acc = np.float64(o[jj])
        pp = np.float64(p)
        s = acc + pp
        bv = s - acc
        e = (acc - (s - bv)) + (pp - bv)
        v, oks = _fast32(s, _rot(r), mode)
        ok = okp & oks & (e == 0.0)  # (bitwise: _fast32)
        o[jj] = v if ok else o[jj]
        bad[jj] = not ok
        nbad += 0 if ok else 1
    return nbad


@njit(inline="always")
def _step32(acc, x, r, mode):
    """One fast k-step ``RND(acc + RND(x))`` (x = the exact product): (value, ok)."""
    p, okp = _fast32(x, r, mode)
    pp = np.float64(p)
    s = acc + pp
    bv = s - acc
    e = (acc - (s - bv)) + (pp - bv)
    v, oks = _fast32(s, _rot(r), mode)
    return np.float64(v), okp & oks & (e == 0.0)  # (bitwise: _fast32)


@njit(inline="always")
def _loop32x2(o, b0, b1, a0, a1, h0, h1, jb, mode, bad):
    """Two k-steps per pass over the tile (the accumulator stays in a register between
    them: half the loads and stores of ``o``). An element rejected at either step is
    flagged and both steps are redone on the full path."""
    nbad = 0
    for jj in range(o.size):
        j = jb + np.uint64(jj)
        acc, ok0 = _step32(np.float64(o[jj]), a0 * np.float64(b0[jj]), _term(h0, j), mode)
        acc, ok1 = _step32(acc, a1 * np.float64(b1[jj]), _term(h1, j), mode)
        ok = ok0 & ok1
        o[jj] = np.float32(acc) if ok else o[jj]
        bad[jj] = not ok
        nbad += 0 if ok else 1
    return nbad


# 512-bit vectors for the function that calls it (see numvar.rounding.kernels)
_wide_vectors = K.wide_vectors


@intrinsic
def _b2f32(typingctx, x):
    """A binary32 bit pattern (the low 32 bits of an unsigned integer) as the float it
    encodes, widened to float64."""
    if not isinstance(x, types.Integer) or x.signed:
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if x.bitwidth != 32:
            v = builder.trunc(v, context.get_value_type(types.uint32))
        f = builder.bitcast(v, context.get_value_type(types.float32))
        return builder.fpext(f, context.get_value_type(types.float64))

    return types.float64(x), codegen


# ------------------------------------------------------------ clean rows (no range checks)
#: A row of a binary32 product at t <= 24 bits is *clean* when every input of the row (and
#: of ``b``) is finite and either every product is ±0, or every nonzero product has
#: magnitude >= 2**-102, K <= 2**19 and K·max|a|·max|b|·(1 + 2**(2-t))**(2K) <= 2**120.
#: Then (i) every product is exact in float64 and lies in binary32's normal range; (ii)
#: with sr, ieee and random every rounded product and every accumulator is a multiple of
#: 2**-125 (nonzero products are at least 2**-102, a point of every t-bit grid; a grid
#: spacing below 2**-125 only occurs below 2**(t-126), where a multiple of 2**-125 has at
#: most t significant bits and is left unchanged; coarser grids are made of such
#: multiples), so no nonzero sum falls below 2**-125: the binary32 normal range; (iii)
#: every rounding grows a magnitude by at most 1 + 2**(2-t) (ud: a step of one unit after
#: rounding to nearest), so |acc| stays below 2**120 times that growth over 2K roundings:
#: far from overflow. The fast path then needs no range checks; what remains is the
#: exactness of each float64 sum, checked per term (an inexact lane is poisoned with NaN
#: and recomputed on the full path), and for ud, which perturbs exact results, the lower
#: range of each sum.
_CLEAN_MIN = 2.0 ** -102
_CLEAN_MAX = 2.0 ** 120
_CLEAN_KMAX = 1 << 19
_UD_MIN = 2.0 ** -125


@njit(inline="always")
def _grid32(x, u, top, mode):
    """:func:`_fast32` without its range check, as float64 (the binary32 value exactly),
    for exact float64 values ``x`` in binary32's normal range (above 2**-125 for ud).
    ``u`` is SR's 29-bit integer (``(~r) >> 35`` of the bits ``r`` :func:`_fast32` takes)
    and ``top`` the top bit of ``r`` (random, ud)."""
    b = _f64_bits(x)
    if mode == _SR:
        return _bits_f64((b + u) & _NLOW29)
    if mode == _RANDOM:
        up = ((b & _LOW29) != np.uint64(0)) & top
        return _bits_f64((b & _NLOW29) + (_ULP32 if up else np.uint64(0)))
    if mode == _UD:
        y = np.float64(np.float32(x))
        yb = _f64_bits(y)
        yb = (yb + _ULP32 if top else yb - _ULP32) if y != 0.0 else yb
        return _bits_f64(yb)
    return np.float64(np.float32(x))


_U6 = np.uint64(6)
_U34 = np.uint64(34)
_ONE = np.uint64(1)


@njit(inline="always")
def _round_term(x, r, mode, t, add):
    """The clean loops' rounding of a term's product (``add`` False) or sum at ``t`` bits,
    with the bits of :func:`_term` (``add``: of :func:`_rot`). At 24 bits the add's bits
    are taken from ``r`` by shifts (``(~rot(r)) >> 35 = ((~r) >> 6) & (2**29 - 1)``, top
    bit of ``rot(r)`` = bit 34 of ``r``): LLVM turns the rotation into a second 64-bit
    multiply."""
    if t == 24:
        if add:
            return _grid32(x, ((~r) >> _U6) & _LOW29, ((r >> _U34) & _ONE) == _ONE, mode)
        return _grid32(x, (~r) >> _U35, (r >> _U63) == _ONE, mode)
    return _gridt(x, _rot(r) if add else r, mode, t)


@njit(inline="always")
def _clean_first(acc, jg, arow, bmat, ukey, base, j0, n, mode, t, exact=False):
    """The first product of every lane of a clean row tile, rounded into ``acc`` (k = 0
    of :func:`_clean_loops` and :func:`_clean_fma_loops`; ``exact`` as there)."""
    a0 = np.float64(arow[0])
    b0 = bmat[0, j0:j0 + n]  # row slices indexed from 0: this form vectorises best
    h0 = _bits(ukey, base)
    for jj in range(n):
        acc[jj] = a0 * np.float64(b0[jj]) if exact else _round_term(
            a0 * np.float64(b0[jj]), _mix(h0 + jg[jj]), mode, t, False)


@njit(inline="always")
def _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, mode, t, exact=False, moot=False):
    """Every k-step of one clean row tile into ``acc`` (float64, binary32 values at ``t``
    bits). A lane whose float64 sum is inexact (or, for ud, below its fast step's range
    and nonzero) becomes NaN and stays NaN (the inputs are finite, so NaN marks exactly
    those lanes). Same bits as :func:`_term`/:func:`_rot`, one 64-bit multiply per term
    (``jg[jj] = (j0 + jj)·γ`` is precomputed).

    With ``exact`` (a constant; sr, ieee and random only): every product is exact at
    ``t`` bits (:func:`narrow_products`), so its rounding, which returns an exact value
    unchanged whatever the random bits, is skipped: the same bits, fewer operations."""
    ud_min = _UD_MIN if t == 24 else _UD_MIN_T
    _clean_first(acc, jg, arow, bmat, ukey, base, j0, n, mode, t, exact)
    rb = np.empty(n, np.uint64)
    for k in range(1, arow.size):
        ak = np.float64(arow[k])
        bk = bmat[k, j0:j0 + n]
        hk = _bits(ukey, base + np.uint64(k))
        _term_bits_row(rb, hk, jg, n, mode, CLEAN_LOOPS_BITS_APART)
        for jj in range(n):
            acc[jj] = _clean_step(acc[jj], ak * np.float64(bk[jj]),
                                  _term_r(rb, hk, jg, jj, CLEAN_LOOPS_BITS_APART),
                                  mode, t, exact, ud_min, moot)


@njit(inline="always")
def _term_bits_row(rb, hk, jg, n, mode, apart):
    """``rb[jj]`` = the bits of term (k, j0 + jj) (:func:`_mix` of ``hk + jg[jj]``), for
    every lane of a clean row tile, in a loop of their own (none for ieee, which draws
    none). The clean loops read them from ``rb``: the hash's dependency chain (its 64-bit
    multiply is three on AVX2) then no longer sits in front of the rounding's, and the
    out-of-order core overlaps more passes (the fused loop was bound by that chain, not by
    its ports: the module docstring). Measured on a Zen 3 (AVX2, one thread, one row tile
    of K = 288 by 512 columns through the bare loops, best of 5): binary32 sr 1.05 → 1.34
    G terms/s, fma 0.59 → 0.64, binary64 0.224 → 0.239; the same bits.
    ``benchmarks/bench_kernels.py`` prints what :func:`contract` reaches.

    The narrow loops (:func:`_narrow_loops`) draw a (k, column) step's bits for their
    NARROW_ROWS row lanes the same way, with the roles swapped: ``hk`` the column's
    ``j·γ`` and ``jg`` the lanes' line hashes (the Weyl sum is the same): 1.08–1.16×
    on Zen 3 (docs/speed.md, "Products with few columns")."""
    if mode != _IEEE and apart:
        for jj in range(n):
            rb[jj] = _mix(hk + jg[jj])


@njit(inline="always")
def _term_r(rb, hk, jg, jj, apart):
    """The bits of lane ``jj``'s term in a k-step whose line hash is ``hk``: drawn by
    :func:`_term_bits_row` into ``rb`` (``apart``: the caller's compile-time switch,
    :data:`CLEAN_LOOPS_BITS_APART` or :data:`TERM_BITS_APART`), or here, in the
    accumulating loop (the same :func:`_mix` of ``hk + jg[jj]``)."""
    return rb[jj] if apart else _mix(hk + jg[jj])


@njit(inline="always")
def _clean_step(c, p, r, mode, t, exact, ud_min, moot=False):
    """One k >= 1 step of a clean lane: ``RND(c + RND(p))`` for the accumulator ``c`` and
    the exact product ``p`` with the term's bits ``r`` (``exact``: ``p`` is on the grid,
    its rounding skipped), or NaN where the float64 sum is inexact (for ud: also below
    ``ud_min`` and nonzero). A NaN accumulator stays NaN. With ``moot`` (24 bits): an
    inexact sum whose residual cannot change its rounding (:func:`_moot`, with the sum's
    bits of :func:`_round_term`) is taken too (:func:`_cleanm32`)."""
    if not exact:
        p = _round_term(p, r, mode, t, False)
    s = c + p
    ok = (s - c == p) & (s - p == c)
    if moot:
        ok = ok | _moot(s, ((~r) >> _U6) & _LOW29, mode)
    if mode == _UD:
        ok = ok & ((abs(s) >= ud_min) | (s == 0.0))
    v = _round_term(s, r, mode, t, True)
    return v if ok else np.nan


_SIGN = np.uint64(1 << 63)
_EXPBITS = np.uint64(0x7FF << 52)
_LO32P = np.uint64((1023 - 126) << 52)  # the float64 pattern of 2**-126
_SPAN32P = np.uint64(254 << 52)  # 2**128's pattern minus 2**-126's
_S76 = np.uint64(2122 << 52)  # minus a biased exponent e: the bits of 2**(76-e)
_U11 = np.uint64(11)


def _vector_int64_conversion() -> bool:
    """Whether numba's target CPU converts float64 vectors to int64 in one instruction
    (AVX-512DQ's ``vcvttpd2qq``). AVX2 has no such instruction: LLVM converts lane by lane
    (four scalar ``vcvttsd2si`` and the shuffles around them per 256-bit vector)."""
    return _cpu_feature("avx512dq")


def _cpu_feature(name: str) -> bool:
    """Whether numba's target CPU has the LLVM feature ``name`` (``NUMBA_CPU_FEATURES``
    where set, else the host's)."""
    cpu = numba.config.CPU_FEATURES
    if cpu:  # NUMBA_CPU_FEATURES set: what numba compiles for
        return f"+{name}" in cpu.split(",")
    try:
        import llvmlite.binding as llvm

        return bool(llvm.get_host_cpu_features().get(name))
    except Exception:  # pragma: no cover - depends on llvmlite
        return True


#: :func:`_fma_sr_step` decides in int64 where the CPU converts vectors to int64, else in
#: float64 (the same decision; a compile-time constant of the kernels, and numba's cache is
#: kept per CPU)
VECTOR_INT64 = _vector_int64_conversion()
#: 512-bit vectors (AVX-512F): which products take the narrow kernel (:data:`NARROW_N_AVX2`)
VECTORS_512 = _cpu_feature("avx512f")
#: whether the ``"fma"`` and binary64 clean loops and the narrow loops draw a k-step's
#: term bits in a loop of their own (:func:`_term_bits_row`) or inside the accumulating
#: loop (:func:`_term_r`): apart where the hash's 64-bit multiply is three instructions
#: (no AVX-512DQ ``vpmullq``), inside where it is one. The same bits either way; a
#: compile-time constant of the kernels (numba's cache is kept per CPU). Measured: module
#: docstring, "Term bits apart or inside". (The binary32 ``"separate"`` clean loops:
#: :data:`CLEAN_LOOPS_BITS_APART`.)
TERM_BITS_APART = not _cpu_feature("avx512dq")
#: the CPUs (LLVM's names) on which :func:`_clean_loops` draws the term bits apart although
#: they have AVX-512DQ: AMD Zen 4, where the fused loop is bound by its dependency chain
#: rather than its ports and the split one runs 4–6 % faster on row tiles of 128 columns
#: and more, 4–13 % slower on 32 or 64 (module docstring, "Term bits apart on Zen 4").
#: Intel's AVX-512 cores keep them inside (measured 1.1–2.5× slower apart); Zen 5
#: (full-width 512-bit pipes) was not measured.
CLEAN_LOOPS_APART_CPUS = ("znver4",)


def _cpu_name() -> str:
    """The CPU numba compiles for (LLVM's name: ``NUMBA_CPU_NAME`` where set to one,
    else the host's)."""
    name = numba.config.CPU_NAME
    if name and name != "host":
        return name
    try:
        import llvmlite.binding as llvm

        return llvm.get_host_cpu_name()
    except Exception:  # pragma: no cover - depends on llvmlite
        return ""


#: whether the binary32 ``"separate"`` clean loops (:func:`_clean_loops`: the column
#: kernel's clean rows, every mode) draw a k-step's term bits in a loop of their own: as
#: :data:`TERM_BITS_APART`, and on :data:`CLEAN_LOOPS_APART_CPUS`. The same bits either
#: way; a compile-time constant of the kernels (numba's cache is kept per CPU). One form
#: per host: both forms in one kernel, chosen by the tile's width (apart loses on 32 or
#: 64 columns, module docstring), doubled the compile of ``_clean32`` (46 → 86 s cold).
CLEAN_LOOPS_BITS_APART = TERM_BITS_APART or _cpu_name() in CLEAN_LOOPS_APART_CPUS
#: whether the binary64 clean loops (:func:`_clean64_loops`) round a k-step's products in
#: a loop of their own, with the term bits (kept for the adds), before the loop of the
#: adds; or round products and adds in one loop (with the bits drawn as
#: :data:`TERM_BITS_APART` says). Split where the bits are drawn inside the loops
#: (AVX-512DQ): the one loop's dependency chain (hash, TwoProduct, rounding, TwoSum,
#: rounding; some 68 vector instructions per 8 terms) kept fewer passes in flight than
#: its ports allow (module docstring, "binary64 products in a loop of their own"). The
#: same bits either way; a compile-time constant of the kernels.
PRODUCTS64_APART = not TERM_BITS_APART
_MAGIC52 = np.uint64(0x4330000000000000)  # the float64 pattern of 2**52
_TWO52 = 2.0 ** 52


@njit(inline="always")
def _u53_f64(q):
    """An integer ``q < 2**53`` as float64, exactly, with no int64 conversion: 2·(q >> 1) +
    (q & 1), each part below 2**52 placed in 2**52's significand and 2**52 taken off."""
    hi = _bits_f64((q >> _ONE) | _MAGIC52) - _TWO52
    lo = _bits_f64((q & _ONE) | _MAGIC52) - _TWO52
    return (hi + hi) + lo


@njit(inline="always")
def _below_trunc(q, thr):
    """``q < trunc(thr)`` for ``q = r >> 11`` (below 2**53) and a float64 ``thr`` in
    int64's range: as ``int64(q) < int64(thr)`` where that is one vector instruction
    (:data:`VECTOR_INT64`), else as ``q + 1 <= thr`` in float64. The same for every such
    thr: q + 1 is an integer (exact in float64, at most 2**53), so q < trunc(thr) ⟺
    q + 1 <= trunc(thr) ⟺ q + 1 <= thr for thr >= 0, and both are false for thr < 0."""
    if VECTOR_INT64:
        return np.int64(q) < np.int64(thr)
    return _u53_f64(q) + 1.0 <= thr


@njit(inline="always")
def _fma_sr_step(s, e, r, mode):
    """SR or random rounding to binary32 (24 bits) of the exact sum ``s + e`` (TwoSum
    output) by integer arithmetic on the bit patterns: (value as float64, ok).

    The rounding core's decision (``round_core`` at k = 0, t = p = 24, identical to
    ``numvar.rounding.kernels.lo32_fast``): for ``H = |s|`` of exponent ``E`` in
    binary32's normal range, ``u = 2**(E-23)``, ``A`` = H with its low 29 bits cleared,
    ``D = H - A``, ``L = ±e`` (the sign of s taken off), ``s' = RN(D + L)``: SR rounds up
    iff ``float(r >> 11) + 1 <= (s'/u)·2**53``. Here ``thr = s'·2**(76-E)`` is that
    right-hand side, exact (a power-of-two scaling, no underflow for the clean rows'
    multiples of 2**-149), and ``q + 1 <= thr`` for the integer ``q = r >> 11`` is
    ``q < trunc(thr)`` (:func:`_below_trunc`). An exact sum (``e == 0``) gives
    ``thr = low29(H)·2**24``, the ``separate`` loops' add-and-truncate decision. ``random``
    rounds up on the top bit unless exact. ``ok`` is False outside binary32's normal range
    (zero kept) and where ``s`` lies on the grid with the exact value below it (``thr <
    0``: ``D = 0``, ``L < 0``; round_core then steps down a possibly finer grid)."""
    sb = _f64_bits(s)
    sign = sb & _SIGN
    ab = sb ^ sign
    ok = ((ab - _LO32P) < _SPAN32P) | (s == 0.0)
    A = _bits_f64(ab & _NLOW29)
    L = _bits_f64(_f64_bits(e) ^ sign)
    low = ab & _LOW29
    if mode == _SR:
        thr = ((_bits_f64(ab) - A) + L) * _bits_f64(_S76 - (ab & _EXPBITS))
        up = _below_trunc(r >> _U11, thr)
        ok = ok & (thr >= 0.0)
    else:
        up = ((r >> _U63) == _ONE) & ((low != np.uint64(0)) | (e != 0.0))
        ok = ok & ((low != np.uint64(0)) | (L >= 0.0))
    return _bits_f64((sb & _NLOW29) + (_ULP32 if up else np.uint64(0))), ok


@njit(inline="always")
def _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, mode, t):
    """:func:`_clean_loops` for ``contraction="fma"``: one rounding per multiply-add,
    ``RND(acc + a·b)`` with the exact product and the term's bits ``r``. The float64 sum
    of a 24-bit accumulator and a 48-bit product is often inexact; its TwoSum residual
    ``e`` is rounded with it: sr and random at 24 bits by :func:`_fma_sr_step` (integer
    decision, no branch), ieee and ud at 24 bits by the rounding core's residual fast path
    (``numvar.rounding.kernels.lo32_fast``, identical to ``round_core`` where it accepts,
    as the core's ``narrow_fma`` rounds); below 24 bits an inexact lane is recomputed.
    Its sums can cancel below binary32's normal range (the products are not on the
    2**-125 grid), so every mode checks the range of the sum (at least 2**-126, 2**-125
    for ud at 24 bits, or zero)."""
    ud_min = _UD_MIN if t == 24 else _UD_MIN_T
    fma_min = ud_min if (mode == _UD or t != 24) else _UD_MIN_T
    _clean_first(acc, jg, arow, bmat, ukey, base, j0, n, mode, t)
    rb = np.empty(n, np.uint64)
    for k in range(1, arow.size):
        ak = np.float64(arow[k])
        bk = bmat[k, j0:j0 + n]
        hk = _bits(ukey, base + np.uint64(k))
        _term_bits_row(rb, hk, jg, n, mode, TERM_BITS_APART)
        for jj in range(n):
            r = _term_r(rb, hk, jg, jj, TERM_BITS_APART)
            p = ak * np.float64(bk[jj])  # exact
            c = acc[jj]
            s = c + p
            bv = s - c
            e = (c - (s - bv)) + (p - bv)  # TwoSum: s + e = c + p exactly
            if t == 24 and (mode == _SR or mode == _RANDOM):
                v, ok = _fma_sr_step(s, e, r, mode)
                acc[jj] = v if ok else np.nan
                continue
            ok = (e == 0.0) & ((abs(s) >= fma_min) | (s == 0.0))
            v = _round_term(s, r, mode, t, False)
            if t == 24:  # an inexact float64 sum: the core's residual path
                w, okw = K.lo32_fast(s, e, r, mode)
                v = v if e == 0.0 else np.float64(w)
                ok = ok | ((e != 0.0) & okw)
            acc[jj] = v if ok else np.nan


@njit(cache=True)
def _clean32(acc, jg, arow, bmat, ukey, base, j0, n, mode):  # pragma: no cover - compiled
    """:func:`_clean_loops` at 24 bits with the mode folded into a constant (one
    vectorised copy per mode) and 512-bit vectors allowed."""
    _wide_vectors()
    if mode == _SR:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _SR, 24)
    elif mode == _IEEE:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _IEEE, 24)
    elif mode == _UD:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _UD, 24)
    else:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _RANDOM, 24)


@njit(cache=True)
def _cleanm32(acc, jg, arow, bmat, ukey, base, j0, n):  # pragma: no cover - compiled
    """:func:`_clean32` in sr taking the inexact float64 sums whose residual cannot change
    the rounding (``moot``): run again on a row tile where many lanes of :func:`_clean32`
    gave up (:func:`_settle_row32`). sr only: each mode's copy of the clean loops costs
    about 14 s of cold compile (four: 55 s more in ``tests/_warmup.py``, AMD Zen 4), and
    sr is the mode of the realizations; the others keep the full path for those lanes."""
    _wide_vectors()
    _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _SR, 24, False, True)


#: a clean row tile of binary32 in sr at 24 bits (``"separate"``) in which more than one
#: lane in RERUN_SHARE gave up (an inexact float64 sum: a term below 2**-29 of the sum so
#: far, such as the product of an activation's tiny tail, and then every column of that
#: row) is run again on :func:`_cleanm32` before the lanes left go to the full path
#: (:func:`_column32`, about 12 times a vectorised term's cost per term). A compile-time
#: constant of the kernels; 0: never.
RERUN_SHARE = 10

_UD_MIN_T = 2.0 ** -126


@njit(cache=True)
def _cleanx32(acc, jg, arow, bmat, ukey, base, j0, n, mode):  # pragma: no cover - compiled
    """:func:`_clean_loops` at 24 bits for rows whose products are all exact in binary32
    (``exact``: the product roundings skipped), sr, ieee and random: one vectorised copy
    per mode, 512-bit vectors allowed. Same bits as :func:`_clean32`."""
    _wide_vectors()
    if mode == _SR:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _SR, 24, True)
    elif mode == _IEEE:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _IEEE, 24, True)
    else:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _RANDOM, 24, True)


@njit(cache=True)
def _cleanfma32(acc, jg, arow, bmat, ukey, base, j0, n, mode, t):  # pragma: no cover
    """:func:`_clean_loops` with ``fma``: one vectorised copy per mode, 24 bits folded
    into a constant (t < 24: one more copy per mode), 512-bit vectors allowed."""
    _wide_vectors()
    if mode == _SR:
        if t == 24:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _SR, 24)
        else:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _SR, t)
    elif mode == _IEEE:
        if t == 24:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _IEEE, 24)
        else:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _IEEE, t)
    elif mode == _UD:
        if t == 24:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _UD, 24)
        else:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _UD, t)
    else:
        if t == 24:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _RANDOM, 24)
        else:
            _clean_fma_loops(acc, jg, arow, bmat, ukey, base, j0, n, _RANDOM, t)


@njit(inline="always")
def _gridt(x, r, mode, t):
    """Rounding at ``t`` < 24 bits of the exact float64 value ``x``, zero or in binary32's
    normal range with no overflow: the rounding core's integer fast path (``_fast_bits``,
    whose ud step is written here without branches: below 24 bits it has no special
    case), and zero kept (the core leaves ±0 unchanged in every mode)."""
    b = _f64_bits(x)
    if mode == _UD:
        nb = np.uint64(53 - t)
        one = np.uint64(1) << nb
        mask = one - np.uint64(1)
        lsb = (b >> nb) & np.uint64(1) if t > 1 else np.uint64(1)
        y = (b + ((one >> np.uint64(1)) - np.uint64(1)) + lsb) & ~mask
        y = y + one if (r >> _U63) == np.uint64(1) else y - one
        return _bits_f64(b if x == 0.0 else y)
    return _bits_f64(K._fast_bits(b, mode, t, 24, -126, 127, r))


@njit(cache=True)
def _cleant32(acc, jg, arow, bmat, ukey, base, j0, n, mode, t):  # pragma: no cover
    """:func:`_clean_loops` at ``t`` < 24 bits, one vectorised copy per mode, 512-bit
    vectors allowed (ud gives up on sums below 2**-126, where the core's integer fast
    path ends)."""
    _wide_vectors()
    if mode == _SR:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _SR, t)
    elif mode == _IEEE:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _IEEE, t)
    elif mode == _UD:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _UD, t)
    else:
        _clean_loops(acc, jg, arow, bmat, ukey, base, j0, n, _RANDOM, t)


@njit
def _column32(arow, bmat, ukey, base, j, mode, t, fma=False):  # pragma: no cover - compiled
    """One output element on the full path (numvar.rounding's scalar functions): the
    reference's loop, for the lanes a fast path gives up on (``fma``: one rounding per
    multiply-add, see the module docstring). Callers pass ``t`` and ``fma`` as runtime
    values (``np.int64(24)``, ``np.bool_(False)`` for constants): a literal would compile
    one more copy per value."""
    uj = np.uint64(j)
    acc = np.float32(0.0)
    for k in range(arow.size):
        r = _term(_bits(ukey, base + np.uint64(k)), uj)
        if fma and k > 0:
            acc = K.fma_f32(np.float64(arow[k]), np.float64(bmat[k, j]), np.float64(acc),
                            mode, t, r)
            continue
        p = K.mul_f32(np.float64(arow[k]), np.float64(bmat[k, j]), mode, t, r)
        acc = p if k == 0 else K.add_f32(np.float64(acc), np.float64(p), mode, t, _rot(r))
    return acc


_ABS32 = np.uint32(0x7FFFFFFF)
_ONE32 = np.uint32(1)
_INF32 = np.uint32(0x7F800000)


@njit(inline="always")
def _absbits(x):
    """(max, min nonzero) of the magnitudes' bit patterns of a contiguous binary32 array
    (integer reductions: they vectorise; patterns of non-negative floats order as the
    floats; min is 0xFFFFFFFF when every element is ±0): :func:`_row_stats` without the
    fraction field."""
    hi, lo, _ = _row_stats(x.view(np.uint32))
    return hi, lo


@njit(inline="always")
def _is_clean(ahi, alo, bhi, blo, Kd, t):
    """Clean-row test (see above) on (max, min nonzero) magnitude patterns of a and b."""
    if ahi >= _INF32 or bhi >= _INF32:  # inf or NaN
        return False
    if ahi == np.uint32(0) or bhi == np.uint32(0):  # every product is ±0
        return True
    amax, amin = _b2f32(ahi), _b2f32(alo)
    bmax, bmin = _b2f32(bhi), _b2f32(blo)
    if amin * bmin < _CLEAN_MIN or Kd > _CLEAN_KMAX:
        return False
    growth = math.exp(2.0 * Kd * math.log1p(2.0 ** (2 - t)))  # inf when huge: not clean
    return amax * bmax * Kd * growth <= _CLEAN_MAX


@njit(cache=True)
def clean_rows(a, b, BO, t):  # pragma: no cover - compiled
    """Which rows ``(bo, i)`` (flattened ``bo·M + i``) of a binary32 product at ``t`` bits
    of ``a`` (BA, M, K) and ``b`` (BB, K, N) with batch BO are clean (see above): the
    serial reference of the clean flags :func:`_prepare32` computes for :func:`contract`."""
    BA, M, Kd = a.shape
    BB = b.shape[0]
    bst = np.empty((BB, 2), dtype=np.uint32)
    for bb in range(BB):
        bst[bb, 0], bst[bb, 1] = _absbits(b[bb].reshape(-1))
    ast = np.empty((BA, M, 2), dtype=np.uint32)
    for ba in range(BA):
        for i in range(M):
            ast[ba, i, 0], ast[ba, i, 1] = _absbits(a[ba, i])
    out = np.empty(BO * M, dtype=np.bool_)
    for bo in range(BO):
        for i in range(M):
            sa = ast[bo % BA, i]
            sb = bst[bo % BB]
            out[bo * M + i] = _is_clean(sa[0], sa[1], sb[0], sb[1], Kd, t)
    return out


@njit(inline="always")
def _row_stats(u):
    """(max, min nonzero, OR of the fraction fields) of the magnitudes' bit patterns of
    one contiguous row of binary32 patterns ``u``: :func:`_absbits` and
    :func:`_fraction_or` in one pass. Every intermediate is cast back to uint32: numba
    widens uint32 arithmetic to uint64, and the loop then ran in 64-bit lanes with its
    ``max``/``min`` half scalar, 0.27 ns per element (in :func:`_prepare32`, 71 of its
    140 µs for a 288 × 1024 ``b``, one thread); in 32-bit lanes (``vpmaxud``/``vpminud``)
    0.08 ns."""
    hi = np.uint32(0)
    lo = np.uint32(0xFFFFFFFF)
    fo = np.uint32(0)
    for i in range(u.size):
        x = u[i]
        m = np.uint32(x & _ABS32)
        hi = max(hi, m)
        mm = np.uint32(m - _ONE32)  # ±0 wraps to 0xFFFFFFFF: ignored
        lo = min(lo, mm)
        fo = np.uint32(fo | x)
    return hi, lo + _ONE32 if lo != np.uint32(0xFFFFFFFF) else lo, fo & _FRAC32


_FRAC32 = np.uint32(0x7FFFFF)


#: elements of ``b`` per task of :func:`_prepare32`
PREPARE_CHUNK = 8192


@njit(parallel=True, cache=True)
def _prepare32(a, b, BO, t):  # pragma: no cover - compiled
    """What :func:`contract` needs before a binary32 product, in one parallel pass over
    ``a`` (BA, M, K) and ``b`` (BB, K, N): the clean rows (the same as
    :func:`clean_rows`) and the OR of the fraction fields of ``a`` and of ``b`` (for
    :func:`narrow_products`). Before, these ran on the calling thread alone
    (:func:`clean_rows`, :func:`_narrow_bits`): about 4 % of a ResNet forward at flop, a
    serial part that two threads could not shrink. (It widened ``b`` to float64 too, until
    :func:`_contract_fast32` widened its column tiles itself.) ``b``'s statistics
    are per batch, so its tasks are runs of rows of about :data:`PREPARE_CHUNK` elements
    (one task per row of ``b`` cost 64 µs for a 4096 × 4 classifier head, whose rows are
    4 elements; 7 µs in runs). Returns (clean, the significant bits bound of a's values
    plus b's, see :func:`_sig_bits`)."""
    BA, M, Kd = a.shape
    BB, _, N = b.shape
    bu = b.reshape(BB * Kd * N).view(np.uint32)
    rows = max(1, PREPARE_CHUNK // max(N, 1))  # rows of b per task
    nch = (Kd + rows - 1) // rows
    bst = np.empty((BB * nch, 3), dtype=np.uint32)
    for task in prange(BB * nch):
        bb = task // nch
        k0 = (task - bb * nch) * rows
        k1 = min(Kd, k0 + rows)
        s0 = (bb * Kd + k0) * N
        s1 = (bb * Kd + k1) * N
        bst[task, 0], bst[task, 1], bst[task, 2] = _row_stats(bu[s0:s1])
    au = a.reshape(BA * M, Kd).view(np.uint32)
    ast = np.empty((BA * M, 3), dtype=np.uint32)
    for r in prange(BA * M):
        ast[r, 0], ast[r, 1], ast[r, 2] = _row_stats(au[r])
    bsum = np.empty((BB, 2), dtype=np.uint32)
    fb = np.uint32(0)
    for bb in range(BB):
        hi = np.uint32(0)
        lo = np.uint32(0xFFFFFFFF)
        for c in range(bb * nch, (bb + 1) * nch):
            hi = max(hi, bst[c, 0])
            lo = min(lo, bst[c, 1])
            fb |= bst[c, 2]
        bsum[bb, 0], bsum[bb, 1] = hi, lo
    fa = np.uint32(0)
    for r in range(BA * M):
        fa |= ast[r, 2]
    clean = np.empty(BO * M, dtype=np.bool_)
    for bo in range(BO):
        for i in range(M):
            sa = ast[(bo % BA) * M + i]
            sb = bsum[bo % BB]
            clean[bo * M + i] = _is_clean(sa[0], sa[1], sb[0], sb[1], Kd, t)
    return clean, _sig_bits(fa) + _sig_bits(fb)


@njit
def _full_step(o, bb, aik, hk, jb, first, mode, t, bad):  # pragma: no cover - compiled
    """One k-step on the full path (numvar.rounding.kernels) for the flagged elements of a
    tile. Not inlined: one copy serves every mode (it is rarely taken)."""
    for jj in range(o.size):
        if bad[jj]:
            r = _term(hk, jb + np.uint64(jj))
            p = K.mul_f32(aik, np.float64(bb[jj]), mode, t, r)
            if first:
                o[jj] = p
            else:
                o[jj] = K.add_f32(np.float64(o[jj]), np.float64(p), mode, t, _rot(r))


@njit(inline="always")
def _tile_fast(o, arow, bmat, ukey, base, N, j0, mode, t, bad, pairs):
    """All k-steps of one row tile ``o`` (= out[b, i, j0:j0+len]) on the binary32 fast
    path, with the full path for the elements it rejects. With ``pairs`` (a constant),
    two k-steps per pass; an element rejected in a pair still holds its value from before
    the pair: both steps are redone. Same results either way."""
    Kd = arow.size
    n = o.size
    jb = np.uint64(j0)
    # the mode and the flag as runtime values for the full path: constants would be
    # literal types, and numba would compile _full_step once per mode and flag (measured:
    # six copies, 46 s of _tile32's 105 s cold) where one copy serves them all
    full_mode = np.int64(mode)
    later = np.bool_(False)
    k = 0
    while k < Kd:
        if k == 0 or k + 1 == Kd or not pairs:  # first product, last odd step: one at a time
            aik = np.float64(arow[k])
            bb = bmat[k, j0:j0 + n]
            hk = _bits(ukey, base + np.uint64(k))
            if _loop32(o, bb, aik, hk, jb, k == 0, mode, bad) != 0:
                _full_step(o, bb, aik, hk, jb, k == 0, full_mode, t, bad)
            k += 1
            continue
        a0 = np.float64(arow[k])
        a1 = np.float64(arow[k + 1])
        b0 = bmat[k, j0:j0 + n]
        b1 = bmat[k + 1, j0:j0 + n]
        h0 = _bits(ukey, base + np.uint64(k))
        h1 = _bits(ukey, base + np.uint64(k + 1))
        if _loop32x2(o, b0, b1, a0, a1, h0, h1, jb, mode, bad) != 0:
            _full_step(o, b0, a0, h0, jb, later, full_mode, t, bad)
            _full_step(o, b1, a1, h1, jb, later, full_mode, t, bad)
        k += 2


@njit(cache=True)
def _tile32(o, arow, bmat, ukey, base, N, j0, mode, t, bad):  # pragma: no cover - compiled
    """One row tile, binary32 at 24 bits. One copy of the loops per mode (constants
    folded) so that LLVM vectorises each; slices indexed from 0 for the same reason.
    Two k-steps per pass for sr and ieee only: it triples the compile time (cold CI)."""
    _wide_vectors()
    if mode == _SR:
        _tile_fast(o, arow, bmat, ukey, base, N, j0, _SR, t, bad, True)
    elif mode == _IEEE:
        _tile_fast(o, arow, bmat, ukey, base, N, j0, _IEEE, t, bad, True)
    elif mode == _UD:
        _tile_fast(o, arow, bmat, ukey, base, N, j0, _UD, t, bad, False)
    else:
        _tile_fast(o, arow, bmat, ukey, base, N, j0, _RANDOM, t, bad, False)


#: bytes of a widened column tile of b (float64) the clean-row tasks stream per k-pass
#: set, kept within L2
CLEAN_TILE_BYTES = 768 * 1024


@njit(cache=True)
def clean_tile(K):  # pragma: no cover - compiled
    """Columns per task of :func:`_contract_fast32`: ``TILE`` (1024), narrowed so that a
    task's widened tile of ``b`` (K × columns × 8 bytes) stays within ``CLEAN_TILE_BYTES``,
    but never below 256 columns (the per-k set-up then dominates)."""
    w = (CLEAN_TILE_BYTES // (8 * max(K, 1))) // 64 * 64
    return max(256, min(TILE, w))


@njit(parallel=True, cache=True)
def _contract_fast32(a, b, clean, out, key, mode, t, fma=False, exact=False,
                     nchunk=1):  # pragma: no cover
    """binary32 at t <= 24 bits. Clean rows (see above): vectorised loops without range
    checks on ``b``'s column tile widened to float64 (the loops then multiply from memory
    instead of widening every element of ``b`` once per row; same products), NaN-poisoned
    lanes recomputed on the full path. Other rows: at 24 bits the checked fast path per
    tile, full path for its rejects; below, the full path.
    ``fma``: one rounding per multiply-add (clean rows vectorised, other rows on the
    full path). ``exact`` (separate, t = 24, sr/ieee/random; see :func:`narrow_products`):
    clean rows skip the product roundings. ``nchunk``: the threads it runs on (numba
    gives each thread an equal contiguous range of a parallel loop's iterations); any
    value gives the same bits."""
    BO, M, N = out.shape
    Kd = b.shape[1]
    tw = clean_tile(Kd)
    ntile = (N + tw - 1) // tw
    ukey = np.uint64(key)
    # tasks batch-major, then column tile, then row, in ``nchunk`` contiguous chunks, one
    # per thread: consecutive tasks share one column tile of b, which a chunk widens once
    # into its own (K, w) block ``bt`` (K × w float64, within L2: clean_tile). In the
    # plain (K, N) layout a tile's rows lie N·8 bytes apart: for N = 2048 a 256-column
    # tile's rows fall into 256 of a 2 MB, 16-way L2's 2048 sets, and a K = 576 tile
    # (1.2 MB) thrashed the L2 (16–20 % slower than in its own block). Widening b whole
    # before the call (_prepare32, until 2026-12-05) wrote and read back 8 bytes per
    # element through memory: 0.1 of 2.1 ms at 16 × 288 × 1024. The chunk's row buffers
    # are allocated once and the column hashes computed once per tile (an allocation per
    # task was 4–10 % of small products, e.g. attention's 8 × 32 × 16 @ 16 × 32).
    # Every element is computed by one task from its own counter-based bits: the order,
    # the chunks and the tile width change no bit.
    ntask = BO * M * ntile
    nch = max(1, min(nchunk, ntask))
    wmax = min(N, tw)
    for c in prange(nch):
        acc = np.empty(wmax)
        jg = np.empty(wmax, dtype=np.uint64)
        bad = np.empty(wmax, dtype=np.bool_)
        bt = np.empty(Kd * wmax)
        held = (-1, -1)  # (the first column of the tile whose hashes jg holds,
        #                   the batch of b times ntile plus the tile that bt holds)
        for task in range(c * ntask // nch, (c + 1) * ntask // nch):
            held = _fast32_task(a, b, clean, out, ukey, mode, t, fma, exact, task, ntile,
                                tw, acc, jg, bad, bt, held)


@njit(inline="always")
def _clean_row32(o, acc, jg, arow, bk, bmat, ukey, base, j0, n, mode, t, fma, exact):
    """Columns ``j0 .. j0+n−1`` of the clean binary32 output row ``o`` (``a``'s row
    ``arow``, the batch's ``b`` ``bmat``): the clean loops over ``bk`` (those columns of
    ``b`` widened, a (K, n) block) into ``acc``, with the column hashes ``jg``; NaN lanes
    (the loops gave up) from the full path (:func:`_column32`)."""
    if fma:
        _cleanfma32(acc, jg, arow, bk, ukey, base, 0, n, mode, t)
    elif exact:
        _cleanx32(acc, jg, arow, bk, ukey, base, 0, n, mode)
    elif t == 24:
        _clean32(acc, jg, arow, bk, ukey, base, 0, n, mode)
    else:
        _cleant32(acc, jg, arow, bk, ukey, base, 0, n, mode, t)
    _settle_row32(o, acc, jg, arow, bk, bmat, ukey, base, j0, n, mode, t, fma)


@njit(inline="always")
def _settle_row32(o, acc, jg, arow, bk, bmat, ukey, base, j0, n, mode, t, fma):
    """Columns ``j0 .. j0+n−1`` of ``o`` from the clean loops' lanes ``acc``: a NaN lane
    (the loops gave up) from the full path (:func:`_column32`), after the tile is run
    again on :func:`_cleanm32` where more than one lane in :data:`RERUN_SHARE` gave up
    (binary32 in sr at 24 bits, ``"separate"``). Each lane's value depends only on its
    terms, so the same bits."""
    if RERUN_SHARE and not fma and t == 24 and mode == _SR:
        nan = 0
        for jj in range(n):
            nan += 0 if acc[jj] == acc[jj] else 1
        if nan * RERUN_SHARE > n:
            _cleanm32(acc, jg, arow, bk, ukey, base, 0, n)
    for jj in range(n):
        v = acc[jj]
        if v == v:
            o[j0 + jj] = np.float32(v)
        else:
            o[j0 + jj] = _column32(arow, bmat, ukey, base, j0 + jj, mode, t, fma)


@njit(inline="always")
def _fast32_task(a, b, clean, out, ukey, mode, t, fma, exact, task, ntile, tw, acc, jg,
                 bad, bt, held):
    """Task ``task`` of :func:`_contract_fast32` (one row of one batch, one column tile)
    with its chunk's row buffers: ``held`` = (the first column of the tile whose column
    hashes ``jg`` holds, the tile of b widened in ``bt`` as ``bb·ntile + tile``; -1:
    none). Returns ``held`` after the task."""
    _, M, N = out.shape
    Kd = b.shape[1]
    bo = task // (M * ntile)
    rem = task - bo * (M * ntile)
    tile = rem // M
    i = rem - tile * M
    row = bo * M + i
    j0 = tile * tw
    j1 = min(N, j0 + tw)
    n = j1 - j0
    arow = a[bo % a.shape[0], i]
    bb = bo % b.shape[0]
    base = np.uint64(row) * np.uint64(Kd)
    o = out[bo, i]
    jg_j0, bt_tile = held
    if clean[row]:
        if j0 != jg_j0:
            for jj in range(n):
                jg[jj] = np.uint64(j0 + jj) * _G
            jg_j0 = j0
        if bb * ntile + tile != bt_tile:  # the tile's own (K, n) block, widened
            bt_tile = bb * ntile + tile
            for k in range(Kd):
                src = b[bb, k, j0:j1]
                dst = bt[k * n:(k + 1) * n]
                for jj in range(n):
                    dst[jj] = np.float64(src[jj])
        _clean_row32(o, acc, jg, arow, bt[:Kd * n].reshape(Kd, n), b[bb], ukey, base, j0, n,
                     mode, t, fma, exact)
        return jg_j0, bt_tile
    if fma:
        for jj in range(n):
            o[j0 + jj] = _column32(arow, b[bb], ukey, base, j0 + jj, mode, t, fma)
    elif t == 24:
        _tile32(o[j0:j1], arow, b[bb], ukey, base, N, j0, mode, 24, bad[:n])
    else:
        for jj in range(n):
            o[j0 + jj] = _column32(arow, b[bb], ukey, base, j0 + jj, mode, t, fma)
    return jg_j0, bt_tile


# ------------------------------------------------------------ narrow products (few columns)
#: widest product (columns N) whose clean rows :func:`_contract_narrow32` computes instead
#: of :func:`_contract_fast32`. The clean loops vectorise across the columns of a row; with
#: fewer than 16 columns their vectorised body (8 lanes, unrolled) does not run and the
#: columns go through its scalar remainder (measured, one thread: 512 × 4608 @ 4608 × 8,
#: ResNet-18's last convolutions on a 2 × 64² batch, 0.88 G terms/s against 1.9 for wide
#: products; ``benchmarks/bench_kernels.py --narrow``).
NARROW_N = 16
#: on CPUs without 512-bit vectors (:data:`VECTORS_512` false), binary32 products of up to
#: this many columns take :func:`_contract_narrow32` too, when their rows fill whole blocks
#: (:func:`_narrow_rows_fit`), enough blocks for every thread, and are not all-exact products
#: (those take the column kernel's copy without product roundings). The column kernel's
#: 4-lane float64 vectors (AVX2) serve a few dozen columns poorly; measured 2026-12-04 on
#: AMD Zen 3, one thread, M = 64–512, K = 64–576: N = 24, 32, 48, 64, 96, 128 ran 1.38,
#: 1.37, 1.26, 1.22, 1.14, 1.11× faster narrow (1.19–1.34 against 0.86–1.20 G terms/s),
#: the same bits; with 32 rows (then half a block of 64) 0.85× (``benchmarks/bench_kernels.py
#: --narrow``). On AVX-512 the column kernel's 8 lanes keep NARROW_N.
NARROW_N_AVX2 = 128
#: the same with 512-bit vectors and the term bits drawn inside the loops
#: (:data:`TERM_BITS_APART` false), for rows in whole blocks of 64 and a last partial
#: block of at most NARROW_TAIL rows (computed row by row): measured 2026-12-05 on an
#: Intel Xeon (AVX-512DQ), one thread, sr, column kernel's time ÷ the narrow one's,
#: M = 64, 128, 192, 512, K = 32, 64, 576: N = 24 1.12–1.36, N = 32 1.14–1.18, 64
#: 1.07–1.16, 256 1.05–1.14, 1024 1.02–1.20; M = 66, 72, 80, 130, 136, K = 64 and 256,
#: N = 16–256: 1.05–1.30; partial blocks of lanes lose (48 and 96 rows 0.77–0.89;
#: docs/speed.md, "Whole blocks of rows across the columns on AVX-512").
#: Wider products were not measured (the block's accumulators, N × 64 float64, leave L2).
NARROW_N_512 = 1024
#: rows of a block of :func:`_contract_narrow32` and :func:`_contract_narrow64`: the vector
#: lanes of their loops (a constant, so that the loops over them have a fixed trip count
#: and no remainder). Eight float64 vectors either way: 64 lanes with 512-bit vectors, 32
#: with AVX2's 256-bit ones. Measured on AMD Zen 3 (AVX2, one thread, 2026-12-05): blocks
#: of 32 rows ran attention-sized products 1.4–1.8× faster than half-filled blocks of 64
#: (8 × 32 × 32 @ 32 × 16 0.58 → 0.99 G terms/s, 8 × 32 × 64 @ 64 × 16 0.61 → 1.11) and
#: products of whole blocks as fast (512 × 4608 @ 4608 × 8 1.11 / 1.12, 128³ 1.37 / 1.36);
#: docs/speed.md, "Blocks of 32 rows on AVX2". Neither the block nor its size changes a bit.
NARROW_ROWS = 64 if VECTORS_512 else 32
#: k-steps per transposed block of ``a`` (NARROW_KC × NARROW_ROWS float64: at most 16 KiB,
#: in L1)
NARROW_KC = 32
#: a last, partial block of at most this many rows (a quarter of a block) is computed row
#: by row (vectorised across the columns: a clean row on the clean loops, another on
#: :func:`_tile32`) instead of as a block of NARROW_ROWS lanes, most of them repeats whose
#: values are dropped (attention's 65 = 64 + 1 rows ran at half speed)
NARROW_TAIL = NARROW_ROWS // 4


def _narrow_rows_fit(M: int, N: int) -> bool:
    """Whether ``M`` rows fill the narrow kernels' blocks well enough for a product of
    ``N`` columns. With 512-bit vectors: at least half a block (N ≤ :data:`NARROW_N`).
    Without: at least three quarters of a block for N ≤ NARROW_N; for more columns,
    where the column kernel is less far behind, whole blocks, and a last partial block
    either of at most an eighth of a block (computed row by row) or at least three
    quarters full. With 512-bit vectors and the term bits inside the column loops
    (:data:`TERM_BITS_APART` false), from 8 columns: three quarters of a block; more than
    :data:`NARROW_N` columns (up to :data:`NARROW_N_512`): whole blocks, and a last
    partial block of at most :data:`NARROW_TAIL` rows (computed row by row). Measured
    on AMD Zen 3 with blocks of 32 (column kernel's time ÷ the
    narrow one's, K = 64 and 576, N = 4–128): M = 16 at N = 16 0.75–0.86; M = 24–28
    1.1–2.7; last blocks of 8 and 16 rows at N ≥ 32 0.69–1.22, of 1, 4 and 24 rows
    0.98–2.2, whole blocks 1.1–2.4 (docs/speed.md, "Blocks of 32 rows on AVX2")."""
    L = NARROW_ROWS
    if VECTORS_512 and (TERM_BITS_APART or N < 8):
        return N <= NARROW_N and M >= L // 2
    if VECTORS_512:
        # the column kernel with the term bits inside its loop and a full 8-lane vector
        # per row: narrow from three quarters of a block (measured on an Intel Xeon with
        # AVX-512, one thread, narrow ÷ column: N = 8 and 16 with 32 rows 0.75–0.87, 40
        # rows 0.92, 48 rows 0.90–1.09, 56 and 64 rows 1.04–1.96; N = 4: 2.2–3.1 from
        # 32 rows; ``benchmarks/bench_kernels.py --narrow``); more columns: whole blocks
        # and a last partial block of at most NARROW_TAIL rows (row by row)
        if N > NARROW_N:
            return M >= L and M % L <= NARROW_TAIL
        return M >= 3 * L // 4
    if N <= NARROW_N:
        return M >= 3 * L // 4
    r = M % L
    return M >= L and (r <= L // 8 or r >= 3 * L // 4)


@njit(inline="always")
def _narrow_loops(acc, at, bmat, hb, hk, k0, kc, mode, wide):
    """k-steps ``k0 .. k0+kc−1`` of a block of NARROW_ROWS clean rows, every column,
    vectorised across the rows: ``acc[j, l]`` is the accumulator of row ``l`` and column
    ``j`` (float64), ``at[kk, l]`` the row's ``a[k0 + kk]`` as float64, ``bmat`` the (K, N)
    product's ``b`` as float64 and ``hb[l]`` the Weyl value of the row's first line
    ``row·K`` (``key + (row·K + 1)·γ``: line ``row·K + k``'s hash is
    ``_bits_weyl(hb[l] + k·γ)``, one multiply fewer per line). Each lane runs the clean
    loops' steps with the same random bits; only the loop order differs (the line hash of
    (row, k) is drawn once per row and k and serves the N columns). ``wide`` false:
    binary32 at 24 bits, the steps of :func:`_clean_first` and :func:`_clean_step`
    (:func:`_narrow32`); true: binary64 at 53 bits, those of :func:`_clean64_loops`, NaN
    where a sum left the step's range (:func:`_narrow64`)."""
    N = acc.shape[0]
    rb = np.empty(NARROW_ROWS, np.uint64)
    pb = np.empty(NARROW_ROWS if wide and PRODUCTS64_APART else 0)
    for kk in range(kc):
        k = k0 + kk
        gk = np.uint64(k) * _G
        for lane in range(NARROW_ROWS):
            hk[lane] = _bits_weyl(hb[lane] + gk)
        ak = at[kk]
        for j in range(N):
            bkj = bmat[k, j]
            row = acc[j]
            # the terms' bits as in the clean loops (in a loop of their own or inside
            # the rounding loop: TERM_BITS_APART)
            gj = np.uint64(j) * _G
            _term_bits_row(rb, gj, hk, NARROW_ROWS, mode, TERM_BITS_APART)
            if wide and k == 0:  # binary64: _clean64_loops' steps
                for lane in range(NARROW_ROWS):
                    r = _term_r(rb, gj, hk, lane, TERM_BITS_APART)
                    row[lane] = _product64(ak[lane], bkj, r, mode)
            elif wide and PRODUCTS64_APART:  # products, then adds (_clean64_loops)
                for lane in range(NARROW_ROWS):
                    r = _term_r(rb, gj, hk, lane, TERM_BITS_APART)
                    rb[lane] = r
                    pb[lane] = _product64(ak[lane], bkj, r, mode)
                for lane in range(NARROW_ROWS):
                    row[lane] = _sum64_step(row[lane], pb[lane], rb[lane], mode)
            elif wide:
                for lane in range(NARROW_ROWS):
                    r = _term_r(rb, gj, hk, lane, TERM_BITS_APART)
                    row[lane] = _sum64_step(row[lane], _product64(ak[lane], bkj, r, mode), r,
                                            mode)
            elif k == 0:
                for lane in range(NARROW_ROWS):
                    r = _term_r(rb, gj, hk, lane, TERM_BITS_APART)
                    row[lane] = _round_term(ak[lane] * bkj, r, mode, 24, False)
            else:
                for lane in range(NARROW_ROWS):
                    r = _term_r(rb, gj, hk, lane, TERM_BITS_APART)
                    row[lane] = _clean_step(row[lane], ak[lane] * bkj, r, mode, 24, False,
                                            _UD_MIN)


@njit(cache=True)
def _narrow32(acc, at, bmat, hb, hk, k0, kc, mode):  # pragma: no cover - compiled
    """:func:`_narrow_loops` at 24 bits, one vectorised copy per mode (as :func:`_clean32`),
    512-bit vectors allowed. Products that are all exact (bfloat16 values) take it too:
    rounding an exact product leaves it unchanged (same bits); a copy without the product
    roundings, as :func:`_cleanx32`, measured 43 s of cold compile on the 2-core CI box for
    a few per cent of a bfloat16 ResNet's forward, and was left out."""
    _wide_vectors()
    if mode == _SR:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _SR, False)
    elif mode == _IEEE:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _IEEE, False)
    elif mode == _UD:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _UD, False)
    else:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _RANDOM, False)


#: rows of ``b`` per task of :func:`_untransposed32`, and the side of its square blocks
UNTRANSPOSE_ROWS = 8


@njit(parallel=True, cache=True)
def _untransposed32(bt, b, b64):  # pragma: no cover - compiled
    """``b`` (BB·K·N,) ← the (BB, K, N) matrix whose transpose is ``bt`` (BB, N, K)
    C-contiguous, in C order, and ``b64`` (the same size, or empty) ← b widened to
    float64: a linear layer's ``weight.t()`` as the product kernels read it. One task per
    :data:`UNTRANSPOSE_ROWS` rows of b, transposed in square blocks with constant trip
    counts, then widened while in cache. Measured (AMD Zen 4, one thread): 128 × 512 and
    512 × 128 weights 28–30 µs, 128 × 128 8 µs, against 51–124 and 14 for torch's
    transposing copy and numpy's ``astype`` after it (docs/speed.md, "A linear layer's
    weight read as it lies and its bias in its product's call"). The rows are 1-D slices
    of flat arrays (a row of a 2-D slice is any-layout to numba, and its loops do not
    vectorise)."""
    BB, N, Kd = bt.shape
    R = UNTRANSPOSE_ROWS
    nkb = (Kd + R - 1) // R
    wide = b64.size > 0
    for task in prange(BB * nkb):
        bb = task // nkb
        k0 = (task - bb * nkb) * R
        k1 = min(Kd, k0 + R)
        src = bt[bb]
        r0 = (bb * Kd + k0) * N
        n0 = 0
        if k1 - k0 == R:
            while n0 + R <= N:
                for kk in range(R):
                    dst = b[r0 + kk * N + n0:r0 + kk * N + n0 + R]
                    for nn in range(R):
                        dst[nn] = src[n0 + nn, k0 + kk]
                n0 += R
        for k in range(k0, k1):
            for n in range(n0, N):
                b[(bb * Kd + k) * N + n] = src[n, k]
        if wide:
            r1 = (bb * Kd + k1) * N
            d64 = b64[r0:r1]
            s32 = b[r0:r1]
            for i in range(d64.size):
                d64[i] = np.float64(s32[i])


def _transposed(b: np.ndarray):
    """``b``'s transpose (BB, N, K) where it is C-contiguous and b is not (b a transposed
    view: ``weight.t()``), else None."""
    if b.flags.c_contiguous:
        return None
    bt = b.transpose(0, 2, 1)
    return bt if bt.flags.c_contiguous else None


def _c_order32(b: np.ndarray, wide: bool):
    """(``b`` C-contiguous, b widened to float64 as a flat array or None) for a binary32
    ``b`` (BB, K, N): a transposed view through :func:`_untransposed32` (on numba's
    threads from 2**15 elements), any other layout by numpy. The same values."""
    bt = _transposed(b)
    if bt is not None:
        flat = np.empty(b.size, np.float32)
        b64 = np.empty(b.size if wide else 0)
        launch(8 * b.size, _untransposed32, bt, flat, b64)
        return flat.reshape(b.shape), (b64 if wide else None)
    b = np.ascontiguousarray(b)
    return b, (b.astype(np.float64).reshape(-1) if wide else None)


@njit(cache=True)
def _transpose_block(at, arows, i0, i1, k0, kc):  # pragma: no cover - compiled
    """``at[kk, lane] = a[i0 + lane, k0 + kk]`` as float64 for the NARROW_ROWS lanes and
    ``kc`` k-steps of a block of :func:`_contract_narrow32` (rows past ``i1`` repeat row
    ``i1 − 1``). A full block has constant trip counts, which LLVM turns into vector
    shuffles: 0.3 ns per element against 1.1–2.5 for the general loop (measured, one
    thread, 512 × 4608 float32). Not inlined: inside the parallel kernel the same loops
    ran at half that speed."""
    if i1 - i0 == NARROW_ROWS and kc == NARROW_KC:
        for lane in range(NARROW_ROWS):
            src = arows[i0 + lane, k0:k0 + NARROW_KC]
            for kk in range(NARROW_KC):
                at[kk, lane] = np.float64(src[kk])
        return
    for lane in range(NARROW_ROWS):
        src = arows[min(i0 + lane, i1 - 1)]
        for kk in range(kc):
            at[kk, lane] = np.float64(src[k0 + kk])


@njit(inline="always")
def _narrow_block(arows, bmat, ukey, row0, i0, i1, mode, wide):
    """The (N, NARROW_ROWS) accumulators of rows ``i0 .. i1−1`` of ``arows`` (one batch's
    ``a``; output rows ``row0 + i``) times ``bmat`` ((K, N) float64) on the narrow loops:
    ``a`` transposed NARROW_KC k-steps at a time, the lanes' Weyl values set (lanes past
    ``i1`` repeat row ``i1 − 1``), then :func:`_narrow32` (``wide`` false) or
    :func:`_narrow64` (``wide`` true) per k block."""
    L = NARROW_ROWS
    Kd, N = bmat.shape
    acc = np.empty((N, L))
    at = np.empty((NARROW_KC, L))
    hb = np.empty(L, dtype=np.uint64)
    hk = np.empty(L, dtype=np.uint64)
    for lane in range(L):  # the Weyl value of the lane's line (row, 0): _bits_weyl
        hb[lane] = ukey + (np.uint64(row0 + min(i0 + lane, i1 - 1)) * np.uint64(Kd)
                           + np.uint64(1)) * _G
    for k0 in range(0, Kd, NARROW_KC):
        kc = min(NARROW_KC, Kd - k0)
        _transpose_block(at, arows, i0, i1, k0, kc)
        if wide:
            _narrow64(acc, at, bmat, hb, hk, k0, kc, mode)
        else:
            _narrow32(acc, at, bmat, hb, hk, k0, kc, mode)
    return acc


@njit(inline="always")
def _narrow_tail32(a, b, b64, clean, out, ukey, mode, bo, i0, i1):
    """Rows ``i0 .. i1−1`` of batch ``bo`` of :func:`_contract_narrow32` row by row: clean
    rows on the column loops (as :func:`_contract_fast32` computes them, one column tile
    of all N columns), the others on :func:`_tile32`."""
    _, M, N = out.shape
    Kd = b.shape[1]
    arows = a[bo % a.shape[0]]
    bb = bo % b.shape[0]
    bw = b64[bb * Kd * N:(bb + 1) * Kd * N].reshape(Kd, N)  # b widened
    bad = np.empty(N, dtype=np.bool_)
    racc = np.empty(N)
    jg = np.empty(N, dtype=np.uint64)
    for jj in range(N):
        jg[jj] = np.uint64(jj) * _G
    for i in range(i0, i1):
        row = bo * M + i
        base = np.uint64(row) * np.uint64(Kd)
        if clean[row]:
            _clean_row32(out[bo, i], racc, jg, arows[i], bw, b[bb], ukey, base, 0, N,
                         mode, np.int64(24), np.bool_(False), np.bool_(False))
        else:
            _tile32(out[bo, i], arows[i], b[bb], ukey, base, N, np.int64(0), mode, 24, bad)


@njit(parallel=True, cache=True)
def _contract_narrow32(a, b, b64, clean, out, key, mode):  # pragma: no cover
    """:func:`_contract_fast32` at 24 bits, ``"separate"``, for products with few columns
    (:func:`_narrow32_serves`): one task per block of NARROW_ROWS rows of one batch. The
    block's rows are the lanes of :func:`_narrow32` (``a`` transposed NARROW_KC k-steps at
    a time; a last, partial block repeats its last row in the missing lanes, whose values
    are dropped, or, of at most :data:`NARROW_TAIL` rows, is computed row by row as
    :func:`_contract_fast32` computes a row of one column tile, :func:`_narrow_tail32`). A
    clean row takes its lanes' values, and its NaN lanes (inexact sums) from the full path
    (:func:`_column32`); another row is computed as :func:`_contract_fast32` computes it
    (:func:`_tile32`). Same bits.

    A tail after at least one whole block is computed by the task of the batch's last
    whole block, not by a task of its own: numba hands each thread an equal contiguous
    range of tasks, and ViT's 2 × 65 = 130 rows made three tasks, two blocks on one thread
    and the two tail rows on the other (no gain from a second thread)."""
    nblk, joined = narrow_split(out.shape[1])
    ukey = np.uint64(key)
    for task in prange(out.shape[0] * nblk):
        narrow32_task(a, b, b64, clean, out, ukey, mode, task, nblk, joined)


@njit(inline="always")
def narrow_split(M):
    """(blocks per batch, whether a short tail joins the last whole block's task) of
    :func:`_contract_narrow32` and :func:`_contract_narrow64` for ``M`` rows: their
    tasks are batch × block."""
    L = NARROW_ROWS
    tail = M % L
    joined = M >= L and 0 < tail <= NARROW_TAIL  # the tail runs in the last block's task
    return (M // L if joined else (M + L - 1) // L), joined


@njit(inline="always")
def _narrow_block_rows(task, nblk, M):
    """(batch, first row, end row) of the block of narrow task ``task``."""
    bo = task // nblk
    i0 = (task - bo * nblk) * NARROW_ROWS
    return bo, i0, min(M, i0 + NARROW_ROWS)


@njit(inline="always")
def narrow32_task(a, b, b64, clean, out, ukey, mode, task, nblk, joined):
    """Task ``task`` of :func:`_contract_narrow32` (``nblk``, ``joined``:
    :func:`narrow_split`); returns (its batch, the first and the end row of ``out`` it
    wrote there), for a caller that finishes those rows in the same task
    (``dense_kernels.linear32``)."""
    _, M, N = out.shape
    Kd = b.shape[1]
    L = NARROW_ROWS
    bo, i0, i1 = _narrow_block_rows(task, nblk, M)
    if i1 - i0 <= NARROW_TAIL and i1 - i0 < L:
        _narrow_tail32(a, b, b64, clean, out, ukey, mode, bo, i0, i1)
        return bo, i0, i1
    arows = a[bo % a.shape[0]]
    bb = bo % b.shape[0]
    bw = b64[bb * Kd * N:(bb + 1) * Kd * N].reshape(Kd, N)  # b widened
    acc = _narrow_block(arows, bw, ukey, bo * M, i0, i1, mode, False)
    racc = np.empty(N)
    jg = np.empty(N if RERUN_SHARE else 0, dtype=np.uint64)
    for j in range(jg.size):
        jg[j] = np.uint64(j) * _G
    for lane in range(i1 - i0):
        i = i0 + lane
        row = bo * M + i
        base = np.uint64(row) * np.uint64(Kd)
        o = out[bo, i]
        if clean[row]:
            for j in range(N):
                racc[j] = acc[j, lane]
            # (the row's lanes as one row tile: _clean_row32's NaN lanes)
            _settle_row32(o, racc, jg, arows[i], bw, b[bb], ukey, base, 0, N, mode,
                          np.int64(24), np.bool_(False))
        else:
            bad = np.empty(N, dtype=np.bool_)
            # j0 as int64, not the literal 0: the signature _contract_fast32 compiles
            _tile32(o, arows[i], b[bb], ukey, base, N, np.int64(0), mode, 24, bad)
    if joined and i1 == nblk * L:
        _narrow_tail32(a, b, b64, clean, out, ukey, mode, bo, i1, M)
        return bo, i0, M
    return bo, i0, i1


# ------------------------------------------------------- few lanes (few rows × few columns)
#: most outputs per batch (rows × columns) of a binary32 product that :func:`contract`
#: computes with :func:`_contract_few32`, one scalar chain per output, eight interleaved
FEW_LANES = 8
#: fewest terms per output (K) for :func:`_contract_few32`, which also needs two rows or
#: more. Measured (AMD Zen 4, one thread, sr, ``benchmarks/bench_kernels.py --few``: µs
#: per call, this kernel with b a transposed view / the column kernel with b contiguous):
#: 2 × 4096 @ 4096 × 4 50 / 103, 4 × 1024 @ 1024 × 2 20 / 40, 8 × 512 @ 512 × 1 14 / 38,
#: 2 × 128 @ 128 × 4 9.8 / 12.9. One row (1 × 4096 @ 4096 × 8 or × 1) gained only 5–9 %:
#: it keeps the column kernel. Below K = 128 the gain is a few µs, and the tests' small
#: products keep the column kernel
FEW_K = 128
#: k-steps per block of :func:`_contract_few32` (its product and bit buffers, 8 lanes ×
#: FEW_KC float64 and uint64: 32 KiB, in L1/L2)
FEW_KC = 256
#: products with few outputs and long rows through :func:`_contract_few32` (same bits
#: either way; False: through :func:`_contract_fast32`, which the tests compare it with)
FEW_KERNEL = True


def few_lanes(M: int, N: int, K: int) -> bool:
    """Whether a product of M rows and N columns per batch, K terms each, has the shape
    :func:`_contract_few32` serves (the other conditions, binary32 at 24 bits in sr,
    ``"separate"``, below ``PARALLEL_MIN_WORK`` terms, are :func:`contract`'s)."""
    return FEW_KERNEL and M >= 2 and M * N <= FEW_LANES and K >= FEW_K


@njit(inline="always")
def _few_products(a, bt, P, R, H, ba, bb, M, N, Kd, row0, k0, kc, ukey, mode):
    """:func:`_contract_few32`'s first pass over the k-steps ``k0 .. k0+kc−1``: for every
    lane l = i·N + j (row i, column j of batch ``row0 // M``), its terms' bits
    ``R[l·FEW_KC + kk]`` (:func:`_term` of the line hash of (row, k), drawn once per row
    and k-step into ``H``) and its rounded products ``P[l·FEW_KC + kk]`` (the clean loops'
    :func:`_round_term`), in loops over k that vectorise (``bt`` is ``b`` transposed: a
    column's k-steps are contiguous)."""
    for i in range(M):
        base = np.uint64((row0 + i) * Kd + k0)
        for kk in range(kc):
            H[kk] = _bits(ukey, base + np.uint64(kk))
        arow = a[ba, i, k0:k0 + kc]
        for j in range(N):
            l0 = (i * N + j) * FEW_KC
            jg = np.uint64(j) * _G
            bcol = bt[bb, j, k0:k0 + kc]
            for kk in range(kc):
                r = _mix(H[kk] + jg)
                R[l0 + kk] = r
                P[l0 + kk] = _round_term(np.float64(arow[kk]) * np.float64(bcol[kk]), r, mode,
                                         24, False)


@njit(error_model="numpy")
def _few_step(c, p, r, mode):  # pragma: no cover - compiled
    """:func:`_clean_step` of a lane of :func:`_few_sums` on its rounded product ``p``.
    A function of its own, not inlined by numba: eight inlined copies in one loop took
    numba's passes about 70 s to compile per mode; called, it is compiled once and LLVM
    inlines the calls (7 s, the same speed)."""
    return _clean_step(c, p, r, mode, 24, True, _UD_MIN)


@njit(inline="always")
def _few_sums(acc, P, R, k1, kc, mode):
    """:func:`_contract_few32`'s second pass: the k-steps ``k1 .. kc−1`` of the block for
    the eight lanes' accumulators ``acc`` (:func:`_few_step`, NaN where a lane gives up,
    as in the clean loops). Eight scalar chains in one loop, so that their latencies
    overlap (a loop over the lanes, unrolled by LLVM, was not vectorised, nor was one
    over lanes and k-steps with the chains eight elements apart; docs/speed.md)."""
    c0, c1, c2, c3 = acc[0], acc[1], acc[2], acc[3]
    c4, c5, c6, c7 = acc[4], acc[5], acc[6], acc[7]
    for kk in range(k1, kc):
        c0 = _few_step(c0, P[kk], R[kk], mode)
        c1 = _few_step(c1, P[FEW_KC + kk], R[FEW_KC + kk], mode)
        c2 = _few_step(c2, P[2 * FEW_KC + kk], R[2 * FEW_KC + kk], mode)
        c3 = _few_step(c3, P[3 * FEW_KC + kk], R[3 * FEW_KC + kk], mode)
        c4 = _few_step(c4, P[4 * FEW_KC + kk], R[4 * FEW_KC + kk], mode)
        c5 = _few_step(c5, P[5 * FEW_KC + kk], R[5 * FEW_KC + kk], mode)
        c6 = _few_step(c6, P[6 * FEW_KC + kk], R[6 * FEW_KC + kk], mode)
        c7 = _few_step(c7, P[7 * FEW_KC + kk], R[7 * FEW_KC + kk], mode)
    acc[0], acc[1], acc[2], acc[3] = c0, c1, c2, c3
    acc[4], acc[5], acc[6], acc[7] = c4, c5, c6, c7


@njit(inline="always")
def _few_batch(a, bt, acc, P, R, H, ba, bb, M, N, Kd, row0, ukey):
    """Batch ``row0 // M`` of :func:`_contract_few32` into ``acc`` (its lanes' binary32
    values as float64, NaN where a lane gave up), block by block of :data:`FEW_KC`
    k-steps."""
    for k0 in range(0, Kd, FEW_KC):
        kc = min(FEW_KC, Kd - k0)
        _few_products(a, bt, P, R, H, ba, bb, M, N, Kd, row0, k0, kc, ukey, _SR)
        if k0 == 0:  # the first products are the accumulators (_clean_first)
            for lane in range(FEW_LANES):
                acc[lane] = P[lane * FEW_KC]
        _few_sums(acc, P, R, 1 if k0 == 0 else 0, kc, _SR)


@njit(cache=True, error_model="numpy")
def _contract_few32(a, bt, clean, out, key):  # pragma: no cover - compiled
    """binary32 products at 24 bits in sr (``"separate"``) with at most
    :data:`FEW_LANES` outputs per batch, ``a`` (BA, M, K) by ``b`` given transposed,
    ``bt`` (BB, N, K) (a classifier head's ``weight.t()`` is that already). The column
    kernel runs each row's few columns in its vectorised loops' scalar remainder, with the
    line hash, slices and bits loop of every k-step around them: fft_filter's 2 × 4096 @
    4096 × 4 head took 106 µs, about 38 cycles per (row, k). Here, per block of k-steps,
    one pass draws every term's bits and rounds its product, vectorised along k
    (:func:`_few_products`), and a second runs the eight outputs' sums as interleaved
    scalar chains (:func:`_few_sums`): 41–50 µs for that head (Zen 4, one thread, sr;
    ``benchmarks/bench_kernels.py --few``). Products of one row keep the column kernel
    (:data:`FEW_K`); so do the other modes (a copy of the loops per mode costs about 6 s of
    compile, and the CI's cold compile has little room: docs/speed.md). The same terms,
    bits and operations as the clean loops; a lane that gives up (an inexact sum) and
    every lane of a row that is not clean (:func:`clean_rows`) comes from the full path
    (:func:`_column32`), as in :func:`_settle_row32`: the same bits."""
    BO, M, N = out.shape
    BA = a.shape[0]
    BB, _, Kd = bt.shape
    ukey = np.uint64(key)
    P = np.zeros(FEW_LANES * FEW_KC)  # (unused lanes stay zero: exact, never given up)
    R = np.zeros(FEW_LANES * FEW_KC, np.uint64)
    H = np.empty(FEW_KC, np.uint64)
    acc = np.empty(FEW_LANES)
    bkn = np.empty((Kd, N), np.float32)  # b's batch in (K, N) order, for _column32
    held = -1
    for bo in range(BO):
        ba = bo % BA
        bb = bo % BB
        _few_batch(a, bt, acc, P, R, H, ba, bb, M, N, Kd, bo * M, ukey)
        for i in range(M):
            row = bo * M + i
            for j in range(N):
                v = acc[i * N + j]
                if clean[row] and not np.isnan(v):
                    out[bo, i, j] = np.float32(v)
                    continue
                if held != bb:
                    for k in range(Kd):
                        for jj in range(N):
                            bkn[k, jj] = bt[bb, jj, k]
                    held = bb
                out[bo, i, j] = _column32(a[ba, i], bkn, ukey, np.uint64(row * Kd), j,
                                          np.int64(_SR), np.int64(24), np.bool_(False))


@njit(inline="always")
def _fraction_or(x):
    """OR of the fraction fields of a contiguous binary32 array (integer reduction: it
    vectorises)."""
    u = x.view(np.uint32)
    acc = np.uint32(0)
    for i in range(u.size):
        acc |= u[i]
    return acc & np.uint32(0x7FFFFF)


@njit(inline="always")
def _sig_bits(frac):
    """An upper bound on the significant bits of every finite binary32 value whose
    fraction field has no bit set outside ``frac`` (the OR of the fraction fields):
    24 minus the trailing zeros of ``frac`` (1 when it is 0). Subnormals have fewer."""
    if frac == np.uint32(0):
        return 1
    tz = 0
    while (frac >> np.uint32(tz)) & np.uint32(1) == np.uint32(0):
        tz += 1
    return 24 - tz


@njit(cache=True)
def _narrow_bits(a, b):  # pragma: no cover - compiled
    """(significant bits bound of a's values, of b's values): see :func:`_sig_bits`."""
    return _sig_bits(_fraction_or(a.reshape(-1))), _sig_bits(_fraction_or(b.reshape(-1)))


def narrow_products(a: np.ndarray, b: np.ndarray, t: int) -> bool:
    """Whether every product ``a[.., i, k] · b[.., k, j]`` of two contiguous binary32
    arrays has at most ``t`` significant bits: the values of ``a`` have at most p_a
    significant bits and those of ``b`` at most p_b (bounds read off the OR of their
    fraction fields), and p_a + p_b <= t. True for bfloat16 (8 + 8 bits) and float16
    (11 + 11) values carried in binary32 at t = 24: such a product, in binary32's normal
    range (as in every clean row), is exact, and sr, ieee and random return an exact
    value unchanged whatever the random bits. :func:`contract` then skips the product
    roundings of its clean rows (same bits, about 3 of the 21 vector micro-ops per 8
    terms of the clean loop). :func:`contract` takes the bound from :func:`_prepare32`'s
    parallel pass; this is its serial reference (the tests compare the two)."""
    pa, pb = _narrow_bits(a, b)
    return pa + pb <= t


@njit(parallel=True, cache=True)
def _contract_kernel(a, b, out, key, mode, t, is32, fma=False):  # pragma: no cover
    """Any precision, binary32 or binary64: numvar.rounding's scalar functions
    (``fma``: one rounding per multiply-add)."""
    BO, M, N = out.shape
    Kd = b.shape[1]
    BA = a.shape[0]
    BB = b.shape[0]
    ukey = np.uint64(key)
    for row in prange(BO * M):
        bo = row // M
        i = row - bo * M
        orow = out[bo, i]
        arow = a[bo % BA, i]
        base = np.uint64(row) * np.uint64(Kd)
        for k in range(Kd):
            aik = np.float64(arow[k])
            brow = b[bo % BB, k]
            hk = _bits(ukey, base + np.uint64(k))
            for j in range(N):
                r = _term(hk, np.uint64(j))
                if fma and k > 0:
                    if is32:
                        orow[j] = K.fma_f32(aik, np.float64(brow[j]), np.float64(orow[j]),
                                            mode, t, r)
                    else:
                        orow[j] = K.fma_f64(aik, np.float64(brow[j]), np.float64(orow[j]),
                                            mode, t, r)
                elif is32:
                    p32 = K.mul_f32(aik, np.float64(brow[j]), mode, t, r)
                    if k == 0:
                        orow[j] = p32
                    else:
                        orow[j] = K.add_f32(np.float64(orow[j]), np.float64(p32), mode, t, _rot(r))
                else:
                    p64 = K.mul_f64(aik, np.float64(brow[j]), mode, t, r)
                    if k == 0:
                        orow[j] = p64
                    else:
                        orow[j] = K.add_f64(np.float64(orow[j]), p64, mode, t, _rot(r))


# ------------------------------------------------------------ binary64 clean rows
#: A row of a binary64 product at 53 bits is *clean* when every input of the row (and of
#: ``b``) is finite with every nonzero magnitude in [2**-300, 2**300]. Then every nonzero
#: product lies in [2**-600, 2**600], where the rounding core's binary64 multiply takes
#: TwoProduct (Dekker's, exact there; the clean loop's ``fma(a, b, -p)`` is the same exact
#: error) and ``_rn64_fast``. Sums are checked per lane: a float64 sum that is zero or has
#: magnitude in [2**-700, 2**1000) is rounded by :func:`_rn64_step` (``_rn64_fast``
#: without branches: normal ulps, no overflow, the SR threshold's power-of-two scaling
#: exact); any other lane becomes NaN and is recomputed on the scalar full path.
_CLEAN64_LO = np.uint64(1023 - 300) << np.uint64(52)
_CLEAN64_HI = np.uint64(1023 + 300) << np.uint64(52)
_SUM64_LO, _SUM64_SPAN = K.SUM64_LO, K.SUM64_SPAN
_fma64 = K.fma64
_rn64_step = K.rn64_step


@njit(inline="always")
def _product64(x, y, r, mode):
    """``numvar.rounding.kernels.mul_f64(x, y, mode, 53, r)`` for a clean row's factors
    (zero, or magnitudes in [2**-300, 2**300]): TwoProduct by FMA, then
    :func:`_rn64_step`; a zero product keeps IEEE's signed zero."""
    p = x * y
    v = _rn64_step(p, _fma64(x, y, -p), r, mode)
    return p if p == 0.0 else v


@njit(inline="always")
def _clean64_loops(acc, jg, arow, bmat, ukey, base, j0, n, mode):
    """Every k-step of one clean binary64 row tile into ``acc``: the order and bits of
    :func:`contract` (product with ``r``, add with ``rot(r)``), TwoProduct by FMA and
    TwoSum; a lane whose sum leaves the range of :func:`_rn64_step` becomes NaN and stays
    NaN (the inputs are finite: NaN marks exactly those lanes). A k-step's products in a
    loop of their own where :data:`PRODUCTS64_APART`."""
    a0 = arow[0]
    b0 = bmat[0, j0:j0 + n]
    h0 = _bits(ukey, base)
    for jj in range(n):
        r = _mix(h0 + jg[jj])
        acc[jj] = _product64(a0, b0[jj], r, mode)
    rb = np.empty(n, np.uint64)
    p = np.empty(n if PRODUCTS64_APART else 0)
    for k in range(1, arow.size):
        ak = arow[k]
        bk = bmat[k, j0:j0 + n]
        hk = _bits(ukey, base + np.uint64(k))
        if PRODUCTS64_APART:
            for jj in range(n):  # the terms' bits and rounded products
                r = _mix(hk + jg[jj])
                rb[jj] = r
                p[jj] = _product64(ak, bk[jj], r, mode)
            for jj in range(n):  # the adds, with the same bits
                acc[jj] = _sum64_step(acc[jj], p[jj], rb[jj], mode)
        else:
            _term_bits_row(rb, hk, jg, n, mode, TERM_BITS_APART)
            for jj in range(n):
                r = _term_r(rb, hk, jg, jj, TERM_BITS_APART)
                acc[jj] = _sum64_step(acc[jj], _product64(ak, bk[jj], r, mode), r, mode)


@njit(inline="always")
def _sum64_step(c, p, r, mode):
    """The add of a clean binary64 lane: ``RND(c + p)`` with the term's bits ``r`` (the add
    draws ``rot(r)``) by TwoSum and :func:`_rn64_step`, or NaN where the sum leaves that
    step's range (a NaN accumulator stays NaN)."""
    s, e = K.two_sum(c, p)  # s + e = c + p exactly
    sb = _f64_bits(s) & ~_SIGN
    ok = ((sb - _SUM64_LO) < _SUM64_SPAN) | (s == 0.0)
    v = _rn64_step(s, e, _rot(r), mode)
    v = s if s == 0.0 else v
    return v if ok else np.nan


@njit(cache=True)
def _clean64(acc, jg, arow, bmat, ukey, base, j0, n, mode):  # pragma: no cover - compiled
    """:func:`_clean64_loops` with the mode folded into a constant (one vectorised copy
    per mode), 512-bit vectors allowed."""
    _wide_vectors()
    if mode == _SR:
        _clean64_loops(acc, jg, arow, bmat, ukey, base, j0, n, _SR)
    elif mode == _IEEE:
        _clean64_loops(acc, jg, arow, bmat, ukey, base, j0, n, _IEEE)
    elif mode == _UD:
        _clean64_loops(acc, jg, arow, bmat, ukey, base, j0, n, _UD)
    else:
        _clean64_loops(acc, jg, arow, bmat, ukey, base, j0, n, _RANDOM)


@njit(inline="always")
def _absbits64(x):
    """(max, min nonzero) of the magnitudes' bit patterns of a contiguous binary64 array
    (min is 2**64 - 1 when every element is ±0); see :func:`_absbits`."""
    u = x.view(np.uint64)
    hi = np.uint64(0)
    lo = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(u.size):
        m = u[i] & ~_SIGN
        hi = max(hi, m)
        lo = min(lo, m - np.uint64(1))
    return hi, lo + np.uint64(1) if lo != np.uint64(0xFFFFFFFFFFFFFFFF) else lo


@njit(inline="always")
def _in_clean64(hi, lo):
    """Whether (max, min nonzero) magnitude patterns are those of a clean binary64 row."""
    return hi <= _CLEAN64_HI and (hi == np.uint64(0) or lo >= _CLEAN64_LO)


@njit(cache=True)
def clean_rows64(a, b, BO):  # pragma: no cover - compiled
    """Which rows ``(bo, i)`` (flattened ``bo·M + i``) of a binary64 product of ``a``
    (BA, M, K) and ``b`` (BB, K, N) with batch BO are clean (see above)."""
    BA, M, Kd = a.shape
    BB = b.shape[0]
    bok = np.empty(BB, dtype=np.bool_)
    for bb in range(BB):
        hi, lo = _absbits64(b[bb].reshape(-1))
        bok[bb] = _in_clean64(hi, lo)
    aok = np.empty((BA, M), dtype=np.bool_)
    for ba in range(BA):
        for i in range(M):
            hi, lo = _absbits64(a[ba, i])
            aok[ba, i] = _in_clean64(hi, lo)
    out = np.empty(BO * M, dtype=np.bool_)
    for bo in range(BO):
        for i in range(M):
            out[bo * M + i] = aok[bo % BA, i] and bok[bo % BB]
    return out


@njit(inline="always")
def _step64(acc, x, y, r, first, mode, t):
    """One k-step of the scalar binary64 path (numvar.rounding's functions): ``RND(x·y)``
    with ``r``, then (not ``first``) ``RND(acc + that)`` with ``rot(r)``."""
    p = K.mul_f64(x, y, mode, t, r)
    return p if first else K.add_f64(acc, p, mode, t, _rot(r))


@njit
def _column64(arow, bmat, ukey, base, j, mode):  # pragma: no cover - compiled
    """One output element of a binary64 product at 53 bits on the scalar full path, for
    the lanes the clean loop gives up on."""
    uj = np.uint64(j)
    acc = 0.0
    for k in range(arow.size):
        acc = _step64(acc, arow[k], bmat[k, j], _term(_bits(ukey, base + np.uint64(k)), uj),
                      k == 0, mode, 53)
    return acc


@njit(cache=True)
def _row64(o, arow, bmat, ukey, base, j0, j1, clean, mode):  # pragma: no cover - compiled
    """Columns ``j0 .. j1−1`` of one binary64 output row ``o`` (53 bits, sr, ieee, ud,
    random): a clean row on the vectorised loop (:func:`_clean64`; NaN lanes recomputed
    on the scalar full path), another row on the scalar path (k outer)."""
    Kd = arow.size
    n = j1 - j0
    if clean:
        acc = np.empty(n)
        jg = np.empty(n, dtype=np.uint64)
        for jj in range(n):
            jg[jj] = np.uint64(j0 + jj) * _G
        _clean64(acc, jg, arow, bmat, ukey, base, j0, n, mode)
        for jj in range(n):
            v = acc[jj]
            o[j0 + jj] = v if v == v else _column64(arow, bmat, ukey, base, j0 + jj, mode)
        return
    for k in range(Kd):
        hk = _bits(ukey, base + np.uint64(k))
        for j in range(j0, j1):
            o[j] = _step64(o[j], arow[k], bmat[k, j], _term(hk, np.uint64(j)), k == 0, mode, 53)


@njit(parallel=True, cache=True)
def _contract_fast64(a, b, clean, out, key, mode):  # pragma: no cover
    """binary64 at 53 bits, modes sr, ieee, ud, random: one task per row tile of TILE
    columns (:func:`_row64`)."""
    BO, M, N = out.shape
    Kd = b.shape[1]
    BA = a.shape[0]
    BB = b.shape[0]
    ntile = (N + TILE - 1) // TILE
    ukey = np.uint64(key)
    for task in prange(BO * M * ntile):
        row = task // ntile
        tile = task - row * ntile
        bo = row // M
        i = row - bo * M
        j0 = tile * TILE
        _row64(out[bo, i], a[bo % BA, i], b[bo % BB], ukey, np.uint64(row) * np.uint64(Kd),
               j0, min(N, j0 + TILE), clean[row], mode)


@njit(cache=True)
def _narrow64(acc, at, bmat, hb, hk, k0, kc, mode):  # pragma: no cover - compiled
    """:func:`_narrow_loops` for binary64, one vectorised copy per mode, 512-bit vectors
    allowed."""
    _wide_vectors()
    if mode == _SR:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _SR, True)
    elif mode == _IEEE:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _IEEE, True)
    elif mode == _UD:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _UD, True)
    else:
        _narrow_loops(acc, at, bmat, hb, hk, k0, kc, _RANDOM, True)


@njit(inline="always")
def _narrow_tail64(arows, bmat, clean, out, ukey, mode, bo, i0, i1):
    """Rows ``i0 .. i1−1`` of batch ``bo`` of :func:`_contract_narrow64` row by row
    (:func:`_row64`)."""
    _, M, N = out.shape
    Kd = bmat.shape[0]
    for i in range(i0, i1):
        row = bo * M + i
        _row64(out[bo, i], arows[i], bmat, ukey, np.uint64(row) * np.uint64(Kd),
               np.int64(0), N, clean[row], mode)


@njit(parallel=True, cache=True)
def _contract_narrow64(a, b, clean, out, key, mode):  # pragma: no cover
    """:func:`_contract_fast64` for products with few columns (N <= :data:`NARROW_N`), as
    :func:`_contract_narrow32` is :func:`_contract_fast32`'s: one task per block of
    NARROW_ROWS rows, the rows the lanes of :func:`_narrow64` (a partial last block of at
    most :data:`NARROW_TAIL` rows row by row); a clean row takes its lanes' values (NaN
    lanes from :func:`_column64`), another row :func:`_row64`; a tail after a whole block
    in the last block's task (:func:`_contract_narrow32`). Same bits. (Row by row, an
    N = 1 head ran at 0.04 G terms/s: every term paid a line hash and a loop set-up.)"""
    BO, M, N = out.shape
    Kd = b.shape[1]
    BA = a.shape[0]
    BB = b.shape[0]
    L = NARROW_ROWS
    nblk, joined = narrow_split(M)
    ukey = np.uint64(key)
    for task in prange(BO * nblk):
        bo, i0, i1 = _narrow_block_rows(task, nblk, M)
        arows = a[bo % BA]
        bmat = b[bo % BB]
        if i1 - i0 <= NARROW_TAIL and i1 - i0 < L:
            _narrow_tail64(arows, bmat, clean, out, ukey, mode, bo, i0, i1)
            continue
        acc = _narrow_block(arows, bmat, ukey, bo * M, i0, i1, mode, True)
        for lane in range(i1 - i0):
            i = i0 + lane
            row = bo * M + i
            base = np.uint64(row) * np.uint64(Kd)
            o = out[bo, i]
            if clean[row]:
                for j in range(N):
                    v = acc[j, lane]
                    o[j] = v if v == v else _column64(arows[i], bmat, ukey, base, j, mode)
            else:
                _row64(o, arows[i], bmat, ukey, base, np.int64(0), N, clean[row], mode)
        if joined and i1 == nblk * L:
            _narrow_tail64(arows, bmat, clean, out, ukey, mode, bo, i1, M)


@njit(inline="always")
def _scanloop32(orow, xrow, ukey, q0, mode, use_mul, bad):
    """One k-step in place: ``orow[j] = RND(orow[j] ∘ xrow[j])`` on the fast path; a
    rejected element keeps its previous value and is flagged. (In place, one array:
    with separate source and destination rows LLVM cannot rule out overlap and keeps
    the loop scalar.)"""
    nbad = 0
    z = _weyl(ukey, q0)  # stepped by γ: _weyl
    for j in range(orow.size):
        a = np.float64(orow[j])
        x = np.float64(xrow[j])
        if use_mul:
            s = a * x
            e = 0.0
        else:
            s = a + x
            bv = s - a
            e = (a - (s - bv)) + (x - bv)
        v, ok = _fast32(s, _bits_weyl(z), mode)
        z += _G
        ok = ok & (e == 0.0)  # (bitwise: _fast32)
        orow[j] = v if ok else orow[j]
        bad[j] = not ok
        nbad += 0 if ok else 1
    return nbad


@njit(cache=True)
def _scanstep32(orow, xrow, ukey, q0, mode, use_mul, bad):  # pragma: no cover
    """One k-step of a scan tile on the binary32 fast path (see :func:`_step32`)."""
    _wide_vectors()
    if mode == _SR:
        return _scanloop32(orow, xrow, ukey, q0, _SR, use_mul, bad)
    if mode == _IEEE:
        return _scanloop32(orow, xrow, ukey, q0, _IEEE, use_mul, bad)
    if mode == _UD:
        return _scanloop32(orow, xrow, ukey, q0, _UD, use_mul, bad)
    return _scanloop32(orow, xrow, ukey, q0, _RANDOM, use_mul, bad)


@njit(inline="always")
def _scanloop64(orow, xrow, ukey, q0, mode, use_mul, bad):
    """:func:`_scanloop32` in binary64 at 53 bits: TwoSum, or the product's exact error by
    one FMA, then ``rn64_step`` (the rounding core's vectorised pass,
    ``numvar.rounding.kernels._wide_loop``); an element ``_wide_takes`` declines (a result
    outside [2**-700, 2**1000), zero, infinite or NaN included; a factor outside
    [2**-480, 2**480]) keeps its value and is flagged."""
    nbad = 0
    z = _weyl(ukey, q0)  # stepped by γ: _weyl
    for j in range(orow.size):
        a = orow[j]
        x = xrow[j]
        if use_mul:
            s = a * x
            e = K.fma64(a, x, -s)
        else:
            s = a + x
            bv = s - a
            e = (a - (s - bv)) + (x - bv)
        v = K.rn64_step(s, e, _bits_weyl(z), mode)
        z += _G
        ok = K._wide_takes(a, x, s, use_mul)
        orow[j] = v if ok else orow[j]
        bad[j] = not ok
        nbad += 0 if ok else 1
    return nbad


@njit(cache=True)
def _scanstep64(orow, xrow, ukey, q0, mode, use_mul, bad):  # pragma: no cover
    """One k-step of a binary64 scan tile on the fast path (:func:`_scanloop64`)."""
    _wide_vectors()
    if mode == _SR:
        return _scanloop64(orow, xrow, ukey, q0, _SR, use_mul, bad)
    if mode == _IEEE:
        return _scanloop64(orow, xrow, ukey, q0, _IEEE, use_mul, bad)
    if mode == _UD:
        return _scanloop64(orow, xrow, ukey, q0, _UD, use_mul, bad)
    return _scanloop64(orow, xrow, ukey, q0, _RANDOM, use_mul, bad)


def _scan_step(orow, xrow, ukey, q0, mode, use_mul, bad):  # pragma: no cover - overloaded
    """One k-step of a scan tile on the fast path of its dtype: :func:`_scanstep32`
    (binary32 at 24 bits) or :func:`_scanstep64` (binary64 at 53)."""


@overload(_scan_step, inline="always")
def _scan_step_impl(orow, xrow, ukey, q0, mode, use_mul, bad):
    if orow.dtype == types.float64:
        return lambda orow, xrow, ukey, q0, mode, use_mul, bad: _scanstep64(
            orow, xrow, ukey, q0, mode, use_mul, bad)
    return lambda orow, xrow, ukey, q0, mode, use_mul, bad: _scanstep32(
        orow, xrow, ukey, q0, mode, use_mul, bad)


def _scan_full(a, xv, mode, use_mul, r):  # pragma: no cover - overloaded
    """A step the fast path declined, on the rounding core's scalar function of the
    dtype (what :func:`_scan_kernel` computes for it)."""


@overload(_scan_full, inline="always")
def _scan_full_impl(a, xv, mode, use_mul, r):
    # (the scalar functions called, not inlined: one compiled copy for every caller)
    if a == types.float64:
        def wide(a, xv, mode, use_mul, r):
            return K.call_wide_binary(np.int64(K.OP_MUL if use_mul else K.OP_ADD), a, xv,
                                      mode, np.int64(53), r)
        return wide

    def narrow(a, xv, mode, use_mul, r):
        return np.float32(K.call_narrow_binary(
            np.int64(K.OP_MUL if use_mul else K.OP_ADD), a, xv, mode, np.int64(24),
            np.int64(24), np.int64(-126), np.int64(127), r))
    return narrow


@njit(parallel=True, cache=True)
def _scan_tiles(x, out, key, mode, use_mul, cumulative):  # pragma: no cover
    """binary32 at 24 bits (float32 arrays) or binary64 at 53 (float64): vectorised fast
    path per column tile (:func:`_scan_step`), the rounding core's scalar functions for
    the steps it declines (:func:`_scan_full`; :func:`_scan_kernel`'s order and bits). A
    cumulative scan copies row k-1 into row k, then updates row k in place."""
    Kd, M = x.shape
    ntile = (M + TILE - 1) // TILE
    ukey = np.uint64(key)
    for tile in prange(ntile):
        j0 = tile * TILE
        j1 = min(M, j0 + TILE)
        for j in range(j0, j1):
            out[0, j] = x[0, j]
        bad = np.empty(j1 - j0, dtype=np.bool_)
        for k in range(1, Kd):
            cur = k if cumulative else 0
            q0 = np.uint64(k) * np.uint64(M) + np.uint64(j0)
            xrow = x[k, j0:j1]
            orow = out[cur, j0:j1]
            if cumulative:
                prow = out[k - 1, j0:j1]
                for jj in range(j1 - j0):
                    orow[jj] = prow[jj]
            if _scan_step(orow, xrow, ukey, q0, mode, use_mul, bad) != 0:
                for jj in range(j1 - j0):
                    if bad[jj]:
                        orow[jj] = _scan_full(orow[jj], xrow[jj], mode, use_mul,
                                              _bits(ukey, q0 + np.uint64(jj)))


@njit(inline="always")
def chain_add64(acc, xv, r, mode, fast):
    """One step of a binary64 sum's dependent chain at 53 bits, ``RND(acc + xv)`` with the
    bits ``r`` (:func:`_scan_kernel`'s value): ``rn64_step`` on the TwoSum where ``fast``
    (sr, ieee, ud, random) and ``_wide_takes`` hold, else the scalar function (called,
    not inlined: one compiled copy for every caller). :func:`_scan_chain64` and
    ``scan_kernels._row_chains64`` step their chains with it."""
    s = acc + xv
    bv = s - acc
    e = (acc - (s - bv)) + (xv - bv)
    if fast and K._wide_takes(acc, xv, s, False):
        return K.rn64_step(s, e, r, mode)
    return K.call_wide_binary(np.int64(K.OP_ADD), acc, xv, mode, np.int64(53), r)


@njit(cache=True)
def _scan_chain64(x, out, key, mode, cumulative):  # pragma: no cover - compiled
    """binary64 sums at 53 bits (sr, ieee, ud, random) of few columns: each column's
    steps one after the other, a dependent chain, each step on ``rn64_step`` inline where
    ``_wide_takes`` holds and on the scalar function elsewhere (:func:`_scan_kernel`'s
    order and bits). A vectorised step per k (:func:`_scan_tiles`) loses on one or two
    columns, and the scalar functions' calls and branches made each step of a chain
    (a float64 dot product's sum) about 1.25 times as long. The mode stays a runtime
    value (its branches are predicted): LLVM took ~8 s to compile this loop, per copy;
    sums only, for the same reason (products of few columns, rare, keep the scalar
    steps)."""
    ukey = np.uint64(key)
    Kd, M = x.shape
    step = np.uint64(M) * _G
    for j in range(M):
        acc = x[0, j]
        out[0, j] = acc
        z = _weyl(ukey, np.uint64(M + j))  # element (1, j): index M + j, stepped by M·γ
        for k in range(1, Kd):
            acc = chain_add64(acc, x[k, j], _bits_weyl(z), mode, True)
            z += step
            if cumulative:
                out[k, j] = acc
        if not cumulative:
            out[0, j] = acc


@njit(parallel=True, cache=True)
def _scan_kernel(x, out, key, mode, t, is32, use_mul, cumulative):  # pragma: no cover
    """Any precision, binary32 or binary64: numvar.rounding's scalar functions."""
    Kd, M = x.shape
    ukey = np.uint64(key)
    for j in prange(M):
        out[0, j] = x[0, j]
        prev = 0
        for k in range(1, Kd):
            cur = k if cumulative else 0
            r = _bits(ukey, np.uint64(k) * np.uint64(M) + np.uint64(j))
            a = np.float64(out[prev, j])
            xv = np.float64(x[k, j])
            if is32:
                if use_mul:
                    out[cur, j] = K.mul_f32(a, xv, mode, t, r)
                else:
                    out[cur, j] = K.add_f32(a, xv, mode, t, r)
            else:
                if use_mul:
                    out[cur, j] = K.mul_f64(a, xv, mode, t, r)
                else:
                    out[cur, j] = K.add_f64(a, xv, mode, t, r)
            prev = cur


@njit(parallel=True, cache=True)
def _contract_format(a, b, out, key, mode, t, p, emin, emax, maxv, flags):  # pragma: no cover
    """Any format (float64 arrays): every product and add rounded by
    numvar.rounding.kernels.format_binary, the order and bits of _contract_kernel."""
    BO, M, N = out.shape
    Kd = b.shape[1]
    BA = a.shape[0]
    BB = b.shape[0]
    ukey = np.uint64(key)
    for row in prange(BO * M):
        bo = row // M
        i = row - bo * M
        orow = out[bo, i]
        arow = a[bo % BA, i]
        base = np.uint64(row) * np.uint64(Kd)
        for k in range(Kd):
            aik = arow[k]
            brow = b[bo % BB, k]
            hk = _bits(ukey, base + np.uint64(k))
            for j in range(N):
                r = _term(hk, np.uint64(j))
                pr = K.format_binary(K.OP_MUL, aik, brow[j], mode, t, p, emin, emax, maxv,
                                     flags, r)
                if k == 0:
                    orow[j] = pr
                else:
                    orow[j] = K.format_binary(K.OP_ADD, orow[j], pr, mode, t, p, emin, emax,
                                              maxv, flags, _rot(r))


@njit(parallel=True, cache=True)
def _scan_format(x, out, key, mode, t, p, emin, emax, maxv, flags, use_mul,
                 cumulative):  # pragma: no cover
    """Any format (float64 arrays): _scan_kernel's order and bits, every step rounded by
    numvar.rounding.kernels.format_binary."""
    Kd, M = x.shape
    ukey = np.uint64(key)
    op = K.OP_MUL if use_mul else K.OP_ADD
    for j in prange(M):
        out[0, j] = x[0, j]
        prev = 0
        for k in range(1, Kd):
            cur = k if cumulative else 0
            r = _bits(ukey, np.uint64(k) * np.uint64(M) + np.uint64(j))
            out[cur, j] = K.format_binary(op, out[prev, j], x[k, j], mode, t, p, emin, emax,
                                          maxv, flags, r)
            prev = cur


def contract_format(a: np.ndarray, b: np.ndarray, key: int, mode: int, t: int,
                    spec: tuple) -> np.ndarray:
    """:func:`contract` with every product and add rounded to the format ``spec`` =
    (p, emin, emax, maxv, flags) of :meth:`numvar.rounding.Format.spec` at ``t`` bits;
    float64 arrays in and out; the same order and random bits."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1] or a.shape[2] < 1:
        raise ValueError(f"bad shapes for contract: {a.shape} @ {b.shape}")
    BO = max(a.shape[0], b.shape[0])
    if BO % a.shape[0] or BO % b.shape[0]:
        raise ValueError(f"batch sizes {a.shape[0]} and {b.shape[0]} are incompatible")
    out = np.empty((BO, a.shape[1], b.shape[2]))
    if out.size:
        launch(out.size * a.shape[2], _contract_format, a, b, out, np.uint64(key), mode, t,
               *spec)
    return out


def scan_format(x: np.ndarray, key: int, mode: int, t: int, spec: tuple, *,
                mul: bool = False, cumulative: bool = False) -> np.ndarray:
    """:func:`scan` with every step rounded to the format ``spec`` (see
    :func:`contract_format`); float64 arrays in and out."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"scan needs a (K>=1, M) array, got {x.shape}")
    out = np.empty((x.shape[0] if cumulative else 1, x.shape[1]))
    if x.shape[1]:
        launch(x.size, _scan_format, x, out, np.uint64(key), mode, t, *spec, mul, cumulative)
    return out


#: skip the product roundings of clean rows whose products are all exact (see
#: :func:`narrow_products`; same bits either way; False: every product rounded, which
#: ``benchmarks/bench_lowp.py`` times against)
EXACT_PRODUCTS = True
#: products with few columns through :func:`_contract_narrow32` / :func:`_contract_narrow64`
#: (same bits either way; False: through :func:`_contract_fast32` / :func:`_contract_fast64`,
#: which the tests and ``benchmarks/bench_kernels.py --narrow`` compare them with)
NARROW_KERNEL = True


def _check(arr: np.ndarray, name: str) -> None:
    if arr.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name}: float32 or float64 array expected, got {arr.dtype}")


#: contraction semantics of :func:`contract`: every product and add rounded, or one
#: rounding per multiply-add (exact product)
CONTRACTIONS = ("separate", "fma")


def _fma_flag(contraction: str) -> bool:
    if contraction not in CONTRACTIONS:
        raise ValueError(f"contraction must be one of {', '.join(CONTRACTIONS)}; "
                         f"got {contraction!r}")
    return contraction == "fma"


def contract(a: np.ndarray, b: np.ndarray, key: int, mode: int, t: int,
             contraction: str = "separate") -> np.ndarray:
    """Batched randomly rounded product of ``a`` (BA, M, K) and ``b`` (BB, K, N).

    The batch of the result is ``max(BA, BB)``; ``a`` is indexed ``b % BA`` and ``b``
    ``b % BB`` (so BA or BB may be 1, or divide the batch: convolution groups). Order and
    random bits: see the module docstring. ``K`` must be >= 1. ``contraction``:
    ``"separate"`` (every product and add rounded) or ``"fma"`` (one rounding per
    multiply-add).
    """
    fma = _fma_flag(contraction)
    _check(a, "a")
    _check(b, "b")
    if a.dtype != b.dtype:
        raise TypeError("a and b must have the same dtype")
    if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1] or a.shape[2] < 1:
        raise ValueError(f"bad shapes for contract: {a.shape} @ {b.shape}")
    BA, BB = a.shape[0], b.shape[0]
    BO = max(BA, BB)
    if BO % BA or BO % BB:
        raise ValueError(f"batch sizes {BA} and {BB} are incompatible")
    out = np.empty((BO, a.shape[1], b.shape[2]), dtype=a.dtype)
    work = out.size * a.shape[2]
    if out.size and a.dtype == np.float32 and few_path(a.shape[1], b.shape[2], a.shape[2], BO,
                                                     mode, t, fma):
        # b transposed: no copy where b is a transposed view (flop._contract passes
        # weight.t() as one); the clean rows from b's per-batch statistics, which do not
        # depend on the order of its elements
        a, bt = np.ascontiguousarray(a), np.ascontiguousarray(b.transpose(0, 2, 1))
        clean, _ = launch(a.size + bt.size, _prepare32, a, bt.reshape(b.shape), BO, t)
        _contract_few32(a, bt, clean, out, np.uint64(key))
    elif out.size:
        a = np.ascontiguousarray(a)
        if a.dtype == np.float32 and 1 <= t <= 24 and mode <= _RANDOM:
            run32(a, plan32(a, b, out.shape, mode, t, fma), out, key, mode, t, fma)
        elif a.dtype == np.float32:
            launch(work, _contract_kernel, a, _c_order32(b, False)[0], out, np.uint64(key),
                   mode, t, True, fma)
        elif a.dtype == np.float64 and t == 53 and mode <= _RANDOM and not fma:
            b = np.ascontiguousarray(b)
            narrow = (NARROW_KERNEL and out.shape[2] <= NARROW_N
                      and _narrow_rows_fit(out.shape[1], out.shape[2]))
            launch(work, _contract_narrow64 if narrow else _contract_fast64, a, b,
                   clean_rows64(a, b, BO), out, np.uint64(key), mode)
        else:
            launch(work, _contract_kernel, a, np.ascontiguousarray(b), out, np.uint64(key),
                   mode, t, False, fma)
    return out


class Plan32(NamedTuple):
    """What :func:`plan32` decides for a binary32 product."""

    b: np.ndarray  #: b in C order
    b64: np.ndarray | None  #: b widened to float64, flat (the narrow kernel's; else None)
    clean: np.ndarray  #: the clean rows (:func:`clean_rows`)
    exact: bool  #: every product exact (:func:`narrow_products`)
    narrow: bool  #: :func:`_contract_narrow32` computes it (else :func:`_contract_fast32`)


def plan32(a: np.ndarray, b: np.ndarray, shape, mode: int, t: int, fma: bool) -> Plan32:
    """:func:`contract`'s steps before a binary32 product in sr, ieee, ud or random at
    ``t`` ≤ 24 bits of ``a`` (C order) and ``b`` (any layout) into an output of ``shape``
    (BO, M, N): the clean rows and significant bits in one parallel pass (the same values
    as :func:`clean_rows` and :func:`narrow_products`; b's statistics are per batch, so
    a transposed b's own array serves), products exact where bf16/fp16 values make them
    so (sr, ieee and random leave them unchanged), the kernel, and b in C order (and
    widened for the narrow kernel: :func:`_c_order32`). ``dense_kernels.addmm32``
    plans a linear layer's product with its bias by it too."""
    BO, M, N = shape
    work = BO * M * N * a.shape[2]
    bt = _transposed(b)
    if bt is None:
        b = np.ascontiguousarray(b)
    clean, pab = launch(a.size + b.size, _prepare32, a,
                        b if bt is None else bt.reshape(b.shape), BO, t)
    exact = EXACT_PRODUCTS and not fma and t == 24 and mode != _UD and pab <= t
    narrow = NARROW_KERNEL and not fma and t == 24 and _narrow32_serves(shape, work, exact)
    b, b64 = _c_order32(b, narrow)
    return Plan32(b, b64, clean, exact, narrow)


def run32(a: np.ndarray, plan: Plan32, out: np.ndarray, key: int, mode: int, t: int,
          fma: bool) -> None:
    """The binary32 product ``out`` of ``a`` and the b of ``plan`` (:func:`plan32`) by
    the kernel the plan names."""
    work = out.size * a.shape[2]
    if plan.narrow:
        launch(work, _contract_narrow32, a, plan.b, plan.b64, plan.clean, out,
               np.uint64(key), mode)
    else:
        launch(work, _contract_fast32, a, plan.b, plan.clean, out, np.uint64(key), mode, t,
               fma, plan.exact, _threads(work))


def few_path(M: int, N: int, K: int, BO: int, mode: int, t: int, fma: bool) -> bool:
    """Whether :func:`contract` computes a binary32 product of BO × M × N outputs, K terms
    each, with the few-outputs kernel (:func:`_contract_few32`, before :func:`plan32`)."""
    return (t == 24 and mode == _SR and not fma and few_lanes(M, N, K)
            and BO * M * N * K < PARALLEL_MIN_WORK)


def _narrow32_serves(shape, work: int, exact: bool) -> bool:
    """Whether :func:`contract` computes a binary32 product of output ``shape`` (BO, M, N)
    with :func:`_contract_narrow32`: N ≤ :data:`NARROW_N` and rows that fill its blocks
    (:func:`_narrow_rows_fit`); or N ≤ :data:`NARROW_N_AVX2` (without 512-bit vectors) or
    :data:`NARROW_N_512` (with them and the term bits inside the loops), rows that fill
    its blocks, not all products exact, and a block for every thread where the product
    runs on several. Either kernel gives the same bits."""
    BO, M, N = shape
    if N <= NARROW_N:
        return _narrow_rows_fit(M, N)
    return (N <= (NARROW_N_512 if VECTORS_512 else NARROW_N_AVX2) and _narrow_rows_fit(M, N)
            and not exact
            and (work < PARALLEL_MIN_WORK
                 or BO * (M // NARROW_ROWS) >= num_threads()))


#: binary64 scans at 53 bits (sr, ieee, ud, random) through :func:`_scan_tiles`; False:
#: :func:`_scan_kernel`'s scalar steps, which the tests and ``benchmarks/bench_oneop.py``
#: compare it with (the same bits). A float64 sum over the 128 columns of 256 rows,
#: flop SR, one thread: 622 µs (19 ns a step) on the scalar steps, 94 µs on these
SCAN64_FAST = True
#: fewer columns than this take :func:`_scan_chain64` (sums; products :func:`_scan_kernel`):
#: one vectorised call per k-step costs more than a scalar step for one or two columns
#: (a 32 768-term sum, one thread, ns per step vectorised / :func:`_scan_kernel`'s scalar
#: steps: 1 column 23.4 / 16.5, 2 17.1 / 16.6, 4 4.9 / 16.7, 8 3.0 / 16.9, 64 1.3 / 16.7)
SCAN64_MIN_COLUMNS = 4


def scan(x: np.ndarray, key: int, mode: int, t: int, *, mul: bool = False,
         cumulative: bool = False) -> np.ndarray:
    """Randomly rounded sum (or product, ``mul``) of ``x`` (K, M) along axis 0.

    Returns (1, M), or (K, M) with ``cumulative`` (every partial result). ``K >= 1``.
    """
    _check(x, "x")
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"scan needs a (K>=1, M) array, got {x.shape}")
    x = np.ascontiguousarray(x)
    out = np.empty((x.shape[0] if cumulative else 1, x.shape[1]), dtype=x.dtype)
    if x.shape[1]:
        if x.dtype == np.float32 and t == 24 and mode <= _RANDOM:
            launch(x.size, _scan_tiles, x, out, np.uint64(key), mode, mul, cumulative)
        elif SCAN64_FAST and x.dtype == np.float64 and t == 53 and mode <= _RANDOM:
            if x.shape[1] >= SCAN64_MIN_COLUMNS:
                launch(x.size, _scan_tiles, x, out, np.uint64(key), mode, mul, cumulative)
            elif not mul:
                _scan_chain64(x, out, np.uint64(key), mode, cumulative)
            else:
                launch(x.size, _scan_kernel, x, out, np.uint64(key), mode, t, False, mul,
                       cumulative)
        else:
            launch(x.size, _scan_kernel, x, out, np.uint64(key), mode, t, x.dtype == np.float32,
                   mul, cumulative)
    return out


# --------------------------------------------------------------------------- references
def contract_reference(a: np.ndarray, b: np.ndarray, key: int, mode: int, t: int,
                       contraction: str = "separate", spec: tuple | None = None) -> np.ndarray:
    """Slow obviously-sequential reference of :func:`contract` (same order, same bits);
    with ``spec``, of :func:`contract_format` (exact Fraction roundings of
    numvar.rounding.reference).

    ``contraction="fma"`` computes every multiply-add exactly in rational arithmetic and
    rounds it with ``numvar.rounding.reference.round_exact`` (tiny shapes only)."""
    if _fma_flag(contraction):
        if spec is not None:
            raise ValueError("contraction='fma' has no format (spec) reference")
        return _contract_fma_exact(a, b, key, mode, t)
    is32 = a.dtype == np.float32
    if spec is not None:
        mul, add = _ref_ops(spec, "mul"), _ref_ops(spec, "add")
        a, b = a.astype(np.float64), b.astype(np.float64)
    else:
        mul = K.mul_f32 if is32 else K.mul_f64
        add = K.add_f32 if is32 else K.add_f64
    BA, M, Kd = a.shape
    BB, _, N = b.shape
    BO = max(BA, BB)
    out = np.empty((BO, M, N), dtype=a.dtype)
    for bo in range(BO):
        for i in range(M):
            for j in range(N):
                acc = None
                for k in range(Kd):
                    r = term_bits(key, (bo * M + i) * Kd + k, j)
                    r_add = ((r << 29) | (r >> 35)) & 0xFFFFFFFFFFFFFFFF
                    p = mul(a[bo % BA, i, k], b[bo % BB, k, j], mode, t, np.uint64(r))
                    acc = p if k == 0 else add(acc, p, mode, t, np.uint64(r_add))
                out[bo, i, j] = acc
    return out


def scan_reference(x: np.ndarray, key: int, mode: int, t: int, *, mul: bool = False,
                   cumulative: bool = False, spec: tuple | None = None) -> np.ndarray:
    """Slow reference of :func:`scan` (with ``spec``: of :func:`scan_format`)."""
    is32 = x.dtype == np.float32
    if spec is not None:
        op = _ref_ops(spec, "mul" if mul else "add")
        x = x.astype(np.float64)
    elif mul:
        op = K.mul_f32 if is32 else K.mul_f64
    else:
        op = K.add_f32 if is32 else K.add_f64
    Kd, M = x.shape
    out = np.empty((Kd if cumulative else 1, M), dtype=x.dtype)
    key = np.uint64(key)
    for m in range(M):
        acc = x[0, m]
        if cumulative:
            out[0, m] = acc
        for k in range(1, Kd):
            acc = op(acc, x[k, m], mode, t, np.uint64(K.bits64(key, np.uint64(k * M + m))))
            if cumulative:
                out[k, m] = acc
        if not cumulative:
            out[0, m] = acc
    return out


def _contract_fma_exact(a: np.ndarray, b: np.ndarray, key: int, mode: int, t: int) -> np.ndarray:
    """``contraction="fma"`` in exact arithmetic: ``acc = RND(a0·b0)``, then
    ``acc = RND(acc + a_k·b_k)`` with each exact value a Fraction, rounded by
    :func:`numvar.rounding.reference.round_exact` with ``term_bits(key, line, j)``.
    An exact zero takes IEEE's sign (the float64 ``a·b + acc``, exact there); non-finite
    inputs give that float64 value."""
    from fractions import Fraction

    from numvar.rounding.reference import round_exact

    fmt = "binary32" if a.dtype == np.float32 else "binary64"
    BA, M, Kd = a.shape
    BB, _, N = b.shape
    BO = max(BA, BB)
    out = np.empty((BO, M, N), dtype=a.dtype)
    for bo in range(BO):
        for i in range(M):
            for j in range(N):
                acc = 0.0
                for k in range(Kd):
                    x, y = float(a[bo % BA, i, k]), float(b[bo % BB, k, j])
                    c = 0.0 if k == 0 else acc
                    ieee = x * y if k == 0 else x * y + c
                    r = term_bits(key, (bo * M + i) * Kd + k, j)
                    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(c)):
                        acc = ieee
                        continue
                    v = Fraction(x) * Fraction(y) + (Fraction(c) if k else 0)
                    acc = ieee if v == 0 else round_exact(abs(v), v < 0, fmt, t, mode, r)
                out[bo, i, j] = acc
    return out


def _ref_ops(spec: tuple, name: str):
    """The exact Fraction reference of one rounded binary op on the format ``spec``
    (numvar.rounding.reference), as ``op(x, y, mode, t, r)`` on 64 random bits ``r``."""
    from numvar.rounding.formats import Format
    from numvar.rounding.reference import ref_op

    p, emin, emax, maxv, flags = spec
    fmt = Format(p, emin, emax, not flags & K.FLAG_FLUSH, ("inf", "saturate", "nan")[flags & 3],
                 maxv or None, not flags & K.FLAG_UNSIGNED_ZERO)

    def op(x, y, mode, t, r):
        x, y = float(x), float(y)
        ieee = x * y if name == "mul" else x + y
        return ref_op(name, (x, y), fmt, t, mode, 0, 0, ieee, r=int(r))

    return op
