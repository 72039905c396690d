"""`loopscale sample`: what a trained model writes after a prompt, at any test-time r (docs/eval.md, "Sampling")."""

from __future__ import annotations

from pathlib import Path

import typer

from loopscale.cli.app import app, console
from loopscale.console import printable


@app.command("sample")
def sample(
    run: Path = typer.Argument(..., help="A finished run dir (or its model.safetensors)."),
    prompt: str = typer.Option("", "--prompt", "-p", help="Text the model continues (after BOS, as in training)."),
    r: int | None = typer.Option(None, "--r", min=1, help="Test-time recurrences (default: the training r)."),
    temperature: float = typer.Option(0.8, "--temperature", "-t", min=0.0, help="0: greedy decoding."),
    top_k: int | None = typer.Option(None, "--top-k", min=1, help="Sample among the k likeliest tokens."),
    max_tokens: int = typer.Option(200, "--max-tokens", "-n", min=1, help="New tokens at most (BOS ends earlier)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling generator: the same text every time."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
) -> None:
    """Continue a prompt with the looped KV cache; the text stops at the first BOS (a document's end)."""
    import torch

    from loopscale.eval.runs import resolve_device, tokenizer_for
    from loopscale.train.checkpoint import load_model

    model, cfg = load_model(run, device=resolve_device(device))
    tok = tokenizer_for(cfg)
    dev = next(model.parameters()).device
    idx = torch.tensor([[tok.bos_id, *tok.encode(prompt)]], device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = model.generate(idx, max_tokens, r=r, stop=tok.bos_id, temperature=temperature, top_k=top_k, generator=gen)
    console.print(printable(prompt + tok.decode(out[0].tolist())), highlight=False, soft_wrap=True)
