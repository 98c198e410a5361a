"""benchmarks/run_all.py runs end to end on a tiny configuration and writes its table
(speed itself is never asserted: only that every measured row is present and sane)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load_script(monkeypatch, name: str):
    """benchmarks/<name>.py as a module (registered under ``name`` for the test)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_run_all_writes_results(tmp_path_factory, monkeypatch, capsys):
    cache = tmp_path_factory.getbasetemp() / "numvar-workloads-cache"  # shared, see models
    monkeypatch.setenv("NUMVAR_CACHE_DIR", str(cache))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _load_script(monkeypatch, "bench_zoo")  # (its interleaved timing)
        run_all = _load_script(monkeypatch, "run_all")
        out = tmp_path_factory.mktemp("bench") / "results.md"
        assert run_all.main(["--workloads", "digits", "--modes", "ieee,sr",
                             "--granularities", "op", "--repeat", "1", "--batch", "8",
                             "--matmul", "32", "--profile", "digits:sr:op",
                             "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(n)
    text = out.read_text()
    assert "## Machine" in text and f"cores: {os.cpu_count()}" in text
    rows = [line for line in text.splitlines() if line.startswith("| digits | 8 images")]
    assert [r.split("|")[3].strip() for r in rows] == ["native", "ieee", "sr"]
    assert "| 32³ |" in text and "profile digits:sr:op" in text
    # the paper's figures sit beside ours
    assert "| digits (MNIST) |" in text and "10.9×" in text


def test_bench_zoo_formats_table_judges_only_comparable_natives(monkeypatch):
    """The formats table divides an entry's ratios by its binary32 twin's and judges the
    goal (≤ 1.5 for bf16/fp16, ≤ 3 for float64), except where the entry's native forward
    is over its format's SLOW_NATIVE times the twin's (no native kernels for the format:
    the ratio to that native run is small for that reason alone; 1.5 for bf16/fp16, so a
    16-bit forward 3.3× slower than binary32's, as BERT's bfloat16 on Zen 3, is not
    judged): then "n/a", never ✓, here and in the main table's goal columns, with the
    least native time (× the twin's) at which the goal would hold given numvar's times."""
    bz = _load_script(monkeypatch, "bench_zoo")

    def row(model, native, op, flop):  # times in seconds; ratios = time ÷ native
        return {"model": model, "threads": 1, "native": native, "op SR": op * native,
                "flop SR": flop * native}

    rows = [row("net", 0.010, 2.0, 10.0), row("net_bf16", 0.008, 2.8, 14.0),  # ÷ 1.4: ✓
            row("net_fp16", 0.150, 0.4, 0.8),                                  # 15× slower
            row("mlp", 0.001, 3.0, 10.0), row("mlp_f64", 0.002, 2.0, 31.0),    # ÷ 3.1: ✗
            row("enc", 0.004, 3.0, 14.0), row("enc_bf16", 0.0132, 1.0, 3.6)]   # 3.3× slower
    lines = {ln.split(" | ")[0][2:]: ln for ln in bz._format_rows(rows) if ln.startswith("| ")}
    assert lines["net_bf16"].endswith("| 0.80 | 14.0× | 10.0× | 1.40 | 2.8× | 2.0× | 1.40 | ✓ |")
    assert "| 15.00 |" in lines["net_fp16"]
    # numvar's times ÷ the twin's: flop 0.12 / 0.10 = 1.2, op 0.06 / 0.02 = 3.0; the goal
    # (1.5) holds where native float16 takes ≥ 3.0 / 1.5 = 2× the twin's native time
    assert lines["net_fp16"].endswith("| n/a (native 15× the twin's: no native float16 "
                                      "kernels here); holds where native float16 takes "
                                      "≥ 2.00× the twin's native time |")
    assert abs(bz.native_for_goal(rows[2], rows[0], 1.5) - 2.0) < 1e-12
    assert lines["mlp_f64"].endswith("| ✗ (> 3.0) |")
    # (its ratios ÷ the twin's, 0.26 and 0.33, would pass: small for the slow native alone)
    assert "| 3.30 |" in lines["enc_bf16"] and "n/a (native 3× the twin's" in lines["enc_bf16"]
    assert bz._slow_natives(rows) == {"net_fp16", "enc_bf16"}
    for r in rows:
        r.update(floor=1.5 * r["native"], contraction=5.0 * r["native"])
    table = bz.render(rows, {1: {"float32": 2e9}}, type("A", (), {"repeats": 3})(), [])
    main = {ln.split(" | ")[0][2:]: ln for ln in table.splitlines() if "| 1 |" in ln}
    assert main["net_fp16"].endswith("| n/a (slow native, see formats) | "
                                     "n/a (slow native, see formats) |")
    assert main["net"].endswith("| ✓ | ✓ |") and main["mlp_f64"].endswith("| ✗ (> 11.5) | ✓ |")


def test_bench_zoo_bounds_a_missed_format_goal(monkeypatch):
    """A missed format goal shows, for each side that misses, that side's bound (flop:
    floor − 1 + kernels; op: f64 ref + op kernels, × the entry's native) ÷ the twin's
    ratio, and "out of reach" exactly when one exceeds the goal; a met goal, or a row
    without the bound's parts, shows none."""
    bz = _load_script(monkeypatch, "bench_zoo")

    def row(model, native, op, flop, **parts):  # ratios × native; parts × native too
        return {"model": model, "threads": 1, "native": native, "op SR": op * native,
                "flop SR": flop * native, **{k: v * native for k, v in parts.items()}}

    twin = row("net", 0.010, 4.0, 10.0)
    # op 6.4 / 4.0 = 1.6 misses; op bound (5.2 + 0.4) / 4.0 = 1.4: not out of reach
    near = row("net_bf16", 0.006, 6.4, 12.0, floor=20.0, kernels=9.0,
               **{"f64 ref": 5.2, "op kernels": 0.4})
    # flop 16.5 / 10 = 1.65 misses, bound (2.0 − 1 + 15.2) / 10 = 1.62 > 1.5; op 1.0
    far = row("net_fp16", 0.009, 4.0, 16.5, floor=2.0, kernels=15.2,
              **{"f64 ref": 3.0, "op kernels": 0.1})
    bare = row("mlp", 0.001, 3.0, 10.0)
    # op 6.2 / 4.0 = 1.55 misses; its parts (24.0 + 0.4) / 4.0 = 6.1 exceed the measure
    # itself (their float64 re-runs slower than numvar's path): no bound, not out of reach
    slow_ref = row("cnn_bf16", 0.006, 6.2, 12.0, floor=23.0, kernels=9.0,
                   **{"f64 ref": 24.0, "op kernels": 0.4})
    lines = {ln.split(" | ")[0][2:]: ln for ln in
             bz._format_rows([twin, near, far, bare, row("mlp_f64", 0.002, 2.0, 31.0),
                              row("cnn", 0.010, 4.0, 10.0), slow_ref]) if ln.startswith("| ")}
    assert lines["net_bf16"].endswith("| 1.60 | ✗ (> 1.5; op bound 1.40) |")
    assert lines["net_fp16"].endswith("| 1.00 | ✗ (> 1.5; flop bound 1.62: out of reach) |")
    assert lines["cnn_bf16"].endswith(
        "| 1.55 | ✗ (> 1.5; op bound 6.10 above the measure: no bound here) |")
    assert lines["mlp_f64"].endswith("| ✗ (> 3.0) |")  # measured without the parts
    met = row("net_bf16", 0.006, 5.0, 12.0, floor=20.0, kernels=9.0,
              **{"f64 ref": 5.6, "op kernels": 0.4})
    assert bz.format_bounds(met, twin, 1.5) == ""
    assert bz._format_rows([twin, met])[-1].endswith("| ✓ |")


def test_bench_zoo_bounds_a_missed_flop_goal_by_its_kernels(monkeypatch):
    """A missed flop goal shows the bound floor − 1 + kernels (× native) and says "out of
    reach" exactly when the bound exceeds the goal; a met goal shows no bound, and a row
    measured without kernels (other thread counts) shows none either."""
    bz = _load_script(monkeypatch, "bench_zoo")

    def row(model, flop, kernels, threads=1):  # native 1 ms, floor 1.5, contraction 0.5
        r = {"model": model, "threads": threads, "native": 1e-3, "floor": 1.5e-3,
             "contraction": 0.5e-3, "op SR": 3e-3, "flop SR": flop * 1e-3}
        if kernels is not None:
            r["kernels"] = kernels * 1e-3
        return r

    # goal = 1.5 + 0.5 + 5 = 7.0; bound = 1.5 - 1 + kernels
    rows = [row("met", 6.0, 5.0), row("close", 9.0, 4.0), row("kernel_bound", 9.0, 7.0),
            row("kernel_bound", 5.0, None, threads=2), row("above", 7.2, 7.0)]
    table = bz.render(rows, {1: {"float32": 2e9}}, type("A", (), {"repeats": 3})(), [])
    lines = {(ln.split(" | ")[0][2:], ln.split(" | ")[1]): ln for ln in table.splitlines()
             if ln.count("|") == 11 and not ln.startswith("|---")}  # the main table
    assert lines["met", "1"].endswith("| 5.0× | ✓ | ✓ |")
    assert lines["close", "1"].endswith("| 4.0× | ✗ (> 7.0; bound 4.5) | ✓ |")
    assert lines["kernel_bound", "1"].endswith(
        "| 7.0× | ✗ (> 7.0; bound 7.5: out of reach) | ✓ |")
    assert lines["kernel_bound", "2"].endswith("| — | — | — |")
    # a bound above the measured ratio is no bound for the entry (its parts ran slower)
    assert lines["above", "1"].endswith(
        "| 7.0× | ✗ (> 7.0; bound 7.5 above the measure: no bound here) | ✓ |")
    assert bz.flop_bound(1.5, 7.0) == 7.5


def test_bench_zoo_bounds_a_missed_thread_goal_by_the_serial_rest(monkeypatch):
    """A missed thread goal shows the speed-up bound time₁ ÷ (rest at n threads + kernels
    at 1 thread ÷ n), "out of reach" exactly when it is under the goal; speed-ups and the
    bound take the one-thread row's wall times where it has them (CPU time otherwise)."""
    import time

    bz = _load_script(monkeypatch, "bench_zoo")

    def row(model, threads, flop, kernels):  # ms
        return {"model": model, "threads": threads, "native": 1e-3, "floor": 1.5e-3,
                "contraction": 0.5e-3, "op SR": 3e-3, "flop SR": flop * 1e-3,
                "kernels": kernels * 1e-3, "digest": "d"}

    # bert: 60 at 1 thread (45 in kernels); 38 at 2 (23 in kernels: the rest is 15)
    # -> 1.58 measured, bound 60 / (15 + 22.5) = 1.6: out of reach
    # resnet_basic: 100 (90 in kernels); 62 at 2 (50 in kernels: rest 12) -> 1.61,
    # bound 100 / (12 + 45) = 1.75
    rows = [row("bert", 1, 60, 45), row("bert", 2, 38, 23),
            row("resnet_basic", 1, 95, 90), row("resnet_basic", 2, 62, 50)]
    # resnet_basic's one-thread row timed by CPU time (95 ms) and again by the wall clock
    # (100 ms): the thread table compares wall times
    rows[2].update({"wall flop SR": 100e-3, "wall native": 1.2e-3})
    lines = {ln.split(" | ")[0][2:]: ln for ln in bz._thread_rows(rows) if ln.startswith("| ")}
    assert lines["bert"].endswith("| 1.58 | yes | ✗ (< 1.7; bound 1.60: out of reach) |")
    assert lines["resnet_basic"].endswith("| 1.61 | yes | ✗ (< 1.7; bound 1.75) |")
    assert lines["resnet_basic"].startswith("| resnet_basic | 2 | 1.20 |")  # wall native
    assert bz.clock_for(1) is time.thread_time and bz.clock_for(2) is time.perf_counter
    assert abs(bz.thread_bound(rows[0], rows[1], 2) - 60 / 37.5) < 1e-12
    # the paired measurement (every round timing both thread counts) where the run made
    # one: bert 56 at 1 thread, 32 at 2 -> 1.75, met; native 1.1 / 0.8
    rows[0].update({"paired flop SR": 56e-3, "paired native": 1.1e-3})
    rows[1].update({"paired flop SR": 32e-3, "paired native": 0.8e-3})
    lines = {ln.split(" | ")[0][2:]: ln for ln in bz._thread_rows(rows) if ln.startswith("| ")}
    assert lines["bert"] == "| bert | 2 | 1.38 | 1.75 | yes | ✓ |"
    # bound: rest at 2 threads from the paired time: 56 / ((32 - 23) + 45 / 2)
    assert abs(bz.thread_bound(rows[0], rows[1], 2) - 56 / 31.5) < 1e-12


def test_bench_zoo_thread_pairs_time_every_thread_count_in_each_round(monkeypatch):
    """thread_pairs: per round, each thread count in turn (threads set for torch and
    numba, an untimed native forward, then native and flop SR timed); per thread count
    and variant the best of the rounds after the warm-up round (whose times, the least
    here, do not count)."""
    import numba
    import torch

    bz = _load_script(monkeypatch, "bench_zoo")
    calls = []

    def variant(name):
        return lambda: calls.append((name, torch.get_num_threads(), numba.get_num_threads()))

    monkeypatch.setattr(bz, "_variants",
                        lambda b: {k: variant(k) for k in ("native", "flop SR")})
    # timed calls in order: per round (1, native), (1, flop), (2, native), (2, flop)
    times = iter([0.1, 0.1, 0.1, 0.1,  # the warm-up round
                  5.0, 9.0, 4.0, 6.0,
                  3.0, 8.0, 7.0, 5.0,
                  4.0, 7.5, 2.0, 6.5])
    monkeypatch.setattr(bz, "_timed", lambda fn, clock=None: (fn(), next(times))[1])
    before = torch.get_num_threads(), numba.get_num_threads()
    try:
        best = bz.thread_pairs(None, [1, 2], 3)
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])
    assert calls[:6] == [("native", 1, 1), ("native", 1, 1), ("flop SR", 1, 1),
                         ("native", 2, 2), ("native", 2, 2), ("flop SR", 2, 2)]
    assert len(calls) == 4 * 2 * 3  # 4 rounds × 2 thread counts × (untimed + 2 timed)
    assert best == {1: {"native": 3.0, "flop SR": 7.5}, 2: {"native": 2.0, "flop SR": 5.0}}


def _numvar_dispatchers() -> dict:
    """Every numba dispatcher a loaded numvar module holds, by module and name."""
    from numba.core.dispatcher import Dispatcher

    return {(name, attr): val for name, mod in list(sys.modules.items())
            if name.startswith("numvar") and mod is not None
            for attr, val in list(vars(mod).items()) if isinstance(val, Dispatcher)}


def test_bench_zoo_kernel_time_counts_the_kernel_calls_and_restores_dispatchers(monkeypatch):
    """kernel_time wraps every numba dispatcher of numvar's modules for the forwards it
    runs and puts the plain ones back after it. Given a clock that ticks once per read,
    each timed call adds exactly one tick, so it returns the number of compiled-kernel
    calls in a flop SR forward of a zoo entry: the same in every forward, and more than
    none (its contractions and FFT stages are compiled). Not a time: nothing here depends
    on the machine's speed."""
    import itertools

    from numvar.workloads import zoo

    _load_script(monkeypatch, "bench_threads")
    bz = _load_script(monkeypatch, "bench_zoo")
    built = zoo.build("fft_filter", "test")
    bz._variants(built)["flop SR"]()  # loads and compiles
    before = _numvar_dispatchers()
    ticks = itertools.count()
    calls = [bz.kernel_time(built, 2, clock=lambda: next(ticks)) for _ in range(2)]
    assert calls[0] == calls[1] and calls[0] >= 2 and calls[0] == int(calls[0])
    after = _numvar_dispatchers()
    assert len(before) > 20 and after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)


def test_bench_clean_loops_times_the_kernels_own_step(monkeypatch):
    """benchmarks/bench_clean_loops.py: its "both loops" row is the kernel's clean step
    (the same bits as ``kernels._clean32``, no lane declined) and the rows asked for are
    timed. (Two rows: the accumulating variants compile for some 13 s more on a cold
    cache, and they share the template of the one accumulating loop timed here.)"""
    mod = _load_script(monkeypatch, "bench_clean_loops")
    rows, ok = mod.measure(K=6, n=16, repeats=1, clock=1e9,
                           loops=("both loops (the kernel's step)", "accumulating, no test"))
    assert ok
    assert [label for label, _ in rows] == ["both loops (the kernel's step)",
                                            "accumulating, no test"]
    assert all(c > 0 for _, c in rows)
    assert mod.LOOPS[0] == rows[0][0] and len(mod.LOOPS) == 5


@pytest.mark.parametrize("flop", [False, True])
def test_bench_depthwise_prints_ratios_and_the_same_bits(monkeypatch, capsys, flop):
    """benchmarks/bench_depthwise.py: one row per shape and a total, positive ratios to
    native, and SR's output (op, or flop with ``--flop``) the same with and without the
    kernel."""
    mod = _load_script(monkeypatch, "bench_depthwise")
    monkeypatch.setattr(mod, "SHAPES", ((8, 6, 3, 1), (4, 9, 5, 2)))
    mod.main(["--repeats", "1", *(["--flop"] if flop else [])])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "×" in r]
    assert len(rows) == 3 and rows[-1].startswith("| all")
    ratios = 2 if flop else 4
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert len(cells) == 2 + ratios + 1
        assert float(cells[1]) > 0 and all(float(c[:-1]) > 0 for c in cells[2:2 + ratios])
    assert [r.strip("| ").endswith("yes") for r in rows[:2]] == [True, True]


def test_bench_oneop_prints_every_case_with_the_same_bits(monkeypatch, capsys):
    """benchmarks/bench_oneop.py: one row per case, positive times and ratios, the same
    bits with each flag off and on, and every flag set back on afterwards."""
    mod = _load_script(monkeypatch, "bench_oneop")
    mod.main(["--repeats", "1", "--calls", "1"])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "×" in r]
    assert len(rows) == len(mod.CASES)
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert all(float(c) > 0 for c in cells[2:5]), r
        assert all(float(c[:-1]) > 0 for c in cells[5:7]) and cells[7] == "yes", r
    assert all(getattr(m, f) is True for _, switches, _ in mod.CASES.values()
               for m, f in switches)


def test_bench_forward_prints_flop_and_native_times(monkeypatch, capsys):
    """benchmarks/bench_forward.py: one line per entry, flop and native ms and their
    ratio, all positive and consistent; an unknown entry is refused with the known ones."""
    mod = _load_script(monkeypatch, "bench_forward")
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "linear_solve", "--repeats", "1"])
    mod.main()
    name, flop_ms, native_ms, ratio = capsys.readouterr().out.split()
    assert name == "linear_solve"
    flop_ms, native_ms, ratio = float(flop_ms), float(native_ms), float(ratio)
    assert flop_ms > 0 and native_ms > 0
    assert abs(ratio - flop_ms / native_ms) <= 0.05 * ratio + 0.1
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "no_such_model"])
    with pytest.raises(SystemExit):
        mod.main()
    assert "known: " in capsys.readouterr().err


def test_bench_block_times_blocks_and_ops_against_the_legacy_set_up(monkeypatch, capsys):
    """benchmarks/bench_block.py: its legacy_codepath sets and restores the switches
    codepath sets (the baseline does the same work); one line per variant, positive
    times, each op's ratio to the native add; every switch as it was after the run; too
    few repeats refused."""
    from numvar.instrument.codepath import codepath

    mod = _load_script(monkeypatch, "bench_block")
    sdp = ("math", "flash", "mem_efficient", "cudnn", "overrideable")

    def state():
        return (torch.backends.mha.get_fastpath_enabled(), torch._C._get_mkldnn_enabled(),
                torch._C._get_cudnn_enabled(),
                *(getattr(torch._C, f"_get_{n}_sdp_enabled")() for n in sdp))

    before = state()
    with codepath():
        new = state()
    with mod.legacy_codepath():
        assert state() == new
    assert state() == before
    mod.main(["--repeats", "10", "--rounds", "1"])
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    assert len(lines) == 16
    times = {ln[:66].strip(): float(ln[66:].split()[0]) for ln in lines}
    assert all(t > 0 for t in times.values())
    assert sum(k.startswith("kernel call: ") for k in times) == 6
    assert sum(k.startswith("block: ") for k in times) == 6
    native = times["op: native add"]
    for ln in lines:
        if ln.startswith("op:"):
            ratio = float(ln.split("us")[1].split("x")[0])
            t = times[ln[:66].strip()]
            # times printed to 0.005 us and the ratio to 0.005: t/n is off the unrounded
            # ratio by at most t/n · (0.005/t + 0.005/n) (first order), plus the ratio's own
            slack = t / native * (0.005 / t + 0.005 / native) * 1.01 + 0.005
            assert abs(ratio - t / native) <= slack
    assert state() == before
    with pytest.raises(SystemExit):
        mod.main(["--repeats", "5"])


def _check_toggled_line(out: str, name: str) -> None:
    """A bench_forward.py --flag line: the entry, flop ms off and on and native ms (all
    positive), the saving in units of native (consistent with them), same bits."""
    got, off, on, native, saved, *same = out.split()
    assert got == name and " ".join(same) == "same bits"
    off, on, native, saved = float(off), float(on), float(native), float(saved)
    assert off > 0 and on > 0 and native > 0
    assert abs(saved - (off - on) / native) < 0.02  # (the printed values are rounded)


def test_bench_forward_times_a_flag_off_and_on_with_the_same_bits(monkeypatch, capsys):
    """bench_forward.py --flag: one line per entry with the flop times off and on, native,
    the saving in units of native and the bits check; the flag is restored; a flag that
    is not a boolean of an importable module is refused before any model runs."""
    from numvar.instrument import flop as FL

    mod = _load_script(monkeypatch, "bench_forward")
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "--flag",
                                     "numvar.instrument.flop.LEAN_BMM", "multihead_attention",
                                     "--repeats", "1"])
    mod.main()
    _check_toggled_line(capsys.readouterr().out, "multihead_attention")
    assert FL.LEAN_BMM is True
    for bad in ("numvar.instrument.flop.FLOP_BACKEND_ENV", "numvar.no_such_module.X"):
        monkeypatch.setattr("sys.argv", ["bench_forward.py", "--flag", bad, "linear_solve"])
        with pytest.raises(SystemExit, match="--flag"):
            mod.main()


def test_bench_forward_times_training_steps_with_a_flag(monkeypatch, capsys):
    """bench_forward.py --train --flag: training steps of the norms entry (batch norm and
    instance norm in training mode, their backward) with batch norm's training kernels
    off and on: the same loss and gradient bits, the flags restored; --train alone:
    flop and native ms and their ratio."""
    from numvar.instrument import norm_kernels as NK

    mod = _load_script(monkeypatch, "bench_forward")
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "--train", "--flag",
                                     "numvar.instrument.norm_kernels.BATCH_NORM_TRAIN",
                                     "--flag",
                                     "numvar.instrument.norm_kernels.BATCH_NORM_BACKWARD",
                                     "norms", "--repeats", "1"])
    mod.main()
    _check_toggled_line(capsys.readouterr().out, "norms")
    assert NK.BATCH_NORM_TRAIN is True and NK.BATCH_NORM_BACKWARD is True
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "--train", "norms", "--repeats", "1"])
    mod.main()
    name, flop_ms, native_ms, ratio = capsys.readouterr().out.split()
    assert name == "norms" and float(flop_ms) > 0 and float(native_ms) > 0
    assert abs(float(ratio) - float(flop_ms) / float(native_ms)) <= 0.05 * float(ratio) + 0.1


def test_bench_rowsums_prints_every_shape_with_the_same_bits(monkeypatch, capsys):
    """benchmarks/bench_rowsums.py: one row per shape, positive times, the row kernel's
    ratio to native consistent with its columns, and the same bits as the scan."""
    _load_script(monkeypatch, "bench_declines")  # (its timing helper, which bench_rowsums uses)
    mod = _load_script(monkeypatch, "bench_rowsums")
    monkeypatch.setattr(mod, "SHAPES", [(40, 100), (64, 300)])
    mod.main(["--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()[2:]
    assert len(lines) == 2
    for ln in lines:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows, scan, native = (float(c) for c in cells[1:4])
        assert rows > 0 and scan > 0 and native > 0 and cells[5] == "yes"
        ratio = float(cells[4].rstrip("×"))
        assert abs(ratio - rows / native) <= 0.06 * ratio + 0.1  # (values printed rounded)


def test_bench_forward_times_an_lbfgs_step(monkeypatch, capsys):
    """bench_forward.py --lbfgs: one line per entry, flop and native ms of an LBFGS step and
    their ratio; combined with --flag it is refused."""
    mod = _load_script(monkeypatch, "bench_forward")
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "--lbfgs", "sine_mlp_f64",
                                     "--repeats", "1"])
    mod.main()
    name, flop_ms, native_ms, ratio = capsys.readouterr().out.split()
    assert name == "sine_mlp_f64" and float(flop_ms) > 0 and float(native_ms) > 0
    assert abs(float(ratio) - float(flop_ms) / float(native_ms)) <= 0.05 * float(ratio) + 0.1
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "--lbfgs", "--flag",
                                     "numvar.instrument.flop.LEAN_BMM", "sine_mlp"])
    with pytest.raises(SystemExit):
        mod.main()


def test_bench_forward_toggles_several_flags_on_a_float64_twin(monkeypatch, capsys):
    """bench_forward.py --float64 with --flag given twice: the entry runs in float64 (its
    output float64), both flags are toggled together and restored, the same bits."""
    from numvar.instrument import kernels as IK
    from numvar.rounding import kernels as RK

    mod = _load_script(monkeypatch, "bench_forward")
    work, grad_mode = mod._built("linear_solve", True)
    with grad_mode():
        assert work().dtype == torch.float64
    seen = []
    real = mod.fuzzy

    def spy(**kw):
        seen.append((RK.DIV64_FAST, IK.SCAN64_FAST))
        return real(**kw)

    monkeypatch.setattr(mod, "fuzzy", spy)
    monkeypatch.setattr("sys.argv", ["bench_forward.py", "--float64", "--flag",
                                     "numvar.rounding.kernels.DIV64_FAST", "--flag",
                                     "numvar.instrument.kernels.SCAN64_FAST", "linear_solve",
                                     "--repeats", "1"])
    mod.main()
    name, off, on, native, saved, *same = capsys.readouterr().out.split()
    assert name == "linear_solve" and " ".join(same) == "same bits"
    assert min(float(off), float(on), float(native)) > 0.0005
    # the printed values' own rounding: ms to 3 decimals (±0.0005 each), saved to 2 (±0.005);
    # (off − on) / native recomputed from them is off by at most the bound below
    off, on, native, saved = float(off), float(on), float(native), float(saved)
    tol = 0.005 + (0.001 + 0.0005 * (abs(saved) + 0.005)) / (native - 0.0005) + 1e-9
    assert abs(saved - (off - on) / native) <= tol, (off, on, native, saved)
    assert set(seen) == {(False, False), (True, True)}
    assert RK.DIV64_FAST is True and IK.SCAN64_FAST is True


# ------------------------------------------- bench_kernels / bench_pipes: AVX2 and AVX-512
#: the binary32 sr k >= 1 loop as numba compiles it for AVX2 (AMD Zen 3): 4 terms per
#: pass, the accumulator loaded from and stored to (%r14,%rdi,8), abridged
_AVX2_K1 = """.LBB0_51:
\tvpaddq\t(%r12,%rdi,8), %ymm6, %ymm9
\tvmulpd\t(%rsi,%rdi,8), %ymm5, %ymm8
\tvmovupd\t(%r14,%rdi,8), %ymm7
\tvpsrlq\t$32, %ymm9, %ymm10
\tvpmuludq\t%ymm1, %ymm10, %ymm10
\tvpbroadcastq\t(%rdx), %ymm10
\tvaddpd\t%ymm7, %ymm8, %ymm11
\tvblendvpd\t%ymm7, %ymm8, %ymm10, %ymm7
\tvmovupd\t%ymm7, (%r14,%rdi,8)
\taddq\t$4, %rdi
\tcmpq\t%rdi, %rbx
\tjne\t.LBB0_51
"""
#: the k = 0 loop before it: writes the accumulator without reading it
_AVX2_K0 = """.LBB0_40:
\tvpaddq\t(%r12,%rdi,8), %ymm6, %ymm9
\tvpmuludq\t%ymm1, %ymm9, %ymm10
\tvmulpd\t(%rsi,%rdi,8), %ymm5, %ymm8
\tvmovupd\t%ymm8, (%r14,%rdi,8)
\taddq\t$4, %rdi
\tcmpq\t%rdi, %rbx
\tjne\t.LBB0_40
"""


def _bench_kernels(monkeypatch, isa: str = "avx2"):
    pipes = _load_script(monkeypatch, "bench_pipes")
    monkeypatch.setattr(pipes, "vector_isa", lambda: isa)
    return _load_script(monkeypatch, "bench_kernels"), pipes


#: the split form (``kernels._term_bits_row``): the term-bits loop, unrolled to 8 terms
#: per pass (abridged), its stores at offsets of one base, then the accumulating loop
#: reading them, without the hash
_AVX2_BITS = """.LBB0_31:
\tvpaddq\t(%r14,%rax,8), %ymm6, %ymm7
\tvpaddq\t32(%r14,%rax,8), %ymm6, %ymm8
\tvpbroadcastq\t(%rdi), %ymm15
\tvpmuludq\t%ymm15, %ymm7, %ymm4
\tvpmuludq\t%ymm15, %ymm8, %ymm5
\tvmovdqu\t%ymm4, (%rdx,%rax,8)
\tvmovdqu\t%ymm5, 32(%rdx,%rax,8)
\taddq\t$8, %rax
\tcmpq\t%rax, %r11
\tjne\t.LBB0_31
"""
#: its remainder loop: 4 terms per pass
_AVX2_BITS_REST = """.LBB0_35:
\tvpaddq\t(%r14,%rax,8), %ymm5, %ymm1
\tvpmuludq\t%ymm6, %ymm1, %ymm7
\tvmovdqu\t%ymm7, (%rdx,%rax,8)
\taddq\t$4, %rax
\tcmpq\t%rax, %r13
\tjne\t.LBB0_35
"""
_AVX2_STEP = """.LBB0_47:
\tvmulpd\t(%rax,%r11,8), %ymm5, %ymm6
\tvpxor\t(%rdx,%r11,8), %ymm11, %ymm7
\tvmovupd\t(%rbp,%r11,8), %ymm1
\tvaddpd\t%ymm6, %ymm1, %ymm8
\tvbroadcastsd\t(%r12), %ymm8
\tvblendvpd\t%ymm1, %ymm6, %ymm8, %ymm1
\tvmovupd\t%ymm1, (%rbp,%r11,8)
\taddq\t$4, %r11
\tcmpq\t%r11, %r13
\tjne\t.LBB0_47
"""


def test_bench_kernels_picks_the_accumulating_loop_on_avx2(monkeypatch):
    bk, _ = _bench_kernels(monkeypatch)
    [body] = bk.step_loops(_AVX2_K0 + _AVX2_K1)
    assert body[-1].strip() == "jne\t.LBB0_51"  # the k >= 1 loop, not the shorter k = 0 one
    # vector instructions less the pure load (vmovupd from memory) and the store; the
    # broadcast from memory is counted by loop_uops (bench_pipes.independent drops it)
    assert bk.loop_uops(body) == 7
    assert bk.terms_per_iteration(body) == 4
    assert bk._updates_memory(body)
    assert not bk._updates_memory(_AVX2_K0.splitlines()[1:])
    # no index step found: one vector of the widest register
    assert bk.terms_per_iteration(["\tvaddpd\t%zmm1, %zmm2, %zmm3"]) == 8


def test_bench_kernels_counts_both_loops_of_a_split_step(monkeypatch):
    """With the term bits in a loop of their own, a k >= 1 step is that loop (its main,
    unrolled body, not the remainder) and the accumulating loop after it; stores at
    offsets of one base (``32(%rdx,...)``) are not mistaken for loads of ``(%rdx,...)``."""
    bk, _ = _bench_kernels(monkeypatch)
    asm = _AVX2_K0 + _AVX2_BITS + _AVX2_BITS_REST + _AVX2_STEP
    bits, step = bk.step_loops(asm)
    assert bits[-1].strip() == "jne\t.LBB0_31" and step[-1].strip() == "jne\t.LBB0_47"
    assert not bk._updates_memory(bits[1:]) and bk._updates_memory(step[1:])
    assert bk.terms_per_iteration(bits) == 8 and bk.terms_per_iteration(step) == 4
    assert bk.loop_uops(bits) == 5 and bk.loop_uops(step) == 5
    # an outer loop around them is not a step loop
    outer = ".LBB0_30:\n" + asm + "\tjne\t.LBB0_30\n"
    assert [b[-1] for b in bk.step_loops(outer)] == [bits[-1], step[-1]]


#: binary64 with its products apart (``kernels.PRODUCTS64_APART``, AVX-512), abridged: the
#: k = 0 loop (hash, product, one store), the k >= 1 step's loop of the bits and products
#: (hash, product, two stores) and its adds (no hash; the accumulator updated)
_512_K0 = """.LBB0_20:
\tvpaddq\t(%r14,%rax,8), %zmm6, %zmm7
\tvpmullq\t%zmm15, %zmm7, %zmm4
\tvmulpd\t(%rsi,%rax,8), %zmm5, %zmm8
\tvfmsub213pd\t%zmm8, %zmm5, %zmm9
\tvmovupd\t%zmm8, (%r12,%rax,8)
\taddq\t$8, %rax
\tcmpq\t%rax, %r11
\tjne\t.LBB0_20
"""
_512_PRODUCTS = """.LBB0_31:
\tvpaddq\t(%r14,%rax,8), %zmm6, %zmm7
\tvpmullq\t%zmm15, %zmm7, %zmm4
\tvmulpd\t(%rsi,%rax,8), %zmm5, %zmm8
\tvfmsub213pd\t%zmm8, %zmm5, %zmm9
\tvmovdqu64\t%zmm4, (%rdx,%rax,8)
\tvmovupd\t%zmm8, (%rdi,%rax,8)
\taddq\t$8, %rax
\tcmpq\t%rax, %r11
\tjne\t.LBB0_31
"""
_512_ADDS = """.LBB0_47:
\tvmovupd\t(%rbp,%r11,8), %zmm1
\tvaddpd\t(%rdi,%r11,8), %zmm1, %zmm8
\tvsubpd\t%zmm1, %zmm8, %zmm6
\tvpxorq\t(%rdx,%r11,8), %zmm11, %zmm7
\tvmovupd\t%zmm8, (%rbp,%r11,8)
\taddq\t$8, %r11
\tcmpq\t%r11, %r13
\tjne\t.LBB0_47
"""


def test_bench_kernels_counts_the_products_loop_of_a_binary64_step(monkeypatch):
    """binary64 with its products in a loop of their own: the step is that loop (two
    stores per vector of terms: the bits and the products), not the k = 0 loop (one
    store), and the adds after it."""
    bk, _ = _bench_kernels(monkeypatch, "avx512")
    products, adds = bk.step_loops(_512_K0 + _512_PRODUCTS + _512_ADDS)
    assert products[-1].strip() == "jne\t.LBB0_31" and adds[-1].strip() == "jne\t.LBB0_47"
    assert bk._stores_per_vector(products) == 2 and bk._stores_per_vector(_512_K0.split("\n")) == 1
    assert bk.loop_uops(products) == 4 and bk.loop_uops(adds) == 3


def test_bench_kernels_independent_instructions_fit_the_hosts_registers(monkeypatch):
    bk, _ = _bench_kernels(monkeypatch)
    out = bk.independent(_AVX2_K1.splitlines()[1:])
    # loads, broadcasts and the store dropped; memory operands read from ymm0; sources in
    # ymm0-7; destinations rotate over ymm8-15 (16 registers with AVX2)
    assert out == ["vpaddq %ymm0, %ymm6, %ymm8", "vmulpd %ymm0, %ymm5, %ymm9",
                   "vpsrlq $$32, %ymm1, %ymm10", "vpmuludq %ymm1, %ymm2, %ymm11",
                   "vaddpd %ymm7, %ymm0, %ymm12", "vblendvpd %ymm7, %ymm0, %ymm2, %ymm13"]
    body = [f"\tvaddpd\t%ymm1, %ymm2, %ymm{i}" for i in range(10)]
    assert [x.split()[-1] for x in bk.independent(body)] == [
        f"%ymm{8 + i % 8}" for i in range(10)]
    bk512, _ = _bench_kernels(monkeypatch, "avx512")
    assert [x.split()[-1] for x in bk512.independent(body)] == [
        f"%ymm{8 + i}" for i in range(10)]  # 24 destinations with AVX-512


def test_bench_pipes_refuses_hosts_without_avx2(monkeypatch):
    import platform

    pipes = _load_script(monkeypatch, "bench_pipes")
    features = {"avx2": True, "avx512f": True, "avx512dq": True}
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(pipes.llvm, "get_host_cpu_features", lambda: features)
    assert pipes.vector_isa() == "avx512" and pipes.registers() == ("zmm", 32)
    features["avx512dq"] = False  # no vpmullq
    assert pipes.vector_isa() == "avx2" and pipes.registers() == ("ymm", 16)
    assert pipes.kinds()[0] is pipes.KINDS_AVX2
    features["avx2"] = False
    with pytest.raises(SystemExit, match="need AVX2 or AVX-512"):
        pipes.vector_isa()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(SystemExit, match="this host is aarch64"):
        pipes.vector_isa()


def test_bench_elementwise_prints_rates_and_the_split_loops_bits(monkeypatch, capsys):
    """benchmarks/bench_elementwise.py: one row per loop (three tiles, the rounding tile,
    two _mulsub shapes), positive rates, and the split and indexed variants give the
    shipped loops' bits; the flags table: the sum tile with and/or flags, same bits; the
    passes table: _mulsub's two passes against one at five shapes, same bits; the
    layouts table: every broadcast layout with the bits of its materialised operands."""
    import numba

    mod = _load_script(monkeypatch, "bench_elementwise")
    n, nn = torch.get_num_threads(), numba.get_num_threads()
    try:
        mod.main(["--repeats", "1"])
    finally:
        torch.set_num_threads(n)
        numba.set_num_threads(nn)
    out = capsys.readouterr().out
    rows = [ln.split(" | ") for ln in out.splitlines()
            if ln.startswith("| _") and ln.count(" | ") == 10]
    assert [r[0][2:] for r in rows] == ["_tile product", "_tile sum", "_tile quotient",
                                        "_roundtile (float64 to binary32)", "_mulsub",
                                        "_mulsub"]
    for r in rows:
        assert float(r[2]) > 0 and float(r[3]) > 0 and float(r[8]) > 0
        no_split = r[0] in ("| _tile quotient", "| _roundtile (float64 to binary32)")
        assert r[7] == ("—" if no_split else "yes")
        assert r[10].rstrip(" |") == "yes"
    flags = [ln.split(" | ") for ln in out.splitlines() if ln.startswith("| sum |")]
    assert [r[1] for r in flags] == ["1024", "16384"]
    for r in flags:
        assert float(r[2]) > 0 and float(r[3]) > 0 and r[5].rstrip(" |") == "yes"
    passes = [ln.split(" | ") for ln in out.splitlines()
              if ln.startswith("| _mulsub |") and " × " in ln and ln.count(" | ") == 5]
    assert [r[1] for r in passes] == ["64 × 64", "16 × 1024", "63 × 20", "20 × 40", "40 × 8"]
    for r in passes:
        assert float(r[2]) > 0 and float(r[3]) > 0 and float(r[4]) > 0
        assert r[5].rstrip(" |") == "yes"
    layouts = [ln.split(" | ") for ln in out.splitlines()[out.splitlines().index(
        next(ln for ln in out.splitlines() if ln.startswith("| layout"))) + 2:]
        if ln.startswith("| ")]
    assert [r[0][2:] for r in layouts] == [
        "same shape, contiguous", "a number", "one element expanded", "a bias row (N = 192)",
        "a column (M, 1)", "sliced rows"]
    assert layouts[0][2] == "1.00" and layouts[0][5].rstrip(" |") == "—"
    for r in layouts:
        assert float(r[1]) > 0 and float(r[2]) > 0 and float(r[3]) > 0
    assert all(r[5].rstrip(" |") == "yes" for r in layouts[1:])


def test_bench_keys_compares_draws_that_agree(monkeypatch, capsys):
    """benchmarks/bench_keys.py: one row per draw (Stream.keys at five sizes, the FFT's
    and the LU's flagged keys) with positive times and the same keys from both draws, and
    a model row whose flop outputs agree bit for bit with the old draws swapped in."""
    import numba

    mod = _load_script(monkeypatch, "bench_keys")
    n, nn = torch.get_num_threads(), numba.get_num_threads()
    try:
        mod.main(["--repeats", "1", "--models", "fft_filter", "--rounds", "1"])
    finally:
        torch.set_num_threads(n)
        numba.set_num_threads(nn)
    out = capsys.readouterr().out
    rows = [ln.split(" | ") for ln in out.splitlines() if ln.startswith("| `")]
    assert [r[1] for r in rows] == ["2", "6", "14", "22", "192", "22", "189"]
    for r in rows:
        assert float(r[2]) > 0 and float(r[3]) > 0 and r[5].rstrip(" |") == "yes"
    model = [ln.split(" | ") for ln in out.splitlines() if ln.startswith("| fft_filter")]
    assert len(model) == 1 and model[0][6].rstrip(" |") == "yes"


def test_op_bound_records_the_float64_reruns_and_the_elementwise_roundings(monkeypatch):
    """The op bound's recording of one op SR forward (bench_zoo.recorded_once, which
    bench_opcnn.py calls too): the addmm among the ops whose float64 result is rounded,
    with its elements; the add and the scaling by a Python number among the elementwise
    roundings, per operation, with theirs; and the elementwise kernels' cost is measured
    for those and nothing for no elements."""
    mod = _load_script(monkeypatch, "bench_zoo")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return (self.lin(x) + x[:, :3]) * 0.5

    with torch.no_grad():
        funcs, elems, pointwise = mod.recorded_once(Model(), (torch.randn(5, 4),))
    assert torch.ops.aten.addmm.default in funcs and elems == 15
    assert pointwise == {mod.PW.OP_ADD: 15, mod.PW.OP_MUL: 15}
    assert isinstance(mod.elementwise_cost(pointwise, 1), float)  # (its value is a time)
    assert mod.elementwise_cost(type(pointwise)(), 1) == 0.0  # no elements, no cost


def test_float64_reference_reruns_the_recorded_ops_in_float64(monkeypatch):
    """float64_reference's forward re-runs exactly the ops op SR rounds from float64, on
    float64 copies, cast back: a linear layer's output is then float64's result cast to
    binary32, bit for bit, while the elementwise add after it stays binary32's."""
    bz = _load_script(monkeypatch, "bench_zoo")
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 16)
    x = torch.randn(8, 24)
    out = {}

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            out["lin"] = y = self.lin(x)
            out["sum"] = s = y + 1.5
            return s

    built = bz.zoo.Built("tiny", Model(), (x,), None)
    f64ref, elems, pointwise = bz.float64_reference(built)
    assert elems == 8 * 16 and sum(pointwise.values()) == 8 * 16
    with torch.no_grad():
        f64ref()
        want = torch.nn.functional.linear(x.double(), lin.weight.double(),
                                          lin.bias.double()).float()
        assert torch.equal(out["lin"], want)
        assert torch.equal(out["sum"], want + 1.5)  # (binary32's add, not re-run)
        plain = lin(x)
    assert not torch.equal(plain, want)  # (the float64 re-run differs from binary32's)


def test_float64_reference_takes_op_srs_depthwise_route(monkeypatch):
    """A depthwise convolution's float64 re-run in the bound is the one op SR runs
    (``depthwise.value64``): the same value as PyTorch's float64 convolution."""
    bz = _load_script(monkeypatch, "bench_zoo")
    from numvar.instrument import depthwise as DW
    from _spy import count_calls

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 6, 3, padding=1, groups=6)
    x = torch.randn(2, 6, 5, 5)
    out = {}

    class Model(torch.nn.Module):
        def forward(self, x):
            out["conv"] = y = conv(x)
            return y

    f64ref, elems, _ = bz.float64_reference(bz.zoo.Built("dw", Model(), (x,), None))
    assert elems == x.numel()
    calls = count_calls(monkeypatch, DW, "value64")
    with torch.no_grad():
        f64ref()
        want = torch.nn.functional.conv2d(x.double(), conv.weight.double(),
                                          conv.bias.double(), padding=1, groups=6).float()
    assert len(calls) == 1 and torch.equal(out["conv"], want)


def test_bench_zoo_bounds_a_missed_op_goal_by_the_float64_reruns_and_kernels(monkeypatch):
    """A missed op goal shows the bound (f64 ref + op kernels) ÷ native and says "out of
    reach" exactly when it exceeds floor + 2; a met goal, and a row measured without the
    bound's parts, show none. measure() at one thread (the thread's CPU time) measures
    those parts on a zoo model, and at other clocks does not."""
    import time

    bz = _load_script(monkeypatch, "bench_zoo")

    def row(model, op, f64=None, kern=None):  # ms; native 1, floor 1.5: goal 3.5
        r = {"model": model, "threads": 1, "native": 1e-3, "floor": 1.5e-3,
             "contraction": 0.5e-3, "op SR": op * 1e-3, "flop SR": 3e-3}
        if f64 is not None:
            r.update({"f64 ref": f64 * 1e-3, "op kernels": kern * 1e-3})
        return r

    rows = [row("met", 3.0, 2.5, 0.2), row("close", 4.0, 2.9, 0.3),
            row("float64_bound", 4.5, 3.4, 0.3), row("unmeasured", 4.0)]
    table = bz.render(rows, {1: {"float32": 2e9}}, type("A", (), {"repeats": 3})(), [])
    lines = {ln.split(" | ")[0][2:]: ln for ln in table.splitlines()
             if ln.count("|") == 11 and not ln.startswith("|---")}
    assert lines["met"].endswith("| ✓ |")
    assert lines["close"].endswith("| ✗ (> 3.5; bound 3.2) |")
    assert lines["float64_bound"].endswith("| ✗ (> 3.5; bound 3.7: out of reach) |")
    assert lines["unmeasured"].endswith("| ✗ (> 3.5) |")
    assert abs(bz.op_bound(rows[1]) - 3.2) < 1e-12 and bz.op_bound(rows[3]) is None

    built = bz.zoo.build("sine_mlp", "test")
    one = bz.measure(built, 1, time.thread_time)
    # (op kernels: kernel times above casts, clamped at 0; not compared with each other)
    assert one["f64 ref"] > 0 and one["op kernels"] >= 0 and one["wall native"] > 0
    assert 0 < bz.op_bound(one) < float("inf")
    assert "f64 ref" not in bz.measure(built, 1, time.perf_counter)


def test_bench_heap_runs_each_side_in_its_own_processes(monkeypatch, capsys):
    """benchmarks/bench_heap.py: one row per model and process, malloc as it was
    (NUMVAR_KEEP_FREED_MEMORY=0) then kept, each read back from the child process that
    measured it, with positive times and counts."""
    mod = _load_script(monkeypatch, "bench_heap")
    mod.main(["--models", "sine_mlp", "--repeats", "1", "--pairs", "1"])
    rows = [ln.split(" | ") for ln in capsys.readouterr().out.splitlines()
            if ln.startswith("| sine_mlp")]
    from numvar.instrument import heap

    sides = ["as it was"] + (["freed memory kept"] if heap._glibc() else ["as it was"])
    assert [r[1] for r in rows] == sides
    for r in rows:
        assert float(r[2]) > 0 and float(r[3]) > 0 and float(r[4]) > 0
        assert float(r[5]) >= 0 and float(r[6].rstrip(" |")) >= 0


def test_bench_heap_large_runs_both_sides_in_their_own_processes(monkeypatch, capsys):
    """benchmarks/bench_heap.py --large: one row per process, large blocks mapped (the
    setting before) then from the heap, each read back from the child that measured it,
    with positive times and memory and each ratio consistent with its columns."""
    mod = _load_script(monkeypatch, "bench_heap")
    mod.main(["--large", "16", "--warmup", "1", "--repeats", "1", "--pairs", "1"])
    rows = [[c.strip() for c in ln.strip("|").split("|")]
            for ln in capsys.readouterr().out.splitlines()[3:]]
    from numvar.instrument import heap

    assert [r[0] for r in rows] == ["mapped on their own (before)",
                                    "from the heap (default)" if heap._glibc()
                                    else "malloc as it is (not glibc)"]
    for r in rows:
        best, median, native, ratio, faults, sys_ms, peak, final = map(float, r[1:])
        assert 0 < best <= median and native > 0 and peak > 0 and final > 0
        assert faults >= 0 and sys_ms >= 0
        # each printed to 2 decimals (± 0.005): the ratio of the printed times within
        # their rounding of the printed ratio
        q = median / native
        assert abs(ratio - q) <= 0.005 + q * (0.005 / median + 0.005 / native) + 1e-9


def test_bench_prefault_runs_each_side_in_its_own_processes(monkeypatch, capsys):
    """benchmarks/bench_prefault.py: one row per process, the warm-up left out
    (NUMVAR_PREFAULT=0) then run, each read back from the child that measured it, with
    positive times and each ratio consistent with its columns."""
    mod = _load_script(monkeypatch, "bench_prefault")
    mod.main(["--repeats", "1", "--pairs", "1"])
    rows = [[c.strip() for c in ln.strip("|").split("|")]
            for ln in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["left out (NUMVAR_PREFAULT=0)", "run (default)"]
    for r in rows:
        op, flop, native, op_ratio, flop_ratio, gelu = map(float, r[1:])
        assert op > 0 and flop > 0 and native > 0 and gelu > 0
        assert abs(op_ratio - op / native) <= 0.06 * op_ratio + 0.1  # (printed rounded)
        assert abs(flop_ratio - flop / native) <= 0.06 * flop_ratio + 0.1


def test_bench_conv_runs_runs_each_side_in_its_own_processes(tmp_path_factory, monkeypatch,
                                                            capsys):
    """benchmarks/bench_conv_runs.py: one row per process, convolutions re-run whole
    (COLUMN_BYTES = 0) then in runs of samples, each read back from the child that
    measured it, with positive times and each ratio consistent with its columns."""
    cache = tmp_path_factory.getbasetemp() / "numvar-workloads-cache"  # shared, see models
    monkeypatch.setenv("NUMVAR_CACHE_DIR", str(cache))
    mod = _load_script(monkeypatch, "bench_conv_runs")
    mod.main(["--workload", "digits", "--batch", "4", "--repeats", "1", "--pairs", "1"])
    rows = [[c.strip() for c in ln.strip("|").split("|")]
            for ln in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["whole (COLUMN_BYTES = 0)",
                                    "in runs of samples (default, 32 MiB)"]
    for r in rows:
        ms, native, ratio, faults = float(r[1]), float(r[2]), float(r[3]), int(r[4])
        assert ms > 0 and native > 0 and faults >= 0
        assert abs(ratio - ms / native) <= 0.06 * ratio + 0.1  # (printed rounded)


def test_bench_inexact_prints_every_case(monkeypatch, capsys):
    """benchmarks/bench_inexact.py: one row per case, positive times, the ratio consistent
    with its columns."""
    _load_script(monkeypatch, "bench_declines")  # (its timing helper)
    mod = _load_script(monkeypatch, "bench_inexact")
    mod.main(["--repeats", "1", "--calls", "1"])
    lines = capsys.readouterr().out.strip().splitlines()[2:]
    assert [ln.split("|")[1].strip() for ln in lines] == list(mod.CASES)
    for ln in lines:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        native, flop = float(cells[1]), float(cells[2])
        assert native > 0 and flop > 0
        ratio = float(cells[3].rstrip("×"))
        assert abs(ratio - flop / native) <= 0.06 * ratio + 0.1  # (values printed rounded)
