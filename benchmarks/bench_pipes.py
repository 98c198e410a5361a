"""Which vector pipes take which instruction of the SR clean loop (one core).

    python benchmarks/bench_pipes.py [--clock-ghz GHZ]

Builds, with llvmlite (numba's own LLVM binding), loops of 16 independent vector
instructions as inline assembly and times them by the thread's CPU time: the cycles per
instruction of each kind alone (0.5: any of two pipe pairs; 1: one pair only; below 0.5:
not executed on a vector pipe, e.g. a move renamed away), and of pairs of kinds, 8 + 8
(8 cycles: the two kinds use different pairs; 16: the same pair). The derivation of the
clean loop's ceiling in ``numvar.instrument.kernels`` quotes these numbers.

x86-64 only. The instructions are those numba generates on the host (:func:`vector_isa`):
512-bit (zmm, 32 registers) with AVX-512, else 256-bit (ymm, 16 registers) with AVX2,
where the clean loop's 64-bit multiply ``vpmullq`` does not exist and is built from
``vpmuludq`` (32×32→64) and shifts. Anything else exits with a message: inline assembly
of an instruction the core lacks would kill the process (SIGILL).
"""

from __future__ import annotations

import argparse
import ctypes
import time

import llvmlite.binding as llvm

_KEEP: list = []  # execution engines must outlive their functions


class UnsupportedHost(SystemExit):
    """The host has neither AVX-512 nor AVX2 (or is not x86-64): nothing here can run."""


def vector_isa() -> str:
    """``"avx512"`` (AVX-512 F and DQ: zmm registers, ``vpmullq``) or ``"avx2"`` (ymm
    registers) by the host CPU's features as LLVM reads them, the code numba generates
    there; raises :class:`UnsupportedHost` (a clean exit with a message) otherwise."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise UnsupportedHost(f"bench_pipes/bench_kernels time x86-64 vector instructions; "
                              f"this host is {platform.machine()}")
    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features()
    if features.get("avx512f") and features.get("avx512dq"):
        return "avx512"
    if features.get("avx2"):
        return "avx2"
    raise UnsupportedHost("bench_pipes/bench_kernels need AVX2 or AVX-512; "
                          f"this CPU ({llvm.get_host_cpu_name()}) has neither")


def registers() -> tuple[str, int]:
    """The vector register class of :func:`vector_isa` and how many there are:
    ``("zmm", 32)`` or ``("ymm", 16)``."""
    return ("zmm", 32) if vector_isa() == "avx512" else ("ymm", 16)


def _compile(lines: list[str], name: str):
    reg, count = registers()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
    asm = "\\0A".join(lines)
    # (AVX2's vpbroadcastq reads an xmm register, not a general-purpose one)
    init = "\\0A".join(["movabsq $$4607182418800017408, %rax", "vmovq %rax, %xmm0"]
                        + [f"vpbroadcastq %xmm0, %{reg}{i}" for i in range(count)])
    clobbers = ",".join(f"~{{{reg}{i}}}" for i in range(count))
    if reg == "zmm":
        clobbers += ",~{k1},~{k2},~{k3},~{k4}"
    clobbers += ",~{rcx},~{dirflag},~{fpsr},~{flags}"
    ir = f"""
define void @{name}(i64 %n) {{
entry:
  ; every register 1.0: repeated products stay 1.0 and sums grow, so no operand or
  ; result is ever subnormal (Intel cores take a microcode assist on those)
  call void asm sideeffect "{init}", "~{{rax}},{clobbers}"()
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i2, %loop]
  call void asm sideeffect "{asm}", "{clobbers}"()
  %i2 = add i64 %i, 1
  %c = icmp slt i64 %i2, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}}"""
    mod = llvm.parse_assembly(ir)
    mod.verify()
    ee = llvm.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    _KEEP.append(ee)
    return ctypes.CFUNCTYPE(None, ctypes.c_int64)(ee.get_function_address(name))


def _seconds_per_iteration(lines: list[str], n: int = 200_000, rounds: int = 30) -> float:
    fn = _compile(lines, f"loop{len(_KEEP)}")
    fn(1000)
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        fn(n)
        best = min(best, time.thread_time() - t)
    return best / n


def cycles_per_iteration(lines: list[str], clock: float, n: int = 200_000) -> float:
    return _seconds_per_iteration(lines, n) * clock


#: dependent scalar integer adds per iteration of the clock loop
CHAIN = 64


def clock_hz(rounds: int = 50) -> float:
    """Core clock, measured: a loop of ``CHAIN`` dependent ``addq %rax, %rcx`` takes CHAIN
    cycles per iteration on every x86-64 core (register-to-register integer add: latency
    1 on AMD and Intel alike; the loop counter runs beside the chain), timed by the
    thread's CPU time, best of ``rounds``. Not an add of an immediate: Intel's Golden
    Cove folds chains of those at rename (it measured 24 GHz here). Not a float64 add
    chain: its latency differs by core (3 cycles on AMD Zen 4, 4 on Intel Skylake-X, 2
    on Golden Cove's adders)."""
    return CHAIN / _seconds_per_iteration(["addq %rax, %rcx"] * CHAIN, 100_000, rounds)


#: the clean loop's instruction kinds on 512-bit registers (AVX-512)
KINDS = {
    "vpaddq": "vpaddq %zmm0, %zmm{r}, %zmm{r}",
    "vpxorq": "vpxorq %zmm0, %zmm{r}, %zmm{r}",
    "vpandq": "vpandq %zmm0, %zmm{r}, %zmm{r}",
    "vpternlogq": "vpternlogq $$150, %zmm0, %zmm1, %zmm{r}",
    "vpsrlq": "vpsrlq $$1, %zmm{r}, %zmm{r}",
    "vpmullq": "vpmullq %zmm0, %zmm{r}, %zmm{r}",
    "vmulpd": "vmulpd %zmm0, %zmm{r}, %zmm{r}",
    "vaddpd": "vaddpd %zmm0, %zmm{r}, %zmm{r}",
    "vcmpeqpd": "vcmpeqpd %zmm0, %zmm{r}, %k{k}",
    "vcvtps2pd": "vcvtps2pd %ymm1, %zmm{r}",
    "vmovdqa64": "vmovdqa64 %zmm0, %zmm{r}",
}
#: the same on 256-bit registers (AVX2): no vpternlogq, no mask registers (a compare
#: writes a vector, a select is vblendvpd), and vpmuludq where AVX-512 has vpmullq
KINDS_AVX2 = {
    "vpaddq": "vpaddq %ymm0, %ymm{r}, %ymm{r}",
    "vpxor": "vpxor %ymm0, %ymm{r}, %ymm{r}",
    "vpand": "vpand %ymm0, %ymm{r}, %ymm{r}",
    "vpsrlq": "vpsrlq $$1, %ymm{r}, %ymm{r}",
    "vpsllq": "vpsllq $$1, %ymm{r}, %ymm{r}",
    "vpmuludq": "vpmuludq %ymm0, %ymm{r}, %ymm{r}",
    "vmulpd": "vmulpd %ymm0, %ymm{r}, %ymm{r}",
    "vaddpd": "vaddpd %ymm0, %ymm{r}, %ymm{r}",
    "vcmpeqpd": "vcmpeqpd %ymm0, %ymm1, %ymm{r}",
    "vblendvpd": "vblendvpd %ymm0, %ymm1, %ymm2, %ymm{r}",
    "vcvtps2pd": "vcvtps2pd %xmm1, %ymm{r}",
    "vmovapd": "vmovapd %ymm0, %ymm{r}",
}
PAIRS = [("vpsrlq", "vaddpd"), ("vpsrlq", "vmulpd"), ("vmulpd", "vaddpd"),
         ("vpmullq", "vmulpd"), ("vpmullq", "vaddpd"), ("vcmpeqpd", "vmulpd"),
         ("vcmpeqpd", "vaddpd"), ("vcvtps2pd", "vaddpd"), ("vcvtps2pd", "vmulpd"),
         ("vpsrlq", "vpaddq")]
PAIRS_AVX2 = [("vpsrlq", "vaddpd"), ("vpsrlq", "vmulpd"), ("vmulpd", "vaddpd"),
              ("vpmuludq", "vmulpd"), ("vpmuludq", "vaddpd"), ("vpmuludq", "vpaddq"),
              ("vcmpeqpd", "vmulpd"), ("vcmpeqpd", "vaddpd"), ("vblendvpd", "vaddpd"),
              ("vpsrlq", "vpaddq")]


def kinds() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(instruction kinds, pairs) for the host's :func:`vector_isa`."""
    return (KINDS, PAIRS) if vector_isa() == "avx512" else (KINDS_AVX2, PAIRS_AVX2)


def _lines(kind: str, regs, table: dict[str, str]) -> list[str]:
    return [table[kind].format(r=r, k=1 + r % 4) for r in regs]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clock-ghz", type=float, default=None,
                    help="core clock (default: measured by a dependent integer add chain)")
    args = ap.parse_args(argv)
    clock = args.clock_ghz * 1e9 if args.clock_ghz else clock_hz()
    print(f"clock {clock / 1e9:.2f} GHz"
          + ("" if args.clock_ghz else f" ({CHAIN} dependent integer adds per iteration)"))
    table, pairs = kinds()
    reg, count = registers()
    # destinations above the sources (0-7): 16 distinct registers with AVX-512, the 8
    # there are (each twice) with AVX2
    first = [8 + r % (count - 8) for r in range(16)]
    second = first[8:] if count == 16 else list(range(16, 24))
    print(f"cycles per instruction, 16 independent {reg} instructions per iteration "
          f"({vector_isa()})")
    for kind in table:
        c = cycles_per_iteration(_lines(kind, first, table), clock)
        print(f"  {kind:12s} {c / 16:.2f}")
    print("cycles per 8 + 8 (8: different pipe pairs, 16: the same pair)")
    for x, y in pairs:
        c = cycles_per_iteration(_lines(x, first[:8], table) + _lines(y, second, table), clock)
        print(f"  {x + ' + ' + y:24s} {c:.1f}")


if __name__ == "__main__":
    main()
