"""The numbers the report's figures and tables share, computed from the report context.

Both ``figures`` and ``tables`` read these frames; they live here, beside ``context``, so that the
tables (and a notebook that wants the numbers) never import matplotlib. numpy and pandas only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.law.formula import equivalent_N
from loopscale.report.context import ReportContext
from loopscale.report.inputs import AXES


# ---- equivalence ----------------------------------------------------------------------------------
def equivalence_ratios(ctx: ReportContext) -> pd.DataFrame:
    """Per r: N_eq/N and N_cost/N (median over the sweep's models) with the CI of N_eq/N from phi's draws."""
    rows = []
    phi = ctx.law.phi_
    all_draws = ctx.variant_fit.bootstrap.draws_of("phi")
    draws = all_draws[np.isfinite(all_draws)] if all_draws.size else None
    for r in ctx.rs:
        g = ctx.df[ctx.df["r"] == r]
        f_once = float(np.median(g["N_once"] / g["N"]))
        f_rec = 1 - f_once
        row = {
            "r": r,
            "N_once_share": f_once,
            "N_cost_ratio": f_once + r * f_rec,
            "N_eq_ratio": np.nan,
            "N_eq_lo": np.nan,
            "N_eq_hi": np.nan,
        }
        if phi is not None:
            row["N_eq_ratio"] = float(equivalent_N(f_once, f_rec, r, phi))
            if draws is not None and draws.size >= 5:
                vals = equivalent_N(f_once, f_rec, r, draws)
                row["N_eq_lo"], row["N_eq_hi"] = np.percentile(vals, [2.5, 97.5])
        rows.append(row)
    return pd.DataFrame(rows)


# ---- five axes ------------------------------------------------------------------------------------
def axis_order(names: Any) -> list[str]:
    present = list(dict.fromkeys(str(n) for n in names))
    return [a for a in AXES if a in present] + sorted(a for a in present if a not in AXES)


def axes_scores(ctx: ReportContext, *, test_time: bool = False) -> pd.DataFrame:
    """Axis score per (C, r, r_eval, axis): macro average over tasks of one run per cell.

    The run per (budget, r) cell is the one with the lowest validation loss among the evaluated runs
    (the compute-optimal run, arXiv 2604.21106 §6), when the axes table's run ids are in the runs
    table; otherwise the scores of the cell's evaluated runs are averaged.
    """
    ax_df = ctx.inputs.axes
    if ax_df is None:
        return pd.DataFrame()
    df = ax_df[(ax_df["r"] == 1) | (ax_df["variant"] == ctx.variant)]
    if not test_time:
        df = df[df["r_eval"] == df["r"]]
    if df.empty:
        return pd.DataFrame()
    val = ctx.inputs.runs.df.set_index(ctx.inputs.runs.df["run_id"].astype(str))["val_loss"]
    df = df.assign(_run=df["run_id"].astype(str), _C=df["C"].fillna(-1.0))
    df = df.assign(_val=df["_run"].map(val))
    keep = []
    for _, cell in df.groupby(["_C", "r"]):
        runs = cell.drop_duplicates("_run")
        if len(runs) > 1 and runs["_val"].notna().all():
            keep.append(cell[cell["_run"] == runs.loc[runs["_val"].idxmin(), "_run"]])
        else:
            keep.append(cell)
    df = pd.concat(keep)
    per_task = df.groupby(["_C", "r", "r_eval", "axis", "task", "_run"], as_index=False).agg(
        loss=("loss", "mean"), accuracy=("accuracy", "mean") if "accuracy" in df.columns else ("loss", "size")
    )
    per_run = per_task.groupby(["_C", "r", "r_eval", "axis", "_run"], as_index=False).agg(
        loss=("loss", "mean"), accuracy=("accuracy", "mean"), n_tasks=("task", "nunique")
    )
    out = per_run.groupby(["_C", "r", "r_eval", "axis"], as_index=False).agg(
        loss=("loss", "mean"), accuracy=("accuracy", "mean"), n_tasks=("n_tasks", "max"), n_runs=("_run", "nunique")
    )
    if "accuracy" not in ax_df.columns:
        out["accuracy"] = np.nan
    return out.rename(columns={"_C": "C"})


# ---- test-time recurrence --------------------------------------------------------------------------
def tt_budget(sc: pd.DataFrame) -> float | None:
    """The largest budget that has test-time points (r_eval != r)."""
    tt = sc[sc["r_eval"] != sc["r"]]
    if tt.empty:
        return None
    return float(tt["C"].max())


def tt_scores(ctx: ReportContext) -> pd.DataFrame | None:
    """The axis scores with test-time recurrence points, at the budget the report shows them for."""
    sc = axes_scores(ctx, test_time=True)
    if sc.empty:
        return None
    c = tt_budget(sc)
    return None if c is None else sc[sc["C"] == c]
