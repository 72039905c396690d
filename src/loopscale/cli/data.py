"""`loopscale data describe`: what a data config yields (documents, tokens, shares, entropy)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from loopscale.cli.app import app, console
from loopscale.config import apply_overrides, load_mapping, validate

data_app = typer.Typer(help="The training data: the embedded default mixture and its task world.", no_args_is_help=True)
app.add_typer(data_app, name="data")


def _load(config: Path | None, set_: list[str]):
    from loopscale.config.data import DataConfig

    data: dict = {"data": {}}
    if config is not None:
        loaded = load_mapping(config)
        if "data" in loaded:
            data = {"data": loaded["data"]}
        elif set(loaded) <= set(DataConfig.model_fields):  # a bare data table
            data = {"data": loaded}
        else:  # a full config without [data]: the defaults
            data = {"data": {}}
    data = apply_overrides(data, set_)
    src = str(config) if config else "--set"
    return validate(DataConfig, data.get("data", {}), source=src, prefix="data")


@data_app.command("describe")
def describe(
    config: Path | None = typer.Argument(None, help=escape("TOML/YAML with a [data] table (default: built-in).")),
    set_: list[str] = typer.Option([], "--set", help="Override, e.g. --set data.world_share=0.3"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Build the data a config describes and print its documents, tokens, shares and entropy."""
    cfg = _load(config, set_)
    if cfg.source != "default":
        from loopscale.errors import ConfigError

        raise ConfigError(
            "data.source", "describe covers the embedded mixture ('default') only so far", value=cfg.source
        )
    from loopscale.data.mixture import build_default

    t0 = time.perf_counter()
    built = build_default(cfg)
    stats = built.describe()
    stats["build_s"] = round(time.perf_counter() - t0, 3)
    if as_json:
        console.print_json(json.dumps(stats))
        return
    tr, va = stats["train"], stats["val"]
    console.print(
        f"[bold]data[/] source={escape(str(stats['source']))} seed={stats['seed']}; "
        f"real text: {escape(str(stats['real_text']))}",
        markup=True,
    )
    console.print(
        f"tokenizer: {stats['tokenizer']}, vocab {stats['vocab_size']}; "
        f"unigram entropy of training tokens {tr['unigram_entropy_nats']:.3f} nats "
        f"({tr['unigram_entropy_bits']:.3f} bits); built in {stats['build_s']:.2f} s"
    )
    table = Table(title="streams")
    for c in ("split", "documents", "real docs", "world docs", "bytes", "tokens", "world share"):
        table.add_column(c, justify="right")
    for name, s in (("train", tr), ("val", va)):
        table.add_row(
            name,
            f"{s['documents']:,}",
            f"{s['real_documents']:,}",
            f"{s['world_documents']:,}",
            f"{s['bytes']:,}",
            f"{s['tokens']:,}",
            f"{s['world_share']:.1%}",
        )
    console.print(table)
    fam = Table(title="training mixture by family")
    for c in ("family", "documents", "bytes", "share"):
        fam.add_column(c, justify="right")
    for f, s in tr["families"].items():
        fam.add_row(f, f"{s['documents']:,}", f"{s['bytes']:,}", f"{s['share']:.1%}")
    console.print(fam)
    ev = Table(
        title=f"evaluation items ({stats['entities']['seen']} people in training, {stats['entities']['unseen']} unseen)"
    )
    for c in ("task", "axis", "items", "note"):
        ev.add_column(c, justify="right")
    for t, s in stats["eval"].items():
        ev.add_row(t, s["axis"], str(s["items"]), "control (not scored)" if s["control"] else "")
    console.print(ev)
