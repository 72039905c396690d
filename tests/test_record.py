"""The run record (``loopscale.record.RunRecord``): result.json as the trainer writes it, the runs table derived from
it, old run dirs, the validation messages, the docs' table of columns."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_sweep_spec
from loopscale import record
from loopscale.record import RunRecord, record_problem, runs_table_columns, table_dtype
from test_train import cfg_with

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: result.json's keys for a finished CPU run of the built-in model, in the order written (before RunRecord too)
OK_KEYS = [
    "status",
    "val_loss",
    "val_loss_se",
    "val_bpb",
    "train_loss",
    "steps",
    "total_steps",
    "D",
    "C",
    "flops",
    "val_tokens",
    "r",
    "d_model",
    "n_prelude",
    "n_recur",
    "n_coda",
    "L_eff",
    "layout",
    "injection",
    "bptt_k",
    "N_once",
    "N_rec",
    "N_emb",
    "N_norm",
    "N_total",
    "flops_per_token",
    "seq_len",
    "batch_size",
    "vocab_size",
    "vocab_multiple",
    "head_dim",
    "mlp_ratio",
    "hc_lanes",
    "tokens_per_param",
    "wall_s",
    "dtype",
    "world_size",
    "hardware",
    "versions",
    "data_fingerprint",
    "threads",
    "compile",
    "micro_batch",
    "val_micro_batch",
    "predicted_peak_bytes",
    "predicted_val_peak_bytes",
    "memory_limit_bytes",
]
#: the accounting and template fields (``train.result.result_fields``), a run of OK_KEYS
ACCOUNTING_KEYS = OK_KEYS[OK_KEYS.index("r") : OK_KEYS.index("hc_lanes") + 1]

#: the runs table's columns and dtypes before RunRecord (sweep/collect.py's COLUMNS then EXTRA): pinned
OLD_COLUMNS = [
    "run_id",
    "variant",
    "seed",
    "C",
    "r",
    "d_model",
    "n_prelude",
    "n_recur",
    "n_coda",
    "N_once",
    "N_rec",
    "D",
    "val_loss",
    "flops_per_token",
    "status",
    "wall_s",
    "error",
    "val_loss_se",
    "val_bpb",
    "L_eff",
    "layout",
    "injection",
    "bptt_k",
    "seq_len",
    "batch_size",
    "steps",
    "flops",
    "tokens_per_param",
    "N_emb",
    "N_total",
    "vocab_size",
    "vocab_multiple",
    "head_dim",
    "mlp_ratio",
    "hc_lanes",
    "attempts",
]
OLD_INT64 = {"r", "d_model", "n_prelude", "n_recur", "n_coda", "N_once", "N_rec", "seed", "attempts"}
OLD_FLOAT64 = {"C", "D", "val_loss", "val_loss_se", "val_bpb", "flops_per_token", "wall_s", "flops", "tokens_per_param"}

OK = {"status": "ok", "val_loss": 3.0, "r": 2, "N_once": 1000, "N_rec": 500, "D": 100000}


# ---- what the trainer writes --------------------------------------------------------------------------------------


def test_the_trainer_writes_the_same_keys_and_types_through_the_record(tmp_path: Path) -> None:
    from loopscale.train import TrainingFailed, train

    res = train(cfg_with(steps=6), tmp_path / "ok", progress=False)
    on_disk = json.loads((tmp_path / "ok" / "result.json").read_text())
    assert list(on_disk) == OK_KEYS and res.dump() == on_disk
    types = {k: type(v) for k, v in on_disk.items()}
    assert types["D"] is int and types["C"] is float and types["steps"] is int and types["mlp_ratio"] is int
    assert types["predicted_peak_bytes"] is float and types["memory_limit_bytes"] is int
    assert types["hardware"] is dict and types["compile"] is str and types["bptt_k"] is type(None)
    rec = RunRecord.read(tmp_path / "ok")
    assert rec is not None and rec.dump() == on_disk and record_problem(on_disk) is None
    assert on_disk["D"] == rec.D and rec.val_loss == on_disk["val_loss"]

    with pytest.raises(TrainingFailed):
        train(cfg_with("run.fail_at_step=2", steps=6), tmp_path / "failed", progress=False)
    failed = json.loads((tmp_path / "failed" / "result.json").read_text())
    # the record's field order (before RunRecord error and traceback came second); the same keys and values
    assert list(failed) == ["status", *ACCOUNTING_KEYS, "wall_s", "versions", "error", "traceback"]
    assert failed["error"].startswith("RuntimeError: injected failure at step 2")
    assert record_problem(failed) is None


def test_a_diverged_run_records_its_error_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopscale.model import LoopedLM
    from loopscale.train import train

    forward = LoopedLM.forward
    monkeypatch.setattr(
        LoopedLM, "forward", lambda self, idx, targets=None, **kw: forward(self, idx, targets, **kw) * math.nan
    )
    res = train(cfg_with(steps=6), tmp_path / "run", progress=False)
    assert res.status == "diverged" and list(res.dump()) == [*OK_KEYS, "error"] and res.val_loss is None
    assert record_problem(res.dump()) is None


def test_dump_writes_only_what_was_set_and_keeps_unknown_keys() -> None:
    rec = RunRecord(status="failed", error="boom", r=2, note="from a later version")
    assert rec.dump() == {"status": "failed", "r": 2, "error": "boom", "note": "from a later version"}
    assert RunRecord.model_validate({"status": "ok", "D": 5}).dump() == {"status": "ok", "D": 5}
    rec.measured_peak_bytes, rec.measured_val_peak_bytes = 7, None  # set after building (CUDA's measured peaks)
    assert list(rec.dump()) == ["status", "r", "measured_peak_bytes", "measured_val_peak_bytes", "error", "note"]


# ---- the runs table ----------------------------------------------------------------------------------------------


def test_the_table_keeps_its_lead_columns_and_dtypes_and_appends_the_rest() -> None:
    from loopscale.sweep.collect import COLUMNS, EXTRA

    cols = runs_table_columns()
    assert list(cols[: len(OLD_COLUMNS)]) == OLD_COLUMNS and list(COLUMNS + EXTRA) == list(cols)
    assert list(COLUMNS) == OLD_COLUMNS[:17]
    for c in OLD_COLUMNS:
        want = "Int64" if c in OLD_INT64 else "float64" if c in OLD_FLOAT64 else None
        assert table_dtype(c) == want, c
    new = cols[len(OLD_COLUMNS) :]
    assert new == tuple(f for f in record.record_columns() if f not in OLD_COLUMNS)  # field order
    assert {"N_norm", "train_loss", "technique", "micro_batch", "measured_peak_bytes"} <= set(new)
    assert not {"hardware", "versions", "traceback"} & set(cols)  # nested or no cell
    assert table_dtype("N_norm") == "Int64" and table_dtype("train_loss") == "float64"
    assert table_dtype("technique") is None


def _sweep(tmp_path: Path):
    from loopscale.sweep import prepare, spec_from_dict

    spec = spec_from_dict(tiny_sweep_spec({"ckpt_every": 0}), source="tiny.toml")
    store = prepare(spec, tmp_path / "sw")
    return store, [rs.run_id for rs in spec.runs()]


def test_a_field_added_once_is_a_column_and_is_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopscale.sweep.collect import corrupt_files, runs_table

    class Later(RunRecord):
        grad_norm: float | None = None  # a field a later version adds, nothing else changed

    monkeypatch.setattr(record, "RunRecord", Later)
    store, ids = _sweep(tmp_path)
    for i, rid in enumerate(ids):
        (store.run_dir(rid) / "result.json").write_text(json.dumps({**OK, "grad_norm": 0.5 + i}))
    (store.run_dir(ids[-1]) / "result.json").write_text(json.dumps({**OK, "grad_norm": "big"}))
    df, missing = runs_table(store)
    assert df.columns[-1] == "grad_norm" and str(df["grad_norm"].dtype) == "float64"
    assert list(df["grad_norm"]) == [0.5 + i for i in range(len(ids) - 1)] and missing == {"corrupt": 1}
    assert any("grad_norm: expected a number, got 'big'" in line for line in corrupt_files(store))


def test_an_old_run_dir_collects_and_validates(tmp_path: Path) -> None:
    """A result.json of an older version: no N_norm, no technique, no memory fields, no train_loss."""
    import pandas as pd

    from loopscale.sweep import runs_table

    old = {
        "status": "ok",
        "val_loss": 3.25,
        "val_loss_se": 0.01,
        "steps": 12,
        "D": 6144,
        "C": 2e9,
        "flops": 1.9e9,
        "r": 2,
        "d_model": 16,
        "n_prelude": 1,
        "n_recur": 2,
        "n_coda": 1,
        "L_eff": 6,
        "layout": "1 + 2x2 + 1",
        "injection": "linear",
        "bptt_k": None,
        "N_once": 6144,
        "N_rec": 6144,
        "N_emb": 4112,
        "N_total": 16400,
        "flops_per_token": 300000.0,
        "seq_len": 64,
        "batch_size": 8,
        "vocab_size": 257,
        "vocab_multiple": 64,
        "head_dim": 16,
        "mlp_ratio": 4,
        "hc_lanes": 2,
        "tokens_per_param": 0.5,
        "wall_s": 1.5,
        "dtype": "float32",
        "hardware": {"device": "cpu"},
        "versions": {"torch": "2.0"},
        "retired_key": 1,
    }
    assert record_problem(old) is None
    rec = RunRecord.model_validate(old)
    assert rec.N_norm is None and rec.micro_batch is None and rec.model_extra == {"retired_key": 1}
    store, ids = _sweep(tmp_path)
    for rid in ids:
        (store.run_dir(rid) / "result.json").write_text(json.dumps(old))
    df, missing = runs_table(store)
    assert missing == {} and len(df) == len(ids) and list(df.columns[: len(OLD_COLUMNS)]) == OLD_COLUMNS
    row = df.iloc[0]
    assert (row.val_loss, row.D, row.steps, row.mlp_ratio) == (3.25, 6144.0, 12, 4)
    assert pd.isna(row.N_norm) and pd.isna(row.micro_batch) and pd.isna(row.train_loss) and "retired_key" not in df
    assert row.error == "" and row.attempts == 0


# ---- validation --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"val_loss": 3.0}, "status: expected one of ok, diverged, failed, got None"),
        ({**OK, "status": "done"}, "status: expected one of ok, diverged, failed, got 'done'"),
        ({**OK, "val_loss": "low"}, "val_loss: expected a finite number, got 'low'"),
        ({**OK, "val_loss": float("nan")}, "val_loss: expected a finite number, got nan"),
        ({**OK, "r": 0}, "r: expected >= 1, got 0"),
        ({**OK, "N_rec": -1}, "N_rec: expected >= 0, got -1"),
        ({**OK, "D": 0}, "D: expected > 0, got 0"),
        ({**OK, "D": True}, "D: expected a finite number, got True"),
        ({**OK, "steps": "12"}, None),  # lax, as JSON from another writer may be: a numeric string is a number
        ({**OK, "steps": 12.5}, "steps: expected an integer, got 12.5"),
        ({**OK, "hardware": "gpu"}, "hardware: expected a JSON object, got 'gpu'"),
        ({**OK, "layout": 3}, "layout: expected a string, got 3"),
        ({"status": "failed", "error": "boom"}, None),
        ({"status": "diverged", "val_loss": None, "error": "loss nan"}, None),
        ([1, 2], "expected a JSON object, got [1, 2]"),
    ],
)
def test_validation_names_the_field_and_what_it_expected(doc, message) -> None:
    assert record_problem(doc) == message


def test_the_fit_requires_the_fields_the_record_requires_of_a_finished_run() -> None:
    from loopscale.fit.table import REQUIRED

    assert set(REQUIRED) == {f for f, _ in record.OK_REQUIRES} == set(record.FIT_INPUTS)
    assert set(REQUIRED) <= set(runs_table_columns())


def test_the_fit_reads_result_json_through_the_record(tmp_path: Path) -> None:
    """A sweep dir read from its run dirs: a record's status and the fit's inputs are checked as the store checks
    them (one line naming the file and field)."""
    from loopscale.errors import ConfigError
    from loopscale.fit import load_runs

    for i, r in enumerate((1, 2, 4)):
        run = tmp_path / f"run{i}"
        run.mkdir()
        (run / "result.json").write_text(json.dumps({**OK, "r": r, "N_rec": 100 * r, "D": 1000 * (i + 1)}))
    assert len(load_runs(tmp_path).df) == 3
    (tmp_path / "run1" / "result.json").write_text(json.dumps({**OK, "D": 0}))
    with pytest.raises(ConfigError) as err:
        load_runs(tmp_path)
    assert "D" in str(err.value) and "run1" in str(err.value) and "expected > 0" in str(err.value)
    # the fit checks what it reads (another writer's D may be a float count), not the record's other types
    (tmp_path / "run1" / "result.json").write_text(json.dumps({**OK, "D": 2000.5, "steps": 2.5}))
    assert len(load_runs(tmp_path).df) == 3


def test_the_store_names_an_invalid_record(tmp_path: Path) -> None:
    from loopscale.sweep.store import result_problem

    assert result_problem is record_problem
    store, ids = _sweep(tmp_path)
    (store.run_dir(ids[0]) / "result.json").write_text(json.dumps({**OK, "N_once": "many"}))
    st = store.state(ids[0])
    assert st.status == "corrupt" and "invalid (N_once: expected a finite number, got 'many')" in st.problem
    with pytest.raises(record.RecordError, match="N_once: expected a finite number"):
        RunRecord.read(store.run_dir(ids[0]))
    assert RunRecord.read(store.run_dir(ids[1])) is None


def test_eval_skips_an_invalid_record_with_a_note(tmp_path: Path) -> None:
    from loopscale.eval.runs import META_COLUMNS, find_runs

    for name, doc in (("good", {**OK, "d_model": 16}), ("bad", {**OK, "d_model": "wide"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(doc))
        (tmp_path / name / "model.safetensors").write_bytes(b"")
    chosen, notes = find_runs(tmp_path)
    assert [r.run_id for r in chosen] == ["good"]
    assert notes == ["bad: result.json is no valid run record (d_model: expected an integer, got 'wide'), skipped"]
    # the axes table's lead columns are the runs table's, plus the run dir and the r evaluated at
    assert set(META_COLUMNS) - {"run_dir", "r_eval"} <= set(runs_table_columns())


# ---- docs and layering -------------------------------------------------------------------------------------------


def test_the_docs_list_every_runs_table_column() -> None:
    text = (DOCS / "sweep.md").read_text(encoding="utf-8")
    section = text.split("## The runs table", 1)[1].split("\n## ", 1)[0]
    listed = []
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("| `") and len(cells) > 2:
            listed += [n.strip() for code in re.findall(r"`([^`]*)`", cells[1]) for n in code.split(",")]
    assert sorted(listed) == sorted(runs_table_columns())


def test_the_record_is_light() -> None:
    """The sweep store and `sweep plan` read it: no torch, no pandas; and the model's chunk sizes load without
    torch (``loopscale.memory`` reads them)."""
    code = (
        "import sys\n"
        "import loopscale.record, loopscale.model.chunks, loopscale.memory\n"
        "bad = [m for m in ('torch', 'pandas', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "from loopscale.model import LoopedLM\n"  # the model's names still load, on first use
        "assert LoopedLM.__module__ == 'loopscale.model.looped'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from test_imports import import_graph

    assert import_graph()["loopscale.record"] <= {"loopscale.errors"}
