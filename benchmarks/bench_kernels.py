"""Contraction kernel throughput against its port-bound ceiling (one core).

    python benchmarks/bench_kernels.py [--repeats 30] [--shape M K N] [--narrow | --few]

For the binary32 SR clean-row loop of :mod:`numvar.instrument.kernels` it prints

* the vector instructions per 8 terms of one k >= 1 step, counted in the machine code
  numba generated on this host (``inspect_asm`` of ``_clean32``'s SR branch: the
  term-bits loop, ``kernels._term_bits_row``, and the accumulating loop with the TwoSum
  ``vaddpd``, :func:`step_loops`; their counts and ceilings per 8 terms add up; one loop
  where the kernel draws the bits inside it, ``kernels.CLEAN_LOOPS_BITS_APART`` false);
* the core clock, measured by a chain of dependent integer adds (one cycle each on every
  x86-64 core: ``bench_pipes.clock_hz``), and the float64 add latency that implies (3
  cycles on AMD Zen 4, 4 on Intel Skylake-X, 2 on Intel Golden Cove);
* the **port-bound ceiling, measured on this host**: the loop's vector instructions with
  every dependency between them cut (``independent``: sources from constant registers,
  destinations rotated, memory operands read from a register) run as inline assembly, in
  cycles per 8 terms: the vector ports' throughput for exactly this instruction mix,
  whatever the core's pipes and micro-op counts (Intel splits a ``vpmullq`` into three
  micro-ops, Zen 4 does not; Zen 4 renames a register move away);
* the model the kernel module derives for Zen 4, ``2 ports × clock × 8 / instructions``
  (two 512-bit vector ports, one micro-op per instruction, 8 float64 lanes per 512-bit
  vector; the derivation is in the module docstring of ``numvar.instrument.kernels``);
* the measured rate of :func:`numvar.instrument.kernels.contract` (shape M × K × N,
  best of ``--repeats``, timed by the thread's CPU time so that a loaded machine's
  preemptions do not count) in terms/s and as a fraction of the measured ceiling and of
  the model, for sr and fma-sr (``contraction="fma"``) in binary32, and sr in binary64
  (clean rows and scalar path).

The same count and ceilings for the binary32 fma-sr clean loop (``_cleanfma32``) and the
binary64 sr clean loop (``_clean64``, whose TwoProduct must be a hardware FMA: the script
says whether the loop has ``vfmadd``/``vfmsub``); each clean row's fraction is of its own
loop's ceiling, the scalar rows' of the binary32 sr ceiling.

With ``--few`` it prints instead the times of binary32 products with at most
``FEW_LANES`` outputs (rows × columns) through the few-outputs kernel
(``_contract_few32``, ``b`` a transposed view as a linear layer's ``weight.t()``) and
through the column kernel (``KN.FEW_KERNEL`` off, ``b`` contiguous), in sr (the other
modes keep the column kernel).

With ``--narrow`` it prints instead the rates of products with few columns (N <= 16)
through the narrow-product kernels (``_contract_narrow32``, ``_contract_narrow64``,
vectorised across rows) and through the column-vectorised kernels, and their ratio.

It runs on one core: it sets numba's (and torch's) thread count to 1 itself, since the
rates are timed by the calling thread's CPU time, which a kernel spread over several
threads would understate (a run with two threads printed 117 % of the ceiling).
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np
from numba import njit

from numvar.instrument import kernels as KN


@njit(cache=True)
def _add_chain(n, y):  # pragma: no cover - compiled
    x = 0.0
    for _ in range(n):
        x = x + y  # one dependent add per iteration (no fast-math: not reassociated)
    return x


def add_latency(clock: float) -> float:
    """Cycles per float64 add of a dependent chain at ``clock`` (best of 50 short chains:
    a loaded shared machine preempts long ones; the best run is the undisturbed one)."""
    n = 1_000_000
    _add_chain(10, 1.0)
    best = min(_timed(lambda: _add_chain(n, 1e-300)) for _ in range(50))
    return best * clock / n


def _operands(text: str) -> list[str]:
    """AT&T operands split at top-level commas (not those inside ``(base,index,scale)``)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and not depth:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def independent(body: list[str]) -> list[str]:
    """The loop's vector instructions with every dependency between them cut: loads,
    broadcasts from memory and stores left out (load and store ports, which the ceiling
    leaves out), a memory operand folded into an arithmetic instruction read from a
    register instead, sources are constant registers 0–7, destinations rotate over the
    registers above them (zmm8–zmm31 with AVX-512, ymm8–ymm15 with AVX2) and k1–k4,
    masks dropped. Same instructions, same pipes: timed, they run at the vector ports'
    throughput for this mix on this host."""
    from bench_pipes import registers

    count = registers()[1]
    out, r, k = [], 0, 0
    for x in body:
        if not re.search(r"%[xyz]mm", x) or _STORE.match(x) or _LOAD_ONLY.match(x):
            continue
        mnem, rest = re.split(r"\s+", x.strip(), maxsplit=1)
        ops = _operands(re.sub(r"\s*\{%k\d\}", "", rest.strip()))
        *src, dst = ops
        widest = max((m.group(1) for o in ops if (m := re.match(r"%([xyz])mm\d+$", o))),
                     default="z", key="xyz".index)
        src = [("$" + o) if o.startswith("$") else  # "$$": a literal $ in inline asm
               f"%{m.group(1)}mm{int(m.group(2)) % 8}"
               if (m := re.match(r"%([xyz])mm(\d+)$", o)) else
               f"%{widest}mm0" if "(" in o else o
               for o in src]
        if dst.startswith("%k"):
            dst, k = f"%k{1 + k % 4}", k + 1
        elif m := re.match(r"%([xyz])mm\d+$", dst):
            dst, r = f"%{m.group(1)}mm{8 + r % (count - 8)}", r + 1
        else:  # a general-purpose register: not a vector-port result
            continue
        out.append(f"{mnem} {', '.join(src + [dst])}")
    return out


def port_bound_cycles(body: list[str], passes: int = 6) -> float:
    """Measured cycles per pass of the loop's vector instructions with their dependencies
    cut (:func:`independent`), ``passes`` copies per iteration: the port-bound ceiling of
    this host, whatever its pipes and micro-op counts (Intel splits a vpmullq into 3;
    AVX2 has none and builds it from three vpmuludq)."""
    from bench_pipes import _seconds_per_iteration, clock_hz

    lines = independent(body) * passes
    return _seconds_per_iteration(lines, 20_000) * clock_hz() / passes


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _cpu_timed(fn) -> float:
    """CPU time of the calling thread (one core: numba runs the kernel on it), which a
    loaded machine's preemptions do not inflate as they do wall-clock time."""
    t = time.thread_time()
    fn()
    return time.thread_time() - t


_PURE_LOAD = re.compile(r"^\s*v(movup[sd]|movdqu64|movdqa64|movdq[au]|movap[sd])\s+-?\w*\(")
_REG_MOVE = re.compile(r"^\s*vmov(dqa64|dqu64|dqa|dqu|apd|aps|upd|ups)\s+%[yz]mm\d+,\s*"
                       r"%[yz]mm\d+\s*$")
_STORE = re.compile(r"^\s*v\w+\s+%[xyz]mm\d+,\s*-?\w*\(")
#: loads and broadcasts from memory: load ports only, on Zen 4 and on Intel cores alike
_LOAD_ONLY = re.compile(r"^\s*v(mov\w+|p?broadcast\w+)\s+-?\w*\(")


#: the term hash's 64-bit multiply: one instruction with AVX-512, three ``vpmuludq``
#: (32×32→64 halves) and shifts with AVX2
_HASH_MUL = re.compile(r"\bvpmul(lq|udq)\b")
#: the loop index step: ``addq $STEP, %REG`` where ``%REG`` indexes float64 elements
_STEP = re.compile(r"^\s*addq\s+\$(\d+),\s*%(\w+)\s*$")


def terms_per_iteration(body: list[str]) -> int:
    """Terms (float64 lanes) one pass of the loop ``body`` computes: the step of the index
    register its memory operands scale by 8 (``(%base,%index,8)``), else one vector of
    the widest register it uses (8 lanes of zmm, 4 of ymm)."""
    text = "\n".join(body)
    for x in body:
        m = _STEP.match(x)
        if m and re.search(rf",%{m.group(2)},8\)", text):
            return int(m.group(1))
    return 8 if "zmm" in text else 4


def _memory_operands(x: str) -> tuple[list[str], list[str]]:
    """(read, written) memory operands of one AT&T instruction: a vector store writes its
    last operand; every other memory operand is read."""
    parts = x.strip().split(None, 1)
    if len(parts) < 2:
        return [], []
    ops = _operands(parts[1])
    mem = [o for o in ops if "(" in o]
    if _STORE.match(x) and ops and "(" in ops[-1]:
        return mem[:-1], [ops[-1]]
    return mem, []


def _updates_memory(body: list[str]) -> bool:
    """Whether the loop stores a vector to an address (the same operand, offset included)
    it also loads from: the k >= 1 loop of a clean row (``acc[j] = RND(acc[j] +
    RND(a_k·b_kj))``); the k = 0 loop and the term-bits loop only write theirs."""
    read, written = set(), set()
    for x in body:
        r, w = _memory_operands(x)
        read.update(r)
        written.update(w)
    return bool(read & written)


_INNER_LABEL = re.compile(r"^\.LBB\S+:")
_F64_ARITH = re.compile(r"^\s*v(add|sub|mul|div)pd\b")


def _innermost_loops(asm: str) -> list[list[str]]:
    """The bodies of the innermost loops on vector registers in ``asm``: the instructions
    from a label to the conditional jump back to it, with no other label between."""
    lines = asm.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines)
              if (m := re.match(r"^(\.LBB\S+):", ln))}
    out = []
    for i, ln in enumerate(lines):
        m = re.match(r"\s+j\w+\s+(\.LBB\S+)$", ln)
        if not m or m.group(1) not in labels or labels[m.group(1)] > i:
            continue
        if any(_INNER_LABEL.match(x) for x in lines[labels[m.group(1)] + 1:i]):
            continue
        body = [x for x in lines[labels[m.group(1)]:i + 1]
                if x.startswith("\t") and not x.strip().startswith((".", "#"))]
        if re.search("[yz]mm", "\n".join(body)):
            out.append(body)
    return out


def step_loops(asm: str) -> list[list[str]]:
    """The loops one k >= 1 step of a clean row runs, in the machine code of one SR clean
    loop (:func:`clean_loop_asm`): the accumulating loop (the innermost vector loop with a
    float64 add that stores to an address it loads from, :func:`_updates_memory`) and,
    where the term hash is not in it, the loop before it that draws the bits (the hash's
    64-bit multiply, ``vpmullq`` with AVX-512, ``vpmuludq`` halves with AVX2): the
    term-bits loop (``kernels._term_bits_row``, no float64 arithmetic) or, for binary64
    where ``kernels.PRODUCTS64_APART``, the loop of the bits and the rounded products
    (two stores per pass's vector of terms: the k = 0 loop, which also multiplies, stores
    one). Of each kind the main vectorised body: the most terms per pass
    (:func:`terms_per_iteration`), then the shortest (not a remainder loop)."""
    loops = _innermost_loops(asm)

    def main_body(cands):
        return min(cands, key=lambda b: (-terms_per_iteration(b), len(b))) if cands else None

    step = main_body([b for b in loops if _updates_memory(b)
                      and any(_F64_ARITH.match(x) for x in b)])
    if step is None:
        raise RuntimeError("SR clean loop not found in the generated code")
    if _HASH_MUL.search("\n".join(step)):
        return [step]
    hashed = [b for b in loops if _HASH_MUL.search("\n".join(b)) and not _updates_memory(b)]
    bits = main_body([b for b in hashed if not any(_F64_ARITH.match(x) for x in b)])
    if bits is None:  # the bits with the products (binary64, kernels.PRODUCTS64_APART)
        bits = main_body([b for b in hashed if _stores_per_vector(b) >= 2])
    if bits is None:
        raise RuntimeError("the term-bits loop not found in the generated code")
    return [bits, step]


def _stores_per_vector(body: list[str]) -> float:
    """Vector stores per vector of terms (8 lanes of zmm, 4 of ymm) of one pass of ``body``."""
    lanes = 8 if re.search("zmm", "\n".join(body)) else 4
    return sum(1 for x in body if _STORE.match(x)) * lanes / terms_per_iteration(body)


def loop_uops(body: list[str]) -> int:
    """Vector micro-ops per pass of the loop ``body`` (one of :func:`step_loops`): every
    instruction on an xmm/ymm/zmm register except pure loads and stores (load/store
    ports, not the vector ports); a load folded into an arithmetic instruction counts
    once. A pass computes :func:`terms_per_iteration` terms."""
    return len([x for x in body if re.search(r"%[xyz]mm", x)
                and not _PURE_LOAD.match(x) and not _STORE.match(x)])


def clean_loop_asm(kernel=KN._clean32, dtype=np.float32, *extra) -> str:
    """Machine code of a clean-row kernel (``_clean32``, ``_cleanfma32`` with ``extra``
    = (24,): its ``t``, ``_clean64``) in SR mode alone, compiled afresh (a cached
    dispatcher holds none): the kernel inlined into a caller that passes the mode (and
    ``t``) as constants, so that its other modes' loops are folded away and the code
    holds SR's k = 0 and k >= 1 loops only, which :func:`step_loops` tells apart without
    looking for any one instruction (AVX-512 and AVX2 spell the same loop differently).
    The kernel itself holds every mode's loops in one function; its SR loop is the same
    code up to register allocation (AVX2, Zen 3: binary32 fma 75 instructions there, 76
    here; binary64 141 there, 144 here)."""
    inner = njit(inline="always")(kernel.py_func)
    sr = KN._SR
    t = extra[0] if extra else 0

    if extra:
        @njit
        def only_sr(acc, jg, arow, bmat, ukey, base, j0, n):  # pragma: no cover
            inner(acc, jg, arow, bmat, ukey, base, j0, n, sr, t)
    else:
        @njit
        def only_sr(acc, jg, arow, bmat, ukey, base, j0, n):  # pragma: no cover
            inner(acc, jg, arow, bmat, ukey, base, j0, n, sr)
    n = 64
    acc = np.empty(n)
    jg = np.arange(n, dtype=np.uint64) * np.uint64(KN._G)
    only_sr(acc, jg, np.ones(8, dtype), np.ones((8, n), np.float64), np.uint64(1),
            np.uint64(0), 0, n)
    return only_sr.inspect_asm(only_sr.signatures[0])


def rate(dtype, shape, repeats: int, mode: int, contraction: str = "separate",
         clean: bool = True) -> float:
    rng = np.random.default_rng(0)
    m, k, n = shape
    a = rng.uniform(0.5, 1.0, (1, m, k)).astype(dtype)
    b = rng.uniform(0.5, 1.0, (1, k, n)).astype(dtype)
    if not clean:
        a[0, :, 0] = 2.0 ** -140 if dtype == np.float32 else 2.0 ** -1070  # no clean row
    kw = {} if contraction == "separate" else {"contraction": contraction}
    KN.contract(a, b, 1, mode, 24 if dtype == np.float32 else 53, **kw)
    t = min(_cpu_timed(lambda: KN.contract(a, b, 1, mode, 24 if dtype == np.float32 else 53,
                                          **kw))
            for _ in range(repeats))
    return m * k * n / t


def narrow_table(repeats: int) -> None:
    """sr rates of products with few columns through the narrow kernels and with
    ``KN.NARROW_KERNEL`` off (the column-vectorised kernels), timed alternately: binary32
    (``_contract_narrow32``, up to ``NARROW_N_AVX2`` columns on hosts without 512-bit
    vectors; "(not taken)" where ``contract`` does not take it) and binary64
    (``_contract_narrow64``; a one-column head as ``sine_mlp_f64``'s last layer,
    256 x 128 x 1, included)."""
    print(f"{'dtype':>8s} {'M x K x N':>18s} {'narrow G terms/s':>17s} {'columns G terms/s':>18s} "
          f"{'ratio':>6s}")
    shapes = {np.float32: ((512, 4608, 8), (512, 2304, 4), (256, 2304, 12), (256, 2304, 16),
                           (64, 576, 10), (40, 576, 8), (256, 2304, 24), (256, 128, 1),
                           (128, 128, 32), (128, 128, 64), (128, 128, 128), (512, 512, 64),
                           (48, 576, 32), (32, 32, 16), (32, 64, 16), (32, 16, 32),
                           (72, 64, 64)),
              np.float64: ((256, 128, 1), (512, 576, 4), (256, 576, 16), (256, 576, 24))}
    for dtype, dshapes in shapes.items():
        for m, k, n in dshapes:
            best = {True: 0.0, False: 0.0}
            for _ in range(max(1, repeats // 5)):
                for flag in (True, False):
                    KN.NARROW_KERNEL = flag
                    best[flag] = max(best[flag], rate(dtype, (m, k, n), 5, KN._SR))
            KN.NARROW_KERNEL = True
            taken = (KN._narrow32_serves((1, m, n), m * k * n, False) if dtype == np.float32
                     else n <= KN.NARROW_N and KN._narrow_rows_fit(m, n))
            used = "" if taken else "  (not taken)"
            print(f"{np.dtype(dtype).name:>8s} {f'{m} x {k} x {n}':>18s} {best[True] / 1e9:17.2f} "
                  f"{best[False] / 1e9:18.2f} {best[True] / best[False]:6.2f}{used}")


def few_table(repeats: int) -> None:
    """µs per :func:`contract` call (the best of ``repeats`` runs of ten calls, the
    thread's CPU time) of
    products with few outputs through ``_contract_few32`` and with ``KN.FEW_KERNEL`` off,
    timed alternately: fft_filter's classifier head (2 × 4096 @ 4096 × 4) and other
    shapes of two to FEW_LANES outputs in two rows or more (one row keeps the column
    kernel: ``KN.FEW_K``)."""
    print(f"{'M x K x N':>16s} {'few µs':>8s} {'columns µs':>11s} {'ratio':>6s}")
    rng = np.random.default_rng(0)
    for m, k, n in ((2, 4096, 4), (4, 1024, 2), (8, 512, 1), (2, 1024, 4), (2, 256, 4),
                    (2, KN.FEW_K, 4), (2, 4096, 1)):
        a = rng.standard_normal((1, m, k)).astype(np.float32)
        bt = (rng.standard_normal((1, n, k)) * 0.02).astype(np.float32)
        views = {True: bt.transpose(0, 2, 1), False: np.ascontiguousarray(bt.transpose(0, 2, 1))}
        best = {True: float("inf"), False: float("inf")}
        for _ in range(repeats):
            for flag in (True, False):
                KN.FEW_KERNEL = flag
                b = views[flag]
                best[flag] = min(best[flag], _cpu_timed(
                    lambda a=a, b=b: [KN.contract(a, b, 1, KN._SR, 24) for _ in range(10)]) / 10)
        KN.FEW_KERNEL = True
        print(f"{f'{m} x {k} x {n}':>16s} {best[True] * 1e6:8.1f} {best[False] * 1e6:11.1f} "
              f"{best[False] / best[True]:6.2f}")


def one_core() -> None:
    """numba's and torch's thread counts set to 1 (the rates are per core)."""
    import numba
    import torch

    numba.set_num_threads(1)
    torch.set_num_threads(1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--shape", type=int, nargs=3, default=(16, 288, 1024),
                    metavar=("M", "K", "N"), help="default: a 32-channel 3x3 convolution's "
                    "product, 16 rows, K = 288, 1024 columns: ~2 ms calls, short enough to run "
                    "undisturbed on a loaded machine")
    ap.add_argument("--narrow", action="store_true",
                    help="only compare the narrow-product kernels (_contract_narrow32 and "
                    "_contract_narrow64, vectorised across rows) with the column-vectorised "
                    "ones on products with few columns (ResNet-18's last convolutions on a "
                    "2 x 64^2 batch: N = 8; a float64 MLP's one-column head)")
    ap.add_argument("--few", action="store_true",
                    help="only compare the few-outputs kernel (_contract_few32: at most "
                    "FEW_LANES rows x columns, such as fft_filter's 2 x 4096 @ 4096 x 4 "
                    "head) with the column kernel")
    args = ap.parse_args(argv)
    one_core()
    if args.few:
        few_table(args.repeats)
        return
    if args.narrow:
        narrow_table(args.repeats)
        return
    from bench_pipes import clock_hz, vector_isa

    isa = vector_isa()  # exits with a message on a host without AVX2 or AVX-512
    f = clock_hz()
    print(f"clock {f / 1e9:.2f} GHz (dependent integer adds, benchmarks/bench_pipes.py); "
          f"float64 add latency {add_latency(f):.1f} cycles; vector instructions: {isa}")
    model, ports = {}, {}
    for label, asm in (
            ("binary32 sr", lambda: clean_loop_asm()),
            ("binary32 fma-sr", lambda: clean_loop_asm(KN._cleanfma32, np.float32, 24)),
            ("binary64 sr", lambda: clean_loop_asm(KN._clean64, np.float64))):
        try:
            bodies = step_loops(asm())
        except (RuntimeError, AttributeError) as exc:  # no such loop on this host/version
            print(f"{label} clean loop: not found ({exc})")
            continue
        # per 8 terms, summed over the step's loops (the term bits' and the accumulating)
        per8 = sum(loop_uops(b) * 8 / terms_per_iteration(b) for b in bodies)
        cycles = sum(port_bound_cycles(b) * 8 / terms_per_iteration(b) for b in bodies)
        moves = sum(1 for b in bodies for x in b if _REG_MOVE.match(x))
        body = [x for b in bodies for x in b]
        shape = " + ".join(f"{len(b)} instructions, {terms_per_iteration(b)} terms per pass"
                           for b in bodies)
        ports[label] = f * 8 / cycles
        if isa == "avx512":  # the module's model: two 512-bit ports (Zen 4)
            model[label] = 2 * f * 8 / per8
            derived = (f"model of one micro-op each, two per cycle: 2 x clock x 8 / "
                       f"{per8:g} = {model[label] / 1e9:.2f} G terms/s")
        else:
            derived = "no port model for AVX2 (the measured ceiling stands alone)"
        fmas = sorted({x.split()[0] for x in body
                       if x.split()[0].startswith(("vfmadd", "vfmsub", "vfnmadd", "vfnmsub"))})
        print(f"{label} clean loop{'s' if len(bodies) > 1 else ''}: {shape}; "
              f"{per8:g} vector instructions per 8 terms ({moves} register-to-register "
              f"moves per pass); ports measured: {cycles:.2f} cycles per 8 terms with the "
              f"dependencies cut, ceiling {ports[label] / 1e9:.2f} G terms/s; {derived}"
              + (f"; FMA: {', '.join(fmas) or 'NONE (not a hardware FMA)'}"
                 if label == "binary64 sr" else ""))
    rows = [("binary32 sr separate (clean rows)", np.float32, "separate", True, "binary32 sr"),
            ("binary32 sr fma (clean rows)", np.float32, "fma", True, "binary32 fma-sr"),
            ("binary32 sr separate (scalar rows)", np.float32, "separate", False, "binary32 sr"),
            ("binary64 sr separate (clean rows)", np.float64, "separate", True, "binary64 sr"),
            ("binary64 sr separate (scalar rows)", np.float64, "separate", False, "binary32 sr")]
    print(f"{'kernel':38s} {'G terms/s':>10s} {'of ceiling':>11s} {'of model':>10s}")
    for name, dt, con, clean, ceil in rows:
        try:
            r = rate(dt, args.shape, args.repeats, KN._SR, con, clean)
        except TypeError:  # a kernel without that option on this version
            continue
        frac = (f"{100 * r / ports[ceil]:10.1f}%" if ceil in ports else f"{'-':>11s}")
        frac += f" {100 * r / model[ceil]:9.1f}%" if ceil in model else f" {'-':>10s}"
        print(f"{name:38s} {r / 1e9:10.3f} {frac} (of {ceil})", flush=True)


if __name__ == "__main__":
    main()
