"""Δφ from the pairing: a technique and its reference ran on the same cells, so the misfit they share cancels.

Why (docs/fit.md, "Paired Δφ"): at CPU scale the joint law misses each (budget, r, width) point by more than
the seed noise (RMSE 0.05 nats on seed means against 0.017 of noise in the probe study), and two separate
fits each absorb that misfit in their own way - their Δφ interval was 0.41-0.45 wide on each side while the
loss difference on the very same runs was resolved to ±0.02 nats. What the law misses at a point it misses
for both recipes alike (same budget, r, width, seed, data order); this estimator uses that.

Model (log losses; ``mu`` the law, ``x`` a run's N_once, N_rec, D, r, the technique's from its own
accounting)::

    reference run at point p:  y_R = mu(theta; x_R) + m_p + e_R
    technique run at point p:  y_V = mu(theta + delta; x_V) + m_p + e_V

``m_p`` is the law's misfit at the point, **shared by the two recipes** (the assumption), with variance tau^2;
``e`` what is not shared (seed noise, the part of the misfit that differs), variance sigma^2. ``delta`` is the
technique's difference from the reference's law; Δφ is its phi slot. Two models of it:

* ``SHARED_LAW``: only Δφ is free - the technique is the reference's law with phi moved (the reading of
  ``fit.inference.shared``, now with the shared misfit);
* ``SEPARATE_LAWS``: every coefficient differs, as in the separate fits (the paper's estimand); the law's
  predictions at the shared r = 1 runs tie the two laws together, as those runs tie the two separate fits.

A point's two residuals split into a level ``u = (res_R + res_V) / 2`` (variance tau^2 + sigma^2 / 2) and a
contrast ``c = res_V - res_R`` (variance 2 sigma^2, free of m_p); r = 1 runs and unmatched runs are levels of
variance tau^2 + sigma^2, and at each r = 1 run the two laws' difference is a contrast (the technique's r = 1
run *is* the reference's). The estimator minimises the Gaussian working likelihood of these independent
parts, ``J = 1/2 sum (u^2 / (lam + 1/2) + c^2 / 2 + s^2 / (lam + 1))``, ``lam = tau^2 / sigma^2`` estimated from
the fit's own residuals (feasible GLS, a few rounds). A large ``lam`` (the misfit dominates) puts the weight
on the contrasts; ``lam = 0`` is plain least squares on both tables.

Calibration, as every loopscale interval (``fit.inference.profile``): the profile statistic
``T(d) = min J(Δφ = d) - min J``, its null from a wild cluster bootstrap - each run's jackknife residual
(the model refitted without its (budget, r) cell) times one Webb draw per cell, the same draw for both
recipes, so a cell's shared misfit and its contrast noise keep their structure - with ``lam`` held at the
observed table's value. Interval ``{d : T(d) <= c}``; test of Δφ = 0 by ``p = (1 + #{T* >= T(0)}) / (B + 1)``.

The assumptions are tested by held-out cells (:func:`held_out`): each of the technique's (budget, r) cells is
left out and its runs predicted three ways - the reference's runs in the same cell moved by each paired
model's contrast, and the technique's own law refitted without the cell (the separate reading, which needs
neither assumption). :func:`leading` quotes the most specific reading the held-out errors do not
contradict: the shared-law paired reading, else the separate-laws paired one, else the separate fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.inference.profile import PROFILE_FINE, critical, p_value, summarise
from loopscale.fit.law.formula import N_THETA, PHI, LawData, residuals
from loopscale.fit.law.formula import loss as law_loss
from loopscale.fit.law.solver import Bounds, lm_minimise, single_thread
from loopscale.fit.result import (
    Comparison,
    DeltaInference,
    Leading,
    NullTables,
    PairedDelta,
    PairedHeldOut,
    PairedReading,
    Test,
)

#: Δφ's box (as the shared reading's).
DELTA_BOUNDS = (-2.0, 2.0)
#: the profile grid's step over Δφ (refined to ``PROFILE_FINE`` near each interval end).
DELTA_STEP = 0.05
#: rounds of re-estimating lam = tau^2 / sigma^2 from the fit's residuals.
LAM_ROUNDS = 4
LAM_MAX = 1e4
#: what a pair of runs matches on (``shared.MATCH``: budget, r, width, seed; seed means drop the seed).
MATCH = ("C", "r", "d_model", "seed")
N_P = 2 * N_THETA  # theta, and the technique's difference from it (Δφ in slot DELTA)
DELTA = N_THETA + PHI
SHARED_LAW = "shared law"
SEPARATE_LAWS = "separate laws"
MODELS = (SHARED_LAW, SEPARATE_LAWS)
METHOD = (
    "paired ({model}): the law's misfit at a (budget, r, width, seed) point shared by both recipes (feasible GLS on "
    "levels and within-point contrasts); profile likelihood, critical value from a wild cluster bootstrap (Webb "
    "weights per (budget, r) cell, one draw for both recipes)"
)
ASSUMPTION = {
    SHARED_LAW: "the law's misfit at a point (budget, r, width, seed) is the same for the technique and its "
    "reference, and the technique is the reference's law with phi moved by Δφ",
    SEPARATE_LAWS: "the law's misfit at a point (budget, r, width, seed) is the same for the technique and its "
    "reference; each has its own law",
}


def free_mask(model: str, fix_delta: bool = False) -> np.ndarray:
    """(12,) the free slots of p under ``model`` (Δφ held too with ``fix_delta``: a profile point)."""
    free = np.ones(N_P, dtype=bool)
    if model == SHARED_LAW:
        free[N_THETA:] = False
        free[DELTA] = True
    elif model != SEPARATE_LAWS:
        raise ValueError(f"unknown paired model {model!r}; expected one of {MODELS}")
    if fix_delta:
        free[DELTA] = False
    return free


# ---- the paired table -------------------------------------------------------------------------
@dataclass(frozen=True)
class Pairing:
    """The reference's runs (every r = 1 run included) and the technique's own runs, and which pair up."""

    ref: LawData
    var: LawData
    pr: np.ndarray  # (P,) reference row of each pair
    pv: np.ndarray  # (P,) technique row of each pair
    single_r: np.ndarray  # reference rows in no pair (r = 1 runs, unmatched looped runs)
    single_v: np.ndarray  # technique rows in no pair
    anchor: np.ndarray  # reference rows with r = 1: where the two laws must agree
    cells_r: np.ndarray  # (budget, r) cell of each reference row
    cells_v: np.ndarray
    keys: tuple[str, ...]

    @classmethod
    def of(cls, ref: pd.DataFrame, var: pd.DataFrame, cells_r: np.ndarray, cells_v: np.ndarray) -> Pairing:
        """``var``: the technique's own runs (not the r = 1 runs it shares with the reference)."""
        seed_means = "n_seeds" in ref.columns and "n_seeds" in var.columns
        keys = tuple(k for k in (MATCH[:3] if seed_means else MATCH) if k in ref.columns and k in var.columns)
        a = ref.reset_index(drop=True).assign(_i=np.arange(len(ref)))
        b = var.reset_index(drop=True).assign(_j=np.arange(len(var)))
        if len(keys) >= 3 and {"C", "r"} <= set(keys):
            m = a[a["r"] > 1][[*keys, "_i"]].merge(b[b["r"] > 1][[*keys, "_j"]], on=list(keys))
            m = m.drop_duplicates("_i").drop_duplicates("_j")
        else:
            m = pd.DataFrame({"_i": [], "_j": []}, dtype=int)
        pr, pv = m["_i"].to_numpy(int), m["_j"].to_numpy(int)
        return cls(
            LawData.from_frame(a),
            LawData.from_frame(b),
            pr,
            pv,
            np.setdiff1d(np.arange(len(a)), pr),
            np.setdiff1d(np.arange(len(b)), pv),
            np.flatnonzero(a["r"].to_numpy() == 1),
            np.asarray(cells_r),
            np.asarray(cells_v),
            keys,
        )

    @property
    def n_pairs(self) -> int:
        return len(self.pr)

    @property
    def n_components(self) -> int:
        return 2 * self.n_pairs + len(self.single_r) + len(self.single_v) + len(self.anchor)

    def with_y(self, y_r: np.ndarray, y_v: np.ndarray) -> Pairing:
        """One row of log losses per fit for each recipe (a batch of bootstrap tables)."""
        return dataclasses.replace(self, ref=self.ref.with_y(y_r), var=self.var.with_y(y_v))

    def take(self, idx: np.ndarray) -> Pairing:
        """The fits ``idx`` of a batch (``with_y``); an unbatched pairing is shared by every fit."""
        if self.ref.y.ndim == 1:
            return self
        return self.with_y(self.ref.y[idx], self.var.y[idx])

    def component_cells(self) -> np.ndarray:
        """The (budget, r) cell of each component (a pair lies in one cell: it matches on budget and r)."""
        c = self.cells_r[self.pr]
        return np.concatenate(
            [c, c, self.cells_r[self.single_r], self.cells_v[self.single_v], self.cells_r[self.anchor]]
        )

    def without_var_rows(self, drop: np.ndarray) -> Pairing:
        """The pairing without the technique rows ``drop``: their partners become reference singles."""
        keep_v = np.flatnonzero(~drop)
        new_index = np.full(len(drop), -1)
        new_index[keep_v] = np.arange(len(keep_v))
        in_pair = ~drop[self.pv]
        pr, pv = self.pr[in_pair], new_index[self.pv[in_pair]]
        v = self.var
        var = LawData.from_arrays(
            v.N_once[keep_v], v.N_rec[keep_v], np.exp(v.log_D[keep_v]), v.r[keep_v], np.exp(v.y[keep_v])
        )
        return dataclasses.replace(
            self,
            var=var,
            pr=pr,
            pv=pv,
            single_r=np.setdiff1d(np.arange(len(self.ref)), pr),
            single_v=np.setdiff1d(np.arange(len(keep_v)), pv),
            cells_v=self.cells_v[keep_v],
        )


def _rows(data: LawData, idx: np.ndarray) -> LawData:
    """Runs ``idx`` of ``data`` (every fit's observations, when batched)."""
    cols = {f: getattr(data, f)[idx] for f in ("N_once", "N_rec", "r", "log_r", "log_D")}
    return dataclasses.replace(data, **cols, y=data.y[..., idx], L=data.L[..., idx])


def _split(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    th = np.array(p[:, :N_THETA], dtype=float, copy=True)
    return th, th + p[:, N_THETA:]


def raw_residuals(p: np.ndarray, pair: Pairing) -> tuple[np.ndarray, np.ndarray]:
    """Log-space residuals (prediction - observed) of the reference's and the technique's rows, (S, n)."""
    th, tv = _split(np.atleast_2d(p))
    return residuals(th, pair.ref, jac=False)[0], residuals(tv, pair.var, jac=False)[0]


def _parts(rr: np.ndarray, rv: np.ndarray, pair: Pairing) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levels of the pairs, their contrasts and the singles' residuals (unweighted), each (S, k)."""
    u = (rr[:, pair.pr] + rv[:, pair.pv]) / 2
    c = rv[:, pair.pv] - rr[:, pair.pr]
    s = np.concatenate([rr[:, pair.single_r], rv[:, pair.single_v]], axis=1)
    return u, c, s


def _scales(pair: Pairing, lam: float) -> np.ndarray:
    """sqrt of each component's weight, in units of sigma^2 = 1."""
    P, n_s = pair.n_pairs, len(pair.single_r) + len(pair.single_v)
    return np.concatenate(
        [
            np.full(P, 1 / np.sqrt(lam + 0.5)),
            np.full(P, 1 / np.sqrt(2.0)),
            np.full(n_s, 1 / np.sqrt(lam + 1.0)),
            np.full(len(pair.anchor), 1 / np.sqrt(2.0)),
        ]
    )


def components(p: np.ndarray, pair: Pairing, lam: float, jac: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Weighted components z (S, m) and dz/dp (S, m, 12) at a batch of parameters p (S, 12)."""
    p = np.atleast_2d(p)
    th, tv = _split(p)
    rr, Jr = residuals(th, pair.ref, jac=jac)
    rv, Jv = residuals(tv, pair.var, jac=jac)
    ra, Ja = residuals(tv, _rows(pair.ref, pair.anchor), jac=jac)  # the technique's law at the r = 1 runs
    u, c, s = _parts(rr, rv, pair)
    a = ra - rr[:, pair.anchor]  # the two laws' difference there (the observation cancels)
    w = _scales(pair, lam)
    z = np.concatenate([u, c, s, a], axis=1) * w
    if not jac:
        return z, None
    assert Jr is not None and Jv is not None and Ja is not None
    zr = np.zeros_like(Jr)
    J12r = np.concatenate([Jr, zr], axis=2)
    J12v = np.concatenate([Jv, Jv], axis=2)
    J12a = np.concatenate([Ja - Jr[:, pair.anchor], Ja], axis=2)
    Ju = (J12r[:, pair.pr] + J12v[:, pair.pv]) / 2
    Jc = J12v[:, pair.pv] - J12r[:, pair.pr]
    Js = np.concatenate([J12r[:, pair.single_r], J12v[:, pair.single_v]], axis=1)
    J = np.concatenate([Ju, Jc, Js, J12a], axis=1) * w[None, :, None]
    return z, J


@dataclass(frozen=True)
class Box:
    lower: np.ndarray  # (12,)
    upper: np.ndarray

    @classmethod
    def of(cls, bounds: Bounds) -> Box:
        span = bounds.upper - bounds.lower
        lo, hi = -span.copy(), span.copy()
        lo[PHI], hi[PHI] = DELTA_BOUNDS
        return cls(np.r_[bounds.lower, lo], np.r_[bounds.upper, hi])


def lm(
    p0: np.ndarray,
    pair: Pairing,
    lam: float,
    box: Box,
    free: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    max_iter: int = 200,
    tol: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """Batched projected Levenberg-Marquardt (``solver.lm_minimise``) on J.

    p0 (S, 12); ``pair`` may carry one row of observations per fit; ``mask`` (S, m) or (m,) weights each
    component (0 leaves it out: a held-out or jackknifed cell); a slot not ``free`` keeps each start's value."""
    p0 = np.atleast_2d(p0)
    S = len(p0)
    M = np.broadcast_to(np.ones(pair.n_components) if mask is None else mask, (S, pair.n_components))

    def evaluate(idx: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with np.errstate(all="ignore"):
            z, J = components(q, pair.take(idx), lam, jac=True)
            assert J is not None
            Mi = M[idx]
            f = 0.5 * np.sum(Mi * z * z, axis=1)
            g = np.matmul((Mi * z)[:, None, :], J)[:, 0, :]
            H = np.matmul(np.swapaxes(J * Mi[..., None], 1, 2), J)
        return np.where(np.isfinite(f), f, np.inf), g, H

    return lm_minimise(p0, evaluate, box.lower, box.upper, free, max_iter=max_iter, tol=tol)


def _best_of(starts: np.ndarray, pair: Pairing, lam: float, box: Box, free: np.ndarray) -> tuple[np.ndarray, float]:
    """The best end point of several starts (30 screening steps each, the best four to convergence)."""
    ends, f = lm(starts, pair, lam, box, free, max_iter=30)
    keep = np.argsort(np.where(np.isfinite(f), f, np.inf))[:4]
    ends, f = lm(ends[keep], pair, lam, box, free)
    k = int(np.argmin(f))
    return ends[k], float(f[k])


def variance_components(p: np.ndarray, pair: Pairing) -> tuple[float, float]:
    """sigma^2 (what the recipes do not share) from the contrasts, tau^2 (the shared misfit) from the levels:
    E[c^2] = 2 sigma^2, E[u^2] = tau^2 + sigma^2 / 2, E[s^2] = tau^2 + sigma^2."""
    rr, rv = raw_residuals(p, pair)
    u, c, s = (x[0] for x in _parts(rr, rv, pair))
    sigma2 = float(np.sum(c**2) / (2 * max(len(c) - 1, 1)))  # Δφ is fitted on the contrasts: one dof
    n_lev = len(u) + len(s)
    tau2 = max(0.0, float((np.sum(u**2) + np.sum(s**2) - sigma2 * (len(u) / 2 + len(s))) / max(n_lev, 1)))
    return sigma2, tau2


@dataclass
class PairedFit:
    model: str
    p: np.ndarray  # (12,): theta, the technique's difference
    objective: float
    lam: float
    sigma2: float
    tau2: float

    @property
    def delta_phi(self) -> float:
        return float(self.p[DELTA])

    @property
    def phi(self) -> float:
        return float(self.p[PHI])

    @property
    def free(self) -> np.ndarray:
        return free_mask(self.model)


def starts_from(theta_ref: np.ndarray, theta_var: np.ndarray | None = None) -> np.ndarray:
    """Starts of a paired fit: the reference's law with no difference, and with the technique's law's (its
    separate fit) - under the shared law only its Δφ counts."""
    a = np.asarray(theta_ref, dtype=float)
    out = [np.r_[a, np.zeros(N_THETA)]]
    if theta_var is not None:
        out.append(np.r_[a, np.asarray(theta_var, dtype=float) - a])
    return np.array(out)


@single_thread
def fit_paired(
    pair: Pairing, bounds: Bounds, starts: np.ndarray, model: str = SHARED_LAW, *, seed: int = 0, random: int = 24
) -> PairedFit:
    """The paired model's optimum, lam re-estimated from its residuals ``LAM_ROUNDS`` times.

    ``starts`` (k, 12) (``starts_from``); slots the model holds are set to 0 in them."""
    if pair.n_pairs < 2:
        raise ValueError("fewer than two matched looped runs: nothing to pair")
    free = free_mask(model)
    box = Box.of(bounds)
    rng = np.random.default_rng(seed)
    rand = np.c_[bounds.sample(random, rng), np.zeros((random, N_THETA))]
    rand[:, DELTA] = rng.uniform(-0.5, 0.5, random)
    given = np.atleast_2d(np.asarray(starts, dtype=float)).copy()
    given[:, N_THETA:] = np.where(free[N_THETA:], given[:, N_THETA:], 0.0)
    st = np.vstack([given, rand])
    lam = 1.0
    p, f = _best_of(st, pair, lam, box, free)
    sigma2 = tau2 = float("nan")
    for _ in range(LAM_ROUNDS):
        sigma2, tau2 = variance_components(p, pair)
        new = float(np.clip(tau2 / max(sigma2, 1e-300), 0.0, LAM_MAX))
        converged = abs(new - lam) <= 0.05 * max(lam, 1e-3)
        lam = new
        p, f = _best_of(np.vstack([p, given]), pair, lam, box, free)
        if converged:
            break
    return PairedFit(model, p, f, lam, sigma2, tau2)


# ---- the profile over Δφ and its wild bootstrap ----------------------------------------------
def profile_delta(
    fit: PairedFit, pair: Pairing, bounds: Bounds, d: np.ndarray, warm: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Restricted optima J(Δφ = d): each point from ``warm`` (k, 12; default the free optimum) and, once, from
    its neighbours' optima. Returns their parameters (m, 12) and objectives (m,)."""
    box = Box.of(bounds)
    free = free_mask(fit.model, fix_delta=True)
    warm = np.atleast_2d(fit.p if warm is None else warm)
    best_p, best_f = np.empty((len(d), N_P)), np.full(len(d), np.inf)
    for w in warm:
        st = np.repeat(w[None], len(d), axis=0)
        st[:, DELTA] = d
        p, f = lm(st, pair, fit.lam, box, free)
        better = f < best_f
        best_p[better], best_f[better] = p[better], f[better]
    for nb in (np.vstack([best_p[:1], best_p[:-1]]), np.vstack([best_p[1:], best_p[-1:]])):
        st = nb.copy()
        st[:, DELTA] = d
        p, f = lm(st, pair, fit.lam, box, free)
        better = f < best_f
        best_p[better], best_f[better] = p[better], f[better]
    return best_p, best_f


def follow_profile(fit: PairedFit, pair: Pairing, bounds: Bounds, stop: float) -> tuple[np.ndarray, np.ndarray]:
    """T(Δφ) on a ``DELTA_STEP`` grid, followed outward from the estimate (and at 0) until it exceeds ``stop``
    on both sides or reaches Δφ's box: the interval lies where T is below the critical value, so the far
    profile is not needed (a second dip beyond ``stop`` would go unseen). Returns the grid and J there."""
    lo, hi = DELTA_BOUNDS
    d0 = fit.delta_phi
    k = np.arange(-4, 5)
    d = np.unique(np.clip(np.r_[d0 + DELTA_STEP * k, 0.0], lo, hi))
    P, f = profile_delta(fit, pair, bounds, d)
    while True:
        f_min = min(fit.objective, float(np.min(f)))
        stat = np.maximum(f - f_min, 0.0)
        order = np.argsort(d)
        d, f, P, stat = d[order], f[order], P[order], stat[order]
        i0 = int(np.argmin(np.abs(d - d0)))
        grow = []
        left, right = d[: i0 + 1], d[i0:]
        if stat[: i0 + 1].max() < stop and left.min() > lo:  # no point left of the estimate exceeds stop yet
            grow.append((np.clip(left.min() - DELTA_STEP * np.arange(1, 9), lo, hi), P[0]))
        if stat[i0:].max() < stop and right.max() < hi:
            grow.append((np.clip(right.max() + DELTA_STEP * np.arange(1, 9), lo, hi), P[-1]))
        if not grow:
            return d, f
        for new, w in grow:
            new = np.unique(new[~np.isin(np.round(new, 9), np.round(d, 9))])
            if new.size:
                p2, f2 = profile_delta(fit, pair, bounds, new, w[None])
                d, f, P = np.r_[d, new], np.r_[f, f2], np.vstack([P, p2])


def jackknife_residuals(fit: PairedFit, pair: Pairing, bounds: Bounds) -> tuple[np.ndarray, np.ndarray]:
    """Each run's residual (observed - prediction, log) against the model refitted without its (budget, r) cell."""
    cells = pair.component_cells()
    uniq = np.unique(np.concatenate([pair.cells_r, pair.cells_v]))
    masks = (cells[None, :] != uniq[:, None]).astype(float)
    ends, _ = lm(np.repeat(fit.p[None], len(uniq), axis=0), pair, fit.lam, Box.of(bounds), fit.free, mask=masks)
    rr, rv = raw_residuals(ends, pair)  # (G, n)
    gi_r, gi_v = np.searchsorted(uniq, pair.cells_r), np.searchsorted(uniq, pair.cells_v)
    return -rr[gi_r, np.arange(len(gi_r))], -rv[gi_v, np.arange(len(gi_v))]


@single_thread
def null_draws(fit: PairedFit, pair: Pairing, bounds: Bounds, v_r: np.ndarray, v_v: np.ndarray) -> np.ndarray:
    """T*(Δφ-hat) on wild bootstrap tables: ``v_r`` (B, n_R) and ``v_v`` (B, n_V), each run's cell weight."""
    box = Box.of(bounds)
    rr, rv = raw_residuals(fit.p, pair)
    e_r, e_v = jackknife_residuals(fit, pair, bounds)
    y_r = (pair.ref.y + rr[0])[None] + v_r * e_r[None]  # prediction + v e
    y_v = (pair.var.y + rv[0])[None] + v_v * e_v[None]
    boot = pair.with_y(y_r, y_v)
    start = np.repeat(fit.p[None], len(y_r), axis=0)
    _, ff = lm(start, boot, fit.lam, box, fit.free)
    _, fn = lm(start, boot, fit.lam, box, free_mask(fit.model, fix_delta=True))
    out: np.ndarray = np.maximum(fn - np.minimum(ff, fn), 0.0)
    return out


# ---- held-out cells: are the assumptions contradicted? ----------------------------------------
def predict_var(p: np.ndarray, pair: Pairing, rows: np.ndarray) -> np.ndarray:
    """The technique's loss (nats) at its rows ``rows``: the reference's run at the same point moved by the
    law's contrast (mu_V / mu_R), or the law alone for a technique run without a partner."""
    th, tv = _split(np.atleast_2d(p))
    v, a = pair.var, pair.ref
    mu_v = law_loss(tv, v.N_once[rows], v.N_rec[rows], np.exp(v.log_D[rows]), v.r[rows])[0]
    partner = dict(zip(pair.pv.tolist(), pair.pr.tolist(), strict=True))
    i = np.array([partner.get(int(j), -1) for j in rows], dtype=int)
    out: np.ndarray = mu_v.copy()
    m = i >= 0
    if m.any():
        mu_r = law_loss(th, a.N_once[i[m]], a.N_rec[i[m]], np.exp(a.log_D[i[m]]), a.r[i[m]])[0]
        out[m] = np.exp(a.y[i[m]]) * mu_v[m] / mu_r
    return out


def held_out(
    fits: dict[str, PairedFit],
    pair: Pairing,
    bounds: Bounds,
    separate_predict: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
) -> PairedHeldOut:
    """Leave-one-technique-cell-out squared errors (nats) of each paired model and of the technique's own law
    (``separate_predict(train_rows, test_rows)``), over the technique's (budget, r) cells with r > 1; a model is
    contradicted by a simpler-assumption one when it predicts worse by more than two standard errors of the
    per-cell difference."""
    cells = sorted(set(pair.cells_v[pair.var.r > 1].tolist()))
    if len(cells) < 2:
        return PairedHeldOut(cells=len(cells), note="fewer than two technique cells: no held-out test")
    box = Box.of(bounds)
    L_v = np.exp(pair.var.y)
    errors: dict[str, list[float]] = {k: [] for k in [*fits, *(["separate fits"] if separate_predict else [])]}
    n: list[int] = []
    for g in cells:
        test = pair.cells_v == g
        rows = np.flatnonzero(test)
        sub = pair.without_var_rows(test)
        y = L_v[rows]
        for name, fit in fits.items():
            end, _ = lm(fit.p[None], sub, fit.lam, box, fit.free)
            errors[name].append(float(np.sum((predict_var(end[0], pair, rows) - y) ** 2)))
        if separate_predict is not None:
            errors["separate fits"].append(float(np.sum((np.asarray(separate_predict(~test, test)) - y) ** 2)))
        n.append(len(rows))
    e = {k: np.array(v) for k, v in errors.items()}
    total = float(np.sum(n))

    def worse(a: str, b: str) -> Comparison:
        diff = e[a] - e[b]
        se = float(np.std(diff, ddof=1) / np.sqrt(len(diff)))
        return Comparison(mean_excess_sq_error=float(np.mean(diff)), se=se, worse=bool(np.mean(diff) > 2 * se))

    comparisons: dict[str, Comparison] = {}
    if SHARED_LAW in e and SEPARATE_LAWS in e:
        comparisons[f"{SHARED_LAW} vs {SEPARATE_LAWS}"] = worse(SHARED_LAW, SEPARATE_LAWS)
    if "separate fits" in e:
        for k in fits:
            comparisons[f"{k} vs separate fits"] = worse(k, "separate fits")
    return PairedHeldOut(
        cells=len(cells),
        rmse={k: float(np.sqrt(x.sum() / total)) for k, x in e.items()},
        comparisons=comparisons,
        note="leave-one-technique-cell-out errors (nats): each paired model predicts the technique's runs from the "
        "reference's runs in the cell moved by its contrast; the separate fits from the technique's own law. "
        "'worse' when by more than 2 standard errors of the per-cell difference",
    )


# ---- the record ----------------------------------------------------------------------------
def record(fit: PairedFit, pair: Pairing, bounds: Bounds, null: np.ndarray, level: float) -> PairedReading:
    """One paired model's Δφ record (docs/fit.md, "Paired Δφ")."""
    lo, hi = DELTA_BOUNDS
    c, _, c_hi = critical(null, level)
    d, f = follow_profile(fit, pair, bounds, stop=1.5 * max(c_hi, c) + 1e-12)
    stat = np.maximum(f - min(fit.objective, float(np.min(f))), 0.0)
    iv = summarise(d, stat, null, level)
    fine = np.concatenate(
        [np.arange(x - DELTA_STEP, x + DELTA_STEP + PROFILE_FINE / 2, PROFILE_FINE) for x in iv.ci or []]
    )
    fine = fine[(fine >= lo) & (fine <= hi) & ~np.isin(np.round(fine, 9), np.round(d, 9))]
    if fine.size:
        _, f2 = profile_delta(fit, pair, bounds, fine)
        d, f = np.r_[d, fine], np.r_[f, f2]
        order = np.argsort(d)
        d, f = d[order], f[order]
        stat = np.maximum(f - min(fit.objective, float(np.min(f))), 0.0)
        iv = summarise(d, stat, null, level)
    t0 = float(stat[np.argmin(np.abs(d))])
    p0 = p_value(t0, null)
    at_bound = min(fit.delta_phi - lo, hi - fit.delta_phi) < 1e-3 * (hi - lo)
    return PairedReading(
        model=fit.model,
        estimate=fit.delta_phi,
        ci=iv.ci,
        level=level,
        method=METHOD.format(model=fit.model),
        assumption=ASSUMPTION[fit.model],
        open=iv.open,
        disjoint=iv.disjoint,
        mc_sd=iv.mc_sd,
        critical_value=iv.critical_value,
        tests={"delta_phi=0": Test(value=0.0, stat=t0, p=p0, rejected=p0 < 1 - level)},
        phi_reference=fit.phi,
        phi_variant=fit.phi + fit.delta_phi,
        at_bound=bool(at_bound),
        misfit={
            "shared_sd": float(np.sqrt(fit.tau2)),
            "not_shared_sd": float(np.sqrt(fit.sigma2)),
            "shared_fraction": float(fit.tau2 / (fit.tau2 + fit.sigma2)) if fit.tau2 + fit.sigma2 > 0 else None,
            "lam": fit.lam,
            "unit": "log loss; not_shared_sd is per recipe (a contrast's sd is sqrt(2) times it)",
        },
        null=NullTables(n=len(null), unit="cell (budget, r)", weights="webb", lam="held at the table's"),
        profile={"delta_phi": d.tolist(), "stat": stat.tolist()},
    )


def paired_delta_phi(
    ref: pd.DataFrame,
    var: pd.DataFrame,
    cells_r: np.ndarray,
    cells_v: np.ndarray,
    V: np.ndarray,
    law: Any,
    starts: np.ndarray,
    level: float,
    *,
    checks: bool = True,
    seed: int = 0,
) -> PairedDelta | None:
    """The paired Δφ of a technique (``var``: its own runs) against its reference (``ref``: every run of the
    reference's fit), under both models, with the held-out test (``checks``). ``V`` (B, K): the wild
    bootstrap's cell weights every variant shares; ``law``: the fit's ``JointLaw`` (its box, and refitted per
    held-out cell for the technique's own law); ``starts``: ``starts_from``. None without two matched runs."""
    pair = Pairing.of(ref, var, cells_r, cells_v)
    if pair.n_pairs < 2:
        return None
    bounds = law.bounds()
    fits: dict[str, PairedFit] = {}
    out = PairedDelta(n_pairs=pair.n_pairs, match=list(pair.keys))
    for model in MODELS:
        extra = [fits[SHARED_LAW].p[None]] if model == SEPARATE_LAWS else []
        fit = fit_paired(pair, bounds, np.vstack([starts, *extra]), model, seed=seed)
        fits[model] = fit
        reading_of = record(
            fit, pair, bounds, null_draws(fit, pair, bounds, V[:, pair.cells_r], V[:, pair.cells_v]), level
        )
        setattr(out, model.replace(" ", "_"), reading_of)
    separate = None
    if checks:
        # the technique's own law without the cell: warm-started from its separate fit (the starts' last row)
        quick = law.clone(restarts=max(10, law.restarts // 10))
        warm = np.atleast_2d(starts)[-1:, :N_THETA] + np.atleast_2d(starts)[-1:, N_THETA:]
        own_r1 = ref[ref["r"] == 1]
        v = var.reset_index(drop=True)

        def separate(train: np.ndarray, test: np.ndarray) -> np.ndarray:
            own = pd.concat([own_r1, v[train]], ignore_index=True)
            return np.asarray(quick.clone().fit(own, extra_starts=warm).predict(v[test]), dtype=float)

    out.held_out = held_out(fits, pair, bounds, separate) if checks else None
    return out


def reading(paired: PairedDelta | None, model: str) -> PairedReading | None:
    """One model's record of a paired Δφ record (``paired_delta_phi``'s), None when absent."""
    return None if paired is None else paired.reading(model)


def leading(paired: PairedDelta | None, separate: DeltaInference | None) -> Leading | None:
    """The reading quoted, and why: the most specific one the held-out test does not contradict - the paired
    shared-law reading (not worse than the paired separate-laws one nor than the separate fits), else the
    paired separate-laws reading (not worse than the separate fits), else the separate fits' calibrated one.
    A paired estimate at its box never leads; untested (checks off), the separate fits lead."""

    def summary(rec: PairedReading | DeltaInference, reading: str, reason: str) -> Leading:
        t = rec.zero or Test()
        return Leading(reading=reading, estimate=rec.estimate, ci=rec.ci, p=t.p, rejected=t.rejected, reason=reason)

    if paired is None:
        why = "no paired reading (fewer than two of the technique's runs match the reference's)"
    elif paired.held_out is None:
        why = "the paired readings' assumption was not tested (checks off)"
    elif paired.held_out.comparisons is None:
        why = f"the paired readings' assumption could not be tested ({paired.held_out.note})"
    else:
        held = paired.held_out
        cmp: dict[str, Comparison] = held.comparisons or {}
        rmse = held.rmse

        def blocked(model: str) -> str | None:
            """Why ``model``'s reading cannot lead, None if it can."""
            own = paired.reading(model)
            if own is None or own.at_bound:
                return "its Δφ ran to its box"
            if (c := cmp.get(f"{model} vs separate fits")) is not None and c.worse:
                return (
                    f"it predicts the technique's held-out cells worse than the technique's own law "
                    f"({rmse[model]:.3f} vs {rmse['separate fits']:.3f} nats): the misfit is not shared"
                )
            if model == SHARED_LAW and cmp[f"{SHARED_LAW} vs {SEPARATE_LAWS}"].worse:
                return (
                    f"with φ alone moved it predicts them worse than with every coefficient its own "
                    f"({rmse[SHARED_LAW]:.3f} vs {rmse[SEPARATE_LAWS]:.3f} nats)"
                )
            return None

        reasons = {m: blocked(m) for m in MODELS}
        for model in MODELS:
            if reasons[model] is None:
                earlier = [f"the {m} reading does not lead: {reasons[m]}" for m in MODELS[: MODELS.index(model)]]
                chosen = paired.reading(model)
                assert chosen is not None
                return summary(
                    chosen,
                    f"paired ({model})",
                    "the technique shares the reference's misfit: the reference's runs, moved by the law's contrast, "
                    f"predict its held-out cells as well as its own law or better ({rmse[model]:.3f} vs "
                    f"{rmse['separate fits']:.3f} nats)" + "".join(f"; {e}" for e in earlier),
                )
        why = "; ".join(f"paired ({m}): {reasons[m]}" for m in MODELS)
    if separate is None:
        return None
    return summary(separate, "separate fits", f"separate fits lead: {why}")
