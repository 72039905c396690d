"""Sweep progress: one overall bar (runs done / total, FLOPs done / total, ETA) and a bar per active run.

With parallel slots every active run has its bar, labelled with its slot (``slot 2  C3e+11_r4_...``),
so a glance shows what each slot trains, at which step, and for how long.

The overall bar advances in FLOPs, so its ETA is the remaining FLOPs over this session's FLOP rate.
A line is also printed when a run ends (readable in logs and SLURM output, where bars are not drawn).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class SweepProgress:
    def __init__(
        self,
        console: Console,
        *,
        total_runs: int,
        total_flops: float,
        done_runs: int = 0,
        done_flops: float = 0.0,
        enabled: bool = True,
    ) -> None:
        self.console = console
        self.total_runs, self.total_flops = total_runs, max(total_flops, 1.0)
        self.done_runs = done_runs
        self._done = done_flops
        self._p = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not enabled,
        )
        # rich annotates add_task's ``completed`` as int; the task keeps it as a float (as update() takes it)
        self._overall = self._p.add_task(
            "sweep",
            total=self.total_flops,
            completed=done_flops,  # type: ignore[arg-type]
            info=self._info(),
        )
        # run_id -> (bar, planned FLOPs, total steps, FLOPs credited so far)
        self._runs: dict[str, tuple[TaskID, float, int, float]] = {}

    def _info(self) -> str:
        return f"{self.done_runs}/{self.total_runs} runs, {self._done:.3g}/{self.total_flops:.3g} FLOPs"

    def __enter__(self) -> SweepProgress:
        self._p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._p.__exit__(*exc)

    def _credit(self, flops: float) -> None:
        self._done += flops
        self._p.update(self._overall, completed=self._done, info=self._info())

    def start_run(
        self, run_id: str, flops: float, total_steps: int, start_step: int = 0, slot: int | None = None
    ) -> None:
        """A bar for a run; ``flops`` is its planned total, ``start_step`` where a resume starts, ``slot`` the
        parallel slot (0-based) that trains it, if any."""
        label = escape(run_id) if slot is None else f"slot {slot + 1}  {escape(run_id)}"
        task = self._p.add_task(label, total=max(total_steps, 1), completed=0, info="")
        self._runs[run_id] = (task, flops, max(total_steps, 1), 0.0)
        if start_step:
            self.step(run_id, start_step, total_steps)

    def step(self, run_id: str, step: int, total: int) -> None:
        if run_id not in self._runs:
            self.start_run(run_id, 0.0, total)
        task, flops, steps, credited = self._runs[run_id]
        target = flops * min(step, steps) / steps
        self._p.update(task, completed=step, total=total, info=f"step {step}/{total}")
        if target > credited:
            self._credit(target - credited)
            self._runs[run_id] = (task, flops, steps, target)

    def end_run(self, run_id: str, outcome: str, message: str) -> None:
        """Remove the run's bar; a terminal outcome counts the run and all its FLOPs as done."""
        task, flops, _steps, credited = self._runs.pop(run_id, (None, 0.0, 1, 0.0))
        if task is not None:
            self._p.remove_task(task)
        if outcome in ("done", "diverged", "failed", "gave-up"):
            self.done_runs += 1
            self._credit(flops - credited)
        else:  # retry / interrupted: its FLOPs are still to do
            self._credit(-credited)
        self.console.print(f"[{self.done_runs}/{self.total_runs}] {message}", highlight=False, markup=False)


def duration(s: float | None) -> str:
    """A time span as people plan with it: "45 s", "12.5 min", "3.2 h" ("-" when unknown)."""
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
