"""numvar's benchmark table: workloads under every rounding mode and granularity.

For each workload (digits, brain, speech) this measures, in one process and one run:

- native PyTorch time per inference (the model's forward on a fixed batch, no autograd);
- numvar time per inference under ``numvar.instrument.fuzzy(mode, granularity)`` for
  mode ∈ {ieee, sr, ud, random} and granularity ∈ {flop, op}, and the slowdown ratio;
- peak extra resident memory during those inferences (sampled from /proc/self/statm);

and the flop-level SR matmul kernel (``numvar.instrument.kernels.contract``) at 256³
and 512³ in MFLOP/s (2·n³ flops) against ``torch.matmul``. Times are the best of
``--repeat`` interleaved rounds (every configuration of a workload once per round, as
``bench_zoo.best_of`` runs them) after a warm-up round, which also compiles numba
kernels; with ``--threads 1`` by the calling thread's CPU time (time a shared host's
other jobs take from it does not count), else by wall time (``bench_zoo.clock_for``).
Measured one configuration after another by wall time instead, on a shared 2-core
host, ``bench_instrument.py``'s transformer encoder took 1.8 to 3.1 ms natively from one
run of the same script to the next, and its ratios moved with it. Peak memory is sampled
over one more call of each configuration, after the warm-up.

Writes the table with a description of the machine to ``benchmarks/results.md``::

    python benchmarks/run_all.py --threads 1           # everything, one core (a minute)
    python benchmarks/run_all.py --workloads digits --modes sr --granularities flop
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

HERE = Path(__file__).resolve().parent
PAPER = {  # Fuzzy PyTorch (TMLR), slowdown vs their IEEE build: (SR, UD)
    "digits": ("MNIST", 10.9, 7.9),
    "brain": ("FastSurfer", 4.1, 3.6),
    "speech": ("WavLM", 53.0, 64.0),
}
GOALS = {"digits": 10.0, "brain": 10.0, "speech": 20.0}  # flop SR slowdown goals; op: 2×


# ---------------------------------------------------------------- measurement helpers
class PeakRSS:
    """Peak resident set size above the level at entry, sampled every millisecond
    from /proc/self/statm (Linux); ``peak_mib`` is None elsewhere."""

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def _rss(self) -> int | None:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self._page
        except OSError:
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            r = self._rss()
            if r is not None:
                self._peak = max(self._peak, r)
            self._stop.wait(0.001)

    def __enter__(self) -> "PeakRSS":
        self._base = self._rss()
        self._peak = self._base or 0
        if self._base is not None:
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._base is None:
            return
        self._stop.set()
        self._t.join()
        self.peak_mib = max(self._peak - self._base, 0) / 2**20


def interleaved(fns: dict, repeat: int) -> dict:
    """Best time (s) of each of ``fns`` over ``repeat`` interleaved rounds after a warm-up
    round (``bench_zoo.best_of``), by ``bench_zoo.clock_for`` the current thread count:
    on a shared machine other processes only ever add time, so the minimum is the
    steadiest estimate of the work itself, and rounds that interleave the configurations
    expose them alike to the host's slow spells."""
    from bench_zoo import best_of, clock_for

    return best_of(fns, repeat, clock_for(torch.get_num_threads()))


@dataclass
class Row:
    workload: str
    batch: str
    mode: str
    granularity: str
    seconds: float
    native: float
    peak_mib: float | None

    @property
    def slowdown(self) -> float:
        return self.seconds / self.native


# ---------------------------------------------------------------- workloads
def workload_inputs(name: str, batch: int | None):
    """(trained model, input batch, description) of a workload."""
    if name == "digits":
        from numvar.workloads import digits as w
        b = batch or 64
        desc = f"{b} images 1×28×28"
    elif name == "brain":
        from numvar.workloads import brain as w
        b = batch or 4
        desc = None
    elif name == "speech":
        from numvar.workloads import speech as w
        b = batch or 4
        desc = None
    else:
        raise SystemExit(f"unknown workload {name!r}")
    trained = w.load_or_train()
    data = w.load_data("test", trained.config).subset(b)
    x = data.inputs
    if desc is None:
        shape = "×".join(map(str, x.shape[1:]))
        desc = f"{len(x)} {'slices' if name == 'brain' else 'signals'} {shape}"
    model = trained.model.eval()
    return (lambda: w.infer(model, x)), desc


def bench_workload(name: str, modes, granularities, repeat: int, batch: int | None,
                   log) -> list[Row]:
    from numvar.instrument import fuzzy

    infer, desc = workload_inputs(name, batch)
    fns: dict[tuple[str, str], Callable[[], object]] = {("native", "—"): infer}
    for gran in granularities:
        for mode in modes:
            def run(mode=mode, gran=gran):
                with fuzzy(mode=mode, granularity=gran, seed=0):
                    return infer()
            fns[mode, gran] = run
    for key, fn in fns.items():  # warm-up: numba compilation, caches
        fn()
        log(f"{name}: {' '.join(key)} warmed up")
    peak = {}
    for key, fn in fns.items():
        with PeakRSS() as mem:
            fn()
        peak[key] = mem.peak_mib
    best = interleaved(fns, repeat)
    native = best["native", "—"]
    rows = []
    for (mode, gran), t in best.items():
        rows.append(Row(name, desc, mode, gran, t, native, peak[mode, gran]))
        log(f"{name}: {mode:6s} {gran:4s} {t * 1e3:10.2f} ms  {t / native:8.1f}×")
    return rows


def profile(spec: str, batch: int | None, top: int = 10) -> str:
    """cProfile one inference of ``WORKLOAD:MODE:GRANULARITY`` (after a warm-up); the
    ``top`` functions by own time, as text."""
    import cProfile
    import io
    import pstats

    from numvar.instrument import fuzzy

    w, mode, gran = spec.split(":")
    infer, desc = workload_inputs(w, batch)

    def run():
        with fuzzy(mode=mode, granularity=gran, seed=0):
            infer()
    run()
    prof = cProfile.Profile()
    prof.runcall(run)
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf).sort_stats("tottime")
    total = st.total_tt
    lines = [f"profile {spec} ({desc}): {total * 1e3:.0f} ms under cProfile"]
    for (file, line, fn), (cc, nc, tt, ct, _) in sorted(
            st.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        short = "/".join(Path(file).parts[-2:]) if file != "~" else ""
        lines.append(f"  {100 * tt / total:5.1f} %  {tt * 1e3:8.1f} ms  {nc:6d} calls  "
                     f"{short}:{line}({fn})")
    return "\n".join(lines)


def bench_matmul(sizes, repeat: int, log) -> list[dict]:
    from numvar.instrument import kernels
    from numvar.rounding.kernels import MODE_SR

    out = []
    g = torch.Generator().manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=g)
        b = torch.randn(n, n, generator=g)
        an, bn = a.numpy()[None], b.numpy()[None]
        best = interleaved({"torch": lambda a=a, b=b: torch.matmul(a, b),
                            "sr": lambda an=an, bn=bn: kernels.contract(an, bn, 12345,
                                                                        MODE_SR, 24)},
                           max(repeat, 5))
        t_torch, t_sr = best["torch"], best["sr"]
        flops = 2.0 * n ** 3
        row = {"n": n, "torch_mflops": flops / t_torch / 1e6, "sr_mflops": flops / t_sr / 1e6,
               "ratio": t_sr / t_torch}
        out.append(row)
        log(f"matmul {n}³: torch {row['torch_mflops']:.0f} MFLOP/s, SR "
            f"{row['sr_mflops']:.0f} MFLOP/s ({row['ratio']:.1f}× slower)")
    return out


# ---------------------------------------------------------------- report
def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numba

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": str(os.cpu_count()),
            "threads (torch / numba)": f"{torch.get_num_threads()} / {numba.get_num_threads()}",
            "python": platform.python_version(), "torch": torch.__version__,
            "numba": numba.__version__, "os": f"{platform.system()} {platform.release()}",
            "load average at start": "—" if load is None else
            ", ".join(f"{v:.1f}" for v in load),
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.2f}" if s < 10 else f"{s * 1e3:.0f}"


def markdown(rows: list[Row], mm: list[dict], info: dict[str, str], repeat: int,
             notes: list[str], profiles: list[str] = ()) -> str:
    lines = ["# numvar benchmarks", "",
             "Generated by `python benchmarks/run_all.py`; times are the best of "
             f"{repeat} interleaved rounds after a warm-up round (one thread: the thread's "
             "CPU time; more: wall time), ratios against native PyTorch measured in the "
             "same rounds.", "", "## Machine", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += ["", "## Workloads: time per inference", "",
              "| workload | batch | mode | granularity | ms / inference | slowdown | "
              "peak extra RSS (MiB) |", "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        mem = "—" if r.peak_mib is None else f"{r.peak_mib:.0f}"
        lines.append(f"| {r.workload} | {r.batch} | {r.mode} | {r.granularity} | "
                     f"{fmt_ms(r.seconds)} | {r.slowdown:.1f}× | {mem} |")
    by = {(r.workload, r.mode, r.granularity): r for r in rows}
    lines += ["", "## Against the paper (Fuzzy PyTorch, slowdown vs its IEEE build)", "",
              "numvar's ratios are against native PyTorch (MKL/oneDNN kernels); the paper's "
              "are against its own IEEE build (PyTorch compiled with Verificarlo, netlib "
              "BLAS). The closest analogue of the paper's ratio is SR over numvar's "
              "instrumented `ieee` mode at the same granularity (last two numvar columns).",
              "",
              "| workload (paper's) | numvar SR flop | numvar UD flop | numvar SR op | "
              "numvar SR / ieee flop | numvar UD / ieee flop | PRISM SR | PRISM UD | Verrou | "
              "goal (flop SR / op) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for w, (paper, psr, pud) in PAPER.items():
        if not any(k[0] == w for k in by):
            continue
        def cell(mode, gran):
            r = by.get((w, mode, gran))
            return "—" if r is None else f"{r.slowdown:.1f}×"
        def rel(mode):
            r, i = by.get((w, mode, "flop")), by.get((w, "ieee", "flop"))
            return "—" if r is None or i is None else f"{r.seconds / i.seconds:.1f}×"
        lines.append(f"| {w} ({paper}) | {cell('sr', 'flop')} | {cell('ud', 'flop')} | "
                     f"{cell('sr', 'op')} | {rel('sr')} | {rel('ud')} | {psr}× | {pud}× | "
                     f"198–419× | ≤ {GOALS[w]:.0f}× / ≤ 2× |")
    if mm:
        lines += ["", "## SR matmul kernel (every product and add rounded, binary32)", "",
                  "| n | torch.matmul MFLOP/s | numvar SR MFLOP/s | slowdown |",
                  "|---:|---:|---:|---:|"]
        for m in mm:
            lines.append(f"| {m['n']}³ | {m['torch_mflops']:.0f} | {m['sr_mflops']:.0f} | "
                         f"{m['ratio']:.1f}× |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if profiles:
        lines += ["", "## Profiles (cProfile, own time)", ""]
        for prof in profiles:
            lines += ["```", prof, "```", ""]
    return "\n".join(lines) + "\n"


def kept_sections(path) -> str:
    """Sections of ``path`` that other scripts own (``<!-- NAME:begin -->`` ...
    ``<!-- NAME:end -->``, e.g. bench_zoo.py's), kept when this script rewrites it."""
    import re

    p = Path(path)
    if not p.exists():
        return ""
    blocks = re.findall(r"(<!-- (\w+):begin -->.*?<!-- \2:end -->\n?)", p.read_text(), re.S)
    return "".join("\n" + b[0] for b in blocks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="digits,brain,speech")
    p.add_argument("--modes", default="ieee,sr,ud,random")
    p.add_argument("--granularities", default="flop,op")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=None, help="inputs per inference "
                   "(default: digits 64, brain 4, speech 4)")
    p.add_argument("--matmul", default="256,512", help="SR matmul sizes ('' to skip)")
    p.add_argument("--out", default=str(HERE / "results.md"))
    p.add_argument("--note", action="append", default=[], help="a note for results.md")
    p.add_argument("--profile", action="append", default=[], metavar="W:MODE:GRAN",
                   help="cProfile one inference (e.g. digits:sr:flop); top functions go "
                        "to results.md")
    p.add_argument("--threads", type=int, default=None, help="torch and numba threads "
                   "(default: theirs); 1 gives steadier numbers on a shared machine")
    args = p.parse_args(argv)
    if args.threads:
        import numba

        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, flush=True)

    info = machine()
    rows: list[Row] = []
    for w in [s for s in args.workloads.split(",") if s]:
        rows += bench_workload(w, [m for m in args.modes.split(",") if m],
                               [g for g in args.granularities.split(",") if g],
                               args.repeat, args.batch, log)
    mm = bench_matmul([int(s) for s in args.matmul.split(",") if s], args.repeat, log)
    profiles = [profile(spec, args.batch) for spec in args.profile]
    for prof in profiles:
        log(prof)
    text = markdown(rows, mm, info, args.repeat, args.note, profiles)
    from numvar._io import atomic_write_text

    text += kept_sections(args.out)

    atomic_write_text(args.out, text)
    print(text)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent / "src"))
    raise SystemExit(main())
