"""Optional experiment tracking (extra ``[track]``): wandb or tensorboard, off by default.

metrics.jsonl is always written; a tracker only mirrors the same records, the final validation included.
W&B: the project and entity come from ``run.wandb_project`` / ``run.wandb_entity``, else wandb's own
``WANDB_PROJECT`` / ``WANDB_ENTITY`` (project default ``loopscale``). The run id is random, stored in the run
dir (``wandb_id``), so a resumed run continues its W&B run and two sweeps with the same run names never
share one. A sweep's run (``sweep.json`` beside it) is grouped by sweep and tagged with budget, r and variant.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tomllib
from pathlib import Path
from typing import Any

from loopscale.errors import ConfigError

WANDB_ID = "wandb_id"


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


def run_id(run_dir: Path) -> str:
    """The run's W&B id: ``<dir name>-<8 random hex>``, made once and kept in ``<run_dir>/wandb_id``."""
    from loopscale.io import atomic_write_text

    path = run_dir / WANDB_ID
    if path.exists():
        stored = path.read_text(encoding="utf-8").strip()
        if stored:
            return stored
    new = f"{re.sub(r'[^A-Za-z0-9_-]', '-', run_dir.name)[:48]}-{secrets.token_hex(4)}"
    atomic_write_text(path, new + "\n")
    return new


def sweep_labels(run_dir: Path) -> tuple[str | None, list[str]]:
    """(group, tags) of a sweep's run: the sweep's name; ``C=<budget>``, ``r=<r>``, ``variant=<v>``.

    A sweep writes ``<sweep>/runs/<id>/sweep.json`` (the run's grid coordinates) and ``<sweep>/spec.toml``;
    a run outside a sweep has neither: no group, no tags.
    """
    try:
        meta = json.loads((run_dir / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, []
    sweep_dir = run_dir.parent.parent
    try:
        name = tomllib.loads((sweep_dir / "spec.toml").read_text(encoding="utf-8"))["sweep"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        name = sweep_dir.name
    tags = [f"C={float(meta['C']):.3g}", f"r={meta['r']}", f"variant={meta['variant']}"] if "C" in meta else []
    return str(name), tags


class _Wandb(Tracker):
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        run = config.get("run", {})
        project = run.get("wandb_project") or os.environ.get("WANDB_PROJECT") or "loopscale"
        entity = run.get("wandb_entity") or os.environ.get("WANDB_ENTITY") or None
        group, tags = sweep_labels(run_dir)
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=run_dir.name,
            dir=str(run_dir),
            config=config,
            resume="allow",
            id=run_id(run_dir),
            group=group,
            tags=tags or None,
        )

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
        raise ConfigError("run.track", f"{kind} is not installed; pip install 'loopscale[track]'", value=kind) from None
