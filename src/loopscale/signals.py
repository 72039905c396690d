"""The one signal handler of loopscale: the trainer and the local sweep executor both stop through it.

A signal only sets a flag (``caught``) that the owner checks at a safe point (between steps, between
evaluation batches, between runs); ``on_signal`` lets the owner react at once as well (forward the
signal to workers, stop a sweep between runs, turn a second Ctrl-C into KeyboardInterrupt).

Every other disposition loopscale sets is here too: a process pool's workers ignore Ctrl-C (``pool_worker``),
its parent ignores a second one while it stops them (``ctrl_c_ignored``), and an interrupted command exits 130
whatever a further Ctrl-C does while the interpreter winds down (``exit_at_once_on_ctrl_c``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: What preemption and people send: SLURM preempts with SIGTERM, Ctrl-C is SIGINT.
STOP = (signal.SIGTERM, signal.SIGINT)
#: The trainer also takes submitit's warning before a time limit (``--signal=USR2@T``) as a stop.
STOP_OR_WARN = (*STOP, *((signal.SIGUSR2,) if hasattr(signal, "SIGUSR2") else ()))


class StopSignals:
    """Context manager: while inside, ``signals`` set ``caught`` (the last signal number) and call
    ``on_signal(signum, first)``, ``first`` being whether it is the first one caught.

    Installed only in the main thread (Python allows no other); on exit the previous handlers return.
    """

    def __init__(self, signals: tuple[int, ...] = STOP, on_signal: Callable[[int, bool], None] | None = None) -> None:
        self.signals = signals
        self.on_signal = on_signal
        self.caught: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._old[sig] = old = signal.signal(sig, self._handle)
                outer = getattr(old, "__self__", None)
                if isinstance(outer, StopSignals) and outer.caught is not None and self.caught is None:
                    self.caught = outer.caught  # a stop the enclosing handler caught before this one was installed
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.caught is None
        self.caught = signum
        if self.on_signal is not None:
            self.on_signal(signum, first)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def worker_process() -> StopSignals:
    """The outer handler of a process that trains one run for a sweep (``sweep run-one``, a CPU slot's worker).

    The trainer's own handler is restored when it leaves its loop, and the worker still has books to keep
    (the interrupted event, the release of the run's lock). A repeated stop signal must not kill it there,
    as the default action would, and repeats come: a tethered worker gets SIGTERM once per thread of its
    killed sweep (the kernel re-sends ``PR_SET_PDEATHSIG`` each time the thread it was handed to exits).
    Under this handler a repeat only sets a flag; a stop caught before the trainer installs its handler
    reaches the trainer (``__enter__``), which checkpoints at its next step and stops. One caught after the
    run's last step changes nothing: the run's outcome stands (a slot worker then ends with its input).
    """
    return StopSignals(STOP_OR_WARN)


def second_ctrl_c_stops_at_once(signum: int, first: bool) -> None:
    """The trainer's ``on_signal``: the first signal waits for the step's end; a second Ctrl-C does not."""
    if not first and signum == signal.SIGINT:
        raise KeyboardInterrupt


def pool_worker() -> None:
    """The dispositions of a process pool's worker (``loopscale.pool``): SIGINT ignored (a terminal's Ctrl-C
    reaches the whole process group, and the parent decides: it kills its workers), SIGTERM at its default
    (whatever handler the parent had: the worker keeps no books)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def ctrl_c_ignored() -> Iterator[None]:
    """Inside, SIGINT is ignored (main thread only; elsewhere nothing changes): a second Ctrl-C while a first
    one is being acted on (a pool's workers stopped) is not a second interruption."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def exit_at_once_on_ctrl_c(status: int = 130) -> None:
    """From now on a Ctrl-C ends the process with ``status``: for a command that was interrupted and now only
    exits (``loopscale.cli.main``). A second Ctrl-C while the interpreter winds down (threads joined, atexit,
    modules torn down: tenths of a second after `design`) would otherwise raise inside that shutdown or, once
    Python has reset its handler to the default, kill the process by SIGINT (status -2). While threads are
    joined it ends the process at once (nothing can hang it); from the atexit callbacks on it is ignored
    (Python resets a handler of its own before it tears the modules down, but leaves an ignored signal ignored).
    """
    import atexit

    def now(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # (a write under way in the interrupted frame)
                stream.flush()
        os._exit(status)

    signal.signal(signal.SIGINT, now)
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)  # registered last: runs first
