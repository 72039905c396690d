"""Optional experiment tracking (extra ``[track]``): wandb or tensorboard, off by default.

metrics.jsonl is always written; a tracker only mirrors the same records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loopscale.errors import ConfigError


class Tracker:
    def log(self, record: dict[str, Any]) -> None:
        """Mirror one metrics record (no-op when tracking is off)."""

    def close(self) -> None:
        """Flush and close (no-op when tracking is off)."""


class _TensorBoard(Tracker):
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(log_dir=str(run_dir / "tb"))

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for k, v in record.items():
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class _Wandb(Tracker):
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project="loopscale", name=run_dir.name, dir=str(run_dir), config=config,
                              resume="allow", id=run_dir.name)

    def log(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if k != "step"}, step=int(record.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


def make_tracker(kind: str, run_dir: Path, config: dict[str, Any]) -> Tracker:
    if kind == "none":
        return Tracker()
    try:
        return _TensorBoard(run_dir) if kind == "tensorboard" else _Wandb(run_dir, config)
    except ImportError:
        raise ConfigError("run.track", f"{kind} is not installed; pip install 'loopscale[track]'",
                          value=kind) from None
