"""`loopscale tokenizer train`: a byte-level BPE on local text, saved as tokenizer.json."""

from __future__ import annotations

from pathlib import Path

import typer

from loopscale.cli.app import app, console

tok_app = typer.Typer(help="Tokenizers: train a byte-level BPE on local text.", no_args_is_help=True)
app.add_typer(tok_app, name="tokenizer")


@tok_app.command("train")
def train_tokenizer(
    paths: list[str] = typer.Argument(None, help="Files or folders: .txt/.md, or .jsonl/.parquet with --source."),
    default: bool = typer.Option(
        False,
        "--default",
        help="Train on the embedded default mixture's training "
        "documents (plays + task world, data.seed 0) instead of PATHS.",
    ),
    vocab_size: int = typer.Option(1024, "--vocab-size", help="Including the 256 byte tokens and <|bos|>."),
    out: Path = typer.Option(Path("tokenizer.json"), "--out", "-o"),
    source: str = typer.Option("text", help="text | jsonl | parquet"),
    text_field: str = typer.Option("text", help="jsonl/parquet column with the text"),
) -> None:
    """Train a byte-level BPE (HuggingFace tokenizers) and write tokenizer.json for data.tokenizer."""
    from loopscale.data import sources
    from loopscale.data.hf_tokenizer import HFTokenizer, train_bpe
    from loopscale.errors import ConfigError

    if source not in ("text", "jsonl", "parquet"):
        raise ConfigError("--source", "expected text, jsonl or parquet", value=source)
    if default == bool(paths):
        raise ConfigError(
            "paths",
            "give files or folders, or --default (the embedded mixture): exactly one of the two",
            value=" ".join(paths or []),
        )
    if default:
        from loopscale.config.data import DataConfig
        from loopscale.data.mixture import build_default

        docs = list(build_default(DataConfig()).train_docs)
    else:
        files = sources.expand_paths(paths, sources.SUFFIXES[source], "paths")
        if source == "text":
            docs = sources.read_text_files(files)
        elif source == "jsonl":
            docs = sources.read_jsonl(files, text_field)
        else:
            docs = sources.read_parquet(files, text_field)
    if not any(d.strip() for d in docs):
        raise ConfigError("paths", "the files hold no text; nothing written", value=" ".join(paths or []))
    path = train_bpe(docs, vocab_size, out)
    tok = HFTokenizer(path)
    n_bytes = sum(len(d.encode()) for d in docs)
    n_tok = sum(len(tok.encode(d)) for d in docs[:2000])
    sample_bytes = sum(len(d.encode()) for d in docs[:2000])
    console.print(
        f"{path}: vocab {tok.vocab_size}, BOS {tok.bos_token!r} = {tok.bos_id}; "
        f"{len(docs)} documents, {n_bytes:,} bytes; {sample_bytes / max(n_tok, 1):.2f} bytes/token",
        highlight=False,
    )
    console.print(f"use it with: --set data.tokenizer={path} --set model.vocab_size={tok.vocab_size}", highlight=False)
