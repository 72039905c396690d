"""Load and validate a runs table: the interchange format of the fit (docs/guide.md).

A runs table is a CSV or Parquet file, or a sweep directory that holds ``runs.csv`` /
``runs.parquet`` or ``result.json`` files (one flat JSON object per run). Required columns:
``r, N_once, N_rec, D, val_loss``; optional: ``C, variant, run_id, status`` (and anything else,
kept as is). Bad input raises a one-line :class:`~loopscale.errors.ConfigError` naming the file,
the column, the bad value and what is expected. Runs whose ``status`` says they did not finish
(diverged, failed, ...) are excluded and counted, not treated as errors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loopscale.errors import ConfigError
from loopscale.record import FIT_INPUTS, STATUSES, record_problem

REQUIRED: tuple[str, ...] = FIT_INPUTS
#: statuses of a run that finished normally (case-insensitive); an empty status counts as ok.
OK_STATUSES: frozenset[str] = frozenset(
    {"ok", "done", "completed", "complete", "success", "succeeded", "finished", "converged"}
)
#: the variant that r = 1 rows belong to when a table has no variant column.
DEFAULT_VARIANT = "baseline"
#: ``V@C`` names the re-fit of variant V's looped runs against control variant C's r = 1 runs.
CONTROL_SEP = "@"


def is_control_refit(variant: str) -> bool:
    """A ``V@C`` re-fit is the same runs under another r = 1 reference (control C), not another recipe."""
    return CONTROL_SEP in str(variant)


def r1_anchor(variant: str) -> str | None:
    """The control whose r = 1 runs a variant is read against (``V@C`` -> C), None for its own/shared ones.

    Δφ compares recipes read against the same r = 1 runs only: V@C against the reference B@C, plain V
    against a plain reference; a φ against other r = 1 runs is another estimand (docs/fit.md, "Δφ").
    """
    name = str(variant)
    return name.split(CONTROL_SEP, 1)[1] if CONTROL_SEP in name else None


@dataclass
class RunsTable:
    """A validated runs table: the usable runs, and what was left out and why."""

    df: pd.DataFrame
    source: str = "<table>"
    excluded: dict[str, int] = field(default_factory=dict)  # status -> count

    @property
    def n_excluded(self) -> int:
        return sum(self.excluded.values())

    @property
    def has_budget(self) -> bool:
        return "C" in self.df.columns

    @property
    def variants(self) -> list[str]:
        """Variants of the r > 1 runs (r = 1 runs are shared by every variant)."""
        looped = self.df[self.df["r"] > 1]
        names = sorted(set(looped["variant"])) if len(looped) else []
        return names or sorted(set(self.df["variant"]))

    def variant_mask(self, variant: str) -> np.ndarray:
        """Rows one variant's fit uses: its own runs, plus the shared r = 1 runs unless it has its own.

        The paper reuses the r = 1 runs across probes: a non-looped run is the same model whatever the
        loop recipe. Shared r = 1 runs are the baseline's (or, in a table without a baseline, every
        r = 1 run); a variant that trained its own r = 1 runs (sweep ``r1 = "own"``) uses only those.
        """
        df = self.df
        own: np.ndarray = (df["variant"] == variant).to_numpy()
        r1: np.ndarray = (df["r"] == 1).to_numpy()
        if (own & r1).any():
            return own
        base: np.ndarray = r1 & (df["variant"] == DEFAULT_VARIANT).to_numpy()
        rows: np.ndarray = own | (base if base.any() else r1)
        return rows

    def for_variant(self, variant: str | None) -> RunsTable:
        """The runs one variant's fit uses (see ``variant_mask``)."""
        if variant is None:
            return self
        if not (self.df["variant"] == variant).any():
            raise ConfigError(
                "variant",
                f"no runs with this variant; the table has {self.variants}",
                value=variant,
                source=self.source,
            )
        return self.subset(self.variant_mask(variant))

    def with_r1_control(self, control: str) -> RunsTable:
        """Add a variant ``V@control`` per variant V: V's looped runs against ``control``'s r = 1 runs.

        The control is a variant of r = 1 runs only, e.g. loops of one (``model.r1_looped``): fitting
        against it separates what sharing weights costs from what the loop's structure costs.
        """
        df = self.df
        ctrl = df[(df["variant"] == control) & (df["r"] == 1)]
        if ctrl.empty:
            names = sorted(set(df["variant"]))
            raise ConfigError(
                "--r1-from",
                f"no r = 1 runs with this variant; the table has {names}",
                value=control,
                source=self.source,
            )
        parts = [df]
        for v in self.variants:
            if v == control:
                continue
            name = f"{v}{CONTROL_SEP}{control}"
            looped = df[self.variant_mask(v) & (df["r"] > 1).to_numpy()]
            parts += [looped.assign(variant=name), ctrl.assign(variant=name)]  # same runs, same run ids
        return RunsTable(pd.concat(parts, ignore_index=True), source=self.source, excluded=dict(self.excluded))

    def seed_means(self) -> RunsTable:
        """One row per design point (variant, r, N_once, N_rec, D): the mean val loss over its seeds.

        The fit treats every run as a point; averaging seeds first weights each design point once and
        fits the mean curve (the bootstrap resamples (C, r) cells either way, seeds inside them).
        Adds ``n_seeds`` and ``val_loss_seed_sd`` (0 for a single seed).
        """
        df = self.df
        key = pd.DataFrame(
            {
                "variant": df["variant"].astype(str),
                "r": df["r"],
                **{c: [f"{v:.6g}" for v in df[c]] for c in ("N_once", "N_rec", "D")},
            }
        )
        groups = df.assign(_g=pd.factorize(pd.MultiIndex.from_frame(key))[0]).groupby("_g", sort=True)
        out = groups.head(1).drop(columns="_g").reset_index(drop=True)  # factorize numbers groups in row order
        loss = groups["val_loss"]
        out["val_loss"] = loss.mean().to_numpy()
        out["n_seeds"] = loss.size().to_numpy()
        out["val_loss_seed_sd"] = loss.std(ddof=1).fillna(0.0).to_numpy()
        out["run_id"] = groups["run_id"].agg(lambda x: ";".join(map(str, x))).to_numpy()
        return RunsTable(out, source=self.source, excluded=dict(self.excluded))

    def subset(self, mask: np.ndarray | pd.Series) -> RunsTable:
        return RunsTable(
            self.df[np.asarray(mask)].reset_index(drop=True), source=self.source, excluded=dict(self.excluded)
        )


def load_runs(path: str | Path | Sequence[str | Path]) -> RunsTable:
    """Read a runs table (CSV, Parquet or sweep dir), or several as one (e.g. one sweep per seed)."""
    if not isinstance(path, str | Path):
        paths = list(path)
        if not paths:
            raise ConfigError("RUNS", "no runs table given", value="")
        if len(paths) > 1:
            return _load_many(paths)
        path = paths[0]
    p = Path(path)
    if p.is_dir():
        df, source = _read_sweep_dir(p)
    elif p.is_file():
        df, source = _read_file(p), str(p)
    else:
        raise ConfigError(
            "RUNS",
            "no such file or directory; expected a runs table (CSV/Parquet) or a sweep dir",
            value=str(p),
        )
    return validate_runs(df, source=source)


def _load_many(paths: list[str | Path]) -> RunsTable:
    """Several tables fitted as one: their runs together, each run once (a repeated run id is an error)."""
    tables = [load_runs(p) for p in paths]
    seen: dict[str, str] = {}
    for t in tables:
        for rid in t.df["run_id"].astype(str):
            if rid in seen:
                raise ConfigError(
                    "run_id",
                    f"run {rid} is in both {seen[rid]} and {t.source}; give each run once "
                    "(a rerun with another seed has its own run ids)",
                    value=rid,
                    source=t.source,
                )
            seen[rid] = t.source
    excluded: dict[str, int] = {}
    for t in tables:
        for k, n in t.excluded.items():
            excluded[k] = excluded.get(k, 0) + n
    df = pd.concat([t.df for t in tables], ignore_index=True)
    return RunsTable(df, source=" + ".join(t.source for t in tables), excluded=excluded)


def _read_file(p: Path) -> pd.DataFrame:
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(p)
        if p.suffix.lower() in (".csv", ".tsv", ".txt"):
            return pd.read_csv(p, sep=_delimiter(p))
        if p.suffix.lower() == ".json":
            return _read_result_json(p, p.parent.name)
    except ConfigError:
        raise
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError("file", f"cannot be read as a table: {msg}", source=str(p)) from None
    raise ConfigError("file", "unknown table format; expected .csv, .tsv or .parquet", value=p.suffix, source=str(p))


def _delimiter(p: Path) -> str:
    """The CSV's delimiter (``,`` ``;`` tab or ``|``), sniffed from its first lines: European spreadsheets
    write ``;``, and a wrong guess reads the whole header as one column ("missing column r")."""
    import csv

    with p.open(encoding="utf-8", errors="replace", newline="") as fh:
        head = "".join(fh.readline() for _ in range(20))
    try:
        return csv.Sniffer().sniff(head, delimiters=",;\t|").delimiter
    except csv.Error:
        return "\t" if p.suffix.lower() == ".tsv" else ","


def _read_result_json(p: Path, run_id: str) -> pd.DataFrame:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except Exception as exc:
        raise ConfigError("result.json", f"not valid JSON: {str(exc).splitlines()[0]}", source=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError("result.json", "expected one flat JSON object per run", source=str(p))
    if data.get("status") in STATUSES:  # a run's record: its status and the fit's inputs checked as the store does
        problem = record_problem(data, types=False)
        if problem:
            field, _, what = problem.partition(": ")
            raise ConfigError(field, what, source=str(p))
    flat = {k: v for k, v in data.items() if not isinstance(v, dict | list)}
    flat.setdefault("run_id", run_id)
    return pd.DataFrame([flat])


def _read_sweep_dir(p: Path) -> tuple[pd.DataFrame, str]:
    for name in ("runs.parquet", "runs.csv"):
        if (p / name).is_file():
            return _read_file(p / name), str(p / name)
    results = sorted(p.rglob("result.json"))
    if not results:
        raise ConfigError("RUNS", "sweep dir has no runs.csv, runs.parquet or */result.json", source=str(p))
    frames = [_read_result_json(f, str(f.parent.relative_to(p))) for f in results]
    return pd.concat(frames, ignore_index=True), str(p)


def validate_runs(df: pd.DataFrame, *, source: str = "<table>") -> RunsTable:
    """Check the columns and values of a runs table; drop runs that did not finish."""
    if not isinstance(df, pd.DataFrame):
        raise ConfigError("table", "expected a pandas DataFrame of runs", value=type(df).__name__, source=source)
    df = df.rename(columns=lambda c: c.strip() if isinstance(c, str) else c)  # ' val_loss' is val_loss
    for col in REQUIRED:
        if col not in df.columns:
            raise ConfigError(col, f"missing column; required: {', '.join(REQUIRED)}", source=source)
    df = df.copy().reset_index(drop=True)
    excluded: dict[str, int] = {}
    if "status" in df.columns:
        status = df["status"].astype("string").str.strip().str.lower().fillna("")
        bad = ~(status.isin(OK_STATUSES) | (status == ""))
        for s, n in status[bad].value_counts().items():
            excluded[str(s)] = int(n)
        df = df[~bad.to_numpy()].reset_index(drop=True)
    if not len(df):
        raise ConfigError("rows", "no usable runs (every run was excluded or the table is empty)", source=source)

    if "run_id" in df.columns:
        ids = df["run_id"].astype(str)
        dup = ids[ids.duplicated()]
        if len(dup):
            raise ConfigError(
                "run_id", "duplicate run id; every run needs its own id", value=dup.iloc[0], source=source
            )
    else:
        df["run_id"] = [f"row{i}" for i in range(len(df))]
    if "variant" in df.columns:
        df["variant"] = df["variant"].astype("string").fillna(DEFAULT_VARIANT).astype(str)
    else:
        df["variant"] = DEFAULT_VARIANT

    numeric = [*REQUIRED, "C"] if "C" in df.columns else list(REQUIRED)
    for col in numeric:
        values = pd.to_numeric(df[col], errors="coerce")
        if values.isna().any():
            i = int(np.flatnonzero(values.isna().to_numpy())[0])
            raise ConfigError(
                col,
                f"not a number in run {df['run_id'].iloc[i]!s}; expected a finite number",
                value=df[col].iloc[i],
                source=source,
            )
        arr = values.to_numpy(dtype=float)
        if not np.isfinite(arr).all():
            i = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise ConfigError(
                col,
                f"not finite in run {df['run_id'].iloc[i]!s}; expected a finite number",
                value=arr[i],
                source=source,
            )
        lowest_ok = 0.0 if col in ("N_once", "N_rec") else None
        bad = arr < 0 if lowest_ok is not None else arr <= 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            want = "expected >= 0" if lowest_ok is not None else "expected > 0"
            raise ConfigError(
                col,
                f"non-positive value in run {df['run_id'].iloc[i]!s}; {want}",
                value=arr[i],
                source=source,
            )
        df[col] = arr
    r = df["r"].to_numpy()
    if (np.abs(r - np.round(r)) > 1e-9).any():
        i = int(np.flatnonzero(np.abs(r - np.round(r)) > 1e-9)[0])
        raise ConfigError(
            "r",
            f"not a whole number of recurrences in run {df['run_id'].iloc[i]!s}; expected 1, 2, 4, ...",
            value=r[i],
            source=source,
        )
    df["r"] = np.round(r).astype(int)
    size = df["N_once"].to_numpy() + df["N_rec"].to_numpy()
    if (size <= 0).any():
        i = int(np.flatnonzero(size <= 0)[0])
        raise ConfigError(
            "N_once",
            f"N_once + N_rec is 0 in run {df['run_id'].iloc[i]!s}; expected > 0",
            value=0,
            source=source,
        )
    looped_empty = (df["r"].to_numpy() > 1) & (df["N_rec"].to_numpy() <= 0)
    if looped_empty.any():
        i = int(np.flatnonzero(looped_empty)[0])
        raise ConfigError(
            "N_rec",
            f"is 0 in looped run {df['run_id'].iloc[i]!s} (r > 1); expected > 0",
            value=0,
            source=source,
        )
    return RunsTable(df, source=source, excluded=excluded)


def as_runs(table: RunsTable | pd.DataFrame | str | Path) -> RunsTable:
    """Accept whatever a user holds: a validated table, a DataFrame, or a path."""
    if isinstance(table, RunsTable):
        return table
    if isinstance(table, pd.DataFrame):
        return validate_runs(table)
    return load_runs(table)


def budget_values(df: pd.DataFrame) -> np.ndarray:
    """Each run's budget C rounded to 3 significant digits (for grouping)."""
    return np.array([float(f"{v:.3g}") for v in np.asarray(df["C"], dtype=float)])


# Architecture columns that set the law-based frontier's template when they hold one value throughout.
TEMPLATE_FIELDS: tuple[str, ...] = (
    "vocab_size",
    "head_dim",
    "L_eff",
    "n_prelude",
    "n_coda",
    "seq_len",
    "injection",
    "mlp_ratio",
    "vocab_multiple",
    "hc_lanes",
)


def template_from_table(df: Any) -> dict[str, Any]:
    """The paper's template, with any architecture column of the table that has one value throughout."""
    from loopscale import grids

    out: dict[str, Any] = dict(grids.PAPER_MODEL)
    for col in TEMPLATE_FIELDS:
        if col in df.columns and df[col].nunique(dropna=True) == 1:
            v = df[col].dropna().iloc[0]
            out[col] = v.item() if hasattr(v, "item") else v
    return out


def tokens_per_step(df: Any) -> float | None:
    """The global batch in tokens the runs trained with (``batch_size x seq_len``, else ``D / steps``), so the
    planner counts steps in the fit's units rather than the paper's 2^18; None when the table does not say."""
    cols = set(df.columns)
    if {"batch_size", "seq_len"} <= cols:
        num = {c: pd.to_numeric(df[c], errors="coerce") for c in ("batch_size", "seq_len")}
        tps = (num["batch_size"] * num["seq_len"]).dropna()
        if len(tps) and tps.nunique() == 1:
            return float(tps.iloc[0])
    if "steps" in cols:
        steps = pd.to_numeric(df["steps"], errors="coerce")
        ratio = (pd.to_numeric(df["D"], errors="coerce") / steps.where(steps > 0)).dropna()
        if len(ratio):
            return float(np.median(ratio))
    return None
