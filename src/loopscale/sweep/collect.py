"""The runs table: one row per run with a result.json, in plan order (docs/sweep.md, "The runs table").

Grid coordinates (run_id, variant, seed, C) come from the sweep's plan (``sweep.json``); accounting
and losses come from each run's ``result.json`` — the trainer writes them from ``loopscale.accounting``.
The columns and their dtypes are ``loopscale.record``'s: the pinned lead (``record.PINNED``, the order
runs.csv has always had), then every other scalar field of ``RunRecord`` in field order.
The fit reads ``r, N_once, N_rec, D, val_loss`` and uses ``C, variant, run_id, status``; the template
columns (vocab_size, head_dim, L_eff, ...) let it rebuild the accounting for other widths.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from loopscale import record
from loopscale.io import atomic_write_bytes, atomic_write_text
from loopscale.sweep.spec import plan_order
from loopscale.sweep.store import SweepStore

COLUMNS: tuple[str, ...] = record.LEAD
"""The lead columns the fit and the report rely on."""
EXTRA: tuple[str, ...] = record.runs_table_columns()[len(COLUMNS) :]
"""Every column after ``COLUMNS``, ``attempts`` and the record's later fields included."""


def runs_table(store: SweepStore) -> tuple[Any, dict[str, int]]:
    """(DataFrame of runs with a result, counts of runs without one by status).

    Runs whose sweep.json or result.json cannot be read count as ``corrupt`` (``corrupt_files`` names them).
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    missing: dict[str, int] = {}
    if store.unreadable_plans():
        missing["corrupt"] = len(store.unreadable_plans())
    columns = record.runs_table_columns()
    from_record = [c for c in columns if c not in record.GRID and c != record.ATTEMPTS]
    for rs in store.planned(plan_order(store.root)):
        st = store.state(rs.run_id)
        if st.result is None:
            missing[st.status] = missing.get(st.status, 0) + 1
            continue
        res = st.result
        row: dict[str, Any] = {"run_id": rs.run_id, "variant": rs.variant, "seed": rs.seed, "C": rs.C}
        for col in from_record:
            row[col] = res.get(col)
        row["error"] = (res.get("error") or "") if res.get("status") != "ok" else ""
        row[record.ATTEMPTS] = st.attempts.get("attempts", 0)
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(columns))
    for col in columns:
        dtype = record.table_dtype(col)
        if dtype is not None:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(dtype)
    return df, missing


def corrupt_files(store: SweepStore) -> list[str]:
    """One line per run left out because a file of it cannot be read (sweep.json or result.json)."""
    lines = list(store.unreadable_plans().values())
    for rs in store.planned(plan_order(store.root)):
        st = store.state(rs.run_id)
        if st.status == "corrupt" and st.problem:
            lines.append(st.problem)
    return lines


def write_table(df: Any, csv_path: Path) -> tuple[Path, Path]:
    """Write ``runs.csv`` and ``runs.parquet`` (same stem) atomically."""
    csv_path = Path(csv_path)
    pq_path = csv_path.with_suffix(".parquet")
    atomic_write_text(csv_path, df.to_csv(index=False))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(pq_path, buf.getvalue())
    return csv_path, pq_path
