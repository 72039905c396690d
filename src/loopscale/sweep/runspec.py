"""One planned run of a sweep: its place in the grid (budget, r, width, variant, seed) and its exact TrainConfig.

Below the spec that expands into it and the store that writes it as each run dir's sweep.json, so that the
executors, the store and the planners read the same record without importing the spec (docs/sweep.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loopscale.config import validate
from loopscale.train.settings import TrainConfig


def budget_label(c: float) -> str:
    return f"{c:.6g}"


def run_id_for(C: float, r: int, d_model: int, variant: str, seed: int) -> str:
    return f"C{budget_label(C)}_r{r}_d{d_model}_{variant}_s{seed}"


@dataclass(frozen=True)
class RunSpec:
    """One planned run: its place in the grid and its fully resolved TrainConfig."""

    run_id: str
    variant: str
    seed: int
    C: float
    r: int
    d_model: int
    config: TrainConfig

    def meta(self) -> dict[str, Any]:
        """What ``runs/<run_id>/sweep.json`` holds: the grid coordinates and the exact config."""
        return {
            "run_id": self.run_id,
            "variant": self.variant,
            "seed": self.seed,
            "C": self.C,
            "r": self.r,
            "d_model": self.d_model,
            "config": self.config.model_dump(mode="json"),
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any], source: str = "sweep.json") -> RunSpec:
        cfg = validate(TrainConfig, meta["config"], source=source)
        return cls(
            meta["run_id"],
            meta["variant"],
            int(meta["seed"]),
            float(meta["C"]),
            int(meta["r"]),
            int(meta["d_model"]),
            cfg,
        )
