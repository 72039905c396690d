"""The report on a phone and in its figures: tables scroll in their own box (the page never scrolls
sideways at 390 px), and every shared legend fits inside its figure (3 r values x 2 budgets once cut
the iso-FLOP legend off)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D

from loopscale.fit import FitSettings, fit_runs, synthetic_runs
from loopscale.report import ReportContext, load_inputs, make_report
from loopscale.report.build import save_figure
from loopscale.report.figures import FIGURES, _grid, _renderer, fig_isoflop
from loopscale.report.render import CSS

QUICK = FitSettings(restarts=40, bootstrap=10, lr_draws=200, checks=False, per_r=False)
RS = (1, 2, 4)  # three r values and two budgets: the shape that cut the iso-FLOP legend off


def _axes(runs: pd.DataFrame) -> pd.DataFrame:
    """An axes table for the best run per cell, with test-time rows at the larger budget."""
    rows = []
    top = runs["C"].max()
    for (c, r), cell in runs.groupby(["C", "r"]):
        run = cell.loc[cell["val_loss"].idxmin()]
        for r_eval in (1, 2, 4, 8, 16) if c == top and r > 1 else (r,):
            for k, axis in enumerate(("knowledge", "reading", "math", "reasoning", "symbolic")):
                rows.append(
                    {
                        "run_id": run["run_id"],
                        "C": c,
                        "r": r,
                        "r_eval": r_eval,
                        "variant": "baseline",
                        "axis": axis,
                        "task": axis,
                        "loss": 1.2 + 0.1 * k + 0.02 * abs(np.log2(r_eval / r)),
                        "accuracy": 0.5,
                        "n_items": 24,
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReportContext, Path]:
    runs = synthetic_runs(0.46, seed=4)
    runs = runs[runs["C"].isin(sorted(runs["C"].unique())[-2:]) & runs["r"].isin(RS)].reset_index(drop=True)
    out = tmp_path_factory.mktemp("layout")
    runs.to_csv(out / "runs.csv", index=False)
    _axes(runs).to_csv(out / "axes.csv", index=False)
    fit = fit_runs(runs, QUICK)
    index = make_report(out / "runs.csv", out / "report", fit=fit, formats=("png",))
    ctx = ReportContext.build(load_inputs(out / "runs.csv", out / "report", fit=out / "report" / "fit.json"))
    return ctx, index


class Tables(HTMLParser):
    """The parent element of every <table>, and the viewport meta tag."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input", "source", "col", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, dict[str, str | None]]] = []
        self.parents: dict[str, tuple[str, dict[str, str | None]]] = {}
        self.viewport = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "meta" and a.get("name") == "viewport":
            self.viewport = a.get("content") or ""
        if tag == "table":
            self.parents[str(a.get("id"))] = self.stack[-1] if self.stack else ("", {})
        if tag not in self.VOID:
            self.stack.append((tag, a))

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID and self.stack and self.stack[-1][0] == tag:
            self.stack.pop()


def _rule(selector: str) -> str:
    """The declarations of the first CSS rule for exactly ``selector``."""
    m = re.search(r"(?:^|[}\s])" + re.escape(selector) + r"\s*\{([^}]*)\}", CSS)
    assert m, f"no CSS rule for {selector}"
    return m.group(1)


def test_every_table_scrolls_in_its_own_box_so_the_page_never_scrolls_sideways(small) -> None:
    _, index = small
    page = Tables()
    page.feed(index.read_text(encoding="utf-8"))
    assert "width=device-width" in page.viewport
    assert {"tab-coefficients", "tab-test-time", "tab-inputs"} <= set(page.parents)
    for table_id, (tag, attrs) in page.parents.items():
        assert tag == "div" and "scroll" in (attrs.get("class") or "").split(), table_id
        assert attrs.get("tabindex") == "0" and attrs.get("role") == "region", table_id  # keyboard can scroll it
    box = _rule(".scroll")
    assert "overflow-x: auto" in box and "max-width: 100%" in box
    # nothing else is wider than a 390 px phone: the facts grid's columns shrink below 300 px, long
    # words (paths, run ids) break, and figures scale down
    assert "minmax(min(300px, 100%)" in _rule(".facts")
    assert "overflow-wrap: anywhere" in _rule("main")
    assert "max-width: 100%" in _rule("figure img")
    assert re.search(r"@media \(max-width: \d+px\)", CSS)


def _outside(fig: Any) -> list[str]:
    """The shared legends of ``fig`` that stick out of it, after the figure was laid out and drawn."""
    fig.draw_without_rendering()
    renderer = _renderer(fig)
    box = fig.bbox
    out = []
    for leg in [*fig.legends, *(leg for sub in fig.subfigs for leg in sub.legends)]:
        e = leg.get_window_extent(renderer)
        if e.x0 < box.x0 - 0.5 or e.x1 > box.x1 + 0.5 or e.y0 < box.y0 - 0.5 or e.y1 > box.y1 + 0.5:
            out.append(f"{[t.get_text() for t in leg.get_texts()]}: {e.bounds} outside {box.bounds}")
    return out


def test_the_iso_flop_legend_with_three_r_and_two_budgets_fits_in_the_figure(small, tmp_path: Path) -> None:
    ctx, _ = small
    assert ctx.rs == list(RS) and len(ctx.budgets) == 2
    fig = fig_isoflop(ctx)
    save_figure(fig, tmp_path, "isoflop", ("png",))
    assert not _outside(fig)
    [leg] = fig.subfigs[1].legends
    assert len(leg.get_texts()) == len(RS) + 3  # every r and the three line keys are still there


def test_every_figure_legend_fits_in_its_figure(small, tmp_path: Path) -> None:
    ctx, _ = small
    drawn = 0
    for name, _title, fn in FIGURES:
        fig = fn(ctx)
        if fig is None:
            continue
        save_figure(fig, tmp_path, name, ("png",))
        assert not _outside(fig), name
        drawn += 1
    assert drawn == len(FIGURES)  # the axes table has test-time rows, so section 9 is drawn too


def test_a_legend_too_wide_for_its_columns_drops_columns_and_the_strip_grows_a_row() -> None:
    grid = _grid(2, 2, 2.0, legend_rows=1)
    height = grid.fig.get_size_inches()[1]
    handles = [Line2D([], [], color="k", label=f"a rather long legend entry number {i}") for i in range(5)]
    grid.legend(handles, 5)  # five of these side by side are ~2.5x the figure's width
    assert grid.rows >= 2
    assert grid.fig.get_size_inches()[1] == pytest.approx(height + 0.22 * (grid.rows - 1))  # panels keep theirs
    assert not _outside(grid.fig)
    short = _grid(2, 2, 2.0, legend_rows=1)
    short.legend(handles[:2], 2)  # room enough: one row, nothing grows
    assert short.rows == 1 and short.fig.get_size_inches()[1] == pytest.approx(height)
