"""The one signal handler (loopscale/signals.py): a stop is a flag, it reaches a handler installed after it was
caught, and a sweep worker's repeated stop signals cannot kill it while it keeps its books."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from loopscale import signals

_WORKER = """\
import os, signal, time
from loopscale.signals import StopSignals, worker_process
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
with worker_process():
    with StopSignals() as trainer:  # the trainer's handler, restored when its loop ends
        os.kill(os.getpid(), signal.SIGTERM)
        while trainer.caught is None:
            time.sleep(0.01)
    for sig in (signal.SIGTERM, signal.SIGUSR2):  # repeats while the books are kept: a default would kill
        os.kill(os.getpid(), sig)
    time.sleep(0.2)
    print("books kept", flush=True)
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored as it was
"""


def test_a_workers_repeated_stop_signals_after_the_trainers_handler_is_gone_do_not_kill_it() -> None:
    done = subprocess.run([sys.executable, "-c", _WORKER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "books kept", (done.returncode, done.stderr[-2000:])


def test_a_stop_caught_before_the_trainers_handler_is_installed_reaches_it() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    with signals.StopSignals((signal.SIGUSR2,)) as outer:
        os.kill(os.getpid(), signal.SIGUSR2)  # e.g. while the worker loads its data
        assert outer.caught == signal.SIGUSR2
        with signals.StopSignals((signal.SIGUSR2,)) as inner:
            assert inner.caught == signal.SIGUSR2  # it stops at its first safe point
        with signals.StopSignals((signal.SIGUSR1,)) as other:
            assert other.caught is None  # only the signals it handles
    assert signal.getsignal(signal.SIGUSR2) is before


def test_sweep_workers_train_inside_the_worker_handler(tmp_path: Path, monkeypatch) -> None:
    """``sweep run-one`` (``--isolate``, GPU slots) and a CPU slot's worker call execute_run under
    ``worker_process``: the handler that keeps a repeated SIGTERM from killing them mid-books."""
    import io

    import loopscale.sweep.attempt as attempt
    import loopscale.sweep.store as store
    from loopscale.cli import run_app
    from loopscale.sweep import slot_worker

    seen: list[object] = []

    def fake_execute_run(store, run_id, **kw):
        seen.append(getattr(signal.getsignal(signal.SIGTERM), "__self__", None))
        return "done"

    monkeypatch.setattr(attempt, "execute_run", fake_execute_run)
    monkeypatch.setattr(store, "open_store", store.SweepStore)  # no planned sweep needed
    assert run_app(["sweep", "run-one", str(tmp_path / "sw"), "r1"]) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("r2\n"))
    saved = os.dup(1)
    try:
        slot_worker.serve(str(tmp_path / "sw"), 1)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert len(seen) == 2 and all(isinstance(h, signals.StopSignals) for h in seen), seen


def test_ctrl_c_is_ignored_inside_and_restored_after() -> None:
    before = signal.getsignal(signal.SIGINT)
    with signals.ctrl_c_ignored():
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # nothing happens
    assert signal.getsignal(signal.SIGINT) is before


_EXITING = """\
import atexit, os, signal, sys, time
from loopscale.signals import exit_at_once_on_ctrl_c
if sys.argv[1] == "late":  # registered before it: runs after its own callback, late in the shutdown
    atexit.register(os.kill, os.getpid(), signal.SIGINT)
exit_at_once_on_ctrl_c(130)
if sys.argv[1] == "now":
    os.kill(os.getpid(), signal.SIGINT)  # while it winds down: ends it at once, with 130
    time.sleep(30)
sys.exit(3)
"""


def test_an_interrupted_command_ends_with_its_status_whatever_a_further_ctrl_c_does() -> None:
    for when, status in (("now", 130), ("late", 3)):  # late: ignored (not the default: -2)
        done = subprocess.run([sys.executable, "-c", _EXITING, when], capture_output=True, text=True, timeout=60)
        assert done.returncode == status, (when, done.returncode, done.stderr[-2000:])
