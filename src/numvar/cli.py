"""The ``numvar`` command. Thin: parses options and calls the parts; no logic here.

Each section below belongs to one part of numvar; keep edits inside your section.
"""

from __future__ import annotations

import sys

import typer

from .errors import NumvarError

app = typer.Typer(
    name="numvar",
    help="How much can you trust the numbers your PyTorch model produces? "
         "Stochastic arithmetic, realizations, bitwise determinism and error bounds.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
demo_app = typer.Typer(help="Demos: the bundled digits model (default), the harmonic "
                            "series, the rounding diagnostic.",
                       subcommand_metavar="[harmonic | rounding [OPTIONS]]")
app.add_typer(demo_app, name="demo")
determinism_app = typer.Typer(help="Bitwise determinism: record a reference run, check a run against it.",
                              no_args_is_help=True)
app.add_typer(determinism_app, name="determinism")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from . import __version__

        try:
            torch = version("torch")
        except PackageNotFoundError:  # pragma: no cover - torch is a dependency
            torch = "not installed"
        typer.echo(f"numvar {__version__} (torch {torch}, Python {sys.version.split()[0]})")
        raise typer.Exit(0)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log diagnostics (INFO level)."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print numvar's version and exit."),
) -> None:
    import logging

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


# ---------------------------------------------------------------- demo (workloads)
@demo_app.callback(invoke_without_command=True)
def demo(
    ctx: typer.Context,
    out: str = typer.Option("numvar-demo", "--out", "-o", help="Folder for report.html, "
                            "the per-mode reports and the run directories."),
    n: int = typer.Option(10, "-n", "--realizations", help="Realizations per rounding mode."),
    samples: int = typer.Option(0, "--samples", help="Classify only the first N test images "
                                "(0: all 450)."),
    modes: str = typer.Option("sr,ud", "--modes", help="Rounding modes, comma-separated "
                              "(sr, ud, random, ieee)."),
    granularity: str = typer.Option("flop", "--granularity", "-g", help="flop or op."),
    seed: int = typer.Option(0, "--seed", help="Seed of realization 0 (i uses seed+i)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Worker processes."),
    basis: int = typer.Option(10, "--basis", help="Significant digits in base 10 or 2 (bits)."),
) -> None:
    """Without a subcommand: the digits demo. Loads (or trains, seconds) a LeNet CNN on
    scikit-learn's digits, runs N stochastic-rounding and N up-down realizations of its
    inference at flop granularity plus an IEEE reference, and writes OUT/report.html."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .workloads.demo import DemoConfig, run_demo

    console = Console(stderr=True)
    cfg = DemoConfig(out=out, n=n, modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
                     granularity=granularity, images=samples or None, seed=seed, jobs=jobs,
                     basis=basis)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=False)
    tasks: dict[str, int] = {}

    def progress(mode: str, event: str, payload) -> None:
        if event == "compile":  # numvar's kernels, before any realization
            if "estimate_s" in payload:
                tasks[mode] = bar.add_task(f"compiling numvar's kernels: first run only, "
                                           f"~{payload['estimate_s']} s", total=None)
            else:
                bar.remove_task(tasks.pop(mode))
                if (payload.get("compile_s") or 0) > 1.0:
                    bar.console.print(_kernels_ready(payload["compile_s"]))
            return
        if mode not in tasks:
            tasks[mode] = bar.add_task(f"{mode.upper()} realizations (+ IEEE)", total=None)
        if event == "total":
            bar.update(tasks[mode], total=payload)
        elif event == "done":
            bar.advance(tasks[mode])

    console.print(f"numvar demo: digits CNN, {n} realizations per mode ({', '.join(cfg.modes)}), "
                  f"{granularity} granularity")
    with bar:
        res = run_demo(cfg, progress=progress)
    unit = "bits" if basis == 2 else "decimal digits"
    table = Table(title=f"significant {unit} (median / min; the loss is one number) and "
                        f"class flips, "
                        f"{res.images} test images")
    for col in ("mode", "logits", "probabilities", "loss", "flipped", "accuracy"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for row in res.summary():
        table.add_row(row["mode"].upper(),
                      *(f"{row[k + '_median']:.2f} / {row[k + '_min']:.2f}"
                        for k in ("logits", "probabilities")),
                      f"{row['loss_median']:.2f}",       # one scalar: no median / min
                      f"{row['flipped']} of {row['samples']}",
                      "—" if row["accuracy_mean"] is None else f"{100 * row['accuracy_mean']:.2f} %")
    Console().print(table)
    total = sum(res.written.values())
    parts = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in res.written.items())
    Console().print(f"wrote {out} ({total / 1e6:.1f} MB: {parts})", soft_wrap=True)
    Console().print(f"report: [bold]{res.report.resolve()}[/bold]")


# ---------------------------------------------------------------- rounding demos
@demo_app.command("harmonic")
def demo_harmonic(
    n: int = typer.Option(10_000_000, "--terms", help="Number of terms 1/k."),
    samples: int = typer.Option(3, "--samples",
                                help="Realizations (seeds seed..seed+samples-1) per random mode."),
    seed: int = typer.Option(0, "--seed", help="First seed."),
    precision: int = typer.Option(None, "--precision",
                                  help="Virtual precision t in bits, 1..24 (default 24)."),
) -> None:
    """Sum 1/k for k = 1..n sequentially in binary32 under IEEE, SR, UD and random
    rounding (every division and addition rounded) and print the result beside the
    Fuzzy PyTorch paper's artifact figures (n = 10**7)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from .errors import ConfigError
    from .workloads.harmonic import harmonic_table

    if n < 1 or samples < 1:
        raise ConfigError("--terms and --samples must be >= 1")
    if precision is not None and not 1 <= precision <= 24:
        raise ConfigError(f"--precision must be in [1, 24], got {precision}")
    with Progress(transient=True) as prog:
        task = prog.add_task("summing", total=3 * samples)
        rows = harmonic_table(n, samples, seed, precision, progress=lambda: prog.advance(task))
    t = f", t = {precision} bits" if precision else ""
    table = Table(title=f"Harmonic series, sum of 1/k for k = 1..{n:,} in binary32{t}")
    table.add_column("computation")
    table.add_column("numvar", justify="right")
    table.add_column("± std", justify="right")
    table.add_column("paper (n = 10^7)", justify="right")
    names = {"ieee binary32": "IEEE binary32 (RN)", "ieee binary64": "IEEE binary64 (RN)",
             "sr": "SR", "ud": "UD", "random": "random rounding"}
    for r in rows:
        paper = "" if r.paper is None or n != 10_000_000 else (
            f"{r.paper[0]:.4f}" + (f" ± {r.paper[1]:.4f}" if r.paper[1] else "")
            + (" (Verrou)" if r.label == "random" else ""))
        table.add_row(names[r.label], f"{r.mean:.4f}",
                      "" if r.std is None else f"{r.std:.4f}", paper)
    Console().print(table)
    Console().print("SR tracks the binary64 sum; round-to-nearest stagnates once 1/k < ulp/2; "
                    "UD only perturbs the stagnated sum; random rounding drifts upwards.")


@demo_app.command("formats")
def demo_formats(
    out: str = typer.Option("numvar-formats", "--out", "-o",
                            help="Folder for formats.json, formats.md and formats.png."),
    formats: str = typer.Option(",".join(("binary32", "tf32", "bfloat16", "float16", "e5m2",
                                          "e4m3fn", "custom:7,5")), "--formats",
                                help="Comma-separated formats (names or custom:P,E)."),
    modes: str = typer.Option("ieee,sr,ud,up,down,farthest", "--modes",
                              help="Comma-separated rounding modes."),
    samples: int = typer.Option(3, "--samples", help="Realizations of each random mode."),
    images: int = typer.Option(200, "--images", help="First N test images (0: all 450)."),
    granularity: str = typer.Option("flop", "--granularity", help="flop | op."),
    accumulate: str = typer.Option("native", "--accumulate", help="native | same."),
    seed: int = typer.Option(0, "--seed", help="First seed of the random modes."),
) -> None:
    """The digits CNN across number formats x rounding modes: accuracy, digits of the loss
    shared with native binary32, and flipped predictions, in a table and a plot."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from .workloads.formats_demo import FormatsDemoConfig, parse_formats, run_formats_demo

    fl = parse_formats(formats)
    ml = tuple(m.strip() for m in modes.split(",") if m.strip())
    cfg = FormatsDemoConfig(out=out, formats=fl, modes=ml, samples=samples,
                            images=images or None, granularity=granularity,
                            accumulate=accumulate, seed=seed)
    with Progress(transient=True) as prog:
        task = prog.add_task("format x mode", total=len(fl) * len(ml))
        res = run_formats_demo(cfg, progress=lambda f, m: prog.advance(task))
    table = Table(title=f"digits CNN, {res.images} images, {granularity}, accumulate "
                        f"{accumulate} (native binary32: accuracy "
                        f"{res.reference['accuracy']:.4f}, loss {res.reference['loss']:.5f})")
    for col in ("format", "bits", "mode", "runs", "accuracy", "loss digits", "flips"):
        table.add_column(col, justify="left" if col in ("format", "mode") else "right")
    for r in res.rows:
        table.add_row(r["format"], str(r["bits"]), r["mode"], str(r["realizations"]),
                      f"{r['accuracy']:.4f}", f"{r['loss_digits']:.2f}", str(r["flips"]))
    con = Console()
    con.print(table)
    con.print("written: " + ", ".join(str(p) for p in res.paths.values()), soft_wrap=True)


@demo_app.command("rounding")
def demo_rounding(
    dtype: str = typer.Option("float32", "--dtype",
                              help="Target: float32, float64, bfloat16 or float16."),
    a: float = typer.Option(1.5, "--a", help="Grid point a; x = a + frac * ulp(a)."),
    frac: str = typer.Option("1/4", "--frac", help="Position of x between a and b, e.g. 1/4."),
    steps: int = typer.Option(16, "--steps", help="Length of the chain s += frac*ulp."),
    draws: int = typer.Option(100_000, "--draws", help="Realizations per mode (>= 2)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random draws."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """SR versus UD on one value: exact-rational mean and variance of one rounding of x and
    of a chain of roundings, against the empirical moments over many draws."""
    import json
    from fractions import Fraction

    import torch
    from rich.console import Console
    from rich.table import Table

    from .errors import ConfigError
    from .rounding.diagnostic import run_diagnostic

    dtypes = {"float32": torch.float32, "float64": torch.float64,
              "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise ConfigError(f"--dtype must be one of {', '.join(dtypes)}, got {dtype!r}")
    try:
        fr = Fraction(frac)
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"--frac must be a fraction such as 1/4, got {frac!r}") from None
    if not 0 <= fr < 1:
        raise ConfigError("--frac must lie in [0, 1)")
    if steps < 0 or draws < 2:
        raise ConfigError("--steps must be >= 0 and --draws >= 2")
    res = run_diagnostic(dtypes[dtype], a, fr, steps, draws, seed)
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    con = Console()
    for key, title in (("single", f"one rounding of x = a + {frac} ulp, a = {a} ({dtype})"),
                       ("chain", f"chain s ← round(s + {frac} ulp), {steps} steps from a")):
        table = Table(title=f"{title}; {draws:,} draws, units of ulp(a)")
        for col in ("mode", "bias theory", "bias measured", "std theory", "std measured",
                    "agrees"):
            table.add_column(col, justify="right" if col != "mode" else "left")
        for r in res[key]:
            table.add_row(r["mode"], f"{r['theory_bias_ulp']:+.4f}",
                          f"{r['empirical_bias_ulp']:+.4f} ± {r['mean_bound_ulp']:.4f}",
                          f"{r['theory_std_ulp']:.4f}", f"{r['empirical_std_ulp']:.4f}",
                          "yes" if r["ok"] else "[red]NO[/red]")
        con.print(table)
    con.print("bias = mean - exact value. SR is unbiased; UD perturbs the round-to-nearest "
              "result, so it keeps RN's bias; random rounding is biased toward the midpoint "
              "of the neighbours. Tolerance: 6 standard errors of the exact moments.")




# ---------------------------------------------------------------- run (runner)
@app.command("run")
def run(
    command: list[str] = typer.Argument(
        None, metavar="-- python SCRIPT.py [ARGS] | -- -m MODULE [ARGS]",
        help="The script to run, after `--`, exactly as you would run it."),
    n: int = typer.Option(None, "-n", help="Number of realizations (default: 10)."),
    mode: str = typer.Option(None, "--mode", help="ieee | sr | ud | random | up | down | "
                                                  "zero | farthest (default: sr)."),
    granularity: str = typer.Option(None, "--granularity", help="flop | op (default: flop)."),
    precision: int = typer.Option(None, "--precision",
                                  help="Virtual precision in significand bits."),
    contraction: str = typer.Option(None, "--contraction",
                                    help="separate (default: every product and add of a "
                                         "contraction rounded) | fma (one rounding per "
                                         "multiply-add, as FMA hardware)."),
    fmt_name: str = typer.Option(None, "--format",
                               help="Round every result to this format, tensors keeping "
                                    "their dtype: binary64, binary32, tf32, bfloat16, "
                                    "float16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz or "
                                    "custom:PRECISION,EXPONENT_BITS."),
    accumulate: str = typer.Option(None, "--accumulate",
                                   help="native (default: low-precision contractions "
                                        "accumulate in binary32, the result rounded once) "
                                        "| same (every partial sum in the format)."),
    seed: int = typer.Option(None, "--seed", help="Realization i uses seed+i (default: 0)."),
    jobs: int = typer.Option(None, "--jobs", "-j",
                             help="Realizations run at once (default: number of cores)."),
    out: str = typer.Option(None, "--out", "-o",
                            help="Run directory (default: runs/SCRIPT-DATE-TIME)."),
    capture: str = typer.Option(None, "--capture",
                                help="What to capture, comma-separated: api (numvar.capture "
                                     "calls), modules (top-level nn.Module outputs), stdout "
                                     "(printed floats), or none (default: api,modules,stdout)."),
    capture_layers: list[str] = typer.Option(
        None, "--capture-layers", help="Globs over named_modules() paths whose outputs to "
                                       "capture, e.g. 'features.*' (repeatable)."),
    files: list[str] = typer.Option(
        None, "--files", help="Globs of .npy/.npz/.safetensors files the script writes in "
                              "its working directory, e.g. 'out/*.npy' (repeatable)."),
    exclude: str = typer.Option(None, "--exclude",
                                help="Aten op globs or op kinds left uninstrumented."),
    include: str = typer.Option(None, "--include",
                                help="Instrument only these aten op globs or op kinds."),
    modules: str = typer.Option(None, "--modules",
                                help="Instrument only inside submodules matching these "
                                     "named_modules() globs."),
    strict: bool = typer.Option(None, "--strict",
                                help="Fail a realization at the first op numvar cannot perturb "
                                     "at the requested granularity (NUMVAR_STRICT=1)."),
    executor: str = typer.Option(None, "--executor", help="local | dask (default: local)."),
    scheduler: str = typer.Option(None, "--scheduler",
                                  help="Dask scheduler address (tcp://host:8786); without "
                                       "it --executor dask starts a LocalCluster."),
    capture_limit: str = typer.Option(
        None, "--capture-limit", metavar="SIZE",
        help="Most bytes one realization may capture, e.g. 1GB, 200MB, or none; captures "
             "past it are dropped and reported (default: 1GiB)."),
    resume: str = typer.Option(None, "--resume", metavar="RUN_DIR",
                               help="Complete an interrupted run: what is missing or corrupt "
                                    "runs again; -n larger than the run's adds realizations."),
) -> None:
    """Run an unmodified script N times under random rounding, after one IEEE reference.

    Each realization is a fresh `python -m numvar.exec` process, instrumented before
    the script starts, with the same random state, threads and inputs as the
    reference; results are stored atomically in the run directory.

    Example: numvar run -n 10 --jobs 2 --out runs/mnist -- python infer.py --batch 64
    """
    from functools import partial

    from rich.console import Console

    from .errors import ConfigError
    from .runner.script import resume_script, run_script

    console = Console(stderr=True)
    if resume is not None:
        given = {"--mode": mode, "--granularity": granularity, "--precision": precision,
                 "--contraction": contraction, "--format": fmt_name, "--accumulate": accumulate,
                 "--seed": seed, "--out": out, "--capture": capture,
                 "--capture-layers": capture_layers, "--files": files, "--exclude": exclude,
                 "--include": include, "--modules": modules, "--strict": strict,
                 "--capture-limit": capture_limit,
                 "script": command}
        extra = [k for k, v in given.items() if v not in (None, [], ())]
        if extra:
            raise ConfigError(f"--resume takes its configuration from {resume}/manifest.json; "
                              f"drop {', '.join(extra)} (only -n (to add realizations), "
                              f"--jobs, --executor and --scheduler may change)")
    show = _RunProgress(console)
    if resume is not None:
        call = partial(resume_script, resume, n=n, jobs=jobs, executor=executor,
                       scheduler=scheduler, progress=show)
    else:
        call = partial(
                run_script, command or [], n=10 if n is None else n, mode=mode or "sr",
                granularity=granularity or "flop", precision=precision,
                seed=0 if seed is None else seed, jobs=jobs, out=out, capture=capture,
                capture_layers=capture_layers, files=files, exclude=exclude, include=include,
                modules=modules, strict=bool(strict), capture_limit=capture_limit,
                contraction=contraction or "separate",
                format=fmt_name, accumulate=accumulate or "native",
                executor=executor or "local", scheduler=scheduler, progress=show)
    try:
        with show.bar:
            result = call()
    except KeyboardInterrupt:
        where = show.path
        console.print("interrupted: what finished is stored"
                      + (f"; complete it with numvar run --resume {where}" if where else ""),
                      soft_wrap=True)
        raise typer.Exit(130)
    _run_summary(console, result)


class _RunProgress:
    """``numvar run``'s progress display: the bar, the kernel compilation, the ETA, the
    files ``--resume`` found missing or corrupt."""

    def __init__(self, console) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn)

        self.console = console
        self.bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                            TimeElapsedColumn(), console=console, transient=False)
        self.task = None
        self.compile_task = None
        self.failed = 0
        self.path = None

    def __call__(self, event: str, payload) -> None:
        say = self.bar.console.print
        if event == "store":
            self.path = payload
        elif event == "added":
            say(f"adding realizations {payload[0]}..{payload[-1]}", soft_wrap=True)
        elif event == "problems":
            for index, why in payload:
                tag = "reference" if index is None else f"r{index:04d}"
                say(f"[yellow]{tag}: {why}; running it again[/]", soft_wrap=True)
        elif event == "total":
            self.task = self.bar.add_task("reference + realizations", total=payload, note="")
        elif event == "compile" and "estimate_s" in payload:
            self.compile_task = self.bar.add_task(
                f"compiling numvar's kernels: first run only, ~{payload['estimate_s']} s",
                total=None, note="")
        elif event == "compile":
            if self.compile_task is not None:
                self.bar.remove_task(self.compile_task)
                self.compile_task = None
            if (payload.get("compile_s") or 0) > 1.0:
                say(_kernels_ready(payload["compile_s"]), soft_wrap=True)
        elif event == "eta":
            ref = payload.get("reference_s")
            say(("" if ref is None else f"reference {ref:.1f} s, ")
                + f"first realization {payload['first_s']:.1f} s: ETA ~{_duration(payload['seconds'])}"
                f" for the remaining {payload['remaining']} ({payload['jobs']} at a time)",
                soft_wrap=True)
        elif event == "done":
            self.failed += payload["status"] != "ok"
            self.bar.update(self.task, advance=1,
                            note=f"[red]{self.failed} failed[/]" if self.failed else "")


def _kernels_ready(seconds: float) -> str:
    return (f"numvar's kernels ready in {seconds:.0f} s (compiled on the first run, loaded "
            f"from numba's cache later; not counted in realization times)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _run_summary(console, result) -> None:
    """What ``numvar run`` stored, what failed or was dropped, and what to do next."""
    m = result.store.manifest
    reals = m["realizations"]
    ok = sum(r["status"] == "ok" for r in reals)
    console.print(f"{ok} of {len(reals)} realizations stored in [bold]{result.path}[/] "
                  f"({len(m['captures'])} captures, {result.wall_s:.1f} s)", soft_wrap=True)
    dropped = [r for r in reals if r["status"] == "ok" and r.get("dropped")]
    if dropped:
        calls = sum(d["calls"] for r in dropped for d in r["dropped"].values())
        limit = m["config"].get("capture_limit")
        console.print(f"[yellow]the capture limit ({limit / 2**20:.0f} MiB per realization) "
                      f"dropped {calls} capture call(s) in {len(dropped)} realization(s); "
                      f"raise it with --capture-limit (the report lists them)[/]",
                      soft_wrap=True)
    if ok >= 2:
        console.print(f"next: numvar report {result.path}", soft_wrap=True)
    else:
        console.print(f"[red]{ok} usable realization(s): a report needs at least 2[/]",
                      soft_wrap=True)
    if result.failed:
        from .runner.engine import failure_summary

        console.print(failure_summary(result.failed, result.total), style="red",
                      markup=False, highlight=False, soft_wrap=True)
        console.print(f"logs: {result.path / 'logs'}; rerun the failed ones with "
                      f"numvar run --resume {result.path}", soft_wrap=True)
        raise typer.Exit(1)


# ---------------------------------------------------------------- report / compare (analysis)
# options shared by report and compare
_OPT = {
    "format": typer.Option("table", "--format", "-f", help="table, json or html."),
    "output": typer.Option(None, "--output", "-o", help="Write to FILE (required for html)."),
    "method": typer.Option("cnh", "--method", help="Significant-digits method: cnh (Sohier et "
                           "al.'s centred normality hypothesis) or general (no distribution "
                           "assumed)."),
    "basis": typer.Option(10, "--basis", help="Significant digits in base 10 (decimal digits) "
                          "or 2 (bits)."),
    "wide": typer.Option(False, "--wide", help="Tables with every column, however wide (by "
                         "default a table too wide for the terminal prints as one block per "
                         "row)."),
    "error": typer.Option("relative", "--error", help="relative (X/x - 1) or absolute (X - x) "
                          "error."),
    "against": typer.Option("reference", "--against", help="reference (the IEEE run; the "
                            "sample mean where none is stored) or mean."),
    "probability": typer.Option(0.95, "--probability", "-p",
                                help="Probability p that the digits are significant."),
    "confidence": typer.Option(0.95, "--confidence", "-c",
                               help="Confidence level of that statement."),
}


def _analysis_options(fmt: str, output: str | None, method: str, basis: int, error: str,
                      against: str, probability: float, confidence: float) -> dict:
    """Check every option, naming it, before any run is read; the analyze() keywords."""
    import os

    from .errors import ConfigError

    choices = {"--format": (fmt, ("table", "json", "html")),
               "--method": (method.lower(), ("cnh", "general")),
               "--error": (error.lower(), ("relative", "absolute")),
               "--against": (against.lower(), ("reference", "mean"))}
    for flag, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"{flag} {value!r}: expected {', '.join(allowed[:-1])} or "
                              f"{allowed[-1]}")
    if basis not in (2, 10):
        raise ConfigError(f"--basis {basis}: expected 2 or 10")
    for flag, v in (("--probability", probability), ("--confidence", confidence)):
        if not 0.0 < v < 1.0:
            raise ConfigError(f"{flag} {v}: expected a number strictly between 0 and 1")
    if fmt == "html" and not output:
        raise ConfigError("--format html needs -o FILE")
    if output and os.path.isdir(output):
        raise ConfigError(f"--output {output}: is a directory; expected a file name")
    return {"method": method.lower(), "basis": basis, "error": error.lower(),
            "against": against.lower(), "probability": probability, "confidence": confidence}


def _write_output(output: str, text: str) -> None:
    from ._io import atomic_write_text
    from .errors import ConfigError

    try:
        atomic_write_text(output, text)
    except OSError as exc:
        raise ConfigError(f"--output {output}: cannot write: {exc.strerror or exc}") from exc


def _emit(fmt: str, output: str | None, data: dict, renderables, html, wide: bool = False) -> None:
    """Print or write (-o) ``data`` as JSON, its rich ``renderables()``, or ``html()``."""
    import json

    from rich.console import Console

    if fmt == "json":
        text = json.dumps(data, indent=2, default=str) + "\n"
        if output:
            _write_output(output, text)
        else:
            sys.stdout.write(text)
    elif fmt == "html":
        _write_output(output, html())
        Console(stderr=True).print(f"wrote {output}")
    elif output:  # the tables go to the file only, at a width that keeps them whole
        import io

        console = Console(file=io.StringIO(), record=True, width=160)
        for r in renderables(wide):
            console.print(r)
        _write_output(output, console.export_text())
        Console(stderr=True).print(f"wrote {output}")
    else:
        console = Console()
        for r in renderables(wide):
            console.print(r)


@app.command("ops")
def ops_cmd(
    fmt: str = typer.Option("markdown", "--format", help="markdown | json."),
    output: str = typer.Option(None, "--output", "-o", help="Write to this file."),
) -> None:
    """Every aten op numvar knows and how it is handled at each granularity.

    Handlings: flop kernel, decomposition, rounded once, exact, in place, not reached;
    'rounded once (ESCAPE)' marks an op that flop granularity does not cover. Generated
    from the handler table (numvar.instrument.optable). Example: numvar ops --format json
    """
    from .instrument.optable import render

    text = render(fmt)
    if output:
        _write_output(output, text)
    else:
        typer.echo(text, nl=False)


@app.command("report")
def report(
    run_dir: str = typer.Argument(..., metavar="RUN", help="Run directory (runs/NAME)."),
    fmt: str = _OPT["format"],
    output: str = _OPT["output"],
    task: str = typer.Option("auto", "--task", help="auto (classification when a capture is "
                             "named like logits/probs), classification, segmentation, none."),
    scores: list[str] = typer.Option(None, "--scores", help="Score capture(s) to treat as "
                                     "decisions (default: names containing logits/probs)."),
    labels: str = typer.Option(None, "--labels", help="Capture holding the true labels "
                               "(default: one named labels or targets)."),
    method: str = _OPT["method"],
    basis: int = _OPT["basis"],
    error: str = _OPT["error"],
    against: str = _OPT["against"],
    probability: float = _OPT["probability"],
    confidence: float = _OPT["confidence"],
    wide: bool = _OPT["wide"],
    locate_json: str = typer.Option(None, "--locate", metavar="FILE.json",
                                    help="Add the result of `numvar locate --json FILE.json` "
                                         "(html and table formats)."),
    locate_map: str = typer.Option(None, "--locate-map", metavar="FILE.png",
                                   help="Embed this `numvar locate --map` PNG with --locate "
                                        "(html)."),
) -> None:
    """Analyse a run: mean, std, standard error and significant digits per capture; flips,
    accuracy and Dice for decisions; the per-layer curve; training bands; optionally a
    saved `numvar locate` result.

    Significant digits are decimal digits unless --basis 2 (bits). Tables that do not fit
    the terminal are printed as one block per capture; --wide prints every column.

    Examples:
    numvar report runs/digits
    numvar report runs/digits --format html -o report.html
    numvar report runs/digits --format json -o report.json --basis 2
    """
    from .analysis import analyze, render_html
    from .analysis.core import TASKS
    from .analysis.text import report_renderables
    from .errors import ConfigError
    from .runner.store import load_run

    opts = _analysis_options(fmt, output, method, basis, error, against, probability,
                             confidence)
    if task not in TASKS:
        raise ConfigError(f"--task {task!r}: expected one of {', '.join(TASKS)}")
    loc, sections = None, []
    if locate_map and not locate_json:
        raise ConfigError("--locate-map needs --locate FILE.json")
    if locate_json:
        if fmt == "json":
            raise ConfigError("--locate adds a section to the html and table reports; with "
                              "--format json keep the locate JSON file as it is")
        from .locate.saved import load_locate, locate_sections, read_png

        loc = load_locate(locate_json)            # fails before the run is read
        if fmt == "html":
            sections = locate_sections(locate_json, locate_map)
        elif locate_map:
            read_png(locate_map)
    samples = load_run(run_dir)
    result = analyze(samples, task=task, scores=scores or None, labels=labels,
                     path=str(run_dir), **opts)

    def renderables(wide: bool = False) -> list:
        out = report_renderables(result, wide=wide)
        if loc is not None:
            from rich.text import Text

            from .locate import renderables as locate_renderables

            out += [Text(""), Text.assemble(("Locating instability", "bold"),
                                            f" ({locate_json})"), *locate_renderables(loc)]
        return out

    _emit(fmt, output, result, renderables,
          lambda: render_html(result, samples, extra_sections=sections), wide=wide)


@app.command("compare")
def compare_cmd(
    run_a: str = typer.Argument(..., metavar="RUN_A", help="First run directory."),
    run_b: str = typer.Argument(..., metavar="RUN_B", help="Second run directory."),
    fmt: str = _OPT["format"],
    output: str = _OPT["output"],
    method: str = _OPT["method"],
    basis: int = _OPT["basis"],
    error: str = _OPT["error"],
    against: str = _OPT["against"],
    probability: float = _OPT["probability"],
    confidence: float = _OPT["confidence"],
    wide: bool = _OPT["wide"],
) -> None:
    """Compare two runs (e.g. SR vs UD, flop vs op): significant digits side by side.

    Examples:
    numvar compare runs/digits-sr runs/digits-ud
    numvar compare runs/digits-sr runs/digits-ud --format html -o sr-vs-ud.html
    """
    from .analysis import analyze_run, compare, render_compare_html
    from .analysis.text import compare_renderables
    from .runner.store import RunStore

    opts = _analysis_options(fmt, output, method, basis, error, against, probability,
                             confidence)
    for r in (run_a, run_b):
        RunStore.open(r)         # a missing or corrupt run fails before any analysis
    cmp = compare(analyze_run(run_a, **opts), analyze_run(run_b, **opts))
    _check_comparable(cmp, run_a, run_b)
    _emit(fmt, output, cmp, lambda w=False: compare_renderables(cmp, wide=w),
          lambda: render_compare_html(cmp), wide=wide)


def _check_comparable(cmp: dict, run_a: str, run_b: str) -> None:
    """Refuse two runs with no capture of one name and shape in common; warn, naming
    it, about what else differs (the program, captures of other shapes)."""
    from rich.console import Console

    from .errors import ConfigError

    diff = [f"{d['name']} {tuple(d['a'])} vs {tuple(d['b'])}" for d in cmp["shape_differs"]]
    if not cmp["captures"]:
        raise ConfigError(
            f"{run_a} and {run_b} have no capture of the same name and shape to compare"
            + (f" (program: {cmp['program_differs']})" if cmp["program_differs"] else "")
            + (f"; shapes differ: {', '.join(diff[:5])}" if diff else "")
            + (f"; only in the first: {', '.join(cmp['only_a'][:5])}" if cmp["only_a"] else "")
            + (f"; only in the second: {', '.join(cmp['only_b'][:5])}" if cmp["only_b"] else ""))
    warn = Console(stderr=True, highlight=False, soft_wrap=True)
    if cmp["program_differs"]:
        warn.print(f"[yellow]warning: the runs ran different programs: "
                   f"{cmp['program_differs']}[/]")
    if diff:
        warn.print(f"[yellow]warning: not compared, shapes differ: {', '.join(diff)}[/]")


# ---------------------------------------------------------------- determinism
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@determinism_app.command(
    "record", context_settings=_PASSTHROUGH,
    options_metavar="[OPTIONS] -- python SCRIPT.py [ARGS] | -- python -m MODULE [ARGS]")
def determinism_record(
    ctx: typer.Context,
    out: str = typer.Option(..., "--out", "-o", help="Folder for the recording (hashes.json)."),
    stacks: bool = typer.Option(True, "--stacks/--no-stacks",
                                help="Store each op's user stack (ops run in backward: "
                                     "the forward call, via autograd anomaly mode)."),
) -> None:
    """Record a script's op hashes as a reference.

    Runs COMMAND (python SCRIPT.py ..., python -m MODULE ..., SCRIPT.py ...) under
    HashMode and writes DIR/hashes.json: every aten op in call order, the hash of its
    outputs and its user-code stack. Nothing is written when the script fails.

    Example: numvar determinism record -o ref/ -- python train_step.py --steps 1
    """
    from rich.console import Console

    from .determinism import record_script

    res = record_script(list(ctx.args), out, stacks=stacks)
    Console().print(f"recorded {res.n_ops} ops ({len(res.counts)} distinct) to {res.path}")


@determinism_app.command("check", context_settings=_PASSTHROUGH)
def determinism_check(
    ctx: typer.Context,
    reference: str = typer.Argument(..., metavar="REF",
                                    help="A folder written by `numvar determinism record`."),
) -> None:
    """Check a script's run against a recording, op by op.

    Runs COMMAND under HashMode, compares every op's output hash with REF as it runs and
    prints the first divergent op with both stacks, or "bitwise identical (N ops)".
    Exit status 1 on divergence, 2 on a missing or corrupt recording.

    Example: numvar determinism check ref/ -- python train_step.py --steps 1
    """
    from rich.console import Console

    from .determinism import check_script

    res = check_script(reference, list(ctx.args))
    console = Console(highlight=False, soft_wrap=True)
    if res.identical:
        console.print(f"[green]{res.message()}[/green]")
        return
    console.print(f"[red]not bitwise identical[/red]\n{res.message()}", markup=True)
    raise typer.Exit(1)



# ---------------------------------------------------------------- bounds
@app.command("bounds")
def bounds_cmd(
    spec: str = typer.Argument(..., metavar="MODEL.py:BUILD",
                               help="File (or module) and function returning the model."),
    input_shape: str = typer.Option(None, "--input-shape",
                                    help="Shape of the sample input, e.g. 1,1,28,28 "
                                         "(uniform in [0,1), seed --seed)."),
    precision: str = typer.Option("fp32", "--precision",
                                  help="fp32 or bf16-mixed (bf16 operands and stored "
                                       "conv/dense results, fp32 accumulation)."),
    input_file: str = typer.Option(None, "--input", help="Sample input (.safetensors)."),
    input_key: str = typer.Option(None, "--input-key",
                                  help="Tensor to use when --input holds several."),
    input_bound: float = typer.Option(None, "--input-bound",
                                      help="A-priori bound A on |input| (default: 1 for "
                                           "generated inputs, max|x| for --input)."),
    run: str = typer.Option(None, "--run", help="Run directory: adds the SR std per layer."),
    plot: str = typer.Option(None, "--plot", help="Write log10 of the curves vs depth (PNG)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated sample input."),
) -> None:
    """Worst-case rounding-error bounds per layer (a-priori and data-dependent) against
    the measured error |computed - float64| and, with --run, the SR std.

    Example: numvar bounds model.py:build --input-shape 8,16 --precision bf16-mixed
    """
    import json
    import logging
    import math

    import torch
    from rich.console import Console
    from rich.table import Table

    from . import _spec
    from .bounds import network_bounds
    from .errors import ConfigError
    from .runner.store import RunStore

    if fmt not in ("table", "json"):
        raise ConfigError(f"--format {fmt!r}: expected table or json")
    if precision not in ("fp32", "bf16-mixed"):
        raise ConfigError(f"--precision {precision!r}: expected fp32 or bf16-mixed")
    if input_bound is not None and not (math.isfinite(input_bound) and input_bound >= 0):
        raise ConfigError(f"--input-bound {input_bound}: expected a finite number >= 0")
    if run is not None:
        RunStore.open(run)             # a missing or corrupt run fails before the work
    if input_file is not None:
        x = _spec.load_input(input_file, input_key)
        if input_shape is not None and tuple(x.shape) != _spec.parse_shape(input_shape):
            raise ConfigError(f"--input has shape {tuple(x.shape)}, --input-shape says "
                              f"{_spec.parse_shape(input_shape)}")
    elif input_shape is not None:
        gen = torch.Generator().manual_seed(seed)
        x = torch.rand(_spec.parse_shape(input_shape), generator=gen)
        if input_bound is None:
            input_bound = 1.0
    else:
        raise ConfigError("give --input-shape or --input")
    try:
        model = _spec.load_object(spec)()
    except NumvarError:
        raise
    except Exception as exc:  # the user's file or build function failed
        logging.getLogger(__name__).info("building %s failed", spec, exc_info=True)
        raise ConfigError(f"{spec}: building the model raised {type(exc).__name__}: {exc} "
                          "(-v for the traceback)") from exc
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    result = network_bounds(model, x, precision=precision, input_bound=input_bound, run=run)
    if plot:
        try:
            result.plot(plot)
        except OSError as exc:
            raise ConfigError(f"--plot {plot}: cannot write: {exc.strerror or exc}") from exc
    if fmt == "json":
        typer.echo(json.dumps(result.to_dict(), indent=2, allow_nan=False))
        return

    def g(v, digits=3):
        return "-" if v is None else f"{v:.{digits}g}"

    table = Table(title=f"rounding-error bounds ({result.precision}), input "
                        f"{list(result.input_shape)}, |input| <= {result.input_bound:g}")
    for col in ("#", "layer", "kind", "fan-in", "w", "A", "a-priori", "data-dep.",
                "measured", "SR std"):
        table.add_column(col, justify="left" if col in ("layer", "kind") else "right")
    for r in result.layers:
        table.add_row(str(r.index), r.name, r.kind, "-" if r.fan_in is None else str(r.fan_in),
                      g(r.w), g(r.A), g(r.apriori), g(r.data_dependent), g(r.measured),
                      g(r.sr_std))
    console = Console()
    if console.width < 120:  # a full table beats ellipses in narrow or piped output
        console = Console(width=120)
    console.print(table)
    console.print(f"output: a-priori bound {g(result.output_apriori)}, data-dependent "
                  f"{g(result.output_data_dependent)}, measured {g(result.output_measured)}"
                  + (f", SR std {g(result.output_sr_std)}" if result.output_sr_std is not None
                     else ""))
    console.print(f"bound/measured: a-priori {g(result.ratio_apriori)}, data-dependent "
                  f"{g(result.ratio_data_dependent)}; network gain {g(result.network_gain)}")
    if plot:
        console.print(f"plot written to {plot}")


# ---------------------------------------------------------------- locate
@app.command("locate")
def locate_cmd(
    spec: str = typer.Argument(..., metavar="MODEL",
                               help="FILE.py:FUNCTION (or module:function) returning the model."),
    input_shape: str = typer.Option(None, "--input-shape",
                                    help="Random normal input of this shape, e.g. 8,16."),
    input_file: str = typer.Option(None, "--input", help="Input tensor from a .safetensors file."),
    input_key: str = typer.Option(None, "--input-key", help="Tensor name inside --input."),
    input_seed: int = typer.Option(0, "--input-seed", help="Seed of the random input."),
    dtype: str = typer.Option("float32", "--dtype",
                              help="dtype of the random input: float32, float64, bfloat16, float16."),
    n: int = typer.Option(6, "-n", help="Realizations per evaluated set."),
    by: str = typer.Option("module", "--by", help="Blame 'module's (leaf modules) or 'op' kinds."),
    mode: str = typer.Option("sr", "--mode", help="Rounding mode: sr, ud, random, ieee, up, "
                                                  "down, zero, farthest."),
    granularity: str = typer.Option("flop", "--granularity", help="flop or op."),
    precision: int = typer.Option(None, "--precision", help="Virtual precision (significand bits)."),
    seed: int = typer.Option(0, "--seed", help="Seed of realization 0 (realization i: seed+i)."),
    threshold: float = typer.Option(None, "--threshold",
                                    help="Output digits to keep (default: halfway between the "
                                         "digits kept with everything perturbed and the cap)."),
    basis: int = typer.Option(10, "--basis", help="Significant digits in base 10 (decimal "
                              "digits) or 2 (bits)."),
    method: str = typer.Option("cnh", "--method", help="Significant digits method: cnh, general."),
    stat: str = typer.Option("mean", "--stat", help="Output summary over elements: mean, median, min."),
    necessity: bool = typer.Option(True, "--necessity/--no-necessity",
                                   help="Also perturb everything except each candidate."),
    dd: bool = typer.Option(True, "--ddmin/--no-ddmin", help="Delta-debug a minimal set."),
    max_dd_tests: int = typer.Option(None, "--max-dd-tests", help="Cap ddmin's extra evaluations."),
    select: str = typer.Option(None, "--select", help="Comma-separated globs over candidate names."),
    layers: bool = typer.Option(True, "--layers/--no-layers", help="Error propagation view."),
    map_png: str = typer.Option(None, "--map", help="Write the spatial view (PNG) here."),
    class_dim: int = typer.Option(None, "--class-dim",
                                  help="Segmentation: class axis of the output (flip map)."),
    json_out: str = typer.Option(None, "--json", help="Write the result as JSON here."),
    html_out: str = typer.Option(None, "--html", help="Write an HTML page of the result here."),
    executor: str = typer.Option("local", "--executor", help="Runner executor: local or dask."),
    jobs: int = typer.Option(None, "--jobs", "-j", help="Parallel realizations."),
    scheduler: str = typer.Option(None, "--scheduler", help="Dask scheduler address."),
) -> None:
    """Which modules (or op kinds) cost the output its significant digits.

    Perturbs one candidate at a time (everything else IEEE), ranks them most harmful
    first, delta-debugs a minimal set breaking --threshold and prints what it spent.

    Example: numvar locate model.py:build --input-shape 8,16 -n 4 --json locate.json
    """
    from pathlib import Path

    import torch
    from rich.console import Console

    from . import _spec
    from .errors import ConfigError
    from .locate import locate
    from .locate.report import html_page, renderables

    if (input_shape is None) == (input_file is None):
        raise ConfigError("give exactly one of --input-shape and --input")
    if class_dim is not None and map_png is None:
        raise ConfigError("--class-dim is for the spatial view: give --map FILE.png too")
    if input_key is not None and input_file is None:
        raise ConfigError("--input-key names a tensor inside --input FILE.safetensors: "
                          "give --input too")
    for opt, path in (("--json", json_out), ("--map", map_png), ("--html", html_out)):
        if path is not None and Path(path).is_dir():  # fail now, not after the analysis
            raise ConfigError(f"{opt} {path}: is a folder, give a file name")
    model = _spec.load_object(spec)()
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    model.eval()
    if input_file is not None:
        x = _spec.load_input(input_file, input_key)
    else:
        dtypes = {"float32": torch.float32, "float64": torch.float64,
                  "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype not in dtypes:
            raise ConfigError(f"--dtype must be one of {', '.join(dtypes)}, not {dtype!r}")
        g = torch.Generator().manual_seed(input_seed)
        x = torch.randn(_spec.parse_shape(input_shape), generator=g).to(dtypes[dtype])
    console = Console(stderr=False)
    status = console.status("locate: recording the model")

    def progress(k: int, names: list[str]) -> None:
        shown = ", ".join(names[:4]) + (f", … ({len(names)})" if len(names) > 4 else "")
        status.update(f"locate: evaluation {k} ({n} realizations): perturbing {shown}")

    with status:
        res = locate(
            model, x, n=n, by=by, mode=mode, granularity=granularity, precision=precision,
            seed=seed, threshold=threshold, basis=basis, method=method, stat=stat,
            necessity=necessity, ddmin=dd, layers=layers, spatial=map_png is not None,
            class_dim=class_dim, max_dd_tests=max_dd_tests,
            select=[s.strip() for s in select.split(",") if s.strip()] if select else None,
            executor=executor, jobs=jobs, scheduler=scheduler, progress=progress)
    for r in renderables(res):
        console.print(r)
    if json_out:
        res.save_json(json_out)
        console.print(f"JSON: {json_out}")
    if map_png:
        res.save_map(map_png)
        console.print(f"map: {map_png}")
    if html_out:
        from ._io import atomic_write_text

        atomic_write_text(html_out, html_page(res))
        console.print(f"HTML: {html_out}")


# ---------------------------------------------------------------- entry point
def _click_exceptions() -> tuple[type[BaseException], ...]:
    """ClickException classes: typer >= 0.22 bundles its own click, older ones use click."""
    classes = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            classes.append(__import__(name, fromlist=["ClickException"]).ClickException)
        except (ImportError, AttributeError):
            pass
    return tuple(classes)


def _help_paragraphs(text: str) -> str:
    """Join the hard-wrapped lines of each paragraph (the terminal rewraps them); a
    paragraph starting with "Example" keeps its lines, one ``$ command`` per line."""
    import inspect

    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        if para.startswith("Example"):
            head, _, rest = para.partition(":")
            cmds = [ln.strip() for ln in rest.strip().splitlines() if ln.strip()]
            out.append("\n".join([head + ":", *("$ " + c for c in cmds)]))
        else:
            out.append(" ".join(ln.strip() for ln in para.splitlines()))
    return "\n\n".join(out)


def _show_type(param, text: str | None) -> None:
    """What the type column of ``--help`` shows for ``param`` (None: nothing)."""
    param.display_type_rich = lambda ctx: text


def _polish(cmd) -> None:
    """Make ``--help`` read like documentation, for every command of the tree.

    - metavars: TEXT, INTEGER, FLOAT instead of Python type names; none for flags;
    - defaults written one way, "(default: X)" at the end of the help text;
    - hard-wrapped docstrings joined into paragraphs (examples keep their lines);
    - pass-through commands show ``-- COMMAND [ARGS]...`` in their usage.
    """
    if cmd.help:
        cmd.help = _help_paragraphs(cmd.help)
    orig_help_option = cmd.get_help_option

    def help_option(ctx, _orig=orig_help_option):
        opt = _orig(ctx)
        if opt is not None:
            _show_type(opt, None)
        return opt

    cmd.get_help_option = help_option
    for param in cmd.params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            default = param.default
            if getattr(param, "secondary_opts", None) and isinstance(default, bool):
                shown = param.opts[-1] if default else param.secondary_opts[0]
                param.help = f"{param.help or ''} (default: {shown})".strip()
            _show_type(param, None)
            param.show_default = False
            continue
        if param.metavar is None:
            bare = param.bare_type() if hasattr(param, "bare_type") else \
                getattr(getattr(param, "type", None), "name", "text")
            param.metavar = {"int": "INTEGER", "integer": "INTEGER",
                             "float": "FLOAT"}.get(bare, "TEXT")
            if param.param_type_name == "argument":
                param.metavar = param.name.upper()
        if param.param_type_name == "argument" and hasattr(param, "_usage_display_name"):
            param._usage_display_name = (lambda p: lambda: (
                (p.display_name_raw if p.required else f"[{p.display_name_raw}]")
                + ("..." if p.nargs != 1 and p.metavar is None else "")))(param)
        # arguments show their metavar as their name: no type column for them
        _show_type(param, None if param.param_type_name == "argument" else param.metavar)
        if getattr(param, "show_default", None) is not False and param.param_type_name == "option":
            default = param.default
            if default not in (None, (), []) and "(default" not in (param.help or ""):
                param.help = f"{param.help or ''} (default: {default})".strip()
            param.show_default = False
    if (cmd.context_settings or {}).get("allow_extra_args"):
        orig = cmd.collect_usage_pieces

        def pieces(ctx, _orig=orig):
            return [*_orig(ctx), "-- COMMAND [ARGS]..."]

        cmd.collect_usage_pieces = pieces
        cmd.options_metavar = "[OPTIONS]"
    for sub in getattr(cmd, "commands", {}).values():
        _polish(sub)


def command():
    """The click command behind ``numvar`` (typer app, polished for --help)."""
    cmd = typer.main.get_command(app)
    _polish(cmd)
    return cmd


def main(argv: list[str] | None = None) -> int:
    """Entry point: numvar's own errors print as one clean line and exit 2."""
    try:
        rv = command().main(args=argv, prog_name="numvar", standalone_mode=False)
    except NumvarError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.secho("aborted", err=True)
        return 130
    except _click_exceptions() as exc:  # usage errors: bad option, missing argument
        exc.show()
        return exc.exit_code
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
