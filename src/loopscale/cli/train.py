"""`loopscale train`: one run from a config to a run dir (also under torchrun)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from loopscale.cli.app import app, console
from loopscale.errors import LoopscaleError

if TYPE_CHECKING:
    from loopscale.record import RunRecord


class RunNotOk(LoopscaleError):
    """The run ended diverged (recorded in result.json): exit status 1, as a failed run."""

    exit_code = 1


@app.command()
def train(
    config: Path | None = typer.Argument(None, help=escape("TOML/YAML with [model] [data] [optim] [run] tables.")),
    set_: list[str] = typer.Option([], "--set", help="Dotted override, e.g. --set optim.matrix_lr=0.02"),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Run dir. Default: runs/r<r>-d<d>-s<seed>-<hash> "
        "(e.g. runs/r4-d64-s0-1a2b3c4d; d the width, hash that of the resolved config, "
        "so another config never reuses it).",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Discard the run in --out (finished or not, of any config) and train afresh."
    ),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar (nor progress lines)."),
    progress_every: int | None = typer.Option(
        None,
        "--progress-every",
        min=1,
        help="Without a terminal (a log "
        "file, a batch job): a progress line every N steps (default: "
        "every 5% of the run).",
    ),
) -> None:
    """Train one looped model; rerunning the same command resumes an interrupted run."""
    import tomli_w

    from loopscale.train import load_train_config
    from loopscale.train.loop import train as run_training
    from loopscale.train.rundir import default_run_dir
    from loopscale.train.settings import config_source, describe_length

    cfg = load_train_config(config, set_)
    if print_config:
        console.print(tomli_w.dumps(cfg.as_toml_dict()), markup=False, highlight=False)
        length = describe_length(cfg)
        console.print(
            f"# {length['steps']} steps, {length['tokens']:.4g} tokens, {length['flops']:.4g} FLOPs, "
            f"{length['tokens_per_param']:.1f} tokens/param",
            markup=False,
            highlight=False,
        )
        return
    run_dir = Path(out or default_run_dir(cfg))
    res = _train_locked(
        run_training,
        cfg,
        run_dir,
        progress=not no_progress,
        overwrite=overwrite,
        source=config_source(config, set_),
        progress_every=progress_every,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        vl = res.val_loss
        console.print(
            f"{run_dir}: status {res.status}, val loss {vl:.4f} nats/token"
            if vl is not None
            else f"{run_dir}: status {res.status} ({res.error or ''})",
            highlight=False,
        )
        console.print(
            f"  {res.steps} steps, {res.D or 0:.4g} tokens, {res.flops or 0:.4g} FLOPs, {res.wall_s or 0:.1f} s",
            highlight=False,
        )
    if res.status != "ok":
        raise RunNotOk(f"{run_dir}: the run {res.status} ({res.error or ''}); recorded in {run_dir / 'result.json'}")


def _train_locked(run_training: Any, cfg: Any, run_dir: Path, **kw: Any) -> RunRecord:
    """Train holding the run dir's lock (``loopscale.locks``, the sweeps' own): a second `loopscale train`, or
    one into a run a sweep is training, is refused instead of training the same steps twice. Under torchrun
    rank 0 holds it for every rank."""
    from loopscale import locks
    from loopscale.train.rundir import check_out_path

    if int(os.environ.get("RANK", "0")) != 0:
        return run_training(cfg, run_dir, **kw)
    check_out_path(run_dir)
    created = not run_dir.exists()
    try:
        with locks.held(run_dir, field="--out", doing="a second training", executor="loopscale train"):
            return run_training(cfg, run_dir, **kw)
    finally:
        if created:  # a run refused before it wrote anything leaves no run dir behind (only the lock made it)
            _remove_if_only_locks(run_dir)


def _remove_if_only_locks(run_dir: Path) -> None:
    import contextlib

    from loopscale import locks

    with contextlib.suppress(OSError):
        if {p.name for p in run_dir.iterdir()} <= {locks.TAKEOVER}:
            (run_dir / locks.TAKEOVER).unlink(missing_ok=True)
            run_dir.rmdir()
