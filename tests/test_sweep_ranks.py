"""Multi-rank SLURM tasks on CPU: submitit's local executor runs 2 tasks per job (2 gloo ranks).

Rank 0 keeps the books and every rank must return the same outcome: a skip trains nowhere, a failed
attempt ends every rank and is recorded once, a retry runs on both ranks together, nothing hangs.
"""

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import submitit

from conftest import OK_RESULT, tiny_sweep_spec
from loopscale.record import RunRecord
from loopscale.sweep import prepare, spec_from_dict
from loopscale.sweep.attempt import runnable
from loopscale.sweep.slurm import SlurmSettings, SweepTask, make_executor, submit
from loopscale.sweep.store import SweepStore

TESTS = Path(__file__).parent
LOCAL_2_RANKS = {"tasks_per_node": 2, "gpus_per_node": 0, "timeout_min": 3}


class CountingTask(SweepTask):
    """A SweepTask that counts train() calls per rank; ranks in ``fail_once`` raise at step 2 on their first call."""

    def __init__(self, sweep_dir: str, max_retries: int, fail_once: tuple[int, ...] = ()) -> None:
        super().__init__(sweep_dir, max_retries)
        self.fail_once = tuple(fail_once)

    def __call__(self, run_id: str) -> str:
        import loopscale.train as lt

        real = lt.train

        def train(cfg: Any, run_dir: Any, **kw: Any) -> Any:
            rank = int(os.environ.get("RANK", "0"))
            calls = Path(run_dir) / f"train-calls-rank{rank}"
            first = not calls.exists()
            with calls.open("a") as fh:
                fh.write("call\n")
            if first and rank in self.fail_once:
                cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"fail_at_step": 2})})
            return real(cfg, run_dir, **kw)

        lt.train = train
        try:
            return super().__call__(run_id)
        finally:
            lt.train = real


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SweepStore, str]:
    """One tiny run (batch 8: 4 rows per rank); the task processes can import this module; short rank timeouts."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("LOOPSCALE_RANK_TIMEOUT_S", "20")
    spec = spec_from_dict(tiny_sweep_spec({"log_every": 5}, budgets=[2e9], r=[2], widths={"2e9": [16]}))
    store = prepare(spec, tmp_path / "sw")
    return store, spec.runs()[0].run_id


def _submit(store: SweepStore, task: SweepTask, run_id: str) -> Any:
    ex = make_executor(store.root / "slurm" / "%j", "local", SlurmSettings(max_requeues=0))
    ex.update_parameters(**LOCAL_2_RANKS)
    return ex.submit(task, run_id)


def _results(job: Any, limit_s: float = 90) -> list[str]:
    """Both ranks' return values; fails (and kills the job) if it is still running after ``limit_s``."""
    t0 = time.time()
    while not job.done():
        if time.time() - t0 > limit_s:
            logs = "\n".join(job.task(k).stderr() or "" for k in range(2))
            job.cancel(check=False)
            pytest.fail(f"job still running after {limit_s} s (a rank hangs?)\n{logs[-4000:]}")
        time.sleep(0.2)
    try:
        return job.results()
    except Exception as exc:
        logs = "\n".join(job.task(k).stderr() or "" for k in range(2))
        raise AssertionError(f"{exc}\n{logs[-4000:]}") from exc


def _events(store: SweepStore, run_id: str) -> list[str]:
    return [e["event"] for e in store.events() if e["run_id"] == run_id]


def _calls(store: SweepStore, run_id: str) -> list[int]:
    paths = [store.run_dir(run_id) / f"train-calls-rank{k}" for k in range(2)]
    return [len(p.read_text().splitlines()) if p.exists() else 0 for p in paths]


def test_a_failed_first_attempt_is_recorded_once_and_retried_on_both_ranks(sweep: tuple[SweepStore, str]) -> None:
    store, rid = sweep
    job = _submit(store, CountingTask(str(store.root), 1, fail_once=(0, 1)), rid)
    assert _results(job) == ["done", "done"]
    assert _calls(store, rid) == [2, 2]  # both ranks trained twice, together
    assert _events(store, rid) == ["start", "failed", "start", "done"]
    att = store.attempts(rid)
    assert att["attempts"] == 2 and att["failures"] == 1
    res = json.loads((store.run_dir(rid) / "result.json").read_text())
    assert res["status"] == "ok" and res["world_size"] == 2
    failed = json.loads((store.run_dir(rid) / "result.failed-1.json").read_text())
    assert failed["status"] == "failed" and "injected failure at step 2" in failed["error"]
    assert not (store.run_dir(rid) / "lock.json").exists()


def test_a_run_failing_every_attempt_gives_up_after_max_retries_on_both_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPSCALE_RANK_TIMEOUT_S", "20")
    spec = spec_from_dict(
        tiny_sweep_spec({"log_every": 5, "fail_at_step": 2}, budgets=[2e9], r=[2], widths={"2e9": [16]})
    )
    store = prepare(spec, tmp_path / "sw")
    rid = spec.runs()[0].run_id
    t0 = time.time()
    (rec,) = submit(
        store,
        spec.runs(),
        {rid: 1e9},
        SlurmSettings(max_requeues=0),
        max_retries=2,
        cluster="local",
        parameters=LOCAL_2_RANKS,
    )
    assert _results(rec["jobs"][0]) == ["failed", "failed"]
    assert time.time() - t0 < 90
    assert _events(store, rid) == ["start", "failed"] * 3  # max_retries + 1 attempts, one failure each
    att = store.attempts(rid)
    assert att["attempts"] == 3 and att["failures"] == 3 and att["retryable"] is True
    assert runnable(store, rid, 2) == (False, "failed")
    assert sorted(p.name for p in store.run_dir(rid).glob("result*.json")) == [
        "result.failed-1.json",
        "result.failed-2.json",
        "result.json",
    ]
    assert "injected failure at step 2" in json.loads((store.run_dir(rid) / "result.json").read_text())["error"]


def test_rank_0_skipping_a_finished_run_trains_on_no_rank(sweep: tuple[SweepStore, str]) -> None:
    store, rid = sweep
    store.run_dir(rid).mkdir(parents=True, exist_ok=True)
    (store.run_dir(rid) / "result.json").write_text(json.dumps(OK_RESULT))
    job = _submit(store, CountingTask(str(store.root), 1), rid)
    assert _results(job) == ["skipped", "skipped"]
    assert _calls(store, rid) == [0, 0]
    assert _events(store, rid) == []


@pytest.mark.long
def test_one_rank_failing_inside_training_ends_both_ranks_and_the_next_submission_finishes(
    sweep: tuple[SweepStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 raises at step 2 while rank 0 waits in that step's all-reduce: no hang, one failure, retryable."""
    store, rid = sweep
    monkeypatch.setenv("LOOPSCALE_RANK_TIMEOUT_S", "5")
    t0 = time.time()
    job = _submit(store, CountingTask(str(store.root), 2, fail_once=(1,)), rid)
    assert _results(job) == ["failed", "failed"]  # abandoned: the task ends instead of retrying in-process
    assert time.time() - t0 < 60
    assert _events(store, rid) == ["start", "failed"]
    att = store.attempts(rid)
    assert att["attempts"] == 1 and att["failures"] == 1 and att["retryable"] is True
    error = json.loads((store.run_dir(rid) / "result.json").read_text())["error"]
    assert error.startswith("rank 1: RuntimeError: injected failure at step 2")  # the cause first, then rank 0's
    assert "rank 0: RuntimeError" in error
    assert runnable(store, rid, 2) == (True, "failed") and not (store.run_dir(rid) / "lock.json").exists()

    again = _submit(store, CountingTask(str(store.root), 2), rid)  # the next submission: both ranks fresh
    assert _results(again) == ["done", "done"]
    assert _events(store, rid) == ["start", "failed", "start", "done"]
    assert json.loads((store.run_dir(rid) / "result.json").read_text())["status"] == "ok"


def test_task_pickles_with_its_failure_plan() -> None:
    task = CountingTask("/sweeps/x", 1, fail_once=(1,))
    assert isinstance(task.checkpoint("r"), submitit.helpers.DelayedSubmission) and task.fail_once == (1,)


def test_rank_0_records_one_failure_naming_each_rank_that_failed_first_one_first() -> None:
    from loopscale.sweep.attempt import _combine, _Ending

    own = _Ending("failed", error="RuntimeError: peer closed", traceback="tb0", ended=20.0)
    same = {1: {**own.message(), "error": "RuntimeError: peer closed"}}
    assert _combine(own, same, 5) is own  # all ranks agree: recorded as a single rank's failure
    cause = {1: {"kind": "error", "error": "OutOfMemoryError: x", "traceback": "tb1", "ended": 10.0}}
    both = _combine(own, cause, 5)
    assert both.kind == "error" and both.error == "rank 1: OutOfMemoryError: x; rank 0: RuntimeError: peer closed"
    assert "--- rank 1 ---\ntb1" in both.traceback
    silent = _combine(own, {1: None}, 5)
    assert silent.error.endswith("rank 1: no report within 5 s (stuck in a collective?)")
    config = _combine(own, {1: {**cause[1], "kind": "config", "error": "ConfigError: bad"}}, 5)
    assert config.kind == "config"  # recorded as not retryable
    ok = _Ending("result", result=RunRecord(status="ok"))
    assert _combine(ok, {1: None}, 5) is ok  # rank 0 passed the final barrier: the run finished
    assert (
        _combine(own, {1: {"kind": "interrupted", "error": "", "traceback": "", "ended": 1.0}}, 5).kind == "interrupted"
    )
