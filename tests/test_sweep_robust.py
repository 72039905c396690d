"""Sweep edges: leftovers of finished runs, the stale-lock race, orphaned workers, corrupt files, failure history."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopscale.errors import ConfigError
from loopscale.sweep import prepare, run_sweep, spec_from_dict
from loopscale.sweep.store import SweepStore
from test_sweep_run import tiny_spec, write_spec


def one_run_spec(**sweep) -> dict:
    return tiny_spec(budgets=[2e9], r=[2], widths={"2e9": [16]}, **sweep)


@pytest.fixture(scope="module")
def one_done(tmp_path_factory: pytest.TempPathFactory):
    """A finished one-run sweep: (spec, store, run_id)."""
    spec = spec_from_dict(one_run_spec(), source="one.toml")
    store = prepare(spec, tmp_path_factory.mktemp("sweep") / "sw")
    assert run_sweep(spec, store, progress=False).count("done") == 1
    return spec, store, spec.runs()[0].run_id


def test_rerunning_a_sweep_removes_a_finished_runs_checkpoint_and_temporaries(one_done) -> None:
    spec, store, rid = one_done
    d = store.run_dir(rid)
    (d / "ckpt.pt").write_bytes(b"left by a kill after result.json")
    (d / ".ckpt.pt.k1ll3d_x.tmp").write_bytes(b"left by a kill mid-write")
    (d / ".attempts.json.abcd1234.tmp").write_bytes(b"not the trainer's")
    summary = run_sweep(spec, store, progress=False)
    assert summary.outcomes == {"skipped": [rid]}
    assert not (d / "ckpt.pt").exists() and not (d / ".ckpt.pt.k1ll3d_x.tmp").exists()
    assert (d / ".attempts.json.abcd1234.tmp").exists() and (d / "model.safetensors").exists()
    (d / ".attempts.json.abcd1234.tmp").unlink()


def _claim(root: str, rid: str, delay: float, out) -> None:
    """A child process: wait ``delay``, try to take the run's lock, report, hold it a while."""
    import time

    time.sleep(delay)
    lock = SweepStore(root).try_lock(rid)
    out.put((os.getpid(), lock is not None))
    time.sleep(2.0)  # still alive while the other contender looks at the lock


def test_two_processes_taking_over_the_same_stale_lock_never_both_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing
    import socket
    import time

    store = SweepStore(tmp_path / "sw")
    rid = "C2e+09_r2_d16_baseline_s0"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.run_dir(rid).mkdir(parents=True)
    (store.run_dir(rid) / "lock.json").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    assert store.live_lock(rid) is None  # stale: its process is gone
    judged = SweepStore.live_lock

    def slow_judge(self, run_id):  # widen the window between "it is stale" and acting on it
        verdict = judged(self, run_id)
        time.sleep(0.6)
        return verdict

    monkeypatch.setattr(SweepStore, "live_lock", slow_judge)
    ctx = multiprocessing.get_context("fork")  # the children inherit the patch
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(store.root), rid, delay, out)) for delay in (0.0, 0.3)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert sorted(results.values()) == [False, True], results
    winner = next(pid for pid, won in results.items() if won)
    assert json.loads((store.run_dir(rid) / "lock.json").read_text())["pid"] == winner


def test_releasing_a_lock_another_process_took_over_leaves_that_lock(tmp_path: Path) -> None:
    store = SweepStore(tmp_path / "sw")
    lock = store.try_lock("run")
    assert lock is not None
    theirs = json.dumps({"pid": 1, "host": "elsewhere", "time": 0.0})
    lock.path.write_text(theirs)  # judged stale (e.g. a heartbeat gap) and taken over
    lock.release()
    assert lock.path.read_text() == theirs


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the worker's tether uses Linux's prctl")
def test_a_worker_stops_when_its_isolated_sweep_is_killed(tmp_path: Path) -> None:
    import signal
    import time

    spec = tiny_spec(budgets=[2e11], r=[2], widths={"2e11": [32]})  # hundreds of steps: still training when killed
    spec_path = write_spec(tmp_path / "spec.toml", spec)
    root = tmp_path / "sw"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loopscale",
            "sweep",
            "run",
            str(spec_path),
            "--out",
            str(root),
            "--isolate",
            "--no-progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    store, worker = SweepStore(root), None
    try:
        t0 = time.time()
        while worker is None:  # the worker holds the lock and has logged a step
            assert parent.poll() is None, parent.communicate()
            assert time.time() - t0 < 120
            runs = list((root / "runs").glob("*/metrics.jsonl")) if (root / "runs").is_dir() else []
            if runs and (lock := store.live_lock(runs[0].parent.name)) is not None:
                worker = int(lock["pid"])
            time.sleep(0.05)
        assert worker != parent.pid
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        t0 = time.time()
        while not _gone(worker) and time.time() - t0 < 30:
            time.sleep(0.1)
        assert _gone(worker), "the worker outlived its sweep"
        rid = runs[0].parent.name
        assert store.state(rid).status == "interrupted"  # it checkpointed and let go of the run
        assert (store.run_dir(rid) / "ckpt.pt").exists()
    finally:
        if worker is not None and not _gone(worker):
            os.kill(worker, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def test_a_rerun_that_finds_a_run_busy_says_so_and_exits_3(tmp_path: Path, capsys) -> None:
    import socket

    from loopscale.cli import run_app

    spec_path = write_spec(tmp_path / "spec.toml", one_run_spec())
    root = tmp_path / "sw"
    store = prepare(spec_from_dict(one_run_spec(), source=str(spec_path)), root)
    rid = store.planned()[0].run_id
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (store.run_dir(rid) / "lock.json").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        capsys.readouterr()
        assert run_app(["sweep", "run", str(root), "--no-progress"]) == 3
        err = capsys.readouterr().err
        assert "1 run(s) busy" in err and rid in err and f"pid {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory):
    """A finished sweep of one run done and one failed for good: (root, done id, failed id)."""
    from loopscale.cli import run_app

    base = tmp_path_factory.mktemp("mixed")
    spec = one_run_spec(max_retries=0)
    spec["sweep"]["variants"] = {"broken": {"run": {"fail_at_step": 3}, "r": [2]}}
    spec_path = write_spec(base / "spec.toml", spec)
    root = base / "sw"
    assert run_app(["sweep", "run", str(spec_path), "--out", str(root), "--no-progress"]) == 1
    states = {rs.run_id: SweepStore(root).state(rs.run_id).status for rs in SweepStore(root).planned()}
    done = next(r for r, s in states.items() if s == "done")
    failed = next(r for r, s in states.items() if s == "failed")
    return root, done, failed


def _copy(mixed, tmp_path: Path) -> tuple[Path, str, str]:
    import shutil

    root, done, failed = mixed
    shutil.copytree(root, tmp_path / "sw")
    return tmp_path / "sw", done, failed


def _cli(capsys, *args: str) -> tuple[int, str]:
    from loopscale.cli import run_app

    capsys.readouterr()
    code = run_app(list(args))
    cap = capsys.readouterr()
    return code, " ".join((cap.out + cap.err).split())  # rich may wrap table cells


def test_sweep_status_counts_failed_runs_flops_apart_from_done(mixed, capsys) -> None:
    from loopscale.sweep import load_spec, plan_row

    root, done, failed = mixed
    spec = load_spec(str(root))
    flops = {rs.run_id: plan_row(rs, spec).flops for rs in spec.runs()}
    code, out = _cli(capsys, "sweep", "status", str(root))
    assert code == 0
    total = flops[done] + flops[failed]
    assert f"{flops[done]:.3g}/{total:.3g} FLOPs done" in out, out
    assert f"{flops[failed]:.3g} in failed runs" in out


def test_a_corrupt_sweep_json_is_counted_and_named_by_status_and_collect(mixed, tmp_path: Path, capsys) -> None:
    root, done, _failed = _copy(mixed, tmp_path)
    (root / "runs" / done / "sweep.json").write_text('{"run_id": "trunc')
    code, out = _cli(capsys, "sweep", "status", str(root))
    assert code == 0 and "2 runs:" in out and "1 corrupt" in out
    assert f"runs/{done}/sweep.json: unreadable" in out
    code, out = _cli(capsys, "sweep", "collect", str(root))
    assert code == 1 and "1 corrupt" in out and f"corrupt, not in the table: runs/{done}/sweep.json" in out
    assert "1 run(s) left out" in out  # the table is written, the exit status says it is not whole


def test_a_run_id_that_leaves_the_sweep_is_not_followed(mixed, tmp_path: Path, capsys) -> None:
    """A sweep.json whose run_id points out of runs/ ('../../x') made collect read a result.json outside the
    sweep (issue 29); the folder is the run's identity, so such a plan is counted as corrupt and named."""
    root, done, _failed = _copy(mixed, tmp_path)
    meta = json.loads((root / "runs" / done / "sweep.json").read_text())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "result.json").write_text(
        (root / "runs" / done / "result.json").read_text().replace('"val_loss": ', '"val_loss": 99.0, "was": ')
    )
    meta["run_id"] = "../../outside"
    (root / "runs" / done / "sweep.json").write_text(json.dumps(meta))
    code, out = _cli(capsys, "sweep", "collect", str(root))
    assert code == 1 and "1 corrupt" in out and "does not match its folder" in out, out
    table = (root / "runs.csv").read_text()
    assert "99.0" not in table and "outside" not in table
    with pytest.raises(ConfigError, match="would leave the sweep"):
        SweepStore(root).run_dir("../../outside")


def test_a_run_dir_that_links_out_of_the_sweep_is_named_not_followed(mixed, tmp_path: Path, capsys) -> None:
    """A run dir that is a symlink out of runs/ (from a colleague's tarball) is named as corrupt by collect and
    refused by `sweep run`; nothing is read or written through it."""
    import shutil

    root, done, _failed = _copy(mixed, tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.move(root / "runs" / done, outside)
    (root / "runs" / done).symlink_to(outside, target_is_directory=True)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    code, out = _cli(capsys, "sweep", "collect", str(root))
    assert code == 1 and f"runs/{done}: " in out and "a link out of the sweep" in out, out
    assert done not in (root / "runs.csv").read_text()
    code, out = _cli(capsys, "sweep", "run", str(root), "--no-progress")
    assert code == 2 and "a link out of the sweep" in out and "Traceback" not in out
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"val_loss": "3.1"}, "val_loss: expected a finite number, got '3.1'"),
        ({"val_loss": None}, "val_loss: expected a finite number, got None"),
        ({"D": -5}, "D: expected > 0, got -5"),
        ({"r": 0}, "r: expected >= 1, got 0"),
        ({"N_rec": [1]}, "N_rec: expected a finite number, got [1]"),
        ({"status": "great"}, "status: expected one of ok, diverged, failed, got 'great'"),
    ],
)
def test_a_result_json_with_a_bad_field_is_corrupt_and_named_not_a_hole_in_the_table(
    mixed, tmp_path: Path, capsys, edit: dict, named: str
) -> None:
    """collect coerced a string loss or a list to NaN and exited 0 (issue 29, item 6): the fit then refused a
    table with a hole, far from the file at fault."""
    root, done, _failed = _copy(mixed, tmp_path)
    path = root / "runs" / done / "result.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    code, out = _cli(capsys, "sweep", "collect", str(root))
    assert code == 1 and f"runs/{done}/result.json: invalid ({named})" in " ".join(out.split()), out
    assert done not in (root / "runs.csv").read_text()


def test_a_corrupt_result_json_is_reported_then_set_aside_and_the_run_redone(mixed, tmp_path: Path, capsys) -> None:
    root, done, _failed = _copy(mixed, tmp_path)
    good = json.loads((root / "runs" / done / "result.json").read_text())
    (root / "runs" / done / "result.json").write_text('{"status": "ok", "val_lo')
    code, out = _cli(capsys, "sweep", "status", str(root))
    assert "1 corrupt" in out and f"runs/{done}/result.json: unreadable" in out
    code, out = _cli(capsys, "sweep", "collect", str(root))
    assert f"corrupt, not in the table: runs/{done}/result.json" in out
    code, out = _cli(capsys, "sweep", "run", str(root), "--no-progress")
    assert code == 1 and "moved to result.json.corrupt-" in out, out  # 1: the other run is failed
    again = json.loads((root / "runs" / done / "result.json").read_text())
    assert again["val_loss"] == good["val_loss"]  # redone from scratch: the same bits
    assert len(list((root / "runs" / done).glob("result.json.corrupt-*"))) == 1


def test_retry_failed_twice_keeps_every_failure_record(mixed, tmp_path: Path, capsys) -> None:
    root, _done, failed = _copy(mixed, tmp_path)
    store = SweepStore(root)
    for _ in range(2):
        code, _out = _cli(capsys, "sweep", "run", str(root), "--no-progress", "--retry-failed")
        assert code == 1
    att = store.attempts(failed)
    assert att["attempts"] == 3 and att["failures"] == 1
    assert [h["failures"] for h in att["history"]] == [1, 1]
    d = store.run_dir(failed)
    assert sorted(p.name for p in d.glob("result.failed-*.json")) == ["result.failed-1.json", "result.failed-2.json"]
    assert json.loads((d / "result.json").read_text())["status"] == "failed"


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"job_name": "loopscale\n#SBATCH --nodes=64"}, "slurm.job_name"),
        ({"partition": "gpu\rrm -rf ~"}, "slurm.partition"),
        ({"additional": {"mail-user": "me@x.org\necho injected"}}, "slurm.additional"),
        ({"additional": {"exclusive\n#SBATCH --nodes": "64"}}, "slurm.additional"),
    ],
    ids=["job_name", "partition", "additional value", "additional key"],
)
def test_a_newline_in_a_slurm_setting_is_refused_in_one_line_naming_the_field(table: dict, field: str) -> None:
    from loopscale.errors import ConfigError

    spec = one_run_spec()
    spec["slurm"] = table
    with pytest.raises(ConfigError) as info:
        spec_from_dict(spec, source="spec.toml")
    msg = str(info.value)
    assert msg.startswith(f"spec.toml: {field}: ") and "must be one line" in msg and "\n" not in msg and "\r" not in msg


_CHILD = """\
import sys, time
from loopscale.signals import StopSignals, worker_process

marker = sys.argv[1]
with worker_process():  # as `sweep run-one` and a CPU slot's worker run execute_run
    with StopSignals() as trainer:  # the trainer's handler, restored when its loop ends
        open(marker + ".ready", "w").close()
        while trainer.caught is None:
            time.sleep(0.01)
    open(marker + ".books", "w").close()
    time.sleep(2.0)  # the books (interrupted event, lock release): the second SIGTERM arrives here
    open(marker, "w").write("wound down")
"""

_PARENT = """\
import os, subprocess, sys, threading, time
from loopscale.sweep.local import tethered

child, marker = sys.argv[1], sys.argv[2]

def spawn():  # this thread starts the worker, then ends: the kernel sends the worker SIGTERM (1)
    subprocess.Popen(tethered([sys.executable, child, marker]))
    while not os.path.exists(marker + ".ready"):
        time.sleep(0.02)

t = threading.Thread(target=spawn)
t.start()
t.join()
while not os.path.exists(marker + ".books"):
    time.sleep(0.02)
os._exit(0)  # the worker's new parent thread ends too: SIGTERM (2), while it keeps its books
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the worker's tether uses Linux's prctl")
def test_a_tethered_worker_keeps_its_books_through_a_second_sigterm_from_its_sweeps_threads(tmp_path: Path) -> None:
    """The cause of the isolated-sweep flake, made deterministic: the kernel re-sends PR_SET_PDEATHSIG each time
    the thread a worker was handed to exits, so a killed sweep with several threads signals its worker several
    times. One landing after the trainer's handler was restored used to kill the worker before it released
    its lock (seen under load); ``worker_process`` takes it."""
    import time

    marker = tmp_path / "done"
    (tmp_path / "child.py").write_text(_CHILD)
    (tmp_path / "parent.py").write_text(_PARENT)
    parent = subprocess.run(
        [sys.executable, str(tmp_path / "parent.py"), str(tmp_path / "child.py"), str(marker)], timeout=120, check=False
    )
    assert parent.returncode == 0 and (tmp_path / "done.books").exists()  # the first SIGTERM reached it
    t0 = time.time()
    while not marker.exists() and time.time() - t0 < 30:
        time.sleep(0.05)
    assert marker.exists() and marker.read_text() == "wound down"
