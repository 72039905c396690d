"""`loopscale report` and `loopscale.report`: the figures, the self-contained page, the honest headline."""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import sys
from html.parser import HTMLParser

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from loopscale.cli import run_app
from loopscale.errors import ConfigError
from loopscale.fit import FitSettings, fit_runs, synthetic_runs, write_fit
from loopscale.report import NOT_IDENTIFIED, ReportContext, load_inputs, make_report, phi_verdict, read_axes
from loopscale.report.data import axes_scores
from loopscale.report.figures import FIGURES

NAMES = [name for name, _, _ in FIGURES]
QUICK = FitSettings(restarts=60, bootstrap=20, lr_draws=200, checks=False, per_r=False)
AXES = ("knowledge", "reading", "math", "reasoning", "symbolic")


def runs_with_probe() -> pd.DataFrame:
    """The paper's grid at phi = 0.46 plus the looped runs of a 'tbptt' recipe at phi = 0.38."""
    base = synthetic_runs(0.46, seed=4)
    probe = synthetic_runs(0.38, seed=5, variant="tbptt")
    probe = probe[probe["r"] > 1].assign(run_id=lambda d: "tbptt_" + d["run_id"])
    return pd.concat([base, probe], ignore_index=True)


def small_axes_table(runs: pd.DataFrame) -> pd.DataFrame:
    """A hand-made axes table: the two largest budgets, one task per axis, and test-time rows at the largest.

    Loss grows with r (more on knowledge), falls with compute, and falls when the loop runs longer.
    """
    rows = []
    budgets = sorted(runs["C"].unique())[-2:]
    base = runs[runs["variant"] == "baseline"]
    for c in budgets:
        for r in (1, 2, 4, 8):
            cell = base[(base["C"] == c) & (base["r"] == r)]
            run = cell.loc[cell["val_loss"].idxmin()]
            for k, axis in enumerate(AXES):
                for r_eval in (1, 2, 4, 8) if c == budgets[-1] else (r,):
                    loss = 1.2 + 0.2 * k + (0.04 if axis == "knowledge" else 0.01) * np.log2(r)
                    loss += 0.03 * abs(np.log2(r_eval / r)) - 0.05 * np.log10(c / 1e19)
                    rows.append(
                        {
                            "run_id": run["run_id"],
                            "C": c,
                            "r": r,
                            "r_eval": r_eval,
                            "variant": "baseline",
                            "d_model": run["d_model"],
                            "axis": axis,
                            "task": f"{axis}_task",
                            "loss": loss,
                            "accuracy": 0.5,
                            "n_items": 40,
                        }
                    )
    return pd.DataFrame(rows)


class PageParser(HTMLParser):
    """Collects ids, sections, images, links and tag balance of a page."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input", "source", "col", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.imgs: list[dict[str, str]] = []
        self.urls: list[str] = []
        self.tags: list[str] = []
        self.section: str | None = None
        self.img_section: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "section" and a.get("id", "").startswith("fig-"):
            self.section = a["id"]
        if tag == "img":
            self.imgs.append(a)
            if self.section:
                self.img_section[self.section] = a.get("src", "")
        for key in ("src", "href", "action", "data"):
            if key in a:
                self.urls.append(a[key])
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A sweep dir (runs.csv + axes.csv + fit.json) and its report."""
    sweep = tmp_path_factory.mktemp("sweep")
    runs = runs_with_probe()
    runs.to_csv(sweep / "runs.csv", index=False)
    small_axes_table(runs).to_csv(sweep / "axes.csv", index=False)
    write_fit(sweep / "fit.json", fit_runs(runs, QUICK))
    out = sweep / "report"
    index = make_report(sweep, out, fit=sweep / "fit.json")
    return out, index


def test_report_writes_every_figure_as_png_svg_and_pdf(report):
    out, _ = report
    for name in NAMES:
        png = mpimg.imread(out / "figures" / f"{name}.png")
        assert png.ndim == 3 and png.shape[2] in (3, 4)
        assert png.shape[1] >= 700 and png.shape[0] >= 400, (name, png.shape)  # >= 150 dpi at print size
        assert png[..., :3].std() > 0.05, name  # not blank
        svg = (out / "figures" / f"{name}.svg").read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg
        assert (out / "figures" / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    assert not list((out / "figures").glob(".*.tmp"))  # atomic writes leave no temp files


def test_page_has_a_section_heading_and_embedded_png_for_every_figure(report):
    _, index = report
    page = PageParser()
    page.feed(index.read_text(encoding="utf-8"))
    for name in NAMES:
        assert f"fig-{name}" in page.ids
        src = page.img_section[f"fig-{name}"]
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"headline", "tab-coefficients", "tab-delta-phi", "tab-loss-gap", "tab-axes", "tab-test-time"} <= set(
        page.ids
    )


def test_page_is_well_formed_and_self_contained(report):
    _, index = report
    text = index.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    page = PageParser()
    page.feed(text)
    page.close()
    assert page.errors == [] and page.stack == []
    assert page.tags.count("h1") == 1 and "title" in page.tags and "body" in page.tags
    assert not {"script", "link", "iframe", "object", "embed"} & set(page.tags)
    for url in page.urls:  # anchors, the data URIs and the figure files beside the page; nothing else
        assert url.startswith(("#", "data:image/png;base64,", "figures/")), url
    assert not re.search(r"[a-z]+://|@import|url\(", text)


def test_identified_phi_is_the_headline_with_its_ci(report):
    out, index = report
    doc = json.loads((out.parent / "fit.json").read_text())
    v = phi_verdict(doc)
    assert v.resolved and v.label.startswith("φ = ") and v.ci is not None
    text = index.read_text(encoding="utf-8")
    assert v.label in text and NOT_IDENTIFIED not in text
    assert "tbptt" in text and "Δφ" in text  # the probe's Delta-phi


def test_summary_md_repeats_the_headline_and_links_every_figure(report):
    out, _ = report
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert md.startswith("# loopscale report")
    assert "| quantity | value | 95% interval, or detail | interval's method |" in md
    assert "Δφ per recipe" in md and "shared law" in md
    for name in NAMES:
        assert f"](figures/{name}.png)" in md
        for fmt in ("svg", "pdf"):
            assert f"(figures/{name}.{fmt})" in md


def test_the_report_writes_headline_json_with_the_same_sentences_and_verdicts(report):
    out, index = report
    h = json.loads((out / "headline.json").read_text(encoding="utf-8"))
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert h["plain"] and all(line.split(".")[0] in md for line in h["plain"])
    doc = json.loads((out.parent / "fit.json").read_text())
    v = phi_verdict(doc)
    assert h["verdict"] == v.label and h["resolved"] == v.resolved and h["phi"] == v.phi
    assert "tbptt" in h["variants"] and h["report"] == str(index)


def test_axes_scores_use_the_compute_optimal_run_of_each_cell(report, tmp_path):
    runs = runs_with_probe()
    axes = small_axes_table(runs)
    c, r = axes["C"].max(), 4
    cell = runs[(runs["C"] == c) & (runs["r"] == r) & (runs["variant"] == "baseline")]
    worse = cell.loc[cell["val_loss"].idxmax()]
    extra = axes[(axes["C"] == c) & (axes["r"] == r)].assign(run_id=worse["run_id"], loss=9.0)
    doc = json.loads((report[0].parent / "fit.json").read_text())
    ctx = ReportContext.build(load_inputs(runs, tmp_path, fit=doc, axes=pd.concat([axes, extra])))
    sc = axes_scores(ctx)
    assert len(sc) == 2 * 4 * 5 and sc["loss"].max() < 9.0  # the worse run of the cell is not used


def test_r1_only_table_is_labelled_not_identified_and_missing_axes_say_not_evaluated(tmp_path, capsys):
    runs = synthetic_runs(0.46, seed=4)
    runs[runs["r"] == 1].to_csv(tmp_path / "runs.csv", index=False)
    out = tmp_path / "report"
    code = run_app(
        [
            "report",
            str(tmp_path / "runs.csv"),
            "--out",
            str(out),
            "--bootstrap",
            "8",
            "--lr-draws",
            "200",
            "--restarts",
            "30",
        ]
    )
    assert code == 0
    assert NOT_IDENTIFIED in capsys.readouterr().out
    assert (out / "fit.json").is_file()  # the report ran the fit and kept it
    text = (out / "index.html").read_text(encoding="utf-8")
    head = text[text.index('id="headline"') : text.index("</section>", text.index('id="headline"'))]
    assert NOT_IDENTIFIED in head and "no looped (r &gt; 1) runs" in head
    for name in ("axes", "test_time"):
        section = text[text.index(f'id="fig-{name}"') :]
        assert "not evaluated" in section[: section.index("</section>")]
        assert not (out / "figures" / f"{name}.png").exists()
    assert NOT_IDENTIFIED in (out / "summary.md").read_text(encoding="utf-8")


def test_pure_noise_table_is_labelled_not_identified():
    runs = synthetic_runs(0.46, seed=7)
    runs["val_loss"] = 2.6 + 0.15 * np.random.default_rng(0).standard_normal(len(runs))
    settings = FitSettings(restarts=40, bootstrap=8, lr_draws=200, restricted=(), per_r=False, checks=False)
    v = phi_verdict(fit_runs(runs, settings))
    assert not v.resolved and v.label == NOT_IDENTIFIED
    assert any("R² = " in r for r in v.reasons)


def _doctor(rec, phi=None, ci=None):
    """Set phi and its interval by hand: the record then reads as a fit file without the calibrated inference."""
    rec.pop("inference", None)
    if phi is not None:
        rec["law"]["params"]["phi"] = phi
    if ci is not None:
        rec["bootstrap"]["ci"]["phi"] = ci


def test_phi_at_a_bound_or_with_a_wide_ci_is_not_identified(report):
    doc = json.loads((report[0].parent / "fit.json").read_text())
    at_bound = copy.deepcopy(doc)
    at_bound["variants"]["baseline"]["law"]["at_bounds"] = ["phi"]
    v = phi_verdict(at_bound)
    assert not v.resolved and any("bound" in r for r in v.reasons)
    wide = copy.deepcopy(doc)
    _doctor(wide["variants"]["baseline"], ci=[-0.2, 0.9])
    v = phi_verdict(wide)
    assert not v.resolved and any("1.10 wide" in r for r in v.reasons)
    no_boot = copy.deepcopy(doc)
    no_boot["variants"]["baseline"]["bootstrap"] = {"n": 0}
    no_boot["variants"]["baseline"].pop("inference")
    v = phi_verdict(no_boot)
    assert v.resolved and "uncertainty not estimated" in v.label


def test_caveats_say_where_phi_and_its_ci_sit_against_0_and_1(report):
    doc = json.loads((report[0].parent / "fit.json").read_text())
    rec = doc["variants"]["baseline"]
    _doctor(rec, 1.11, [0.96, 1.31])
    v = phi_verdict(doc)
    assert v.resolved and v.label == "φ = 1.110 [0.960, 1.310]"
    assert any("> 1" in c for c in v.caveats) and any("includes φ = 1" in c for c in v.caveats)
    assert not any("φ = 0" in c for c in v.caveats)
    _doctor(rec, 0.46, [0.41, 0.53])
    assert not [c for c in phi_verdict(doc).caveats if "φ" in c and "percentile" not in c]  # the paper's result
    _doctor(rec, 0.2, [-0.05, 0.4])
    assert any("includes φ = 0" in c for c in phi_verdict(doc).caveats)


def test_refits_against_controls_are_stated_beside_the_headline(report):
    from types import SimpleNamespace

    from loopscale.fit import FitResult, load_fit
    from loopscale.report.render import control_refits

    doc = json.loads((report[0].parent / "fit.json").read_text())
    ctrl = copy.deepcopy(doc["variants"]["baseline"])
    _doctor(ctrl, 0.75, [0.59, 1.11])
    doc["variants"]["baseline@loop1"] = ctrl
    doc["variants"]["other@loop1"] = ctrl  # another recipe's refit: not this page's
    lines = control_refits(SimpleNamespace(result=FitResult.of(doc), variant="baseline"))  # type: ignore[arg-type]
    assert len(lines) == 1 and "'loop1' (baseline@loop1, a different quantity): φ̂ = 0.750 [0.590, 1.110]" in lines[0]
    assert "0.52 wide" in lines[0] and "includes φ = 1" in lines[0]
    assert (
        control_refits(SimpleNamespace(result=load_fit(report[0].parent / "fit.json"), variant="baseline"))  # type: ignore[arg-type]
        == []
    )


def test_axes_table_without_a_loss_column_is_a_one_line_error():
    with pytest.raises(ConfigError, match="loss: missing column"):
        read_axes(pd.DataFrame({"r": [1], "axis": ["math"], "accuracy": [0.5]}))


def test_importing_the_report_does_not_load_torch():
    code = "import sys, loopscale.report, loopscale.report.figures; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_report_tables_do_not_import_matplotlib():
    """The tables read their numbers from ``report.data``, not from the figures: a notebook that wants the
    tables (or the context and the verdict) does not load the plotting stack."""
    code = (
        "import sys, loopscale.report, loopscale.report.tables, loopscale.report.data; "
        "print('matplotlib' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_phi_and_its_ci_print_the_same_in_fit_and_in_the_report(report, capsys):
    """`loopscale fit` (its table and verdict line) and the report (coefficients and Δφ tables, headline)
    quote φ through ``loopscale.numbers``: the same digits, the same CI, the same dash."""
    from loopscale.cli.fit import _print_fit, _print_verdicts
    from loopscale.fit import load_fit
    from loopscale.numbers import phi, phi_ci, phi_interval

    out, _ = report
    doc = load_fit(out.parent / "fit.json")
    _print_fit(doc, markdown=True)
    _print_verdicts(doc)
    printed = capsys.readouterr().out
    summary = (out / "summary.md").read_text(encoding="utf-8")
    page = (out / "index.html").read_text(encoding="utf-8")
    for name, rec in doc.variants.items():
        assert rec.inference is not None and rec.inference.phi is not None
        value, ci = rec.params.phi, rec.inference.phi.ci  # the calibrated interval
        both = phi_ci(value, ci)
        assert "[" in both and both in printed and both in summary and both in page, (name, both)
        assert phi(value) in printed and phi_interval(ci) in printed  # the table's value and CI columns
        # the secondary interval, on its own row, named by its method
        assert re.search(
            re.escape(phi_interval(rec.bootstrap.ci["phi"])) + r"[\s|│]*block bootstrap percentile, secondary",
            printed,
        )
        assert f"{value:.4f}" not in printed + summary  # the old four-digit φ of `fit`'s table


def test_the_plain_headline_leads_with_the_papers_estimand_and_labels_the_control_fit_a_different_quantity(
    report, tmp_path
):
    import html
    import io

    from rich.console import Console

    from loopscale.demo import _print_headline
    from loopscale.report.plain import plain_headline, structure_tax
    from loopscale.report.render import render_html, render_markdown
    from loopscale.report.tables import axes_table

    runs = runs_with_probe()
    ones = runs[(runs["r"] == 1) & (runs["variant"] == "baseline")]
    loop1 = ones.assign(variant="loop1", run_id="loop1_" + ones["run_id"], val_loss=ones["val_loss"] + 0.1)
    runs = pd.concat([runs, loop1], ignore_index=True)
    doc = json.loads((report[0].parent / "fit.json").read_text())
    ctrl = copy.deepcopy(doc["variants"]["baseline"])
    ctrl["law"]["params"]["phi"], ctrl["inference"]["phi"]["ci"] = 0.75, [0.62, 0.93]
    ctrl["inference"]["tests"] = {
        "phi=0": {"value": 0.0, "p": 0.001, "rejected": True, "held_out_worse": True, "ruled_out": True},
        "phi=1": {"value": 1.0, "p": 0.004, "rejected": True, "held_out_worse": False, "ruled_out": False},
    }
    doc["variants"]["baseline@loop1"] = ctrl
    doc["variants"]["baseline"]["law"]["at_bounds"] = ["phi"]  # the paper-design fit ran into its bound
    ctx = ReportContext.build(load_inputs(runs, tmp_path, fit=doc, axes=small_axes_table(runs)))
    lines = plain_headline(ctx)
    assert lines[0].startswith("What was measured: ") and "r = 1, 2, 4, 8" in lines[0]
    # one estimand leads, whatever its verdict: the reference against its own (plain) r = 1 runs; why it is not
    # resolved is the verdict's to say, once (the sentence points there)
    assert lines[1].startswith("Result: not measured precisely enough") and "listed with the verdict" in lines[1]
    assert "bound" not in lines[1] and "[0.38, 0.45]" in lines[1]
    assert lines[2].startswith("Here r = 1 is the plain stack") and "loop of one over all 20" in lines[2]
    assert "For reference, the paper measures φ = 0.46" in lines[2]
    # the control fit: a different quantity, its claims from the tests, never beside the paper's 0.46
    assert lines[3].startswith("A different quantity") and "φ = 0.75" in lines[3] and "[0.62, 0.93]" in lines[3]
    assert "rules out φ = 0" in lines[3] and "rules out φ = 1" not in lines[3]
    assert "cannot tell φ = 1 apart from the fit" in lines[3] and "0.46" not in lines[3]
    assert lines[4].startswith("Its r = 1 models (loop1) are a loop of one") and "+0.10 nats" in lines[4]
    assert "not the paper's estimand" in lines[4] and "0.46" not in lines[4]
    assert np.allclose(list(structure_tax(runs, "baseline", "loop1").values()), 0.1)

    md = render_markdown(ctx, [], [], [])  # what summary.md and index.html open with (figures: other tests)
    page = html.unescape(render_html(ctx, [], [], []))
    buf = io.StringIO()
    _print_headline(
        Console(file=buf, width=100), {"plain": lines, "phi": 0.5, "report": "x", "wall_s": 60.0}, axes_table(ctx)
    )
    term = " ".join(buf.getvalue().split())  # rich wraps long lines
    for line in lines:
        assert line in md and line in page and line in term
    # the verdict first, then the plain words, then what limits the fit and what the control measures
    assert md.index("## ⚠ φ not resolved") < md.index("## In plain words") < md.index(lines[0])
    assert page.index('id="headline"') < page.index('id="plain"') < page.index(lines[0])
    assert page.index(lines[2]) < page.index('id="control"') < page.index(lines[3]) < page.index(lines[4])
    assert md.index("## What the control measures") < md.index(lines[3])
    assert term.index(lines[0]) < term.index("details") < term.index("─ verdict ─")  # the verdict: last on screen
    summary, index = (report[0] / "summary.md").read_text(), report[1].read_text()
    assert "| axis | r = 1 | r = 2 | r = 4 | r = 8 |" in summary and 'id="tab-axes"' in index
    assert "knowledge" in term.lower() and "r = 8" in term and "{" not in term  # a table, not a JSON dict


def test_every_interval_of_the_resolved_report_is_fit_jsons_under_its_method(report, monkeypatch, capsys):
    """The interval cross-check (tests/report_checks.py, issue 43) on a resolved synthetic table whose probe's Δφ
    is led by the separate fits (no paired reading without checks): page, summary.md, `fit`, `plan`, the demo's
    terminal summary and headline.json."""
    from report_checks import check_report, terminal_outputs

    out, index = report
    fit_path = out.parent / "fit.json"
    found = check_report(index, fit_path, terminal_outputs(fit_path, index, monkeypatch, capsys))
    doc = json.loads(fit_path.read_text())
    assert phi_verdict(doc).resolved and doc["delta_phi"][0]["leading"]["reading"] == "separate fits"
    assert {(f.where, f.quantity) for f in found} >= {
        ("index.html", "phi"),
        ("index.html", "dphi"),
        ("summary.md", "dphi"),
        ("fit (terminal)", "dphi"),
        ("demo (terminal)", "dphi"),
    }
