"""The sweep dir: one trainer run dir per run, and a status read from the files in it.

    SWEEP_DIR/
      spec.toml            the spec as run (widths resolved)
      events.jsonl         start / done / failed / diverged / interrupted, one line per event
      calibration.json     timings of the planner (per model shape and hardware)
      runs/<run_id>/       the trainer's run dir (config.toml, metrics.jsonl, ckpt.pt, result.json, ...)
          sweep.json       the run's grid coordinates and exact TrainConfig (written when planned)
          attempts.json    starts and failures so far, with the last errors
          lock.json        held while a process trains the run (``loopscale.locks``: pid, host, boot id, start time)
          lock.takeover    flock'ed while a process takes over a stale lock.json
          queued.json      SLURM job id while the run waits in a queue
      runs.csv, runs.parquet   `loopscale sweep collect`

Status (``RunState.status``), first match wins:
  done         result.json says ok
  diverged     result.json says diverged
  failed       result.json says failed (retried while failures <= max_retries)
  corrupt      result.json cannot be read (``sweep run`` sets it aside and runs the run again); a run
               dir whose sweep.json cannot be read is listed by ``unreadable_plans`` (not planned)
  running      lock.json held by a live process (same host: that pid, started then, this boot; other host: a
               fresh heartbeat)
  queued       queued.json names a SLURM job (and no lock)
  interrupted  started before (ckpt.pt, config.toml or metrics) but not running: resumes from its checkpoint
  planned      nothing yet
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscale import locks
from loopscale.errors import ConfigError
from loopscale.io import append_jsonl, atomic_write_json, atomic_write_text
from loopscale.record import RESULT
from loopscale.record import record_problem as result_problem  # what makes a result.json unusable
from loopscale.sweep.runspec import RunSpec

META = "sweep.json"
ATTEMPTS = "attempts.json"
QUEUED = "queued.json"
LOCK = locks.LOCK
Lock = locks.Lock  # re-exported: executors hold one while a run trains
STATUSES = ("done", "diverged", "failed", "corrupt", "running", "queued", "interrupted", "planned")


def _read_json(path: Path) -> dict[str, Any] | None:
    return _load_json(path)[0]


def _load_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object, None), (None, None) when there is no file, or (None, what is wrong with it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''})"
    if not isinstance(data, dict):
        return None, f"unreadable (a JSON {type(data).__name__}, not an object)"
    return data, None


@dataclass
class RunState:
    run_id: str
    status: str
    result: dict[str, Any] | None
    attempts: dict[str, Any]
    lock: dict[str, Any] | None = None
    step: int | None = None
    problem: str | None = None  # a status file that cannot be read (status corrupt, or a note)

    @property
    def failures(self) -> int:
        return int(self.attempts.get("failures", 0))

    @property
    def retryable(self) -> bool:
        return bool(self.attempts.get("retryable", True))


class SweepStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._last_events: dict[str, str] | None = None  # run_id -> its last event (log_missing_end)
        self.runs_dir = self.root / "runs"

    # -- layout --
    def run_dir(self, run_id: str) -> Path:
        """``runs/RUN_ID``; an id that would leave ``runs/`` (a separator, ``..``) is refused, so no read or
        write follows an id out of its sweep."""
        rid = str(run_id)
        if not rid or rid in (".", "..") or "/" in rid or "\\" in rid or "\0" in rid:
            raise ConfigError("run_id", "not a run id (it would leave the sweep's runs/ folder)", value=rid)
        d = self.runs_dir / rid
        if d.is_symlink() and d.resolve().parent != self.runs_dir.resolve():
            raise ConfigError(
                "run_id",
                f"{d} is a link out of the sweep's runs/ folder (to {d.resolve()}); loopscale "
                "neither reads nor writes through it",
                value=rid,
            )
        return d

    @property
    def spec_path(self) -> Path:
        return self.root / "spec.toml"

    def exists(self) -> bool:
        return self.spec_path.is_file()

    def write_spec(self, text: str) -> None:
        atomic_write_text(self.spec_path, text)

    def event(self, event: str, run_id: str, **extra: Any) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        append_jsonl(
            self.root / "events.jsonl",
            {
                "time": time.time(),
                "event": event,
                "run_id": run_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                **extra,
            },
        )

    def events(self) -> list[dict[str, Any]]:
        from loopscale.io import read_jsonl

        return read_jsonl(self.root / "events.jsonl")

    def log_missing_end(self, run_id: str, state: RunState) -> bool:
        """Log the end of a finished run whose last event is still its ``start``, marked ``recovered``.

        A kill after the trainer wrote result.json but before the executor logged ``done`` leaves the run
        finished with no end in events.jsonl; the restart skips it, so without this the log would never
        say it finished. Only for runs no live process holds (the holder logs its own end after the
        result). The last event per run is cached and re-read before anything is written.
        """
        if state.result is None or self.live_lock(run_id) is not None:
            return False
        if self._last_events is None or self._last_events.get(run_id) == "start":
            self._last_events = {str(e.get("run_id")): str(e.get("event")) for e in self.events()}
        if self._last_events.get(run_id) != "start":
            return False
        self.event(
            state.status,
            run_id,
            val_loss=state.result.get("val_loss"),
            wall_s=state.result.get("wall_s"),
            recovered=True,
        )
        self._last_events[run_id] = state.status
        return True

    # -- planned runs --
    def materialise(self, runs: list[RunSpec]) -> None:
        """Write each run's sweep.json; refuse (before writing any) when a run dir that a different config
        started, or that a live process holds, would be rewritten."""
        writes = []
        for rs in runs:
            d = self.run_dir(rs.run_id)
            meta = rs.meta()
            old = _read_json(d / META)
            if old is not None and old.get("config") != meta["config"]:
                # started: anything the trainer writes (config.toml comes first), or a live process holding it
                # (another `sweep run` of the old spec about to train it: rewriting its plan mixed the two specs)
                started = any((d / f).exists() for f in (RESULT, "ckpt.pt", "metrics.jsonl", "config.toml"))
                if started or self.live_lock(rs.run_id) is not None:
                    raise ConfigError(
                        "spec",
                        f"{d} was trained with a different config (or is being trained now); use a new "
                        "sweep dir (--out) or delete that run dir",
                        value=rs.run_id,
                        source=str(self.spec_path),
                    )
            if old != meta:
                writes.append((d / META, meta))
        for path, meta in writes:
            atomic_write_json(path, meta)

    def planned(self, order: Sequence[str] = ()) -> list[RunSpec]:
        """The runs written by ``materialise``: those in ``order`` (run ids) first, in that order, then the rest by id.

        ``spec.plan_order(store.root)`` is the plan's order (the store stores, the spec knows the grid); a run dir
        whose sweep.json cannot be read is not here: ``unreadable_plans`` names it.
        """
        metas = [rs for rs in self._metas().values() if isinstance(rs, RunSpec)]
        index = {rid: i for i, rid in enumerate(order)}
        return sorted(metas, key=lambda rs: (index.get(rs.run_id, len(index)), rs.run_id))

    def unreadable_plans(self) -> dict[str, str]:
        """Run dirs whose sweep.json exists but cannot be read or validated: run id -> the problem.

        ``sweep status`` and ``collect`` count and name them; ``sweep run`` rewrites them from the spec.
        """
        return {rid: m for rid, m in self._metas().items() if isinstance(m, str)}

    def _metas(self) -> dict[str, RunSpec | str]:
        """Every run dir's sweep.json: its RunSpec, or what is wrong with it (dirs without one are left out)."""
        if not self.runs_dir.is_dir():
            return {}
        out: dict[str, RunSpec | str] = {}
        for d in sorted(self.runs_dir.iterdir()):
            try:
                self.run_dir(d.name)  # a link out of runs/ is named, never read through
            except ConfigError as exc:
                out[d.name] = f"{self._rel(d)}: {exc.message}"
                continue
            path = d / META
            m, problem = _load_json(path)
            if m is not None:
                try:
                    rs = RunSpec.from_meta(m, source=str(path))
                    if rs.run_id != d.name:  # the folder is the run's identity; an id elsewhere is not trusted
                        raise ConfigError("run_id", f"does not match its folder '{d.name}'", value=rs.run_id)
                    out[d.name] = rs
                    continue
                except (ConfigError, KeyError, TypeError, ValueError) as exc:
                    problem = f"invalid ({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__})"
            if problem is not None:
                out[d.name] = f"{self._rel(path)}: {problem}"
        return out

    def _rel(self, path: Path) -> str:
        """``path`` relative to the sweep dir (short enough for a table's note), else as given."""
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def load_run(self, run_id: str) -> RunSpec:
        m, problem = _load_json(self.run_dir(run_id) / META)
        if m is None:
            path = self.run_dir(run_id) / META
            why = f"{path} is {problem}" if problem else f"not planned in {self.root} (no {META})"
            raise ConfigError("run_id", why, value=run_id)
        return RunSpec.from_meta(m, source=str(self.run_dir(run_id) / META))

    # -- status --
    def attempts(self, run_id: str) -> dict[str, Any]:
        return _read_json(self.run_dir(run_id) / ATTEMPTS) or {"attempts": 0, "failures": 0, "errors": []}

    def reset_failures(self, run_id: str) -> None:
        """``--retry-failed``: a fresh set of retries; the old count and errors stay in ``history``."""
        att = self.attempts(run_id)
        past = {
            "time": time.time(),
            "failures": int(att.get("failures", 0)),
            "retryable": att.get("retryable", True),
            "errors": list(att.get("errors", [])),
        }
        self.write_attempts(
            run_id, {**att, "failures": 0, "retryable": True, "history": [*att.get("history", []), past]}
        )

    def write_attempts(self, run_id: str, rec: dict[str, Any]) -> None:
        atomic_write_json(self.run_dir(run_id) / ATTEMPTS, rec)

    def state(self, run_id: str) -> RunState:
        d = self.run_dir(run_id)
        attempts = self.attempts(run_id)
        note = self._problem(d / ATTEMPTS)
        result, bad = _load_json(d / RESULT)
        if result is not None and (wrong := result_problem(result)) is not None:
            result, bad = None, f"invalid ({wrong})"
        if result is not None:
            status = {"ok": "done", "diverged": "diverged"}.get(str(result.get("status")), "failed")
            return RunState(run_id, status, result, attempts, problem=note)
        lock = self.live_lock(run_id)
        step = last_step(d)
        if lock is not None:  # a live process may be about to replace an unreadable result.json
            return RunState(run_id, "running", None, attempts, lock, step, problem=note)
        if bad is not None:
            return RunState(run_id, "corrupt", None, attempts, None, step, problem=f"{self._rel(d / RESULT)}: {bad}")
        if (d / QUEUED).exists():
            return RunState(run_id, "queued", None, attempts, _read_json(d / QUEUED), step, problem=note)
        if any((d / f).exists() for f in ("ckpt.pt", "config.toml", "metrics.jsonl")):
            return RunState(run_id, "interrupted", None, attempts, None, step, problem=note)
        return RunState(run_id, "planned", None, attempts, problem=note)

    def unreadable_result(self, run_id: str) -> str | None:
        """What is wrong with the run's result.json, naming it; None when it is readable or absent."""
        return self._problem(self.run_dir(run_id) / RESULT)

    def _problem(self, path: Path) -> str | None:
        """What is wrong with a status file, naming it; None when it is fine or absent."""
        problem = _load_json(path)[1]
        return None if problem is None else f"{self._rel(path)}: {problem}"

    # -- locks --
    def live_lock(self, run_id: str) -> dict[str, Any] | None:
        """The live lock of a run (``loopscale.locks``: a reused PID or a lock from another boot is stale)."""
        return locks.live(self.run_dir(run_id))

    def try_lock(self, run_id: str, **info: Any) -> Lock | None:
        """Claim a run for this process, or None when a live process holds it (stale locks are taken over)."""
        return locks.acquire(self.run_dir(run_id), **info)

    # -- queue (SLURM) --
    def mark_queued(self, run_id: str, job_id: str) -> None:
        atomic_write_json(self.run_dir(run_id) / QUEUED, {"job_id": job_id, "time": time.time()})

    def clear_queued(self, run_id: str) -> None:
        with contextlib.suppress(OSError):
            (self.run_dir(run_id) / QUEUED).unlink()


def last_step(run_dir: Path) -> int | None:
    """The step of the last metrics line (cheap: reads the file's tail)."""
    p = run_dir / "metrics.jsonl"
    try:
        with open(p, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 2048))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return int(json.loads(line)["step"])
    return None


def open_store(path: str | Path) -> SweepStore:
    store = SweepStore(path)
    if not store.exists():
        raise ConfigError(
            "DIR", "not a sweep dir (no spec.toml); start one with `loopscale sweep run SPEC`", value=str(path)
        )
    return store
