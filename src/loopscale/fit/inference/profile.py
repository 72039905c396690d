"""Calibrated inference for phi and Delta-phi: profile-likelihood intervals and tests whose reference
distribution comes from a wild cluster bootstrap of the likelihood-ratio statistic.

Why not the percentile bootstrap alone (docs/fit.md, "Inference"): a looped study has few (budget, r)
cells (12 in the demo, 29 x 4 in arXiv 2604.21106) and the runs of one cell share an error. Resampling
whole cells with replacement then draws tables without an r = 1 cell or without some r (3% and ~12% of the
demo's draws), and the percentile ends of 200 draws move by more than the margins the claims rest on.
Here the design stays fixed and only the errors are resampled:

* **Statistic.** The profile objective ``P(phi) = min over (E, A, B, alpha, beta) of f`` (``f``: the
  paper's summed Huber loss in log space, ``solver.objective``) and ``T(phi) = P(phi) - min f``, the
  likelihood-ratio statistic of the fitted M-estimator (one parameter restricted).
* **Reference distribution.** Bootstrap tables ``y* = y_hat + v_g e`` where ``y_hat`` is the free fit's
  log prediction, ``e`` each run's residual against the law refitted without the run's cell (the
  jackknife residual: with a dozen cells the fitted residuals understate the cell-shared error, and
  flipping them covered the truth in 80% of simulated demo studies) and ``v_g`` one draw of Webb's
  six-point distribution per
  (budget, r) cell (the wild cluster bootstrap; Webb's weights because Rademacher's two values give
  too few distinct tables with a dozen cells). Every table keeps every cell, the errors within a cell
  stay together and their scale stays each cell's own. In the bootstrap world the truth is ``phi_hat``,
  so ``T*(phi_hat)`` of each table is a draw of T under the null; its level quantile ``c`` is the critical
  value.
* **Interval and tests.** ``{phi : T(phi) <= c}`` (its hull, flagged when the set is not one piece), and
  ``p(phi0) = (1 + #{T* >= T(phi0)}) / (B + 1)``; the two agree by construction: phi0 lies outside the
  interval exactly when the test rejects at the interval's level.
* **Delta-phi** between two separately fitted variants: ``T_D(d) = min over phi of [P_ref(phi) +
  P_v(phi + d)] - both minima`` (the two laws share no coefficient, so the joint profile is a 1-D
  minimisation over the two profiles), calibrated the same way with one cell draw shared by both
  variants (paired: the r = 1 runs both fits use move together).

Monte-Carlo error: the ends move with ``c``; ``mc_sd`` maps the order-statistic band of the quantile
(binomial, +-1 sd) through the profile. The coverage of the whole procedure on the demo's and the
paper's grid is measured by ``bench/inference_coverage.py`` (docs/fit.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from loopscale.fit.inference.bootstrap import percentile_ci
from loopscale.fit.law.formula import N_THETA, PHI, LawData, residuals
from loopscale.fit.law.solver import Bounds, lm_batch, single_thread
from loopscale.fit.result import (
    Bootstrap,
    DeltaInference,
    HeldOutErrors,
    Inference,
    Interval,
    NullTables,
    ProfileCurve,
    Secondary,
    Test,
    VariantFit,
)

#: Webb's six-point distribution: mean 0, variance 1, six values (Webb 2014, "Reworking wild bootstrap
#: based inference for clustered errors").
WEBB = np.array([-np.sqrt(1.5), -1.0, -np.sqrt(0.5), np.sqrt(0.5), 1.0, np.sqrt(1.5)])
#: profile grid step over phi's box (refined to PROFILE_FINE near each interval end).
PROFILE_STEP = 0.05
PROFILE_FINE = 0.005
#: fits x runs held at once by the batched optimiser (as ``bootstrap.CHUNK_ELEMENTS``).
CHUNK_ELEMENTS = 1_000_000
METHOD = "profile likelihood; critical value from a wild cluster bootstrap (Webb weights per (budget, r) cell)"


def webb_weights(n_cells: int, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """(n_draws, n_cells) draws of Webb's six-point distribution."""
    return WEBB[rng.integers(0, len(WEBB), size=(n_draws, n_cells))]


def log_fit(theta: np.ndarray, data: LawData) -> tuple[np.ndarray, np.ndarray]:
    """The law's log predictions and the residuals log L - prediction (n,) at ``theta``."""
    res = residuals(np.atleast_2d(theta), data, jac=False)[0][0]
    return data.y + res, -res


# ---- batched restricted / free fits ------------------------------------------------------------
def fit_batch(
    data: LawData,
    starts: np.ndarray,
    bounds: Bounds,
    *,
    phi_free: bool,
    loss: str,
    delta: float,
    max_iter: int = 300,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Best of ``k`` starts for each of ``S`` fits: ``starts`` (S, k, 6); ``data`` unbatched or with one row
    of observations per fit (``LawData.with_y``). With ``phi_free=False`` each start keeps its own phi.
    ``weights`` (n,): run weights (a large table's design points, ``Screen``); default 1.

    Screening (30 steps of every start), then the best start of each fit runs to convergence; chunked so
    memory stays bounded. Returns theta (S, 6) and objective (S,)."""
    S, k, _ = starts.shape
    free = np.ones(N_THETA, dtype=bool)
    free[PHI] = phi_free
    n = len(data)
    chunk = max(1, CHUNK_ELEMENTS // (k * n))
    theta = np.empty((S, N_THETA))
    f = np.empty(S)
    batched = data.y.ndim == 2
    w = np.ones((1, n)) if weights is None else np.asarray(weights, dtype=float)[None]
    for c0 in range(0, S, chunk):
        sl = np.arange(c0, min(S, c0 + chunk))
        nb = len(sl)
        d = data.take(sl) if batched else data
        if k > 1:
            dk = data.with_y(np.repeat(d.y, k, axis=0)) if batched else d
            ends, fk = lm_batch(starts[sl].reshape(nb * k, N_THETA), dk, w, bounds, free, loss, delta, max_iter=30)
            ends, fk = ends.reshape(nb, k, N_THETA), fk.reshape(nb, k)
            best = np.argmin(np.where(np.isfinite(fk), fk, np.inf), axis=1)
            th = ends[np.arange(nb), best]
        else:
            th = starts[sl, 0]
        theta[sl], f[sl] = lm_batch(th, d, w, bounds, free, loss, delta, max_iter=max_iter)
    return theta, f


def _with_phi(theta: np.ndarray, phi: np.ndarray) -> np.ndarray:
    out = np.array(theta, dtype=float, copy=True)
    out[..., PHI] = phi
    return out


# ---- the profile on the observed table ---------------------------------------------------------
@dataclass
class Profile:
    """``P(phi)`` on a grid over phi's box, each point the best of warm and random starts."""

    phi: np.ndarray
    objective: np.ndarray
    theta: np.ndarray
    f_min: float  # min f: the free optimum (or a lower profile point)

    @property
    def stat(self) -> np.ndarray:
        return np.maximum(self.objective - self.f_min, 0.0)

    def at(self, phi: float) -> float:
        """T(phi) by monotone cubic interpolation of the grid (exact at grid points)."""
        from scipy.interpolate import PchipInterpolator

        if not self.phi[0] <= phi <= self.phi[-1]:
            return float("nan")
        return float(max(PchipInterpolator(self.phi, self.stat)(phi), 0.0))


def _fit_profile(
    data: LawData,
    phis: np.ndarray,
    warm: np.ndarray,
    bounds: Bounds,
    loss: str,
    delta: float,
    rng: np.random.Generator,
    random_starts: int,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Restricted fits at each of ``phis`` from ``warm`` (k, 6) and random starts, then two passes that
    restart every point from its neighbours' optima (a profile is continuous where the basin is)."""
    m = len(phis)
    st = [np.broadcast_to(warm, (m, *warm.shape))]
    if random_starts:
        st.append(bounds.sample(m * random_starts, rng).reshape(m, random_starts, N_THETA))
    starts = _with_phi(np.concatenate(st, axis=1), phis[:, None])
    theta, f = fit_batch(data, starts, bounds, phi_free=False, loss=loss, delta=delta, weights=weights)
    for _ in range(2):
        left = np.vstack([theta[:1], theta[:-1]])
        right = np.vstack([theta[1:], theta[-1:]])
        nb = _with_phi(np.stack([left, right], axis=1), phis[:, None])
        t2, f2 = fit_batch(data, nb, bounds, phi_free=False, loss=loss, delta=delta, weights=weights)
        better = f2 < f
        theta[better], f[better] = t2[better], f2[better]
    return theta, f


@single_thread
def profile(
    data: LawData,
    theta_hat: np.ndarray,
    f_hat: float,
    bounds: Bounds,
    *,
    loss: str,
    delta: float,
    seed: int = 0,
    random_starts: int = 4,
    step: float = PROFILE_STEP,
    weights: np.ndarray | None = None,
) -> Profile:
    """The profile of phi over its whole box (grid ``step``, phi_hat included)."""
    lo, hi = float(bounds.lower[PHI]), float(bounds.upper[PHI])
    phis = np.unique(np.concatenate([np.arange(lo, hi + step / 2, step), [theta_hat[PHI]]]))
    phis = phis[(phis >= lo) & (phis <= hi)]
    theta, f = _fit_profile(
        data, phis, np.atleast_2d(theta_hat), bounds, loss, delta, np.random.default_rng(seed), random_starts, weights
    )
    return Profile(phis, f, theta, float(min(f_hat, np.min(f))))


def refine(
    prof: Profile,
    data: LawData,
    around: list[float],
    bounds: Bounds,
    *,
    loss: str,
    delta: float,
    half: float = PROFILE_STEP,
    step: float = PROFILE_FINE,
    weights: np.ndarray | None = None,
) -> Profile:
    """The profile with extra points every ``step`` within ``half`` of each of ``around``."""
    pts = [np.arange(a - half, a + half + step / 2, step) for a in around if np.isfinite(a)]
    if not pts:
        return prof
    new = np.unique(np.concatenate(pts))
    new = new[(new >= prof.phi[0]) & (new <= prof.phi[-1]) & ~np.isin(np.round(new, 9), np.round(prof.phi, 9))]
    if not new.size:
        return prof
    near = np.abs(new[:, None] - prof.phi[None]).argsort(axis=1)[:, :2]
    warm = prof.theta[near]  # (m, 2, 6): the two nearest grid optima
    starts = _with_phi(warm, new[:, None])
    theta, f = fit_batch(data, starts, bounds, phi_free=False, loss=loss, delta=delta, weights=weights)
    phis = np.concatenate([prof.phi, new])
    order = np.argsort(phis)
    obj = np.concatenate([prof.objective, f])[order]
    th = np.concatenate([prof.theta, theta])[order]
    return Profile(phis[order], obj, th, float(min(prof.f_min, np.min(f))))


class Hull(NamedTuple):
    """``{x : stat(x) <= c}`` on a grid: its hull, whether each end reaches the grid's edge, whether it is in pieces."""

    ci: list[float]
    open: list[bool]
    disjoint: bool


def interval_from_stat(phi: np.ndarray, stat: np.ndarray, c: float) -> Hull:
    """``{x : stat(x) <= c}`` from a gridded statistic (linear between grid points): its hull, whether it
    reaches the grid's ends (open), and whether it is more than one piece."""
    inside = stat <= c
    if not inside.any():
        k = int(np.argmin(stat))
        return Hull([float(phi[k]), float(phi[k])], [False, False], False)
    idx = np.flatnonzero(inside)
    i0, i1 = int(idx[0]), int(idx[-1])

    def cross(a: int, b: int) -> float:  # stat[a] > c >= stat[b] (or the reverse): linear crossing
        sa, sb = stat[a], stat[b]
        if not np.isfinite(sa):  # the outside point's profile failed (an overflow): the interval ends inside
            return float(phi[b])
        w = (c - sa) / (sb - sa) if sb != sa else 0.5
        return float(phi[a] + w * (phi[b] - phi[a]))

    lo = float(phi[0]) if i0 == 0 else cross(i0 - 1, i0)
    hi = float(phi[-1]) if i1 == len(phi) - 1 else cross(i1 + 1, i1)
    pieces = int(np.sum(np.diff(inside.astype(int)) == 1) + (1 if inside[0] else 0))
    return Hull([lo, hi], [i0 == 0, i1 == len(phi) - 1], pieces > 1)


# ---- the wild cluster bootstrap of T -----------------------------------------------------------
@dataclass
class NullDraws:
    """Per bootstrap table: the free optimum and the restricted one at the bootstrap world's phi."""

    y: np.ndarray  # (B, n) bootstrap log losses
    theta_free: np.ndarray  # (B, 6)
    f_free: np.ndarray  # (B,)
    theta_null: np.ndarray  # (B, 6): phi fixed at phi_hat
    f_null: np.ndarray  # (B,)

    @property
    def stat(self) -> np.ndarray:
        out: np.ndarray = np.maximum(self.f_null - np.minimum(self.f_free, self.f_null), 0.0)
        return out

    @property
    def phi(self) -> np.ndarray:
        return self.theta_free[:, PHI]


def jackknife_residuals(
    data: LawData,
    theta_hat: np.ndarray,
    cells: np.ndarray,
    bounds: Bounds,
    *,
    loss: str,
    delta: float,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Each run's residual against the law refitted without its (budget, r) cell (log space).

    Why: with a dozen cells the six coefficients absorb much of the cell-shared error, so the fitted
    residuals understate it; the leave-one-cell-out residuals do not (the jackknife residuals behind
    the CR3 cluster-robust variance)."""
    uniq, inv = np.unique(cells, return_inverse=True)
    W = (inv[None, :] != np.arange(len(uniq))[:, None]).astype(float)
    if weights is not None:
        W = W * np.asarray(weights, dtype=float)[None]
    free = np.ones(N_THETA, dtype=bool)
    free[PHI] = bool(((data.r > 1) & (data.N_rec > 0)).any())
    th, _ = lm_batch(
        np.repeat(np.atleast_2d(theta_hat), len(uniq), axis=0), data, W, bounds, free, loss, delta, max_iter=300
    )
    res = residuals(th, data, jac=False)[0]  # (G, n): prediction - observed
    return -res[inv, np.arange(len(data))]


@single_thread
def null_draws(
    data: LawData,
    theta_hat: np.ndarray,
    cells: np.ndarray,
    v: np.ndarray,
    bounds: Bounds,
    *,
    loss: str,
    delta: float,
    seed: int = 0,
    random_starts: int = 4,
    errors: str = "jackknife",
    weights: np.ndarray | None = None,
) -> NullDraws:
    """Refit ``B`` wild-bootstrap tables (``v``: (B, n_cells) weights; ``cells``: the cell of each run).

    ``errors``: "fit" (the free fit's residuals) or "jackknife" (``jackknife_residuals``)."""
    pred, e = log_fit(theta_hat, data)
    if errors == "jackknife":
        e = jackknife_residuals(data, theta_hat, cells, bounds, loss=loss, delta=delta, weights=weights)
    y = pred[None] + v[:, cells] * e[None]
    dy = data.with_y(y)
    B = len(y)
    rng = np.random.default_rng(seed)
    st = [np.broadcast_to(theta_hat, (B, 1, N_THETA))]
    if random_starts:
        st.append(bounds.sample(B * random_starts, rng).reshape(B, random_starts, N_THETA))
    tf, ff = fit_batch(dy, np.concatenate(st, axis=1), bounds, phi_free=True, loss=loss, delta=delta, weights=weights)
    tn, fn = fit_batch(
        dy,
        np.broadcast_to(theta_hat, (B, 1, N_THETA)).copy(),
        bounds,
        phi_free=False,
        loss=loss,
        delta=delta,
        weights=weights,
    )
    return NullDraws(y, tf, ff, tn, fn)


def p_value(stat: float, null: np.ndarray) -> float:
    """``(1 + #{T* >= T}) / (B + 1)``: the bootstrap p-value (never 0)."""
    null = null[np.isfinite(null)]
    return float((1 + np.sum(null >= stat * (1 - 1e-12))) / (len(null) + 1))


def critical(null: np.ndarray, level: float) -> tuple[float, float, float]:
    """The level quantile of the null draws and its +-1 sd order-statistic band (binomial)."""
    x = np.sort(null[np.isfinite(null)])
    B = len(x)
    k = level * (B + 1) - 1
    sd = np.sqrt(B * level * (1 - level))

    def q(j: float) -> float:
        return float(x[int(np.clip(np.ceil(j), 0, B - 1))])

    return q(k), q(k - sd), q(k + sd)


def summarise(phi: np.ndarray, stat: np.ndarray, null: np.ndarray, level: float) -> Interval:
    """Interval at ``level`` with its Monte-Carlo sd, from a gridded statistic and its null draws (the estimate,
    level and method are the caller's)."""
    c, c_lo, c_hi = critical(null, level)
    hull = interval_from_stat(phi, stat, c)
    a, b = interval_from_stat(phi, stat, c_lo).ci, interval_from_stat(phi, stat, c_hi).ci
    return Interval(
        ci=hull.ci,
        open=hull.open,
        disjoint=hull.disjoint,
        mc_sd=[abs(b[0] - a[0]) / 2, abs(b[1] - a[1]) / 2],
        critical_value=c,
    )


# ---- Delta-phi --------------------------------------------------------------------------------
def delta_stat(ref: Profile, var: Profile, d: np.ndarray) -> np.ndarray:
    """``T_D(d) = min_phi [T_ref(phi) + T_v(phi + d)]`` on the two profiles' grids (interpolated)."""
    from scipy.interpolate import PchipInterpolator

    fr, fv = PchipInterpolator(ref.phi, ref.stat), PchipInterpolator(var.phi, var.stat)
    lo, hi = ref.phi[0], ref.phi[-1]
    grid = np.linspace(lo, hi, round((hi - lo) / PROFILE_FINE) + 1)
    out = np.empty(len(d))
    for i, di in enumerate(d):
        g = grid[(grid + di >= var.phi[0]) & (grid + di <= var.phi[-1])]
        out[i] = np.min(fr(g) + fv(g + di)) if g.size else np.inf
    return np.maximum(out, 0.0)


@single_thread
def delta_null(
    ref_data: LawData,
    ref: NullDraws,
    ref_theta: np.ndarray,
    var_data: LawData,
    var: NullDraws,
    var_theta: np.ndarray,
    bounds: Bounds,
    *,
    loss: str,
    delta: float,
    iters: int = 14,
    ref_weights: np.ndarray | None = None,
    var_weights: np.ndarray | None = None,
) -> np.ndarray:
    """``T_D*(d_hat)`` per paired bootstrap table: golden-section search over the common shift ``t``
    (``phi_ref = phi_hat_ref + t``, ``phi_v = phi_hat_v + t``) of the sum of the two restricted optima."""
    dr, dv = ref_data.with_y(ref.y), var_data.with_y(var.y)
    tr, tv = ref.phi - ref_theta[PHI], var.phi - var_theta[PHI]
    a = np.minimum(tr, tv) - 0.05
    b = np.maximum(tr, tv) + 0.05
    warm_r, warm_v = ref.theta_null.copy(), var.theta_null.copy()

    def g(t: np.ndarray) -> np.ndarray:
        _, fr = fit_batch(
            dr,
            _with_phi(warm_r, ref_theta[PHI] + t)[:, None],
            bounds,
            phi_free=False,
            loss=loss,
            delta=delta,
            max_iter=150,
            weights=ref_weights,
        )
        _, fv = fit_batch(
            dv,
            _with_phi(warm_v, var_theta[PHI] + t)[:, None],
            bounds,
            phi_free=False,
            loss=loss,
            delta=delta,
            max_iter=150,
            weights=var_weights,
        )
        both: np.ndarray = fr + fv
        return both

    ratio = (np.sqrt(5) - 1) / 2
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    g1, g2 = g(x1), g(x2)
    best = np.minimum(ref.f_null + var.f_null, np.minimum(g1, g2))
    for _ in range(iters):
        left = g1 < g2  # the minimum is in [a, x2]: x2 <- x1, new x1; else in [x1, b]: x1 <- x2, new x2
        b = np.where(left, x2, b)
        a = np.where(left, a, x1)
        new = np.where(left, b - ratio * (b - a), a + ratio * (b - a))
        gn = g(new)
        x1, x2, g1, g2 = (
            np.where(left, new, x2),
            np.where(left, x1, new),
            np.where(left, gn, g2),
            np.where(left, g1, gn),
        )
        best = np.minimum(best, gn)
    mins = np.minimum(ref.f_free, ref.f_null) + np.minimum(var.f_free, var.f_null)
    out: np.ndarray = np.maximum(best - mins, 0.0)
    return out


# ---- records ----------------------------------------------------------------------------------
#: phi values every fit tests: a repeat adds nothing, is worth a unique block, and the paper's estimate
#: (arXiv 2604.21106 §1); ``--compare`` and the restricted fits add theirs.
def tested_values(extra: tuple[float, ...] = (), paper: bool = True) -> list[float]:
    """``paper=False`` for a fit whose phi is another quantity (a loop-of-one control re-fit)."""
    from loopscale.fit.paper import PAPER_COEFFICIENTS

    return sorted({0.0, 1.0, *([float(PAPER_COEFFICIENTS["phi"])] if paper else []), *map(float, extra)})


def percentile_mc_sd(draws: np.ndarray, level: float) -> list[float] | None:
    """Monte-Carlo sd of the two percentile ends (order-statistic band, binomial +-1 sd)."""
    x = np.sort(np.asarray(draws, dtype=float)[np.isfinite(draws)])
    B = len(x)
    if B < 10:
        return None
    out = []
    for q in ((1 - level) / 2, (1 + level) / 2):
        sd = np.sqrt(B * q * (1 - q))
        lo, hi = (int(np.clip(round(B * q + s * sd), 0, B - 1)) for s in (-1, 1))
        out.append(float((x[hi] - x[lo]) / 2))
    return out


def held_out_worse(free: HeldOutErrors | None, restricted: HeldOutErrors | None) -> bool | None:
    """Does the restricted law predict held-out runs worse than the free one on every check both ran
    (top-budget extrapolation, leave-one-r-out)? None when no check ran."""
    if free is None or restricted is None:
        return None
    both = [
        (free.extrapolation_rmse, restricted.extrapolation_rmse),
        (free.leave_one_r_out_rmse, restricted.leave_one_r_out_rmse),
    ]
    pairs = [(a, b) for a, b in both if a is not None and b is not None]
    if not pairs:
        return None
    return all(b > a for a, b in pairs)


@dataclass
class VariantInference:
    """Everything one variant's inference needs, kept between the variant's fit and the Delta-phi step.

    Above ``solver.SCREEN_ROWS`` runs it works on the table's design points (``solver.Screen``: seeds of
    a point become one row with their mean loss and summed weight, a fixed random subset above 1,024
    points), as the fit's batched stages do: 2000 tables x 10,000 runs would cost minutes."""

    data: LawData
    theta_hat: np.ndarray
    bounds: Bounds
    loss: str
    delta: float
    prof: Profile
    null: NullDraws
    weights: np.ndarray | None = None
    screened: bool = False

    @classmethod
    def run(
        cls,
        theta_hat: np.ndarray,
        f_hat: float,
        bounds: Bounds,
        data: LawData,
        cells: np.ndarray,
        v: np.ndarray,
        loss: str,
        delta: float,
        seed: int,
        errors: str = "jackknife",
    ) -> VariantInference:
        """From the free fit's optimum (``theta_hat``, objective ``f_hat``, its box ``bounds``)."""
        from loopscale.fit.law.solver import Screen

        screen = Screen.of(data)
        weights = None
        if screen is not None:
            first = np.full(len(screen.data), -1)
            keep = np.flatnonzero(screen.group >= 0)
            first[screen.group[keep]] = keep
            data, cells, weights = screen.data, cells[first], screen.weights(np.ones(len(data)))[0]
            f_hat = float(
                fit_batch(
                    data, np.atleast_2d(theta_hat)[None], bounds, phi_free=True, loss=loss, delta=delta, weights=weights
                )[1][0]
            )
        null = null_draws(
            data, theta_hat, cells, v, bounds, loss=loss, delta=delta, seed=seed + 2, errors=errors, weights=weights
        )
        prof = profile(data, theta_hat, f_hat, bounds, loss=loss, delta=delta, seed=seed + 3, weights=weights)
        return cls(data, theta_hat, bounds, loss, delta, prof, null, weights, screen is not None)

    def interval(self, level: float) -> Interval:
        """The profile interval at ``level``; the profile is refined around its ends first (kept)."""
        s = summarise(self.prof.phi, self.prof.stat, self.null.stat, level)
        self.prof = refine(
            self.prof,
            self.data,
            [x for x, o in zip(s.ci or [], s.open or [], strict=True) if not o],
            self.bounds,
            loss=self.loss,
            delta=self.delta,
            weights=self.weights,
        )
        return summarise(self.prof.phi, self.prof.stat, self.null.stat, level)

    def stat_at(self, phi: float, exact: float | None = None) -> float:
        """T(phi): the profile's, or an exact restricted fit's objective when it is lower."""
        t = self.prof.at(phi)
        if exact is not None and np.isfinite(exact) and not self.screened:  # same objective only on every run
            t = min(t, max(float(exact) - self.prof.f_min, 0.0)) if np.isfinite(t) else max(exact - self.prof.f_min, 0)
        return float(t)

    def record(
        self,
        level: float,
        rec: VariantFit,
        boot: Bootstrap,
        extra_tests: tuple[float, ...] = (),
        paper: bool = True,
    ) -> Inference:
        """The ``inference`` record of one variant (docs/fit.md, "The inference record")."""
        iv = self.interval(level)
        free_held = rec.checks.held_out if rec.checks is not None else None
        tests: dict[str, Test] = {}
        lo_b, hi_b = float(self.bounds.lower[PHI]), float(self.bounds.upper[PHI])
        for x in tested_values(extra_tests, paper):
            if not lo_b <= x <= hi_b:
                continue
            key = f"phi={x:g}"
            restricted = rec.restricted.get(key)
            t = self.stat_at(x, restricted.objective if restricted is not None else None)
            p = p_value(t, self.null.stat)
            worse = held_out_worse(free_held, restricted.held_out if restricted is not None else None)
            tests[key] = Test(
                value=x,
                stat=t,
                p=p,
                rejected=p < 1 - level,
                held_out_worse=worse,
                ruled_out=bool(p < 1 - level and worse is True),
            )
        draws = boot.draws_of("phi")
        secondary = Secondary(
            method="percentile block bootstrap over (budget, r) cells",
            n=int(boot.n or 0),
            ci=boot.ci.get("phi"),
            mc_sd=percentile_mc_sd(draws, level) if draws.size else None,
        )
        nul = self.null
        method = METHOD + ("; on the table's design points (seed means)" if self.screened else "")
        return Inference(
            phi=Interval(**quoted(iv, float(self.theta_hat[PHI]), level, method)),
            tests=tests,
            secondary=secondary,
            null=NullTables(
                n=len(nul.stat),
                unit="cell (budget, r)",
                weights="webb",
                stat=nul.stat.tolist(),
                phi_percentile_ci=list(percentile_ci(nul.phi, level)),
                at_bounds_fraction=float(np.mean(at_bounds(nul.theta_free, self.bounds).any(axis=1))),
            ),
            profile=ProfileCurve(phi=self.prof.phi.tolist(), stat=self.prof.stat.tolist()),
        )


def quoted(iv: Interval, estimate: float, level: float, method: str) -> dict[str, Any]:
    """An interval's fields as a record quotes it: the estimate, then ``summarise``'s, with the level and method."""
    return {
        "estimate": estimate,
        "ci": iv.ci,
        "level": level,
        "method": method,
        "open": iv.open,
        "disjoint": iv.disjoint,
        "mc_sd": iv.mc_sd,
        "critical_value": iv.critical_value,
    }


def test_value(record: Inference, x: float) -> float | None:
    """p of "phi = x" from a fit file's inference record (its profile grid and null draws): the test a record
    makes for any value after the fit, e.g. another fit's phi (``fit.inference.compare``). None outside the profile."""
    prof, null = record.profile, record.null
    if prof is None or null is None or not prof.phi or not null.stat:
        return None
    phi, stat = np.asarray(prof.phi, dtype=float), np.asarray(prof.stat, dtype=float)
    if not phi[0] <= x <= phi[-1]:
        return None
    t = Profile(phi, stat, np.zeros((len(phi), N_THETA)), 0.0).at(x)
    return p_value(t, np.asarray(null.stat, dtype=float))


def at_bounds(theta: np.ndarray, bounds: Bounds) -> np.ndarray:
    """(B, 6): which coefficients of each fit sit at their box bound (as ``JointLaw.at_bounds_``: 1e-6 of the span)."""
    span = bounds.upper - bounds.lower
    out: np.ndarray = (theta <= bounds.lower + 1e-6 * span) | (theta >= bounds.upper - 1e-6 * span)
    return out


def delta_record(
    ref: VariantInference, var: VariantInference, level: float, paired_draws: np.ndarray | None = None
) -> DeltaInference:
    """Delta-phi = phi_v - phi_ref: profile interval and the test of Delta-phi = 0, calibrated by the paired
    wild bootstrap (``delta_null``); the block bootstrap's paired percentile interval is secondary."""
    d_hat = float(var.theta_hat[PHI] - ref.theta_hat[PHI])
    span = float(ref.bounds.upper[PHI] - ref.bounds.lower[PHI])
    d = np.unique(np.concatenate([np.arange(-span, span + PROFILE_STEP / 2, PROFILE_STEP / 2), [d_hat, 0.0]]))
    stat = delta_stat(ref.prof, var.prof, d)
    null = delta_null(
        ref.data,
        ref.null,
        ref.theta_hat,
        var.data,
        var.null,
        var.theta_hat,
        ref.bounds,
        loss=ref.loss,
        delta=ref.delta,
        ref_weights=ref.weights,
        var_weights=var.weights,
    )
    iv = summarise(d, stat, null, level)
    fine = np.concatenate([np.arange(x - PROFILE_STEP, x + PROFILE_STEP, PROFILE_FINE) for x in iv.ci or []])
    d = np.unique(np.concatenate([d, fine]))
    stat = delta_stat(ref.prof, var.prof, d)
    iv = summarise(d, stat, null, level)
    t0 = float(stat[np.argmin(np.abs(d))])
    p = p_value(t0, null)
    draws = np.asarray(paired_draws if paired_draws is not None else [], dtype=float)
    return DeltaInference(
        **quoted(iv, d_hat, level, METHOD),
        tests={"delta_phi=0": Test(value=0.0, stat=t0, p=p, rejected=p < 1 - level)},
        secondary=Secondary(
            method="paired percentile block bootstrap",
            ci=list(percentile_ci(draws, level)) if draws.size else None,
            mc_sd=percentile_mc_sd(draws, level) if draws.size else None,
        ),
        null=NullTables(n=len(null)),
    )
