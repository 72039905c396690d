"""Run one planned run with the sweep's bookkeeping: lock, attempts, failure records, events.

Shared by every executor (in-process, subprocess, torchrun, SLURM task), so the rules are the same
everywhere: a finished or diverged run is skipped; an interrupted one resumes from its checkpoint;
a failed one is retried while ``failures <= max_retries`` (its old result.json is kept as
``result.failed-<n>.json``); a user error (ConfigError, e.g. a budget too small for
``run.min_steps``) is recorded as failed at once and never retried — it would fail the same way.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopscale.errors import ConfigError
from loopscale.io import atomic_write_json
from loopscale.sweep.store import RESULT, SweepStore

#: outcomes of ``execute_run``
OUTCOMES = ("done", "diverged", "failed", "retry", "skipped", "busy", "gave-up")


def runnable(store: SweepStore, run_id: str, max_retries: int) -> tuple[bool, str]:
    """Should an executor start this run now? (False, why) for finished, busy or exhausted runs."""
    st = store.state(run_id)
    if st.status in ("done", "diverged"):
        return False, st.status
    if st.status == "running":
        return False, "running elsewhere"
    if st.status == "failed" and (not st.retryable or st.failures > max_retries):
        return False, "failed"
    return True, st.status


def execute_run(store: SweepStore, run_id: str, *, max_retries: int, on_step: Callable[[int, int], None] | None = None,
                executor: str = "local", job_id: str | None = None) -> str:
    """Train one run of the sweep (or skip it). Returns one of OUTCOMES.

    ``retry``: it failed and has retries left (the caller decides when to run it again).
    RunInterrupted and KeyboardInterrupt propagate after the lock is released.
    """
    from loopscale.train import RunInterrupted, TrainingFailed, train

    rank = int(os.environ.get("RANK", "0"))
    rs = store.load_run(run_id)
    run_dir = store.run_dir(run_id)
    if rank != 0:  # a torchrun/SLURM worker rank: rank 0 keeps the books
        try:
            train(rs.config, run_dir, progress=False)
        except (TrainingFailed, ConfigError):
            return "failed"
        return "done"

    ok, why = runnable(store, run_id, max_retries)
    if not ok:
        return "busy" if why == "running elsewhere" else ("gave-up" if why == "failed" else "skipped")
    lock = store.try_lock(run_id, executor=executor, job_id=job_id)
    if lock is None:
        return "busy"
    try:
        store.clear_queued(run_id)
        st = store.state(run_id)
        if st.status in ("done", "diverged"):  # finished between the check and the lock
            return "skipped"
        att = store.attempts(run_id)
        if st.status == "failed":  # a retry: keep the failed record beside the run
            (run_dir / RESULT).replace(run_dir / f"result.failed-{att.get('failures', 0)}.json")
        att["attempts"] = int(att.get("attempts", 0)) + 1
        store.write_attempts(run_id, att)
        store.event("start", run_id, attempt=att["attempts"], resume=(run_dir / "ckpt.pt").exists(),
                    executor=executor, job_id=job_id)

        def step_hook(step: int, total: int) -> None:
            lock.beat()
            if on_step is not None:
                on_step(step, total)

        t0 = time.time()
        try:
            res = train(rs.config, run_dir, progress=False, on_step=step_hook)
        except (RunInterrupted, KeyboardInterrupt):
            store.event("interrupted", run_id)
            raise
        except ConfigError as err:
            _record_failure(store, rs, att, f"ConfigError: {err}", traceback.format_exc(), retryable=False,
                            wall_s=time.time() - t0)
            return "failed"
        except TrainingFailed:
            from loopscale.train import read_result

            rec = read_result(run_dir) or {}
            _record_failure(store, rs, att, str(rec.get("error", "failed")), rec.get("traceback", ""),
                            retryable=True, wall_s=time.time() - t0, write_result=not rec)
            return "retry" if att["failures"] <= max_retries else "failed"
        except Exception as exc:  # anything the trainer did not record (setup, devices)
            _record_failure(store, rs, att, f"{type(exc).__name__}: {exc}", traceback.format_exc(), retryable=True,
                            wall_s=time.time() - t0)
            return "retry" if att["failures"] <= max_retries else "failed"
        status = str(res.get("status"))
        store.event("done" if status == "ok" else status, run_id, val_loss=res.get("val_loss"),
                    wall_s=res.get("wall_s"))
        return "done" if status == "ok" else ("diverged" if status == "diverged" else "failed")
    finally:
        lock.release()


def _record_failure(store: SweepStore, rs: Any, att: dict[str, Any], error: str, tb: str, *, retryable: bool,
                    wall_s: float, write_result: bool = True) -> None:
    """Count the failure in attempts.json; write result.json (status failed) if the trainer did not."""
    from loopscale.train.loop import result_fields

    att["failures"] = int(att.get("failures", 0)) + 1
    att["retryable"] = retryable
    att["errors"] = [*list(att.get("errors", []))[-4:], error]
    store.write_attempts(rs.run_id, att)
    path = Path(store.run_dir(rs.run_id)) / RESULT
    if write_result or not path.exists():
        atomic_write_json(path, {"status": "failed", "error": error, "traceback": tb, **result_fields(rs.config),
                                 "C": rs.C, "wall_s": wall_s})
    store.event("failed", rs.run_id, error=error, failures=att["failures"], retryable=retryable)
