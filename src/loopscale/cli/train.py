"""`loopscale train`: one run from a config to a run dir (also under torchrun)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape

from loopscale.cli.app import app, console


@app.command()
def train(
    config: Path | None = typer.Argument(None, help=escape("TOML/YAML with [model] [data] [optim] [run] tables.")),
    set_: list[str] = typer.Option([], "--set", help="Dotted override, e.g. --set optim.matrix_lr=0.02"),
    out: Path | None = typer.Option(None, "--out", "-o", help="Run dir (default runs/<layout>-d<width>)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Train one looped model; rerunning the same command resumes an interrupted run."""
    import tomli_w

    from loopscale.train import load_train_config
    from loopscale.train.config import describe_length
    from loopscale.train.loop import train as run_training

    cfg = load_train_config(config, set_)
    if print_config:
        console.print(tomli_w.dumps(cfg.as_toml_dict()), markup=False, highlight=False)
        length = describe_length(cfg)
        console.print(f"# {length['steps']} steps, {length['tokens']:.4g} tokens, {length['flops']:.4g} FLOPs, "
                      f"{length['tokens_per_param']:.1f} tokens/param", markup=False, highlight=False)
        return
    run_dir = out or Path("runs") / f"r{cfg.model.r}-d{cfg.model.width}-s{cfg.run.seed}"
    res = run_training(cfg, run_dir, progress=not no_progress)
    if int(os.environ.get("RANK", "0")) == 0:
        vl = res.get("val_loss")
        console.print(
            f"{run_dir}: status {res['status']}, val loss {vl:.4f} nats/token" if vl is not None
            else f"{run_dir}: status {res['status']} ({res.get('error', '')})",
            highlight=False,
        )
        console.print(f"  {res['steps']} steps, {res['D']:.4g} tokens, {res['flops']:.4g} FLOPs, "
                      f"{res['wall_s']:.1f} s", highlight=False)
