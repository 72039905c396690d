"""The numbers every figure and table of a report draws on, computed once from the inputs.

``ReportContext.build(inputs)`` picks the reference variant of the fit file, rebuilds its law and
bootstrap draws (``loopscale.fit.law_from_fit``), predicts every run, and collects the fit file's
empirical optima and law-based frontier. Figures and tables read this object and compute nothing
that the fit file already holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscale import grids
from loopscale.fit import JointLaw, law_from_fit
from loopscale.fit.allocation import empirical_optima, template_config, valid_rs
from loopscale.fit.inference.verdict import verdicts as all_verdicts
from loopscale.fit.result import FitResult, VariantFit
from loopscale.fit.table import budget_values
from loopscale.report.honesty import Verdict
from loopscale.report.inputs import ReportInputs
from loopscale.report.style import Palette


@dataclass
class ReportContext:
    inputs: ReportInputs
    variant: str
    law: JointLaw
    draws: np.ndarray | None  # bootstrap thetas (S, 6), finite rows only
    df: pd.DataFrame  # the variant's runs, with _C, N, pred, resid
    rs: list[int]
    budgets: list[float]
    template: dict[str, Any]
    frontier_rs: list[int]  # r values the template can build (for law-based frontier curves)
    empirical: pd.DataFrame  # the fit file's parabola minima per (budget, r) cell
    frontier: pd.DataFrame
    optima: pd.DataFrame  # what figures show per cell: the vertex if bracketed, else the cell's best run
    verdict: Verdict
    verdicts: dict[str, Verdict]
    palette: Palette
    result: FitResult  # the fit file, typed (``loopscale.fit.result``): every reader reads its attributes
    notes: list[str] = field(default_factory=list)

    @property
    def variant_fit(self) -> VariantFit:
        """The reference variant's record, typed."""
        return self.result.variant(self.variant)

    @property
    def has_budget(self) -> bool:
        return "_C" in self.df.columns

    @classmethod
    def build(cls, inputs: ReportInputs) -> ReportContext:
        result = inputs.fit
        variant = result.reference
        rec = result.variant(variant)
        law, draws = law_from_fit(result, variant)
        if law.phi_undetermined:
            draws = None  # phi undetermined: draws carry no information about phi
        runs = inputs.runs.for_variant(variant) if variant in set(inputs.runs.df["variant"]) else inputs.runs
        df = runs.df.copy()
        df["N"] = df["N_once"] + df["N_rec"]
        if "C" in df.columns:
            df["_C"] = budget_values(df)
        df["pred"] = law.predict(df)
        df["resid"] = df["val_loss"] - df["pred"]
        rs = sorted(int(r) for r in set(df["r"]))
        budgets = sorted(set(df["_C"])) if "_C" in df.columns else []
        template = dict(result.template or grids.PAPER_MODEL)
        notes = list(inputs.notes)
        frontier_rs = valid_rs(template, rs)
        if law.phi_undetermined:
            frontier_rs = [r for r in frontier_rs if r == 1]
        mismatch = _template_mismatch(template, df)
        if mismatch:
            notes.append(mismatch)
        empirical = pd.DataFrame(rec.optima.empirical)
        if empirical.empty and "C" in df.columns:
            empirical = empirical_optima(df)
        frontier = pd.DataFrame(rec.optima.frontier)
        verdicts = all_verdicts(result)
        axes_rs = inputs.axes["r"].tolist() + inputs.axes["r_eval"].tolist() if inputs.axes is not None else []
        palette = Palette.for_rs(rs, inputs.runs.df["r"], axes_rs)
        return cls(
            inputs=inputs,
            variant=variant,
            law=law,
            draws=draws,
            df=df,
            rs=rs,
            budgets=budgets,
            template=template,
            frontier_rs=frontier_rs,
            empirical=empirical,
            frontier=frontier,
            optima=display_optima(empirical, df),
            verdict=verdicts[variant],
            verdicts=verdicts,
            palette=palette,
            result=result,
            notes=notes,
        )


def display_optima(empirical: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """Per (budget, r) cell: N, D/N and L at the optimum as a figure should show them.

    A bracketed parabola vertex is shown as is. A vertex outside the widths tried (or of a concave
    parabola) is an extrapolation that can land anywhere (N* = 1e20 on a noisy cell), so for those
    cells the best run of the cell is shown instead, flagged ``bracketed = False`` (an open marker).
    """
    cols = ["C", "r", "N", "L", "tokens_per_param", "bracketed", "gap_to_r1"]
    if empirical.empty or "_C" not in df.columns:
        return pd.DataFrame(columns=cols)
    rows = []
    for _, e in empirical.iterrows():
        c, r = float(e["C"]), int(e["r"])
        if bool(e["bracketed"]):
            rows.append(
                {
                    "C": c,
                    "r": r,
                    "N": e["N_opt"],
                    "L": e["L_opt"],
                    "tokens_per_param": e["tokens_per_param"],
                    "bracketed": True,
                }
            )
            continue
        cell = df[(df["_C"] == c) & (df["r"] == r)]
        if cell.empty:
            continue
        best = cell.loc[cell["val_loss"].idxmin()]
        rows.append(
            {
                "C": c,
                "r": r,
                "N": best["N"],
                "L": best["val_loss"],
                "tokens_per_param": best["D"] / best["N"],
                "bracketed": False,
            }
        )
    out = pd.DataFrame(rows, columns=cols[:-1])
    base = out[out["r"] == 1].set_index("C")["L"]
    out["gap_to_r1"] = [L - base.get(c, np.nan) for c, L in zip(out["C"], out["L"], strict=True)]
    return out


def _template_mismatch(template: dict[str, Any], df: pd.DataFrame) -> str | None:
    """Does the fit's architecture template reproduce the runs' N_once and N_rec at their widths?

    The law-based frontier is computed for the template; if the runs were built differently (another
    depth, vocabulary or injection) those curves describe a different model family.
    """
    if "d_model" not in df.columns:
        return None
    from loopscale import accounting

    bad = 0
    checked = 0
    for _, row in df.drop_duplicates(["r", "d_model"]).head(24).iterrows():
        try:
            cfg = template_config(template, int(row["r"]), int(row["d_model"]))
        except Exception:
            continue
        checked += 1
        if not (
            np.isclose(accounting.N_once(cfg), row["N_once"], rtol=1e-3)
            and np.isclose(accounting.N_rec(cfg), row["N_rec"], rtol=1e-3)
        ):
            bad += 1
    if checked and bad:
        return (
            f"the fit file's architecture template does not reproduce N_once/N_rec of {bad} of {checked} "
            "checked (r, d_model) models; the law-based frontier curves describe the template, not these runs"
        )
    return None
