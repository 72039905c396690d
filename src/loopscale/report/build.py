"""``make_report``: runs (+ fit file, + axes table) in, a folder with the report out.

    OUT/index.html        self-contained page (figures embedded as PNG, inline CSS, no scripts)
    OUT/summary.md        headline and tables in Markdown, figures linked
    OUT/headline.json     the plain headline and every variant's phi verdict, for scripts
    OUT/figures/*.png|svg|pdf
    OUT/fit.json          only when the report ran the fit itself

Every file is written atomically (loopscale.io), so a crash never leaves a half page.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from loopscale.fit.result import DeltaPhi, Inference, Test
from loopscale.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from loopscale.numbers import interval_method
from loopscale.report import figures, tables
from loopscale.report.context import ReportContext
from loopscale.report.honesty import delta_phi_quote
from loopscale.report.inputs import load_inputs
from loopscale.report.render import HOW_TO_READ, PNG_DPI, Panel, render_html, render_markdown

FORMATS: tuple[str, ...] = ("png", "svg", "pdf")


def save_figure(fig: Figure, folder: Path, name: str, formats: tuple[str, ...] = FORMATS) -> dict[str, bytes]:
    """Write ``name.{png,svg,pdf}`` atomically; return the bytes per format (PNG for embedding).

    The first format runs the constrained layout; the layout is then frozen, so the other formats
    reuse it (the layout is most of the drawing time) and all three files show the same picture.
    """
    out: dict[str, bytes] = {}
    for fmt in formats:
        buf = io.BytesIO()
        meta: dict[str, Any] = {"svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}.get(fmt, {})
        fig.savefig(buf, format=fmt, dpi=PNG_DPI if fmt == "png" else None, metadata=meta or None, facecolor="white")
        fig.set_layout_engine("none")
        data = buf.getvalue()
        atomic_write_bytes(folder / f"{name}.{fmt}", data)
        out[fmt] = data
    return out


def _missing_text(ctx: ReportContext, name: str) -> str:
    if ctx.inputs.axes is None:
        return (
            "not evaluated: no axes table (run `loopscale eval`, or put axes.csv in the sweep dir, or pass --axes FILE)"
        )
    if name == "test_time":
        return "not evaluated: the axes table has no test-time rows (r_eval ≠ r)"
    return f"not evaluated: the axes table has no rows for recipe {ctx.variant} with r_eval = r"


def build_panels(
    ctx: ReportContext, out_dir: Path, formats: tuple[str, ...] = FORMATS, progress: Callable[[str], None] | None = None
) -> list[Panel]:
    say = progress or (lambda _msg: None)
    fig_dir = out_dir / "figures"
    panels = []
    tabs = {
        "frontier": [tables.loss_gap_table(ctx)],
        "parity": [tables.checks_table(ctx)],
        "phi": [tables.delta_phi_table(ctx)],
        "allocation": [],
        "axes": [tables.axes_table(ctx)],
        "test_time": [tables.test_time_table(ctx)],
    }
    details: dict[str, list[tables.Table | None]] = {
        "equivalence": [tables.equivalence_table(ctx)],
        "allocation": [tables.allocation_table(ctx)],
    }
    for name, title, fn in figures.FIGURES:
        say(f"figure: {name}")
        fig = fn(ctx)
        panel = Panel(name, title, HOW_TO_READ[name])
        if fig is None:
            panel.missing = _missing_text(ctx, name)
        else:
            data = save_figure(fig, fig_dir, name, formats)
            panel.png = data.get("png")
            panel.files = [f"figures/{name}.{fmt}" for fmt in formats]
        panel.tables = [t for t in tabs.get(name, []) if t is not None]
        panel.details = [t for t in details.get(name, []) if t is not None]
        if name == "phi" and panel.tables and ctx.result.delta_phi:
            panel.lead_title = "Δφ per technique: the leading reading, its test, the loss on the same runs"
            panel.lead = [delta_phi_quote(d) for d in ctx.result.delta_phi]
            panel.after = tables.leading_reasons(ctx)
            panel.after_title = "Why each leading reading leads"
        panels.append(panel)
    return panels


@dataclass(frozen=True)
class Report:
    """What ``write_report`` wrote: the page, the context every part of it read, and headline.json's record."""

    index: Path
    ctx: ReportContext
    headline: dict[str, Any]


def make_report(
    runs: Any,
    out_dir: str | Path,
    fit: str | Path | dict[str, Any] | None = None,
    axes: str | Path | pd.DataFrame | None = None,
    bootstrap: int | None = None,
    lr_draws: int | None = None,
    *,
    restarts: int | None = None,
    formats: tuple[str, ...] = FORMATS,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write the report for ``runs`` into ``out_dir``; returns the path of ``index.html`` (``write_report``)."""
    return write_report(
        runs, out_dir, fit, axes, bootstrap, lr_draws, restarts=restarts, formats=formats, progress=progress
    ).index


def write_report(
    runs: Any,
    out_dir: str | Path,
    fit: str | Path | dict[str, Any] | None = None,
    axes: str | Path | pd.DataFrame | None = None,
    bootstrap: int | None = None,
    lr_draws: int | None = None,
    *,
    restarts: int | None = None,
    formats: tuple[str, ...] = FORMATS,
    progress: Callable[[str], None] | None = None,
    headline_extra: Callable[[ReportContext], dict[str, Any]] | None = None,
) -> Report:
    """Write the report for ``runs`` into ``out_dir``, building its context once.

    runs       a runs table (CSV/Parquet path, sweep dir, DataFrame or RunsTable)
    fit        a fit file (path or dict from ``fit_runs``); None: fit now (saved as OUT/fit.json)
    axes       the axes table (path or DataFrame); None: ``axes.csv`` in the sweep dir, if any
    bootstrap  resamples when the report fits (default: the paper's 200); ignored with ``fit``
    lr_draws   wild-bootstrap tables of the interval and tests when the report fits (default 2000)
    restarts   random starts when the report fits (default: the paper's 500)
    headline_extra  more fields for headline.json, from the same context (``loopscale demo`` adds its numbers)
    """
    if "png" not in formats:
        raise ValueError("formats must include 'png' (the page embeds the PNGs)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = load_inputs(
        runs, out, fit=fit, axes=axes, bootstrap=bootstrap, lr_draws=lr_draws, restarts=restarts, progress=progress
    )
    ctx = ReportContext.build(inputs)
    panels = build_panels(ctx, out, formats, progress)
    top = [tables.coefficients_table(ctx)]
    end = [tables.inputs_table(ctx)]
    atomic_write_text(out / "summary.md", render_markdown(ctx, panels, top, end))
    index = out / "index.html"
    atomic_write_text(index, render_html(ctx, panels, top, end))
    headline = {**headline_record(ctx, index), **(headline_extra(ctx) if headline_extra else {})}
    atomic_write_json(out / "headline.json", headline)
    return Report(index, ctx, headline)


def headline_record(ctx: ReportContext, index: Path) -> dict[str, Any]:
    """``headline.json``: the plain sentences of summary.md and index.html, every variant's φ verdict with its
    quoted interval and that interval's method, and every technique's Δφ by its leading reading, for scripts that
    read a report. ``loopscale demo`` adds its loss gaps and axes through ``write_report(headline_extra=...)``, so
    the report's headline.json and the demo's are one record."""
    from loopscale.report.plain import plain_headline

    def one(v: Any) -> dict[str, Any]:
        return {
            "phi": v.phi,
            "phi_ci": list(v.ci) if v.ci else None,
            "ci_level": v.ci_level,
            "ci_method": interval_method(v.method) if v.ci else None,
            "resolved": v.resolved,
            "verdict": v.label,
            "reasons": v.reasons,
            "caveats": v.caveats,
            "claims": v.claims,
            "inference": brief_inference(ctx.result.variant(v.variant).inference),
        }

    return {
        "plain": plain_headline(ctx),
        "reference_variant": ctx.variant,
        **one(ctx.verdict),
        "variants": {name: one(v) for name, v in ctx.verdicts.items() if name != ctx.variant},
        "delta_phi": [delta_phi_record(d) for d in ctx.result.delta_phi],
        "report": str(index),
    }


def delta_phi_record(d: DeltaPhi) -> dict[str, Any]:
    """One technique's Δφ as headline.json states it: the leading reading (estimate, interval, test) and its
    sentence; the other readings stay in the fit file, each under its own method."""
    lead, inf = d.leading, d.inference
    test = (inf.zero if inf is not None else None) or Test()
    if lead is not None:
        reading, estimate, ci, p, rejected = lead.reading, lead.estimate, lead.ci or d.ci, lead.p, lead.rejected
    else:
        reading = "separate fits" if inf is not None else "block bootstrap percentile"
        estimate = inf.estimate if inf is not None and "estimate" in inf.model_fields_set else d.delta_phi
        ci, p, rejected = d.ci, test.p, test.rejected
    return {
        "variant": d.variant,
        "reference": d.reference,
        "reading": reading,
        "estimate": estimate,
        "ci": ci,
        "p": p,
        "rejected": rejected,
        "why_it_leads": lead.reason if lead is not None else None,
        "sentence": delta_phi_quote(d),
        "loss_gap": d.loss_gap.to_dict() if d.loss_gap is not None else None,
    }


#: what headline.json leaves out of a variant's inference record: the profile's grid and the null draws
_BRIEF: dict[str, Any] = {
    "profile": True,
    "null": {"stat"},
    "paired_delta_phi": {"shared_law": {"profile"}, "separate_laws": {"profile"}},
}


def brief_inference(inference: Inference | None) -> dict[str, Any] | None:
    """A variant's inference record without the profile's grid and the null draws (the numbers every sentence
    uses)."""
    return None if inference is None else inference.to_dict(exclude=_BRIEF)
