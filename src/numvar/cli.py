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
