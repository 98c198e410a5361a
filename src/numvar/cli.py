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
    unit = "bits" if basis == 2 else "digits"
    table = Table(title=f"significant {unit} (median / min) and class flips, "
                        f"{res.images} test images")
    for col in ("mode", "logits", "probabilities", "loss", "flipped", "accuracy"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for row in res.summary():
        table.add_row(row["mode"].upper(),
                      *(f"{row[k + '_median']:.2f} / {row[k + '_min']:.2f}"
                        for k in ("logits", "probabilities", "loss")),
                      f"{row['flipped']} of {row['samples']}",
                      "—" if row["accuracy_mean"] is None else f"{100 * row['accuracy_mean']:.2f} %")
    Console().print(table)
    Console().print(f"report: [bold]{res.report.resolve()}[/bold]")


# ---------------------------------------------------------------- rounding demos


# ---------------------------------------------------------------- run (runner)


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
