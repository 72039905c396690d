"""What a report reads: the runs table, the fit file (or a fit run now), and the optional axes table.

The runs table is loaded by ``loopscale.fit.load_runs`` (CSV, Parquet, or a sweep dir), so the report
and the fit accept exactly the same inputs. A fit file is never refitted: if one is given it is used
as it is (and checked against the runs); if none is given the report runs ``fit_runs`` and saves the
fit file beside the report, so every number on the page is traceable to a file.

The axes table (``axes.csv``, written by ``loopscale eval``) is long format, one row per
(run, r_eval, task): ``run_id`` (or ``run_dir``), ``C``, ``r``, ``r_eval``, ``variant``, ``d_model``,
``axis``, ``task``, ``loss``, ``accuracy``, ``n_items``. Required: ``r``, ``axis``, ``loss``.
Rows with ``r_eval != r`` are test-time recurrence points.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loopscale.errors import ConfigError
from loopscale.fit import FitResult, RunsTable, fit_runs, prepare_fit, read_fit, write_fit
from loopscale.fit.table import as_runs

#: the five evaluation axes of arXiv 2604.21106 §6, in the paper's order.
AXES: tuple[str, ...] = ("knowledge", "reading", "math", "reasoning", "symbolic")
AXIS_TITLES: dict[str, str] = {
    "knowledge": "parametric knowledge",
    "reading": "reading comprehension",
    "math": "math word problems",
    "reasoning": "reasoning primitives",
    "symbolic": "compositional symbolic",
}
AXES_REQUIRED: tuple[str, ...] = ("r", "axis", "loss")


@dataclass
class ReportInputs:
    """Everything one report is made from, with where each piece came from."""

    runs: RunsTable
    fit: FitResult  # as read from the fit file (every number on the page is traceable to it)
    fit_source: str
    fit_computed: bool
    axes: pd.DataFrame | None = None
    axes_source: str | None = None
    notes: list[str] = field(default_factory=list)  # problems with the inputs, shown as warnings

    @property
    def reference(self) -> str:
        return self.fit.reference


def runs_folder(runs: Any) -> Path | None:
    """The folder a runs table lives in (the sweep dir, or the folder of a runs file)."""
    if isinstance(runs, str | Path):
        p = Path(runs)
        return p if p.is_dir() else p.parent
    return None


def find_axes(runs: Any) -> Path | None:
    """``axes.csv`` (or ``axes.parquet``) in the sweep dir / beside the runs table, if there is one."""
    folder = runs_folder(runs)
    if folder is None:
        return None
    for name in ("axes.csv", "axes.parquet"):
        if (folder / name).is_file():
            return folder / name
    return None


def read_axes(path: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Read and check an axes table; one-line errors name the file, the column and the bad value."""
    if isinstance(path, pd.DataFrame):
        df, source = path.copy(), "<axes table>"
    else:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise ConfigError("--axes", "axes table not found", value=source)
        try:
            df = pd.read_parquet(p) if p.suffix.lower() in (".parquet", ".pq") else pd.read_csv(p)
        except Exception as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError("axes table", f"cannot be read as a table: {msg}", source=source) from None
    for col in AXES_REQUIRED:
        if col not in df.columns:
            raise ConfigError(
                col, f"missing column in the axes table; required: {', '.join(AXES_REQUIRED)}", source=source
            )
    if not len(df):
        raise ConfigError("rows", "the axes table is empty", source=source)
    df = df.reset_index(drop=True)
    if "run_id" not in df.columns:
        df["run_id"] = df["run_dir"].astype(str).map(lambda s: Path(s).name) if "run_dir" in df.columns else None
    numeric = ["r", "loss"] + [c for c in ("C", "r_eval", "accuracy", "n_items", "d_model") if c in df.columns]
    for col in numeric:
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = vals.isna() & df[col].notna() if col in ("accuracy", "n_items", "d_model") else vals.isna()
        if col == "loss":
            bad |= ~np.isfinite(vals.fillna(np.nan)) | (vals < 0)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise ConfigError(
                col, f"not a valid number in row {i + 2} of the axes table", value=df[col].iloc[i], source=source
            )
        df[col] = vals
    df["r"] = df["r"].round().astype(int)
    df["r_eval"] = df["r_eval"].fillna(df["r"]).round().astype(int) if "r_eval" in df.columns else df["r"]
    df["variant"] = (
        df["variant"].astype("string").fillna("baseline").astype(str) if "variant" in df.columns else "baseline"
    )
    df["axis"] = df["axis"].astype(str).str.strip().str.lower()
    df["task"] = df["task"].astype(str) if "task" in df.columns else df["axis"]
    if "C" in df.columns:
        df["C"] = [float(f"{c:.3g}") if np.isfinite(c) else np.nan for c in df["C"]]
    else:
        df["C"] = np.nan
    return df


def load_inputs(
    runs: Any,
    out_dir: Path,
    *,
    fit: str | Path | FitResult | dict[str, Any] | None = None,
    axes: str | Path | pd.DataFrame | None = None,
    bootstrap: int | None = None,
    restarts: int | None = None,
    progress: Callable[[str], None] | None = None,
    lr_draws: int | None = None,
) -> ReportInputs:
    """Load the runs, read or run the fit, and find the axes table."""
    say = progress or (lambda _msg: None)
    table = as_runs(runs)
    notes: list[str] = []
    if fit is None:
        given = {"bootstrap": bootstrap, "restarts": restarts, "lr_draws": lr_draws}
        options: dict[str, Any] = {k: int(v) for k, v in given.items() if v is not None}
        prepared = prepare_fit(table, **options)  # with the [fit] table of a spec.toml beside the runs
        settings = prepared.settings
        for note in prepared.notes:
            say(note)
        say(f"no fit file given: fitting ({settings.restarts} starts, {settings.bootstrap} resamples)")
        doc = fit_runs(table, settings, progress=say)
        path = write_fit(Path(out_dir) / "fit.json", doc)
        fit_doc, fit_source, computed = read_fit(path), str(path), True
    elif not isinstance(fit, str | Path):  # straight from fit_runs (or its dict): save it, so the page's numbers
        # have a file
        path = write_fit(Path(out_dir) / "fit.json", fit)
        fit_doc, fit_source, computed = read_fit(path), str(path), False
    else:
        fit_doc, fit_source, computed = read_fit(fit), str(fit), False
    if not computed:
        notes += _check_fit_matches_runs(fit_doc, table)
    axes_df, axes_source = None, None
    axes_path = axes if axes is not None else find_axes(runs)
    if axes_path is not None:
        axes_df = read_axes(axes_path)
        axes_source = "<axes table>" if isinstance(axes_path, pd.DataFrame) else str(axes_path)
    return ReportInputs(table, FitResult.of(fit_doc), fit_source, computed, axes_df, axes_source, notes)


def _check_fit_matches_runs(doc: dict[str, Any], table: RunsTable) -> list[str]:
    """A fit file made from another table would make every figure wrong: say so."""
    ids = (doc.get("resamples") or {}).get("run_id")
    if not ids:
        return []
    fit_ids = {str(i) for i in ids}
    run_ids = set(table.df["run_id"].astype(str))
    if fit_ids <= run_ids:
        return []
    missing = len(fit_ids - run_ids)
    return [
        f"the fit file was made from a different runs table: {missing} of its {len(fit_ids)} runs are not in "
        f"{table.source}; figures show this table's runs against that fit"
    ]
