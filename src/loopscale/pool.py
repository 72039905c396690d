"""Worker processes that stop with their parent: Ctrl-C ends a pool at once, and no worker outlives it.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, the workers as well as the parent;
``kill -INT PID`` (a script, a scheduler) reaches the parent alone; SIGKILL gives the parent no chance to
clean up. A plain ``ProcessPoolExecutor`` handles none of these: its workers turn SIGINT into an exception
that they report as the job's result and go on to the next job, its parent waits in ``shutdown`` for every
queued job (a minute of `loopscale design` after the Ctrl-C), a second Ctrl-C leaves parent and workers
deadlocked on the pool's queues, and a killed parent leaves its workers orphaned and blocked for ever,
holding the caller's stdout and stderr (a script that reads them hangs). :func:`process_pool` instead:

* its workers ignore SIGINT (the parent decides) and die with their parent (:func:`tie_to_parent`:
  ``PR_SET_PDEATHSIG`` on Linux, a thread watching the parent's pid elsewhere), whatever kills it;
* the parent leaving its block by an exception (KeyboardInterrupt from SIGINT, a failing job) kills the
  workers, drops the queued jobs and joins what remains: well under a second, then the exception goes on
  (``run_app`` turns KeyboardInterrupt into exit status 130).

Workers hold no state worth saving (a job is a pure function of its arguments), so killing them loses
only the jobs in flight. The sweep's workers, which do hold state (a run's checkpoint), stop another way:
the signal is forwarded to them and the trainer checkpoints (``loopscale.sweep.local``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from loopscale.signals import ctrl_c_ignored, pool_worker

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def tie_to_parent(parent: int, signum: int = signal.SIGKILL) -> bool:
    """This process gets ``signum`` when ``parent`` (its parent's pid) dies; it exits now if that already happened.

    On Linux the kernel sends it (``PR_SET_PDEATHSIG``; it fires when the *thread* that started this process
    ends, so start workers from a thread that lives as long as they should); elsewhere a daemon thread
    checks the parent's pid twice a second. Returns whether the kernel took it.
    """
    tied = False
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            tied = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum)) == 0
    if os.getppid() != parent:  # the parent died before the tie was made
        os._exit(128 + int(signum))
    if not tied:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signum)

        threading.Thread(target=watch, name="loopscale-parent-watch", daemon=True).start()
    return tied


def _worker_start(parent: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    """Every pool worker's first act: SIGINT ignored, SIGTERM at its default (``signals.pool_worker``), tied
    to the parent."""
    pool_worker()
    tie_to_parent(parent)
    if initializer is not None:
        initializer(*initargs)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Kill the workers, cancel the queued jobs and join the pool's threads and processes (no job is waited for)."""
    with ctrl_c_ignored():
        # The executor has no public terminate(): its process table is the one handle on the workers.
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                proc.kill()
        # The pool's manager thread sees the dead workers, fails the pending futures and joins the rest.
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def process_pool(
    workers: int,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
    *,
    start_method: str | None = None,
) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` of ``workers`` processes that ends at once on an exception (module docstring).

    ``start_method``: default ``fork`` where the platform has it (what the parent has imported, the workers
    have), else ``spawn``. Workers are started from the thread that submits the first job.
    """
    import multiprocessing as mp

    if start_method is None:
        start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp.get_context(start_method),
        initializer=functools.partial(_worker_start, os.getpid(), initializer, tuple(initargs)),
    )
    try:
        yield pool
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
