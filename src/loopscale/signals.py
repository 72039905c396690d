"""The one signal handler of loopscale: the trainer and the local sweep executor both stop through it.

A signal only sets a flag (``caught``) that the owner checks at a safe point (between steps, between
evaluation batches, between runs); ``on_signal`` lets the owner react at once as well (forward the
signal to workers, stop a sweep between runs, turn a second Ctrl-C into KeyboardInterrupt).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
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

    def __init__(self, signals: tuple[int, ...] = STOP,
                 on_signal: Callable[[int, bool], None] | None = None) -> None:
        self.signals = signals
        self.on_signal = on_signal
        self.caught: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.caught is None
        self.caught = signum
        if self.on_signal is not None:
            self.on_signal(signum, first)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            # Once a stop was caught the process is winding down (checkpoint, events, lock): a repeated stop
            # signal must not kill it half-way, as a default action would. Repeats come: a tethered sweep
            # worker gets SIGTERM once per thread of its killed sweep (the kernel re-sends PR_SET_PDEATHSIG
            # each time the thread it was handed to exits), and SLURM repeats its SIGTERM.
            signal.signal(sig, _ignore_repeat if self.caught is not None and old == signal.SIG_DFL else old)
        self._old.clear()


def _ignore_repeat(signum: int, frame: Any) -> None:
    """A stop signal after the one already being acted on: nothing more to do."""


def second_ctrl_c_stops_at_once(signum: int, first: bool) -> None:
    """The trainer's ``on_signal``: the first signal waits for the step's end; a second Ctrl-C does not."""
    if not first and signum == signal.SIGINT:
        raise KeyboardInterrupt
