"""`loopscale eval`: five-axis downstream evaluation of one checkpoint or of a whole sweep (docs/eval.md).

Heavy imports (torch, pandas, loopscale.eval) stay inside the command function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from loopscale.cli.app import app, console, err_console

if TYPE_CHECKING:
    from loopscale.eval.runs import Evaluation

AXES = ("knowledge", "reading", "math", "reasoning", "symbolic")


def _ints(values: list[str], name: str) -> list[int]:
    from loopscale.errors import ConfigError

    out = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                try:
                    out.append(int(part))
                except ValueError:
                    raise ConfigError(name, "expected whole numbers, e.g. --r 1,2,4,8", value=part) from None
    return out


def _shots(values: list[str]) -> int | dict[str, int] | None:
    """``--shots 5`` (every task) or ``--shots triviaqa=5 --shots coqa=0`` (per task)."""
    from loopscale.errors import ConfigError

    if not values:
        return None
    if len(values) == 1 and "=" not in values[0]:
        return _ints(values, "--shots")[0]
    out: dict[str, int] = {}
    for v in values:
        name, sep, k = v.partition("=")
        if not sep:
            raise ConfigError("--shots", "give one number, or TASK=K for each task", value=v)
        out[name.strip()] = _ints([k], "--shots")[0]
    return out


def _f(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{float(x):.{digits}f}"


def _list_tasks() -> None:
    from loopscale.eval.tasks import GROUPS, REGISTRY

    table = Table(title="loopscale eval tasks")
    for c in ("task", "axis", "source", "shots", "accuracy", "about / file under --data-dir"):
        table.add_column(c)
    for t in REGISTRY.values():
        where = t.about + (f" [{t.benchmark.files[0]}]" if t.benchmark else "")
        table.add_row(t.name, t.axis + (" (control)" if t.control else ""), t.source, str(t.shots), t.accuracy, where)
    console.print(table)
    console.print("groups: " + "; ".join(f"{g} ({len(v)} tasks)" for g, v in GROUPS.items()))


def _print_run(out: Evaluation) -> None:
    ref = out.runs[0]
    results = out.results[ref.run_id]
    table = Table(
        title=f"{ref.run_id} - r = {ref.r}, d = {ref.d_model}, val_loss {_f(ref.val_loss)}; loss in nats per gold token"
    )
    table.add_column("axis")
    table.add_column("task")
    for res in results:
        table.add_column(f"loss r={res.r}", justify="right")
        table.add_column(f"acc r={res.r}", justify="right")
    axes = results[0].axes()
    for axis in [*axes, *sorted({t.axis for t in results[0].tasks} - set(axes))]:
        for t in [t for t in results[0].tasks if t.axis == axis]:
            cells = []
            for res in results:
                ts = res.task(t.task)
                cells += [_f(ts.loss), _f(ts.accuracy, 2)]
            table.add_row(axis, t.task + (" (control)" if t.control else ""), *cells)
        if axis in axes:
            cells = []
            for res in results:
                a = res.axes()[axis]
                cells += [_f(a["loss"]), _f(a["accuracy"], 2)]
            table.add_row(axis, "macro average", *cells, style="bold", end_section=True)
    cells = []
    for res in results:
        o = res.overall()
        cells += [_f(o["loss"]), _f(o["accuracy"], 2)]
    table.add_row("overall", "mean of axes", *cells, style="bold")
    console.print(table)
    gaps = [(res.r, res.knowledge_gap()) for res in results if res.knowledge_gap() is not None]
    if gaps:
        console.print(
            "knowledge gap (unseen - seen closed-book loss): " + ", ".join(f"r={r}: {g:+.3f}" for r, g in gaps),
            highlight=False,
        )


def _print_sweep(out: Evaluation) -> None:
    table = Table(title=f"loopscale eval - {len(out.runs)} runs, loss in nats/token (accuracy)")
    for c in ("variant", "C", "r", "d", "r_eval", "val_loss", *AXES, "overall", "gap"):
        table.add_column(c, justify="right")
    for s in out.summary:
        axes = [
            f"{_f(s.get(f'loss_{a}'))} ({_f(s.get(f'acc_{a}'), 2)})" if s.get(f"loss_{a}") is not None else "-"
            for a in AXES
        ]
        table.add_row(
            str(s["variant"]),
            f"{s['C']:.3g}" if s["C"] is not None else "-",
            str(s["r"]),
            str(s["d_model"]),
            str(s["r_eval"]),
            _f(s["val_loss"]),
            *axes,
            f"{_f(s['loss_overall'])} ({_f(s['acc_overall'], 2)})",
            _f(s["knowledge_gap"]),
        )
    console.print(table)


@app.command("eval")
def eval_(
    path: Path | None = typer.Argument(None, help="A run dir (or its model.safetensors), or a sweep dir."),
    tasks: str = typer.Option(
        "world",
        "--tasks",
        "-t",
        help="Tasks or groups, comma-separated: world, benchmarks, paper, all, or names (loopscale eval --list).",
    ),
    r: list[str] = typer.Option(
        [], "--r", help="Extra test-time recurrences, e.g. --r 1,2,4,8 (the training r is always evaluated)."
    ),
    all_runs: bool = typer.Option(False, "--all", help="Sweep: every finished run, not only the best per cell."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Folder with the real benchmark files."),
    shots: list[str] = typer.Option([], "--shots", help="Few-shot k: one number, or TASK=K (repeatable)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Evaluate the first N items of each task."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", min=1, help="Sequences per forward pass."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Folder for axes.csv / axes_summary.csv (default: PATH)."
    ),
    force: bool = typer.Option(False, "--force", help="Recompute, ignoring the per-run caches in <run>/eval/."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary rows as JSON."),
    list_tasks: bool = typer.Option(False, "--list", help="List the tasks and groups, then exit."),
) -> None:
    """Five-axis downstream evaluation: loss of the gold continuation (primary) and accuracy per task,
    macro-averaged per axis; a sweep dir gets its compute-optimal run per (C, r) evaluated."""
    if list_tasks:
        _list_tasks()
        return
    from loopscale.errors import ConfigError

    if path is None:
        raise ConfigError("PATH", "give a run dir or a sweep dir (or --list to see the tasks)")
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError("--device", "expected auto, cpu or cuda", value=device)
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from loopscale.eval.runs import evaluate_path

    r_values = _ints(r, "--r")
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    bars: dict[str, Any] = {}
    live = err_console.is_terminal  # bars on a terminal; plain lines in a log file or a pipe
    shown: dict[str, int] = {}

    def on_progress(name: str, done: int, total: int) -> None:
        if live:
            if name not in bars:
                bars[name] = progress.add_task(escape(name), total=total)  # the column renders markup
            progress.update(bars[name], completed=done, total=total)
            return
        tenth = max(1, total // 10)
        if done == total or done // tenth > shown.get(name, 0) // tenth:
            err_console.print(f"{name}: {done}/{total} sequences ({100 * done / max(total, 1):.0f}%)", highlight=False)
        shown[name] = done

    def log(msg: str) -> None:
        progress.console.print(msg, highlight=False)

    def on_run(ref: Any, i: int, n: int) -> None:
        if n > 1:
            c = f"{ref.C:.3g}" if ref.C is not None else "-"
            progress.console.print(
                f"[{i + 1}/{n}] {ref.run_id} (C={c}, r={ref.r}, d={ref.d_model})", highlight=False, markup=False
            )

    with progress:
        result = evaluate_path(
            path,
            tasks,
            r_values=r_values,
            all_runs=all_runs,
            out_dir=out,
            data_dir=data_dir,
            shots=_shots(shots),
            limit=limit,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            use_cache=not force,
            progress=on_progress,
            on_run=on_run,
            log=log,
        )
    for note in result.notes:
        err_console.print(f"note: {note}", highlight=False)
    if as_json:
        console.print_json(json.dumps(result.summary, default=str))
        return
    if len(result.runs) == 1:
        _print_run(result)
    else:
        _print_sweep(result)
    console.print(f"wrote {result.axes_csv} and {result.summary_csv}", highlight=False)
