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
