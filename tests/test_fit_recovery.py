"""Acceptance: the fit recovers phi from synthetic tables on the paper's 116-run grid.

Tables are drawn from the law with the paper's coefficients and a chosen phi, on the paper's
widths, budgets and FLOPs per token (``loopscale.accounting``), with sigma = 0.01 nats of noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from loopscale.fit import JointLaw, LawData, cell_weights, percentile_ci, refit_batch, synthetic_runs
from loopscale.fit.paper import PAPER_R2
from loopscale.fit.parts import bootstrap_cells

SEEDS = (11, 12, 13)


@pytest.mark.parametrize("phi", [0.2, 0.46, 0.8])
def test_phi_is_recovered_within_005_and_its_bootstrap_ci_covers_the_truth_in_most_seeds(phi):
    covered = 0
    for seed in SEEDS:
        df = synthetic_runs(phi, sigma=0.01, seed=seed)
        assert len(df) == 116
        law = JointLaw(seed=seed).fit(df)  # the paper's 500 starts
        assert law.phi_ == pytest.approx(phi, abs=0.05)
        # R^2 on raw nats is the paper's 0.9972 up to noise
        assert law.r2_ == pytest.approx(PAPER_R2["joint"], abs=0.002)
        cells, unit = bootstrap_cells(df)
        assert unit == "cell (budget, r)" and len(np.unique(cells)) == 24
        draws = refit_batch(
            LawData.from_frame(df),
            cell_weights(cells, 100, np.random.default_rng(seed)),
            law.theta_[None],
            bounds=law.bounds(),
            seed=seed,
        )
        assert draws.converged.mean() > 0.95
        lo, hi = percentile_ci(draws.theta[:, 5])
        assert hi - lo < 0.2  # informative, like the paper's 0.41-0.53
        covered += lo <= phi <= hi
    assert covered >= 2
