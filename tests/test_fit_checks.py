"""Validation of the fit: extrapolation, leave-one-r-out and the half-split stability check."""

from __future__ import annotations

import pytest

from loopscale.fit import JointLaw, run_checks, synthetic_runs, validate_runs


def test_checks_on_a_table_drawn_from_the_law_predict_held_out_runs_to_the_noise_level():
    runs = validate_runs(synthetic_runs(0.46, seed=8))
    law = JointLaw(restarts=100).fit(runs)
    checks = run_checks(law, runs, restarts=60)

    ex = checks.extrapolation
    assert ex is not None and ex.rmse is not None and ex.bias is not None
    assert ex.held_out_budget == 2.15e19 and ex.n == 16
    assert ex.rmse < 0.02 and abs(ex.bias) < 0.01

    loro = checks.leave_one_r_out
    assert loro is not None and set(loro) == {"1", "2", "4", "8"}
    for r, res in loro.items():
        assert res.n == 29 and res.rmse is not None and res.rmse < 0.03, r
        assert res.phi == pytest.approx(0.46, abs=0.1), r

    hs = checks.half_split
    assert hs is not None and hs.lower is not None and hs.upper is not None
    assert hs.lower.budgets == [4.64e17, 1e18, 2.15e18]
    assert hs.upper.budgets == [4.64e18, 1e19, 2.15e19]
    for half in (hs.lower, hs.upper):  # half the budgets: phi's standard error is ~0.05
        assert half.phi == pytest.approx(0.46, abs=0.15)


def test_checks_that_need_budgets_are_skipped_without_a_budget_column():
    runs = validate_runs(synthetic_runs(0.46, seed=8).drop(columns=["C"]))
    law = JointLaw(restarts=60).fit(runs)
    checks = run_checks(law, runs, restarts=30)
    assert checks.extrapolation is None and checks.half_split is None
    assert set(checks.leave_one_r_out or {}) == {"1", "2", "4", "8"}


def test_a_law_that_ignores_the_loop_extrapolates_worse_across_r():
    """Leave-one-r-out can fail: with phi fixed at 1 the held-out r = 8 is predicted badly."""
    runs = validate_runs(synthetic_runs(0.2, seed=8))
    train, test = runs.subset(runs.df["r"] != 8), runs.subset(runs.df["r"] == 8)
    rmse = {}
    for name, phi in (("free", None), ("phi=1", 1.0)):
        law = JointLaw(phi=phi, restarts=60).fit(train)
        err = law.predict(test.df) - test.df["val_loss"].to_numpy()
        rmse[name] = float((err**2).mean() ** 0.5)
    assert rmse["free"] < 0.02 < rmse["phi=1"]


def test_restricted_fits_get_held_out_errors_and_the_wrong_phi_predicts_worse():
    from loopscale.fit import FitSettings, fit_runs

    settings = FitSettings(restarts=60, bootstrap=0, lr_draws=200, per_r=False, checks_restarts=30)
    rec = fit_runs(synthetic_runs(0.46, seed=8), settings).to_dict()["variants"]["baseline"]
    free = rec["checks"]["held_out"]
    lor = rec["checks"]["leave_one_r_out"]
    pooled = (sum(x["n"] * x["rmse"] ** 2 for x in lor.values()) / sum(x["n"] for x in lor.values())) ** 0.5
    assert free["leave_one_r_out_rmse"] == pytest.approx(pooled)
    assert free["extrapolation_rmse"] == rec["checks"]["extrapolation"]["rmse"]
    for key in ("phi=0", "phi=1"):  # phi = 0.46 is the truth: both restricted laws predict held-out runs worse
        ho = rec["restricted"][key]["held_out"]
        assert ho["leave_one_r_out_rmse"] > 1.5 * free["leave_one_r_out_rmse"], key
