"""Runs tables: loading, validation with one-line errors, and exclusion of failed runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from loopscale.errors import ConfigError
from loopscale.fit import load_runs, synthetic_runs, validate_runs


@pytest.fixture()
def table():
    return synthetic_runs(0.46, seed=0)


def _one_line_error(df, *needles):
    with pytest.raises(ConfigError) as info:
        validate_runs(df, source="runs.csv")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("runs.csv: ")
    for n in needles:
        assert n in msg, msg
    return msg


def test_missing_column_names_the_column_and_the_required_set(table):
    _one_line_error(table.drop(columns=["N_rec"]), "N_rec", "missing column", "r, N_once, N_rec, D, val_loss")


def test_non_positive_value_names_column_run_and_value(table):
    table.loc[5, "D"] = -1.0
    _one_line_error(table, "D:", "non-positive", table.loc[5, "run_id"], "-1.0", "expected > 0")


def test_nan_value_names_column_and_run(table):
    table.loc[7, "val_loss"] = np.nan
    _one_line_error(table, "val_loss", "not a number", table.loc[7, "run_id"])


def test_text_in_a_numeric_column_is_an_error(table):
    table["N_once"] = table["N_once"].astype(object)
    table.loc[2, "N_once"] = "big"
    _one_line_error(table, "N_once", "'big'")


def test_duplicate_run_ids_are_an_error(table):
    table.loc[3, "run_id"] = table.loc[4, "run_id"]
    _one_line_error(table, "run_id", "duplicate", table.loc[4, "run_id"])


def test_fractional_r_is_an_error(table):
    table["r"] = table["r"].astype(float)
    table.loc[0, "r"] = 2.5
    _one_line_error(table, "r:", "whole number")


def test_looped_run_without_recurrent_params_is_an_error(table):
    i = int(np.flatnonzero(table["r"] > 1)[0])
    table.loc[i, "N_rec"] = 0
    _one_line_error(table, "N_rec", "looped")


def test_diverged_and_failed_runs_are_excluded_and_counted(table):
    table.loc[0, "status"] = "diverged"
    table.loc[1, "status"] = "failed"
    table.loc[2, "status"] = "DIVERGED"
    table.loc[0, "val_loss"] = np.nan  # a diverged run's NaN loss is not an error
    runs = validate_runs(table)
    assert len(runs.df) == 113 and runs.n_excluded == 3
    assert runs.excluded == {"diverged": 2, "failed": 1}


def test_r1_runs_are_shared_by_every_variant(table):
    other = synthetic_runs(0.38, seed=1, variant="tbptt")
    other = other[other["r"] > 1].assign(run_id=lambda d: d["run_id"] + "_tbptt")
    runs = validate_runs(pd.concat([table, other], ignore_index=True))
    assert runs.variants == ["baseline", "tbptt"]
    t = runs.for_variant("tbptt").df
    assert (t[t["r"] == 1]["variant"] == "baseline").all() and len(t) == 116
    with pytest.raises(ConfigError, match="variant"):
        runs.for_variant("nope")


def test_a_variant_with_its_own_r1_runs_uses_only_those(table):
    own = synthetic_runs(0.3, seed=2, variant="lr2").assign(run_id=lambda d: d["run_id"] + "_lr2")
    runs = validate_runs(pd.concat([table, own], ignore_index=True))
    for v in ("baseline", "lr2"):
        t = runs.for_variant(v).df
        assert len(t) == 116 and (t["variant"] == v).all()


def test_csv_parquet_and_sweep_dirs_load_the_same_table(tmp_path, table):
    table.to_csv(tmp_path / "runs.csv", index=False)
    table.to_parquet(tmp_path / "runs.parquet", index=False)
    a = load_runs(tmp_path / "runs.csv").df
    b = load_runs(tmp_path / "runs.parquet").df
    c = load_runs(tmp_path).df  # a dir with runs.parquet / runs.csv
    sweep = tmp_path / "sweep"
    for _, row in table.iterrows():
        d = sweep / row["run_id"]
        d.mkdir(parents=True)
        rec = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
        rec["hardware"] = {"gpu": "none"}  # nested fields are ignored
        (d / "result.json").write_text(json.dumps(rec))
    e = load_runs(sweep).df
    for other in (b, c, e):
        key = other.set_index("run_id").loc[a["run_id"]]
        np.testing.assert_allclose(key["val_loss"], a["val_loss"])
        np.testing.assert_allclose(key["D"], a["D"])


def test_missing_path_and_unknown_format_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_runs(tmp_path / "nope.csv")
    (tmp_path / "runs.xlsx").write_text("x")
    with pytest.raises(ConfigError, match="unknown table format"):
        load_runs(tmp_path / "runs.xlsx")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"result\.json"):
        load_runs(tmp_path / "empty")


def test_sweep_dir_with_a_failed_run_record_excludes_it(tmp_path, table):
    for _, row in table.head(6).iterrows():
        d = tmp_path / row["run_id"]
        d.mkdir()
        (d / "result.json").write_text(json.dumps({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}))
    (tmp_path / "crashed").mkdir()  # what the trainer writes when a run raises: no D, no val_loss
    (tmp_path / "crashed" / "result.json").write_text(json.dumps({"status": "failed", "error": "OOM", "r": 4}))
    runs = load_runs(tmp_path)
    assert len(runs.df) == 6 and runs.excluded == {"failed": 1}


def test_several_tables_load_as_one_and_a_repeated_run_is_an_error(tmp_path, table):
    seed1 = table.assign(run_id=table["run_id"] + "_s1", val_loss=table["val_loss"] + 0.01)
    bad = table.assign(status="diverged").head(2).assign(run_id=["x1", "x2"])
    table.to_csv(tmp_path / "a.csv", index=False)
    pd.concat([seed1, bad]).to_csv(tmp_path / "b.csv", index=False)
    both = load_runs([tmp_path / "a.csv", tmp_path / "b.csv"])
    assert len(both.df) == 2 * len(table) and both.excluded == {"diverged": 2}
    assert both.source == f"{tmp_path / 'a.csv'} + {tmp_path / 'b.csv'}"
    assert len(load_runs([tmp_path / "a.csv"]).df) == len(table)  # a list of one is that table
    with pytest.raises(ConfigError) as info:
        load_runs([tmp_path / "a.csv", tmp_path / "a.csv"])
    assert "is in both" in str(info.value) and "\n" not in str(info.value)


def test_seed_means_average_each_design_point_over_its_seeds(table):
    seed1 = table.assign(run_id=table["run_id"] + "_s1", val_loss=table["val_loss"] + 0.1)
    both = validate_runs(pd.concat([table, seed1, seed1.head(1).assign(run_id="extra", val_loss=9.0)]))
    means = both.seed_means()
    assert len(means.df) == len(table)
    first = means.df.iloc[0]
    assert first["n_seeds"] == 3 and first["run_id"].count(";") == 2
    assert first["val_loss"] == pytest.approx((2 * table["val_loss"].iloc[0] + 0.1 + 9.0) / 3)
    rest = means.df.iloc[1:]
    np.testing.assert_allclose(rest["val_loss"], table["val_loss"].iloc[1:] + 0.05)
    np.testing.assert_allclose(rest["val_loss_seed_sd"], 0.1 / np.sqrt(2))
    assert (rest["n_seeds"] == 2).all()
    one = validate_runs(table).seed_means().df  # one seed: the table itself
    np.testing.assert_allclose(one["val_loss"], table["val_loss"])
    assert (one["val_loss_seed_sd"] == 0).all()
