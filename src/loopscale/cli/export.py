"""`loopscale export`: a finished run as a Hugging Face folder (docs/eval.md, "Hugging Face export")."""

from __future__ import annotations

from pathlib import Path

import typer

from loopscale.cli.app import app, console


@app.command("export")
def export(
    run: Path = typer.Argument(..., help="A finished run dir (or its model.safetensors)."),
    out: Path = typer.Argument(..., help="Output folder."),
    fmt: str = typer.Option(
        "hf",
        "--format",
        "-f",
        help="hf: config.json + model.safetensors + tokenizer + card, "
        "loadable with transformers (trust_remote_code=True).",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files of a non-empty OUT."),
) -> None:
    """Export a run for other tools: a Hugging Face folder (AutoModelForCausalLM, lm_eval --model hf)."""
    from loopscale.errors import ConfigError

    if fmt != "hf":
        raise ConfigError("--format", "expected hf", value=fmt)
    from loopscale.export import export_hf

    path = export_hf(run, out, overwrite=overwrite)
    console.print(
        f"{path}: load with AutoModelForCausalLM.from_pretrained({str(path)!r}, trust_remote_code=True)",
        highlight=False,
    )
    console.print(
        f"evaluate: lm_eval --model hf --model_args pretrained={path},trust_remote_code=True "
        "--tasks TASKS --device cpu",
        highlight=False,
    )
