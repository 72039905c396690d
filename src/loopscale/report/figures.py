"""The report's figures: one function per figure, each taking a ReportContext and returning a Figure.

matplotlib's object-oriented API only (``matplotlib.figure.Figure``, no pyplot): no global state, no
GUI backend, nothing to close, safe inside a notebook or a server. Every function applies the
report's style (``style.RC``) itself, so it can be called alone::

    ctx = ReportContext.build(load_inputs("runs.csv", out_dir, fit="fit.json"))
    fig_isoflop(ctx).savefig("isoflop.pdf")

Colours, markers and line styles per r come from ``ctx.palette``; axis labels with units from
``style``. What each figure shows and how to read it: docs/report.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure
from matplotlib.gridspec import GridSpec
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from loopscale.fit.allocation import law_frontier
from loopscale.fit.inference.verdict import finite_or_none
from loopscale.fit.result import Metrics, SubFit, VariantFit
from loopscale.numbers import count, flops
from loopscale.report import style
from loopscale.report.context import ReportContext
from loopscale.report.data import axes_scores, axis_order, equivalence_ratios, tt_scores
from loopscale.report.inputs import AXIS_TITLES
from loopscale.report.style import FULL_WIDTH, r_label

NOT_ID_COLOUR = "#B00020"

_P = ParamSpec("_P")
_F = TypeVar("_F", bound="Figure | None")


def styled(fn: Callable[_P, _F]) -> Callable[_P, _F]:
    """Create the figure inside the report's rc settings."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _F:
        with matplotlib.rc_context(style.RC):
            return fn(*args, **kwargs)

    return wrapper


# ---- small helpers ----------------------------------------------------------------------------
LEGEND_FILL = 0.97  # a shared legend may take this share of the figure's width (the rest: margins)


def _strip_height(rows: int) -> float:
    """Inches of the legend strip for ``rows`` rows of entries (0: no strip)."""
    return 0.22 * rows + 0.1 if rows else 0.0


@dataclass
class Grid:
    """A figure of panels, with an optional strip below them for a shared legend.

    The legend lives in its own subfigure so that constrained layout never lets it collide with the
    shared axis labels (``panels.supxlabel``) or the title.
    """

    fig: Figure
    axs: list[Axes]
    panels: Any  # the (sub)figure holding the axes: supxlabel/supylabel go here
    strip: Any | None  # the subfigure for the legend, or None
    gridspec: GridSpec | None = None  # panels above, strip below: the strip grows when the legend needs rows
    rows: int = 0  # legend rows the strip has room for

    def legend(self, handles: list[Any], ncols: int) -> Legend:
        """The shared legend, with at most ``ncols`` columns and as many as fit the figure's width.

        A legend wider than the figure is cut off in the saved files (the iso-FLOP legend with 3 r values
        did that), so columns are dropped until it fits and the strip grows by the rows that adds.
        """
        kw: dict[str, Any] = {"handles": handles, "columnspacing": 1.0, "handletextpad": 0.5}
        loc: Literal["center", "outside lower center"]
        target, loc = (self.strip, "center") if self.strip is not None else (self.fig, "outside lower center")
        renderer = _renderer(self.fig)
        n = max(1, min(ncols, len(handles)))
        while True:
            leg = target.legend(loc=loc, ncols=n, **kw)
            if n == 1 or leg.get_window_extent(renderer).width <= LEGEND_FILL * self.fig.bbox.width:
                break
            leg.remove()
            n -= 1
        self._grow_strip(math.ceil(len(handles) / n))
        return leg

    def _grow_strip(self, rows: int) -> None:
        """Make the strip tall enough for ``rows`` legend rows; the panels keep their height."""
        if self.strip is None or self.gridspec is None or rows <= self.rows:
            return
        w, h = self.fig.get_size_inches()
        body = h - _strip_height(self.rows)
        self.fig.set_size_inches(w, body + _strip_height(rows))
        self.gridspec.set_height_ratios([body, _strip_height(rows)])
        self.rows = rows

    def labels(self, x: str | None = None, y: str | None = None) -> None:
        if x:
            self.panels.supxlabel(x, fontsize=9.5)
        if y:
            self.panels.supylabel(y, fontsize=9.5)


def _renderer(fig: Figure) -> Any:
    """An Agg renderer at the figure's dpi, to measure text before the figure is saved."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    return canvas.get_renderer()


def _grid(n: int, ncols: int, panel_h: float, width: float = FULL_WIDTH, legend_rows: int = 0, **kw: Any) -> Grid:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    body = panel_h * nrows + 0.5
    strip = _strip_height(legend_rows)
    fig = Figure(figsize=(width, body + strip), layout="constrained")
    gs = None
    panels: Figure | SubFigure
    bottom: SubFigure | None
    if legend_rows:  # as fig.subfigures(2, 1), keeping the grid so that the strip can grow
        gs = GridSpec(2, 1, figure=fig, height_ratios=[body, strip], left=0, right=1, bottom=0, top=1)
        panels, bottom = fig.add_subfigure(gs[0, 0]), fig.add_subfigure(gs[1, 0])
    else:
        panels, bottom = fig, None
    axs = panels.subplots(nrows, ncols, squeeze=False, **kw).ravel().tolist()
    for ax in axs[n:]:
        ax.set_visible(False)
    return Grid(fig, axs[:n], panels, bottom, gs, legend_rows)


def _log_axis(ax: Axes, which: str = "x", fmt: Callable[[float], str] | None = None) -> None:
    """Log axis with tick labels at 1-2-5 steps (1-10 steps beyond 2.5 decades); call after plotting."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    lo, hi = ax.get_xlim() if which == "x" else ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=30))
    axis.set_minor_locator(NullLocator())  # the 1-2-5 majors carry the grid; minor ticks cost draw time
    label = fmt or (lambda v: count(v, trim=True))  # ticks: "1M", not "1.00M"
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: label(v)))
    axis.set_minor_formatter(NullFormatter())


def _count_axis(ax: Axes, which: str = "x") -> None:
    """Log axis of parameter counts: 20M, 50M, 100M, ..."""
    _log_axis(ax, which)


def _budget_axis(ax: Axes, budgets: list[float], which: str = "x") -> None:
    """Log axis of FLOPs with a tick at every budget of the sweep (4.64e17, 1e18, ...)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    if budgets:
        axis.set_major_locator(FixedLocator(budgets))
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: flops(v)))


def _flops_x(axes: tuple[Axes, ...], budgets: list[float]) -> None:
    """Budget panels share one x axis style: log FLOPs, a tick per budget, rotated labels."""
    for a in axes:
        _budget_axis(a, budgets)
        a.set_xlabel(style.FLOPS)
        a.tick_params(axis="x", labelrotation=30)


def _frontier_panels(
    ctx: ReportContext, height: float, empty: str
) -> tuple[Grid, np.ndarray | None, dict[int, dict[str, Any]]]:
    """Two panels, dense budgets and the law's frontier curves per r (no budgets: C is None, panels say so)."""
    grid = _grid(2, 2, height, legend_rows=2)
    if not ctx.budgets:
        _empty(grid.axs[0], empty)
        _empty(grid.axs[1], "")
        return grid, None, {}
    C = _dense_budgets(ctx.budgets)
    return grid, C, _law_frontier_curves(ctx, C)


def _frontier_legend(ctx: ReportContext, grid: Grid) -> None:
    grey = "#555555"
    grid.legend(
        [
            *_r_handles(ctx, ctx.rs, line=True),
            Line2D([], [], color=grey, linestyle="-", label="joint law (band: 95% CI)"),
            Line2D([], [], color=grey, marker="o", linestyle="none", label="parabola minimum"),
            Line2D(
                [],
                [],
                color=grey,
                marker="o",
                markerfacecolor="white",
                linestyle="none",
                label="open: best run (not bracketed)",
            ),
        ],
        4,
    )


def _r_handles(ctx: ReportContext, rs: list[int], *, line: bool = False) -> list[Line2D]:
    pal = ctx.palette
    out = []
    for r in rs:
        kw = pal.point(r)
        if line:
            kw = {**kw, "linestyle": pal.linestyle(r)}
        out.append(Line2D([], [], label=r_label(r), **kw))
    return out


def _note(ax: Axes, text: str, *, colour: str = "#444444", size: float = 9.5) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color=colour, fontsize=size, wrap=True)


def _empty(ax: Axes, text: str) -> None:
    """Clear a panel and say why it is empty."""
    for artist in [*ax.lines, *ax.collections, *ax.patches]:
        artist.remove()
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for s in ax.spines.values():
        s.set_visible(False)
    _note(ax, text)


def _band(draws: np.ndarray | None, level: float = 0.95) -> tuple[np.ndarray, np.ndarray] | None:
    """Percentile band over the first axis of draws (S, K); None if too few draws."""
    if draws is None or len(draws) < 5:
        return None
    a = (1 - level) / 2 * 100
    with np.errstate(invalid="ignore"):
        return np.nanpercentile(draws, a, axis=0), np.nanpercentile(draws, 100 - a, axis=0)


def _cell_curve(cell: pd.DataFrame, n: int = 80, pad: float = 0.15) -> dict[str, np.ndarray] | None:
    """N_once, N_rec, D along the cell's model family, as smooth functions of log N.

    Within one (budget, r) cell the runs differ only in width: N_once/N and N_rec/N are constant for
    the paper's accounting (every term is 12 d^2 or 2 d^2) and log D is a smooth function of log N
    (D = C / F(d), F quadratic in d). Interpolating through the cell's own runs makes the law's curve
    right for any runs table, whatever architecture produced it.
    """
    x = np.log(cell["N"].to_numpy(float))
    if len(np.unique(x)) < 2:
        return None
    order = np.argsort(x)
    x, logD = x[order], np.log(cell["D"].to_numpy(float))[order]
    f_once = (cell["N_once"] / cell["N"]).to_numpy(float)[order]
    deg = min(2, len(np.unique(x)) - 1)
    cD = np.polyfit(x, logD, deg)
    span = x[-1] - x[0]
    xs = np.linspace(x[0] - pad * span, x[-1] + pad * span, n)
    N = np.exp(xs)
    once = np.interp(xs, x, f_once) * N
    return {"N": N, "N_once": once, "N_rec": N - once, "D": np.exp(np.polyval(cD, xs))}


def _dense_budgets(budgets: list[float], n: int = 40) -> np.ndarray:
    lo, hi = min(budgets), max(budgets)
    return np.exp(np.linspace(np.log(lo) - 0.15, np.log(hi) + 0.15, n))


def _law_frontier_curves(ctx: ReportContext, C: np.ndarray) -> dict[int, dict[str, Any]]:
    """Law-based frontier per r on a dense budget grid, with bootstrap bands (L, N, D/N, gap)."""
    out: dict[int, dict[str, Any]] = {}
    theta = ctx.law.theta_
    draws = ctx.draws
    base = base_draws = None
    for r in ctx.frontier_rs:
        fr = law_frontier(theta, ctx.template, C, r)
        cur: dict[str, Any] = {"L": fr["L"], "N": fr["N"], "tpp": fr["tokens_per_param"], "d": fr["d"]}
        if draws is not None and len(draws) >= 5:
            fd = law_frontier(draws, ctx.template, C, r)
            cur["L_draws"], cur["N_draws"], cur["tpp_draws"] = fd["L"], fd["N"], fd["tokens_per_param"]
        if r == 1:
            base, base_draws = fr["L"], cur.get("L_draws")
        out[r] = cur
    for r, cur in out.items():
        if base is not None and r != 1:
            cur["gap"] = cur["L"] - base
            if base_draws is not None and "L_draws" in cur:
                cur["gap_draws"] = cur["L_draws"] - base_draws
    return out


# ---- 1. iso-FLOP curves -----------------------------------------------------------------------
@styled
def fig_isoflop(ctx: ReportContext) -> Figure:
    """Loss vs N per budget (one panel each), per r: runs, the cell's parabola in log N, the law."""
    pal, df = ctx.palette, ctx.df
    if not ctx.has_budget:
        grid = _grid(1, 1, 3.2, width=FULL_WIDTH * 0.6)
        fig, (ax,) = grid.fig, grid.axs
        for r in ctx.rs:
            g = df[df["r"] == r]
            ax.plot(g["N"], g["val_loss"], **pal.point(r), label=r_label(r))
        _count_axis(ax)
        ax.set_xlabel(style.PARAMS)
        ax.set_ylabel(style.LOSS)
        ax.set_title("runs (no budget column C: no iso-FLOP grouping)")
        ax.legend()
        return fig
    budgets = ctx.budgets
    grid = _grid(len(budgets), 3, 2.3, legend_rows=2)
    fig, axs = grid.fig, grid.axs
    for ax, c in zip(axs, budgets, strict=True):
        cell_df = df[df["_C"] == c]
        for r in ctx.rs:
            cell = cell_df[cell_df["r"] == r]
            if cell.empty:
                continue
            colour = pal.colour(r)
            curve = _cell_curve(cell)
            if curve is not None:
                law = ctx.law.predict(curve["N_once"], curve["N_rec"], curve["D"], np.full(len(curve["N"]), r))
                ax.plot(curve["N"], law, color=colour, linewidth=1.5, alpha=0.85)
            x = np.log(cell["N"].to_numpy(float))
            if len(np.unique(x)) >= 3:
                c2, c1, c0 = np.polyfit(x, cell["val_loss"].to_numpy(float), 2)
                xs = np.linspace(x.min(), x.max(), 60)
                ax.plot(np.exp(xs), np.polyval([c2, c1, c0], xs), color=colour, linestyle=(0, (1, 1.2)), linewidth=1.1)
                if c2 > 0 and x.min() <= -c1 / (2 * c2) <= x.max():
                    xv = -c1 / (2 * c2)
                    ax.plot(
                        np.exp(xv),
                        np.polyval([c2, c1, c0], xv),
                        marker="|",
                        color=colour,
                        markersize=12,
                        markeredgewidth=2.0,
                        linestyle="none",
                    )
            ax.plot(cell["N"], cell["val_loss"], **pal.point(r), zorder=3)
        _count_axis(ax)
        ax.set_title(f"C = {flops(c)} FLOPs")
    grid.labels(style.PARAMS + " (log scale)", style.LOSS)
    handles = [Line2D([], [], **{**pal.point(r), "linestyle": "-"}, label=r_label(r)) for r in ctx.rs] + [
        Line2D([], [], color="#555555", linestyle="-", label=f"joint law (φ = {_phi_txt(ctx)})"),
        Line2D([], [], color="#555555", linestyle=(0, (1, 1.2)), linewidth=1.1, label="parabola in log N per cell"),
        Line2D(
            [],
            [],
            color="#555555",
            marker="|",
            markersize=12,
            markeredgewidth=2.0,
            linestyle="none",
            label="its minimum (if bracketed)",
        ),
    ]
    grid.legend(handles, 4)
    fig.suptitle("iso-FLOP curves: loss vs model size at fixed training compute", fontweight="bold")
    return fig


def _phi_txt(ctx: ReportContext) -> str:
    if ctx.law.phi_undetermined:
        return "undetermined"
    return f"{ctx.law.phi_:.2f}" + ("" if ctx.verdict.resolved else ", not resolved")


# ---- 2. compute-optimal frontier ----------------------------------------------------------------
@styled
def fig_frontier(ctx: ReportContext) -> Figure:
    """L*(C) per r (law line + band, empirical parabola minima) and the gap to r = 1 at matched compute."""
    pal = ctx.palette
    grid, C, curves = _frontier_panels(ctx, 3.1, "no budget column C:\nno compute-optimal frontier")
    fig, (ax, axg) = grid.fig, grid.axs
    if C is None:
        return fig
    emp = ctx.optima
    for r in ctx.rs:
        cur = curves.get(r)
        if cur is not None:
            ax.plot(C, cur["L"], **pal.line(r))
            band = _band(cur.get("L_draws"))
            if band is not None:
                ax.fill_between(C, *band, color=pal.colour(r), alpha=0.15, linewidth=0)
            if "gap" in cur:
                axg.plot(C, cur["gap"], **pal.line(r))
                band = _band(cur.get("gap_draws"))
                if band is not None:
                    axg.fill_between(C, *band, color=pal.colour(r), alpha=0.15, linewidth=0)
        if not emp.empty:
            e = emp[emp["r"] == r]
            for bracketed, g in e.groupby("bracketed"):
                ax.plot(g["C"], g["L"], **pal.point(r, filled=bool(bracketed)), zorder=3)
                if r != 1 and "gap_to_r1" in g:
                    axg.plot(g["C"], g["gap_to_r1"], **pal.point(r, filled=bool(bracketed)), zorder=3)
    _flops_x((ax, axg), ctx.budgets)
    ax.set_ylabel("compute-optimal " + style.LOSS)
    ax.set_title("compute-optimal frontier L*(C)")
    axg.axhline(0, color="#000000", linewidth=0.8)
    axg.set_ylabel("L*(r) − L*(r = 1) (nats/token)")
    axg.set_title("loss gap to r = 1 at matched compute")
    if not any("gap" in c for c in curves.values()) and (emp.empty or not (emp["r"] > 1).any()):
        _empty(axg, "no looped runs: no gap to r = 1")
    _frontier_legend(ctx, grid)
    return fig


# ---- 3. parity ----------------------------------------------------------------------------------
@styled
def fig_parity(ctx: ReportContext) -> Figure:
    """Predicted vs observed loss per run, coloured by r, with R^2 on raw nats."""
    pal, df = ctx.palette, ctx.df
    fig = Figure(figsize=(FULL_WIDTH * 0.55, FULL_WIDTH * 0.55), layout="constrained")
    ax = fig.add_subplot()
    lo = float(min(df["val_loss"].min(), df["pred"].min()))
    hi = float(max(df["val_loss"].max(), df["pred"].max()))
    pad = 0.04 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="#777777", linewidth=0.9, linestyle="--", zorder=1)
    rmse = ctx.variant_fit.metrics.rmse_per_r
    for r in ctx.rs:
        g = df[df["r"] == r]
        lab = r_label(r) + (f"  (RMSE {rmse[str(r)]:.3f})" if rmse.get(str(r)) is not None else "")
        ax.plot(g["pred"], g["val_loss"], **pal.point(r), alpha=0.9, label=lab, zorder=2)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_aspect("equal")
    ax.set_xlabel("predicted " + style.LOSS)
    ax.set_ylabel("observed " + style.LOSS)
    m = ctx.variant_fit.metrics
    ax.text(
        0.04,
        0.96,
        f"R² = {m.r2:.4f} (raw nats)\nRMSE = {m.rmse:.4f} nats\n{m.n_runs} runs",
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=9,
        bbox={"facecolor": "white", "edgecolor": "#bbbbbb", "boxstyle": "round,pad=0.3"},
    )
    ax.legend(loc="lower right", title="RMSE per r in nats")
    ax.set_title("joint law: predicted vs observed")
    return fig


# ---- 4. residuals -------------------------------------------------------------------------------
@styled
def fig_residuals(ctx: ReportContext) -> Figure:
    """Observed - predicted per run: one panel per r, runs grouped by budget (width order within)."""
    pal, df = ctx.palette, ctx.df
    grid = _grid(len(ctx.rs), 4 if len(ctx.rs) > 2 else len(ctx.rs), 2.7, sharey=True)
    fig, axs = grid.fig, grid.axs
    if ctx.has_budget:
        pos = {c: i for i, c in enumerate(ctx.budgets)}
        labels = [flops(c) for c in ctx.budgets]
    lim = float(np.nanmax(np.abs(df["resid"]))) * 1.15 or 0.01
    for ax, r in zip(axs, ctx.rs, strict=True):
        g = df[df["r"] == r].sort_values("N")
        rm = float(np.sqrt(np.mean(g["resid"] ** 2)))
        ax.axhspan(-rm, rm, color=pal.colour(r), alpha=0.10, linewidth=0)
        ax.axhline(0, color="#000000", linewidth=0.8)
        if ctx.has_budget:
            for c, cell in g.groupby("_C"):
                n = len(cell)
                x = pos[c] + (np.linspace(-0.28, 0.28, n) if n > 1 else np.zeros(1))
                ax.plot(x, cell["resid"], **pal.point(r), zorder=3)
                ax.plot(
                    pos[c],
                    cell["resid"].mean(),
                    marker="_",
                    color="#000000",
                    markersize=14,
                    markeredgewidth=1.6,
                    linestyle="none",
                    zorder=4,
                )
            ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", rotation_mode="anchor")
            ax.set_xlim(-0.6, len(labels) - 0.4)
        else:
            ax.plot(g["N"], g["resid"], **pal.point(r))
            _count_axis(ax)
            ax.set_xlabel(style.PARAMS)
        ax.set_title(f"{r_label(r)}\nRMSE {rm:.4f} nats")
        ax.set_ylim(-lim, lim)
    axs[0].set_ylabel("observed − predicted loss (nats/token)")
    fig.suptitle("residuals of the joint law per r and budget", fontweight="bold")
    if ctx.has_budget:
        grid.labels(style.FLOPS + "  (band: ±RMSE of r · bar: cell mean · within a budget: narrow → wide)")
    return fig


# ---- 5. phi: bootstrap, restricted fits, Delta-phi ---------------------------------------------
def _phi_draws(rec: VariantFit) -> np.ndarray:
    d = rec.bootstrap.draws_of("phi")
    finite: np.ndarray = d[np.isfinite(d)]
    return finite


@styled
def fig_phi(ctx: ReportContext) -> Figure:
    """phi's bootstrap with CI and estimate; phi per recipe (Delta-phi) on the 0-1 scale; restricted fits."""
    fig = Figure(figsize=(FULL_WIDTH, 2.9), layout="constrained")
    axs = fig.subplots(1, 3, width_ratios=[1.05, 1.2, 0.95])
    _phi_histogram(axs[0], ctx)
    _probe_panel(axs[1], ctx)
    _restricted_panel(axs[2], ctx)
    return fig


def _phi_histogram(ax: Axes, ctx: ReportContext) -> None:
    v = ctx.verdict
    draws = _phi_draws(ctx.variant_fit)
    ax.set_title("block bootstrap of φ, quoted interval")
    if v.phi is None:
        _empty(ax, "")
        ax.text(
            0.5,
            0.8,
            "φ undetermined:\nno looped (r > 1) runs",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            color="#444444",
        )
        _stamp(ax, 0.4)
        return
    if draws.size:
        bins = int(np.clip(np.sqrt(draws.size) * 2, 8, 40))
        ax.hist(
            draws,
            bins=bins,
            color="#a9c4e0",
            edgecolor="#2b5d8a",
            linewidth=0.6,
            label=f"{draws.size} cell resamples ({ctx.variant})",
        )
    else:
        ax.text(0.5, 0.8, "no bootstrap draws", transform=ax.transAxes, ha="center", color="#555555")
    if v.ci is not None:
        quoted = "profile likelihood" if v.method == "profile likelihood" else "percentile"
        ax.axvspan(*v.ci, color="#0072B2", alpha=0.13, linewidth=0, label=f"{v.ci_level:.0%} CI, {quoted} (quoted)")
        for end in v.ci:
            ax.axvline(end, color="#0072B2", linestyle="--", linewidth=1.1)
    secondary = ctx.variant_fit.bootstrap.ci_of("phi") if v.method == "profile likelihood" else None
    if secondary is not None and draws.size:
        for k, end in enumerate(secondary):
            ax.axvline(
                end,
                color="#555555",
                linestyle=":",
                linewidth=1.1,
                label="percentile CI (secondary)" if k == 0 else None,
            )
    ax.axvline(v.phi, color="#000000", linewidth=2.0, label=f"estimate {v.phi:.3f}")
    pts = [v.phi, *(v.ci or ()), *(secondary or ()), *draws.tolist()]
    lo, hi = min(pts), max(pts)
    pad = max(0.25 * (hi - lo), 0.02)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend
    ax.set_xlabel("φ")
    ax.set_ylabel("resamples (count)")
    ax.legend(loc="upper left", fontsize=7.5, handlelength=1.2, frameon=True, framealpha=0.85, edgecolor="none")
    if not v.resolved:
        _stamp(ax)


def _stamp(ax: Axes, y: float = 0.45) -> None:
    ax.text(
        0.5,
        y,
        "φ NOT IDENTIFIED\nAT THIS SCALE",
        transform=ax.transAxes,
        ha="center",
        va="center",
        color=NOT_ID_COLOUR,
        fontsize=11,
        fontweight="bold",
        zorder=10,
        bbox={"facecolor": "white", "edgecolor": NOT_ID_COLOUR, "alpha": 0.9, "boxstyle": "round,pad=0.3"},
    )


def _probe_panel(ax: Axes, ctx: ReportContext) -> None:
    """phi per recipe with CIs on a scale from 'a repeat adds nothing' to 'worth a unique block'.

    Delta-phi to the reference (and "not resolved") go into the row's label, where nothing can
    overlap them.
    """
    from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI

    fit = ctx.result
    dphi = {d.variant: d for d in fit.delta_phi}
    names = list(fit.variants)
    rows: list[tuple[str, float | None, Any, bool, str]] = []
    for name in names:
        vd = ctx.verdicts[name]
        label = name + (" (ref.)" if name == ctx.variant and len(names) > 1 else "")
        d = dphi.get(name)
        lead = d.leading if d is not None else None
        est = lead.estimate if lead is not None else d.delta_phi if d is not None else None
        if d is not None and est is not None:  # the leading reading's estimate with its own interval
            ci_d = (lead.ci if lead is not None else None) or d.ci or [None, None]
            label += f"\nΔφ {est:+.3f}"
            if finite_or_none(ci_d[0]) is not None:
                label += f" [{ci_d[0]:+.2f}, {ci_d[1]:+.2f}]"
            if lead is not None and lead.reading:
                label += f"\n({lead.reading})"
        if vd.phi is not None and not vd.resolved:
            label += "\nnot resolved"
        rows.append((label, vd.phi, vd.ci, vd.resolved, name))
    rows.append(("paper (for scale)", PAPER_COEFFICIENTS["phi"], PAPER_PHI_CI, True, ""))
    y = np.arange(len(rows))[::-1].astype(float)
    xs = [0.0, 1.0]
    for yi, (_label, phi, ci, ok, name) in zip(y, rows, strict=True):
        colour = "#999999" if not name else ("#000000" if name == ctx.variant else "#0072B2")
        if phi is None:
            ax.text(0.5, yi, "undetermined", va="center", ha="center", fontsize=8.5, color=NOT_ID_COLOUR)
            continue
        xs += [phi, *(ci or ())]
        if ci is not None:
            ax.plot(ci, [yi, yi], color=colour, linewidth=2.2, solid_capstyle="butt")
        ax.plot(
            phi,
            yi,
            marker="o",
            markerfacecolor=colour if ok else "white",
            color=colour,
            markersize=7,
            markeredgewidth=1.5,
            linestyle="none",
        )
    ax.set_yticks(y, [row[0] for row in rows], fontsize=8)
    for tick, row in zip(ax.get_yticklabels(), rows, strict=True):
        if row[4] and not row[3]:
            tick.set_color(NOT_ID_COLOUR)
    ax.set_ylim(y.min() - 0.6, y.max() + 0.6)
    lo, hi = min(xs), max(xs)
    ax.set_xlim(lo - 0.12 * (hi - lo), hi + 0.12 * (hi - lo))
    for ref, txt in ((0.0, "φ = 0: a repeat adds nothing"), (1.0, "φ = 1: worth a unique block")):
        ax.axvline(ref, color="#888888", linewidth=0.9, linestyle=":")
        ax.annotate(
            txt,
            (ref, 0.02),
            xycoords=("data", "axes fraction"),
            xytext=(-2, 0),
            textcoords="offset points",
            rotation=90,
            ha="right",
            va="bottom",
            fontsize=6.5,
            color="#555555",
        )
    ax.set_xlabel("φ, 95% CI (open: not resolved)")
    ax.grid(axis="y", visible=False)


def _restricted_panel(ax: Axes, ctx: ReportContext) -> None:
    """RMSE and R^2 of the free fit against the fits with phi fixed to 0 and to 1."""
    rec = ctx.variant_fit
    rows: list[tuple[str, Metrics | SubFit]] = [("free φ" if ctx.verdict.phi is not None else "no φ", rec.metrics)]
    for key, rf in rec.restricted.items():
        rows.append((key.replace("phi=", "φ = "), rf))
    rmse = [float(np.nan if m.rmse is None else m.rmse) for _, m in rows]
    y = np.arange(len(rows))[::-1]
    ax.barh(y, rmse, color=["#000000"] + ["#9a9a9a"] * (len(rows) - 1), height=0.55)
    for yi, (_, m), val in zip(y, rows, rmse, strict=True):
        ax.text(val, yi, f" R² {np.nan if m.r2 is None else m.r2:.4f}", va="center", ha="left", fontsize=8)
    ax.set_yticks(y, [n for n, _ in rows])
    ax.set_xlim(0, max(rmse) * 2.0)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("RMSE (nats/token)")
    ax.set_title("restricted fits")
    ax.grid(axis="y", visible=False)
    if len(rows) == 1:
        ax.text(
            0.5,
            0.04,
            "not run: φ undetermined or fixed",
            transform=ax.transAxes,
            ha="center",
            va="bottom",
            fontsize=7.5,
            color="#555555",
        )


# ---- 6. equivalence ------------------------------------------------------------------------------
@styled
def fig_equivalence(ctx: ReportContext) -> Figure:
    """What one unique looped parameter is worth: N_eq/N (same loss) and N_cost/N (same training FLOPs) per r."""
    pal = ctx.palette
    eq = equivalence_ratios(ctx)
    fig = Figure(figsize=(FULL_WIDTH * 0.62, 3.0), layout="constrained")
    ax = fig.add_subplot()
    if not (eq["r"] > 1).any():
        ax.set_title("what a looped model is worth")
        _empty(ax, "no looped (r > 1) runs:\nnothing to compare with r = 1")
        return fig
    x = np.arange(len(eq))
    w = 0.38
    for i, row in eq.iterrows():
        r = int(row["r"])
        c = pal.colour(r)
        if np.isfinite(row["N_eq_ratio"]):
            err = None
            if np.isfinite(row["N_eq_lo"]):
                err = [[row["N_eq_ratio"] - row["N_eq_lo"]], [row["N_eq_hi"] - row["N_eq_ratio"]]]
            ax.bar(
                x[i] - w / 2,
                row["N_eq_ratio"],
                w,
                color=c,
                edgecolor="#000000",
                linewidth=0.6,
                yerr=err,
                capsize=3,
                error_kw={"linewidth": 1.0},
            )
            top = row["N_eq_hi"] if np.isfinite(row["N_eq_hi"]) else row["N_eq_ratio"]
            ax.text(x[i] - w / 2, top, f"{row['N_eq_ratio']:.2f}×", ha="center", va="bottom", fontsize=8)
        ax.bar(x[i] + w / 2, row["N_cost_ratio"], w, color="white", edgecolor=c, hatch="///", linewidth=1.2)
        ax.text(x[i] + w / 2, row["N_cost_ratio"], f"{row['N_cost_ratio']:.2f}×", ha="center", va="bottom", fontsize=8)
    ax.axhline(1, color="#000000", linewidth=0.8)
    ax.set_xticks(x, [r_label(int(r)) for r in eq["r"]])
    ax.set_ylabel("non-looped-equivalent size / unique N")
    ax.set_title("what a looped model is worth")
    ax.grid(axis="x", visible=False)
    ax.legend(
        handles=[
            Patch(
                facecolor="#777777",
                edgecolor="#000000",
                label=r"quality: N$_\mathrm{eq}$ = N$_\mathrm{once}$ + r$^{\varphi}$ N$_\mathrm{rec}$ (95% CI)",
            ),
            Patch(
                facecolor="white",
                edgecolor="#777777",
                hatch="///",
                label=r"cost: N$_\mathrm{cost}$ = N$_\mathrm{once}$ + r N$_\mathrm{rec}$",
            ),
        ],
        loc="upper left",
    )
    ax.set_ylim(0, float(np.nanmax([eq["N_cost_ratio"].max(), eq["N_eq_hi"].max()])) * 1.25)
    return fig


# ---- 7. allocation ---------------------------------------------------------------------------------
@styled
def fig_allocation(ctx: ReportContext) -> Figure:
    """Compute-optimal size N*(C) and tokens per parameter D*/N* per r: law lines, empirical minima."""
    pal = ctx.palette
    grid, C, curves = _frontier_panels(ctx, 3.0, "no budget column C")
    fig, (axn, axt) = grid.fig, grid.axs
    if C is None:
        return fig
    emp = ctx.optima
    for r in ctx.rs:
        cur = curves.get(r)
        if cur is not None:
            axn.plot(C, cur["N"], **pal.line(r))
            axt.plot(C, cur["tpp"], **pal.line(r))
            for a, key in ((axn, "N_draws"), (axt, "tpp_draws")):
                band = _band(cur.get(key))
                if band is not None:
                    a.fill_between(C, *band, color=pal.colour(r), alpha=0.15, linewidth=0)
        if not emp.empty:
            for bracketed, g in emp[emp["r"] == r].groupby("bracketed"):
                axn.plot(g["C"], g["N"], **pal.point(r, filled=bool(bracketed)), zorder=3)
                axt.plot(g["C"], g["tokens_per_param"], **pal.point(r, filled=bool(bracketed)), zorder=3)
    _flops_x((axn, axt), ctx.budgets)
    _count_axis(axn, "y")
    axn.set_ylabel("compute-optimal " + style.PARAMS.replace("unique ", "unique\n"))
    axn.set_title("optimal model size N*(C)")
    _log_axis(axt, "y", lambda v: f"{v:g}")
    axt.set_ylabel(style.TOKENS_PER_PARAM + " at the optimum")
    axt.set_title("tokens per parameter at the optimum")
    _frontier_legend(ctx, grid)
    return fig


# ---- 8. five axes ------------------------------------------------------------------------------------
@styled
def fig_axes(ctx: ReportContext) -> Figure | None:
    """Continuation loss per axis per r (vs budget when there are several); None when not evaluated."""
    sc = axes_scores(ctx)
    if sc.empty:
        return None
    pal = ctx.palette
    names = axis_order(sc["axis"])
    budgets = sorted(c for c in sc["C"].unique() if c > 0)
    several = len(budgets) > 1
    rs = sorted(int(r) for r in sc["r"].unique())
    grid = _grid(len(names) + 1, 3, 2.25, legend_rows=1)
    fig, axs = grid.fig, grid.axs
    for ax, name in zip(axs, names, strict=False):
        g = sc[sc["axis"] == name]
        for r in rs:
            gr = g[g["r"] == r].sort_values("C")
            if gr.empty:
                continue
            if several:
                ax.plot(gr["C"], gr["loss"], **{**pal.point(r), "linestyle": pal.linestyle(r)}, label=r_label(r))
            else:
                ax.plot([rs.index(r)], gr["loss"].mean(), **pal.point(r), markersize=8, label=r_label(r))
        if several:
            _budget_axis(ax, budgets)
        else:
            ax.set_xticks(range(len(rs)), [f"r = {r}" for r in rs])
            ax.set_xlim(-0.5, len(rs) - 0.5)
            ax.margins(y=0.2)
        n_tasks = int(g["n_tasks"].max())
        ax.set_title(f"{AXIS_TITLES.get(name, name)}\n", fontsize=9.5)
        ax.text(
            0.5,
            1.02,
            f"{n_tasks} task{'s' if n_tasks != 1 else ''}, macro average",
            transform=ax.transAxes,
            ha="center",
            va="bottom",
            fontsize=7.5,
            color="#555555",
        )
    _axis_gap_panel(axs[-1], ctx, sc, names, rs)
    where = style.FLOPS if several else "trained recurrences r" + (f" at C = {flops(budgets[0])}" if budgets else "")
    grid.labels(where, style.CONT_LOSS)
    grid.legend(_r_handles(ctx, rs, line=several), len(rs))
    fig.suptitle("five evaluation axes (compute-optimal run per cell; lower is better)", fontweight="bold")
    return fig


def _axis_gap_panel(ax: Axes, ctx: ReportContext, sc: pd.DataFrame, names: list[str], rs: list[int]) -> None:
    """Per axis: loss of each r > 1 minus r = 1 at the largest budget (which axes close the gap)."""
    c = float(sc["C"].max())
    g = sc[sc["C"] == c].set_index(["axis", "r"])["loss"]
    looped = [r for r in rs if r != 1]
    ax.set_title("gap to r = 1 per axis\n", fontsize=9.5)
    ax.text(
        0.5,
        1.02,
        f"C = {flops(c)}" if c > 0 else "all runs",
        transform=ax.transAxes,
        ha="center",
        va="bottom",
        fontsize=7.5,
        color="#555555",
    )
    if 1 not in rs or not looped:
        _empty(ax, "needs r = 1 and r > 1")
        return
    w = 0.8 / len(looped)
    for j, r in enumerate(looped):
        vals = [g.get((n, r), np.nan) - g.get((n, 1), np.nan) for n in names]
        ax.bar(
            np.arange(len(names)) - 0.4 + w * (j + 0.5),
            vals,
            w,
            color=ctx.palette.colour(r),
            edgecolor="#000000",
            linewidth=0.5,
        )
    ax.axhline(0, color="#000000", linewidth=0.8)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", rotation_mode="anchor")
    ax.set_ylabel("Δ loss vs r = 1 (nats)", fontsize=8.5)
    ax.grid(axis="x", visible=False)


# ---- 9. test-time recurrence --------------------------------------------------------------------------
@styled
def fig_test_time(ctx: ReportContext) -> Figure | None:
    """Loss vs the number of recurrences run at test time, per trained r (one panel per axis + mean)."""
    sc = tt_scores(ctx)
    if sc is None:
        return None
    c = float(sc["C"].iloc[0])
    pal = ctx.palette
    names = axis_order(sc["axis"])
    mean = sc.groupby(["r", "r_eval"], as_index=False)["loss"].mean().assign(axis="mean of the axes")
    panels = [("mean of the axes", mean)] + [(n, sc[sc["axis"] == n]) for n in names]
    grid = _grid(len(panels), 3, 2.3, legend_rows=2)
    fig, axs = grid.fig, grid.axs
    rs = sorted(sc["r"].unique())
    r_evals = sorted(sc["r_eval"].unique())
    for ax, (name, g) in zip(axs, panels, strict=True):
        for r in rs:
            gr = g[g["r"] == r].sort_values("r_eval")
            if gr.empty:
                continue
            ax.plot(
                gr["r_eval"],
                gr["loss"],
                color=pal.colour(r),
                linestyle=pal.linestyle(r),
                marker=pal.marker(r),
                markerfacecolor="white",
                markersize=4.5,
            )
            at = gr[gr["r_eval"] == r]
            ax.plot(at["r_eval"], at["loss"], **pal.point(r), markersize=8, zorder=4)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(r_evals))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax.set_title(AXIS_TITLES.get(name, name), fontsize=9.5)
    grid.labels("recurrences run at test time r_eval (log scale)", style.CONT_LOSS)
    handles = [
        Line2D(
            [],
            [],
            color=pal.colour(r),
            linestyle=pal.linestyle(r),
            marker=pal.marker(r),
            markerfacecolor="white",
            label=f"trained with {r_label(r)}",
        )
        for r in rs
    ]
    handles.append(
        Line2D([], [], color="#555555", marker="o", linestyle="none", markersize=8, label="filled: r_eval = trained r")
    )
    grid.legend(handles, min(len(handles), 3))
    fig.suptitle(f"test-time recurrence at C = {flops(c)} FLOPs", fontweight="bold")
    return fig


#: name, title, function — the report's figures in order (a function returning None: "not evaluated").
FIGURES: tuple[tuple[str, str, Callable[[ReportContext], Figure | None]], ...] = (
    ("isoflop", "Iso-FLOP curves", fig_isoflop),
    ("frontier", "Compute-optimal frontier", fig_frontier),
    ("parity", "Predicted vs observed", fig_parity),
    ("residuals", "Residuals per r and budget", fig_residuals),
    ("phi", "φ: bootstrap, restricted fits, probes", fig_phi),
    ("equivalence", "Equivalent sizes", fig_equivalence),
    ("allocation", "Optimal size and tokens per parameter", fig_allocation),
    ("axes", "Five evaluation axes", fig_axes),
    ("test_time", "Test-time recurrence", fig_test_time),
)
