"""`loopscale fit` and `loopscale plan` end to end, and the fit file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loopscale.cli import run_app
from loopscale.errors import ConfigError
from loopscale.fit import read_fit, synthetic_runs, write_fit

QUICK = ["--bootstrap", "20", "--lr-draws", "200", "--restarts", "60", "--no-checks"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    df = synthetic_runs(0.46, seed=4)
    df.loc[0, "status"] = "diverged"
    df.to_csv(d / "runs.csv", index=False)
    code = run_app(["fit", str(d / "runs.csv"), *QUICK, "--out", str(d / "fit.json"), "--markdown"])
    assert code == 0
    return d


def test_fit_prints_a_pasteable_table_and_writes_the_fit_file(fitted, capsys):
    doc = read_fit(fitted / "fit.json")
    v = doc["variants"]["baseline"]
    assert v["n_runs"] == 115 and doc["source"]["excluded"] == {"diverged": 1}
    assert v["law"]["params"]["phi"] == pytest.approx(0.46, abs=0.06)
    assert len(v["bootstrap"]["draws"]["phi"]) == 20
    for k in ("E", "A", "B", "alpha", "beta", "phi", "r_phi_4", "N_opt_r4_C1e+19", "gap_to_r1_r8_C2.15e+19"):
        lo, hi = v["bootstrap"]["ci"][k]
        assert lo <= hi
    assert set(v["restricted"]) == {"phi=0", "phi=1"} and set(v["per_r"]) == {"1", "2", "4", "8"}
    assert doc["settings"]["restarts"] == 60 and doc["template"]["L_eff"] == 20
    assert v["optima"]["frontier"] and v["optima"]["empirical"]


def test_fit_table_output_has_phi_with_ci_and_the_restricted_fits(tmp_path, capsys):
    synthetic_runs(0.46, seed=4).to_csv(tmp_path / "runs.csv", index=False)
    assert run_app(["fit", str(tmp_path / "runs.csv"), *QUICK, "--markdown", "--no-per-r"]) == 0
    out, err = capsys.readouterr()
    assert "| phi" in out and "R^2 restricted phi=0" in out and "R^2 (raw nats)" in out
    assert (tmp_path / "fit.json").is_file()  # default: beside the table
    assert "fit file:" in err


def test_fit_json_summary_is_machine_readable(tmp_path, capsys):
    synthetic_runs(0.46, seed=4).to_csv(tmp_path / "runs.csv", index=False)
    assert run_app(["fit", str(tmp_path / "runs.csv"), *QUICK, "--json", "--no-per-r", "--no-restricted"]) == 0
    summary = json.loads(capsys.readouterr().out)
    ci = summary["variants"]["baseline"]["ci"]["phi"]
    assert ci[0] < summary["variants"]["baseline"]["params"]["phi"] < ci[1]


def test_r1_only_table_fits_chinchilla_and_warns_that_phi_is_undetermined(tmp_path, capsys):
    df = synthetic_runs(0.46, seed=4)
    df[df["r"] == 1].to_csv(tmp_path / "runs.csv", index=False)
    assert run_app(["fit", str(tmp_path / "runs.csv"), *QUICK]) == 0
    out, err = capsys.readouterr()
    assert "undetermined" in out and "NOT identifiable" in err
    v = read_fit(tmp_path / "fit.json")["variants"]["baseline"]
    assert v["law"]["params"]["phi"] is None and v["metrics"]["r2"] > 0.99


def test_one_width_per_r_warns_that_phi_is_poorly_identified(tmp_path, capsys):
    df = synthetic_runs(0.46, seed=4)
    keep = (df["r"] == 1) | (df["s"] == 12)
    df[keep].to_csv(tmp_path / "runs.csv", index=False)
    run_app(["fit", str(tmp_path / "runs.csv"), *QUICK, "--no-per-r"])
    assert "POORLY" in capsys.readouterr().err


def test_malformed_table_gives_a_one_line_error_and_status_2(tmp_path, capsys):
    synthetic_runs(0.46, seed=4).drop(columns=["val_loss"]).to_csv(tmp_path / "runs.csv", index=False)
    assert run_app(["fit", str(tmp_path / "runs.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "val_loss" in err and "missing column" in err


def test_plan_uses_the_fit_file_with_bootstrap_cis(fitted, capsys):
    assert run_app(["plan", "--budget", "1e19", "--fit", str(fitted / "fit.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["plan"]
    assert [r["r"] for r in rows] == [1, 2, 4, 8]
    for r in rows:
        assert r["loss_ci"][0] <= r["loss"] <= r["loss_ci"][1] and r["ci_kind"].startswith("bootstrap")
        assert r["N_eq"] <= r["N_cost"]


def test_plan_with_the_papers_coefficients_and_template_overrides(capsys):
    assert run_app(["plan", "-C", "1e18", "--paper", "--r", "1", "--r", "4", "--set", "model.seq_len=1024"]) == 0
    out = capsys.readouterr().out
    assert "2+4x4+2" in out and "phi CI only" in out and "lowest predicted loss: r = 1" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["plan", "-C", "1e19"], "--fit"),
        (["plan", "-C", "-5", "--paper"], "--budget"),
        (["plan", "-C", "1e19", "--paper", "--set", "model.n_prelude=-1"], "model.n_prelude"),
        (["plan", "-C", "1e19", "--fit", "nope.json"], "not found"),
    ],
)
def test_plan_errors_are_one_line(args, needle, capsys):
    assert run_app(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_fit_file_is_written_atomically_as_strict_json(tmp_path):
    p = write_fit(tmp_path / "f.json", {"variants": {"x": {"v": np.float64(np.nan), "a": np.arange(3)}}})
    assert [q.name for q in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind
    doc = json.loads(p.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert doc["variants"]["x"] == {"v": None, "a": [0, 1, 2]} and doc["format"] == "loopscale.fit"
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ConfigError, match="not a loopscale fit file"):
        read_fit(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_fit(tmp_path / "broken.json")


def test_every_bootstrap_draw_can_be_recomputed_from_the_fit_file(fitted):
    from loopscale.fit import JointLaw, load_runs

    doc = read_fit(fitted / "fit.json")
    res = doc["resamples"]
    runs = load_runs(fitted / "runs.csv")
    df = runs.df.set_index("run_id").loc[res["run_id"]].reset_index()
    counts = np.array(res["cell_counts"])
    assert counts.shape == (20, 24) and (counts.sum(axis=1) == 24).all()
    weights = counts[1][np.array(res["cell_of_run"])]
    phi = JointLaw(restarts=100).fit(df, weights=weights).phi_
    assert phi == pytest.approx(doc["variants"]["baseline"]["bootstrap"]["draws"]["phi"][1], abs=1e-4)


def test_fit_can_select_r_values_and_rejects_bad_selections(tmp_path, capsys):
    synthetic_runs(0.46, seed=4).to_csv(tmp_path / "runs.csv", index=False)
    args = ["fit", str(tmp_path / "runs.csv"), *QUICK, "--json", "--no-per-r", "--no-restricted"]
    assert run_app([*args, "--r", "2", "--r", "4", "--r", "8"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert read_fit(tmp_path / "fit.json")["variants"]["baseline"]["n_runs"] == 87  # 116 minus the 29 r = 1 runs
    assert summary["variants"]["baseline"]["params"]["phi"] == pytest.approx(0.46, abs=0.1)
    assert run_app([*args, "--r", "3", "--r", "4"]) == 2
    assert "--r: no runs with r = [3]" in capsys.readouterr().err
    assert run_app([*args, "--r", "4"]) == 2
    assert "two or more values of r" in capsys.readouterr().err


def test_fit_against_a_control_variants_r1_runs_adds_a_derived_variant(tmp_path, capsys):
    df = synthetic_runs(0.46, seed=4)
    r1 = df[df["r"] == 1]
    ctrl = r1.assign(variant="loop1", val_loss=r1["val_loss"] + 0.2, run_id=r1["run_id"] + "_loop1")
    base = df.assign(val_loss=df["val_loss"] + 0.2 * (df["r"] > 1))  # a fixed looping tax on r > 1
    import pandas as pd

    pd.concat([base, ctrl]).to_csv(tmp_path / "runs.csv", index=False)
    args = ["fit", str(tmp_path / "runs.csv"), *QUICK, "--json", "--no-per-r", "--no-restricted"]
    assert run_app([*args, "--r1-from", "loop1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert list(summary["variants"]) == ["baseline", "baseline@loop1"]  # the control alone is not fitted
    doc = read_fit(tmp_path / "fit.json")
    assert doc["variants"]["baseline"]["n_runs"] == doc["variants"]["baseline@loop1"]["n_runs"] == 116
    assert summary["variants"]["baseline@loop1"]["params"]["phi"] == pytest.approx(0.46, abs=0.1)  # tax cancels
    assert summary["variants"]["baseline"]["params"]["phi"] < 0.2  # the tax reads as a smaller phi
    assert run_app([*args, "--r1-from", "nope"]) == 2
    assert "--r1-from: no r = 1 runs with this variant" in capsys.readouterr().err


def test_delta_phi_pairs_recipes_read_against_the_same_r1_runs(tmp_path, capsys):
    import pandas as pd

    df = synthetic_runs(0.46, seed=4)
    r1 = df[df["r"] == 1]
    ctrl = r1.assign(variant="loop1", run_id=r1["run_id"] + "_loop1")
    looped = df[df["r"] > 1]
    probe = looped.assign(variant="probe", val_loss=looped["val_loss"] - 0.02, run_id=looped["run_id"] + "_p")
    pd.concat([df, ctrl, probe]).to_csv(tmp_path / "runs.csv", index=False)
    args = [
        "fit",
        str(tmp_path / "runs.csv"),
        "--bootstrap",
        "20",
        "--lr-draws",
        "0",
        "--restarts",
        "60",
        "--json",
        "--no-per-r",
        "--no-restricted",
        "--r1-from",
        "loop1",
    ]
    assert (
        run_app(
            [
                *args,
                "--reference",
                "baseline@loop1",
                "--variant",
                "baseline@loop1",
                "--variant",
                "probe@loop1",
                "--restarts",
                "20",
                "--no-law-variants",
            ]
        )
        == 0
    )
    capsys.readouterr()
    (d,) = read_fit(tmp_path / "fit.json")["delta_phi"]
    assert d["variant"] == "probe@loop1"  # the control's r = 1 runs enter its shared-law fit once, not twice
    assert d["shared"]["held_out"]["supported"] in ("shared", "separate")
    assert run_app([*args, "--no-checks"]) == 0
    capsys.readouterr()
    assert [d["variant"] for d in read_fit(tmp_path / "fit.json")["delta_phi"]] == ["probe"]


def test_fit_takes_several_tables_and_can_fit_seed_means(tmp_path, capsys):
    df = synthetic_runs(0.46, seed=4)
    df.to_csv(tmp_path / "s0.csv", index=False)
    df.assign(run_id=df["run_id"] + "_s1", val_loss=df["val_loss"] + 0.01).to_csv(tmp_path / "s1.csv", index=False)
    args = [
        "fit",
        str(tmp_path / "s0.csv"),
        str(tmp_path / "s1.csv"),
        *QUICK,
        "--json",
        "--no-per-r",
        "--no-restricted",
        "--no-checks",
    ]
    assert run_app(args) == 0
    capsys.readouterr()
    doc = read_fit(tmp_path / "fit.json")  # beside the first table
    assert doc["variants"]["baseline"]["n_runs"] == 232
    assert run_app([*args, "--seed-means", "--out", str(tmp_path / "means.json")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert read_fit(tmp_path / "means.json")["variants"]["baseline"]["n_runs"] == 116
    assert summary["variants"]["baseline"]["params"]["phi"] == pytest.approx(0.46, abs=0.1)
