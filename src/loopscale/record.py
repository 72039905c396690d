"""A run's record: what the trainer writes to ``result.json`` and what one row of the runs table holds.

``RunRecord`` is the one statement of that record. The trainer builds it (``loopscale.train.loop``), a sweep
writes it for a run that failed outside the trainer (``sweep.attempt.record_failure``), ``sweep collect``
derives the runs table's columns and dtypes from its fields (``runs_table_columns``, ``table_dtype``) and
the sweep store and ``eval`` validate what they read against it (``record_problem``). A field
added here once appears in result.json, in the runs table and in what the readers check (docs/sweep.md,
"The runs table").

Old run dirs load: every field but ``status`` is optional (older versions wrote fewer), and keys this
version does not know are kept (``extra="allow"``). The trainer dumps with ``dump()``, which writes the
fields it set and no others, so a new field appears in result.json only where the trainer sets it.

Torch-free and pandas-free: the sweep store and ``sweep plan`` import it.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, ValidationError

RESULT = "result.json"
STATUSES = ("ok", "diverged", "failed")
"""The terminal statuses a result.json records (an interrupted run writes none)."""


@dataclass(frozen=True)
class Column:
    """How a field appears in the runs table (``typing.Annotated`` metadata on a ``RunRecord`` field).

    Without it a scalar field is a column whose dtype follows its annotation (int: ``Int64``, float:
    ``float64``, anything else: as pandas infers it). ``dtype``: the pandas dtype to convert to, None to
    keep what pandas infers from the values; ``table``: False leaves the field out of the table.
    """

    dtype: str | None = None
    table: bool = True


INFERRED = Column(None)
"""A column pandas has typed from its values since before ``RunRecord`` (int64 when every row has one, float64
with holes); kept so runs.csv and runs.parquet read as they did."""
AS_FLOAT = Column("float64")
"""A count the table has always held as float64 (``D``: ``49664.0`` in runs.csv)."""
NO_COLUMN = Column(table=False)
"""In result.json only (a traceback is no table cell)."""


class RunRecord(BaseModel):
    """One run's ``result.json``: the final estimate, the grid's tokens and FLOPs, the model's accounting and
    template, the setup it ran on, the memory plan, and what went wrong (fields in the order written)."""

    model_config = ConfigDict(extra="allow")

    # -- the outcome: the status and the final validation estimate (the fit's y and its noise)
    status: str
    val_loss: float | None = None
    val_loss_se: float | None = None
    val_bpb: float | None = None
    train_loss: float | None = None

    # -- how far it trained and what that cost: D (tokens) and C (the grid's budget, else the FLOPs spent)
    steps: Annotated[int | None, INFERRED] = None
    total_steps: int | None = None
    D: Annotated[int | None, AS_FLOAT] = None
    C: float | None = None
    flops: float | None = None
    val_tokens: int | None = None

    # -- a user's technique (``model.technique``): which code, in which version, made the run
    technique: str | None = None
    technique_sha256: str | None = None

    # -- the architecture: the loop's shape (``loopscale.config.ModelConfig``)
    r: int | None = None
    d_model: int | None = None
    n_prelude: int | None = None
    n_recur: int | None = None
    n_coda: int | None = None
    L_eff: Annotated[int | None, INFERRED] = None
    layout: str | None = None
    injection: str | None = None
    bptt_k: Annotated[int | None, INFERRED] = None

    # -- the accounting (``loopscale.accounting``): the fit's N_once and N_rec, the rest for the report
    N_once: int | None = None
    N_rec: int | None = None
    N_emb: Annotated[int | None, INFERRED] = None
    N_norm: int | None = None
    N_total: Annotated[int | None, INFERRED] = None
    flops_per_token: float | None = None

    # -- the architecture template, so a fit can rebuild the accounting for other widths
    seq_len: Annotated[int | None, INFERRED] = None
    batch_size: Annotated[int | None, INFERRED] = None
    vocab_size: Annotated[int | None, INFERRED] = None
    vocab_multiple: Annotated[int | None, INFERRED] = None
    head_dim: Annotated[int | None, INFERRED] = None
    mlp_ratio: Annotated[int | None, INFERRED] = None
    hc_lanes: Annotated[int | None, INFERRED] = None
    tokens_per_param: float | None = None

    # -- the setup it ran on, to reproduce or explain a run (wall time, precision, processes, code, data)
    wall_s: float | None = None
    dtype: str | None = None
    world_size: int | None = None
    hardware: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None
    data_fingerprint: str | None = None
    threads: int | None = None
    compile: str | None = None

    # -- the memory plan (``loopscale.train.microbatch.MicroBatches.record``) and, on CUDA, what the allocator saw
    micro_batch: int | None = None
    val_micro_batch: int | None = None
    predicted_peak_bytes: float | None = None
    predicted_val_peak_bytes: float | None = None
    memory_limit_bytes: int | None = None
    measured_peak_bytes: int | None = None
    measured_val_peak_bytes: int | None = None

    # -- why it did not finish (diverged, failed)
    error: str | None = None
    traceback: Annotated[str | None, NO_COLUMN] = None

    def dump(self) -> dict[str, Any]:
        """result.json's object: the fields set (in field order), then any extra keys; nothing unset."""
        return self.model_dump(exclude_unset=True)

    @classmethod
    def read(cls, path: str | Path) -> RunRecord | None:
        """The record of a run dir (or of a result.json path); None when there is none.

        Raises ``RecordError`` when the file cannot be read or is no valid record (``record_problem``)."""
        p = Path(path)
        if p.is_dir():
            p = p / RESULT
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise RecordError(f"{p}: unreadable ({type(exc).__name__}: {exc})") from None
        problem = record_problem(doc)
        if problem is not None:
            raise RecordError(f"{p}: invalid ({problem})")
        return cls.model_validate(doc)


class RecordError(ValueError):
    """A result.json that cannot be read or is no valid ``RunRecord``."""


# ---- validation --------------------------------------------------------------------------------------------------

FIT_INPUTS: tuple[str, ...] = ("r", "N_once", "N_rec", "D", "val_loss")
"""The fields the law reads: a runs table's required columns (``fit.table.REQUIRED``)."""

OK_REQUIRES: tuple[tuple[str, int | None], ...] = (("val_loss", None), ("r", 1), ("N_once", 0), ("N_rec", 0), ("D", 0))
"""What a finished (status ok) run must carry, finite and at least this (``D`` above it): the fit's inputs."""


def record_problem(doc: Any, model: type[RunRecord] | None = None, *, types: bool = True) -> str | None:
    """What makes a result.json unusable ("field: expected ..., got ..."), or None.

    A result the fit would silently read as NaN (a string loss, a negative token count) is a corrupt run that
    ``collect`` and ``sweep status`` name, not a row with holes; so is a field of the wrong type (``types``:
    False checks the status and the fit's inputs only, as the fit does for a result.json of any writer)."""
    if not isinstance(doc, dict):
        return f"expected a JSON object, got {_short(doc)}"
    status = doc.get("status")
    if status not in STATUSES:
        return f"status: expected one of {', '.join(STATUSES)}, got {_short(status)}"
    if status == "ok":
        for field, lowest in OK_REQUIRES:
            v = doc.get(field)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                return f"{field}: expected a finite number, got {_short(v)}"
            if lowest is not None and (v < lowest or (field == "D" and v <= 0)):
                return f"{field}: expected {'> 0' if field == 'D' else f'>= {lowest}'}, got {_short(v)}"
    if not types:
        return None
    try:
        (model or RunRecord).model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "record"
        return f"{field}: expected {_expected(err['type'])}, got {_short(err.get('input'))}"
    return None


def _expected(kind: str) -> str:
    for prefix, what in (
        ("int", "an integer"),
        ("float", "a number"),
        ("string", "a string"),
        ("dict", "a JSON object"),
        ("missing", "a value"),
    ):
        if kind.startswith(prefix):
            return what
    return kind.replace("_", " ")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- the runs table ----------------------------------------------------------------------------------------------

GRID: tuple[str, ...] = ("run_id", "variant", "seed", "C")
"""The plan's grid coordinates (``sweep.json``), the first columns of every row."""
GRID_DTYPES: dict[str, str | None] = {"run_id": None, "variant": None, "seed": "Int64", "C": "float64"}
ATTEMPTS = "attempts"
"""The row's last column among the pinned ones: how many times the sweep started the run (attempts.json)."""

PINNED: tuple[str, ...] = (
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
)
"""The runs table's lead columns, in the order runs.csv has had them; every other column of the record follows,
in field order (appended, so a reader by position keeps working)."""
LEAD = PINNED[:17]
"""The columns the fit and the report rely on (``sweep.COLUMNS``)."""


def _column(name: str, model: type[RunRecord]) -> Column | None:
    """The field's table metadata, or None when it is a plain column; raises KeyError for no field."""
    return next((m for m in model.model_fields[name].metadata if isinstance(m, Column)), None)


def _scalar(name: str, model: type[RunRecord]) -> type | None:
    """int, float or str for a field whose annotation is that (or it or None); None for anything else."""
    ann = model.model_fields[name].annotation
    args: list[Any] = [a for a in typing.get_args(ann) if a is not type(None)] if typing.get_args(ann) else [ann]
    return args[0] if len(args) == 1 and args[0] in (int, float, str) else None


def record_columns(model: type[RunRecord] | None = None) -> tuple[str, ...]:
    """The record's fields that are runs-table columns, in field order: scalars, not marked ``NO_COLUMN``."""
    m = model or RunRecord
    return tuple(n for n in m.model_fields if _scalar(n, m) is not None and ((c := _column(n, m)) is None or c.table))


def runs_table_columns(model: type[RunRecord] | None = None) -> tuple[str, ...]:
    """Every runs-table column: the pinned lead (``PINNED``), then the record's other columns in field order."""
    return PINNED + tuple(n for n in record_columns(model) if n not in PINNED)


def table_dtype(name: str, model: type[RunRecord] | None = None) -> str | None:
    """The pandas dtype of a runs-table column (None: as pandas infers it from the values)."""
    m = model or RunRecord
    if name in GRID_DTYPES:
        return GRID_DTYPES[name]
    if name == ATTEMPTS:
        return "Int64"
    column = _column(name, m)
    if column is not None:
        return column.dtype
    kind = _scalar(name, m)
    return "Int64" if kind is int else "float64" if kind is float else None


def _check_pinned() -> None:
    fields = set(record_columns())
    odd = [c for c in PINNED if c not in fields and c not in GRID and c != ATTEMPTS]
    if odd:  # pragma: no cover - a field renamed without its column
        raise RuntimeError(f"runs-table columns without a RunRecord field: {odd}")


_check_pinned()
