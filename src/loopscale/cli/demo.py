"""`loopscale demo`: the iso-depth study on the embedded default, end to end."""

from __future__ import annotations

from pathlib import Path

import typer

from loopscale.cli.app import app


@app.command()
def demo(
    out: Path = typer.Option(Path("demo"), "--out", "-o", help="Output dir (sweep, runs.csv, fit.json, report/)."),
    quick: bool = typer.Option(False, "--quick", help="20 tiny runs, ~2 min: for CI and first contact."),
    preset: str = typer.Option(
        "demo", "--preset", help="demo (~11 min on 2 cores), study (~80 min) or quick (= --quick)."
    ),
    bootstrap: int | None = typer.Option(None, help="Bootstrap resamples (default 200)."),
    lr_draws: int | None = typer.Option(
        None,
        "--lr-draws",
        help="Wild-bootstrap tables of φ's interval and tests "
        "(default 2000; fewer: a rougher critical value, docs/fit.md).",
    ),
    eval_limit: int = typer.Option(100, "--eval-limit", min=1, help="Items per task in the five-axis evaluation."),
    slots: int | None = typer.Option(None, "--slots", min=1, help="Runs trained at once (default: one per core)."),
    no_progress: bool = typer.Option(False, "--no-progress"),
) -> None:
    """Sweep r in {1,2,4,8} over budgets and widths, fit phi with its interval and tests, evaluate five axes, report.

    Rerun the same command to resume: finished runs are skipped.
    """
    from loopscale.cores import check_slots
    from loopscale.demo import run_demo

    check_slots(slots)
    run_demo(
        out,
        preset="quick" if quick else preset,
        bootstrap=bootstrap,
        lr_draws=lr_draws,
        eval_limit=eval_limit,
        progress=not no_progress,
        slots=slots,
    )
