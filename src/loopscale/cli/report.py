"""`loopscale report`: figures, an HTML page and a Markdown summary from runs (+ a fit file, + axes).

Heavy imports (matplotlib, loopscale.report, loopscale.fit) stay inside the command function.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from loopscale.cli.app import app, console, err_console
from loopscale.numbers import interval_method, phi_ci


@app.command()
def report(
    runs: Path = typer.Argument(..., help="Runs table (CSV/Parquet) or sweep dir (runs.csv or */result.json)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: index.html, summary.md, figures/."),
    fit_file: Path | None = typer.Option(None, "--fit", help="Fit file from `loopscale fit` (default: fit now)."),
    axes: Path | None = typer.Option(None, "--axes", help="Axes table (default: axes.csv in the sweep dir)."),
    bootstrap: int | None = typer.Option(None, "--bootstrap", "-b", help="Resamples if the report fits (200)."),
    restarts: int | None = typer.Option(None, "--restarts", help="Random starts if the report fits (500)."),
    lr_draws: int | None = typer.Option(
        None, "--lr-draws", help="Wild-bootstrap tables of φ's interval and tests if the report fits (2000)."
    ),
) -> None:
    """Write the report: iso-FLOP curves, frontier, parity, residuals, phi, equivalence, axes, test time."""
    from loopscale.errors import ConfigError
    from loopscale.report import make_report
    from loopscale.report.honesty import phi_verdict

    if fit_file is not None and (bootstrap is not None or restarts is not None or lr_draws is not None):
        raise ConfigError("--bootstrap", "only used when the report fits; drop it or drop --fit")
    with err_console.status("report") as status:
        index = make_report(
            runs,
            out,
            fit=fit_file,
            axes=axes,
            bootstrap=bootstrap,
            lr_draws=lr_draws,
            restarts=restarts,
            progress=lambda msg: status.update(escape(msg)),
        )
    from loopscale.fit import read_fit

    doc = read_fit(fit_file if fit_file is not None else out / "fit.json")
    v = phi_verdict(doc)
    colour = "green" if v.resolved else "bold red"
    console.print(f"[{colour}]{escape(v.label)}[/]", markup=True, highlight=False)
    if not v.resolved and v.phi is not None:
        console.print(f"  best estimate φ̂ = {phi_ci(v.phi, v.ci)}, for the record", highlight=False)
    if v.ci is not None:
        console.print(f"  interval: {v.ci_level:.0%}, {interval_method(v.method)}", highlight=False)
    for reason in v.reasons:
        console.print(f"  - {reason}", highlight=False)
    if fit_file is None:
        err_console.print(f"fit file: {out / 'fit.json'}")
    err_console.print(f"report: {index}  (summary.md, figures/*.png|svg|pdf beside it)")
