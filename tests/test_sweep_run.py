"""Running sweeps: a correct runs table, idempotent reruns, SIGKILL and restart, failures, locks, executors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import tomli_w

from conftest import tiny_sweep_spec
from loopscale import accounting
from loopscale.sweep import COLUMNS, load_spec, prepare, run_sweep, runs_table, spec_from_dict, write_table
from loopscale.sweep.store import SweepStore


def tiny_spec(**sweep) -> dict:
    return tiny_sweep_spec({"ckpt_every": 0}, **sweep)


def write_spec(path: Path, spec: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(spec))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory):
    """The tiny sweep, uninterrupted, one run at a time in this process: (spec, store, table)."""
    root = tmp_path_factory.mktemp("sweep")
    spec = spec_from_dict(tiny_spec(), source="tiny.toml")
    store = prepare(spec, root / "straight")
    summary = run_sweep(spec, store, progress=False, slots=1)
    assert summary.count("done") == 8, summary.outcomes
    df, _missing = runs_table(store)
    return spec, store, df


def test_tiny_sweep_finishes_and_collects_a_correct_runs_table(finished, tmp_path: Path) -> None:
    spec, store, df = finished
    assert list(df.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert list(df["run_id"]) == [rs.run_id for rs in spec.runs()] and (df["status"] == "ok").all()
    for rs, row in zip(spec.runs(), df.itertuples(index=False), strict=True):
        m = rs.config.model
        res = json.loads((store.run_dir(rs.run_id) / "result.json").read_text())
        assert (row.variant, row.seed, row.C, row.r, row.d_model) == ("baseline", 0, rs.C, rs.r, rs.d_model)
        assert (row.N_once, row.N_rec) == (accounting.N_once(m), accounting.N_rec(m))
        assert (row.n_prelude, row.n_recur, row.n_coda) == (m.n_prelude, m.n_recur, m.n_coda)
        assert row.flops_per_token == accounting.train_flops_per_token(m)
        tokens = 8 * 64 * accounting.steps_for_budget(m, rs.C, 8 * 64)
        assert tokens == row.D
        assert row.val_loss == res["val_loss"] and row.wall_s == res["wall_s"] and row.error == ""
    csv_path, pq_path = write_table(df, tmp_path / "runs.csv")
    pd.testing.assert_frame_equal(
        pd.read_csv(csv_path)[["run_id", "r", "N_once", "D", "val_loss"]],
        df[["run_id", "r", "N_once", "D", "val_loss"]],
        check_dtype=False,
    )
    pd.testing.assert_frame_equal(pd.read_parquet(pq_path), df)
    from loopscale.fit import load_runs

    assert len(load_runs(csv_path).df) == 8  # the fit reads it as is


def test_rerunning_a_finished_sweep_trains_nothing(finished) -> None:
    spec, store, _df = finished
    n_events = len(store.events())
    summary = run_sweep(spec, store, progress=False)
    assert summary.count("skipped") == 8 and len(store.events()) == n_events


def _wait_mid_run(root: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until some run has a checkpoint but no result (it is mid-run), and the sweep has finished one."""
    t0 = time.time()
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout
        runs = sorted((root / "runs").glob("*/ckpt.pt"))
        done = list((root / "runs").glob("*/result.json"))
        if done and any(not (ck.parent / "result.json").exists() for ck in runs):
            return
        time.sleep(0.01)


def _wait_unlocked(store: SweepStore, timeout: float = 60) -> None:
    """Wait until no live process holds a run (tethered slot workers checkpoint and exit after a kill)."""
    t0 = time.time()
    while any(store.live_lock(rs.run_id) for rs in store.planned()):
        assert time.time() - t0 < timeout, "a slot worker outlived its killed sweep"
        time.sleep(0.05)


@pytest.mark.parametrize("slots", [1, 2])
def test_sigkill_mid_run_then_restart_finishes_every_run_once_with_the_same_table(
    finished, tmp_path: Path, slots: int
) -> None:
    from loopscale.cli import run_app

    spec = tiny_spec()
    spec["train"]["run"]["ckpt_every"] = 3  # checkpoints do not change the trajectory
    spec_path = write_spec(tmp_path / "tiny.toml", spec)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for attempt in range(3):
        root = tmp_path / f"killed{attempt}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loopscale",
                "sweep",
                "run",
                str(spec_path),
                "--out",
                str(root),
                "--no-progress",
                "--slots",
                str(slots),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_mid_run(root, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        store = SweepStore(root)
        _wait_unlocked(store)
        states = {rs.run_id: store.state(rs.run_id).status for rs in store.planned()}
        # its lock names a dead process; with two slots the other slot's run may have been killed before its
        # first checkpoint (it then restarts from step 0, as it must): the victim is one that had checkpointed.
        # The tethered slot workers finish their step after the kill, so a run seen mid-run with one step left
        # can end "done" instead: then the kill missed every checkpointed run, and the scenario is rerun.
        victim = next(
            (rid for rid, st in states.items() if st == "interrupted" and (root / "runs" / rid / "ckpt.pt").exists()),
            None,
        )
        if victim is not None:
            break
    assert victim is not None, states
    assert "running" not in states.values() and "done" in states.values()

    assert run_app(["sweep", "run", str(root), "--no-progress", "--slots", str(slots)]) == 0
    assert run_app(["sweep", "collect", str(root)]) == 0
    df = pd.read_parquet(root / "runs.parquet")
    _spec, _store, straight = finished
    cols = [c for c in straight.columns if c not in ("wall_s", "attempts")]
    pd.testing.assert_frame_equal(df[cols], straight[cols], check_exact=True)  # bitwise: no tolerance
    events = store.events()
    done = [e["run_id"] for e in events if e["event"] == "done"]
    assert sorted(done) == sorted(straight["run_id"])  # every run finished exactly once
    assert (
        json.loads((root / "runs" / victim / "result.json").read_text())["steps"]
        == straight.set_index("run_id").loc[victim, "steps"]
    )
    starts = [e for e in events if e["event"] == "start" and e["run_id"] == victim]
    assert len(starts) == 2 and starts[1]["resume"] is True


@pytest.mark.long
def test_sigkill_mid_pack_then_restart_gives_the_runs_table_of_an_unkilled_packed_sweep(tmp_path: Path) -> None:
    """Two seeds: the runs of each (r, d) train as one pack of 4 (2 seeds x 2 budgets, members leaving at their
    own steps). Killed with SIGKILL while a pack has finished members and checkpointed ones, rerun: each member
    resumes from its own checkpoint, and the runs table is bitwise that of the same sweep never killed."""
    from loopscale.cli import run_app

    spec = tiny_spec(seeds=[0, 1])
    spec["train"]["run"]["ckpt_every"] = 3
    straight_store = prepare(spec_from_dict(spec, source="tiny.toml"), tmp_path / "straight")
    assert run_sweep(spec_from_dict(spec), straight_store, progress=False, slots=1).count("done") == 16
    straight, _ = runs_table(straight_store)
    spec_path = write_spec(tmp_path / "tiny.toml", spec)
    root = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopscale", "sweep", "run", str(spec_path), "--out", str(root), "--no-progress"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_mid_run(root, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    store = SweepStore(root)
    _wait_unlocked(store)
    packs = {e["run_id"]: e.get("pack") for e in store.events() if e["event"] == "start"}
    assert set(packs.values()) == {4}, packs  # every run started as one of a pack of 4
    states = {rs.run_id: store.state(rs.run_id).status for rs in store.planned()}
    assert "done" in states.values() and "running" not in states.values()
    assert any(st == "interrupted" and (root / "runs" / rid / "ckpt.pt").exists() for rid, st in states.items())
    assert run_app(["sweep", "run", str(root), "--no-progress"]) == 0
    assert run_app(["sweep", "collect", str(root)]) == 0
    df = pd.read_parquet(root / "runs.parquet")
    cols = [c for c in straight.columns if c not in ("wall_s", "attempts")]
    pd.testing.assert_frame_equal(df[cols], straight[cols], check_exact=True)  # bitwise: no tolerance
    done = [e["run_id"] for e in store.events() if e["event"] == "done"]
    assert sorted(done) == sorted(straight["run_id"])  # every run finished exactly once


def test_a_kill_between_result_and_done_event_is_logged_on_restart(finished, tmp_path: Path) -> None:
    """A run whose result.json was written but whose "done" event was not (killed in between) gets its end
    logged, marked recovered, when the sweep restarts; it is not retrained and nothing is logged twice."""
    import shutil

    from loopscale.cli import run_app

    _spec, store, _df = finished
    root = tmp_path / "copy"
    shutil.copytree(store.root, root)
    log = root / "events.jsonl"
    lines = log.read_text().splitlines()
    victim = json.loads(next(ln for ln in lines if json.loads(ln)["event"] == "done"))["run_id"]
    log.write_text(
        "".join(
            ln + "\n" for ln in lines if not (json.loads(ln)["event"] == "done" and json.loads(ln)["run_id"] == victim)
        )
    )
    assert run_app(["sweep", "run", str(root), "--no-progress", "--slots", "1"]) == 0
    assert run_app(["sweep", "run", str(root), "--no-progress", "--slots", "1"]) == 0  # already logged: no repeat
    events = SweepStore(root).events()
    ends = [e for e in events if e["run_id"] == victim and e["event"] == "done"]
    assert len(ends) == 1 and ends[0]["recovered"] is True and ends[0]["val_loss"] is not None
    assert sum(e["event"] == "start" for e in events) == 8  # nothing retrained
    assert sum(e["event"] == "done" for e in events) == 8


@pytest.mark.parametrize("slots", [1, 2])
def test_a_run_that_raises_is_recorded_failed_with_its_error_and_the_others_complete(
    tmp_path: Path, slots: int
) -> None:
    from loopscale.cli import run_app

    spec = tiny_spec(budgets=[2e9], widths={"2e9": [32]}, max_retries=1)
    spec["sweep"]["variants"] = {
        "broken": {"run": {"fail_at_step": 3}, "r": [2]},
        "short": {"run": {"min_steps": 1000}, "r": [2], "optim": {"lr_scale": 0.5}},
    }
    spec["local"] = {"slots": slots}  # the spec's [local] table sets the slots
    spec_path = write_spec(tmp_path / "spec.toml", spec)
    root = tmp_path / "sw"
    assert run_app(["sweep", "run", str(spec_path), "--out", str(root), "--no-progress"]) == 1
    pids = {e["pid"] for e in SweepStore(root).events() if e["event"] == "start"}
    assert (pids == {os.getpid()}) == (slots == 1)  # one slot: in this process; two: in workers
    store = SweepStore(root)
    df, _ = runs_table(store)
    assert list(df.loc[df["variant"] == "baseline", "status"]) == ["ok", "ok"]
    by = df.set_index("variant")
    assert by.loc["broken", "status"] == "failed" and "injected failure at step 3" in by.loc["broken", "error"]
    assert by.loc["short", "status"] == "failed" and "run.min_steps=1000" in by.loc["short", "error"]
    broken = "C2e+09_r2_d32_broken_s0"
    assert store.attempts(broken)["failures"] == 2 and (store.run_dir(broken) / "result.failed-1.json").exists()
    assert store.attempts("C2e+09_r2_d32_short_s0")["attempts"] == 1  # a user error is not retried
    n = len(store.events())
    assert run_app(["sweep", "run", str(root), "--no-progress"]) == 1  # left failed, not retried again
    assert len(store.events()) == n
    assert run_app(["sweep", "run", str(root), "--no-progress", "--retry-failed", "--variant", "broken"]) == 1
    assert store.attempts(broken)["attempts"] == 4


def test_cpu_slots_train_runs_side_by_side_with_bitwise_the_serial_runs_table(finished, tmp_path: Path) -> None:
    _spec, _store, straight = finished
    spec = spec_from_dict(tiny_spec())
    store = prepare(spec, tmp_path / "sw")
    summary = run_sweep(spec, store, progress=False, slots=2)
    assert summary.count("done") == 8
    df, _ = runs_table(store)
    cols = [c for c in straight.columns if c not in ("wall_s", "attempts")]
    pd.testing.assert_frame_equal(df[cols], straight[cols], check_exact=True)  # bitwise: no tolerance
    events = store.events()
    starts = [e for e in events if e["event"] == "start"]
    assert {e["executor"] for e in starts} == {"local-worker"} and os.getpid() not in {e["pid"] for e in starts}
    begin = {e["run_id"]: (e["time"], e["pid"]) for e in starts}
    spans = [(begin[e["run_id"]][0], e["time"], begin[e["run_id"]][1]) for e in events if e["event"] == "done"]
    overlap = max(len({pid for a, b, pid in spans if a <= t < b}) for t, _, _ in spans)
    assert overlap == 2  # two slot workers at a time (each a pack of runs of one shape), never more
    for rs in spec.runs():
        assert json.loads((store.run_dir(rs.run_id) / "result.json").read_text())["threads"] == 1


def test_cpu_slots_fill_the_cores_at_run_threads_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopscale.sweep.local import cpu_slots, slot_envs

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)  # an 8-core machine
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    runs = spec_from_dict(tiny_spec()).runs()
    assert cpu_slots(runs) == 8 and cpu_slots(runs, 3) == 3
    assert cpu_slots(spec_from_dict(tiny_sweep_spec({"threads": 2})).runs()) == 4
    assert cpu_slots(spec_from_dict(tiny_sweep_spec({"threads": None})).runs()) == 1  # run.threads unset: all cores
    assert cpu_slots(spec_from_dict(tiny_sweep_spec({"device": "cuda"})).runs(), 4) == 1  # GPU runs: --gpus
    assert slot_envs(runs, slots=2) == ([{"LOOPSCALE_SLOT_CORES": "4", "OMP_NUM_THREADS": "4"}] * 2, True)
    assert slot_envs(runs, slots=1) == ([], False)  # one at a time, in this process
    assert slot_envs(runs, slots=2, isolate=True)[1] is False  # --isolate: a process per run, two at a time
    assert slot_envs(runs, slots=1, isolate=True) == ([{"LOOPSCALE_SLOT_CORES": "8", "OMP_NUM_THREADS": "8"}], False)


def test_the_progress_display_has_a_bar_per_active_slot() -> None:
    import io

    from rich.console import Console

    from loopscale.sweep.progress import SweepProgress

    prog = SweepProgress(Console(file=io.StringIO()), total_runs=3, total_flops=3.0, enabled=False)
    prog.start_run("a", 1.0, 10, slot=0)
    prog.start_run("b", 1.0, 10, slot=1)
    prog.step("b", 5, 10)
    bars = {t.description: t.fields["info"] for t in prog._p.tasks}
    assert bars == {"sweep": "0/3 runs, 0.5/3 FLOPs", "slot 1  a": "", "slot 2  b": "step 5/10"}
    prog.end_run("a", "done", "a: done")
    assert [t.description for t in prog._p.tasks] == ["sweep", "slot 2  b"]


def test_isolated_run_goes_through_a_worker_subprocess(tmp_path: Path) -> None:
    spec = spec_from_dict(tiny_spec(budgets=[2e9], r=[2], widths={"2e9": [32]}))
    store = prepare(spec, tmp_path / "sw")
    summary = run_sweep(spec, store, isolate=True, progress=False)
    rid = spec.runs()[0].run_id
    assert summary.outcomes == {"done": [rid]}
    start = next(e for e in store.events() if e["event"] == "start")
    assert start["pid"] != os.getpid() and start["executor"] == "local-worker"
    log = (store.run_dir(rid) / "worker.log").read_text()
    assert "step " in log and "tok/s" in log  # the worker's log shows its progress lines (users tail it)


def test_debug_slurm_executor_gives_the_same_results_as_the_local_one(finished, tmp_path: Path) -> None:
    from loopscale.sweep.slurm import SlurmSettings, submit

    _spec, _store, straight = finished
    spec = spec_from_dict(tiny_spec())
    runs = [rs for rs in spec.runs() if rs.run_id in ("C2e+09_r2_d32_baseline_s0", "C2e+09_r1_d32_baseline_s0")]
    store = prepare(spec, tmp_path / "sw")
    recs = submit(
        store, runs, dict.fromkeys((rs.run_id for rs in runs), 1e9), SlurmSettings(), max_retries=0, cluster="debug"
    )
    assert [store.state(rs.run_id).status for rs in runs] == ["queued", "queued"]
    assert [job.result() for rec in recs for job in rec["jobs"]] == ["done", "done"]
    df, _ = runs_table(store)
    want = straight.set_index("run_id").loc[df["run_id"], "val_loss"].tolist()
    assert df["val_loss"].tolist() == want


def test_a_live_lock_keeps_a_run_busy_and_a_dead_ones_lock_is_taken_over(tmp_path: Path) -> None:
    from loopscale.sweep.attempt import execute_run

    spec = spec_from_dict(tiny_spec(budgets=[4e9], r=[1], widths={"4e9": [32]}))
    store = prepare(spec, tmp_path / "sw")
    rid = spec.runs()[0].run_id
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = store.run_dir(rid) / "lock.json"
        import socket

        lock.write_text(json.dumps({"pid": other.pid, "host": socket.gethostname()}))
        assert store.state(rid).status == "running"
        assert execute_run(store, rid, max_retries=0) == "busy"
    finally:
        other.kill()
        other.wait()
    assert store.state(rid).status == "planned"  # stale: its process is gone
    lk = store.try_lock(rid)
    assert lk is not None and store.try_lock(rid) is None
    lk.release()


def test_gpu_slots_split_the_gpus_into_groups_of_nproc_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopscale.sweep.local import _worker_cmd, gpu_slots

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # ids are physical
    assert gpu_slots([0, 1, 2, 3], 1) == [{"CUDA_VISIBLE_DEVICES": str(i)} for i in range(4)]
    assert gpu_slots([0, 1, 2, 3, 4], 2) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    cmd = _worker_cmd(SweepStore("/x"), ["rid"], 2, nproc=2)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"] and "--nproc-per-node=2" in cmd
    assert cmd[-5:] == ["run-one", "/x", "rid", "--max-retries", "2"]
    cmd = _worker_cmd(SweepStore("/x"), ["a", "b"], 2, nproc=1)  # a pack: one worker for its runs
    assert cmd[-6:] == ["run-one", "/x", "a", "b", "--max-retries", "2"]


def test_gpu_ids_are_positions_in_the_parents_cuda_visible_devices_and_uuids_pass_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loopscale.errors import ConfigError
    from loopscale.sweep.local import gpu_slots

    def visible(gpus, nproc=1):
        return [slot["CUDA_VISIBLE_DEVICES"] for slot in gpu_slots(gpus, nproc)]

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert visible([0, 1]) == ["4", "5"] and visible([3]) == ["7"]
    assert visible(None) == ["4", "5", "6", "7"] and visible(None, 2) == ["4,5", "6,7"]
    with pytest.raises(ConfigError, match=r"--gpus: ids are positions in CUDA_VISIBLE_DEVICES=4,5,6,7 .* 4 is not"):
        gpu_slots([0, 4], 1)
    uuids = "GPU-8f2a1c3e-0000-1111-2222-333344445555,MIG-1b2c3d4e-aaaa-bbbb-cccc-ddddeeeeffff,GPU-77"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuids)
    assert visible(None) == uuids.split(",")
    assert visible([2, 0]) == ["GPU-77", uuids.split(",")[0]]
    assert visible(None, 2) == [",".join(uuids.split(",")[:2])]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3,-1,4")  # CUDA stops at the first invalid entry
    assert visible(None) == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible
    assert visible(None) == []


def test_a_config_change_on_a_started_run_is_refused(finished, tmp_path: Path) -> None:
    from loopscale.errors import ConfigError

    _spec, store, _df = finished
    changed = tiny_spec()
    changed["train"]["optim"]["lr_scale"] = 0.5
    with pytest.raises(ConfigError, match="trained with a different config"):
        prepare(spec_from_dict(changed), store.root, change_spec=True)
    assert load_spec(store.root).runs()[0].config.optim.lr_scale == 1.0


def test_a_sweep_dir_belongs_to_one_spec_unless_asked(tmp_path: Path) -> None:
    """A second spec for an existing sweep dir is refused before anything is written; --change-spec lets it
    replace spec.toml where no run it would rewrite has begun (issue 29, item 2)."""
    from loopscale.errors import ConfigError

    store = prepare(spec_from_dict(tiny_spec()), tmp_path / "swm")
    before = {p: p.read_bytes() for p in store.root.rglob("*") if p.is_file()}
    changed = tiny_spec()
    changed["train"]["optim"]["lr_scale"] = 3.0
    with pytest.raises(ConfigError, match=r"already holds another spec.*--change-spec"):
        prepare(spec_from_dict(changed, source="b.toml"), store.root)
    assert {p: p.read_bytes() for p in store.root.rglob("*") if p.is_file()} == before
    prepare(spec_from_dict(tiny_spec(), source="again.toml"), store.root)  # the same spec again: resumes
    assert {p: p.read_bytes() for p in store.root.rglob("*") if p.is_file()} == before
    prepare(spec_from_dict(changed), store.root, change_spec=True)  # nothing started: asked, it is replaced
    assert load_spec(store.root).runs()[0].config.optim.lr_scale == 3.0


def test_a_second_spec_cannot_rewrite_a_run_another_sweep_holds_or_has_begun(tmp_path: Path) -> None:
    """While `sweep run specA --out swm` trains, `sweep run specB --out swm` rewrote every run's sweep.json not
    yet checkpointed, and sweep A then trained B's config under A's name (issue 29). A run with a live lock or
    a config.toml counts as started: its plan is never rewritten."""
    from loopscale import locks
    from loopscale.errors import ConfigError

    spec_a = spec_from_dict(tiny_spec())
    store = prepare(spec_a, tmp_path / "swm")
    first, second = (rs.run_id for rs in spec_a.runs()[:2])
    changed = tiny_spec()
    changed["train"]["optim"]["lr_scale"] = 3.0
    # sweep A holds its first run (no checkpoint yet)
    with locks.acquire(store.run_dir(first)), pytest.raises(ConfigError, match="or is being trained now"):
        prepare(spec_from_dict(changed), store.root, change_spec=True)
    assert store.load_run(first).config.optim.lr_scale == 1.0
    (store.run_dir(second) / "config.toml").write_text("# the trainer's first file\n")
    with pytest.raises(ConfigError, match="different config"):
        prepare(spec_from_dict(changed), store.root, change_spec=True)
    assert store.load_run(second).config.optim.lr_scale == 1.0
    assert store.load_run(first).config.optim.lr_scale == 1.0  # refused before writing any run's plan


def test_gpu_slots_run_one_worker_per_gpu_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi-GPU scheduler with a stand-in worker (no training): one run per GPU, runs handed out as GPUs free."""
    from loopscale.sweep import local

    worker = (
        "import json, os, sys, time; from pathlib import Path\n"
        "d = Path(sys.argv[1]); (d / 'gpu.txt').write_text(os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "(d / 'threads.txt').write_text(os.environ['LOOPSCALE_SLOT_CORES'] + ' ' + os.environ['OMP_NUM_THREADS'])\n"
        "(d / 'span.json').write_text(json.dumps([time.time(), time.time() + 0.4])); time.sleep(0.4)\n"
        "(d / 'result.json').write_text(json.dumps({'status': 'ok', 'val_loss': 1.0, 'wall_s': 0.4, 'r': 1,"
        " 'N_once': 1, 'N_rec': 1, 'D': 1}))\n"
    )
    monkeypatch.setattr(
        local,
        "_worker_cmd",
        lambda store, ids, retries, nproc: [sys.executable, "-c", worker, str(store.run_dir(ids[0]))],
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)  # a 16-core node
    spec = spec_from_dict(tiny_spec())
    store = prepare(spec, tmp_path / "sw")
    summary = run_sweep(spec, store, gpus=[0, 1], progress=False, pack="off")  # the stand-in trains one run
    assert summary.count("done") == 8
    gpus = [(store.run_dir(rs.run_id) / "gpu.txt").read_text() for rs in spec.runs()]
    assert sorted(set(gpus)) == ["0", "1"]
    threads = {(store.run_dir(rs.run_id) / "threads.txt").read_text() for rs in spec.runs()}
    assert threads == {"8 8"}  # each of the 2 slots gets half the cores
    spans = sorted(json.loads((store.run_dir(rs.run_id) / "span.json").read_text()) for rs in spec.runs())
    overlap = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert overlap == 2  # never more workers than GPUs


def test_the_paper_preset_without_data_is_refused_before_any_run_starts(tmp_path: Path, capsys) -> None:
    from loopscale.cli import run_app

    out = tmp_path / "paper"
    assert run_app(["sweep", "run", "paper", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "data.allow_default = false" in err and "\n" not in err.strip()
    assert not out.exists()  # nothing prepared, nothing launched
