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

    from .errors import ConfigError
    from .runner.script import resume_script, run_script

    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), console=console,
                   transient=False)
    state: dict = {"task": None, "failed": 0}

    def progress(event: str, payload) -> None:
        if event == "total":
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
        with bar:
            result = resume_script(resume, jobs=jobs, executor=executor, scheduler=scheduler,
                                   progress=progress)
    else:
        with bar:
            result = run_script(
                command or [], n=10 if n is None else n, mode=mode or "sr",
                granularity=granularity or "flop", precision=precision,
                seed=0 if seed is None else seed, jobs=jobs, out=out, capture=capture,
                capture_layers=capture_layers, files=files, exclude=exclude, include=include,
                executor=executor or "local", scheduler=scheduler, progress=progress)
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
