"""`loopscale fit --compare`: is a fit consistent with the paper's law or with another fit file?"""

from __future__ import annotations

import json

import numpy as np
import pytest

from loopscale.cli import run_app
from loopscale.fit import FitSettings, fit_runs, synthetic_runs
from loopscale.fit.inference.compare import compare, p_value

QUICK = FitSettings(restarts=40, bootstrap=40, lr_draws=200, per_r=False, checks=False, restricted=(), law_variants=())


@pytest.fixture(scope="module")
def fits():
    return {phi: fit_runs(synthetic_runs(phi, seed=11), QUICK) for phi in (0.459, 0.8)}


def test_a_fit_of_the_papers_law_is_consistent_with_the_paper(fits):
    out = compare(fits[0.459], "paper")
    rows = {r["quantity"]: r for r in out["rows"]}
    assert rows["phi"]["consistent"] and rows["phi"]["p_value"] > 0.05
    lo, hi = rows["phi"]["difference_ci"]
    assert lo < 0 < hi and rows["phi"]["reference_ci"] == (0.41, 0.53)


def test_a_different_phi_is_flagged_inconsistent_with_the_paper_and_with_another_fit(fits):
    rows = {r["quantity"]: r for r in compare(fits[0.8], "paper")["rows"]}
    assert rows["phi"]["consistent"] is False and rows["phi"]["p_value"] < 0.05
    assert rows["phi"]["difference"] == pytest.approx(0.8 - 0.459, abs=0.05)
    rows = {r["quantity"]: r for r in compare(fits[0.8], fits[0.459])["rows"]}
    assert rows["phi"]["consistent"] is False
    assert {r["quantity"]: r for r in compare(fits[0.459], fits[0.459])["rows"]}["phi"]["consistent"]


def test_p_value_is_two_sided():
    assert p_value(np.array([1.0, 2.0, 3.0])) == 0.0
    assert p_value(np.linspace(-1, 1, 101)) == pytest.approx(1.0)


def test_cli_compare_prints_the_test_and_stores_it(tmp_path, capsys):
    synthetic_runs(0.459, seed=12).to_csv(tmp_path / "runs.csv", index=False)
    args = [
        "fit",
        str(tmp_path / "runs.csv"),
        "--restarts",
        "40",
        "-b",
        "30",
        "--lr-draws",
        "200",
        "--no-checks",
        "--no-per-r",
        "--no-restricted",
        "--no-law-variants",
        "--compare",
        "paper",
    ]
    assert run_app(args) == 0
    out = capsys.readouterr().out
    assert "consistency with paper" in out and "p-value" in out
    assert run_app([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [r["quantity"] for r in summary["compare"]["rows"]] == ["phi", "alpha", "beta"]
    assert run_app(["fit", str(tmp_path / "runs.csv"), "--compare", str(tmp_path / "nope.json")]) == 2
