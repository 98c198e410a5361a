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


# ---------------------------------------------------------------- bounds


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
    n: int = typer.Option(6, "-n", "--n", help="Realizations per evaluated set."),
    by: str = typer.Option("module", "--by", help="Blame 'module's (leaf modules) or 'op' kinds."),
    mode: str = typer.Option("sr", "--mode", help="Rounding mode: sr, ud, random, ieee."),
    granularity: str = typer.Option("flop", "--granularity", help="flop or op."),
    precision: int = typer.Option(None, "--precision", help="Virtual precision (significand bits)."),
    seed: int = typer.Option(0, "--seed", help="Seed of realization 0 (realization i: seed+i)."),
    threshold: float = typer.Option(None, "--threshold",
                                    help="Output digits to keep (default: halfway between the "
                                         "digits kept with everything perturbed and the cap)."),
    basis: int = typer.Option(2, "--basis", help="Digits in this basis (2: bits, 10: decimal)."),
    method: str = typer.Option("cnh", "--method", help="Significant digits method: cnh, general."),
    stat: str = typer.Option("median", "--stat", help="Output summary: median, mean, min."),
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
    """
    import torch
    from rich.console import Console

    from . import _spec
    from .errors import ConfigError
    from .locate import locate
    from .locate.report import html_page, renderables

    if (input_shape is None) == (input_file is None):
        raise ConfigError("give exactly one of --input-shape and --input")
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
