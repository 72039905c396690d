"""The report's tables, as plain rows of formatted strings; rendered to HTML and to Markdown.

Every number comes from the fit file (or the runs and axes tables); nothing is refitted here.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from loopscale.fit.inference.paired import reading
from loopscale.fit.law.formula import equivalent_N
from loopscale.fit.result import (
    DeltaInference,
    DeltaPhi,
    FitResult,
    HalfFit,
    Leading,
    PairedReading,
    SharedReading,
    Test,
    finite_ends,
)
from loopscale.fit.table import r1_anchor
from loopscale.numbers import (
    BLOCK_BOOTSTRAP,
    MISSING,
    PHI_DIGITS,
    SECONDARY,
    count,
    flops,
    interval,
    interval_method,
    num,
    phi_ci,
    phi_interval,
    signed,
)
from loopscale.numbers import phi as phi_txt
from loopscale.report.context import ReportContext
from loopscale.report.data import axes_scores, axis_order, equivalence_ratios, tt_scores
from loopscale.report.honesty import Verdict
from loopscale.report.inputs import AXIS_TITLES


@dataclass
class Table:
    id: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
    classes: list[str] = field(default_factory=list)  # per-row CSS class ("" for none)

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = []
        for i, row in enumerate(self.rows):
            cls = self.classes[i] if i < len(self.classes) and self.classes[i] else ""
            attr = f' class="{cls}"' if cls else ""
            body.append(f"<tr{attr}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        note = f'<p class="note">{html.escape(self.note)}</p>' if self.note else ""
        # the wrapper scrolls sideways on its own, so a wide table never makes the whole page scroll on a phone
        return (
            f'<div class="scroll" role="region" aria-label="{html.escape(self.title)}" tabindex="0">'
            f'<table id="{self.id}"><caption>{html.escape(self.title)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>{note}"
        )

    def markdown(self) -> str:
        def cell(s: str) -> str:
            return s.replace("|", "\\|")

        lines = [f"**{self.title}**", "", "| " + " | ".join(map(cell, self.columns)) + " |"]
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(map(cell, row)) + " |" for row in self.rows]
        if self.note:
            lines += ["", f"_{self.note}_"]
        return "\n".join(lines)


# ---- the tables --------------------------------------------------------------------------------
def coefficients_table(ctx: ReportContext) -> Table:
    """The joint law's coefficients, each interval named by its method: φ's quoted interval is the verdict's (the
    calibrated profile likelihood of ``inference.phi``), the block bootstrap's percentile interval of φ follows it
    as the secondary one, and α, β, E, A, B have the block bootstrap's only."""
    rec, v = ctx.variant_fit, ctx.verdict
    p = rec.params.as_dict()
    cis = rec.bootstrap.ci
    rows, classes = [], []
    undetermined = rec.phi_undetermined
    phi_val = "undetermined" if undetermined else phi_txt(rec.params.phi)
    if not undetermined and not v.resolved:
        phi_val += " (not resolved)"
    quoted = phi_interval(v.ci)
    rows.append(["φ (recurrence-equivalence exponent)", phi_val, quoted, "" if quoted == MISSING else _quoted(v)])
    classes.append("phi" if v.resolved else "phi bad")
    secondary = phi_interval(cis.get("phi"))
    if v.method == "profile likelihood" and secondary != MISSING:
        rows.append(["φ, secondary interval", "", secondary, SECONDARY])
        classes.append("")
    for key, name in (
        ("alpha", "α (size exponent)"),
        ("beta", "β (data exponent)"),
        ("E", "E (irreducible loss)"),
        ("A", "A"),
        ("B", "B"),
    ):
        ci = interval(cis.get(key))
        rows.append([name, num(p[key]), ci, "" if ci == MISSING else BLOCK_BOOTSTRAP])
        classes.append("")
    m = rec.metrics
    rows.append(["R² (raw nats)", num(m.r2), "", ""])
    per_r = ", ".join(f"r={r}: {x:.4f}" for r, x in m.rmse_per_r.items())
    rows.append(["RMSE (nats/token)", num(m.rmse), per_r, ""])
    for key, rf in rec.restricted.items():
        rows.append([f"restricted fit {key.replace('phi', 'φ')}: R²", num(rf.r2), f"RMSE {rf.rmse:.4f}", ""])
    for label, ho in (
        ("free fit", rec.checks.held_out if rec.checks is not None else None),
        *((f"restricted fit {k.replace('phi', 'φ')}", rf.held_out) for k, rf in rec.restricted.items()),
    ):
        if ho is not None and ho.extrapolation_rmse is not None:
            lor = ho.leave_one_r_out_rmse
            rows.append(
                [
                    f"{label}: held-out RMSE, top budget",
                    num(ho.extrapolation_rmse),
                    "" if lor is None else f"leave-one-r-out {lor:.4f}",
                    "",
                ]
            )
    for r, cf in rec.per_r.items():
        cp = cf.params
        rows.append([f"Chinchilla fit r = {r} alone: R²", num(cf.r2), f"α {cp['alpha']:.3f}, β {cp['beta']:.3f}", ""])
    classes += [""] * (len(rows) - len(classes))
    vf = rec
    n_near = 1 if vf.law.n_near_optimal is None else vf.law.n_near_optimal
    note = (
        f"{ctx.variant}: {vf.n_runs} runs, r = {', '.join(map(str, vf.rs))}; "
        f"converged: {'yes' if vf.law.converged else 'NO'}; "
        f"{n_near} near-optimal minim{'um' if n_near == 1 else 'a'}"
    )
    return Table(
        "tab-coefficients",
        "joint law L = E + A (N_once + r^φ N_rec)^−α + B D^−β",
        ["quantity", "value", f"{v.ci_level:.0%} interval, or detail", "interval's method"],
        rows,
        note,
        classes,
    )


def _quoted(v: Verdict) -> str:
    """The method of the verdict's interval, as the coefficients table names it."""
    return f"{interval_method(v.method)} (quoted)"


def delta_phi_table(ctx: ReportContext) -> Table | None:
    fit = ctx.result
    if len(fit.variants) < 2:
        return None
    from loopscale.fit.paper import PAPER_PROBES_PHI as probes

    dphi = {d.variant: d for d in fit.delta_phi}
    rows = []
    for name in fit.variants:
        vd = ctx.verdicts[name]
        d = dphi.get(name)
        phi = phi_ci(vd.phi, vd.ci)
        if vd.phi is not None and not vd.resolved:
            phi += " — not resolved"
        if name == ctx.variant:
            rows.append([name + " (reference)", phi, *["–"] * 8, "reference"])
        elif d is None:
            why = (
                "read against other r = 1 runs than the reference"
                if r1_anchor(name) != r1_anchor(ctx.variant)
                else "φ undetermined"
            )
            rows.append([name, phi, *["–"] * 8, f"Δφ not computed ({why})"])
        else:
            gap = d.loss_gap
            gap_cell = (
                f"{signed(gap.mean, 3)} {interval(gap.ci, 3, is_signed=True)}"
                if gap is not None and isinstance(gap.mean, int | float)
                else "–"
            )
            lead = d.leading
            rows.append(
                [
                    name,
                    phi,
                    _reading_cell(lead, lead=True),
                    MISSING if lead is None or lead.p is None else f"{lead.p:.3g}",
                    _reading_cell(d.inference),
                    _reading_cell(_paired(fit, name, "shared law")),
                    _reading_cell(_paired(fit, name, "separate laws")),
                    _secondary_cell(d),
                    _shared_cell(d.shared),
                    gap_cell,
                    _short_reading(d),
                ]
            )
    return Table(
        "tab-delta-phi",
        "Δφ per recipe: the leading reading, and each reading beside it",
        [
            "recipe",
            "φ [95% CI, profile likelihood]",
            "Δφ [95% CI], leading reading (quoted)",
            "p (Δφ = 0)",
            "separate fits: Δφ [CI]",
            "paired, shared law: Δφ [CI]",
            "paired, separate laws: Δφ [CI]",
            f"{SECONDARY}: Δφ [CI]",
            "shared law: Δφ (held-out reading)",
            "Δ val loss, same runs [CI]",
            "reading (the line above says it in full)",
        ],
        rows,
        "r = 1 runs are shared by every recipe; Δφ = φ(recipe) − φ(reference). The leading reading is the one to "
        "quote; every other reading is beside it, named by its method. Every interval but the block bootstrap's is "
        "a profile-likelihood interval calibrated by a wild cluster bootstrap. Separate fits give each recipe "
        "its own E, A, α, B, β (profile interval, paired wild bootstrap). The paired readings let the law's misfit at "
        "each (budget, r, width, seed) point be shared by the two recipes (fit/inference/paired.py), with φ alone "
        "moved (shared law) or every coefficient its own (separate laws); the most specific reading its held-out "
        'test does not contradict leads, else the separate fits (docs/fit.md, "Paired Δφ"). The shared law '
        "without a shared misfit has no interval. Δ val loss: the recipe's loss minus the "
        "reference's on the same looped runs (budget, r, width, seed; t interval over cells). For reference, "
        f"the paper (arXiv 2604.21106) measures φ = {probes['baseline']:.2f} for its baseline, "
        f"{probes['truncated_bptt']:.2f} for truncated BPTT "
        f"(Δφ {probes['truncated_bptt'] - probes['baseline']:+.2f}: val loss improves while φ falls, a "
        f"token-budget gain, not a capacity gain) and {probes['hyperconnect']:.2f} for hyperconnections "
        f"(Δφ {probes['hyperconnect'] - probes['baseline']:+.2f}, a capacity gain).",
    )


def _short_reading(d: DeltaPhi) -> str:
    """What the leading reading's test says, in three words (the Δφ section's line above the table says it in full,
    with the loss on the same runs and the paper's reading, ``honesty.delta_phi_quote``)."""
    lead = d.leading
    test: Leading | Test | None = lead if lead is not None else d.inference.zero if d.inference is not None else None
    ci = finite_ends((lead.ci if lead is not None else None) or d.ci)
    if ci is None:
        return "undetermined"
    rejected = test is not None and bool(test.rejected)
    if rejected and ci[0] > 0:
        return "raises φ"
    if rejected and ci[1] < 0:
        return "lowers φ"
    return "cannot tell from the reference" if test is not None else "percentile only"


def leading_reasons(ctx: ReportContext) -> list[str]:
    """Why each technique's leading reading leads (``delta_phi[].leading.reason``, fit/inference/paired.py)."""
    return [
        f"{d.variant}: {d.leading.reading} leads — {d.leading.reason}"
        for d in ctx.result.delta_phi
        if d.leading is not None and d.leading.reason
    ]


def _paired(fit: FitResult, name: str, model: str) -> PairedReading | None:
    inf = fit.variants[name].inference
    return reading(inf.paired_delta_phi if inf is not None else None, model)


def _reading_cell(rec: Leading | PairedReading | DeltaInference | None, lead: bool = False) -> str:
    if rec is None or not isinstance(rec.estimate, int | float) or not rec.ci:
        return "–"
    cell = f"{signed(float(rec.estimate), PHI_DIGITS)} {interval(rec.ci, PHI_DIGITS, is_signed=True)}"
    label = rec.reading if isinstance(rec, Leading) else None
    return f"{cell} ({label})" if lead and label else cell


def _secondary_cell(d: DeltaPhi) -> str:
    """The paired block bootstrap's percentile interval of Δφ (``secondary_ci``), with no estimate of its own."""
    return interval(d.secondary_ci, PHI_DIGITS, is_signed=True)


def _shared_cell(sh: SharedReading | None) -> str:
    if sh is None or not isinstance(sh.delta_phi, int | float):
        return "–"
    supported = sh.held_out.supported if sh.held_out is not None else None
    bound = ", at its bound" if sh.at_bound else ""
    readings: dict[object, str] = {"shared": "not contradicted", "separate": "contradicted: read the separate fits"}
    reading = readings.get(supported, "not tested")
    return f"{signed(float(sh.delta_phi), PHI_DIGITS)}{bound} ({reading})"


def loss_gap_table(ctx: ReportContext) -> Table | None:
    """Gap to r = 1 at matched compute per r: law-based (range over budgets, with CIs) and empirical."""
    if 1 not in ctx.rs or len(ctx.rs) < 2:
        return None
    cis = ctx.variant_fit.bootstrap.ci
    rows = []
    fr, emp = ctx.frontier, ctx.optima
    for r in ctx.rs:
        if r == 1:
            continue
        law_txt, ci_range, emp_txt = "–", "–", "–"
        if not fr.empty and (fr["r"] == r).any():
            g = fr[fr["r"] == r]
            law_txt = f"{g['gap_to_r1'].min():+.3f} to {g['gap_to_r1'].max():+.3f}"
            los = [cis.get(f"gap_to_r1_r{r}_C{c:.3g}", [None, None])[0] for c in g["C"]]
            his = [cis.get(f"gap_to_r1_r{r}_C{c:.3g}", [None, None])[1] for c in g["C"]]
            if all(x is not None for x in los + his):
                ci_range = f"{min(los):+.3f} to {max(his):+.3f}"
        if not emp.empty:
            e = emp[(emp["r"] == r) & emp["gap_to_r1"].notna()]
            if len(e):
                n_b = int(e["bracketed"].astype(bool).sum())
                emp_txt = f"{e['gap_to_r1'].min():+.3f} to {e['gap_to_r1'].max():+.3f}"
                emp_txt += f" ({n_b}/{len(e)} cells bracketed)"
        rows.append([f"r = {r}", law_txt, ci_range, emp_txt])
    budgets = f"{flops(min(ctx.budgets))}–{flops(max(ctx.budgets))}" if ctx.budgets else "–"
    return Table(
        "tab-loss-gap",
        f"loss gap to r = 1 at matched compute (nats/token, budgets {budgets})",
        [
            "r",
            "joint law (range over budgets)",
            "95% CI, block bootstrap (outer range)",
            "empirical (parabola minima; best run where not bracketed)",
        ],
        rows,
        "positive: the looped model is worse than the non-looped one at the same training FLOPs.",
    )


def equivalence_table(ctx: ReportContext) -> Table:
    """N_eq (same loss) and N_cost (same FLOPs) for the sweep's models, per width and r."""
    df = ctx.df
    phi = ctx.law.phi_
    eq = equivalence_ratios(ctx)
    lo = dict(zip(eq["r"], eq["N_eq_lo"], strict=True))
    hi = dict(zip(eq["r"], eq["N_eq_hi"], strict=True))
    key = "d_model" if "d_model" in df.columns else None
    rows = []
    models = df.drop_duplicates(["r", key] if key else ["r", "N_once", "N_rec"]).sort_values(["r", "N"])
    for _, m in models.iterrows():
        r = int(m["r"])
        n_eq = MISSING if phi is None else count(equivalent_N(m["N_once"], m["N_rec"], r, phi))
        if phi is not None and np.isfinite(lo.get(r, np.nan)) and r > 1:
            n_eq += f" [{count(lo[r] * m['N'])}, {count(hi[r] * m['N'])}]"
        rows.append(
            [
                f"r = {r}",
                str(int(m[key])) if key else "–",
                count(m["N_once"]),
                count(m["N_rec"]),
                count(m["N"]),
                n_eq,
                count(m["N_once"] + r * m["N_rec"]),
            ]
        )
    return Table(
        "tab-equivalence",
        "equivalent non-looped sizes of the sweep's models",
        [
            "r",
            "d_model",
            "N_once",
            "N_rec",
            "unique N",
            "N_eq = N_once + r^φ N_rec [95% CI, block bootstrap]",
            "N_cost = N_once + r N_rec",
        ],
        rows,
        "N_eq: the non-looped size with the same loss (quality); N_cost: the non-looped size whose training "
        "costs the same FLOPs (cost). CI: the percentiles of N_eq over φ's block-bootstrap draws.",
    )


def allocation_table(ctx: ReportContext) -> Table | None:
    fr, emp = ctx.frontier, ctx.optima
    if fr.empty and emp.empty:
        return None
    cis = ctx.variant_fit.bootstrap.ci
    e_idx = {(float(row["C"]), int(row["r"])): row for _, row in emp.iterrows()} if not emp.empty else {}
    f_idx = {(float(row["C"]), int(row["r"])): row for _, row in fr.iterrows()} if not fr.empty else {}
    keys = sorted(set(f_idx) | set(e_idx))
    rows = []
    for c, r in keys:
        f = f_idx.get((c, r))
        e = e_idx.get((c, r))
        tag = f"r{r}_C{c:.3g}"
        gap = "–"
        if f is not None and r != 1 and np.isfinite(f["gap_to_r1"]):
            gap = f"{signed(f['gap_to_r1'])} {interval(cis.get(f'gap_to_r1_{tag}'), is_signed=True)}"
        rows.append(
            [
                flops(c),
                str(r),
                "–" if f is None else f"{f['d']:.0f}",
                "–" if f is None else count(f["N"]),
                "–" if f is None else count(f["D"]),
                "–" if f is None else f"{f['tokens_per_param']:.1f}",
                "–" if f is None else f"{f['L']:.4f}",
                gap,
                "–" if e is None else count(e["N"]) + ("" if e["bracketed"] else " †"),
                "–" if e is None else f"{e['tokens_per_param']:.1f}",
                "–" if e is None else f"{e['L']:.4f}",
            ]
        )
    return Table(
        "tab-allocation",
        "compute-optimal allocation per budget and r",
        [
            "C (FLOPs)",
            "r",
            "law d*",
            "law N*",
            "law D*",
            "law D/N",
            "law L*",
            "law gap to r=1 [CI, block bootstrap]",
            "empirical N*",
            "empirical D/N",
            "empirical L*",
        ],
        rows,
        "law: minimum over a continuous width of the fit's architecture template; empirical: vertex of the "
        "parabola in log N through each cell's runs († not bracketed by the widths tried: the cell's best "
        "run instead).",
    )


def axes_table(ctx: ReportContext) -> Table | None:
    sc = axes_scores(ctx)
    if sc.empty:
        return None
    c = float(sc["C"].max())
    sc = sc[sc["C"] == c]
    rs = sorted(sc["r"].unique())
    has_acc = sc["accuracy"].notna().any()
    rows = []
    for name in axis_order(sc["axis"]):
        g = sc[sc["axis"] == name].set_index("r")
        row = [AXIS_TITLES.get(name, name)]
        for r in rs:
            if r not in g.index:
                row.append("–")
                continue
            txt = f"{g.loc[r, 'loss']:.3f}"
            if has_acc and np.isfinite(g.loc[r, "accuracy"]):
                txt += f" ({100 * g.loc[r, 'accuracy']:.0f}%)"
            if r != 1 and 1 in g.index:
                txt += f" Δ{g.loc[r, 'loss'] - g.loc[1, 'loss']:+.3f}"
            row.append(txt)
        rows.append(row)
    where = f"C = {flops(c)} FLOPs" if c > 0 else "all runs"
    return Table(
        "tab-axes",
        f"five axes at {where}: continuation loss (nats/token)"
        + (", accuracy in brackets" if has_acc else "")
        + ", Δ to r = 1",
        ["axis"] + [f"r = {r}" for r in rs],
        rows,
        "axis score = macro average of its tasks, at the compute-optimal run of each cell.",
    )


def test_time_table(ctx: ReportContext) -> Table | None:
    sc = tt_scores(ctx)
    if sc is None:
        return None
    c = float(sc["C"].iloc[0])
    mean = sc.groupby(["r", "r_eval"])["loss"].mean()
    r_evals = sorted(sc["r_eval"].unique())
    rows = []
    for r in sorted(sc["r"].unique()):
        row = [f"trained r = {r}"]
        for re_ in r_evals:
            v = mean.get((r, re_))
            row.append("–" if v is None or not np.isfinite(v) else f"{v:.3f}" + (" *" if re_ == r else ""))
        rows.append(row)
    return Table(
        "tab-test-time",
        f"test-time recurrence at C = {flops(c)}: mean continuation loss of the axes",
        ["model"] + [f"r_eval = {x}" for x in r_evals],
        rows,
        "* the r the model was trained with.",
    )


def checks_table(ctx: ReportContext) -> Table | None:
    ch = ctx.variant_fit.checks
    if ch is None or not ch.model_fields_set:
        return None
    rows = []
    ex = ch.extrapolation
    if ex is not None:
        rows.append(
            [
                f"extrapolation to C = {flops(ex.held_out_budget)}",
                phi_txt(ex.phi),
                f"RMSE {num(ex.rmse)}, bias {ex.bias:+.4f}, max {num(ex.max_abs)}",
            ]
        )
    hs = ch.half_split
    if hs is not None:
        for half in ("lower", "upper"):
            h = getattr(hs, half) or HalfFit()
            b = h.budgets
            span = f"{flops(min(b))}–{flops(max(b))}" if b else ""
            rows.append([f"{half} half of the budgets ({span})", phi_txt(h.phi), f"R² {num(h.r2)}"])
    for r, lo in (ch.leave_one_r_out or {}).items():
        rows.append(
            [
                f"leave r = {r} out, predict it",
                phi_txt(lo.phi),
                f"RMSE {num(lo.rmse)}, bias {lo.bias:+.4f}",
            ]
        )
    return Table(
        "tab-checks",
        "validation of the fit (refits on part of the table)",
        ["check", "φ of that fit", "prediction of the held-out runs (nats/token)"],
        rows,
    )


def inputs_table(ctx: ReportContext) -> Table:
    fit, inp = ctx.result, ctx.inputs
    s = fit.settings
    src = fit.source
    boot = ctx.variant_fit.bootstrap
    rows = [
        [
            "runs table",
            str(inp.runs.source),
            f"{len(inp.runs.df)} usable runs"
            + (f", {inp.runs.n_excluded} excluded (did not finish)" if inp.runs.n_excluded else ""),
        ],
        ["fit file", inp.fit_source, "fitted by this report" if inp.fit_computed else "read, not refitted"],
        [
            "fit settings",
            f"{s.loss} δ={s.delta}, {s.restarts} starts",
            f"bootstrap: {boot.n} resamples (unit: {boot.unit if 'unit' in boot.model_fields_set else '–'})",
        ],
        [
            "fit made",
            str(fit.created if "created" in fit.model_fields_set else "–"),
            f"loopscale {fit.loopscale_version if 'loopscale_version' in fit.model_fields_set else '?'}; "
            f"{src.get('n_used', '?')} runs used",
        ],
        ["axes table", inp.axes_source or "none (not evaluated)", "" if inp.axes is None else f"{len(inp.axes)} rows"],
    ]
    return Table("tab-inputs", "inputs", ["", "source", "details"], rows)


def frame(table: Table) -> pd.DataFrame:
    """A table as a DataFrame (handy in a notebook)."""
    return pd.DataFrame(table.rows, columns=table.columns)
