"""The one lock protocol for a run dir: ``RUN_DIR/lock.json``, taken by `loopscale train` and by every sweep
executor before a run trains (docs/sweep.md, "Locks").

A lock names its holder: host, PID, the kernel's boot id and the process's start time (``/proc/PID/stat``,
clock ticks since boot). A lock is live while that process runs: on this host, the PID exists *and* started
at the recorded time on this boot (a reused PID, or a lock from before a reboot, is stale); on another host,
while its heartbeat (the file's mtime, refreshed by ``Lock.beat``) is younger than ``STALE_AFTER_S``.
Taking a lock is an atomic hard link; a stale lock is replaced under ``flock(lock.takeover)``, so two
processes can never both take it over.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCK = "lock.json"
TAKEOVER = "lock.takeover"  # flock'ed while a process takes over a stale lock.json (empty, never removed)
STALE_AFTER_S = 900.0  # a lock from another host with no heartbeat for this long is stale
HEARTBEAT_S = 30.0


def boot_id() -> str | None:
    """This boot's id (Linux); None where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22); None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: fields resume after the last ')'
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def holder() -> dict[str, Any]:
    """This process, as a lock records it."""
    pid = os.getpid()
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "start": start_time(pid),
        "time": time.time(),
    }


def holder_alive(info: dict[str, Any], path: Path) -> bool:
    """Is the process a lock names still the one that took it? (see the module docstring)"""
    if info.get("host") == socket.gethostname():
        ours = boot_id()
        if info.get("boot_id") and ours and info["boot_id"] != ours:
            return False  # taken before this machine rebooted
        try:
            pid = int(info.get("pid", -1))
        except (TypeError, ValueError):
            return False
        if pid <= 0 or not _pid_alive(pid):
            return False
        recorded, now = info.get("start"), start_time(pid)
        return recorded is None or now is None or int(recorded) == now  # else: the PID was reused
    try:
        return time.time() - path.stat().st_mtime < STALE_AFTER_S
    except OSError:
        return False


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def live(run_dir: Path) -> dict[str, Any] | None:
    """The live lock of ``run_dir`` (its record), or None when there is none or it is stale.

    An unreadable lock.json (being written by another host's process, or broken) counts as live while it is
    younger than ``STALE_AFTER_S``."""
    path = Path(run_dir) / LOCK
    info = _read(path)
    if info is None:
        if not path.exists():
            return None
        try:
            young = time.time() - path.stat().st_mtime < STALE_AFTER_S
        except OSError:
            return None
        return {} if young else None
    return info if holder_alive(info, path) else None


def describe(info: dict[str, Any], run_dir: Path) -> str:
    """Who holds a lock and how to clear it, for a one-line message."""
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(info.get("time", 0)))) if info.get("time") else "?"
    by = f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {since}"
    what = f" ({info['executor']})" if info.get("executor") else ""
    return (
        f"held by {by}{what}; wait for it, stop it, or if that process is gone for good delete {Path(run_dir) / LOCK}"
    )


class Lock:
    """An exclusive claim on a run dir (a hard link, atomic); ``beat()`` refreshes its mtime as a heartbeat."""

    def __init__(self, path: Path, text: str = "") -> None:
        self.path = path
        self.text = text  # what this process wrote: release() removes only its own lock
        self._last = time.time()

    def beat(self, force: bool = False) -> None:
        now = time.time()
        if force or now - self._last >= HEARTBEAT_S:
            with contextlib.suppress(OSError):
                os.utime(self.path)
            self._last = now

    def release(self) -> None:
        """Remove the lock, unless another process took it over (it judged this one stale)."""
        with contextlib.suppress(OSError):
            if not self.text or self.path.read_text(encoding="utf-8") == self.text:
                self.path.unlink()

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created, never removed): the kernel frees it when we exit or die.

    On a file system without ``flock`` this serialises nothing (docs/sweep.md, locks).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def acquire(run_dir: Path, **info: Any) -> Lock | None:
    """Claim ``run_dir`` for this process, or None when a live process holds it (stale locks are taken over)."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / LOCK
    text = json.dumps({**holder(), **info})
    tmp = d / f".lock.{socket.gethostname()}.{os.getpid()}.tmp"
    tmp.write_text(text, encoding="utf-8")
    try:
        try:
            os.link(tmp, path)  # atomic and exclusive (also on NFS): a lock is never half-written
            return Lock(path, text)
        except FileExistsError:
            pass
        return Lock(path, text) if _take_over(d, tmp, path) else None
    finally:
        tmp.unlink(missing_ok=True)


def _take_over(run_dir: Path, tmp: Path, path: Path) -> bool:
    """Replace a stale lock with ``tmp``; False when a live process holds the run.

    Check-dead-then-replace is not atomic by itself: two processes could both find the same lock stale and
    both "take it over". So takeovers hold ``flock(lock.takeover)`` from the check to the swap, and the swap
    is one ``rename`` over the stale lock (never absent, so no fresh ``link`` can slip in between). The flock
    dies with its holder: no stale takeover can block a run.
    """
    with _flocked(run_dir / TAKEOVER):
        try:
            os.link(tmp, path)  # released meanwhile
            return True
        except FileExistsError:
            pass
        if live(run_dir) is not None:
            return False
        os.replace(tmp, path)
        return True


@contextlib.contextmanager
def held(run_dir: Path, *, field: str, doing: str, executor: str) -> Iterator[Lock]:
    """Hold ``run_dir``'s lock for one command (`loopscale train`, `eval`'s cache, `export`); a live holder, or a
    dir that cannot be written, is a one-line ``ConfigError`` naming ``field`` (the command's argument)."""
    from loopscale.errors import ConfigError

    d = Path(run_dir)
    try:
        lock = acquire(d, executor=executor)
    except OSError as exc:
        raise ConfigError(field, f"cannot write {d}: {exc.strerror or exc}", value=str(d)) from None
    if lock is None:
        raise ConfigError(
            field,
            f"{d} is in use by another process ({doing} would mix with it): " + describe(live(d) or {}, d),
            value=str(d),
        )
    with lock:
        yield lock


READERS = ("loopscale eval",)
"""Holders that only add files beside a run (eval's cache): reading the run while they hold it is safe."""


def refuse_if_held(run_dir: Path, *, field: str, doing: str) -> None:
    """For readers of a run's files (export, eval): a run a live process is training may change under them."""
    from loopscale.errors import ConfigError

    info = live(Path(run_dir))
    if info is not None and info.get("executor") not in READERS:
        raise ConfigError(
            field,
            f"{run_dir} is being written now, so {doing} could read a half-made run: " + describe(info, Path(run_dir)),
            value=str(run_dir),
        )
