"""Sweep executors behind one interface: what trains a sweep's runs (this machine, SLURM, ...).

An executor is an ``Executor`` subclass in its own module; ``EXECUTORS`` registers it under a name,
which is both ``loopscale sweep run --executor NAME`` and the spec's ``[NAME]`` table (validated
with the executor's ``Settings`` when the spec loads). A new executor is one new file plus one line
here (docs/extending.md).

Entries are ``"module:Class"`` strings imported on first use, as entry points are: the spec, which
the executors build on (they read RunSpecs and the sweep store), names and validates them without
importing them, so the package's imports stay free of circles; and an executor whose dependency
cannot be imported (submitit) fails only when it is asked for, in one line.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from loopscale.config import StrictModel, validate
from loopscale.errors import ConfigError, LoopscaleError

if TYPE_CHECKING:
    from rich.console import Console

    from loopscale.sweep.runspec import RunSpec
    from loopscale.sweep.store import SweepStore

#: name -> the executor: a "module:Class" string (imported when used) or the class itself.
EXECUTORS: dict[str, str | type[Executor]] = {
    "local": "loopscale.sweep.local:LocalExecutor",
    "slurm": "loopscale.sweep.slurm:SlurmExecutor",
}


class SweepIncomplete(LoopscaleError):
    """Some runs failed; the others finished (exit status 1)."""

    exit_code = 1


class SweepBusy(LoopscaleError):
    """No run failed, but some are held by another live process and were not run (exit status 3)."""

    exit_code = 3


class SubmitFailed(LoopscaleError):
    """A scheduler refused a submission (exit status 1)."""

    exit_code = 1


class ExecutorUnavailable(ConfigError):
    """The executor's module cannot be imported (a missing dependency); other executors still work."""


@dataclass
class SweepJob:
    """What ``loopscale sweep run`` hands an executor: the runs to train and how.

    ``options`` holds the command-line flags that were given (``isolate``, ``gpus``, ``nproc_per_run``,
    ``slots``, ``cluster``, ``resubmit_queued``; a flag left out is absent or None): each executor takes
    the ones it knows, over its ``table`` (the spec's ``[NAME]`` table, from ``source``).
    """

    name: str  # the sweep's
    store: SweepStore
    runs: list[RunSpec]
    flops: dict[str, float]  # planned FLOPs of each run: progress, time limits
    max_retries: int
    console: Console
    table: dict[str, Any] = field(default_factory=dict)
    source: str = "spec"
    options: dict[str, Any] = field(default_factory=dict)
    progress: bool = True

    def option(self, key: str, default: Any = None) -> Any:
        """A flag's value, or ``default`` when it was not given."""
        value = self.options.get(key)
        return default if value is None else value


class Executor(ABC):
    """Trains (or submits) a sweep's runs. Every executor goes through ``attempt.execute_run`` for each run
    (lock, attempts, failure records), so results never depend on the executor."""

    #: the registered name (``--executor``, the spec's table)
    name: ClassVar[str]
    #: the spec's ``[name]`` table; typos fail when the spec loads
    Settings: ClassVar[type[StrictModel]]

    def settings(self, table: dict[str, Any], source: str) -> Any:
        """The validated ``[name]`` table (a ConfigError names the file and the key)."""
        return validate(self.Settings, table, source=source, prefix=self.name)

    @abstractmethod
    def launch(self, job: SweepJob) -> None:
        """Train or submit every runnable run of ``job``, reporting on ``job.console``.

        Finished runs are skipped and interrupted ones resume (``attempt.runnable``); raise SweepIncomplete
        when runs failed, SweepBusy when another process holds some, SubmitFailed when a scheduler refused.
        """

    def plan_note(self, settings: Any, total_flops: float) -> str | None:
        """A line (rich markup) for ``sweep plan`` when the spec has this executor's table, or None."""
        return None


def names() -> list[str]:
    """The registered executors' names, in registration order."""
    return list(EXECUTORS)


def register(name: str, executor: str | type[Executor]) -> None:
    """Register ``executor`` (a class or a "module:Class" string) as ``name``; a later one replaces it."""
    EXECUTORS[name] = executor


def get(name: str) -> Executor:
    """The executor registered as ``name``. ConfigError (field ``--executor``) for an unknown name,
    ExecutorUnavailable when its module cannot be imported."""
    entry = EXECUTORS.get(name)
    if entry is None:
        raise ConfigError("--executor", f"expected {_choices()}", value=name)
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        try:
            entry = getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            missing = exc.name or "a dependency"
            others = " or ".join(n for n in EXECUTORS if n != name)
            raise ExecutorUnavailable(
                "--executor",
                f"{name} needs {missing}, which cannot be imported ({exc}); "
                f"pip install {missing}" + (f", or use --executor {others}" if others else ""),
            ) from None
    return entry()


def check_tables(data: dict[str, Any], source: str) -> None:
    """Validate every executor's table of a spec (``data``), so a typo fails at load, not at submit.

    An executor that cannot be imported is not checked: the others still work, and asking for it says why.
    """
    for name in EXECUTORS:
        try:
            ex = get(name)
        except ExecutorUnavailable:
            continue
        ex.settings(data.get(name) or {}, source)


def _choices() -> str:
    *head, last = EXECUTORS
    return f"{', '.join(head)} or {last}" if head else last
