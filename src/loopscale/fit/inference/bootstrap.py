"""Block bootstrap over (budget, r) cells: CIs for every coefficient, Delta-phi between variants.

Why cells, not runs (arXiv 2604.21106 §5): runs in one (budget, r) cell share a budget, a layout
and most of their training stream, so their errors are correlated; the law's information about phi
comes from comparing cells. Resampling whole cells with replacement keeps that structure, and it
is what the paper did (200 resamples, 2.5/97.5 percentiles).

A resample is a vector of multiplicities over the runs, so every refit is the *same* data with
other weights: all draws are fitted together by the batched optimiser (``loopscale.fit.law.solver``). Each draw starts
from the main optimum and the other distinct minima the main fit found (warm starts), plus a few
fresh random starts from the paper's box (so a draw whose optimum moved to another basin can still
find it). :func:`restart_check` compares this with full restarts on a few draws: the warm-started
refits must reach the same optimum, or the CIs would be artificially narrow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from loopscale.fit.law.formula import N_THETA, PHI, LawData
from loopscale.fit.law.solver import Bounds, Screen, lm_batch, multistart, polish_lbfgsb, single_thread
from loopscale.fit.paper import PAPER_HUBER_DELTA, PAPER_LOSS, PAPER_RESTARTS


def cell_counts(n_cells: int, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """(n_draws, n_cells): how often each cell is drawn when n_cells cells are drawn with replacement."""
    picks = rng.integers(0, n_cells, size=(n_draws, n_cells))
    counts = np.zeros((n_draws, n_cells))
    np.add.at(counts, (np.arange(n_draws)[:, None], picks), 1.0)
    return counts


def cell_weights(cells: np.ndarray, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """(n_draws, n_runs) multiplicities: whole cells drawn with replacement (cell id per run)."""
    uniq, inv = np.unique(np.asarray(cells), return_inverse=True)
    return cell_counts(len(uniq), n_draws, rng)[:, inv]


@dataclass
class Refits:
    """Bootstrap refits of one law: theta per draw and whether phi was identifiable in it."""

    theta: np.ndarray  # (B, 6)
    objective: np.ndarray  # (B,)
    converged: np.ndarray  # (B,) bool
    phi_identifiable: np.ndarray  # (B,) bool


#: draws x starts x rows held in memory at once by the batched stage (~100 MB of float64 temporaries).
CHUNK_ELEMENTS = 1_000_000


@single_thread
def refit_batch(
    data: LawData,
    weights: np.ndarray,
    warm: np.ndarray,
    *,
    bounds: Bounds,
    fixed_phi: float | None = None,
    loss: str = PAPER_LOSS,
    delta: float = PAPER_HUBER_DELTA,
    random_starts: int = 8,
    seed: int | np.random.Generator = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Refits:
    """Fit the law once per row of ``weights`` (B, n), streamed in chunks of draws.

    Starts per draw: the ``warm`` points (k, 6) and ``random_starts`` uniform points of the box.
    The batched Levenberg-Marquardt stage runs every start (on the design points when the table is
    large: ``solver.Screen``); the best start of each draw is polished by L-BFGS-B on the exact objective
    over every run. Chunks keep memory bounded (10,000 runs: ~0.3 GB instead of 3.4 GB);
    ``progress(done, B)`` is called after each draw.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    weights = np.asarray(weights, dtype=float)
    B = len(weights)
    bnds, free = bounds.pin_phi(fixed_phi, data.phi_identifiable)
    warm = np.atleast_2d(np.asarray(warm, dtype=float))
    k = len(warm) + random_starts
    starts = np.empty((B, k, N_THETA))
    starts[:, : len(warm)] = warm
    if random_starts:
        starts[:, len(warm) :] = bnds.sample(B * random_starts, rng).reshape(B, random_starts, N_THETA)
    if not free[PHI]:
        starts[..., PHI] = bnds.lower[PHI]
    screen = Screen.of(data)
    sdata = data if screen is None else screen.data
    chunk = max(1, CHUNK_ELEMENTS // (k * len(sdata)))
    out = np.empty((B, N_THETA))
    obj = np.empty(B)
    conv = np.zeros(B, dtype=bool)
    for c0 in range(0, B, chunk):
        sl = slice(c0, min(B, c0 + chunk))
        nb = sl.stop - sl.start
        sw = weights[sl] if screen is None else screen.weights(weights[sl])
        W = np.repeat(sw, k, axis=0)
        ends, f = lm_batch(starts[sl].reshape(nb * k, N_THETA), sdata, W, bnds, free, loss, delta, max_iter=30)
        ends, f = ends.reshape(nb, k, N_THETA), f.reshape(nb, k)
        best = np.argmin(np.where(np.isfinite(f), f, np.inf), axis=1)
        th = ends[np.arange(nb), best]
        th, _ = lm_batch(th, sdata, sw, bnds, free, loss, delta, max_iter=200)
        for j, i in enumerate(range(sl.start, sl.stop)):
            m = polish_lbfgsb(th[j], data, weights[i], bnds, free, loss, delta)
            out[i], obj[i], conv[i] = m.theta, m.objective, m.converged
            if progress is not None:  # per draw: on 10,000 runs each polish is the slow part
                progress(i + 1, B)
    looped = (data.r > 1) & (data.N_rec > 0)
    ident = (weights[:, looped].sum(axis=1) > 0) & free[PHI]
    return Refits(out, obj, conv, ident)


@single_thread
def restart_check(
    data: LawData,
    weights: np.ndarray,
    warm: np.ndarray,
    *,
    bounds: Bounds,
    fixed_phi: float | None = None,
    loss: str = PAPER_LOSS,
    delta: float = PAPER_HUBER_DELTA,
    random_starts: int = 8,
    restarts: int = PAPER_RESTARTS,
    seed: int = 0,
) -> dict[str, float]:
    """Refit a few draws both ways (warm + few random starts vs. full restarts) and compare.

    Returns the largest |phi| difference, the largest objective excess of the warm-started refit
    over the full-restart one (relative), and the number of draws compared.
    """
    fast = refit_batch(
        data,
        weights,
        warm,
        bounds=bounds,
        fixed_phi=fixed_phi,
        loss=loss,
        delta=delta,
        random_starts=random_starts,
        seed=seed,
    )
    dphi, excess = 0.0, 0.0
    for i, w in enumerate(weights):
        full = multistart(
            data,
            weights=w,
            bounds=bounds,
            fixed_phi=fixed_phi,
            loss=loss,
            delta=delta,
            restarts=restarts,
            polish=4,
            seed=seed + 1 + i,
        )[0]
        dphi = max(dphi, abs(float(full.theta[PHI] - fast.theta[i, PHI])))
        excess = max(excess, (fast.objective[i] - full.objective) / max(full.objective, 1e-300))
    return {"draws": len(weights), "max_abs_dphi": dphi, "max_rel_objective_excess": excess}


def percentile_ci(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the finite draws (NaN, NaN if there are none)."""
    x = np.asarray(draws, dtype=float)
    x = x[np.isfinite(x)]
    if not x.size:
        return (float("nan"), float("nan"))
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(x, [tail, 100 - tail])
    return (float(lo), float(hi))
