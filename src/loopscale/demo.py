"""`loopscale demo`: the paper's whole argument on a laptop — sweep, fit, five-axis eval, report.

Every stage reads and writes plain files under OUT, so the demo resumes where it stopped:
the sweep skips finished runs, the evaluation reuses its per-run cache, fit and report are
recomputed (seconds). ``--quick`` is a 16-run, ~3-minute version for CI and first contact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from loopscale.errors import LoopscaleError
from loopscale.numbers import phi_ci

if TYPE_CHECKING:
    from loopscale.report.context import ReportContext

PRESETS = {"quick": "quick", "demo": "demo", "study": "study"}
TEST_TIME_R: tuple[int, ...] = (1, 2, 4, 8, 16)
"""Recurrences the demo also runs its top-budget looped models with, so the report's test-time section has
points. Only those 2-3 models: at L_eff fixed, r_eval = 16 costs ~16/r times a training-r evaluation."""
BUSY_WAIT_S = 60.0  # a killed demo's workers checkpoint and let go of their runs within seconds


def run_demo(
    out: str | Path = "demo",
    *,
    preset: str = "demo",
    bootstrap: int | None = None,
    restarts: int | None = None,
    lr_draws: int | None = None,
    eval_limit: int | None = 100,
    progress: bool = True,
    console: Console | None = None,
    slots: int | None = None,
    test_time_r: tuple[int, ...] = TEST_TIME_R,
) -> dict[str, Any]:
    """Run (or resume) the demo in ``out``; returns the headline dict (also written to OUT/headline.json).

    ``slots``: runs trained at once (default: as many as the cores hold, the presets' runs use one thread).
    ``test_time_r``: the r_eval of the report's test-time section (``()``: none, the section says "not evaluated").
    """
    from loopscale.errors import ConfigError
    from loopscale.eval.runs import evaluate_path
    from loopscale.fit import fit_runs, prepare_fit, write_fit
    from loopscale.fit.prepare import CONTROLS_FROM_SPEC
    from loopscale.io import atomic_write_json
    from loopscale.report import write_report
    from loopscale.report.tables import axes_table
    from loopscale.sweep import SweepStore, holds_another_spec, load_spec, prepare, runs_table, write_table

    if preset not in PRESETS:
        raise ConfigError("--preset", f"expected one of {', '.join(PRESETS)}", value=preset)
    con = console or Console(stderr=True, markup=False)
    out = Path(out)
    t0 = time.time()
    spec = load_spec(PRESETS[preset])
    con.rule(_rich(f"[bold]1/4 sweep[/] ({preset}: {len(spec.runs())} runs) -> {escape(str(out / 'sweep'))}"))
    if holds_another_spec(spec, SweepStore(out / "sweep")):  # e.g. `demo --quick`, then `demo` into the same dir
        raise ConfigError(
            "--out",
            f"{out} holds a demo of another preset (or an edited one); give this one its own "
            f"folder, e.g. --out {out}-{preset}",
            value=str(out),
        )
    store = prepare(spec, out / "sweep")
    _sweep(spec, store, progress=progress, console=con, slots=slots)
    df, counts = runs_table(store)
    runs_csv, _ = write_table(df, out / "runs.csv")
    missing = ", ".join(f"{n} {status}" for status, n in counts.items())
    con.print(
        f"runs table: {runs_csv} ({len(df)} runs" + (f"; without a result: {missing})" if missing else ")"),
        highlight=False,
        markup=False,
    )

    con.rule(_rich("[bold]2/4 fit[/]"))
    # the sweep's own spec ([fit] table, its loop-of-one controls); None: the fit's defaults
    given = {"bootstrap": bootstrap, "restarts": restarts, "lr_draws": lr_draws}
    options: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    prepared = prepare_fit(runs_csv, spec=out / "sweep", r1_from=CONTROLS_FROM_SPEC, **options)
    table = prepared.table
    fit = fit_runs(table, prepared.settings, progress=lambda m: con.print(f"  {m}", highlight=False, markup=False))
    fit_path = write_fit(out / "fit.json", fit)

    con.rule(_rich("[bold]3/4 five-axis evaluation[/] (compute-optimal run per budget and r)"))
    if test_time_r:
        rs = ", ".join(map(str, test_time_r))
        con.print(
            f"  test-time recurrence: the top budget's looped runs also at r = {rs}", highlight=False, markup=False
        )
    reference = fit.reference
    test_time = _test_time_runs(table.df, reference) if test_time_r else _never
    ev = evaluate_path(
        out / "sweep",
        "world",
        out_dir=out,
        limit=eval_limit,
        r_values=test_time_r,
        r_values_where=test_time,
        on_run=lambda ref, i, n: con.print(
            f"  [{i + 1}/{n}] {ref.run_id}" + (" + test-time r" if test_time(ref) else ""),
            highlight=False,
            markup=False,
        ),
    )
    con.rule(_rich("[bold]4/4 report[/]"))
    report = write_report(  # one context, one headline record: the report's, with the demo's numbers added
        runs_csv,
        out / "report",
        fit=fit_path,
        axes=ev.axes_csv,
        headline_extra=lambda ctx: _demo_numbers(ctx, table, ev.summary, time.time() - t0),
    )
    atomic_write_json(out / "headline.json", report.headline)
    _print_headline(con, report.headline, axes_table(report.ctx))
    return report.headline


def _test_time_runs(runs: Any, variant: str) -> Callable[[Any], bool]:
    """Which evaluated runs also get the test-time r values: the looped runs of ``variant`` (the fit's reference, the
    recipe the report shows) at its largest budget, where the report draws its test-time figure."""
    mine = runs[runs["variant"].astype(str) == variant]
    top = float(mine["C"].max()) if len(mine) and mine["C"].notna().any() else None

    def chosen(ref: Any) -> bool:
        return (
            top is not None
            and ref.variant == variant
            and (ref.r or 1) > 1
            and ref.C is not None
            and math.isclose(float(ref.C), top, rel_tol=1e-3)
        )

    return chosen


def _never(_ref: Any) -> bool:
    return False


def _rich(markup: str) -> Text:
    """A styled rule title, whatever the console's markup setting (interpolations are escaped)."""
    return Text.from_markup(markup)


class DemoBusy(LoopscaleError):
    """Runs of the demo's sweep are held by another live process (exit status 3, as `sweep run`)."""

    exit_code = 3


def _sweep(spec: Any, store: Any, *, progress: bool, console: Console, slots: int | None) -> None:
    """Run the sweep; runs still held by a killed demo's slot workers (checkpointing) are waited for, once."""
    from loopscale.sweep import run_sweep
    from loopscale.sweep.local import busy_message

    summary = run_sweep(spec, store, progress=progress, console=console, slots=slots)
    busy = summary.outcomes.get("busy", [])
    t0 = time.time()
    while busy and any(store.live_lock(rid) for rid in busy) and time.time() - t0 < BUSY_WAIT_S:
        time.sleep(0.5)
    if busy:
        summary = run_sweep(spec, store, progress=progress, console=console, slots=slots)
        if summary.outcomes.get("busy"):
            raise DemoBusy(busy_message(store, summary.outcomes["busy"]))


def _demo_numbers(ctx: ReportContext, runs: Any, axes_summary: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """What the demo adds to the report's headline record (``report.build.headline_record``: the plain sentences,
    every variant's verdict with its quoted interval and method, every Δφ by its leading reading): R² against the
    restricted fits, the loss gap to r = 1 per cell, the axes, the wall time up to the report."""
    from loopscale.config.data import AXES

    v = ctx.variant_fit
    # loss gap to r = 1 at matched compute, from the best run per (C, r) cell (parabola vertices of
    # unbracketed cells extrapolate wildly; the report shows both)
    best = runs.df[runs.df["status"].fillna("ok") == "ok"].groupby(["C", "r"])["val_loss"].min()
    gaps: dict[str, dict[str, float]] = {}
    for (c, r), loss in best.items():
        if r != 1 and (c, 1) in best.index:
            gaps.setdefault(str(int(r)), {})[f"{c:.3g}"] = float(loss - best[(c, 1)])
    axes: dict[str, dict[int, list[float]]] = {}
    for row in axes_summary:
        if row.get("r_eval") != row.get("r"):
            continue  # test-time recurrence points are in the report, not the headline
        for axis in AXES:
            x = row.get(f"loss_{axis}")
            if x is not None:
                axes.setdefault(axis, {}).setdefault(int(row["r"]), []).append(float(x))
    return {
        "r2": v.metrics.r2,
        "restricted": {k: r.r2 for k, r in v.restricted.items()},
        "loss_gap_to_r1": gaps,
        "axes": {a: {r: sum(x) / len(x) for r, x in sorted(per.items())} for a, per in axes.items()},
        "wall_s": wall,
    }


def _phi_line(name: str, o: dict[str, Any]) -> str:
    """ "NAME: phi = x [lo, hi] (95%, profile likelihood) - verdict (reasons)", from a headline.json verdict."""
    est = "" if o.get("phi") is None else f"phi = {phi_ci(o['phi'], o.get('phi_ci'))}"
    if est and o.get("phi_ci") and o.get("ci_method"):
        est += f" ({o.get('ci_level') or 0.95:.0%}, {o['ci_method']})"
    line = f"  {name}: {est}" + (" - " if est else "")
    line += "resolved" if o.get("resolved") else str(o.get("verdict"))
    return line + (f" ({'; '.join(o['reasons'])})" if o.get("reasons") else "")


def _reference_name(h: dict[str, Any]) -> str:
    """The reference's name in the terminal, with which r = 1 runs its φ is read against."""
    from loopscale.fit.table import CONTROL_SEP

    ref = h.get("reference_variant")
    if not ref:
        return "paper design (plain r = 1)"
    if CONTROL_SEP in str(ref):
        return f"{ref} (r = 1: a loop of one)"
    return f"{ref} (paper design, plain r = 1)"


def _print_headline(con: Console, h: dict[str, Any], axes: Any = None) -> None:
    """The plain words first (``report.plain``, as in summary.md and index.html), then the numbers, and last the
    verdict: φ with its quoted interval and that interval's method, each control re-fit, each Δφ by its leading
    reading (``honesty.delta_phi_quote``) — the lines left on the screen when the demo ends."""
    con.rule(_rich("[bold]headline"))
    for line in h.get("plain") or []:
        con.print(line, highlight=False, markup=False)
        con.print()
    con.print(_rich("[bold]details"))
    if h.get("restricted") and h.get("r2") is not None:
        con.print(
            "  R2: free "
            + f"{h['r2']:.4f}"
            + "".join(f", {k} {v:.4f}" for k, v in h["restricted"].items() if v is not None),
            highlight=False,
            markup=False,
        )
    for r, per in (h.get("loss_gap_to_r1") or {}).items():
        con.print(
            f"  loss gap to r=1 at matched compute (best run per cell), r={r}: "
            + ", ".join(f"C={c}: {g:+.3f}" for c, g in per.items()),
            highlight=False,
            markup=False,
        )
    named = [(_reference_name(h), h), *(h.get("variants") or {}).items()]
    for name, o in named:  # what limits each fit, before the verdict (whose reasons say why not resolved)
        if o.get("caveats"):
            con.print(f"  what limits {name}:", highlight=False, markup=False)
            for c in o["caveats"]:
                con.print(f"    - {c}", highlight=False, markup=False)
    if axes is not None:
        con.print(rich_table(axes))
    con.rule(_rich("[bold]verdict"))
    if h.get("phi") is None:
        con.print("  paper design: no fit", highlight=False, markup=False)
    for name, o in named:
        if o is h and h.get("phi") is None:
            continue
        con.print(_phi_line(name, o), highlight=False, markup=False)
        for c in o.get("claims") or []:
            con.print(f"    {c}", highlight=False, markup=False)
    for d in h.get("delta_phi") or []:
        con.print(f"  {d['sentence']}", highlight=False, markup=False)
    con.print(f"report: {h['report']}  ({h['wall_s'] / 60:.1f} min)", highlight=False, markup=False)


def rich_table(t: Any) -> Any:
    """A report table (``report.tables.Table``) for the terminal: the same title, columns, rows and note."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    out = Table(
        title=Text(t.title),
        title_justify="left",
        caption=Text(t.note) if t.note else None,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for i, col in enumerate(t.columns):
        out.add_column(Text(col), justify="left" if i == 0 else "right")
    for row in t.rows:
        out.add_row(*map(Text, row))
    return out
