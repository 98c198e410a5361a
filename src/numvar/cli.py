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
                            "series, the rounding diagnostic.")
app.add_typer(demo_app, name="demo")
determinism_app = typer.Typer(help="Bitwise determinism: record a reference run, check a run against it.",
                              no_args_is_help=True)
app.add_typer(determinism_app, name="determinism")


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log diagnostics (INFO level)."),
) -> None:
    import logging

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


# ---------------------------------------------------------------- demo (workloads)
@demo_app.callback(invoke_without_command=True)
def demo(ctx: typer.Context) -> None:
    """Without a subcommand: the digits demo (train or load the bundled CNN, SR and UD
    realizations, HTML report)."""
    if ctx.invoked_subcommand is not None:
        return
    raise NumvarError("the digits demo is not available yet")


# ---------------------------------------------------------------- rounding demos


# ---------------------------------------------------------------- run (runner)
@app.command("run")
def run(
    command: list[str] = typer.Argument(
        None, metavar="-- python SCRIPT.py [ARGS] | -- -m MODULE [ARGS]",
        help="The script to run, after `--`, exactly as you would run it."),
    n: int = typer.Option(None, "-n", "--n", help="Number of realizations (default: 10)."),
    mode: str = typer.Option(None, "--mode", help="ieee | sr | ud | random (default: sr)."),
    granularity: str = typer.Option(None, "--granularity", help="flop | op (default: flop)."),
    precision: int = typer.Option(None, "--precision",
                                  help="Virtual precision in significand bits."),
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
    executor: str = typer.Option(None, "--executor", help="local | dask (default: local)."),
    scheduler: str = typer.Option(None, "--scheduler",
                                  help="Dask scheduler address (tcp://host:8786); without "
                                       "it --executor dask starts a LocalCluster."),
    resume: str = typer.Option(None, "--resume", metavar="RUN_DIR",
                               help="Complete an interrupted run: only what is missing runs."),
) -> None:
    """Run an unmodified script N times under random rounding, after one IEEE reference.

    Each realization is a fresh `python -m numvar.exec` process, instrumented before
    the script starts; results are stored atomically in the run directory.
    Example: numvar run -n 10 --jobs 2 --out runs/mnist -- python infer.py --batch 64
    """
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from functools import partial

    from .errors import ConfigError
    from .runner.script import resume_script, run_script

    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), console=console,
                   transient=False)
    state: dict = {"task": None, "failed": 0}

    def progress(event: str, payload) -> None:
        if event == "store":
            state["path"] = payload
        elif event == "total":
            state["task"] = bar.add_task("realizations", total=payload, failed=0)
        elif event == "done":
            state["failed"] += payload["status"] != "ok"
            bar.update(state["task"], advance=1, failed=state["failed"])

    if resume is not None:
        given = {"-n": n, "--mode": mode, "--granularity": granularity, "--precision": precision,
                 "--seed": seed, "--out": out, "--capture": capture,
                 "--capture-layers": capture_layers, "--files": files, "--exclude": exclude,
                 "--include": include, "script": command}
        extra = [k for k, v in given.items() if v not in (None, [], ())]
        if extra:
            raise ConfigError(f"--resume takes its configuration from {resume}/manifest.json; "
                              f"drop {', '.join(extra)} (only --jobs, --executor and "
                              f"--scheduler may change)")
        call = partial(resume_script, resume, jobs=jobs, executor=executor,
                       scheduler=scheduler, progress=progress)
    else:
        call = partial(
                run_script, command or [], n=10 if n is None else n, mode=mode or "sr",
                granularity=granularity or "flop", precision=precision,
                seed=0 if seed is None else seed, jobs=jobs, out=out, capture=capture,
                capture_layers=capture_layers, files=files, exclude=exclude, include=include,
                executor=executor or "local", scheduler=scheduler, progress=progress)
    try:
        with bar:
            result = call()
    except KeyboardInterrupt:
        where = state.get("path")
        console.print("interrupted: what finished is stored"
                      + (f"; complete it with numvar run --resume {where}" if where else ""),
                      soft_wrap=True)
        raise typer.Exit(130)
    m = result.store.manifest
    ok = sum(r["status"] == "ok" for r in m["realizations"])
    console.print(f"{ok} of {len(m['realizations'])} realizations stored in "
                  f"[bold]{result.path}[/] ({len(m['captures'])} captures, "
                  f"{result.wall_s:.1f} s); next: numvar report {result.path}", soft_wrap=True)
    if result.failed:
        from .runner.engine import failure_summary

        console.print(failure_summary(result.failed, result.total), style="red",
                      markup=False, highlight=False, soft_wrap=True)
        console.print(f"logs: {result.path / 'logs'}; rerun the failed ones with "
                      f"numvar run --resume {result.path}", soft_wrap=True)
        raise typer.Exit(1)


# ---------------------------------------------------------------- report / compare (analysis)
_ANALYSIS_HELP = {
    "method": "Significant-digits method: cnh (Sohier et al.'s centred normality hypothesis) "
              "or general (no distribution assumed).",
    "basis": "Digits in base 2 (bits) or 10 (decimal digits).",
    "error": "relative (X/x - 1) or absolute (X - x) error.",
    "against": "reference (the IEEE run; the sample mean where none is stored) or mean.",
    "probability": "Probability p that the digits are significant.",
    "confidence": "Confidence level of that statement.",
}


def _analysis_options(method: str, basis: int, error: str, against: str, probability: float,
                      confidence: float) -> dict:
    from .errors import ConfigError

    if basis not in (2, 10):
        raise ConfigError(f"--basis must be 2 or 10, not {basis}")
    return {"method": method.lower(), "basis": basis, "error": error.lower(),
            "against": against.lower(), "probability": probability, "confidence": confidence}


@app.command("report")
def report(
    run_dir: str = typer.Argument(..., metavar="RUN", help="Run directory (runs/NAME)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or html."),
    output: str = typer.Option(None, "--output", "-o", help="Write to FILE (required for html)."),
    task: str = typer.Option("auto", "--task", help="auto (classification when a capture is "
                             "named like logits/probs), classification, segmentation, none."),
    scores: list[str] = typer.Option(None, "--scores", help="Score capture(s) to treat as "
                                     "decisions (default: names containing logits/probs)."),
    labels: str = typer.Option(None, "--labels", help="Capture holding the true labels "
                               "(default: one named labels or targets)."),
    method: str = typer.Option("cnh", "--method", help=_ANALYSIS_HELP["method"]),
    basis: int = typer.Option(2, "--basis", help=_ANALYSIS_HELP["basis"]),
    error: str = typer.Option("relative", "--error", help=_ANALYSIS_HELP["error"]),
    against: str = typer.Option("reference", "--against", help=_ANALYSIS_HELP["against"]),
    probability: float = typer.Option(0.95, "--probability", "-p", help=_ANALYSIS_HELP["probability"]),
    confidence: float = typer.Option(0.95, "--confidence", "-c", help=_ANALYSIS_HELP["confidence"]),
) -> None:
    """Analyse a run: mean, std, standard error and significant digits per capture; flips,
    accuracy and Dice for decisions; the per-layer curve; training bands."""
    import json

    from rich.console import Console

    from .analysis import analyze_run, render_html
    from .analysis.text import report_renderables
    from .errors import ConfigError

    if fmt not in ("table", "json", "html"):
        raise ConfigError(f"--format must be table, json or html, not {fmt!r}")
    if fmt == "html" and not output:
        raise ConfigError("--format html needs -o FILE")
    opts = _analysis_options(method, basis, error, against, probability, confidence)
    result = analyze_run(run_dir, task=task, scores=scores or None, labels=labels, **opts)
    if fmt == "json":
        text = json.dumps(result, indent=2, default=str) + "\n"
        if output:
            from ._io import atomic_write_text

            atomic_write_text(output, text)
        else:
            sys.stdout.write(text)
        return
    if fmt == "html":
        from .runner.store import load_run

        render_html(result, load_run(run_dir), output)
        Console(stderr=True).print(f"wrote {output}")
        return
    console = Console(record=bool(output))
    for r in report_renderables(result):
        console.print(r)
    if output:
        from ._io import atomic_write_text

        atomic_write_text(output, console.export_text())


@app.command("compare")
def compare_cmd(
    run_a: str = typer.Argument(..., metavar="RUN_A", help="First run directory."),
    run_b: str = typer.Argument(..., metavar="RUN_B", help="Second run directory."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or html."),
    output: str = typer.Option(None, "--output", "-o", help="Write to FILE (required for html)."),
    method: str = typer.Option("cnh", "--method", help=_ANALYSIS_HELP["method"]),
    basis: int = typer.Option(2, "--basis", help=_ANALYSIS_HELP["basis"]),
    error: str = typer.Option("relative", "--error", help=_ANALYSIS_HELP["error"]),
    against: str = typer.Option("reference", "--against", help=_ANALYSIS_HELP["against"]),
    probability: float = typer.Option(0.95, "--probability", "-p", help=_ANALYSIS_HELP["probability"]),
    confidence: float = typer.Option(0.95, "--confidence", "-c", help=_ANALYSIS_HELP["confidence"]),
) -> None:
    """Compare two runs (e.g. SR vs UD, flop vs op): significant digits side by side."""
    import json

    from rich.console import Console

    from .analysis import analyze_run, compare
    from .analysis.text import compare_renderables
    from .errors import ConfigError

    if fmt not in ("table", "json", "html"):
        raise ConfigError(f"--format must be table, json or html, not {fmt!r}")
    if fmt == "html" and not output:
        raise ConfigError("--format html needs -o FILE")
    opts = _analysis_options(method, basis, error, against, probability, confidence)
    cmp = compare(analyze_run(run_a, **opts), analyze_run(run_b, **opts))
    if fmt == "html":
        from .analysis import render_compare_html

        render_compare_html(cmp, output)
        Console(stderr=True).print(f"wrote {output}")
        return
    if fmt == "json":
        text = json.dumps(cmp, indent=2, default=str) + "\n"
        if output:
            from ._io import atomic_write_text

            atomic_write_text(output, text)
        else:
            sys.stdout.write(text)
        return
    console = Console(record=bool(output))
    for r in compare_renderables(cmp):
        console.print(r)
    if output:
        from ._io import atomic_write_text

        atomic_write_text(output, console.export_text())



# ---------------------------------------------------------------- determinism


# ---------------------------------------------------------------- bounds


# ---------------------------------------------------------------- locate


# ---------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    """Entry point: numvar's own errors print as one clean line and exit 2."""
    try:
        rv = app(args=argv, standalone_mode=False)
    except NumvarError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.secho("aborted", err=True)
        return 130
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
