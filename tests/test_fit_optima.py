"""Compute-optimal analysis: accounting as a function of width, the law's frontier, parabola minima."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale import accounting, grids
from loopscale.config import ModelConfig
from loopscale.fit import PAPER_COEFFICIENTS, JointLaw, empirical_optima, law_frontier, width_polynomials
from loopscale.fit.allocation import empirical_exponents, frontier_draws, frontier_table


@pytest.mark.parametrize(
    "extra",
    [{}, {"injection": "hyperconnect"}, {"bptt_k": 2}, {"seq_len": 256, "head_dim": 64, "vocab_size": 256}],
)
@pytest.mark.parametrize("r", [1, 2, 4, 8])
def test_width_polynomials_equal_the_accounting_at_every_allowed_width(r, extra):
    template = {**grids.PAPER_MODEL, **extra}
    if "bptt_k" in extra and r < 2:
        template.pop("bptt_k")
    poly = width_polynomials(template, r)
    head = template["head_dim"]
    for d in range(head, 40 * head, 7 * head):
        cfg = ModelConfig(**{**template, "d_model": d, "r": r})
        n_once, n_rec, flops = poly.at(d)
        assert n_once == pytest.approx(accounting.N_once(cfg), rel=1e-12)
        assert n_rec == pytest.approx(accounting.N_rec(cfg), rel=1e-12)
        assert flops == pytest.approx(accounting.train_flops_per_token(cfg), rel=1e-12)


def test_law_frontier_is_the_minimum_over_widths_at_fixed_compute():
    law = JointLaw.from_params(**PAPER_COEFFICIENTS)
    for r in (1, 4):
        fr = law_frontier(law.theta_, grids.PAPER_MODEL, [1e18, 1e20], r)
        poly = width_polynomials(grids.PAPER_MODEL, r)
        d = np.exp(np.linspace(np.log(200), np.log(20000), 200001))
        n_once, n_rec, flops = poly.at(d)
        for j, C in enumerate((1e18, 1e20)):
            loss = law.predict(n_once, n_rec, C / flops, r)
            k = int(np.argmin(loss))
            assert fr["d"][j] == pytest.approx(d[k], rel=1e-3)
            assert fr["L"][j] == pytest.approx(loss[k], abs=1e-9)
            assert fr["D"][j] == pytest.approx(C / np.polyval(poly.flops, fr["d"][j]))
            assert fr["interior"][j]


def test_law_frontier_gap_to_r1_grows_with_r_and_compute_optimal_size_grows_with_budget():
    law = JointLaw.from_params(**PAPER_COEFFICIENTS)
    table, exps = frontier_table(law.theta_, grids.PAPER_MODEL, list(grids.PAPER_BUDGETS), [1, 2, 4, 8])
    for _c, g in table.groupby("C"):
        assert list(g.sort_values("r")["gap_to_r1"].diff().dropna() > 0) == [True] * 3
    assert 0.5 < exps["N_exponent_r1"] < 0.8 and 0.3 < exps["D_exponent_r1"] < 0.6
    draws = frontier_draws(np.repeat(law.theta_[None], 3, axis=0), grids.PAPER_MODEL, [1e19], [1, 4])
    row = table[(table["r"] == 4) & (table["C"] == 1e19)].iloc[0]
    assert draws["N_opt_r4_C1e+19"] == pytest.approx([row["N"]] * 3)
    assert draws["gap_to_r1_r4_C1e+19"] == pytest.approx([row["gap_to_r1"]] * 3)


def test_empirical_optimum_is_the_parabola_vertex_in_log_n():
    logN = np.log([5e7, 1e8, 2e8, 4e8])
    vertex = np.log(1.3e8)
    rows = []
    for r, shift in ((1, 0.0), (4, 0.05)):
        for x in logN:
            rows.append(
                {
                    "C": 1e19,
                    "r": r,
                    "N_once": np.exp(x) / 2,
                    "N_rec": np.exp(x) / 2,
                    "D": 1e19 / (6 * np.exp(x)),
                    "val_loss": 2.5 + shift + 0.3 * (x - vertex) ** 2,
                }
            )
    opt = empirical_optima(pd.DataFrame(rows))
    assert opt["N_opt"].to_numpy() == pytest.approx([1.3e8, 1.3e8], rel=1e-9)
    assert opt["L_opt"].to_numpy() == pytest.approx([2.5, 2.55])
    assert opt["D_opt"].to_numpy() == pytest.approx([1e19 / (6 * 1.3e8)] * 2, rel=1e-9)
    assert opt["bracketed"].all() and opt["gap_to_r1"].to_numpy() == pytest.approx([0.0, 0.05])


def test_an_optimum_outside_the_widths_tried_is_flagged_unbracketed():
    rows = [
        {"C": 1e18, "r": 1, "N_once": n, "N_rec": n, "D": 1e9, "val_loss": 3.0 + 0.1 * np.log(n / 1e6) ** 2}
        for n in (2e7, 4e7, 8e7)
    ]
    opt = empirical_optima(pd.DataFrame(rows))
    assert not opt["bracketed"].iloc[0]
    assert empirical_exponents(opt) == {}


def test_a_cell_whose_loss_is_nearly_linear_in_width_takes_its_best_run_not_a_far_vertex():
    """A parabola through three nearly collinear points has its vertex e^100 widths away; reading it as the
    optimum overflowed (exp) and divided by zero. The best run stands in, unbracketed."""
    N = np.array([1e4, 2e4, 4e4])
    x = np.log(N)
    loss = 3.0 + 0.2 * x + 1e-9 * (x - x.mean()) ** 2  # rising with width, curving up by a hair
    df = pd.DataFrame({"C": 1e12, "r": 1, "N_once": N / 2, "N_rec": N / 2, "D": 1e12 / (6 * N), "val_loss": loss})
    row = empirical_optima(df).iloc[0]
    assert row["method"] == "best run" and not row["bracketed"] and row["N_opt"] == pytest.approx(1e4)
    assert np.isfinite(row["tokens_per_param"])
