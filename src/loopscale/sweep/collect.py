"""The runs table: one row per run with a result.json, in plan order (docs/guide.md, runs-table schema).

Grid coordinates (run_id, variant, seed, C) come from the sweep's plan (``sweep.json``); accounting
and losses come from each run's ``result.json`` — the trainer writes them from ``loopscale.accounting``.
The fit reads ``r, N_once, N_rec, D, val_loss`` and uses ``C, variant, run_id, status``; the template
columns (vocab_size, head_dim, L_eff, ...) let it rebuild the accounting for other widths.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from loopscale.io import atomic_write_bytes, atomic_write_text
from loopscale.sweep.store import SweepStore

COLUMNS: tuple[str, ...] = ("run_id", "variant", "seed", "C", "r", "d_model", "n_prelude", "n_recur", "n_coda",
                            "N_once", "N_rec", "D", "val_loss", "flops_per_token", "status", "wall_s", "error")
EXTRA: tuple[str, ...] = ("val_loss_se", "val_bpb", "L_eff", "layout", "injection", "bptt_k", "seq_len", "batch_size",
                          "steps", "flops", "tokens_per_param", "N_emb", "N_total", "vocab_size", "vocab_multiple",
                          "head_dim", "mlp_ratio", "hc_lanes", "attempts")


def runs_table(store: SweepStore) -> tuple[Any, dict[str, int]]:
    """(DataFrame of runs with a result, counts of runs without one by status).

    Runs whose sweep.json or result.json cannot be read count as ``corrupt`` (``corrupt_files`` names them).
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    missing: dict[str, int] = {}
    if store.unreadable_plans():
        missing["corrupt"] = len(store.unreadable_plans())
    for rs in store.planned():
        st = store.state(rs.run_id)
        if st.result is None:
            missing[st.status] = missing.get(st.status, 0) + 1
            continue
        res = st.result
        row: dict[str, Any] = {"run_id": rs.run_id, "variant": rs.variant, "seed": rs.seed, "C": rs.C}
        for col in COLUMNS[4:] + EXTRA:
            row[col] = res.get(col)
        row["status"] = res.get("status")
        row["error"] = (res.get("error") or "") if res.get("status") != "ok" else ""
        row["attempts"] = st.attempts.get("attempts", 0)
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(COLUMNS + EXTRA))
    for col in ("r", "d_model", "n_prelude", "n_recur", "n_coda", "N_once", "N_rec", "seed", "attempts"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    for col in ("C", "D", "val_loss", "val_loss_se", "val_bpb", "flops_per_token", "wall_s", "flops",
                "tokens_per_param"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    return df, missing


def corrupt_files(store: SweepStore) -> list[str]:
    """One line per run left out because a file of it cannot be read (sweep.json or result.json)."""
    lines = list(store.unreadable_plans().values())
    for rs in store.planned():
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
