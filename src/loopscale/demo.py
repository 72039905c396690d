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
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from loopscale.errors import LoopscaleError
from loopscale.numbers import phi_ci

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
    from loopscale.report import make_report
    from loopscale.report.context import ReportContext
    from loopscale.report.inputs import load_inputs
    from loopscale.report.plain import plain_headline
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
    index = make_report(runs_csv, out / "report", fit=fit_path, axes=ev["axes_csv"])
    ctx = ReportContext.build(load_inputs(runs_csv, out / "report", fit=fit_path, axes=ev["axes_csv"]))
    headline = _headline(fit, table, ev, index, time.time() - t0)
    headline["plain"] = plain_headline(ctx)  # the same sentences as summary.md and index.html
    atomic_write_json(out / "headline.json", headline)
    _print_headline(con, headline, axes_table(ctx))
    return headline


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


def _headline(res: Any, runs: Any, ev: dict[str, Any], index: Path, wall: float) -> dict[str, Any]:
    """The numbers the demo prints (``res``: the FitResult): phi [CI] and its verdict, R2 vs restricted fits,
    delta phi, gaps, axes."""
    from loopscale.config.data import AXES
    from loopscale.fit.inference.verdict import verdicts

    ref = res.reference
    v = res.variant(ref)
    verdict = verdicts(res)[ref]
    # loss gap to r = 1 at matched compute, from the best run per (C, r) cell (parabola vertices of
    # unbracketed cells extrapolate wildly; the report shows both)
    best = runs.df[runs.df["status"].fillna("ok") == "ok"].groupby(["C", "r"])["val_loss"].min()
    gaps: dict[str, dict[str, float]] = {}
    for (c, r), loss in best.items():
        if r != 1 and (c, 1) in best.index:
            gaps.setdefault(str(int(r)), {})[f"{c:.3g}"] = float(loss - best[(c, 1)])
    axes: dict[str, dict[int, list[float]]] = {}
    for row in ev["summary"]:
        if row.get("r_eval") != row.get("r"):
            continue  # test-time recurrence points are in the report, not the headline
        for axis in AXES:
            x = row.get(f"loss_{axis}")
            if x is not None:
                axes.setdefault(axis, {}).setdefault(int(row["r"]), []).append(float(x))
    others = {}
    for name, o in verdicts(res).items():
        if name != ref:
            others[name] = {
                "phi": o.phi,
                "phi_ci": list(o.ci) if o.ci else None,
                "resolved": o.resolved,
                "verdict": o.label,
                "reasons": o.reasons,
                "caveats": o.caveats,
                "claims": o.claims,
                "inference": _brief(res.variant(name).inference),
            }
    return {
        "phi": verdict.phi,
        "phi_ci": list(verdict.ci) if verdict.ci else None,
        "resolved": verdict.resolved,
        "verdict": verdict.label,
        "reasons": verdict.reasons,
        "caveats": verdict.caveats,
        "claims": verdict.claims,
        "inference": _brief(v.inference),
        "r2": v.metrics.r2,
        "restricted": {k: r["r2"] for k, r in v.restricted.items()},
        "delta_phi": {d.variant: d.delta_phi for d in res.delta_phi},
        "delta_phi_inference": {d.variant: _brief(d.inference) for d in res.delta_phi if d.inference},
        "loss_gap_to_r1": gaps,
        "variants": others,
        "axes": {a: {r: sum(x) / len(x) for r, x in sorted(per.items())} for a, per in axes.items()},
        "report": str(index),
        "wall_s": wall,
    }


def _brief(inference: Any) -> dict[str, Any] | None:
    """The fit file's inference record without the profile's grid and the null draws (the numbers every
    sentence uses)."""
    if inference is None:
        return None
    out = {k: v for k, v in inference.items() if k != "profile"}
    if isinstance(out.get("null"), dict):
        out["null"] = {k: v for k, v in out["null"].items() if k != "stat"}
    return out


def _print_headline(con: Console, h: dict[str, Any], axes: Any = None) -> None:
    """The plain-words headline first (``report.plain``, as in summary.md and index.html), then the numbers."""
    con.rule(_rich("[bold]headline"))
    for line in h.get("plain") or []:
        con.print(line, highlight=False, markup=False)
        con.print()
    con.print(_rich("[bold]details"))
    ci = h.get("phi_ci")
    phi = h.get("phi")
    con.print(
        f"  paper design (plain r = 1): phi = {phi_ci(phi, ci)}" if phi is not None else "  paper design: no fit",
        highlight=False,
        markup=False,
    )
    con.print(
        f"    {h.get('verdict')}" + (f" ({'; '.join(h['reasons'])})" if h.get("reasons") else ""),
        highlight=False,
        markup=False,
    )
    for c in h.get("claims") or []:
        con.print(f"    {c}", highlight=False, markup=False)
    if h.get("caveats"):
        con.print(f"    {'; '.join(h['caveats'])}", highlight=False, markup=False)
    if h.get("restricted"):
        con.print(
            "    R2: free "
            + f"{h['r2']:.4f}"
            + "".join(f", {k} {v:.4f}" for k, v in h["restricted"].items() if v is not None),
            highlight=False,
            markup=False,
        )
    for name, o in (h.get("variants") or {}).items():
        est = "" if o.get("phi") is None else f"phi = {phi_ci(o['phi'], o.get('phi_ci'))}"
        line = f"  {name}: {est}" + (" - " if est else "")
        line += "resolved" if o["resolved"] else o["verdict"]
        con.print(line + (f" ({'; '.join(o['reasons'])})" if o.get("reasons") else ""), highlight=False, markup=False)
        for c in o.get("claims") or []:
            con.print(f"    {c}", highlight=False, markup=False)
        if o.get("caveats"):
            con.print(f"    {'; '.join(o['caveats'])}", highlight=False, markup=False)
    for k, v in (h.get("delta_phi") or {}).items():
        if v is not None:
            con.print(f"  delta phi ({k}) = {v:+.3f}", highlight=False, markup=False)
    for r, per in (h.get("loss_gap_to_r1") or {}).items():
        con.print(
            f"  loss gap to r=1 at matched compute (best run per cell), r={r}: "
            + ", ".join(f"C={c}: {g:+.3f}" for c, g in per.items()),
            highlight=False,
            markup=False,
        )
    if axes is not None:
        con.print(rich_table(axes))
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
