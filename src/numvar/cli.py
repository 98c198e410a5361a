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
@demo_app.command("harmonic")
def demo_harmonic(
    n: int = typer.Option(10_000_000, "--n", help="Number of terms 1/k."),
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
        raise ConfigError("--n and --samples must be >= 1")
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


@demo_app.command("rounding")
def demo_rounding(
    dtype: str = typer.Option("float32", "--dtype",
                              help="Target: float32, float64, bfloat16 or float16."),
    a: float = typer.Option(1.5, "--a", help="Grid point a; x = a + frac * ulp(a)."),
    frac: str = typer.Option("1/4", "--frac", help="Position of x between a and b, e.g. 1/4."),
    steps: int = typer.Option(16, "--steps", help="Length of the chain s += frac*ulp."),
    draws: int = typer.Option(100_000, "--draws", help="Realizations per mode (>= 2)."),
    seed: int = typer.Option(0, "--seed"),
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
