"""The report's pages: ``index.html`` (self-contained: figures as base64 PNG, inline CSS, no scripts, no
network) and ``summary.md`` (the same headline and tables, figures linked)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Any

from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI
from loopscale.fit.table import CONTROL_SEP
from loopscale.numbers import MISSING, interval, num, phi_ci
from loopscale.report.context import ReportContext
from loopscale.report.honesty import NOT_IDENTIFIED, delta_phi_reading, loss_gap_reading, phi_verdict
from loopscale.report.plain import plain_headline
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
        "Left: φ from the block bootstrap over (budget, r) cells — the histogram of the refits, the "
        "percentile CI (shaded) and the point estimate (black). φ = 0: a repeat adds no capacity; φ = 1: a "
        "repeat is worth a unique block. Middle: the restricted fits with φ fixed to 0 and 1 against the "
        "free fit (lower RMSE is better). Right (with probes): φ per recipe with its CI and Δφ to the "
        "reference from paired resamples."
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
.facts { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(300px, 100%), 1fr)); gap: 6px 28px;
         margin: 10px 0; }
.facts div { padding: 2px 0; border-bottom: 1px dotted var(--line); }
.warnings { background: var(--warn-bg); border-left: 4px solid #e69f00; padding: 8px 14px; margin: 14px 0; }
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


# ---- the headline ----------------------------------------------------------------------------------
def headline(ctx: ReportContext) -> dict[str, Any]:
    """Everything the top of the page (and of summary.md) says, as text."""
    v = ctx.verdict
    p = ctx.variant_fit.params.as_dict()
    cis = ctx.variant_fit.bootstrap.ci
    facts = []
    if not v.resolved and v.phi is not None:
        facts.append(f"point estimate φ̂ = {phi_ci(v.phi, v.ci)} — shown for the record, not as a finding")
    for key, name in (("alpha", "α"), ("beta", "β"), ("E", "E"), ("A", "A"), ("B", "B")):
        ci = interval(cis.get(key))
        facts.append(f"{name} = {num(p[key])}" + ("" if ci == MISSING else f" {ci}"))
    vf = ctx.variant_fit
    m = vf.metrics
    facts.append(f"R² = {m.r2:.4f} (raw nats), RMSE {m.rmse:.4f} nats/token, {m.n_runs} runs")
    restricted = vf.restricted
    if restricted:
        facts.append(
            "restricted fits: "
            + ", ".join(f"{k.replace('phi', 'φ')} R² = {x['r2']:.4f}" for k, x in restricted.items())
            + f" (free: {m.r2:.4f})"
        )
    gaps = []
    fr = ctx.frontier
    if not fr.empty and len(ctx.rs) > 1:
        for r in ctx.rs:
            g = fr[fr["r"] == r]
            if r != 1 and len(g):
                gaps.append(f"r = {r}: {g['gap_to_r1'].min():+.3f} to {g['gap_to_r1'].max():+.3f}")
    emp_gaps = []
    emp = ctx.optima
    if not emp.empty:
        for r in ctx.rs:
            e = emp[(emp["r"] == r) & emp["gap_to_r1"].notna()]
            if r != 1 and len(e):
                emp_gaps.append(f"r = {r}: {e['gap_to_r1'].min():+.3f} to {e['gap_to_r1'].max():+.3f}")
    dphi = [
        delta_phi_reading(d)
        + f" ({d['variant']} − {d['reference']})"
        + (f"; {gap}" if (gap := loss_gap_reading(d)) else "")
        for d in ctx.fit.get("delta_phi") or []
    ]
    warnings = list(dict.fromkeys([*ctx.notes, *v.caveats, *(ctx.fit.get("warnings") or [])]))
    no_checks: dict[str, Any] = {}
    hs = (vf.checks or no_checks).get("half_split") or {}
    if hs.get("phi_difference") is not None and v.resolved and abs(hs["phi_difference"]) > 0.2:
        warnings.append(
            f"φ moves by {hs['phi_difference']:+.2f} between the lower and upper half of the budgets: "
            "the estimate depends on scale"
        )
    return {
        "plain": plain_headline(ctx),
        "label": v.label,
        "resolved": v.resolved,
        "reasons": v.reasons,
        "controls": control_refits(ctx),
        "variant": ctx.variant,
        "facts": facts,
        "gaps": gaps,
        "emp_gaps": emp_gaps,
        "delta_phi": dphi,
        "warnings": warnings,
        "paper": (
            "for reference, the paper (116 runs, 4.64e17–2.15e19 FLOPs): φ = "
            + phi_ci(PAPER_COEFFICIENTS["phi"], PAPER_PHI_CI, digits=2)
        ),
    }


def control_refits(ctx: ReportContext) -> list[str]:
    """One line per re-fit of this recipe against control r = 1 runs (``V@C``): loopscale's main CPU-scale
    result, so it belongs beside the headline, not only in the variants table."""
    out = []
    for name in ctx.fit.get("variants") or {}:
        if name.startswith(f"{ctx.variant}{CONTROL_SEP}"):
            o = phi_verdict(ctx.fit, name)
            est = "φ undetermined" if o.phi_undetermined else f"φ̂ = {phi_ci(o.phi, o.ci)}"
            why = f" — {NOT_IDENTIFIED} ({'; '.join(o.reasons)})" if not o.resolved else " — resolved"
            control = name.split(CONTROL_SEP, 1)[1]
            extra = "; ".join(c for c in o.caveats if c.startswith(("the CI", "φ =")))
            line = f"the looped runs against the r = 1 runs of '{control}' ({name}): {est}{why}"
            out.append(line + (f"; {extra}" if extra else ""))
    return out


def _esc(s: str) -> str:
    return html.escape(str(s))


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
        '<section id="plain" class="plain">' + "".join(f"<p>{_esc(line)}</p>" for line in h["plain"]) + "</section>",
        f'<section id="headline" class="verdict{"" if h["resolved"] else " bad"}">',
        f'<p class="label">{_esc(h["label"])}</p>',
    ]
    if h["reasons"]:
        out.append("<p><b>Why:</b></p><ul>" + "".join(f"<li>{_esc(r)}</li>" for r in h["reasons"]) + "</ul>")
        out.append("<p>The figures and numbers below describe these runs; do not quote φ from them.</p>")
    for c in h["controls"]:
        out.append(f'<p class="control">{_esc(c)}</p>')
    out.append(f'<p class="note">{_esc(h["paper"])}</p></section>')
    out.append('<section id="facts"><div class="facts">' + "".join(f"<div>{_esc(f)}</div>" for f in h["facts"]))
    if h["gaps"]:
        out.append(
            "<div><b>loss gap to r = 1 at matched compute (law):</b> " + _esc("; ".join(h["gaps"])) + " nats</div>"
        )
    if h["emp_gaps"]:
        out.append("<div><b>loss gap (empirical, per cell):</b> " + _esc("; ".join(h["emp_gaps"])) + " nats</div>")
    for d in h["delta_phi"]:
        out.append(f"<div><b>{_esc(d)}</b></div>")
    out.append("</div></section>")
    if h["warnings"]:
        out.append(
            '<section id="warnings" class="warnings"><b>Warnings</b><ul>'
            + "".join(f"<li>{_esc(w)}</li>" for w in h["warnings"])
            + "</ul></section>"
        )
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
        for t in p.tables:
            out.append(t.html())
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
    for line in h["plain"]:
        out += [line, ""]
    if h["resolved"]:
        out.append(f"## {h['label']}")
    else:
        out.append(f"## ⚠ {NOT_IDENTIFIED}")
        out.append("")
        out.append("**Why:**")
        out += [f"- {r}" for r in h["reasons"]]
        out += ["", "The figures and numbers below describe these runs; do not quote φ from them."]
    out += [""] + [f"- {c}" for c in h["controls"]]
    out += ["", f"_{h['paper']}_", ""]
    out += [f"- {f}" for f in h["facts"]]
    if h["gaps"]:
        out.append("- loss gap to r = 1 at matched compute (law): " + "; ".join(h["gaps"]) + " nats")
    if h["emp_gaps"]:
        out.append("- loss gap (empirical, per cell): " + "; ".join(h["emp_gaps"]) + " nats")
    out += [f"- **{d}**" for d in h["delta_phi"]]
    if h["warnings"]:
        out += ["", "**Warnings**", ""] + [f"- {w}" for w in h["warnings"]]
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
        for t in [*p.tables, *p.details]:
            out += ["", t.markdown()]
    for t in end_tables:
        out += ["", t.markdown()]
    return "\n".join(out) + "\n"
