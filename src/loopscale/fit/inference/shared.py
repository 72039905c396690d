"""Δφ under the shared-law reading: a technique shares E, A, α, B, β with the reference and differs only in φ.

The separate fits (``pipeline``) give each variant its own five coefficients and its own φ; Δφ is their
difference, with the calibrated interval of ``fit.inference.profile``. The shared reading assumes more: one law for
both recipes, the technique moving only how much a recurrence is worth. Written for the variant's runs,

    r^(φ + Δφ) N_rec = r^φ (r^Δφ N_rec),

so at a fixed Δφ the shared fit *is* the reference law fitted to the union of both tables with the
variant's N_rec scaled by r^Δφ: Δφ is profiled (bounded Brent, each step a warm-started batched refit, as
``structure.LoopTaxLaw`` profiles its tax), then the best Δφ gets an L-BFGS-B polish.

Which reading do the data support? The assumption is tested by held-out error: leaving out one of the
variant's (budget, r) cells at a time, both readings are refitted on the rest and predict the cell; the
shared reading is contradicted when it predicts the held-out cells worse than the separate fits by more
than two standard errors of the per-cell difference; otherwise the simpler reading stands. Its Δφ carries
no calibrated interval here: where it is supported, the separate fits' calibrated interval is the one to
quote (docs/fit.md, "Δφ").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from loopscale.fit.law.formula import LawData, predict, theta_to_params
from loopscale.fit.law.joint import JointLaw
from loopscale.fit.law.solver import lm_batch, multistart, polish_lbfgsb, single_thread
from loopscale.fit.result import LossGap, SharedHeldOut, SharedReading

DELTA_BOUNDS = (-2.0, 2.0)


def _scaled(data: LawData, is_variant: np.ndarray, d: float) -> LawData:
    """The variant's runs with N_rec scaled by r^d: the reference law on these is the shared law at Δφ = d."""
    scale = np.where(is_variant, np.exp(d * data.log_r), 1.0)
    return dataclasses.replace(data, N_rec=data.N_rec * scale)


@dataclasses.dataclass
class SharedFit:
    delta_phi: float
    phi: float
    theta: np.ndarray
    objective: float
    converged: bool
    at_bound: bool


@single_thread
def fit_shared(
    ref: pd.DataFrame, var: pd.DataFrame, law: JointLaw, bounds: tuple[float, float] = DELTA_BOUNDS
) -> SharedFit:
    """The shared law on the reference's runs and the variant's own runs (its shared r = 1 runs are the
    reference's, so they enter once)."""
    from scipy.optimize import minimize_scalar

    df = pd.concat([ref, var], ignore_index=True)
    is_var = np.r_[np.zeros(len(ref), bool), np.ones(len(var), bool)]
    data = LawData.from_frame(df)
    b = law.bounds()
    free = np.ones(len(b.lower), dtype=bool)
    first = multistart(
        _scaled(data, is_var, 0.0),
        bounds=b,
        fixed_phi=None,
        loss=law.loss,
        delta=law.delta,
        restarts=law.restarts,
        polish=4,
        advance=16,
        seed=law.seed,
    )
    fixed = np.vstack([[m.theta for m in first], b.sample(12, np.random.default_rng(law.seed + 5))])
    warm = [first[0].theta]
    ones = np.ones((1, len(data)))

    def profile(d: float) -> float:
        starts = np.vstack([warm[-1:], fixed])
        ends, f = lm_batch(starts, _scaled(data, is_var, d), ones, b, free, law.loss, law.delta, max_iter=60)
        k = int(np.argmin(f))
        warm.append(ends[k])
        return float(f[k])

    res = minimize_scalar(profile, bounds=bounds, method="bounded", options={"xatol": 1e-4})
    d = float(res.x)
    best = polish_lbfgsb(warm[-1], _scaled(data, is_var, d), ones[0], b, free, law.loss, law.delta)
    span = bounds[1] - bounds[0]
    return SharedFit(
        delta_phi=d,
        phi=float(theta_to_params(best.theta)["phi"]),
        theta=best.theta,
        objective=float(best.objective),
        converged=bool(best.converged),
        at_bound=min(d - bounds[0], bounds[1] - d) < 1e-3 * span,
    )


def _predict(theta: np.ndarray, df: pd.DataFrame, d: float = 0.0) -> np.ndarray:
    r = df["r"].to_numpy(dtype=float)
    return predict(theta, df["N_once"].to_numpy(float), df["N_rec"].to_numpy(float) * r**d, df["D"].to_numpy(float), r)


def _untested(cells: int, why: str) -> SharedHeldOut:
    return SharedHeldOut(cells=cells, shared_rmse=None, separate_rmse=None, supported=None, note=why)


def held_out(ref: pd.DataFrame, var: pd.DataFrame, law: JointLaw) -> SharedHeldOut:
    """Leave-one-variant-cell-out RMSE (nats) of the shared and the separate readings, and which is better."""
    cells = sorted({(float(c), int(r)) for c, r in zip(var["C"], var["r"], strict=True)})
    if len(cells) < 2:
        return _untested(len(cells), "fewer than two variant cells: no held-out test")
    quick = law.clone(restarts=max(20, law.restarts // 5))
    per_cell: list[tuple[float, float, int]] = []  # summed squared errors of each reading, runs in the cell
    for c, r in cells:
        out = (var["C"] == c) & (var["r"] == r)
        train, test = var[~out], var[out]
        own = pd.concat([ref[ref["r"] == 1], train], ignore_index=True)  # the variant's own law (with r = 1)
        if len(own) <= 6:
            return _untested(len(cells), "too few runs to refit the variant's own law with a cell left out")
        sh = fit_shared(ref, train, quick)
        sep = quick.clone().fit(own)
        y = test["val_loss"].to_numpy(float)
        per_cell.append(
            (
                float(np.sum((_predict(sh.theta, test, sh.delta_phi) - y) ** 2)),
                float(np.sum((sep.predict(test) - y) ** 2)),
                len(test),
            )
        )
    e_sh, e_sep, n = (np.array(col, dtype=float) for col in zip(*per_cell, strict=True))
    shared_rmse, sep_rmse = float(np.sqrt(e_sh.sum() / n.sum())), float(np.sqrt(e_sep.sum() / n.sum()))
    diff = e_sh - e_sep  # per held-out cell: how much worse the shared reading predicts it
    se = float(np.std(diff, ddof=1) / np.sqrt(len(diff)))
    worse = float(np.mean(diff)) > 2 * se
    return SharedHeldOut(
        cells=len(cells),
        shared_rmse=shared_rmse,
        separate_rmse=sep_rmse,
        mean_excess_sq_error=float(np.mean(diff)),
        se=se,
        supported="separate" if worse else "shared",
        note="leave-one-variant-cell-out errors; 'separate' when the shared law predicts the held-out cells "
        "worse by more than 2 standard errors of the per-cell difference, else 'shared' (the "
        "simpler reading is not contradicted)",
    )


def shared_record(ref: pd.DataFrame, var: pd.DataFrame, law: JointLaw, *, checks: bool = True) -> SharedReading:
    """What the fit file stores under ``delta_phi[i].shared``."""
    fit = fit_shared(ref, var, law)
    return SharedReading(
        assumption="the variant shares E, A, alpha, B, beta with the reference and differs only in phi",
        delta_phi=fit.delta_phi,
        phi_reference=fit.phi,
        phi_variant=fit.phi + fit.delta_phi,
        objective=fit.objective,
        converged=fit.converged,
        at_bound=fit.at_bound,
        interval=None,
        interval_note="not calibrated for the shared reading; quote the separate fits' "
        "calibrated interval (delta_phi[i].ci) where this reading is supported",
        held_out=held_out(ref, var, law) if checks else None,
    )


MATCH = ("C", "r", "d_model", "seed")


def loss_gap(ref: pd.DataFrame, var: pd.DataFrame, level: float = 0.95) -> LossGap | None:
    """The variant's val loss minus the reference's on the same looped runs (budget, r, width, seed).

    The paper reads truncated BPTT by this beside Δφ (arXiv 2604.21106 §5): at equal compute its loss is
    lower while φ falls - the cheaper backward buys tokens, not capacity per repeat. Pairs are averaged over
    seeds per (C, r, d_model) cell and the interval is a t interval over cells (cells as independent units).
    A table of seed means (``n_seeds``) is paired per cell, its rows already being means over the seeds.
    None when the tables cannot be matched (no d_model/seed columns, or fewer than two shared cells).
    """
    from scipy import stats

    seed_means = "n_seeds" in ref.columns and "n_seeds" in var.columns
    keys = list(MATCH[:3] if seed_means else MATCH)
    if any(c not in ref.columns or c not in var.columns for c in keys):
        return None
    count = ["n_seeds"] if seed_means else []
    a, b = ref[ref["r"] > 1], var[var["r"] > 1]
    pairs = a[[*keys, "val_loss"]].merge(b[[*keys, "val_loss", *count]], on=keys, suffixes=("_ref", "_var"))
    if pairs.empty:
        return None
    pairs = pairs.assign(diff=pairs["val_loss_var"] - pairs["val_loss_ref"])
    per_cell = pairs.groupby(["C", "r", "d_model"], sort=True)["diff"].mean()
    n = int(per_cell.size)
    if n < 2:
        return None
    mean, se = float(per_cell.mean()), float(per_cell.std(ddof=1) / np.sqrt(n))
    q = float(stats.t.ppf(0.5 + level / 2, n - 1))
    per_budget = pairs.groupby("C", sort=True)["diff"].mean()
    n_runs = int(pairs["n_seeds"].sum()) if seed_means else len(pairs)  # the variant's runs behind the pairs
    return LossGap(
        mean=mean,
        ci=[mean - q * se, mean + q * se],
        level=level,
        n_runs=n_runs,
        n_cells=n,
        per_budget={f"{c:.6g}": float(v) for c, v in per_budget.items()},
        lower_in_cells=float(np.mean(per_cell.to_numpy() < 0)),
    )
