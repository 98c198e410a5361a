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


# ---------------------------------------------------------------- report / compare (analysis)


# ---------------------------------------------------------------- determinism
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@determinism_app.command("record", context_settings=_PASSTHROUGH)
def determinism_record(
    ctx: typer.Context,
    out: str = typer.Option(..., "--out", "-o", help="Folder for the recording (hashes.json)."),
    stacks: bool = typer.Option(True, "--stacks/--no-stacks",
                                help="Store each op's user stack (for reports)."),
) -> None:
    """Record a script's op hashes as a reference (usage: record -o DIR -- COMMAND).

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
    reference: str = typer.Argument(..., help="A folder written by `numvar determinism record`."),
) -> None:
    """Check a script's run against a recording, op by op (usage: check REF -- COMMAND).

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
