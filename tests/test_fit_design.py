"""`loopscale design`: simulate a planned study with the real fitter before spending the compute."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from loopscale.cli import run_app
from loopscale.fit import synthetic_runs
from loopscale.fit.design import DesignSettings, Noise, estimate_noise, search, simulate, study_cost, variants
from loopscale.fit.law.joint import params_to_theta
from loopscale.fit.paper import PAPER_COEFFICIENTS
from loopscale.fit.synthetic import paper_grid_table

FAST = DesignSettings(sims=4, bootstrap=12, restarts=30, workers=1)


@pytest.fixture(scope="module")
def grid():
    g = paper_grid_table()
    return g[g["C"] >= 4.64e18].reset_index(drop=True)  # 3 budgets, 60 runs


def test_simulate_reports_width_bias_coverage_power_and_bracketing(grid):
    res = simulate(grid, PAPER_COEFFICIENTS, Noise(0.01, 0.0), FAST)
    assert res.sims == 4 and res.n_runs == len(grid) and res.n_cells == 12
    assert 0 < res.ci_width < 0.5 and abs(res.bias) < 0.1
    assert 0 <= res.coverage <= 1 and res.reject_0 == 1.0
    assert set(res.bracketed) == {f"{c:.3g}|{r}" for c in (4.64e18, 1e19, 2.15e19) for r in (1, 2, 4, 8)}
    assert res.cost_flops == pytest.approx(study_cost(grid))
    # the interval `fit` quotes (fit/inference/profile.py), simulated as well: width, coverage, tests
    assert 0 < res.lr_ci_width_median <= res.lr_ci_width * 2 and 0 <= res.lr_coverage <= 1
    assert res.lr_reject_0 == 1.0 and 0 <= res.identified <= 1


def test_more_noise_widens_the_ci(grid):
    quiet = simulate(grid, PAPER_COEFFICIENTS, Noise(0.005, 0.0), FAST, with_bootstrap=False)
    loud = simulate(grid, PAPER_COEFFICIENTS, Noise(0.005, 0.03), FAST, with_bootstrap=False)
    assert loud.sampling_width > quiet.sampling_width


def test_noise_is_estimated_from_seeds_and_cells():
    grid = paper_grid_table()
    theta = params_to_theta(PAPER_COEFFICIENTS)
    rng = np.random.default_rng(0)
    cells = pd.factorize(grid["C"].astype(str) + "|" + grid["r"].astype(str))[0]
    u = 0.02 * rng.standard_normal(cells.max() + 1)
    parts = []
    for s in range(4):
        d = synthetic_runs(0.459, sigma=0.01, seed=100 + s)
        d["val_loss"] += u[cells]
        parts.append(d.assign(run_id=d["run_id"] + f"_s{s}"))
    noise = estimate_noise(pd.concat(parts, ignore_index=True), theta)
    assert noise.run_sd == pytest.approx(0.01, rel=0.15) and noise.cell_sd == pytest.approx(0.02, rel=0.35)
    assert "seeds" in noise.source


def test_variants_and_search_rank_grids_by_cost(grid):
    vs = variants(grid)
    assert {"as planned", "2 seeds per run", "budgets x 0.5", "without C = 1e+19"} <= set(vs)
    assert len(vs["2 seeds per run"]) == 2 * len(grid)
    rows, best = search(grid, PAPER_COEFFICIENTS, Noise(0.01, 0.0), FAST, target=1.0, sims=3)
    costs = [r.cost_flops for r in rows]
    assert costs == sorted(costs) and best is not None and best.cost_flops == min(costs)


def test_cli_design_on_a_preset(capsys):
    args = [
        "design",
        "quick",
        "--sims",
        "2",
        "--bootstrap",
        "4",
        "--restarts",
        "20",
        "--workers",
        "1",
        "--no-search",
        "--json",
    ]
    assert run_app(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["result"]["n_runs"] == 16 and doc["result"]["sims"] == 2 and doc["prior_law"]["phi"] == 0.459


def test_cli_design_prints_styles_not_their_tags(capsys):
    """The console has markup off by default; a styled line that forgets markup=True prints '[bold]'."""
    args = [
        "design",
        "quick",
        "--sims",
        "2",
        "--bootstrap",
        "4",
        "--restarts",
        "20",
        "--workers",
        "1",
        "--search-sims",
        "2",
        "--target-width",
        "5",
    ]
    assert run_app(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("quick: 16 runs")
    assert "[bold]" not in out and "[/]" not in out and "\\[" not in out


def test_noise_estimated_against_a_prior_that_misses_the_runs_by_nats_is_flagged(tmp_path, capsys) -> None:
    """`design --noise-from runs.csv` with the paper's law as prior read tiny CPU runs' misfit (4.9 / 20.5 nats)
    as their noise, silently."""
    import numpy as np

    from loopscale.cli.design import _noise
    from loopscale.fit.paper import PAPER_COEFFICIENTS

    rng = np.random.default_rng(0)
    rows = [
        f"baseline,{c},{r},{n},{n},{d},{3 + rng.normal(0, 0.01) + 5 * (r > 1)}"
        for c in (1e11, 2e11)
        for r in (1, 2)
        for n, d in ((1e4, 1e6), (2e4, 5e5))
    ]
    csv = tmp_path / "runs.csv"
    csv.write_text("variant,C,r,N_once,N_rec,D,val_loss\n" + "\n".join(rows) + "\n")
    est = _noise(None, None, [csv], dict(PAPER_COEFFICIENTS), None, None)
    assert max(est.run_sd, est.cell_sd) > 0.5
    assert "that is the law's misfit, not noise; pass --prior" in " ".join(capsys.readouterr().err.split())


def test_the_point_misfit_seeds_do_not_average_is_estimated_apart_from_the_seed_noise():
    """8 seeds of the probe study were no narrower than 4: the law missed each (budget, r, width) point by more
    than the seed noise, and the old estimate folded that into the per-run noise that seeds average away."""
    grid = paper_grid_table()
    theta = params_to_theta(PAPER_COEFFICIENTS)
    rng = np.random.default_rng(1)
    m = 0.03 * rng.standard_normal(len(grid))  # a misfit per design point, the same for every seed
    parts = []
    for s in range(4):
        d = synthetic_runs(0.459, sigma=0.01, seed=200 + s)
        d["val_loss"] += m
        parts.append(d.assign(run_id=d["run_id"] + f"_s{s}", seed=s))
    noise = estimate_noise(pd.concat(parts, ignore_index=True), theta)
    assert noise.run_sd == pytest.approx(0.01, rel=0.15) and noise.point_sd == pytest.approx(0.03, rel=0.25)
    assert noise.misfit_sd == pytest.approx(np.hypot(noise.cell_sd, noise.point_sd))
    fitted = estimate_noise(pd.concat(parts, ignore_index=True), theta, fitted=True)
    assert fitted.point_sd > noise.point_sd and "dof-corrected" in fitted.source


def test_a_point_misfit_is_shared_by_seeds_and_correlated_with_a_paired_technique():
    from loopscale.fit.design import misfit_draw, point_keys, seed_means, simulate_table

    grid = paper_grid_table().assign(seed=0)
    two = pd.concat([grid, grid.assign(seed=1)], ignore_index=True)
    theta = params_to_theta(PAPER_COEFFICIENTS)
    nz = Noise(0.0, 0.0, point_sd=0.05, shared=1.0)
    L = simulate_table(two, theta, nz, 0, 0)
    assert np.allclose(L[: len(grid)], L[len(grid) :])  # no run noise: both seeds carry the point's misfit
    same = misfit_draw(grid, nz, 0, 0, "technique")
    assert np.allclose(same, misfit_draw(grid, nz, 0, 0))
    half = misfit_draw(grid, Noise(0.0, 0.0, point_sd=0.05, shared=0.5), 0, 0, "technique")
    assert 0.2 < np.corrcoef(half, misfit_draw(grid, nz, 0, 0))[0, 1] < 0.8
    means, Lm = seed_means(two, L)
    assert len(means) == len(grid) and (means["n_seeds"] == 2).all() and len(set(point_keys(means))) == len(grid)
    assert np.allclose(Lm, L[: len(grid)])


def test_simulated_paired_studies_read_delta_phi_three_ways_and_the_search_ranks_grids_by_cost():
    from loopscale.fit.paired_design import READINGS, pair_variants, search_pair, simulate_pair
    from test_fit_inference import DEMO_RUNS, LAW

    g = pd.read_csv(DEMO_RUNS)
    g = g[g["variant"] == "baseline"].reset_index(drop=True)
    tech = g[g["r"] > 1].assign(D=g.loc[g["r"] > 1, "D"] * 1.2)  # its own accounting: more tokens
    st = DesignSettings(sims=1, restarts=20, lr_draws=100, workers=1, delta=0.02)
    prior = {**LAW, "phi": 0.6}
    res = simulate_pair(g, tech, prior, 0.1, Noise(0.005, 0.0, point_sd=0.03), st)
    assert res.sims == 1 and set(res.readings) == set(READINGS) and res.n_technique_runs == len(tech)
    for r in res.readings.values():
        assert r.n == 1 and r.median_half_width > 0 and 0 <= r.coverage <= 1
    assert sum(res.leads.values()) == pytest.approx(1.0)
    assert res.readings["paired (shared law)"].median_half_width < res.readings["separate fits"].median_half_width
    vs = pair_variants(g, tech)
    assert vs["2 seeds per point"][2] == 2.0 and len(vs["2 seeds per point"][0]) == 2 * len(g)
    rows = search_pair(g, tech, prior, 0.1, Noise(0.005, 0.0, point_sd=0.03), st, sims=3)
    assert [r.relative_cost for r in rows] == sorted(r.relative_cost for r in rows) and all(
        r.sampling_half_width > 0 for r in rows
    )
