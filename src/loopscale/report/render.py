"""The report's pages: ``index.html`` (self-contained: figures as base64 PNG, inline CSS, no scripts, no
network) and ``summary.md`` (the same headline and tables, figures linked)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Any

from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI
from loopscale.fit.table import CONTROL_SEP
from loopscale.numbers import PROFILE_LONG, interval_method, phi_ci
from loopscale.report.context import ReportContext
from loopscale.report.honesty import NOT_IDENTIFIED, Verdict, delta_phi_reading, phi_verdict
from loopscale.report.plain import plain_groups
from loopscale.report.tables import Table


@dataclass
class Panel:
    """One section of the report: a figure (or why there is none) and its tables."""

    name: str  # file stem and HTML id suffix
    title: str
    how_to_read: str
    png: bytes | None = None  # None: not drawn, see ``missing``
    files: list[str] = field(default_factory=list)  # relative paths of the written figure files
    missing: str = ""  # "not evaluated: ..." when there is no figure
    tables: list[Table] = field(default_factory=list)
    details: list[Table] = field(default_factory=list)  # long tables, folded (<details>)
    lead: list[str] = field(default_factory=list)  # lines a reader can quote, before the tables (Δφ per technique)
    lead_title: str = ""
    after: list[str] = field(default_factory=list)  # lines after the tables (why each leading reading leads)
    after_title: str = ""


PNG_DPI = 200  # the PNGs' resolution (build.save_figure)
CSS_PX_PER_IN = 130  # on screen, a 7.2 in figure is ~940 px wide (the page is 1060 px)

HOW_TO_READ: dict[str, str] = {
    "isoflop": (
        "One panel per training budget C. Each point is a run; within a panel all runs cost the same FLOPs, so "
        "a larger model sees fewer tokens. Dotted: a parabola in log N through each (budget, r) cell, whose "
        "minimum (vertical tick) is the empirical compute-optimal size. Solid: the joint law's prediction for "
        "that cell's model family. Curves of looped models (r > 1) lie above r = 1 when a repeat is worth "
        "less than a unique block."
    ),
    "frontier": (
        "Left: the best loss reachable at each budget, per r — the law's frontier (line, with the bootstrap "
        "95% band) and the cells' parabola minima (points; open: the minimum was not bracketed by the "
        "widths tried, so the cell's best run is shown instead of an extrapolated vertex). Right: the gap to "
        "the non-looped model at the same compute; above zero, looping costs loss at matched FLOPs."
    ),
    "parity": (
        "Each run's observed validation loss against the joint law's prediction. Points on the dashed line "
        "are fitted exactly; a systematic offset for one r means the law's single φ does not describe it. "
        "R² is on raw nats, as in the paper."
    ),
    "residuals": (
        "Observed − predicted loss per run, one panel per r, grouped by budget (within a budget, runs are "
        "ordered by width). The band is ± the RMSE of that r, the black bar the mean residual of the cell. "
        "A trend across budgets or a U-shape within a budget means the law misses curvature; seed noise "
        "shows as scatter of the size of the band."
    ),
    "phi": (
        "Left: the block bootstrap over (budget, r) cells — the histogram of its refits of φ and its percentile "
        "interval (dotted, secondary) — with the interval the report quotes (shaded: the profile-likelihood "
        "interval, calibrated by a wild cluster bootstrap) and the point estimate (black). φ = 0: a repeat adds no "
        "capacity; φ = 1: a repeat is worth a unique block. Middle: φ per recipe with its quoted interval, and Δφ "
        "to the reference with its leading reading's interval. Right: the restricted fits with φ fixed to 0 and 1 "
        "against the free fit (lower RMSE is better)."
    ),
    "equivalence": (
        "What a looped model is worth per unique parameter. Filled bars: the quality-equivalent non-looped "
        "size N_eq = N_once + r^φ N_rec (same predicted loss) divided by the unique size N; hatched: the "
        "cost-equivalent size N_cost = N_once + r N_rec (same training FLOPs for the blocks). The gap between "
        "the two is what looping loses; the table lists both for every model of the sweep."
    ),
    "allocation": (
        "Left: the compute-optimal model size N* per budget; right: training tokens per parameter D*/N* "
        "there. Lines: the law's optimum over a continuous width (band: bootstrap 95%); points: the cells' "
        "parabola minima. With the paper's law (`loopscale plan 1e19`), a larger r prefers wider layers but "
        "fewer unique parameters (N* 476M, 344M, 231M, 205M for r = 1, 2, 4, 8), so D*/N* per unique parameter "
        "rises (5.5 to 9.1); only per cost-equivalent parameter N_once + r N_rec does it fall (5.5 to 2.6)."
    ),
    "axes": (
        "Continuation loss (nats/token of the gold answer given the prompt; lower is better) on the five "
        "evaluation axes, at the compute-optimal run of each (budget, r) cell. An axis that tracks the "
        "validation loss gap (typically knowledge) separates the r values; axes whose r values overlap show "
        "no per-r signal at this scale."
    ),
    "test_time": (
        "Each trained model evaluated with the loop run r_eval times (filled marker: the r it was trained "
        "with). A curve that keeps falling to the right of its filled marker means extra recurrences at test "
        "time help; a rise means the model only works at its training depth."
    ),
}

CSS = """
:root { --ink: #1a1a1a; --muted: #555; --line: #d8d8d8; --bad: #b00020; --bad-bg: #fdecef; --ok: #0b6e4f;
        --ok-bg: #e9f6f0; --warn-bg: #fff6e0; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; }
main { max-width: 1060px; margin: 0 auto; padding: 24px 28px 60px; overflow-wrap: anywhere; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 8px; padding-top: 8px; border-top: 1px solid var(--line); }
.sub { color: var(--muted); margin: 0 0 18px; }
.plain { font-size: 16px; margin: 0 0 14px; }
.plain p { margin: 0 0 8px; }
.verdict { border: 2px solid var(--ok); background: var(--ok-bg); border-radius: 8px; padding: 14px 18px;
           margin: 10px 0 14px; }
.verdict.bad { border-color: var(--bad); background: var(--bad-bg); }
.verdict .label { font-size: 28px; font-weight: 700; margin: 0; }
.verdict.bad .label { color: var(--bad); }
.verdict ul { margin: 6px 0 0 0; }
.verdict p { margin: 6px 0 0; }
.verdict .method, .verdict .estimate { font-size: 14px; }
.verdict .method { color: var(--muted); }
.verdict .dphi li { font-weight: 600; }
.quote { border-left: 4px solid var(--ok); padding: 6px 14px; margin: 12px 0; }
.quote ul { margin: 4px 0; padding-left: 20px; }
.facts { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(300px, 100%), 1fr)); gap: 6px 28px;
         margin: 10px 0; }
.facts div { padding: 2px 0; border-bottom: 1px dotted var(--line); }
.warnings { background: var(--warn-bg); border-left: 4px solid #e69f00; padding: 8px 14px; margin: 14px 0; }
.warnings h2 { border-top: 0; margin-top: 4px; padding-top: 0; }
.warnings ul { margin: 4px 0; padding-left: 20px; }
nav ol { columns: 2; margin: 6px 0; }
figure { margin: 10px 0; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption, .note { color: var(--muted); font-size: 13px; }
.control { font-weight: 600; }
.how { margin: 4px 0 8px; }
.missing { border: 2px dashed #999; border-radius: 8px; padding: 22px; color: #444; font-size: 17px;
           font-weight: 600; text-align: center; background: #f6f6f6; }
.scroll { max-width: 100%; overflow-x: auto; margin: 12px 0 4px; }
table { border-collapse: collapse; font-size: 13.5px; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
caption { text-align: left; font-weight: 600; padding-bottom: 4px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; white-space: nowrap; }
thead th { border-bottom: 2px solid var(--ink); }
tr.phi td { font-weight: 700; }
#tab-delta-phi td { white-space: nowrap; }
tr.bad td { color: var(--bad); }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--muted); }
code { font-size: 13px; }
@media (max-width: 600px) { main { padding: 16px 12px 40px; } h1 { font-size: 22px; } h2 { font-size: 18px; }
                            nav ol { columns: 1; padding-left: 22px; } th, td { padding: 3px 6px; white-space: nowrap; }
                            th:first-child, td:first-child { white-space: normal; min-width: 9em; } }
@media print { .scroll { overflow: visible; }
               main { max-width: none; padding: 0; } h2 { break-after: avoid; } figure, table { break-inside: avoid; }
               details { display: block; } }
"""


#: what the verdict's Δφ lines are, and where the other readings are.
DPHI_NOTE = "the leading reading, the one to quote; every reading in the Δφ table under the φ figure"


# ---- the headline ----------------------------------------------------------------------------------
def headline(ctx: ReportContext) -> dict[str, Any]:
    """Everything the top of the page (and of summary.md) says, as text, in the order the page shows it.

    First the verdict (``label``, ``estimate``, ``method``, ``reasons``, ``controls``, ``delta_phi``): the answer to
    "what did I measure, can I quote it", on the first screen. Then the plain words (``plain``), what limits this fit
    (``limits``) and what the control measures (``control``, ``control_limits``), each warning in one of them, once.
    """
    v = ctx.verdict
    explain, control_lines = plain_groups(ctx)
    limits, control_limits = grouped_warnings(ctx)
    estimate = ""
    if not v.resolved and v.phi is not None:
        estimate = f"best estimate φ̂ = {phi_ci(v.phi, v.ci)} — for the record, not a finding"
    return {
        "label": v.label,
        "resolved": v.resolved,
        "estimate": estimate,
        "method": quoted_method(v),
        "reasons": v.reasons,
        "controls": control_refits(ctx),
        "delta_phi": [f"{d.variant} − {d.reference}: {delta_phi_reading(d)}" for d in ctx.result.delta_phi],
        "variant": ctx.variant,
        "plain": explain,
        "limits": limits,
        "control": control_lines,
        "control_limits": control_limits,
        "gaps": _law_gaps(ctx),
        "emp_gaps": _empirical_gaps(ctx),
        "paper": (
            "for reference, the paper (116 runs, 4.64e17–2.15e19 FLOPs): φ = "
            + phi_ci(PAPER_COEFFICIENTS["phi"], PAPER_PHI_CI, digits=2)
        ),
    }


def quoted_method(v: Verdict) -> str:
    """What φ's interval in the verdict is, named: the one to quote, and where the secondary one is."""
    if v.ci is None:
        return ""
    if v.method == "profile likelihood":
        return (
            f"{v.ci_level:.0%} interval: {PROFILE_LONG} — the one to quote (the block bootstrap's percentile "
            "interval is secondary, in the coefficients table)"
        )
    return f"{v.ci_level:.0%} interval: {interval_method(v.method)} (a fit file without the calibrated inference)"


def _law_gaps(ctx: ReportContext) -> list[str]:
    fr = ctx.frontier
    if fr.empty or len(ctx.rs) < 2:
        return []
    out = []
    for r in ctx.rs:
        g = fr[fr["r"] == r]
        if r != 1 and len(g):
            out.append(f"r = {r}: {g['gap_to_r1'].min():+.3f} to {g['gap_to_r1'].max():+.3f}")
    return out


def _empirical_gaps(ctx: ReportContext) -> list[str]:
    emp = ctx.optima
    if emp.empty:
        return []
    out = []
    for r in ctx.rs:
        e = emp[(emp["r"] == r) & emp["gap_to_r1"].notna()]
        if r != 1 and len(e):
            out.append(f"r = {r}: {e['gap_to_r1'].min():+.3f} to {e['gap_to_r1'].max():+.3f}")
    return out


def _controls(ctx: ReportContext) -> list[str]:
    """The re-fits of this page's recipe against control r = 1 runs (``V@C``)."""
    return [name for name in ctx.result.variants if name.startswith(f"{ctx.variant}{CONTROL_SEP}")]


def _control_extras(o: Verdict) -> list[str]:
    """The control's caveats its one line in the verdict states (where φ sits against 0 and 1)."""
    return [c for c in o.caveats if c.startswith(("the CI", "φ ="))]


def grouped_warnings(ctx: ReportContext) -> tuple[list[str], list[str]]:
    """Every caveat and warning once, in two groups: what limits this fit (the reference's caveats, the inputs'
    notes, the fit's warnings) and what limits the control re-fit (its caveats, the fit's warnings about it).
    Nothing the verdict already says (a reason, a control's line) is repeated."""
    v = ctx.verdict
    controls = _controls(ctx)
    said = set(v.reasons)
    for name in controls:
        o = ctx.verdicts[name]
        said |= set(o.reasons) | set(_control_extras(o))
    limits: list[str] = []
    control: list[str] = []
    checks = ctx.variant_fit.checks
    moved_by = checks.half_split.phi_difference if checks is not None and checks.half_split is not None else None
    moved = []
    if moved_by is not None and v.resolved and abs(moved_by) > 0.2:
        moved.append(
            f"φ moves by {moved_by:+.2f} between the lower and upper half of the budgets: the estimate depends on scale"
        )
    for w in [*ctx.notes, *v.caveats, *moved, *ctx.result.warnings]:
        tag = w[1 : w.index("]")] if w.startswith("[") and "]" in w else None
        (control if tag in controls else limits).append(w)
    for name in controls:
        control += [c for c in ctx.verdicts[name].caveats if c not in said]
    limits = [w for w in dict.fromkeys(limits) if w not in said]
    control = [w for w in dict.fromkeys(control) if w not in said and w not in limits]
    return limits, control


def control_refits(ctx: ReportContext) -> list[str]:
    """One line per re-fit of this recipe against control r = 1 runs (``V@C``): loopscale's main CPU-scale
    result, so it belongs in the verdict, not only in the variants table."""
    out = []
    for name in _controls(ctx):
        o = phi_verdict(ctx.result, name)
        est = "φ undetermined" if o.phi_undetermined else f"φ̂ = {phi_ci(o.phi, o.ci)}"
        why = f" — {NOT_IDENTIFIED} ({'; '.join(o.reasons)})" if not o.resolved else " — resolved"
        control = name.split(CONTROL_SEP, 1)[1]
        extra = "; ".join(_control_extras(o))
        line = f"the looped runs against the r = 1 runs of '{control}' ({name}, a different quantity): {est}{why}"
        out.append(line + (f"; {extra}" if extra else ""))
    return out


def _esc(s: str) -> str:
    return html.escape(str(s))


def _list(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{_esc(w)}</li>" for w in items) + "</ul>"


def render_html(ctx: ReportContext, panels: list[Panel], top_tables: list[Table], end_tables: list[Table]) -> str:
    h = headline(ctx)
    title = f"loopscale report: {h['label']}"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title><style>{CSS}</style></head><body><main>",
        '<header id="top"><h1>How much is one recurrence worth?</h1>',
        f'<p class="sub">loopscale report · joint law L = E + A (N_once + r<sup>φ</sup> N_rec)<sup>−α</sup> + '
        f"B D<sup>−β</sup> · recipe <b>{_esc(ctx.variant)}</b> · runs: {_esc(ctx.inputs.runs.source)}</p></header>",
        f'<section id="headline" class="verdict{"" if h["resolved"] else " bad"}">',
        f'<p class="label">{_esc(h["label"])}</p>',
    ]
    if h["estimate"]:
        out.append(f'<p class="estimate">{_esc(h["estimate"])}</p>')
    if h["method"]:
        out.append(f'<p class="method">{_esc(h["method"])}</p>')
    if h["reasons"]:
        out.append('<p class="why"><b>Why not resolved</b> (do not quote φ from these runs):</p>' + _list(h["reasons"]))
    for c in h["controls"]:
        out.append(f'<p class="control">{_esc(c)}</p>')
    if h["delta_phi"]:
        out.append(f'<p class="dphi-head"><b>Δφ per technique</b> ({_esc(DPHI_NOTE)}):</p>')
        out.append('<ul class="dphi">' + "".join(f"<li>{_esc(d)}</li>" for d in h["delta_phi"]) + "</ul>")
    out.append(f'<p class="note">{_esc(h["paper"])}</p></section>')
    out.append(
        '<section id="plain" class="plain"><h2>In plain words</h2>'
        + "".join(f"<p>{_esc(line)}</p>" for line in h["plain"])
        + "</section>"
    )
    if h["limits"]:
        out.append(
            '<section id="limits" class="warnings"><h2>What limits this fit</h2>' + _list(h["limits"]) + "</section>"
        )
    if h["control"] or h["control_limits"]:
        out.append(
            '<section id="control" class="plain"><h2>What the control measures</h2>'
            + "".join(f"<p>{_esc(line)}</p>" for line in h["control"])
            + (
                '<div class="warnings"><b>What limits the control re-fit</b>' + _list(h["control_limits"]) + "</div>"
                if h["control_limits"]
                else ""
            )
            + "</section>"
        )
    facts = []
    if h["gaps"]:
        facts.append("<b>loss gap to r = 1 at matched compute (law):</b> " + _esc("; ".join(h["gaps"])) + " nats")
    if h["emp_gaps"]:
        facts.append("<b>loss gap (empirical, per cell):</b> " + _esc("; ".join(h["emp_gaps"])) + " nats")
    if facts:
        out.append('<section id="facts"><div class="facts">' + "".join(f"<div>{f}</div>" for f in facts) + "</div>")
        out.append("</section>")
    for t in top_tables:
        out.append(t.html())
    out.append(
        '<nav id="contents"><b>Figures</b><ol>'
        + "".join(
            f'<li><a href="#fig-{p.name}">{_esc(p.title)}</a>' + (" — not evaluated" if p.png is None else "") + "</li>"
            for p in panels
        )
        + "</ol></nav>"
    )
    for i, p in enumerate(panels, start=1):
        out.append(f'<section id="fig-{p.name}" class="panel"><h2>{i}. {_esc(p.title)}</h2>')
        out.append(f'<p class="how">{_esc(p.how_to_read)}</p>')
        if p.png is None:
            out.append(f'<div class="missing">{_esc(p.missing)}</div>')
        else:
            b64 = base64.b64encode(p.png).decode("ascii")
            w = round(int.from_bytes(p.png[16:20], "big") / PNG_DPI * CSS_PX_PER_IN)  # PNG IHDR width
            links = " · ".join(f'<a href="{_esc(f)}">{_esc(f.rsplit(".", 1)[-1].upper())}</a>' for f in p.files)
            out.append(
                f'<figure><img id="img-{p.name}" src="data:image/png;base64,{b64}" width="{w}" '
                f'alt="{_esc(p.title)}"><figcaption>Figure {i}. {_esc(p.title)}. Files: {links}</figcaption>'
                "</figure>"
            )
        if p.lead:
            out.append(f'<div class="quote"><b>{_esc(p.lead_title)}</b>' + _list(p.lead) + "</div>")
        for t in p.tables:
            out.append(t.html())
        if p.after:
            out.append(f'<div class="note"><b>{_esc(p.after_title)}</b>' + _list(p.after) + "</div>")
        for t in p.details:
            out.append(f"<details><summary>{_esc(t.title)} ({len(t.rows)} rows)</summary>{t.html()}</details>")
        out.append("</section>")
    if end_tables:
        out.append('<section id="provenance"><h2>Inputs and provenance</h2>')
        out += [t.html() for t in end_tables]
        out.append("</section>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"


def render_markdown(ctx: ReportContext, panels: list[Panel], top_tables: list[Table], end_tables: list[Table]) -> str:
    h = headline(ctx)
    out = ["# loopscale report: how much is one recurrence worth?", ""]
    out.append(f"Recipe **{ctx.variant}**; runs: `{ctx.inputs.runs.source}`; fit: `{ctx.inputs.fit_source}`.")
    out.append("")
    out.append(f"## {h['label']}" if h["resolved"] else f"## ⚠ {NOT_IDENTIFIED}")
    out.append("")
    if h["estimate"]:
        out += [h["estimate"], ""]
    if h["method"]:
        out += [f"_{h['method']}_", ""]
    if h["reasons"]:
        out += ["**Why not resolved** (do not quote φ from these runs):", ""] + [f"- {r}" for r in h["reasons"]]
        out.append("")
    out += [f"- {c}" for c in h["controls"]]
    if h["delta_phi"]:
        out += ["", f"**Δφ per technique** ({DPHI_NOTE}):", ""]
        out += [f"- {d}" for d in h["delta_phi"]]
    out += ["", f"_{h['paper']}_", "", "## In plain words", ""]
    for line in h["plain"]:
        out += [line, ""]
    if h["limits"]:
        out += ["## What limits this fit", ""] + [f"- {w}" for w in h["limits"]] + [""]
    if h["control"] or h["control_limits"]:
        out += ["## What the control measures", ""]
        for line in h["control"]:
            out += [line, ""]
        if h["control_limits"]:
            out += ["**What limits the control re-fit**", ""] + [f"- {w}" for w in h["control_limits"]] + [""]
    if h["gaps"]:
        out.append("- loss gap to r = 1 at matched compute (law): " + "; ".join(h["gaps"]) + " nats")
    if h["emp_gaps"]:
        out.append("- loss gap (empirical, per cell): " + "; ".join(h["emp_gaps"]) + " nats")
    for t in top_tables:
        out += ["", t.markdown()]
    for i, p in enumerate(panels, start=1):
        out += ["", f"## {i}. {p.title}", "", p.how_to_read, ""]
        if p.png is None:
            out.append(f"**{p.missing}**")
        else:
            png = next((f for f in p.files if f.endswith(".png")), p.files[0])
            others = ", ".join(f"[{f.rsplit('.', 1)[-1].upper()}]({f})" for f in p.files)
            out += [f"![{p.title}]({png})", "", f"Files: {others}"]
        if p.lead:
            out += ["", f"**{p.lead_title}**", ""] + [f"- {line}" for line in p.lead]
        for t in p.tables:
            out += ["", t.markdown()]
        if p.after:
            out += ["", f"**{p.after_title}**", ""] + [f"- {line}" for line in p.after]
        for t in p.details:
            out += ["", t.markdown()]
    for t in end_tables:
        out += ["", t.markdown()]
    return "\n".join(out) + "\n"
