"""Δφ under the shared-law reading (fit/inference/shared.py): one law for both recipes, differing only in φ, and the
held-out test of that assumption."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.fit.inference import shared
from loopscale.fit.law.joint import JointLaw
from loopscale.fit.result import DeltaPhi
from test_fit_inference import _demo_like


def _pair(delta: float) -> tuple:
    ref = _demo_like(0.4, 0.01, 0)
    var = _demo_like(0.4 + delta, 0.01, 1, "probe")
    return ref, var[var["r"] > 1]  # the variant shares the reference's r = 1 runs


def test_a_variant_that_shares_the_law_gets_its_delta_phi_back_and_the_shared_reading_stands() -> None:
    ref, var = _pair(0.4)
    rec = shared.shared_record(ref, var, JointLaw(restarts=60))
    assert rec.delta_phi == pytest.approx(0.4, abs=0.05) and rec.phi_reference == pytest.approx(0.4, abs=0.05)
    assert rec.converged and not rec.at_bound and rec.interval is None
    assert rec.held_out is not None and rec.held_out.supported == "shared" and rec.held_out.cells == 9


def test_a_variant_whose_data_term_differs_is_read_as_separate_laws() -> None:
    ref, var = _pair(0.4)
    var = var.copy()
    var["val_loss"] = var["val_loss"] * (1 + 0.03 * np.log(var["D"] / var["D"].min()))  # another B D^-beta
    rec = shared.shared_record(ref, var, JointLaw(restarts=60))
    held = rec.held_out
    assert held is not None and held.shared_rmse is not None and held.separate_rmse is not None
    assert held.supported == "separate" and held.shared_rmse > 2 * held.separate_rmse


def test_fit_runs_reports_the_shared_reading_beside_the_calibrated_separate_delta_phi() -> None:
    import pandas as pd

    from loopscale.fit import FitSettings, fit_runs

    ref, var = _pair(0.4)
    res = fit_runs(
        pd.concat([ref, var]),
        FitSettings(restarts=60, bootstrap=0, lr_draws=100, checks=False, per_r=False, law_variants=(), delta=0.02),
    )
    (d,) = res.delta_phi
    assert d.shared is not None and d.loss_gap is not None and d.loss_gap.ci is not None
    assert d.shared.delta_phi == pytest.approx(d.delta_phi, abs=0.1) and d.shared.held_out is None
    gap = d.loss_gap  # φ 0.8 vs 0.4 at the same N: lower loss on every matched looped run
    assert gap.n_runs == len(var) and gap.ci[1] < 0 and gap.lower_in_cells == 1.0
    from loopscale.report.honesty import loss_gap_verdict

    assert d.ci[0] > 0 and "capacity gain" in (loss_gap_verdict(d) or "")


def test_the_loss_gap_pairs_the_same_runs_and_reads_lower_loss_with_falling_phi_as_a_token_budget_gain() -> None:
    from loopscale.report.honesty import loss_gap_reading, loss_gap_verdict

    ref, _ = _pair(0.0)
    var = ref[ref["r"] > 1].copy()
    var["variant"] = "probe"
    var["D"] = var["D"] * 1.5  # a cheaper backward: more tokens at the same C
    rng = np.random.default_rng(3)
    var["val_loss"] = var["val_loss"] - 0.05 + 0.01 * rng.standard_normal(len(var))
    gap = shared.loss_gap(ref, var)
    assert gap is not None and gap.ci is not None
    assert gap.mean == pytest.approx(-0.05, abs=0.01) and gap.ci[0] < -0.05 < gap.ci[1] < 0
    assert gap.n_runs == len(var) and gap.n_cells == len(var.groupby(["C", "r", "d_model"]))
    rec = DeltaPhi(reference="baseline", variant="probe", delta_phi=-0.1, ci=[-0.2, -0.02], loss_gap=gap)
    assert "token-budget gain" in (loss_gap_verdict(rec) or "") and "nats" in (loss_gap_reading(rec) or "")
    assert "Δφ cannot tell" in (loss_gap_verdict(rec.model_copy(update={"ci": [-0.2, 0.1]})) or "")
    wide = rec.model_copy(update={"loss_gap": gap.model_copy(update={"ci": [-0.01, 0.02]})})
    assert loss_gap_verdict(wide) == "no loss difference resolved"
    assert shared.loss_gap(ref, var.drop(columns="seed")) is None  # a table from elsewhere: nothing to pair
    assert shared.loss_gap(ref, var.iloc[:0]) is None


def test_the_loss_gap_of_seed_means_pairs_cells_and_counts_the_runs_behind_them() -> None:
    from loopscale.fit.table import validate_runs

    ref, _ = _pair(0.0)
    two = [ref.assign(seed=s, run_id=ref["run_id"] + f"_s{s}") for s in (0, 1)]
    var = [t[t["r"] > 1].assign(variant="probe", val_loss=t["val_loss"] - 0.03, run_id=t["run_id"] + "_p") for t in two]
    var[0] = var[0].assign(seed=5)  # another seed numbering: a seed-mean row keeps its first run's seed
    means = validate_runs(pd.concat([*two, *var])).seed_means().df
    gap = shared.loss_gap(means[means["variant"] == "baseline"], means[means["variant"] == "probe"])
    looped = ref[ref["r"] > 1]
    assert gap is not None and gap.mean == pytest.approx(-0.03)
    assert gap.n_cells == len(looped.groupby(["C", "r", "d_model"])) and gap.n_runs == 2 * len(looped)
