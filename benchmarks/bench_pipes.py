"""Which vector pipes take which 512-bit instruction of the SR clean loop (one core).

    python benchmarks/bench_pipes.py [--clock-ghz GHZ]

Builds, with llvmlite (numba's own LLVM binding), loops of 16 independent 512-bit
instructions as inline assembly and times them by the thread's CPU time: the cycles per
instruction of each kind alone (0.5: any of two 512-bit pipe pairs; 1: one pair only;
below 0.5: not executed on a vector pipe, e.g. a move renamed away), and of pairs of
kinds, 8 + 8 (8 cycles: the two kinds use different pairs; 16: the same pair). The
derivation of the clean loop's ceiling in ``numvar.instrument.kernels`` quotes these
numbers. x86-64 with AVX-512 only.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import llvmlite.binding as llvm

_KEEP: list = []  # execution engines must outlive their functions


def _compile(lines: list[str], name: str):
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
    asm = "\\0A".join(lines)
    init = "\\0A".join(["movabsq $$4607182418800017408, %rax"]
                        + [f"vpbroadcastq %rax, %zmm{i}" for i in range(32)])
    clobbers = ",".join(f"~{{zmm{i}}}" for i in range(32))
    clobbers += ",~{k1},~{k2},~{k3},~{k4},~{rcx},~{dirflag},~{fpsr},~{flags}"
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
PAIRS = [("vpsrlq", "vaddpd"), ("vpsrlq", "vmulpd"), ("vmulpd", "vaddpd"),
         ("vpmullq", "vmulpd"), ("vpmullq", "vaddpd"), ("vcmpeqpd", "vmulpd"),
         ("vcmpeqpd", "vaddpd"), ("vcvtps2pd", "vaddpd"), ("vcvtps2pd", "vmulpd"),
         ("vpsrlq", "vpaddq")]


def _lines(kind: str, regs) -> list[str]:
    return [KINDS[kind].format(r=r, k=1 + r % 4) for r in regs]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clock-ghz", type=float, default=None,
                    help="core clock (default: measured by a dependent integer add chain)")
    args = ap.parse_args(argv)
    clock = args.clock_ghz * 1e9 if args.clock_ghz else clock_hz()
    print(f"clock {clock / 1e9:.2f} GHz"
          + ("" if args.clock_ghz else f" ({CHAIN} dependent integer adds per iteration)"))
    print("cycles per instruction, 16 independent 512-bit instructions per iteration")
    for kind in KINDS:
        c = cycles_per_iteration(_lines(kind, range(8, 24)), clock)
        print(f"  {kind:12s} {c / 16:.2f}")
    print("cycles per 8 + 8 (8: different pipe pairs, 16: the same pair)")
    for x, y in PAIRS:
        c = cycles_per_iteration(_lines(x, range(8, 16)) + _lines(y, range(16, 24)), clock)
        print(f"  {x + ' + ' + y:24s} {c:.1f}")


if __name__ == "__main__":
    main()
