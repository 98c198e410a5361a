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
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@determinism_app.command("record", context_settings=_PASSTHROUGH)
def determinism_record(
    ctx: typer.Context,
    out: str = typer.Option(..., "--out", "-o", help="Folder for the recording (hashes.json)."),
    stacks: bool = typer.Option(True, "--stacks/--no-stacks",
                                help="Store each op's user stack (ops run in backward: "
                                     "the forward call, via autograd anomaly mode)."),
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
    input_bound: float = typer.Option(None, "--input-bound",
                                      help="A-priori bound A on |input| (default: 1 for "
                                           "generated inputs, max|x| for --input)."),
    run: str = typer.Option(None, "--run", help="Run directory: adds the SR std per layer."),
    plot: str = typer.Option(None, "--plot", help="Write log10 of the curves vs depth (PNG)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated sample input."),
) -> None:
    """Worst-case rounding-error bounds per layer (a-priori and data-dependent) against
    the measured error |computed - float64| and, with --run, the SR std."""
    import json

    import torch
    from rich.console import Console
    from rich.table import Table

    from . import _spec
    from .bounds import get_precision, network_bounds
    from .errors import ConfigError

    if fmt not in ("table", "json"):
        raise ConfigError(f"--format {fmt!r}: expected table or json")
    if precision not in ("fp32", "bf16-mixed"):
        raise ConfigError(f"--precision {precision!r}: expected fp32 or bf16-mixed")
    get_precision(precision)
    if input_file is not None:
        x = _spec.load_input(input_file)
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
    model = _spec.load_object(spec)()
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    result = network_bounds(model, x, precision=precision, input_bound=input_bound, run=run)
    if plot:
        result.plot(plot)
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
