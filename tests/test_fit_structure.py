"""The loop_tax law variant: a loss factor on looped runs with its own phi, judged held out."""

from __future__ import annotations

import pytest

from loopscale.fit import FitSettings, JointLaw, fit_runs, synthetic_runs
from loopscale.fit.law.structure import LoopTaxLaw


def taxed(kappa: float = 0.05, seed: int = 3):
    df = synthetic_runs(0.46, seed=seed, sigma=0.005)
    df.loc[df["r"] > 1, "val_loss"] *= 1 + kappa
    return df


def test_loop_tax_recovers_the_factor_and_phi_where_the_joint_law_cannot():
    df = taxed()
    tax = LoopTaxLaw(JointLaw(restarts=60)).fit(df)
    assert tax.kappa_ == pytest.approx(0.05, abs=0.01)
    assert tax.phi_ == pytest.approx(0.46, abs=0.08)
    joint = JointLaw(restarts=60).fit(df)
    assert abs(joint.phi_ - 0.46) > 0.3  # the joint law reads the tax as a smaller phi
    assert tax.r2_ > joint.r2_


def test_without_a_tax_the_variant_reduces_to_the_joint_law():
    df = synthetic_runs(0.46, seed=4, sigma=0.005)
    tax = LoopTaxLaw(JointLaw(restarts=60)).fit(df)
    assert abs(tax.kappa_) < 0.005 and tax.phi_ == pytest.approx(0.46, abs=0.05)


def test_fit_runs_reports_the_variant_beside_the_restricted_fits_with_held_out_errors():
    settings = FitSettings(restarts=60, bootstrap=0, lr_draws=200, per_r=False, restricted=(), checks_restarts=30)
    rec = fit_runs(taxed(), settings).to_dict()["variants"]["baseline"]
    lv = rec["law_variants"]["loop_tax"]
    assert lv["kappa"] == pytest.approx(0.05, abs=0.01) and lv["held_out"]["leave_one_r_out_rmse"] is not None
    free = rec["checks"]["held_out"]
    assert lv["held_out"]["extrapolation_rmse"] < free["extrapolation_rmse"]
