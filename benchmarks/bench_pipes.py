"""Which vector pipes take which 512-bit instruction of the SR clean loop (one core).

    python benchmarks/bench_pipes.py [--clock-ghz 3.69]

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
    clobbers = ",".join(f"~{{zmm{i}}}" for i in range(32))
    clobbers += ",~{k1},~{k2},~{k3},~{k4},~{dirflag},~{fpsr},~{flags}"
    ir = f"""
define void @{name}(i64 %n) {{
entry:
  ; constants that are ordinary doubles / integers (no subnormal slow paths)
  call void asm sideeffect "movabsq $$4604930618986332160, %rax\\0Avpbroadcastq %rax, %zmm0\\0Avpbroadcastq %rax, %zmm1", "~{{rax}},~{{zmm0}},~{{zmm1}}"()
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


def cycles_per_iteration(lines: list[str], clock: float, n: int = 200_000) -> float:
    fn = _compile(lines, f"loop{len(_KEEP)}")
    fn(1000)
    best = float("inf")
    for _ in range(30):
        t = time.thread_time()
        fn(n)
        best = min(best, time.thread_time() - t)
    return best * clock / n


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
    ap.add_argument("--clock-ghz", type=float, default=3.69,
                    help="core clock (bench_kernels.py measures it)")
    args = ap.parse_args(argv)
    clock = args.clock_ghz * 1e9
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
