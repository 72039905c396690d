"""One attempt of a planned run with the sweep's bookkeeping: lock, attempts, failure records, events.

Shared by every executor (in-process, subprocess, torchrun, SLURM task), so the rules are the same
everywhere: a finished or diverged run is skipped; an interrupted one resumes from its checkpoint;
a failed one is retried while ``failures <= max_retries`` (its old result.json is kept as
``result.failed-<attempt>.json``); a user error (ConfigError, e.g. a budget too small for
``run.min_steps``) is recorded as failed at once and never retried — it would fail the same way;
an unreadable result.json is set aside (``result.json.corrupt-<time>``) and the run runs again.

A multi-rank run (``WORLD_SIZE`` > 1: torchrun, one SLURM task per GPU) calls ``execute_run`` on
every rank; rank 0 alone keeps the books and every rank returns the same outcome (see
``_execute_ranks``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from loopscale.errors import ConfigError
from loopscale.io import atomic_write_json, set_aside
from loopscale.record import RunRecord
from loopscale.sweep.store import RESULT, Lock, RunState, SweepStore

#: outcomes of ``execute_run``
OUTCOMES = ("done", "diverged", "failed", "retry", "skipped", "busy", "gave-up")

#: how long ranks wait for each other's control messages (env LOOPSCALE_RANK_TIMEOUT_S overrides)
RANK_TIMEOUT_S = 300.0


def runnable(store: SweepStore, run_id: str, max_retries: int) -> tuple[bool, str]:
    """Should an executor start this run now? (False, why) for finished, busy or exhausted runs."""
    st = store.state(run_id)
    if st.status in ("done", "diverged"):
        tidy_finished_run(store, run_id, st)
        return False, st.status
    if st.status == "running":
        return False, "running elsewhere"
    if st.status == "failed" and (not st.retryable or st.failures > max_retries):
        return False, "failed"
    return True, st.status


def tidy_finished_run(store: SweepStore, run_id: str, state: RunState | None = None) -> None:
    """Remove a finished run's leftovers: ``ckpt.pt`` (unless the run keeps it) and atomic-write temporaries,
    and log its end if a kill after ``result.json`` kept the executor from doing so (``log_missing_end``).

    The trainer removes ``ckpt.pt`` right after ``result.json``; a kill in between left it, and executors
    skip finished runs without calling the trainer. Failed runs keep theirs: a retry resumes from it.
    """
    store.log_missing_end(run_id, state or store.state(run_id))
    from loopscale.train.checkpoint import tidy_finished

    try:
        keep = store.load_run(run_id).config.run.keep_checkpoint
    except ConfigError:
        return
    tidy_finished(store.run_dir(run_id), keep_checkpoint=keep)


def execute_run(
    store: SweepStore,
    run_id: str,
    *,
    max_retries: int,
    on_step: Callable[[int, int], None] | None = None,
    executor: str = "local",
    job_id: str | None = None,
) -> str:
    """Train one run of the sweep (or skip it). Returns one of OUTCOMES.

    ``retry``: it failed and has retries left (the caller decides when to run it again).
    RunInterrupted and KeyboardInterrupt propagate after the lock is released.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return _execute_ranks(store, run_id, max_retries=max_retries, on_step=on_step, executor=executor, job_id=job_id)
    rs = store.load_run(run_id)
    begun = _begin(store, run_id, max_retries, executor=executor, job_id=job_id)
    if isinstance(begun, str):
        return begun
    lock, att = begun
    try:
        ending = _attempt(rs, store.run_dir(run_id), _step_hook(lock, on_step), log=executor != "local")
        return _settle(store, rs, att, ending, max_retries)
    finally:
        lock.release()


# -- one attempt, as every executor runs it ------------------------------------------------------------------------


@dataclass
class _Ending:
    """How train() ended on one rank: a result, an interrupt, or a failure (kind config/failed/error)."""

    kind: str
    result: RunRecord | None = None
    error: str = ""
    traceback: str = ""
    wall_s: float = 0.0
    exc: BaseException | None = None  # the interrupt, re-raised once the books are kept
    ended: float = field(default_factory=time.time)  # when this rank left train()

    def message(self) -> dict[str, Any]:
        """What a rank tells rank 0 (JSON; the traceback capped)."""
        return {"kind": self.kind, "error": self.error, "traceback": self.traceback[-20_000:], "ended": self.ended}


def _begin(
    store: SweepStore, run_id: str, max_retries: int, *, executor: str, job_id: str | None, pack: int = 1
) -> str | tuple[Lock, dict[str, Any]]:
    """Rank 0's books before training: the skip outcome, or the held lock and the counted attempt."""
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
            lock.release()
            return "skipped"
        run_dir = store.run_dir(run_id)
        att = store.attempts(run_id)
        if st.status == "failed":  # a retry: keep the failed record beside the run
            (run_dir / RESULT).replace(_failed_record_path(run_dir, int(att.get("attempts", 0))))
        problem = store.unreadable_result(run_id)  # (this process holds the lock: state() says running)
        if problem is not None:  # kept aside, and the run is run again (the same trajectory)
            aside = set_aside(run_dir / RESULT)
            store.event("corrupt", run_id, file=RESULT, moved_to=aside.name)
            print(f"warning: {problem}; moved to {aside.name}, the run runs again", file=sys.stderr, flush=True)
        att["attempts"] = int(att.get("attempts", 0)) + 1
        store.write_attempts(run_id, att)
        store.event(
            "start",
            run_id,
            attempt=att["attempts"],
            resume=(run_dir / "ckpt.pt").exists(),
            executor=executor,
            job_id=job_id,
            **({"pack": pack} if pack > 1 else {}),
        )
    except BaseException:
        lock.release()
        raise
    return lock, att


def _failed_record_path(run_dir: Path, attempt: int) -> Path:
    """``result.failed-<attempt>.json``: numbered by the attempt that failed, which ``--retry-failed`` never
    resets (the failure count it resets would overwrite earlier records); never an existing file."""
    path = run_dir / f"result.failed-{attempt}.json"
    n = 1
    while path.exists():
        n += 1
        path = run_dir / f"result.failed-{attempt}-{n}.json"
    return path


def _step_hook(lock: Lock, on_step: Callable[[int, int], None] | None) -> Callable[[int, int], None]:
    def step_hook(step: int, total: int) -> None:
        lock.beat()
        if on_step is not None:
            on_step(step, total)

    return step_hook


def _attempt(
    rs: Any,
    run_dir: Path,
    on_step: Callable[[int, int], None] | None,
    setup: Callable[[], None] | None = None,
    *,
    log: bool = False,
) -> _Ending:
    """Call train() (after ``setup``, e.g. the rank's process group) and say how it ended; never raises.

    ``log``: a worker whose output goes to a log file (``--isolate``, SLURM) prints train()'s plain
    progress lines there; in the sweep's own process its progress display shows the run instead.
    """
    from loopscale.train import RunInterrupted, TrainingFailed, train
    from loopscale.train.compiling import use_cache_dir

    use_cache_dir(run_dir.parent.parent / "compile_cache")  # <sweep>/runs/<id>: one cache per sweep
    t0 = time.time()
    try:
        if setup is not None:
            setup()
        return _Ending("result", result=train(rs.config, run_dir, progress=log, on_step=on_step))
    except (RunInterrupted, KeyboardInterrupt) as exc:
        return _Ending("interrupted", exc=exc)
    except ConfigError as err:
        return _Ending("config", error=f"ConfigError: {err}", traceback=traceback.format_exc(), wall_s=time.time() - t0)
    except TrainingFailed as exc:  # rank 0's trainer wrote result.json; the cause names the error
        cause = exc.__cause__ or exc
        return _Ending(
            "failed",
            error=f"{type(cause).__name__}: {cause}",
            traceback=traceback.format_exc(),
            wall_s=time.time() - t0,
        )
    except Exception as exc:  # anything the trainer did not record (setup, devices)
        return _Ending(
            "error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(), wall_s=time.time() - t0
        )


def _settle(store: SweepStore, rs: Any, att: dict[str, Any], ending: _Ending, max_retries: int) -> str:
    """Rank 0's books after an attempt: the event, at most one failure record. Re-raises an interrupt."""
    run_id = rs.run_id
    if ending.kind == "interrupted":
        store.event("interrupted", run_id)
        assert ending.exc is not None
        raise ending.exc
    if ending.kind == "result":
        res = ending.result
        status = str(res.status if res is not None else None)
        store.event(
            "done" if status == "ok" else status,
            run_id,
            val_loss=res.val_loss if res is not None else None,
            wall_s=res.wall_s if res is not None else None,
        )
        return "done" if status == "ok" else ("diverged" if status == "diverged" else "failed")
    if ending.kind == "config":
        record_failure(store, rs, att, ending.error, ending.traceback, retryable=False, wall_s=ending.wall_s)
        return "failed"
    if ending.kind == "failed":
        from loopscale.train import read_result

        rec = read_result(store.run_dir(run_id))
        record_failure(
            store,
            rs,
            att,
            str(rec.error if rec is not None and rec.error is not None else "failed"),
            (rec.traceback or "") if rec is not None else "",
            retryable=True,
            wall_s=ending.wall_s,
            write_result=rec is None,
        )
    else:
        record_failure(store, rs, att, ending.error, ending.traceback, retryable=True, wall_s=ending.wall_s)
    return "retry" if att["failures"] <= max_retries else "failed"


def record_failure(
    store: SweepStore,
    rs: Any,
    att: dict[str, Any],
    error: str,
    tb: str,
    *,
    retryable: bool,
    wall_s: float,
    write_result: bool = True,
) -> None:
    """Count the failure in attempts.json; write result.json (status failed) if the trainer did not."""
    from loopscale.train.result import result_fields

    att["failures"] = int(att.get("failures", 0)) + 1
    att["retryable"] = retryable
    att["errors"] = [*list(att.get("errors", []))[-4:], error]
    store.write_attempts(rs.run_id, att)
    path = Path(store.run_dir(rs.run_id)) / RESULT
    if write_result or not path.exists():
        atomic_write_json(
            path,
            RunRecord(
                status="failed", error=error, traceback=tb, **result_fields(rs.config), C=rs.C, wall_s=wall_s
            ).dump(),
        )
    store.event("failed", rs.run_id, error=error, failures=att["failures"], retryable=retryable)


# -- a pack: several runs of the same shape trained as one model in this process ------------------------------------


def execute_pack(
    store: SweepStore,
    run_ids: list[str],
    *,
    max_retries: int,
    on_step: Callable[[str, int, int], None] | None = None,
    executor: str = "local",
    job_id: str | None = None,
) -> dict[str, str]:
    """Train runs of one pack (``sweep.packs``) as one stacked model (``train.pack``); each run's outcome.

    Each member gets what ``execute_run`` gives a run: the runnable check, its lock (held by this process while
    the pack trains), a counted attempt, its events, its failure record. A run that failed before (a retry) trains
    alone, after the pack, and so do the runs of a technique that cannot run packed (``why_not_packable``): a
    pack never fails a run that would train alone. RunInterrupted propagates once every member's books are kept.
    """
    hook = on_step

    def member_hook(rid: str) -> Callable[[int, int], None] | None:
        return None if hook is None else (lambda s, t: hook(rid, s, t))

    def alone(rid: str) -> str:
        hook_ = member_hook(rid)
        return execute_run(store, rid, max_retries=max_retries, on_step=hook_, executor=executor, job_id=job_id)

    if len(run_ids) < 2:
        return {rid: alone(rid) for rid in run_ids}
    retried = [rid for rid in run_ids if int(store.attempts(rid).get("failures", 0)) > 0]
    packed = [rid for rid in run_ids if rid not in retried]
    if len(packed) >= 2 and (why := _why_not_packable([store.load_run(rid) for rid in packed])) is not None:
        note = f"warning: {packed[0]} and {len(packed) - 1} more train one at a time: {why}"
        print(note, file=sys.stderr, flush=True)
        packed = []
    if len(packed) < 2:
        retried, packed = list(run_ids), []
    outcomes: dict[str, str] = {}
    interrupt: BaseException | None = None
    if packed:
        outcomes, interrupt = _execute_packed(store, packed, max_retries, member_hook, executor, job_id)
    for rid in retried:
        if interrupt is not None:
            break
        try:
            outcomes[rid] = alone(rid)
        except BaseException as exc:
            interrupt = exc
    if interrupt is not None:
        raise interrupt
    return outcomes


def _why_not_packable(specs: list[Any]) -> str | None:
    from loopscale.train.pack import why_not_packable

    try:
        return why_not_packable([rs.config for rs in specs])
    except Exception as exc:  # the technique cannot even be built: each run fails alone, with its own record
        return f"{type(exc).__name__}: {exc}"


def _execute_packed(
    store: SweepStore,
    run_ids: list[str],
    max_retries: int,
    member_hook: Callable[[str], Callable[[int, int], None] | None],
    executor: str,
    job_id: str | None,
) -> tuple[dict[str, str], BaseException | None]:
    """The members that may start: locked, counted, trained together; each settled (its event, its books) and
    let go of (its lock) as soon as it ends, while the others train on."""
    outcomes: dict[str, str] = {}
    begun: dict[str, tuple[Any, Lock, dict[str, Any]]] = {}
    interrupts: list[BaseException] = []
    try:
        for rid in run_ids:
            rs = store.load_run(rid)
            b = _begin(store, rid, max_retries, executor=executor, job_id=job_id, pack=len(run_ids))
            if isinstance(b, str):
                outcomes[rid] = b
            else:
                begun[rid] = (rs, *b)
        ids = list(begun)

        def settle(i: int, ending: _Ending) -> None:
            rid = ids[i]
            if rid in outcomes or rid not in begun:
                return
            rs, lock, att = begun.pop(rid)
            try:
                outcomes[rid] = _settle(store, rs, att, ending, max_retries)
            except BaseException as exc:  # an interrupt: re-raised once every member's books are kept
                outcomes[rid] = "interrupted"
                interrupts.append(exc)
            finally:
                lock.release()

        hooks = [_step_hook(begun[rid][1], member_hook(rid)) for rid in ids]
        specs, dirs = [begun[rid][0] for rid in ids], [store.run_dir(rid) for rid in ids]
        for i, ending in enumerate(_attempt_pack(specs, dirs, hooks, settle)):
            settle(i, ending)  # any member not settled yet (the pack's own setup failed)
        outcomes = {rid: o for rid, o in outcomes.items() if o != "interrupted"}
        return outcomes, (interrupts[0] if interrupts else None)
    finally:
        for _rs, lock, _att in begun.values():
            lock.release()


def _ending(e: Any) -> _Ending:
    """A member's ``train.pack.MemberEnd`` as ``_attempt`` reports a run's end."""
    if e.kind == "result":
        return _Ending("result", result=e.result)
    if e.kind == "interrupted":
        return _Ending("interrupted", exc=e.exc)
    return _Ending(e.kind, error=e.error, traceback=e.traceback, wall_s=e.wall_s)  # config; failed: result written


def _attempt_pack(
    specs: list[Any],
    run_dirs: list[Path],
    hooks: list[Callable[[int, int], None]],
    on_end: Callable[[int, _Ending], None] | None = None,
) -> list[_Ending]:
    """``train_pack`` and how it ended for each member (``_attempt`` for a pack), each handed to ``on_end`` as it
    happens; never raises."""
    if not specs:
        return []
    from loopscale.train.compiling import use_cache_dir
    from loopscale.train.pack import train_pack

    use_cache_dir(run_dirs[0].parent.parent / "compile_cache")
    t0 = time.time()
    hand = None if on_end is None else (lambda i, e: on_end(i, _ending(e)))
    try:
        ends = train_pack([rs.config for rs in specs], run_dirs, on_step=hooks, on_end=hand)
    except KeyboardInterrupt as exc:  # a second Ctrl-C: stopped at once, every member
        return [_Ending("interrupted", exc=exc)] * len(specs)
    except ConfigError as err:
        return [_Ending("config", error=f"ConfigError: {err}", traceback=traceback.format_exc())] * len(specs)
    except Exception as exc:  # the pack's own setup (devices): every member, as _attempt records it
        tb, wall = traceback.format_exc(), time.time() - t0
        return [_Ending("error", error=f"{type(exc).__name__}: {exc}", traceback=tb, wall_s=wall)] * len(specs)
    return [_ending(e) for e in ends]


# -- several ranks --------------------------------------------------------------------------------------------------


def _execute_ranks(
    store: SweepStore,
    run_id: str,
    *,
    max_retries: int,
    on_step: Callable[[int, int], None] | None,
    executor: str,
    job_id: str | None,
) -> str:
    """One call of a multi-rank run: every rank agrees on skip, retry and give-up.

    1. Rank 0 alone reads the store and decides (``_begin``: runnable, lock, attempts) and sends the
       decision; on a skip every rank returns that outcome and no rank trains.
    2. Every rank builds a fresh process group for this attempt (its own keys, so it can never meet
       a previous attempt's), trains, and reports how train() ended; then it destroys the group.
    3. Rank 0 collects the reports, records the attempt once (one failure however many ranks
       raised) and sends the outcome, which every rank returns; on ``retry`` the caller's loop
       (SweepTask) starts the next attempt on all ranks together.

    A rank that raised while the others sit in a collective cannot free them in-process (the
    failed attempt's DDP keeps its group alive), so every wait is bounded: if some rank has not
    reported within the rank timeout, the attempt is *abandoned* — a flag any rank may set, once,
    with compare-and-set — rank 0 records the failure, every rank returns ``failed`` and the task
    ends. Ending the processes closes the group's sockets, which releases a gloo rank stuck in a
    collective (an NCCL rank is released by NCCL's watchdog timeout). The run stays retryable:
    the next submission runs it again with every rank fresh.
    """
    ctl = _Control(run_id)
    rs = store.load_run(run_id)
    lock: Lock | None = None
    att: dict[str, Any] = {}
    try:
        if ctl.rank == 0:
            begun = _begin_shared(ctl, store, run_id, max_retries, executor=executor, job_id=job_id)
            if isinstance(begun, str):
                return begun
            lock, att = begun
        else:
            decision = ctl.receive("decision")
            if decision.get("abort"):
                raise RuntimeError(f"{run_id}: rank 0 failed before training: {decision['abort']}")
            if decision.get("skip"):
                return str(decision["skip"])
        hook = _step_hook(lock, on_step) if lock is not None else None
        ending = _attempt(
            rs, store.run_dir(run_id), hook, setup=lambda: ctl.init_group(rs.config.run.device), log=executor != "local"
        )
        if ctl.rank != 0:
            with contextlib.suppress(RuntimeError):  # rank 0 gone: the claim below gives up
                ctl.post(f"end/{ctl.rank}", ending.message())
        _teardown_group()  # before any retry, on every rank
        if ctl.rank != 0:
            return _outcome_on_worker(ctl, ending)
        return _outcome_on_rank0(ctl, store, rs, att, ending, max_retries)
    finally:
        if lock is not None:
            lock.release()


def _begin_shared(
    ctl: _Control, store: SweepStore, run_id: str, max_retries: int, *, executor: str, job_id: str | None
) -> str | tuple[Lock, dict[str, Any]]:
    """Rank 0: ``_begin`` and send its decision to the other ranks (an error is sent too, then raised)."""
    try:
        begun = _begin(store, run_id, max_retries, executor=executor, job_id=job_id)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            ctl.send("decision", {"abort": f"{type(exc).__name__}: {exc}"})
        raise
    try:
        ctl.send("decision", {"skip": begun} if isinstance(begun, str) else {"train": True})
    except BaseException:
        if not isinstance(begun, str):
            begun[0].release()
        raise
    return begun


def _outcome_on_rank0(
    ctl: _Control, store: SweepStore, rs: Any, att: dict[str, Any], own: _Ending, max_retries: int
) -> str:
    """Rank 0: collect the reports, claim the attempt, keep the books once and send the outcome."""
    from loopscale.train import RunInterrupted

    reports = ctl.collect_ends()
    claim = ctl.claim("abandoned:0" if None in reports.values() else "rank0")
    ending = _combine(own, reports, ctl.timeout_s)
    if ending.kind == "interrupted":
        store.event("interrupted", rs.run_id)
        if claim == "rank0":
            ctl.send("outcome", "interrupted")
        raise (
            own.exc
            if own.exc is not None
            else RunInterrupted(f"{rs.run_id}: another rank was stopped by a signal; the checkpoint is saved")
        )
    outcome = _settle(store, rs, att, ending, max_retries)
    if claim != "rank0":  # abandoned: end the task on every rank; the run stays retryable
        return "failed" if outcome == "retry" else outcome
    ctl.send("outcome", outcome)
    return outcome


def _outcome_on_worker(ctl: _Control, own: _Ending) -> str:
    """A rank > 0: rank 0's outcome, or ``failed`` once the attempt is abandoned (then the task ends)."""
    from loopscale.train import RunInterrupted

    try:
        claim = ctl.wait_claim()
    except RuntimeError:  # rank 0 is gone
        claim = "abandoned"
    if claim != "rank0":
        return "failed"
    outcome = ctl.receive("outcome")
    if outcome == "interrupted":
        raise (
            own.exc
            if own.exc is not None
            else RunInterrupted("rank 0 was stopped by a signal; the checkpoint is saved")
        )
    return str(outcome)


def _combine(own: _Ending, reports: dict[int, dict[str, Any] | None], timeout_s: float) -> _Ending:
    """Rank 0's view of the attempt from its own ending and the other ranks' reports.

    Rank 0 returning a result means every rank passed the trainer's final barrier: the run finished.
    Failures on several ranks become one record; it names each rank's error unless they all agree,
    the first rank to leave training first (usually the cause; the others failed in a collective).
    """
    if own.kind in ("result", "interrupted"):
        return own
    if any(rep is not None and rep["kind"] == "interrupted" for rep in reports.values()):
        return _Ending("interrupted")
    failed = {r: rep for r, rep in {0: own.message(), **reports}.items() if rep is None or rep["kind"] != "result"}
    failed = dict(sorted(failed.items(), key=lambda kv: kv[1]["ended"] if kv[1] else math.inf))
    errors = {
        r: rep["error"] if rep else f"no report within {timeout_s:g} s (stuck in a collective?)"
        for r, rep in failed.items()
    }
    if set(errors.values()) == {own.error}:
        return own  # every failing rank says the same: record it as a single rank would
    kind = "config" if any(rep and rep["kind"] == "config" for rep in failed.values()) else "error"
    tb = "\n".join(f"--- rank {r} ---\n{rep['traceback']}" for r, rep in failed.items() if rep)
    return _Ending(kind, error="; ".join(f"rank {r}: {e}" for r, e in errors.items()), traceback=tb, wall_s=own.wall_s)


def _teardown_group() -> None:
    """Destroy this rank's process group, so the next attempt builds a new one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    gc.collect()


_STORES: dict[tuple[str, ...], Any] = {}
_CALLS: dict[str, int] = {}


class _Control:
    """Control messages between the ranks of one ``execute_run`` call, over the c10d TCPStore of env://.

    Why a key-value store rather than a gloo group for control: it is CPU-only whatever backend
    trains (NCCL or gloo), it lives outside any attempt's process group (so it still works after a
    rank failed inside a collective), every wait has a timeout, and a message cannot be matched
    with the wrong one (keys name the run and the call). It is the store env:// itself uses
    (rank 0 serves it at MASTER_ADDR:MASTER_PORT; under torchrun, the agent's), created once per
    process and kept across attempts.
    """

    def __init__(self, run_id: str) -> None:
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.timeout_s = float(os.environ.get("LOOPSCALE_RANK_TIMEOUT_S", RANK_TIMEOUT_S))
        self.timeout = timedelta(seconds=self.timeout_s)
        self.base = _base_store(self.timeout)
        _CALLS[run_id] = _CALLS.get(run_id, 0) + 1
        self.prefix = f"loopscale/{run_id}/{_CALLS[run_id]}/"
        self.store = dist.PrefixStore(self.prefix, self.base)

    def init_group(self, device_pref: str) -> None:
        """This attempt's process group (fresh keys), with the backend train()'s setup_dist would pick."""
        import torch

        from loopscale.cores import uses_cuda

        _teardown_group()
        use_cuda = uses_cuda(device_pref) and torch.cuda.is_available()  # no GPU: train() reports it
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(
            "nccl" if use_cuda else "gloo",
            store=torch.distributed.PrefixStore(self.prefix + "pg/", self.base),
            rank=self.rank,
            world_size=self.world,
        )

    def post(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def _get(self, key: str) -> Any:
        self.store.wait([key], self.timeout)
        return json.loads(self.store.get(key))

    def send(self, key: str, value: Any) -> None:
        """Rank 0: post ``value``; return once every rank has read it (rank 0 serves the store)."""
        self.post(key, value)
        self.store.wait([f"{key}/read/{r}" for r in range(1, self.world)], self.timeout)

    def receive(self, key: str) -> Any:
        value = self._get(key)
        self.store.set(f"{key}/read/{self.rank}", "1")
        return value

    def collect_ends(self) -> dict[int, dict[str, Any] | None]:
        """Rank 0: the other ranks' reports; None for a rank still silent after the timeout."""
        keys = {r: f"end/{r}" for r in range(1, self.world)}
        deadline = time.monotonic() + self.timeout_s
        while not self.store.check(list(keys.values())) and time.monotonic() < deadline:
            time.sleep(0.05)
        return {r: json.loads(self.store.get(k)) if self.store.check([k]) else None for r, k in keys.items()}

    def claim(self, value: str) -> str:
        """Write the attempt's claim once (first writer wins) and return it."""
        return self.store.compare_set("claim", "", value).decode()

    def wait_claim(self) -> str:
        """A worker: rank 0's claim, or ``abandoned:<rank>`` if none came within the timeout."""
        try:
            self.store.wait(["claim"], self.timeout)
        except RuntimeError:
            return self.claim(f"abandoned:{self.rank}")
        return self.store.get("claim").decode()


def _base_store(timeout: timedelta) -> Any:
    """The env:// store of this process (rank 0 serves it), made once and kept across attempts."""
    import torch.distributed as dist

    key = tuple(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))
    if key not in _STORES:
        store, _rank, _world = next(dist.rendezvous("env://", timeout=timeout))
        _STORES[key] = store
    return _STORES[key]
