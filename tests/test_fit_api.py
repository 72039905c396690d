"""The fit's public shape: one law module, the estimator API, the typed fit result and old fit files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from loopscale import grids
from loopscale.errors import ConfigError
from loopscale.fit import (
    FitResult,
    FitSettings,
    JointLaw,
    NotFittedError,
    PhiState,
    clone,
    load_fit,
    read_fit,
)
from loopscale.fit import allocation as optima
from loopscale.fit.fitfile import law_from_fit, write_fit
from loopscale.fit.inference.verdict import phi_verdict, verdicts
from loopscale.fit.law import formula, variants
from loopscale.fit.law.structure import LoopTaxLaw
from loopscale.fit.paper import PAPER_COEFFICIENTS
from loopscale.fit.parts import derived_from_params
from loopscale.fit.synthetic import synthetic_runs

#: a fit file written by loopscale before the typed result existed (tests/fixtures/fit/fit_v1.json).
OLD_FIT = Path(__file__).parent / "fixtures" / "fit" / "fit_v1.json"
SRC = Path(__file__).resolve().parents[1] / "src" / "loopscale"
BOX = {
    "a": (0.0, 20.0),
    "b": (0.0, 25.0),
    "e": (-1.0, 2.0),
    "alpha": (0.0, 1.5),
    "beta": (0.0, 1.5),
    "phi": (-3.0, 3.0),
}


# ---- estimator API ------------------------------------------------------------------------------
def test_params_come_from_init_and_round_trip() -> None:
    law = JointLaw(loss="mse", delta=0.01, phi=0.5, restarts=7, polish=2, seed=3, box=BOX, advance=5)
    params = law.get_params()
    assert params == {
        "loss": "mse",
        "delta": 0.01,
        "phi": 0.5,
        "phi_bounds": (-3.0, 3.0),
        "restarts": 7,
        "polish": 2,
        "seed": 3,
        "box": BOX,
        "advance": 5,
    }
    assert JointLaw(**params).get_params() == params
    assert law.set_params(restarts=9, phi=None) is law
    assert (law.restarts, law.phi) == (9, None)
    with pytest.raises(ValueError, match="invalid parameter 'nope'"):
        law.set_params(nope=1)


def test_clone_keeps_every_setting_including_box_and_is_unfitted() -> None:
    law = JointLaw(box=BOX, restarts=11, advance=4).fit(synthetic_runs(seed=1).head(40))
    for copy in (clone(law), law.clone(), law.clone(restarts=3)):
        assert copy.box == BOX and copy.advance == 4
        assert "theta_" not in copy.__dict__
    assert law.clone(restarts=3).restarts == 3
    tax = LoopTaxLaw(JointLaw(box=BOX, seed=5), tax_bounds=(-0.2, 0.2))
    for copy in (clone(tax), tax.clone(restarts=2)):
        assert copy.base.box == BOX and copy.base.seed == 5 and copy.tax_bounds == (-0.2, 0.2)
    assert tax.get_params()["base__box"] == BOX


def test_predict_before_fit_says_not_fitted() -> None:
    with pytest.raises(NotFittedError, match="not fitted yet"):
        JointLaw().predict(1e6, 1e6, 1e9, 2)
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)
    assert "phi=None" in repr(JointLaw())
    with pytest.raises(NotFittedError, match="LoopTaxLaw is not fitted"):
        LoopTaxLaw().predict(1e6, 1e6, 1e9, 2)


def test_fit_settings_build_the_law_and_validate_once() -> None:
    s = FitSettings(loss="mse", delta=0.02, phi_bounds=(-1.0, 2.0), fixed_phi=0.25, restarts=33, polish=3, seed=4)
    law = s.law()
    assert (law.loss, law.delta, law.phi_bounds, law.phi, law.restarts, law.polish, law.seed) == (
        "mse",
        0.02,
        (-1.0, 2.0),
        0.25,
        33,
        3,
        4,
    )
    assert s.law(phi=1.0, restarts=5).get_params() | {"phi": 0.25, "restarts": 33} == law.get_params()
    # one rule, two spellings of the name: the CLI flag for settings, the parameter for the law
    with pytest.raises(ConfigError, match="--phi-bounds"):
        FitSettings(phi_bounds=(1.0, 1.0)).validate()
    with pytest.raises(ConfigError, match="phi_bounds"):
        JointLaw(phi_bounds=(1.0, 1.0)).fit(synthetic_runs(seed=1).head(40))
    with pytest.raises(ConfigError, match="--delta"):
        FitSettings(delta=0.0).validate()
    with pytest.raises(ConfigError, match="delta"):
        JointLaw(delta=0.0).fit(synthetic_runs(seed=1).head(40))


def test_law_variants_come_from_the_registry() -> None:
    assert {"loop_tax": LoopTaxLaw} == variants.REGISTRY
    assert isinstance(variants.make("loop_tax", JointLaw()), LoopTaxLaw)
    with pytest.raises(ConfigError, match="unknown law variant"):
        variants.make("nope", JointLaw())


# ---- one law module -----------------------------------------------------------------------------
def _paper_theta() -> np.ndarray:
    return formula.params_to_theta(PAPER_COEFFICIENTS)


def test_formula_is_the_law() -> None:
    t = _paper_theta()
    p = PAPER_COEFFICIENTS
    n_once, n_rec, D, r = np.array([3e7, 5e7]), np.array([2e7, 0.0]), np.array([1e9, 3e9]), np.array([4, 1])
    expected = p["E"] + p["A"] * (n_once + r ** p["phi"] * n_rec) ** -p["alpha"] + p["B"] * D ** -p["beta"]
    np.testing.assert_allclose(formula.predict(t, n_once, n_rec, D, r), expected, rtol=1e-12)
    assert t[formula.Slot.PHI] == p["phi"] and t[formula.Slot.ALPHA] == p["alpha"]
    assert formula.theta_to_params(t) == pytest.approx(p)
    # the Jacobian is the derivative of the residuals
    data = formula.LawData.from_arrays(n_once, n_rec, D, r, expected * 1.01)
    _, J = formula.residuals(t[None], data, jac=True)
    assert J is not None
    for k in formula.Slot:
        step = np.zeros(formula.N_THETA)
        step[k] = 1e-6
        num = (
            formula.residuals((t + step)[None], data, False)[0] - formula.residuals((t - step)[None], data, False)[0]
        ) / 2e-6
        np.testing.assert_allclose(J[0, :, k], num[0], rtol=1e-5, atol=1e-9)


def test_frontier_plan_and_derived_use_the_formula_module() -> None:
    t = _paper_theta()
    template = dict(grids.PAPER_MODEL)
    fr = optima.law_frontier(t, template, [1e18, 1e19], 4)
    phi = t[formula.Slot.PHI]
    assert np.array_equal(fr["N_eq"], formula.equivalent_N(fr["N_once"], fr["N_rec"], 4, phi))
    assert np.array_equal(fr["L"], formula.predict(t, fr["N_once"], fr["N_rec"], fr["D"], 4))
    law = JointLaw.from_params(**PAPER_COEFFICIENTS)
    assert np.array_equal(law.equivalent_N(1e7, 2e7, 4), formula.equivalent_N(1e7, 2e7, 4, phi))
    assert np.array_equal(law.predict(1e7, 2e7, 1e9, 4), formula.predict(t, 1e7, 2e7, 1e9, 4))
    derived = derived_from_params(dict(PAPER_COEFFICIENTS), [1, 4])
    assert derived["r_phi_4"] == formula.r_power(4.0, phi)


def test_no_literal_theta_slots_outside_the_formula_module() -> None:
    """theta is indexed by ``formula.Slot`` names: ``t[:, 5]`` or ``theta[..., 3]`` nowhere else."""
    pattern = re.compile(r"\b(t|th|theta|thetas|draws)\[(:|\.\.\.), *\d")
    hits = [
        f"{p.relative_to(SRC)}:{i}"
        for p in SRC.rglob("*.py")
        if p.name != "formula.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


# ---- typed fit result and old fit files ---------------------------------------------------------
def test_old_fit_file_loads_typed() -> None:
    res = load_fit(OLD_FIT)
    assert isinstance(res, FitResult) and res.version == 1
    assert res.reference == "baseline" and set(res.variants) == {"baseline", "wide"}
    base = res.variant()
    assert base.phi == pytest.approx(0.461, abs=1e-3) and res.phi_state() is PhiState.ESTIMATED
    lo, hi = base.bootstrap.ci_of("phi")  # type: ignore[misc]
    assert lo < base.phi < hi
    assert base.bootstrap.draws_of("phi").shape == (12,)
    assert phi_verdict(res, "baseline").phi == base.phi
    assert set(verdicts(res)) == {"baseline", "wide"}
    law, draws = law_from_fit(res)
    assert law.phi_ == base.phi and draws is not None and draws.shape[1] == formula.N_THETA
    # the typed path and the dict path read the same numbers
    law_d, draws_d = law_from_fit(read_fit(OLD_FIT))
    assert np.array_equal(law.theta_, law_d.theta_) and np.array_equal(draws, draws_d)


def test_typed_result_writes_the_identical_fit_file(tmp_path: Path) -> None:
    res = load_fit(OLD_FIT)
    assert res.to_dict() == read_fit(OLD_FIT)
    out = write_fit(tmp_path / "fit.json", res)
    assert out.read_text() == OLD_FIT.read_text()
    again = write_fit(
        tmp_path / "again.json", {k: v for k, v in read_fit(OLD_FIT).items() if k not in ("format", "version")}
    )
    assert again.read_text() == OLD_FIT.read_text()


#: every fit file the tests keep: the old one and the two the report tests render (probes: Δφ with paired readings)
FIT_FILES = [OLD_FIT, *sorted((Path(__file__).parent / "fixtures" / "report").glob("*/fit.json"))]


@pytest.mark.parametrize("path", FIT_FILES, ids=lambda p: p.parent.name)
def test_every_kept_fit_file_round_trips_byte_identically_through_the_typed_result(path: Path, tmp_path: Path) -> None:
    res = load_fit(path)
    assert write_fit(tmp_path / "fit.json", res).read_text() == path.read_text()


def test_the_fit_result_is_typed_to_its_leaves_and_has_no_dict_view() -> None:
    from loopscale.fit import result as R

    res = load_fit(Path(__file__).parent / "fixtures" / "report" / "probes" / "fit.json")
    assert isinstance(res.settings, FitSettings) and res.settings.loss == "huber"
    v = res.variant()
    inf = v.inference
    assert inf is not None and isinstance(inf.phi, R.Interval) and isinstance(inf.null, R.NullTables)
    assert all(isinstance(t, R.Test) for t in inf.tests.values()) and isinstance(inf.secondary, R.Secondary)
    assert isinstance(v.checks, R.Checks) and isinstance(v.checks.held_out, R.HeldOutErrors)
    assert all(isinstance(x, R.LeftOut) for x in (v.checks.leave_one_r_out or {}).values())
    assert isinstance(v.identifiability, R.Identifiability)
    assert all(isinstance(x.held_out, R.HeldOutErrors) for x in v.restricted.values())
    d = res.delta_phi[0]
    assert isinstance(d.inference, R.DeltaInference) and isinstance(d.loss_gap, R.LossGap)
    assert isinstance(d.leading, R.Leading) and d.shared is None  # the fixture fits without the shared reading
    shared = R.DeltaPhi.model_validate(
        {"reference": "a", "variant": "b", "shared": {"delta_phi": 0.1, "held_out": {"supported": "shared"}}}
    ).shared
    assert isinstance(shared, R.SharedReading) and isinstance(shared.held_out, R.SharedHeldOut)
    paired = res.variant(d.variant).inference.paired_delta_phi  # type: ignore[union-attr]
    assert isinstance(paired, R.PairedDelta) and isinstance(paired.held_out, R.PairedHeldOut)
    assert isinstance(paired.shared_law, R.PairedReading) and isinstance(paired.shared_law.misfit, R.Misfit)
    # null in the file is NaN in memory, and NaN is null again when written
    assert inf.phi.ends is not None and all(np.isfinite(inf.phi.ends))
    for record in (res, v, inf, inf.phi, d, paired):
        assert not hasattr(record, "__getitem__") and not hasattr(record, "get")  # read by attribute only


def test_a_fit_file_with_null_where_a_number_was_nan_loads() -> None:
    """json_ready writes NaN as null: an undetermined exponent, a per-r RMSE or an open interval must load."""
    doc = json.loads((Path(__file__).parent / "fixtures" / "report" / "probes" / "fit.json").read_text())
    rec = next(iter(doc["variants"].values()))
    rec["optima"]["frontier_exponents"]["N_exponent_r1"] = None
    rec["optima"]["empirical_exponents"] = {"N_exponent_r1": None}
    rec["checks"]["extrapolation"]["rmse_per_r"]["1"] = None
    rec["inference"]["phi"]["ci"] = [None, None]
    res = FitResult.of(doc)
    assert res.variant().inference.phi.ends is None  # type: ignore[union-attr]
    assert res.variant().optima.frontier_exponents["N_exponent_r1"] is None


def test_phi_state_replaces_none_checks() -> None:
    doc = json.loads(OLD_FIT.read_text())
    doc["variants"]["wide"]["law"]["params"]["phi"] = None
    res = FitResult.of(doc)
    assert res.phi_state("wide") is PhiState.UNDETERMINED and res.variant("wide").phi is None
    assert not phi_verdict(res, "wide").resolved
    doc["settings"]["fixed_phi"] = 0.5
    assert FitResult.of(doc).phi_state("baseline") is PhiState.FIXED
    law = JointLaw.from_params(**{**PAPER_COEFFICIENTS, "phi": None})
    assert law.phi_undetermined and law.phi_state_ is PhiState.UNDETERMINED
    assert JointLaw.from_params(**PAPER_COEFFICIENTS).phi_state_ is PhiState.ESTIMATED


def test_a_broken_fit_file_is_one_line(tmp_path: Path) -> None:
    doc = json.loads(OLD_FIT.read_text())
    doc["variants"]["baseline"]["law"]["params"]["phi"] = "about a half"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"law\.params\.phi: expected a finite number"):
        load_fit(bad)
