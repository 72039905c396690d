"""Honesty at the edges of the fit (issue 17): too little data, two r values, one looped r, one verdict,
the planner's units and r range, large tables, and the input niggles (delimiters, headers, error values)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from loopscale import accounting
from loopscale.cli import run_app
from loopscale.errors import ConfigError
from loopscale.fit import FitSettings, JointLaw, LawData, fit_runs, load_runs, read_fit, synthetic_runs
from loopscale.fit.allocation import template_config
from loopscale.fit.inference.bootstrap import refit_batch
from loopscale.fit.inference.checks import leave_one_r_out
from loopscale.fit.inference.verdict import data_rule, phi_verdict
from loopscale.fit.law.joint import Bounds, Screen, params_to_theta, predict_theta
from loopscale.fit.table import as_runs

QUICK = FitSettings(restarts=40, bootstrap=10, lr_draws=200, per_r=False, checks=False, restricted=(), law_variants=())
CPU_TEMPLATE = {
    "vocab_size": 257,
    "head_dim": 16,
    "L_eff": 12,
    "n_prelude": 2,
    "n_coda": 2,
    "seq_len": 128,
    "injection": "linear",
}
CPU_LAW = {"E": 1.0, "A": 20.0, "alpha": 0.3, "B": 200.0, "beta": 0.35, "phi": 0.8}


def cpu_runs(seed: int = 0, sigma: float = 0.005) -> pd.DataFrame:
    """A CPU-scale table (d = 16-64, 1e11-6e11 FLOPs, 2048-token steps) drawn from a CPU-scale law."""
    rows = []
    for c in (1.5e11, 3e11, 6e11):
        for d in (16, 32, 48, 64):
            for r in (1, 2, 4):
                cfg = template_config(CPU_TEMPLATE, r, d)
                a = accounting.account(cfg, budget=c)
                rows.append(
                    {
                        "run_id": f"C{c:g}_d{d}_r{r}",
                        "C": c,
                        "r": r,
                        "N_once": a.N_once,
                        "N_rec": a.N_rec,
                        "D": a.tokens,
                        "batch_size": 16,
                        **CPU_TEMPLATE,
                    }
                )
    df = pd.DataFrame(rows)
    clean = predict_theta(params_to_theta(CPU_LAW), df["N_once"], df["N_rec"], df["D"], df["r"])
    df["val_loss"] = clean + sigma * np.random.default_rng(seed).standard_normal(len(df))
    return df


# ---- the minimum-data rule ------------------------------------------------------------------
@pytest.mark.parametrize("n", [5, 6])
def test_as_many_runs_as_parameters_is_refused_not_fitted_exactly(n):
    df = synthetic_runs(0.46, seed=1)
    df = df[df["C"] == df["C"].max()].head(n)
    with pytest.raises(ConfigError, match="6 free parameters"):
        JointLaw(restarts=20).fit(df)


def test_seven_runs_fit_but_a_zero_width_ci_is_never_identified():
    df = synthetic_runs(0.46, seed=1)
    df = df[df["C"] == df["C"].max()].head(7)
    assert JointLaw(restarts=20).fit(df).n_runs_ == 7
    doc = {
        "settings": {},
        "reference_variant": "b",
        "variants": {
            "b": {"law": {"params": {"phi": 0.5468}}, "bootstrap": {"n": 10, "ci": {"phi": [0.5468, 0.5468]}}}
        },
    }
    v = phi_verdict(doc)
    assert not v.resolved and any("zero width" in r for r in v.reasons)


def test_a_looped_r_with_one_width_is_a_reason_not_to_claim_phi():
    df = synthetic_runs(0.46, seed=1)
    keep = (df["r"] != 8) | (df["s"] == 12)
    rule = data_rule(df[keep])
    assert any("r = 8 has a single width" in r for r in rule.reasons)
    assert not data_rule(df).reasons


def test_one_looped_r_without_r1_is_not_identified_and_warned(capsys):
    df = synthetic_runs(0.46, seed=2)
    fit = fit_runs(df[df["r"] == 4], QUICK)
    v = phi_verdict(fit)
    assert not v.resolved and any("confounded with A" in r for r in v.reasons)
    assert any("one looped r (4) and no r = 1" in w for w in fit.warnings)


def test_looped_only_fit_needs_a_declared_reference(tmp_path, capsys):
    df = synthetic_runs(0.46, seed=2)
    looped = df[df["r"] > 1]
    assert any("no declared reference" in r for r in data_rule(looped).reasons)
    declared = data_rule(looped, reference_r=2)
    assert not declared.reasons and any("reference r = 2" in c for c in declared.caveats)


def test_two_r_values_skip_leave_one_r_out_with_a_warning():
    df = synthetic_runs(0.46, seed=3)
    two = df[df["r"].isin([1, 2])]
    law = JointLaw(restarts=30).fit(two)
    assert leave_one_r_out(law, as_runs(two), restarts=20) == {}
    fit = fit_runs(
        two,
        FitSettings(
            restarts=30, bootstrap=0, lr_draws=200, per_r=False, restricted=(), law_variants=(), checks_restarts=20
        ),
    )
    assert any("leave-one-r-out skipped" in w for w in fit.warnings)


# ---- one verdict everywhere ---------------------------------------------------------------------
def test_fit_plan_and_json_print_the_reports_verdict(tmp_path, capsys):
    df = synthetic_runs(0.46, seed=4)
    df = df[df["r"].isin([1, 4])]
    df["val_loss"] += 0.08 * np.random.default_rng(0).standard_normal(len(df))  # too noisy to pin phi
    df.to_csv(tmp_path / "runs.csv", index=False)
    args = [
        "fit",
        str(tmp_path / "runs.csv"),
        "--restarts",
        "40",
        "-b",
        "20",
        "--lr-draws",
        "200",
        "--no-checks",
        "--no-per-r",
        "--no-law-variants",
    ]
    assert run_app(args) == 0
    out = capsys.readouterr().out
    v = phi_verdict(read_fit(tmp_path / "fit.json"))
    assert not v.resolved and "not resolved, because" in out
    assert run_app([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["variants"]["baseline"]["verdict"]["resolved"] is False
    assert summary["variants"]["baseline"]["verdict"]["reasons"] == v.reasons
    assert run_app(["plan", "-C", "1e19", "--fit", str(tmp_path / "fit.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["resolved"] is False
    from loopscale.report import phi_verdict as report_verdict

    assert report_verdict is phi_verdict  # the report's headline is the same function


# ---- the planner: r range and units --------------------------------------------------------------
def test_plan_refuses_r_outside_the_fit_and_works_in_the_fits_units(tmp_path, capsys):
    cpu_runs().to_csv(tmp_path / "runs.csv", index=False)
    assert (
        run_app(
            [
                "fit",
                str(tmp_path / "runs.csv"),
                "--restarts",
                "40",
                "-b",
                "10",
                "--lr-draws",
                "200",
                "--no-checks",
                "--no-per-r",
                "--no-law-variants",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "0.0M" not in out and "k" in out  # the frontier's N* in thousands, not "0.0M"
    fit = tmp_path / "fit.json"
    assert read_fit(fit)["tokens_per_step"] == 2048
    assert run_app(["plan", "-C", "6e11", "--fit", str(fit), "--r", "8"]) == 2
    assert "outside the range of r the law was fitted on (1-4: r = 1, 2, 4)" in capsys.readouterr().err
    assert run_app(["plan", "-C", "6e11", "--fit", str(fit), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["plan"]
    assert [r["r"] for r in rows] == [1, 2, 4]
    assert all(r["steps"] > 50 for r in rows)  # 2048-token steps, not the paper's 2^18
    assert run_app(["plan", "-C", "6e11", "--fit", str(fit)]) == 0
    out = capsys.readouterr().out
    assert "0.0M" not in out and "0.0002B" not in out and "534 steps of 2.05k tokens" in out


def test_counts_are_printed_with_si_prefixes():
    from loopscale.numbers import count

    assert [count(x) for x in (24_576, 35_389_440, 2.0e6, 1.2e9, 3.1e12, 999, 0)] == [
        "24.6k",
        "35.4M",
        "2.00M",
        "1.20B",
        "3.10T",
        "999",
        "0",
    ]


# ---- large tables -------------------------------------------------------------------------------
def seeds_table(n_seeds: int, sigma: float = 0.01) -> pd.DataFrame:
    parts = [
        synthetic_runs(0.46, sigma=sigma, seed=s).assign(run_id=lambda d, s=s: d["run_id"] + f"_s{s}")
        for s in range(n_seeds)
    ]
    return pd.concat(parts, ignore_index=True)


def test_large_tables_screen_starts_on_design_points_and_polish_on_every_run():
    df = seeds_table(10)  # 1160 runs > SCREEN_ROWS
    data = LawData.from_frame(df)
    screen = Screen.of(data)
    assert screen is not None and len(screen.data) == 116
    w = np.ones((2, len(df)))
    assert np.allclose(screen.weights(w).sum(axis=1), len(df))
    law = JointLaw(restarts=60).fit(df)
    assert law.phi_ == pytest.approx(0.46, abs=0.03) and law.converged_
    assert law.n_runs_ == len(df)  # the fit (the polish) is on every run


def test_bootstrap_streams_in_chunks_with_the_same_result(monkeypatch):
    from loopscale.fit.inference import bootstrap

    df = synthetic_runs(0.46, seed=5)
    data = LawData.from_frame(df)
    law = JointLaw(restarts=40).fit(df)
    W = bootstrap.cell_weights(np.asarray(df["C"].astype(str) + df["r"].astype(str)), 6, np.random.default_rng(0))
    whole = refit_batch(data, W, law.theta_[None], bounds=Bounds.paper(), random_starts=2, seed=1)
    seen = []
    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", 3 * len(df) * 2)
    chunked = refit_batch(
        data,
        W,
        law.theta_[None],
        bounds=Bounds.paper(),
        random_starts=2,
        seed=1,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(k, 6) for k in range(1, 7)]
    assert np.allclose(whole.theta, chunked.theta, atol=1e-6)


def test_big_tables_get_a_progress_note_and_the_seed_means_hint(tmp_path, capsys, monkeypatch):
    import loopscale.cli.fit as cli_fit

    monkeypatch.setattr(cli_fit, "BIG_TABLE", 200)
    seeds_table(2).to_csv(tmp_path / "runs.csv", index=False)
    assert (
        run_app(
            [
                "fit",
                str(tmp_path / "runs.csv"),
                "--restarts",
                "30",
                "-b",
                "4",
                "--lr-draws",
                "200",
                "--no-checks",
                "--no-per-r",
                "--no-restricted",
                "--no-law-variants",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "232 runs" in err and "--seed-means" in err and "116 design points" in err


# ---- input niggles --------------------------------------------------------------------------------
def test_error_values_are_plain_python_values():
    err = ConfigError("val_loss", "not finite", value=np.float64("nan"))
    assert "np.float64" not in str(err) and "(got nan)" in str(err)
    assert "(got 3)" in str(ConfigError("r", "bad", value=np.int64(3)))


def test_semicolon_csv_and_padded_headers_load(tmp_path):
    df = synthetic_runs(0.46, seed=6)
    df.rename(columns={"val_loss": " val_loss", "r": "r "}).to_csv(tmp_path / "runs.csv", sep=";", index=False)
    t = load_runs(tmp_path / "runs.csv")
    assert len(t.df) == len(df) and np.allclose(t.df["val_loss"], df["val_loss"])
    df.to_csv(tmp_path / "tabs.csv", sep="\t", index=False)
    assert len(load_runs(tmp_path / "tabs.csv").df) == len(df)


def test_fit_on_a_sweep_dir_uses_its_fit_table_unless_told_otherwise(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    synthetic_runs(0.46, seed=7).to_csv(sweep / "runs.csv", index=False)
    (sweep / "spec.toml").write_text('[sweep]\nname = "x"\n\n[fit]\ndelta = 0.02\n', encoding="utf-8")
    args = [
        "--restarts",
        "30",
        "-b",
        "0",
        "--lr-draws",
        "200",
        "--no-checks",
        "--no-per-r",
        "--no-restricted",
        "--no-law-variants",
    ]
    assert run_app(["fit", str(sweep), *args]) == 0
    assert "using [fit] delta = 0.02" in capsys.readouterr().err
    assert read_fit(sweep / "fit.json")["settings"]["delta"] == 0.02
    assert run_app(["fit", str(sweep / "runs.csv"), *args, "--delta", "0.001"]) == 0
    assert read_fit(sweep / "fit.json")["settings"]["delta"] == 0.001
