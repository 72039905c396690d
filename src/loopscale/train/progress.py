"""Progress of one run on stderr: a rich bar on a terminal, a plain line every few steps in a log (docs/training.md,
"Progress")."""

from __future__ import annotations

import time
from typing import Any


class ProgressBar:
    """Progress of a run on stderr: a rich bar with loss and ETA on a terminal; elsewhere (a log file, a pipe,
    a batch job) a plain line every ``every`` steps (default: every 5 % of the run) with the step, loss,
    tokens/s and ETA, as people tail logs. No-op when disabled."""

    def __init__(
        self, enabled: bool, total: int, start: int, name: str, *, every: int | None = None, tokens_per_step: int = 0
    ) -> None:
        from loopscale.console import err_console

        self.enabled, self.total, self.start, self.done = enabled, total, start, start
        self.live = enabled and err_console.is_terminal
        self.every = max(1, every or -(-total // 20))
        self.tokens_per_step = tokens_per_step
        self._console = err_console
        self._t0 = self._t_last = time.time()
        self._last_step = start
        if self.live:
            from rich.markup import escape
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._p = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("loss {task.fields[loss]}"),
                TimeRemainingColumn(),
                console=err_console,
                transient=True,
            )
            self._task = self._p.add_task(escape(name), total=total, completed=start, loss="-")
        elif enabled:
            resumed = f", resuming at step {start}" if start else ""
            self._say(f"{name}: {total} steps of {tokens_per_step:,} tokens{resumed}; a line every {self.every} steps")

    def __enter__(self) -> ProgressBar:
        if self.live:
            self._p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self._p.__exit__(*exc)

    def advance(self, loss: float) -> None:
        self.done += 1
        if self.live:
            self._p.update(self._task, advance=1, loss=f"{loss:.3f}")
        elif self.enabled and (self.done % self.every == 0 or self.done == self.total):
            self._say(self.line(loss, time.time()))

    def line(self, loss: float, now: float) -> str:
        """``step 40/200 (20%) loss 3.215 | 51,200 tok/s | elapsed 12s | ETA 48s``."""
        steps = self.done - self._last_step
        window = max(now - self._t_last, 1e-9)
        per_step = (now - self._t0) / max(self.done - self.start, 1)
        self._t_last, self._last_step = now, self.done
        return (
            f"step {self.done}/{self.total} ({100 * self.done / max(self.total, 1):.0f}%) loss {loss:.4f} | "
            f"{steps * self.tokens_per_step / window:,.0f} tok/s | elapsed {hms(now - self._t0)} | "
            f"ETA {hms(per_step * (self.total - self.done))}"
        )

    def note(self, text: str) -> None:
        """A stage worth a line in a log (the final evaluation can take minutes)."""
        if self.enabled and not self.live:
            self._say(text)

    def _say(self, text: str) -> None:
        self._console.print(text, highlight=False, markup=False, soft_wrap=True)


def hms(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")
