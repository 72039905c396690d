"""The calibrated inference of fit/inference/profile.py: the record's schema, intervals and tests that agree, Delta-phi,
the verdict's whole-fit caveats and the wording rule ("rules out" only with a rejecting test *and* a worse
held-out error). Coverage itself is measured by bench/inference_coverage.py (docs/fit.md), not here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loopscale.fit import FitSettings, JointLaw, LawData, fit_runs, load_runs
from loopscale.fit.inference import profile as inf
from loopscale.fit.inference.verdict import claims, phi_verdict
from loopscale.fit.law.formula import params_to_theta
from loopscale.fit.law.formula import predict as predict_theta
from loopscale.fit.parts import bootstrap_cells
from loopscale.fit.result import FitResult, Inference, Test, VariantFit

FIXTURES = Path(__file__).parent / "fixtures" / "fit"
DEMO_RUNS = FIXTURES / "demo_runs.csv"  # `loopscale demo` on an AVX-512 EPYC (35 runs, 12 cells + controls)
LAW = {"E": 1.58, "A": 15700.0, "alpha": 1.065, "B": 3220.0, "beta": 0.671}


def _demo_like(phi: float, sigma: float, seed: int = 0, variant: str = "baseline") -> pd.DataFrame:
    """The demo's baseline grid with val_loss from the law at ``phi`` plus N(0, sigma^2) per run."""
    df = pd.read_csv(DEMO_RUNS)
    df = df[df["variant"] == "baseline"].copy()
    clean = predict_theta(params_to_theta({**LAW, "phi": phi}), df["N_once"], df["N_rec"], df["D"], df["r"])
    df["val_loss"] = clean + sigma * np.random.default_rng(seed).standard_normal(len(df))
    df["variant"] = variant
    df["run_id"] = df["run_id"].str.replace("baseline", variant)
    return df


def _quick(**kw: object) -> FitSettings:
    base = {
        "restarts": 60,
        "bootstrap": 40,
        "lr_draws": 200,
        "checks_restarts": 20,
        "per_r": False,
        "law_variants": (),
        "delta": 0.02,
    }
    return FitSettings(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def one_fit() -> FitResult:
    return fit_runs(_demo_like(0.6, 0.01), _quick())


def _inference(res: FitResult) -> Inference:
    rec = res.variant("baseline").inference
    assert rec is not None and rec.phi is not None
    return rec


def test_the_inference_record_has_the_documented_schema(one_fit: FitResult) -> None:
    rec = one_fit.to_dict()["variants"]["baseline"]["inference"]  # the fit file's keys
    assert set(rec) == {"phi", "tests", "secondary", "null", "profile"}
    assert set(rec["phi"]) == {"estimate", "ci", "level", "method", "open", "disjoint", "mc_sd", "critical_value"}
    assert set(rec["tests"]) == {"phi=0", "phi=0.459", "phi=1"}
    for t in rec["tests"].values():
        assert {"value", "stat", "p", "rejected", "held_out_worse", "ruled_out"} <= set(t)
        assert 0 < t["p"] <= 1 and t["rejected"] == (t["p"] < 0.05)
        assert t["ruled_out"] == (t["rejected"] and t["held_out_worse"] is True)
    assert set(rec["secondary"]) == {"method", "n", "ci", "mc_sd"} and rec["secondary"]["n"] == 40
    assert rec["null"]["n"] == 200 and rec["null"]["weights"] == "webb"
    typed = _inference(one_fit)
    lo, hi = typed.phi.ends  # type: ignore[union-attr,misc]
    assert lo < typed.phi.estimate < hi and typed.phi.level == 0.95  # type: ignore[union-attr,operator]


def test_compare_carries_the_calibrated_test_of_the_references_value(one_fit: FitResult) -> None:
    from loopscale.fit.inference.compare import compare

    rec = _inference(one_fit)
    row = next(r for r in compare(one_fit, "paper")["rows"] if r["quantity"] == "phi")
    assert row["p_calibrated"] == pytest.approx(rec.tests["phi=0.459"].p, abs=0.02)
    assert inf.test_value(rec, 1.0) == pytest.approx(rec.tests["phi=1"].p, abs=0.02)
    assert inf.test_value(rec, 9.0) is None  # outside the profiled box


def test_a_test_rejects_exactly_where_the_interval_excludes_the_value(one_fit: FitResult) -> None:
    rec = _inference(one_fit)
    lo, hi = rec.phi.ci  # type: ignore[union-attr,misc]
    for t in rec.tests.values():
        assert t.value is not None
        if min(abs(t.value - lo), abs(t.value - hi)) > 0.02:  # away from the ends (interpolation)
            assert t.rejected == (not lo <= t.value <= hi), t


def test_the_verdict_reads_the_profile_interval_and_old_fit_files_fall_back_with_a_caveat(one_fit: FitResult) -> None:
    v = phi_verdict(one_fit)
    assert v.method == "profile likelihood"
    assert v.ci == pytest.approx(tuple(_inference(one_fit).phi.ci))  # type: ignore[union-attr,arg-type]
    assert v.claims and all("φ = " in c for c in v.claims)
    old = phi_verdict(__import__("json").loads((FIXTURES / "fit_v1.json").read_text()))
    assert old.method == "percentile bootstrap" and old.claims == []
    assert any("percentile bootstrap's" in c for c in old.caveats)


def test_the_interval_ends_move_by_less_than_0_02_between_seeds_on_the_demos_own_runs() -> None:
    table = load_runs(DEMO_RUNS).with_r1_control("loop1")
    df = table.for_variant("baseline@loop1").df
    law = JointLaw(restarts=200, delta=0.02).fit(df)
    data = LawData.from_frame(df)
    cells, _ = bootstrap_cells(df)
    ends, verdicts = [], []
    for seed in range(4):
        v = inf.webb_weights(int(cells.max()) + 1, 1000, np.random.default_rng([seed, 1]))
        st = inf.VariantInference.run(law.theta_, law.objective_, law.bounds(), data, cells, v, "huber", 0.02, seed)
        iv = st.interval(0.95)
        ends.append(iv.ci)
        verdicts.append(tuple(inf.p_value(st.stat_at(x), st.null.stat) < 0.05 for x in (0.0, 1.0)))
    ends = np.array(ends)
    assert np.ptp(ends, axis=0).max() <= 0.04  # every end within +-0.02 of the others' middle
    assert len(set(verdicts)) == 1  # the same tests reject with every seed


def test_delta_phi_gets_a_profile_interval_and_a_test_of_zero() -> None:
    df = pd.concat([_demo_like(0.4, 0.01, 0), _demo_like(1.2, 0.01, 1, "probe")])
    df = df[~((df["variant"] == "probe") & (df["r"] == 1))]  # the probe shares the baseline's r = 1 runs
    res = fit_runs(df, _quick(checks=False))
    (d,) = res.delta_phi
    rec = d.inference
    assert rec is not None and rec.ci is not None and rec.estimate is not None and rec.secondary is not None
    lo, hi = rec.ci
    assert lo < rec.estimate < hi and d.ci == rec.ci
    assert rec.estimate == pytest.approx(d.delta_phi)
    t = rec.tests["delta_phi=0"]
    assert t.p is not None and t.rejected == (t.p < 0.05) and t.rejected == (lo > 0 or hi < 0)
    assert rec.secondary.ci is not None


def test_the_joint_profile_of_two_quadratic_profiles_is_the_harmonic_combination() -> None:
    phi = np.linspace(-3, 3, 601)

    def prof(a: float, m: float) -> inf.Profile:
        return inf.Profile(phi, a * (phi - m) ** 2, np.zeros((len(phi), 6)), 0.0)

    d = np.array([-0.5, 0.0, 0.5, 1.0, 1.5])
    got = inf.delta_stat(prof(2.0, 0.5), prof(3.0, 1.5), d)
    assert got == pytest.approx(2 * 3 / (2 + 3) * (d - 1.0) ** 2, abs=1e-4)


def test_interval_p_value_and_critical_value_on_known_numbers() -> None:
    phi = np.linspace(0, 2, 21)
    stat = (phi - 1) ** 2
    iv = inf.interval_from_stat(phi, stat, 0.25)
    assert iv.ci == pytest.approx([0.5, 1.5]) and iv.open == [False, False] and not iv.disjoint
    two = inf.interval_from_stat(phi, np.minimum((phi - 0.5) ** 2, (phi - 1.5) ** 2 + 0.001), 0.01)
    assert two.disjoint
    null = np.arange(1, 1000, dtype=float)  # 999 draws
    assert inf.critical(null, 0.95)[0] == 950.0
    assert inf.p_value(0.0, null) == 1.0 and inf.p_value(2000.0, null) == pytest.approx(1 / 1000)


def _rec(**tests: Test) -> VariantFit:
    """The least a VariantFit needs for ``claims``: its tests."""
    return VariantFit(inference=Inference(tests=tests))


def _t(value: float, p: float, worse: bool | None) -> Test:
    return Test(value=value, p=p, rejected=p < 0.05, held_out_worse=worse, ruled_out=p < 0.05 and worse is True)


def test_rules_out_needs_a_rejecting_test_a_worse_held_out_error_and_a_resolved_fit() -> None:
    as_good = claims(_rec(**{"phi=1": _t(1.0, 0.01, False)}), 0.95, resolved=True)
    assert not any("rules out φ = 1" in c for c in as_good)
    assert "cannot tell φ = 1 apart from the fit" in as_good[0] and "as well or better" in as_good[0]
    assert "rules out φ = 1" in claims(_rec(**{"phi=1": _t(1.0, 0.01, True)}), 0.95, resolved=True)[0]
    assert "no claim" in claims(_rec(**{"phi=1": _t(1.0, 0.01, True)}), 0.95, resolved=False)[0]
    kept = claims(_rec(**{"phi=0": _t(0.0, 0.3, True)}), 0.95, resolved=True)[0]
    assert "cannot tell φ = 0 apart" in kept and "p = 0.3" in kept


def test_a_table_where_phi_1_fits_as_well_never_prints_rules_out_phi_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from loopscale.cli import run_app

    runs = tmp_path / "runs.csv"
    _demo_like(1.0, 0.02, 3).to_csv(runs, index=False)  # drawn from the phi = 1 law
    assert run_app(["fit", str(runs), "--restarts", "60", "--bootstrap", "40", "--lr-draws", "200", "--no-per-r"]) == 0
    out = capsys.readouterr().out
    assert "cannot tell φ = 1 apart from the fit" in out and "rules out φ = 1" not in out


def _verdict_with(**extra: object) -> list[str]:
    doc = __import__("json").loads((FIXTURES / "fit_v1.json").read_text())
    name = doc.get("reference_variant") or next(iter(doc["variants"]))
    rec = doc["variants"][name]
    for k, v in extra.items():
        head, _, rest = k.partition("__")
        (rec[head] if rest else rec).update({rest: v} if rest else {head: v})
    return phi_verdict(doc, name).caveats


def test_each_whole_fit_caveat_is_named() -> None:
    assert any("box bound" in c for c in _verdict_with(inference={"null": {"at_bounds_fraction": 0.6}}))
    assert any(
        "Monte-Carlo sd of up to 0.030" in c
        for c in _verdict_with(inference={"phi": {"mc_sd": [0.0, 0.03]}, "null": {"n": 2000}})
    )
    assert any("more than one piece" in c for c in _verdict_with(inference={"phi": {"disjoint": True}}))
    assert any("orders of magnitude" in c for c in _verdict_with(bootstrap__ci={"A": [1e-3, 1e7]}))
    assert any(
        "have no r = 1 cell" in c
        for c in _verdict_with(bootstrap__data_rule_draws={"no_r1": 6, "missing_r": 24}, bootstrap__n=200)
    )
    assert any("r = 1 runs fit" in c for c in _verdict_with(metrics__rmse_per_r={"1": 0.11, "2": 0.03, "4": 0.04}))


def test_a_large_table_runs_its_inference_on_design_points() -> None:
    """Above 1,024 runs the inference works on seed means per design point (as the batched fit stages do)."""
    from loopscale.fit.synthetic import synthetic_runs

    one = synthetic_runs(0.46, sigma=0.01, seed=0)
    df = pd.concat(
        [
            one.assign(
                seed=s,
                run_id=one["run_id"] + f"_s{s}",
                val_loss=one["val_loss"] + 0.005 * np.random.default_rng(s).standard_normal(len(one)),
            )
            for s in range(9)
        ],
        ignore_index=True,
    )  # 1,044 runs on 116 design points
    law = JointLaw(restarts=50).fit(df)
    cells, _ = bootstrap_cells(df)
    st = inf.VariantInference.run(
        law.theta_,
        law.objective_,
        law.bounds(),
        LawData.from_frame(df),
        cells,
        inf.webb_weights(int(cells.max()) + 1, 200, np.random.default_rng(0)),
        "huber",
        1e-3,
        0,
    )
    assert st.screened and len(st.data) == 116 and st.weights is not None and st.weights.sum() == len(df)
    lo, hi = st.interval(0.95).ci  # type: ignore[misc]
    assert lo < law.phi_ < hi and hi - lo < 0.2


def test_an_interval_next_to_a_failed_profile_point_ends_at_its_last_inside_point_not_nan() -> None:
    """A profile point that overflowed (inf) beside the interval made its end NaN (seen on a tiny sweep)."""
    from loopscale.fit.inference.profile import interval_from_stat

    phi = np.array([0.0, 0.5, 1.0, 1.5])
    got = interval_from_stat(phi, np.array([np.inf, 1.0, 0.0, 5.0]), 2.0)
    assert got.ci == [0.5, pytest.approx(1.0 + 0.5 * 2 / 5)] and got.open == [False, False]
