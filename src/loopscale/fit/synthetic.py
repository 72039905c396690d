"""Synthetic runs tables drawn from the joint law on the paper's 116-run grid.

The recovery tests and the benchmark use these; a user can use them to see how well a planned grid
identifies phi before training anything. Parameter counts and FLOPs per token come from
``loopscale.accounting`` (the paper's template, ``grids.PAPER_MODEL``), so ``D = C / F`` exactly
as the sweep would train.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from loopscale import accounting, grids
from loopscale.config import ModelConfig
from loopscale.fit.law.formula import params_to_theta
from loopscale.fit.law.formula import predict as predict_theta
from loopscale.fit.paper import PAPER_COEFFICIENTS


def paper_grid_table(
    template: dict[str, Any] | None = None, grid: list[tuple[float, int, int]] | None = None
) -> pd.DataFrame:
    """One row per run of the grid (default: the paper's 116) with the accounting's N_once, N_rec, D."""
    template = dict(grids.PAPER_MODEL if template is None else template)
    rows = []
    for c, s, r in grid if grid is not None else grids.paper_grid():
        cfg = ModelConfig(**{**template, "s": s, "r": r})
        a = accounting.account(cfg, budget=c)
        rows.append(
            {
                "run_id": f"C{c:.3g}_s{s}_r{r}",
                "C": c,
                "s": s,
                "d_model": a.d_model,
                "r": r,
                "N_once": a.N_once,
                "N_rec": a.N_rec,
                "D": a.tokens,
                "flops_per_token": a.flops_per_token,
            }
        )
    return pd.DataFrame(rows)


def synthetic_runs(
    phi: float = PAPER_COEFFICIENTS["phi"],
    *,
    sigma: float = 0.01,
    seed: int = 0,
    coefficients: dict[str, float] | None = None,
    variant: str = "baseline",
    table: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """val_loss = law(N_once, N_rec, D, r) + N(0, sigma^2) nats on the grid (default: paper's)."""
    coef = {**PAPER_COEFFICIENTS, **(coefficients or {}), "phi": phi}
    df = (paper_grid_table() if table is None else table).copy()
    theta = params_to_theta(coef)
    clean = predict_theta(theta, df["N_once"], df["N_rec"], df["D"], df["r"])
    rng = np.random.default_rng(seed)
    df["val_loss"] = clean + sigma * rng.standard_normal(len(df))
    df["variant"] = variant
    df["status"] = "ok"
    return df
