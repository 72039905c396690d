"""Block bootstrap over (budget, r) cells, warm-started refits, and Delta-phi between variants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.fit import (
    FitSettings,
    JointLaw,
    LawData,
    cell_weights,
    fit_runs,
    percentile_ci,
    restart_check,
    synthetic_runs,
)
from loopscale.fit.parts import bootstrap_cells


def test_resamples_keep_budget_r_cells_whole():
    df = synthetic_runs(0.46, seed=0)
    cells, _unit = bootstrap_cells(df)
    W = cell_weights(cells, 50, np.random.default_rng(0))
    assert W.shape == (50, 116)
    for w in W:
        for c in np.unique(cells):
            assert len(np.unique(w[cells == c])) == 1  # one multiplicity per cell
        per_cell = pd.Series(w).groupby(cells).first()
        assert per_cell.sum() == 24  # 24 cells drawn with replacement
    assert W.std(axis=0).min() > 0  # every cell is sometimes out, sometimes repeated


def test_without_budget_column_the_bootstrap_falls_back_to_runs_and_says_so():
    df = synthetic_runs(0.46, seed=0).drop(columns=["C"])
    cells, unit = bootstrap_cells(df)  # C is rebuilt from D x flops_per_token
    assert unit == "cell (budget, r)" and len(np.unique(cells)) == 24
    cells, unit = bootstrap_cells(df.drop(columns=["flops_per_token"]))
    assert unit == "run" and len(np.unique(cells)) == 116


def test_warm_started_refits_reach_the_full_restart_optimum():
    """The CI is only honest if the cheap refits find what 500-start refits would find."""
    df = synthetic_runs(0.46, seed=5)
    law = JointLaw(restarts=200).fit(df)
    cells, _ = bootstrap_cells(df)
    W = cell_weights(cells, 3, np.random.default_rng(9))
    check = restart_check(LawData.from_frame(df), W, law.theta_[None], bounds=law.bounds(), restarts=200)
    assert check["draws"] == 3
    assert check["max_abs_dphi"] < 1e-3
    assert check["max_rel_objective_excess"] < 1e-6


def test_percentile_ci_ignores_undetermined_draws():
    x = np.r_[np.linspace(0, 1, 101), np.nan, np.nan]
    assert percentile_ci(x) == pytest.approx((0.025, 0.975))
    assert np.isnan(percentile_ci(np.array([np.nan]))[0])


def _two_variants(phi_b: float, seed: int) -> pd.DataFrame:
    base = synthetic_runs(0.46, seed=seed)
    other = synthetic_runs(phi_b, seed=seed + 100, variant="tbptt")
    other = other[other["r"] > 1].assign(run_id=lambda d: d["run_id"] + "_tbptt")
    return pd.concat([base, other], ignore_index=True)


FAST = dict(bootstrap=60, lr_draws=200, restarts=150, restricted=(), per_r=False, checks=False)


def test_delta_phi_between_variants_has_a_paired_bootstrap_ci_and_sign_fraction():
    fit = fit_runs(_two_variants(0.30, seed=1), FitSettings(**FAST)).to_dict()
    assert set(fit["variants"]) == {"baseline", "tbptt"} and fit["reference_variant"] == "baseline"
    assert fit["variants"]["tbptt"]["n_runs"] == 116  # 87 own looped runs + the 29 shared r = 1 runs
    (d,) = fit["delta_phi"]
    assert d["variant"] == "tbptt" and d["delta_phi"] == pytest.approx(-0.16, abs=0.06)
    lo, hi = d["ci"]
    assert lo < d["delta_phi"] < hi < 0
    assert d["fraction_above_zero"] < 0.05 and len(d["draws"]) == 60


def test_delta_phi_ci_covers_zero_when_both_recipes_share_phi():
    fit = fit_runs(_two_variants(0.46, seed=2), FitSettings(**FAST)).to_dict()
    (d,) = fit["delta_phi"]
    lo, hi = d["ci"]
    assert lo < 0 < hi
    assert 0.05 < d["fraction_above_zero"] < 0.95
