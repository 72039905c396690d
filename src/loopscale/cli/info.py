"""`loopscale info`: layout, parameter split and FLOP accounting for one model or a whole grid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from loopscale import accounting, grids
from loopscale.cli.app import app, console
from loopscale.config import ModelConfig, apply_overrides, load_mapping, validate
from loopscale.numbers import count, flops


def _rows_for_grid(grid: str) -> list[accounting.Accounting]:
    if grid != "paper":
        from loopscale.errors import ConfigError

        raise ConfigError("--grid", "unknown grid; expected 'paper' (sweep specs: loopscale sweep plan)", value=grid)
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
        table.add_column(flops(c), justify="left")
    table.add_column("runs", justify="right")
    base = [" ".join(map(str, grids.PAPER_WIDTHS[c])) for c in grids.PAPER_BUDGETS]
    n_base = len(grids.paper_grid())
    table.add_row(
        "baseline", ",".join(map(str, grids.PAPER_R)), *base, f"{n_base} ({n_base // len(grids.PAPER_R)} per r)"
    )
    for probe, added in grids.PAPER_PROBE_WIDTHS.items():
        cells = ["+" + " +".join(map(str, added[c])) if c in added else "-" for c in grids.PAPER_BUDGETS]
        n = len(grids.probe_grid(probe))
        table.add_row(
            probe, ",".join(map(str, grids.PAPER_PROBE_R)), *cells, f"{n} ({n // len(grids.PAPER_PROBE_R)} per r)"
        )
    return table


def _train_config(data: dict[str, Any], budget: float | None, tokens_per_step: int | None, source: str) -> Any:
    """The run a config (plus --budget / --tokens-per-step) describes, for its learning rates."""
    from loopscale.train.settings import train_config_from_dict

    tables = {k: dict(v) for k, v in data.items() if k in ("model", "data", "optim", "run") and isinstance(v, dict)}
    run = tables.setdefault("run", {})
    if budget is not None:
        for key in ("tokens", "steps"):
            run.pop(key, None)
        run["budget"] = budget
    if tokens_per_step is not None or "batch_size" not in run:
        seq_len = int(tables["model"].get("seq_len", 2048))
        run["batch_size"] = max(1, (tokens_per_step or grids.PAPER_TOKENS_PER_STEP) // seq_len)
    run.setdefault("min_steps", 1)
    return train_config_from_dict(tables, source)


TABLES = ("model", "data", "optim", "run")


def config_run(config: Path, set_: list[str], budget: float | None, tokens_per_step: int | None) -> Any:
    """The TrainConfig `loopscale train CONFIG --set ...` resolves (``train_config_from_dict``, its defaults),
    with --budget replacing the run's length and --tokens-per-step its batch; a bare [model] table is allowed."""
    from loopscale.train.settings import config_source, train_config_from_dict

    data = load_mapping(config)
    if not set(data) & set(TABLES) and set(data) <= set(ModelConfig.model_fields):
        data = {"model": data}
    extra = []
    if budget is not None:
        extra += ["run.steps=null", "run.tokens=null", f"run.budget={budget!r}"]
    source = config_source(config, set_)
    tcfg = train_config_from_dict(apply_overrides(data, [*set_, *extra]), source)
    if tokens_per_step is not None:
        extra.append(f"run.batch_size={max(1, tokens_per_step // tcfg.model.seq_len)}")
        tcfg = train_config_from_dict(apply_overrides(data, [*set_, *extra]), source)
    return tcfg


def _lr_fields(tcfg: Any) -> dict[str, Any]:
    """Peak lr per group and the transfer rules' inputs, as the trainer will resolve them."""
    from loopscale.optim.transfer import tokens_ref, transfer_factors

    m = tcfg.model
    f = transfer_factors(
        tcfg.optim, d_model=m.width, tokens_per_step=tcfg.tokens_per_step, total_tokens=tcfg.lr_tokens(), r=m.r
    )
    return {
        "lrs": tcfg.lrs(),
        "lr_factors": f,
        "lr_tokens": tcfg.lr_tokens(),
        "D_ref": tokens_ref(tcfg.optim, m.r),
        "tokens_per_step": tcfg.tokens_per_step,
        "steps": tcfg.total_steps(),
    }


def _lr_table(fields: dict[str, Any], optim: Any) -> Table:
    f = fields["lr_factors"]
    table = Table(
        title="learning rates: peak per optimiser group (docs/optim.md)",
        caption=f"B = {fields['tokens_per_step']:,} tokens/step, D = {fields['lr_tokens']:.6g}, "
        f"D_ref = {fields['D_ref']:.6g}; {fields['steps']:,} steps, {optim.schedule} to "
        f"{optim.final_lr_frac:g} x peak",
    )
    for c in ("group", "lr", "x width", "x batch", "x data", "x lr_scale"):
        table.add_column(c, justify="left" if c == "group" else "right")
    batch_scaled = ("matrix", "embed", "head")
    for group, lr in fields["lrs"].items():
        adamw = group != "matrix" or optim.name == "adamw"
        table.add_row(
            group,
            f"{lr:.6g}",
            f"{f['width']:.4g}" if adamw else "-",
            f"{f['batch']:.4g}" if group in batch_scaled else "-",
            f"{f['data']:.4g}" if group == "matrix" else "-",
            f"{optim.lr_scale:g}",
        )
    return table


@app.command()
def info(
    config: Path | None = typer.Argument(None, help=escape("Training config or [model] table (default: paper s=10).")),
    set_: list[str] = typer.Option([], "--set", help="Override, e.g. --set model.r=4 --set model.s=6"),
    grid: str | None = typer.Option(None, "--grid", help="Whole grid: 'paper' (116 runs, and the probes' widths)."),
    budget: float | None = typer.Option(None, "--budget", "-C", help="FLOP budget C for tokens D = C/F."),
    tokens_per_step: int | None = typer.Option(
        None, help="Global batch in tokens (default: the config's run.batch_size x seq_len, else 2^18)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Print the layout, N_once / N_rec / N_emb, FLOPs per token, tokens for a budget and the run's learning rates.

    The learning rates (per optimiser group, after the paper's width / batch / data transfer rules) are shown
    whenever the run's length is known: run.budget, run.tokens or run.steps in CONFIG, or --budget.
    """
    lr_fields: dict[str, Any] | None = None
    lr_rows: list[dict[str, Any] | None]
    tcfg = None
    if grid:
        rows = _rows_for_grid(grid)
        lr_rows = [
            _lr_fields(
                _train_config(
                    {"model": grids.paper_model(a.d_model // 64, a.r)}, a.budget, tokens_per_step, "--grid paper"
                )
            )
            for a in rows
        ]
    elif config is not None:  # the run `loopscale train CONFIG` would train: the same loader, the same defaults
        tcfg = config_run(config, set_, budget, tokens_per_step)
        cfg = tcfg.model
        lr_fields = _lr_fields(tcfg)
        from loopscale.train.settings import describe_length

        compute = tcfg.run.budget or describe_length(tcfg)["flops"]  # a steps / tokens run: its FLOPs
        rows = [accounting.account(cfg, budget=compute, tokens_per_step=tcfg.tokens_per_step)]
        lr_rows = [lr_fields]
    else:
        data: dict = apply_overrides({"model": {**grids.PAPER_MODEL, "s": 10}}, set_)
        if not isinstance(data["model"], dict):
            from loopscale.errors import ConfigError

            raise ConfigError("model", "expected a table (--set model.KEY=VALUE)", value=data["model"], source="--set")
        cfg = validate(ModelConfig, data["model"], source="--set", prefix="model")
        run: dict[str, Any] = data["run"] if isinstance(data.get("run"), dict) else {}
        if budget is not None or any(k in run for k in ("budget", "tokens", "steps")):
            from loopscale.train.settings import DEFAULT_MODEL

            # the model validated above, whole: the trainer's own defaults (DEFAULT_MODEL, r = 4) must not
            # fill what ModelConfig's defaults already decided, or the lr line describes another run
            model = {**{k: getattr(cfg, k) for k in DEFAULT_MODEL if k != "d_model"}, **data["model"]}
            tcfg = _train_config({**data, "model": model}, budget, tokens_per_step, "--set")
            lr_fields = _lr_fields(tcfg)
            cfg = tcfg.model
        tps = lr_fields["tokens_per_step"] if lr_fields else (tokens_per_step or grids.PAPER_TOKENS_PER_STEP)
        rows = [accounting.account(cfg, budget=budget or (tcfg.run.budget if tcfg else None), tokens_per_step=tps)]
        lr_rows = [lr_fields]
    if as_json:
        console.print_json(json.dumps([{**r.as_dict(), **(lr or {})} for r, lr in zip(rows, lr_rows, strict=True)]))
        return
    table = Table(title=f"loopscale accounting{' - paper grid, ' + str(len(rows)) + ' runs' if grid else ''}")
    cols = [
        "C",
        "d",
        "r",
        "layout",
        "N_once",
        "N_rec",
        "N (Table 6)",
        "N_emb",
        "F/token",
        "attn",
        "D",
        "D/N",
        "steps",
    ] + (["lr matrix", "lr embed"] if grid else [])
    for c in cols:
        table.add_column(c, justify="right")
    for a, lr in zip(rows, lr_rows, strict=True):
        table.add_row(
            flops(a.budget) if a.budget else "-",
            str(a.d_model),
            str(a.r),
            a.layout,
            count(a.N_once),
            count(a.N_rec),
            count(a.N_unique + a.N_norm),
            count(a.N_emb),
            f"{a.flops_per_token:.4g}",
            f"{a.attention_share:.0%}",
            count(a.tokens) if a.tokens else "-",
            f"{a.tokens_per_param:.1f}" if a.tokens_per_param else "-",
            str(a.steps) if a.steps is not None else "-",
            *([f"{lr['lrs']['matrix']:.4g}", f"{lr['lrs']['embed']:.4g}"] if grid and lr else []),
        )
    console.print(table)
    if tcfg is not None and lr_fields is not None:
        console.print(_lr_table(lr_fields, tcfg.optim))
    if grid:
        console.print(_probe_table())
