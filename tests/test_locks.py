"""The run-dir lock every writer takes (loopscale/locks.py; issue 29): a reused PID or a lock from another boot is
stale, a live holder is named with how to clear it, and `loopscale train` honours it like the sweeps do."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loopscale import locks


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _write(run_dir: Path, **info: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / locks.LOCK).write_text(json.dumps({"host": socket.gethostname(), "time": 0, **info}))


def test_acquire_live_and_release(tmp_path: Path) -> None:
    lock = locks.acquire(tmp_path / "run", executor="test")
    assert lock is not None and locks.live(tmp_path / "run")["executor"] == "test"
    assert locks.acquire(tmp_path / "run") is None  # this live process holds it
    lock.release()
    assert locks.live(tmp_path / "run") is None and not (tmp_path / "run" / locks.LOCK).exists()


def test_a_live_holder_keeps_its_lock_and_is_named(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    _write(tmp_path, pid=sleeper.pid, start=locks.start_time(sleeper.pid), boot_id=locks.boot_id())
    assert locks.live(tmp_path) is not None and locks.acquire(tmp_path) is None
    text = locks.describe(locks.live(tmp_path), tmp_path)
    assert f"pid {sleeper.pid} on {socket.gethostname()}" in text and str(tmp_path / locks.LOCK) in text


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process start times come from /proc")
def test_a_reused_pid_is_stale(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    """A lock naming this host and a live but unrelated PID blocked the sweep forever ("busy")."""
    _write(tmp_path, pid=sleeper.pid, start=locks.start_time(sleeper.pid) - 1, boot_id=locks.boot_id())
    assert locks.live(tmp_path) is None
    assert locks.acquire(tmp_path) is not None  # taken over


@pytest.mark.skipif(locks.boot_id() is None, reason="the kernel gives no boot id")
def test_a_lock_from_another_boot_is_stale(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    _write(tmp_path, pid=sleeper.pid, start=locks.start_time(sleeper.pid), boot_id="another-boot")
    assert locks.live(tmp_path) is None


def test_loopscale_train_refuses_a_run_dir_another_process_trains(
    tmp_path: Path, sleeper: subprocess.Popen, capsys: pytest.CaptureFixture[str]
) -> None:
    """`loopscale train` took no lock: two trainings into one dir both ran (469 metrics lines for 301 steps)."""
    from loopscale.cli import run_app
    from test_train_cli import tiny_toml

    run = tmp_path / "run"
    _write(run, pid=sleeper.pid, start=locks.start_time(sleeper.pid), boot_id=locks.boot_id(), executor="local")
    assert run_app(["train", str(tiny_toml(tmp_path)), "--out", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "is in use by another process (a second training would mix with it): held by pid" in err and "(local)" in err
    assert "delete" in err and not (run / "metrics.jsonl").exists() and not (run / "config.toml").exists()
    sleeper.kill()
    sleeper.wait()  # its holder is gone: the lock is stale, the run trains, and the lock is released after
    assert run_app(["train", str(tiny_toml(tmp_path)), "--out", str(run), "--no-progress"]) == 0
    assert (run / "result.json").exists() and not (run / locks.LOCK).exists()
