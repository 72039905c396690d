"""Validation of a fit: does the law predict what it was not fitted on?

* extrapolation: fit the budgets below the highest, predict the highest budget's runs;
* leave-one-r-out: fit without one r, predict that r's runs;
* half split: fit the lower and the upper half of the budgets separately and compare phi
  (arXiv 2604.21106 §5: 0.44 / 0.49). With an odd number of budgets the middle one is in both;
* held out: the first two as one RMSE each, for the free law and for the restricted ones (phi = 0, 1),
  so "phi = 0 is worse" is judged on predictions, not only on R^2 in sample.

Each refit uses the same objective as the main fit, warm-started from its optimum plus ``restarts``
random starts (the 16 best advanced, the 2 best distinct polished). Errors are on raw nats
(prediction - observed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loopscale.fit.law.joint import JointLaw
from loopscale.fit.law.variants import LawVariant
from loopscale.fit.result import Checks, Extrapolation, HalfFit, HalfSplit, HeldOutErrors, LeftOut
from loopscale.fit.table import RunsTable, budget_values


def _refit(law: Any, runs: RunsTable, restarts: int) -> Any | None:
    """The same law (and law variant) refitted on a subset; None when the subset has too few runs."""
    if len(runs.df) <= 6:
        return None
    # Warm-started from the law's optimum: advancing the 16 best screened starts and polishing the 2 best
    # distinct end points is enough (a check uses the best fit only; polishing 8 was 3/4 of its cost).
    clone = law.clone(restarts=restarts, seed=law.seed + 7, advance=16, polish=2)
    return clone.fit(runs, extra_starts=law.theta_[None])


def _errors(law: JointLaw, runs: RunsTable) -> dict[str, Any]:
    """The refit's errors on the held-out runs: how many, RMSE, mean (bias) and worst, nats."""
    df = runs.df
    err = law.predict(df) - df["val_loss"].to_numpy(float)
    return {
        "n": len(df),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "bias": float(np.mean(err)),
        "max_abs": float(np.max(np.abs(err))),
    }


def extrapolation(law: JointLaw | LawVariant, runs: RunsTable, restarts: int = 100) -> Extrapolation | None:
    """Fit every budget below the highest; predict the runs at the highest budget."""
    if not runs.has_budget:
        return None
    C = budget_values(runs.df)
    top = C.max()
    if len(np.unique(C)) < 3:
        return None
    fit = _refit(law, runs.subset(top > C), restarts)
    if fit is None:
        return None
    test = runs.subset(top == C)
    per_r = {str(r): _errors(fit, test.subset(test.df["r"] == r))["rmse"] for r in sorted(set(test.df["r"]))}
    return Extrapolation(held_out_budget=float(top), phi=fit.phi_, **_errors(fit, test), rmse_per_r=per_r)


def leave_one_r_out(law: JointLaw | LawVariant, runs: RunsTable, restarts: int = 100) -> dict[str, LeftOut]:
    """For each r: fit the other r values, predict this one.

    Needs three or more r values: with two, each refit sees a single r, where phi is undetermined (r = 1
    alone) or confounded with A (one looped r alone), so "phi = 0 is worse held out" would mean nothing.
    """
    out: dict[str, LeftOut] = {}
    rs = sorted(set(runs.df["r"]))
    if len(rs) < 3:
        return out
    for r in rs:
        train = runs.subset(runs.df["r"] != r)
        fit = _refit(law, train, restarts)
        if fit is None:
            continue
        out[str(r)] = LeftOut(phi=fit.phi_, **_errors(fit, runs.subset(runs.df["r"] == r)))
    return out


def half_split(law: JointLaw | LawVariant, runs: RunsTable, restarts: int = 100) -> HalfSplit | None:
    """phi from the lower and from the upper half of the budgets."""
    if not runs.has_budget:
        return None
    C = budget_values(runs.df)
    budgets = np.unique(C)
    if len(budgets) < 4:
        return None
    half = (len(budgets) + 1) // 2
    lower, upper = budgets[:half], budgets[-half:]
    halves = {}
    for name, keep in (("lower", lower), ("upper", upper)):
        fit = _refit(law, runs.subset(np.isin(C, keep)), restarts)
        halves[name] = HalfFit(
            budgets=[float(c) for c in keep],
            phi=None if fit is None else fit.phi_,
            r2=None if fit is None else fit.r2_,
        )
    lo, hi = halves["lower"].phi, halves["upper"].phi
    return HalfSplit(**halves, phi_difference=None if lo is None or hi is None else float(hi - lo))


def held_out(extrap: Extrapolation | None, lor: dict[str, LeftOut]) -> HeldOutErrors:
    """Two numbers to compare laws by what they predict: RMSE at the held-out top budget, and the
    RMSE pooled over every leave-one-r-out prediction."""
    pooled = None
    if lor:
        n = sum(x.n or 0 for x in lor.values())
        pooled = float(np.sqrt(sum((x.n or 0) * (x.rmse or 0.0) ** 2 for x in lor.values()) / n))
    return HeldOutErrors(extrapolation_rmse=None if extrap is None else extrap.rmse, leave_one_r_out_rmse=pooled)


def run_checks(law: JointLaw | LawVariant, runs: RunsTable, restarts: int = 100, *, split: bool = True) -> Checks:
    """Every check of one law; ``split = False`` skips the half split (restricted fits: phi is fixed)."""
    extrap, lor = extrapolation(law, runs, restarts), leave_one_r_out(law, runs, restarts)
    return Checks(
        extrapolation=extrap,
        leave_one_r_out=lor,
        half_split=half_split(law, runs, restarts) if split else None,
        held_out=held_out(extrap, lor),
    )
