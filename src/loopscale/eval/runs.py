"""Checkpoints and sweeps: which models to evaluate, at which r, and the axes table.

A sweep dir is any folder with run dirs below it (``**/result.json``, as the trainer writes them);
nothing here imports the sweep executor. Runs are grouped into cells by (variant, C, r): the grid
coordinates of the sweep's ``sweep.json`` when a run dir has one (run_id, variant, seed, C), else
result.json's ``variant`` (default ``baseline``) and ``C``, rounded to 3 significant digits. The
compute-optimal run of a cell is its finished run (status ok, with weights) of lowest ``val_loss``
over widths and seeds (``all_runs=True``: every finished run). Each model is evaluated at its
training r and at any extra ``r_values`` it supports (test-time recurrence; an r = 1 baseline has
no loop to vary, and hyperconnect has lane scalars for its training r only, so those
combinations are skipped with a note).

Results are cached per run, r and task set in ``<run dir>/eval/<key>.json`` (the key includes the
weights' size and mtime), so an interrupted sweep evaluation resumes where it stopped.

The axes table (``axes.csv``, long format) has one row per (run, r_eval, scored task):
``run_id, run_dir, variant, seed, C, r, r_eval, d_model, val_loss, axis, task, loss, loss_per_byte,
accuracy, n_items, n_tokens, shots`` — what the report macro-averages into axes. Controls and the
aggregates go to ``axes_summary.csv``, one row per (run, r_eval): ``loss_<axis>``, ``acc_<axis>``,
``loss_overall``, ``acc_overall``, ``loss_<control>``, ``acc_<control>`` and ``knowledge_gap``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscale.errors import ConfigError
from loopscale.eval.runner import EvalResult, evaluate
from loopscale.eval.tasks import resolve_tasks
from loopscale.record import RESULT, record_problem

EVAL_VERSION = 1
"""Bumped when scores change for the same model and tasks (invalidates the per-run caches)."""
DEFAULT_VARIANT = "baseline"
WEIGHTS = "model.safetensors"
META_COLUMNS = ("run_id", "run_dir", "variant", "seed", "C", "r", "r_eval", "d_model", "val_loss")
"""The axes table's lead columns: the runs table's (``loopscale.record``; a test checks them) plus the run dir and
the r it was evaluated at."""


@dataclass(frozen=True)
class RunRef:
    """A run dir and the result.json fields the axes table carries."""

    run_dir: Path
    run_id: str
    variant: str = DEFAULT_VARIANT
    C: float | None = None
    r: int | None = None
    d_model: int | None = None
    val_loss: float | None = None
    status: str = "ok"
    seed: int | None = None
    problem: str | None = None  # what makes its result.json no valid record (``record.record_problem``)

    def meta(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "variant": self.variant,
            "seed": self.seed,
            "C": self.C,
            "r": self.r,
            "d_model": self.d_model,
            "val_loss": self.val_loss,
        }


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _read_json(p: Path, what: str) -> dict[str, Any]:
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(what, f"not valid JSON: {str(exc).splitlines()[0]}", source=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError(what, "expected one JSON object per run", source=str(p))
    return data


def read_run(run_dir: Path, run_id: str | None = None) -> RunRef:
    """A RunRef from a run dir: grid coordinates (run_id, variant, seed, C) from the sweep's
    ``sweep.json`` when there is one, else from ``result.json``; r, d_model, val_loss, status from
    ``result.json``."""
    res = _read_json(run_dir / RESULT, RESULT)
    grid = _read_json(run_dir / "sweep.json", "sweep.json")
    problem = record_problem(res) if res else None
    r = _num(res.get("r", grid.get("r")))
    d = _num(res.get("d_model", grid.get("d_model")))
    seed = _num(grid.get("seed", res.get("seed")))
    return RunRef(
        run_dir,
        str(grid.get("run_id") or run_id or run_dir.name),
        str(grid.get("variant") or res.get("variant") or DEFAULT_VARIANT),
        _num(grid.get("C", res.get("C"))),
        int(r) if r is not None else None,
        int(d) if d is not None else None,
        _num(res.get("val_loss")),
        str(res.get("status", "ok")),
        int(seed) if seed is not None else None,
        problem,
    )


def _cell_C(C: float | None) -> float | None:
    return float(f"{C:.3g}") if C is not None else None


def find_runs(sweep_dir: str | Path, *, all_runs: bool = False) -> tuple[list[RunRef], list[str]]:
    """The runs to evaluate under ``sweep_dir`` (compute-optimal per cell, or all) and notes on the rest."""
    root = Path(sweep_dir)
    results = sorted(root.rglob("result.json"))
    if not results:
        if (root / "config.toml").is_file():  # a single run that has not finished (or is training now)
            from loopscale import locks

            held = locks.live(root)
            why = ("; " + locks.describe(held, root)) if held is not None else ""
            raise ConfigError("RUN", f"not finished: no {WEIGHTS} or result.json yet{why}", value=str(root))
        raise ConfigError("SWEEP_DIR", "no run dirs (*/result.json) below this folder", value=str(root))
    runs, notes = [], []
    for p in results:
        ref = read_run(p.parent, str(p.parent.relative_to(root)) if p.parent != root else p.parent.name)
        if ref.problem is not None:
            notes.append(f"{ref.run_id}: {RESULT} is no valid run record ({ref.problem}), skipped")
        elif ref.status.lower() != "ok":
            notes.append(f"{ref.run_id}: status {ref.status}, skipped")
        elif not (ref.run_dir / WEIGHTS).exists():
            notes.append(f"{ref.run_id}: no {WEIGHTS}, skipped")
        elif not all_runs and ref.val_loss is None:
            notes.append(f"{ref.run_id}: no val_loss, cannot rank it, skipped")
        else:
            runs.append(ref)
    if all_runs:
        chosen = runs
    else:
        best: dict[tuple[Any, ...], RunRef] = {}
        for ref in runs:
            key = (ref.variant, _cell_C(ref.C), ref.r)
            if key not in best or (ref.val_loss or math.inf) < (best[key].val_loss or math.inf):
                best[key] = ref
        chosen = list(best.values())
    if not chosen:
        raise ConfigError(
            "SWEEP_DIR", f"no finished run with weights to evaluate ({len(notes)} skipped)", value=str(root)
        )
    chosen.sort(key=lambda x: (x.variant, x.C if x.C is not None else -1.0, x.r or 0, x.d_model or 0, x.run_id))
    return chosen, notes


def r_values_for(model_cfg: Any, r_values: Sequence[int] | None) -> tuple[list[int], list[str]]:
    """The training r plus every requested r the model can run; notes for the ones it cannot."""
    from loopscale.model.looped import cannot_run, supports_r

    rs, notes = [int(model_cfg.r)], []
    for r in r_values or []:
        r = int(r)
        if r in rs:
            continue
        if r < 1:
            raise ConfigError("--r", "must be a positive number of recurrences", value=r)
        if not model_cfg.is_looped:
            notes.append(f"r={r}: the r = 1 baseline is a plain stack, no loop to vary")
        elif not supports_r(model_cfg, r):
            notes.append(f"r={r}: {cannot_run(model_cfg, r)}")
        else:
            rs.append(r)
    return sorted(rs), notes


def _cache_key(
    run_dir: Path, task_names: list[str], r: int, shots: Any, limit: int | None, data_dir: str | Path | None, dtype: str
) -> str:
    w = run_dir / WEIGHTS
    st = w.stat()
    blob = json.dumps(
        {
            "v": EVAL_VERSION,
            "tasks": task_names,
            "r": r,
            "shots": shots,
            "limit": limit,
            "dtype": dtype,
            "data_dir": str(Path(data_dir).resolve()) if data_dir else None,
            "weights": [st.st_size, st.st_mtime_ns],
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def evaluate_run(
    run: RunRef | str | Path,
    tasks: str | Sequence[str] = "world",
    *,
    r_values: Sequence[int] | None = None,
    data_dir: str | Path | None = None,
    shots: int | dict[str, int] | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    device: str = "auto",
    dtype: str = "auto",
    use_cache: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[EvalResult], list[str]]:
    """Evaluate one trained run at its training r and the extra ``r_values``; (results, notes).

    ``log`` hears each stage (model loaded, each task prepared, scoring), so a long evaluation is never silent.

    ``dtype`` is the autocast dtype as in training: ``auto`` = bfloat16 on CUDA, float32 on CPU
    (logits and the log-softmax are fp32/fp64 either way).
    """
    import torch

    from loopscale.config import load_mapping, validate
    from loopscale.config.data import DataConfig
    from loopscale.io import atomic_write_json
    from loopscale.train.checkpoint import CONFIG
    from loopscale.train.hardware import autocast, resolved_dtype
    from loopscale.train.settings import TrainConfig

    if dtype not in ("auto", "float32", "bfloat16"):
        raise ConfigError("--dtype", "expected auto, float32 or bfloat16", value=dtype)

    ref = run if isinstance(run, RunRef) else read_run(_run_dir(Path(run)))
    specs = resolve_tasks(tasks)
    names = [s.name for s in specs]
    if not (ref.run_dir / WEIGHTS).exists():
        raise ConfigError("checkpoint", f"no {WEIGHTS} in {ref.run_dir} (is the run finished?)", value=str(ref.run_dir))
    cfg = validate(TrainConfig, load_mapping(ref.run_dir / CONFIG), source=str(ref.run_dir / CONFIG))
    dev = torch.device(resolve_device(device))
    dtype = resolved_dtype(dev, dtype)
    rs, notes = r_values_for(cfg.model, r_values)
    results: dict[int, EvalResult] = {}
    paths = {
        r: ref.run_dir / "eval" / f"{_cache_key(ref.run_dir, names, r, shots, limit, data_dir, dtype)}.json" for r in rs
    }
    for r, path in paths.items():
        if use_cache and path.exists():
            with contextlib.suppress(ValueError, KeyError, TypeError):  # a damaged entry is recomputed
                results[r] = EvalResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    todo = [r for r in rs if r not in results]
    if todo:
        with _cache_lock(ref.run_dir, use_cache, notes) as cache:
            say = log or (lambda _msg: None)
            say(f"{ref.run_id}: loading {WEIGHTS}")
            model, cfg = _load_weights(ref.run_dir, str(dev))
            tokenizer = tokenizer_for(cfg)
            # world tasks come from the run's own world; a run on other data gets the default world (its
            # reasoning, math, reading and symbolic items are still meaningful, its bio_qa facts are not)
            data = cfg.data if cfg.data.source == "default" else DataConfig(seed=cfg.data.seed)
            for r in todo:
                cb: Callable[[int, int], None] | None = None
                if progress:

                    def cb(d: int, t: int, r: int = r) -> None:
                        progress(f"{ref.run_id} r={r}", d, t)

                def log_line(m: str, r: int = r) -> None:
                    say(f"{ref.run_id} r={r}: {m}")

                with autocast(dev, dtype):
                    res = evaluate(
                        model,
                        specs,
                        tokenizer=tokenizer,
                        r=r,
                        data=data,
                        data_dir=data_dir,
                        shots=shots,
                        limit=limit,
                        batch_size=batch_size,
                        progress=cb,
                        log=log_line,
                    )
                if cache:
                    atomic_write_json(paths[r], {**res.as_dict(), "run_id": ref.run_id, "tasks_requested": names})
                results[r] = res
    return [results[r] for r in rs], notes


@contextlib.contextmanager
def _cache_lock(run_dir: Path, use_cache: bool, notes: list[str]) -> Iterator[bool]:
    """Hold the run's lock (``loopscale.locks``) while its cache is written; yields whether to cache.

    A run a live process holds (training it again, another evaluation) is refused in one line; a run dir that
    cannot be written (read-only) is evaluated without a cache, with a note."""
    from loopscale import locks

    if not use_cache:
        locks.refuse_if_held(run_dir, field="RUN", doing="evaluating it")
        yield False
        return
    try:
        lock = locks.acquire(run_dir, executor="loopscale eval")
    except OSError as exc:
        locks.refuse_if_held(run_dir, field="RUN", doing="evaluating it")
        notes.append(f"{run_dir}: cannot write its eval cache ({exc.strerror or exc}); evaluated without one")
        yield False
        return
    if lock is None:
        raise ConfigError(
            "RUN",
            f"{run_dir} is in use by another process (evaluating it now would mix with it): "
            + locks.describe(locks.live(run_dir) or {}, run_dir),
            value=str(run_dir),
        )
    with lock:
        yield True


def _load_weights(run_dir: Path, device: str) -> Any:
    """``load_model``, with a damaged or truncated weights file as one line naming it, not a traceback."""
    from safetensors import SafetensorError

    from loopscale.train.checkpoint import load_model

    try:
        return load_model(run_dir, device=device)
    except (SafetensorError, OSError, RuntimeError) as exc:
        msg = " ".join(str(exc).split())[:200]
        raise ConfigError(
            "checkpoint",
            f"{run_dir / WEIGHTS} cannot be loaded ({type(exc).__name__}: {msg}); the "
            "file is damaged or truncated: copy it again, or retrain the run",
        ) from None


def tokenizer_for(cfg: Any) -> Any:
    """The tokenizer a run trained with (``data.tokenizer``: bytes or a HuggingFace tokenizer.json)."""
    from loopscale.train.batches import make_tokenizer

    tok = make_tokenizer(cfg.data)
    if cfg.model.vocab_size < tok.vocab_size:
        raise ConfigError(
            "model.vocab_size", f"smaller than the tokenizer's {tok.vocab_size} ids", value=cfg.model.vocab_size
        )
    return tok


def resolve_device(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _run_dir(p: Path) -> Path:
    return p.parent if p.is_file() else p


def is_run(path: str | Path) -> bool:
    """A single run (a run dir with weights, or its model.safetensors), as opposed to a sweep dir."""
    p = Path(path)
    return (p.is_file() and p.name == WEIGHTS) or (p.is_dir() and (p / WEIGHTS).exists())


LONG_COLUMNS = (*META_COLUMNS, "axis", "task", "loss", "loss_per_byte", "accuracy", "n_items", "n_tokens", "shots")


def table_rows(ref: RunRef, results: Sequence[EvalResult]) -> list[dict[str, Any]]:
    """Rows of the axes table: one per scored task (controls and aggregates are in the summary)."""
    rows = []
    for res in results:
        meta = {**ref.meta(), "r_eval": res.r}
        for t in res.tasks:
            if not t.control:
                rows.append(
                    {
                        **meta,
                        "axis": t.axis,
                        "task": t.task,
                        "loss": t.loss,
                        "loss_per_byte": t.loss_per_byte,
                        "accuracy": t.accuracy,
                        "n_items": t.n_items,
                        "n_tokens": t.n_tokens,
                        "shots": t.shots,
                    }
                )
    return rows


def summary_rows(ref: RunRef, results: Sequence[EvalResult]) -> list[dict[str, Any]]:
    """One row per (run, r_eval): axis scores, overall, controls and the knowledge gap."""
    rows = []
    for res in results:
        row: dict[str, Any] = {**ref.meta(), "r_eval": res.r}
        for axis, a in res.axes().items():
            row[f"loss_{axis}"] = a["loss"]
            row[f"acc_{axis}"] = a["accuracy"]
        o = res.overall()
        row["loss_overall"] = o["loss"]
        row["acc_overall"] = o["accuracy"]
        for t in res.tasks:
            if t.control:
                row[f"loss_{t.task}"] = t.loss
                row[f"acc_{t.task}"] = t.accuracy
        row["knowledge_gap"] = res.knowledge_gap()
        rows.append(row)
    return rows


def write_tables(out_dir: str | Path, rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> tuple[Path, Path]:
    """Write ``axes.csv`` and ``axes_summary.csv`` (atomically) and return their paths."""
    import pandas as pd

    from loopscale.io import atomic_write_text

    out = Path(out_dir)
    a = out / "axes.csv"
    s = out / "axes_summary.csv"
    df_long = pd.DataFrame(rows, columns=list(LONG_COLUMNS))
    df = pd.DataFrame(summary)
    lead = [c for c in META_COLUMNS if c in df.columns]
    df = df[lead + [c for c in df.columns if c not in lead]]
    for frame in (df_long, df):
        for c in ("n_items", "n_tokens", "shots", "seed", "r", "r_eval", "d_model"):
            if c in frame.columns:
                frame[c] = frame[c].astype("Int64")  # whole numbers; empty where unknown
    atomic_write_text(a, df_long.to_csv(index=False))
    atomic_write_text(s, df.to_csv(index=False))
    return a, s


@dataclass(frozen=True)
class Evaluation:
    """What ``evaluate_path`` evaluated and wrote: the long and summary rows (as in the CSVs), each run's
    ``EvalResult`` per r_eval, the notes, the runs, and the two tables' paths."""

    rows: list[dict[str, Any]]  # axes.csv's rows: one per (run, r_eval, task)
    summary: list[dict[str, Any]]  # axes_summary.csv's rows: one per (run, r_eval)
    results: dict[str, list[EvalResult]]  # run_id -> one EvalResult per r_eval
    notes: list[str]
    runs: list[RunRef]
    axes_csv: Path
    summary_csv: Path


def evaluate_path(
    path: str | Path,
    tasks: str | Sequence[str] = "world",
    *,
    r_values: Sequence[int] | None = None,
    r_values_where: Callable[[RunRef], bool] | None = None,
    all_runs: bool = False,
    out_dir: str | Path | None = None,
    data_dir: str | Path | None = None,
    shots: int | dict[str, int] | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    device: str = "auto",
    dtype: str = "auto",
    use_cache: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[RunRef, int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> Evaluation:
    """Evaluate a run dir (or its model.safetensors) or every selected run of a sweep dir; write the tables.

    ``r_values_where`` picks the runs that get the extra ``r_values`` (default: all): a run at r_eval = 16 costs
    up to 16/r times its training-r evaluation, so a cheap test-time study (``loopscale demo``) evaluates
    only the runs the report's test-time figure shows.

    Returns an ``Evaluation``: ``.results[run_id]`` holds the run's ``EvalResult`` per r_eval.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError("PATH", "no such file or folder", value=str(p))
    resolve_tasks(tasks)  # unknown names fail before any model is loaded
    if is_run(p):
        refs, notes = [read_run(_run_dir(p))], list[str]()
    else:
        refs, notes = find_runs(p, all_runs=all_runs)
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    per_run: dict[str, list[EvalResult]] = {}
    for i, ref in enumerate(refs):
        if on_run is not None:
            on_run(ref, i, len(refs))
        extra = r_values if r_values_where is None or r_values_where(ref) else None
        results, run_notes = evaluate_run(
            ref,
            tasks,
            r_values=extra,
            data_dir=data_dir,
            shots=shots,
            limit=limit,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            use_cache=use_cache,
            progress=progress,
            log=log,
        )
        notes += [f"{ref.run_id}: {n}" for n in run_notes]
        per_run[ref.run_id] = results
        rows += table_rows(ref, results)
        summary += summary_rows(ref, results)
    target = Path(out_dir) if out_dir is not None else _run_dir(p)
    a, s = write_tables(target, rows, summary)
    return Evaluation(rows, summary, per_run, notes, refs, a, s)
