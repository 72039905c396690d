"""A report a reader can quote (issue 43): one interval per quantity everywhere, named by its method, and a first
screen that answers.

Two reports, rendered once from fixtures (tests/fixtures/report): the quick demo's own runs and fit file
(`loopscale demo --quick`, φ not resolved, with its loop-of-one control re-fit) and a small synthetic probes study
(``baseline@loop1`` and two techniques with paired Δφ readings, tests/fixtures/report/make_probes.py). On each,
every interval printed for φ and Δφ in index.html, summary.md, `loopscale fit`'s tables and verdicts, `plan` and
the demo's terminal summary is checked against fit.json (tests/report_checks.py says how they are read), and
headless Chromium shows where the verdict sits at 1280×800. test_report.py runs the same check on its resolved
synthetic report, test_demo.py on a real `demo --quick`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from loopscale.report import build, make_report
from loopscale.report.render import PNG_DPI
from report_checks import Unit, browser, check_report, first_screen, read_intervals, terminal_outputs

FIXTURES = Path(__file__).parent / "fixtures" / "report"
REPORTS = {
    "quick demo": ("quick_demo", True),  # (folder, has an axes table)
    "probes": ("probes", False),
}


def placeholder_figure(fig: Figure, folder: Path, name: str, formats: tuple[str, ...] = ("png",)) -> dict[str, bytes]:
    """A grey PNG of the figure's size in place of the drawn one: the checks read the page's text and its first
    screen, which ends above the first figure; drawing the figures is two thirds of a report's time (and
    test_report.py and test_demo.py check the real ones)."""
    from PIL import Image

    w, h = (round(x * PNG_DPI) for x in fig.get_size_inches())
    buf = io.BytesIO()
    Image.new("L", (w, h), 230).save(buf, format="PNG")
    (folder / f"{name}.png").parent.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.png").write_bytes(buf.getvalue())
    return {"png": buf.getvalue()}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each report rendered once, its figures built but not drawn (``placeholder_figure``)."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "save_figure", placeholder_figure)
        for name, (folder, has_axes) in REPORTS.items():
            src = FIXTURES / folder
            axes = src / "axes.csv" if has_axes else None
            out[name] = make_report(
                src / "runs.csv",
                tmp_path_factory.mktemp(folder) / "report",
                fit=src / "fit.json",
                axes=axes,
                formats=("png",),
            )
    return out


@pytest.mark.parametrize("name", list(REPORTS))
def test_every_interval_printed_for_phi_and_delta_phi_is_fit_jsons_under_its_method(
    name: str, reports: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    index = reports[name]
    fit_path = FIXTURES / REPORTS[name][0] / "fit.json"
    found = check_report(index, fit_path, terminal_outputs(fit_path, index, monkeypatch, capsys))
    kinds = {(f.where, f.quantity) for f in found}
    assert {("index.html", "phi"), ("summary.md", "phi"), ("index.html", "coef"), ("fit (terminal)", "coef")} <= kinds
    if name == "probes":
        assert {("index.html", "dphi"), ("summary.md", "dphi"), ("fit (terminal)", "dphi")} <= kinds
        page = index.read_text(encoding="utf-8")
        for d in json.loads(fit_path.read_text())["delta_phi"]:  # the leading readings the fixture has
            assert f"({d['leading']['reading']})" in page
        assert {d["leading"]["reading"] for d in json.loads(fit_path.read_text())["delta_phi"]} == {
            "paired (shared law)",
            "paired (separate laws)",
        }


def test_the_check_fails_on_an_unlabelled_secondary_interval_and_on_a_mislabelled_reading() -> None:
    """The cross-check can fail: the issue's own case (the coefficients table's φ row printing the block bootstrap's
    interval with no method) and a Δφ interval named by a reading it is not."""
    fit = json.loads((FIXTURES / "probes" / "fit.json").read_text())
    ref = fit["variants"]["baseline@loop1"]
    boot, quoted = ref["bootstrap"]["ci"]["phi"], ref["inference"]["phi"]["ci"]
    row = f"95% CI ¦ φ (recurrence-equivalence exponent) ¦ [{boot[0]:.3f}, {boot[1]:.3f}]"
    [f] = read_intervals([Unit(row, "t")], fit, "test")
    assert f.problems and "quoted" in f.problems[0]
    [f] = read_intervals([Unit(row, "t", label="block bootstrap percentile, secondary")], fit, "test")
    assert not f.problems
    [f] = read_intervals([Unit(f"φ = 0.701 [{quoted[0]:.2f}, {quoted[1]:.2f}] (block bootstrap)", "t")], fit, "t")
    assert f.problems  # the quoted interval, named as the secondary one
    hc = next(d for d in fit["delta_phi"] if d["variant"] == "hc@loop1")
    sep = hc["inference"]["ci"]
    for text, ok in (
        (f"hc@loop1: Δφ = +0.17 [{sep[0]:+.3f}, {sep[1]:+.3f}] (separate fits)", True),
        (f"hc@loop1: Δφ = +0.17 [{sep[0]:+.3f}, {sep[1]:+.3f}]", False),  # unlabelled: must be the leading one
        (f"hc@loop1: Δφ = +0.17 [{sep[0]:+.3f}, {sep[1]:+.3f}] (paired (shared law))", False),
    ):
        [f] = read_intervals([Unit(text, "t")], fit, "t")
        assert (not f.problems) == ok, (text, f.problems)
    [f] = read_intervals([Unit("α (size exponent) ¦ [1.2809, 2.5000]", "t")], fit, "t")
    assert f.problems  # a coefficient's interval must say it is the block bootstrap's


@pytest.mark.skipif(browser() is None, reason="no chromium/chrome on PATH (Debian: apt-get install -y chromium)")
@pytest.mark.parametrize("name", list(REPORTS))
def test_the_verdict_is_on_the_first_screen_of_a_1280x800_window(name: str, reports: dict[str, Path]) -> None:
    """φ's verdict with its interval (and each technique's Δφ) inside the first 800 px — and inside the viewport
    Chromium reports for a 1280×800 window, which is smaller — with the plain words after it. The screenshot stays
    beside the report (its path is printed: `pytest -s`)."""
    index = reports[name]
    shot = index.parent / "first-screen.png"
    pos = first_screen(index, shot, index.parent.parent / "chromium-profile")
    print(f"{name}: verdict at y = {pos['verdict']}, viewport {pos['viewport']}, screenshot {shot}")
    top, bottom = pos["verdict"]
    height = min(800, pos["viewport"][1])
    assert 0 < top < bottom <= height, pos
    assert pos["label"][1] <= bottom and pos["plain"][0] >= bottom, pos  # the plain words come after the verdict
    if name == "probes":
        assert pos["dphi"] is not None and pos["dphi"][1] <= bottom
    assert shot.stat().st_size > 10_000
