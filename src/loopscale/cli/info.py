"""`loopscale info`: layout, parameter split and FLOP accounting for one model or a whole grid."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from loopscale import accounting, grids
from loopscale.cli.app import app, console
from loopscale.config import ModelConfig, apply_overrides, load_mapping, validate


def _fmt_m(n: float) -> str:
    return f"{n / 1e6:,.1f}M" if n >= 1e5 else f"{n / 1e3:,.1f}k"


def _rows_for_grid(grid: str) -> list[accounting.Accounting]:
    if grid != "paper":
        from loopscale.errors import ConfigError

        raise ConfigError("--grid", "unknown grid; expected 'paper' (sweep specs: loopscale sweep plan)",
                          value=grid)
    out = []
    for c, s, r in grids.paper_grid():
        cfg = ModelConfig(**grids.paper_model(s, r))  # type: ignore[arg-type]  # r = 1: the paper's loop of one
        out.append(accounting.account(cfg, budget=c, tokens_per_step=grids.PAPER_TOKENS_PER_STEP))
    return out


def _probe_table() -> Table:
    """The paper's recipes: widths (s) per budget, with what each probe adds, and runs per recipe."""
    table = Table(title="paper recipes: widths s per budget (probes: looped runs, + = added; r = 1 runs shared)")
    table.add_column("recipe", justify="left")
    table.add_column("r", justify="left")
    for c in grids.PAPER_BUDGETS:
        table.add_column(f"{c:.3g}", justify="left")
    table.add_column("runs", justify="right")
    base = [" ".join(map(str, grids.PAPER_WIDTHS[c])) for c in grids.PAPER_BUDGETS]
    n_base = len(grids.paper_grid())
    table.add_row("baseline", ",".join(map(str, grids.PAPER_R)), *base,
                  f"{n_base} ({n_base // len(grids.PAPER_R)} per r)")
    for probe, added in grids.PAPER_PROBE_WIDTHS.items():
        cells = ["+" + " +".join(map(str, added[c])) if c in added else "-" for c in grids.PAPER_BUDGETS]
        n = len(grids.probe_grid(probe))
        table.add_row(probe, ",".join(map(str, grids.PAPER_PROBE_R)), *cells,
                      f"{n} ({n // len(grids.PAPER_PROBE_R)} per r)")
    return table


@app.command()
def info(
    config: Path | None = typer.Argument(None, help="TOML/YAML with a [model] table (default: paper s=10)."),
    set_: list[str] = typer.Option([], "--set", help="Override, e.g. --set model.r=4 --set model.s=6"),
    grid: str | None = typer.Option(None, "--grid", help="Whole grid: 'paper' (116 runs, and the probes' widths)."),
    budget: float | None = typer.Option(None, "--budget", "-C", help="FLOP budget C for tokens D = C/F."),
    tokens_per_step: int = typer.Option(grids.PAPER_TOKENS_PER_STEP, help="Global batch in tokens."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Print the layout, N_once / N_rec / N_emb, FLOPs per token and tokens for a budget."""
    if grid:
        rows = _rows_for_grid(grid)
    else:
        data: dict = {"model": {**grids.PAPER_MODEL, "s": 10}}
        if config is not None:
            loaded = load_mapping(config)
            data = {"model": loaded.get("model", loaded)}
        data = apply_overrides(data, set_)
        src = str(config) if config else "--set"
        cfg = validate(ModelConfig, data["model"], source=src, prefix="model")
        rows = [accounting.account(cfg, budget=budget, tokens_per_step=tokens_per_step)]
    if as_json:
        console.print_json(json.dumps([r.as_dict() for r in rows]))
        return
    table = Table(title=f"loopscale accounting{' - paper grid, ' + str(len(rows)) + ' runs' if grid else ''}")
    cols = ["C", "d", "r", "layout", "N_once", "N_rec", "N (Table 6)", "N_emb", "F/token", "attn",
            "D", "D/N", "steps"]
    for c in cols:
        table.add_column(c, justify="right")
    for a in rows:
        table.add_row(
            f"{a.budget:.3g}" if a.budget else "-",
            str(a.d_model), str(a.r), a.layout, _fmt_m(a.N_once), _fmt_m(a.N_rec),
            _fmt_m(a.N_unique + a.N_norm), _fmt_m(a.N_emb), f"{a.flops_per_token:.4g}",
            f"{a.attention_share:.0%}",
            f"{a.tokens / 1e9:.3g}B" if a.tokens else "-",
            f"{a.tokens_per_param:.1f}" if a.tokens_per_param else "-",
            str(a.steps) if a.steps is not None else "-",
        )
    console.print(table)
    if grid:
        console.print(_probe_table())
