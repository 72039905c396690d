"""Planning: at budget C, which (r, width, tokens) does the law recommend, and at what loss?

For each r the law-based compute-optimal width (``allocation.law_frontier``) is rounded to a width the
template allows (a multiple of ``head_dim``; both neighbours are tried and the lower predicted
loss wins); tokens are ``D = C / F`` with F from ``loopscale.accounting`` for that exact model.
The loss CI comes from the fit file's bootstrap draws (the law evaluated at the recommended model
for every draw). With the paper's published coefficients there are no draws: the range shown is
the loss when phi spans its published CI with the other coefficients held (labelled so).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loopscale import accounting, grids
from loopscale.fit.allocation import law_frontier, template_config, valid_rs
from loopscale.fit.inference.bootstrap import percentile_ci
from loopscale.fit.law.formula import Slot
from loopscale.fit.law.formula import predict as predict_theta
from loopscale.fit.law.joint import JointLaw


def plan(
    budget: float,
    *,
    law: JointLaw,
    template: dict[str, Any] | None = None,
    draws: np.ndarray | None = None,
    rs: list[int] | None = None,
    tokens_per_step: int = grids.PAPER_TOKENS_PER_STEP,
    ci_level: float = 0.95,
    phi_ci: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """One recommendation per r (rows sorted by r); see the module docstring."""
    template = dict(grids.PAPER_MODEL if template is None else template)
    rs = valid_rs(template, list(rs or grids.PAPER_R))
    if law.phi_undetermined:
        rs = [r for r in rs if r == 1]
    head = int(template.get("head_dim", 128))
    rows = []
    for r in rs:
        fr = law_frontier(law.theta_, template, [budget], r)
        d_cont = float(fr["d"][0])
        k = max(1, int(np.floor(d_cont / head)))
        best = None
        for width in sorted({k * head, (k + 1) * head}):
            cfg = template_config(template, r, width)
            D = accounting.tokens_for_budget(cfg, budget)
            loss = float(law.predict(accounting.N_once(cfg), accounting.N_rec(cfg), D, r))
            if best is None or loss < best[0]:
                best = (loss, cfg, D)
        assert best is not None
        loss, cfg, D = best
        n_once, n_rec = accounting.N_once(cfg), accounting.N_rec(cfg)
        row: dict[str, Any] = {
            "r": r,
            "layout": cfg.layout,
            "d_model": cfg.width,
            "s": cfg.width // 64 if cfg.width % 64 == 0 else None,
            "d_opt_continuous": d_cont,
            "N_once": n_once,
            "N_rec": n_rec,
            "N_unique": n_once + n_rec,
            "N_eq": float(law.equivalent_N(n_once, n_rec, r)),
            "N_cost": float(law.cost_equivalent_N(n_once, n_rec, r)),
            "flops_per_token": accounting.train_flops_per_token(cfg),
            "D": D,
            "tokens_per_param": D / (n_once + n_rec),
            "steps": accounting.steps_for_budget(cfg, budget, tokens_per_step),
            "loss": loss,
            "loss_ci": None,
            "ci_kind": None,
        }
        if draws is not None and len(draws):
            row["loss_ci"] = percentile_ci(predict_theta(draws, n_once, n_rec, D, r), ci_level)
            row["ci_kind"] = f"bootstrap {ci_level:.0%}"
        elif phi_ci is not None and r > 1:
            t = np.repeat(law.theta_[None], 2, axis=0)
            t[:, Slot.PHI] = phi_ci
            ends = predict_theta(t, n_once, n_rec, D, r)
            row["loss_ci"] = (float(ends.min()), float(ends.max()))
            row["ci_kind"] = "phi CI only"
        rows.append(row)
    base = next((row["loss"] for row in rows if row["r"] == 1), None)
    for row in rows:
        row["gap_to_r1"] = None if base is None else row["loss"] - base
    return rows
