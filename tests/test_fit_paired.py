"""Paired Δφ (fit/inference/paired.py): one law for both recipes, the law's misfit at each point shared by them, and
the held-out test that decides whether it leads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.fit.inference import paired, profile
from loopscale.fit.law.formula import params_to_theta
from loopscale.fit.law.formula import predict as predict_theta
from loopscale.fit.law.joint import JointLaw
from loopscale.fit.parts import bootstrap_cells
from loopscale.fit.result import DeltaInference, Leading, PairedDelta, PairedReading, Test
from test_fit_inference import DEMO_RUNS, LAW


def _tables(delta: float, *, shared: float = 0.05, own: float = 0.0, sigma: float = 0.01, seed: int = 0):
    """The demo's grid: the reference at phi 0.6, the technique at 0.6 + delta on its looped points; both miss the
    law by the same ``shared`` misfit per point, the technique by ``own`` more, each run by ``sigma``."""
    df = pd.read_csv(DEMO_RUNS)
    df = df[df["variant"] == "baseline"].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    m = shared * rng.standard_normal(len(df))
    ref = df.copy()
    law = {**LAW, "phi": 0.6}
    ref["val_loss"] = predict_theta(params_to_theta(law), df.N_once, df.N_rec, df.D, df.r) + m
    ref["val_loss"] += sigma * rng.standard_normal(len(df))
    looped = (df["r"] > 1).to_numpy()
    var = df[looped].copy()
    clean = predict_theta(params_to_theta({**law, "phi": 0.6 + delta}), var.N_once, var.N_rec, var.D, var.r)
    var["val_loss"] = clean + m[looped] + sigma * rng.standard_normal(len(var)) + own * rng.standard_normal(len(var))
    var["variant"] = "probe"
    var["run_id"] = var["run_id"].str.replace("baseline", "probe")
    return ref, var


def _paired(ref: pd.DataFrame, var: pd.DataFrame, draws: int = 200, checks: bool = True) -> PairedDelta | None:
    cells, _ = bootstrap_cells(pd.concat([ref, var], ignore_index=True))
    V = profile.webb_weights(int(cells.max()) + 1, draws, np.random.default_rng(1))
    law = JointLaw(restarts=60, delta=0.02)
    a = law.clone().fit(ref).theta_
    b = law.clone().fit(pd.concat([ref[ref["r"] == 1], var])).theta_
    starts = paired.starts_from(a, b)
    return paired.paired_delta_phi(ref, var, cells[: len(ref)], cells[len(ref) :], V, law, starts, 0.95, checks=checks)


SEPARATE = DeltaInference(estimate=0.05, ci=[-0.4, 0.5], tests={"delta_phi=0": Test(p=0.7, rejected=False)})


def _reading(rec: PairedDelta, model: str) -> PairedReading:
    r = paired.reading(rec, model)
    assert r is not None and r.ci is not None
    return r


def _lead(rec: PairedDelta | None, separate: DeltaInference | None = SEPARATE) -> Leading:
    lead = paired.leading(rec, separate)
    assert lead is not None and lead.reading is not None and lead.reason is not None
    return lead


def test_a_technique_sharing_the_references_misfit_gets_its_delta_phi_back_and_the_shared_law_reading_leads() -> None:
    ref, var = _tables(0.19)
    rec = _paired(ref, var)
    assert rec is not None and rec.n_pairs == len(var) and rec.match == ["C", "r", "d_model", "seed"]
    for model in paired.MODELS:
        r = _reading(rec, model)
        lo, hi = r.ci  # type: ignore[misc]
        assert r.model == model and lo < 0.19 < hi and lo > 0 and hi - lo < 0.4  # misfit 0.05, noise 0.01
        zero = r.tests["delta_phi=0"]
        assert zero.rejected and zero.p is not None and zero.p < 0.05
    sl = _reading(rec, "shared law")
    m = sl.misfit
    assert m is not None and m.shared_fraction is not None and m.shared_fraction > 0.8
    assert m.shared_sd == pytest.approx(0.02, rel=0.6)
    held = rec.held_out
    assert held is not None and held.comparisons is not None
    assert held.rmse["shared law"] < held.rmse["separate fits"] / 2  # type: ignore[operator]
    assert not any(c.worse for c in held.comparisons.values())
    lead = _lead(rec)
    assert lead.reading == "paired (shared law)" and lead.ci == sl.ci and "shares the reference's misfit" in lead.reason


def test_the_paired_interval_contains_exactly_the_values_its_test_does_not_reject() -> None:
    ref, var = _tables(0.0, seed=2)
    rec = _paired(ref, var, checks=False)
    assert rec is not None and rec.held_out is None
    for model in paired.MODELS:
        r = _reading(rec, model)
        lo, hi = r.ci  # type: ignore[misc]
        assert (lo <= 0 <= hi) == (not r.tests["delta_phi=0"].rejected)
        assert r.profile is not None and r.critical_value is not None
        stat, d = np.asarray(r.profile.stat), np.asarray(r.profile.delta_phi)
        inside = d[stat <= r.critical_value]
        assert lo == pytest.approx(inside.min(), abs=0.006) and hi == pytest.approx(inside.max(), abs=0.006)
        assert stat.max() > r.critical_value  # the profile was followed past both ends
    lead = _lead(rec)
    assert lead.reading == "separate fits" and "not tested" in lead.reason
    assert paired.leading(rec, None) is None


def test_a_paired_reading_at_its_box_never_leads_and_the_reason_names_each_readings_failure() -> None:
    ref, var = _tables(0.0, seed=3)
    var = var.copy()  # the looped runs of the technique lose 0.1-0.4 nats that no phi of the law can give
    law = {**LAW, "phi": 0.6}
    var["val_loss"] = var["val_loss"] + 0.3 * law["B"] * var["D"].to_numpy(float) ** -law["beta"]
    rec = _paired(ref, var)
    assert rec is not None
    sl = _reading(rec, "shared law")
    assert sl.at_bound and sl.estimate == pytest.approx(-2.0)
    lead = _lead(rec)
    assert lead.reading != "paired (shared law)"
    assert "paired (shared law): its Δφ ran to its box" in lead.reason or "does not lead: its Δφ ran" in lead.reason


def test_when_the_misfit_is_not_shared_the_held_out_test_says_so_and_the_separate_fits_lead() -> None:
    ref, var = _tables(0.0, shared=0.0, seed=5)
    rng = np.random.default_rng(11)
    ref, var = ref.copy(), var.copy()  # each recipe misses the law by its own 0.1 nats per point
    ref["val_loss"] += 0.1 * rng.standard_normal(len(ref))
    var["val_loss"] += 0.1 * rng.standard_normal(len(var))
    rec = _paired(ref, var)
    assert rec is not None
    held = rec.held_out
    assert held is not None and held.comparisons is not None
    assert held.rmse["separate laws"] > held.rmse["separate fits"]  # type: ignore[operator]
    lead = _lead(rec)
    if held.comparisons["separate laws vs separate fits"].worse:
        assert lead.reading == "separate fits" and "the misfit is not shared" in lead.reason
    else:  # not contradicted: a paired reading may lead, and says what it rests on
        assert lead.reading.startswith("paired") and "as well as its own law" in lead.reason


def test_without_a_width_and_seed_to_match_on_there_is_no_paired_reading_and_the_separate_fits_lead() -> None:
    ref, var = _tables(0.0)
    assert _paired(ref.drop(columns=["d_model", "seed"]), var.drop(columns=["d_model", "seed"])) is None
    lead = _lead(None)
    assert lead.reading == "separate fits" and "no paired reading" in lead.reason


def test_seed_means_pair_on_budget_r_and_width() -> None:
    ref, var = _tables(0.0)
    ref, var = ref.assign(n_seeds=1), var.assign(n_seeds=1)
    cells, _ = bootstrap_cells(pd.concat([ref, var], ignore_index=True))
    pair = paired.Pairing.of(ref, var, cells[: len(ref)], cells[len(ref) :])
    assert pair.keys == ("C", "r", "d_model") and pair.n_pairs == len(var)
    assert len(pair.single_r) == len(pair.anchor) == int((ref["r"] == 1).sum()) and not len(pair.single_v)


def test_fit_runs_puts_the_paired_readings_in_the_variants_inference_record_and_quotes_the_leading_one(
    tmp_path,
) -> None:
    from loopscale.fit import FitSettings, fit_runs
    from loopscale.fit.fitfile import load_fit, write_fit

    ref, var = _tables(0.19, seed=4)
    settings = FitSettings(
        restarts=60,
        bootstrap=0,
        lr_draws=200,
        checks=True,
        checks_restarts=20,
        per_r=False,
        law_variants=(),
        delta=0.02,
    )
    res = fit_runs(pd.concat([ref, var], ignore_index=True), settings)
    (d,) = res.delta_phi
    rec = res.variants["probe"].inference.paired_delta_phi  # type: ignore[union-attr]
    assert rec is not None and rec.held_out is not None and d.leading is not None and d.inference is not None
    assert rec.reference == "baseline" and set(paired.MODELS) <= set(rec.held_out.rmse)
    assert d.leading.reading == "paired (shared law)" and d.ci == _reading(rec, "shared law").ci == d.leading.ci
    assert d.inference.ci != d.ci  # the separate fits' interval stays in its own record
    path = tmp_path / "fit.json"
    write_fit(path, res)
    back = load_fit(path)
    assert back.delta_phi[0].leading == d.leading
    back_paired = back.variants["probe"].inference.paired_delta_phi  # type: ignore[union-attr]
    assert back_paired is not None and _reading(back_paired, "shared law").ci == _reading(rec, "shared law").ci
    from loopscale.report.honesty import delta_phi_reading

    assert "(paired (shared law))" in delta_phi_reading(back.delta_phi[0])
