"""The joint law's objective, optimiser and estimator API."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from loopscale.fit import PAPER_COEFFICIENTS, JointLaw, LawData, objective, synthetic_runs
from loopscale.fit.law.joint import Bounds, multistart, params_to_theta


@pytest.fixture(scope="module")
def noisy():
    return synthetic_runs(0.46, sigma=0.01, seed=3)


@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_analytic_gradient_matches_central_differences(noisy, loss):
    data = LawData.from_frame(noisy)
    rng = np.random.default_rng(0)
    w = rng.integers(0, 3, len(data)).astype(float)
    truth = params_to_theta(PAPER_COEFFICIENTS)
    for theta in (truth + 0.05 * rng.standard_normal(6), truth + 0.3 * rng.standard_normal(6)):
        _f, g = objective(theta, data, w, loss=loss)
        h = 1e-6
        num = np.array(
            [
                (
                    objective(theta + h * e, data, w, loss=loss, grad=False)[0][0]
                    - objective(theta - h * e, data, w, loss=loss, grad=False)[0][0]
                )
                / (2 * h)
                for e in np.eye(6)
            ]
        )
        np.testing.assert_allclose(g[0], num, rtol=1e-5, atol=1e-9 * np.abs(num).max())


def test_noise_free_table_recovers_all_six_parameters():
    for phi in (0.2, 0.46, 0.8):
        df = synthetic_runs(phi, sigma=0.0, seed=0)
        law = JointLaw(restarts=100).fit(df)
        truth = {**PAPER_COEFFICIENTS, "phi": phi}
        for k, v in truth.items():
            assert law.params_[k] == pytest.approx(v, rel=1e-3), k
        assert law.converged_ and law.r2_ > 1 - 1e-9 and not law.at_bounds_


def test_fit_returns_the_estimator_with_learned_attributes_and_predicts_raw_nats(noisy):
    law = JointLaw(restarts=100)
    assert law.fit(noisy) is law
    assert law.phi_ == law.params_["phi"] and law.alpha_ == law.params_["alpha"]
    pred = law.predict(noisy["N_once"], noisy["N_rec"], noisy["D"], noisy["r"])
    np.testing.assert_allclose(pred, law.predict(noisy))
    assert law.score(noisy) == pytest.approx(law.r2_)
    assert 0.99 < law.r2_ < 1 and law.rmse_ == pytest.approx(0.01, rel=0.3)
    assert set(law.rmse_per_r_) == {1, 2, 4, 8}
    assert law.n_near_optimal_ >= 1 and law.minima_[0]["near_optimal"]
    assert float(law.equivalent_N(1e8, 1e8, 1)) == 2e8
    assert float(law.equivalent_N(1e8, 1e8, 4)) == pytest.approx(1e8 * (1 + 4**law.phi_))
    assert float(JointLaw.cost_equivalent_N(1e8, 1e8, 4)) == 5e8


def test_fixed_phi_gives_the_restricted_fit_with_a_worse_objective(noisy):
    free = JointLaw(restarts=100).fit(noisy)
    for phi in (0.0, 1.0):
        fixed = JointLaw(phi=phi, restarts=100).fit(noisy)
        assert fixed.phi_ == phi
        assert fixed.objective_ > free.objective_ and fixed.r2_ < free.r2_


def test_mse_objective_also_recovers_phi(noisy):
    law = JointLaw(loss="mse", restarts=100).fit(noisy)
    assert law.phi_ == pytest.approx(0.46, abs=0.05)


def test_phi_bounds_are_respected_and_reported_when_active(noisy):
    law = JointLaw(phi_bounds=(0.6, 1.0), restarts=100).fit(noisy)
    assert law.phi_ == pytest.approx(0.6)
    assert "phi" in law.at_bounds_


def test_table_with_only_r1_fits_chinchillas_law_and_leaves_phi_undetermined():
    df = synthetic_runs(0.46, sigma=0.0)
    df = df[df["r"] == 1]
    law = JointLaw(restarts=100).fit(df)
    assert law.phi_ is None and not law.phi_identifiable_
    assert law.alpha_ == pytest.approx(PAPER_COEFFICIENTS["alpha"], rel=1e-3)
    assert law.beta_ == pytest.approx(PAPER_COEFFICIENTS["beta"], rel=1e-3)
    assert "undetermined" in repr(law)


def test_multistart_reports_distinct_minima_best_first(noisy):
    minima = multistart(LawData.from_frame(noisy), restarts=200, polish=8, seed=1)
    objs = [m.objective for m in minima]
    assert objs == sorted(objs)
    thetas = [m.theta for m in minima]
    for i in range(len(thetas)):
        for j in range(i):
            assert np.any(np.abs(thetas[i] - thetas[j]) > np.array([0.05] * 3 + [0.01] * 3))


def test_restarts_start_inside_the_papers_box():
    b = Bounds.paper()
    starts = b.sample(1000, np.random.default_rng(0))
    assert (starts >= b.lower).all() and (starts <= b.upper).all()
    assert b.lower[3] == 0 and b.upper[3] == 2.5 and b.lower[5] == -3 and b.upper[5] == 3


def test_importing_loopscale_fit_never_imports_torch():
    code = (
        "import sys, loopscale.fit, loopscale.fit.pipeline, loopscale.fit.recommend; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
