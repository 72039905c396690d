"""The optimiser of the joint law: objective, gradients, the batched multi-start search, L-BFGS-B polish.

Public so that every fitter (``JointLaw``, the bootstrap's batched refits, the loop-tax variant, the
study designer) drives the same machinery; the law itself is ``loopscale.fit.law.formula``.

Objective (arXiv 2604.21106, Sec. 5): minimise over the runs ``i``::

    f(theta) = sum_i c_i rho(res_i),   res_i = LSE(t1_i, t2_i, t3_i) - log L_i
    t1 = a - alpha log M,   M = N_once + r^phi N_rec       (the quality-equivalent size N_eq)
    t2 = b - beta log D,    t3 = e

``LSE(t) = log sum_k exp(t_k)`` is exactly ``log(A M^-alpha + B D^-beta + E)``. ``rho`` is the
Huber loss with ``delta = 1e-3`` (summed, not averaged), or ``res^2 / 2`` for ``loss="mse"``;
``c_i`` are run weights (1, or bootstrap multiplicities).

Gradients (derivation). With softmax weights ``w_k = exp(t_k - LSE)`` (so ``dLSE/dt_k = w_k``)::

    d res / d a     =  w1                  (dt1/da = 1)
    d res / d b     =  w2                  (dt2/db = 1)
    d res / d e     =  w3                  (dt3/de = 1)
    d res / d alpha = -w1 log M            (dt1/dalpha = -log M)
    d res / d beta  = -w2 log D            (dt2/dbeta = -log D)
    d res / d phi   = -w1 alpha (r^phi log r N_rec) / M
                                           (dt1/dphi = -alpha dlogM/dphi, dM/dphi = r^phi log r N_rec)

(``formula.residuals`` computes these rows) and ``df/dtheta = sum_i c_i psi(res_i) d res_i/dtheta``
with ``psi = rho'``: ``psi(x) = x`` for ``|x| <= delta``, ``delta sign(x)`` beyond (Huber),
``psi(x) = x`` (MSE). Stacking the rows of ``d res/d theta`` as the Jacobian ``J`` gives
``grad = J^T (c psi)``.

Search. Each random start of the paper's box is first advanced by a batched, damped Gauss-Newton
(Levenberg-Marquardt) step on the IRLS form of the objective, ``H = J^T diag(c omega) J`` with
``omega = psi(res)/res = min(1, delta/|res|)``, for all starts at once in numpy (restarts
vectorised); steps are projected onto the box and accepted only if ``f`` decreases. The best distinct
end points are then polished with scipy's L-BFGS-B on the exact objective with the analytic gradient
and tight tolerances (``ftol = 1e-15``: an objective this small would otherwise stop L-BFGS-B early,
the pitfall arXiv 2604.21106, Sec. 5 names). The optimum is a local minimum of the paper's
objective; the batched stage only decides where L-BFGS-B starts.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from loopscale.fit.law.formula import N_THETA, PARAMS, PHI, LawData, Slot, residuals, theta_to_params
from loopscale.fit.law.threads import single_thread_blas
from loopscale.fit.paper import PAPER_BOX, PAPER_HUBER_DELTA, PAPER_LOSS, PAPER_RESTARTS

LOSSES: tuple[str, ...] = ("huber", "mse")


# ---- objective -----------------------------------------------------------------------------
def robust_loss(res: np.ndarray, loss: str, delta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rho(res), psi(res) = rho'(res) and the IRLS weight omega = psi/res."""
    if loss == "mse":
        return 0.5 * res * res, res, np.ones_like(res)
    ares = np.abs(res)
    quad = ares <= delta
    rho = np.where(quad, 0.5 * res * res, delta * (ares - 0.5 * delta))
    psi = np.clip(res, -delta, delta)
    omega = np.where(quad, 1.0, delta / np.where(quad, 1.0, ares))
    return rho, psi, omega


def objective(
    theta: np.ndarray,
    data: LawData,
    weights: np.ndarray | None = None,
    *,
    loss: str = PAPER_LOSS,
    delta: float = PAPER_HUBER_DELTA,
    grad: bool = True,
    hess: bool = False,
) -> tuple[np.ndarray, ...]:
    """f (S,), and optionally grad (S, 6) and the IRLS Hessian J^T diag(c omega) J (S, 6, 6).

    ``theta`` is (S, 6) or (6,); ``weights`` is (n,) or (S, n). Non-finite values become +inf.
    """
    theta = np.atleast_2d(np.asarray(theta, dtype=float))
    c = np.ones(len(data)) if weights is None else np.asarray(weights, dtype=float)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        res, J = residuals(theta, data, jac=grad or hess)
        rho, psi, omega = robust_loss(res, loss, delta)
        f = np.sum(c * rho, axis=-1)
        out: list[np.ndarray] = [np.where(np.isfinite(f), f, np.inf)]
        if grad:
            assert J is not None
            out.append(np.matmul((c * psi)[:, None, :], J)[:, 0, :])
        if hess:
            assert J is not None
            out.append(np.matmul(np.swapaxes(J * (c * omega)[..., None], 1, 2), J))
    return tuple(out)


# ---- optimiser -----------------------------------------------------------------------------
def single_thread(fn: Any) -> Any:
    """Run ``fn`` with single-threaded BLAS (see ``_threads``: 10-20x faster on a busy machine)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with single_thread_blas():
            return fn(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class Bounds:
    """Box for theta = (a, b, e, alpha, beta, phi); also where random starts are drawn."""

    lower: np.ndarray
    upper: np.ndarray

    @classmethod
    def paper(cls, phi_bounds: tuple[float, float] | None = None, box: dict[str, Any] | None = None) -> Bounds:
        spec = dict(PAPER_BOX if box is None else box)
        if phi_bounds is not None:
            spec["phi"] = tuple(phi_bounds)
        lo = np.array([float(spec[k][0]) for k in PARAMS])
        hi = np.array([float(spec[k][1]) for k in PARAMS])
        return cls(lo, hi)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        out: np.ndarray = self.lower + rng.random((n, N_THETA)) * (self.upper - self.lower)
        return out

    def pin_phi(self, fixed_phi: float | None, identifiable: bool = True) -> tuple[Bounds, np.ndarray]:
        """The box and the mask of free slots for a fit: phi pinned (to ``fixed_phi``, or 0 when the data
        cannot identify it) or free. Every fitter pins phi this one way."""
        free = np.ones(N_THETA, dtype=bool)
        if fixed_phi is None and identifiable:
            return self, free
        free[PHI] = False
        lo, hi = self.lower.copy(), self.upper.copy()
        lo[PHI] = hi[PHI] = 0.0 if fixed_phi is None else fixed_phi
        return Bounds(lo, hi), free


@dataclass
class Minimum:
    """One local minimum found by the multi-start search."""

    theta: np.ndarray
    objective: float
    converged: bool
    n_iter: int
    message: str
    grad_max: float

    def params(self) -> dict[str, float]:
        return theta_to_params(self.theta)


def lm_minimise(
    x0: np.ndarray,
    evaluate: Any,
    lower: np.ndarray,
    upper: np.ndarray,
    free: np.ndarray,
    max_iter: int = 150,
    tol: float = 1e-11,
) -> tuple[np.ndarray, np.ndarray]:
    """Batched projected Levenberg-Marquardt: ``evaluate(idx, x)`` gives the objective (k,), gradient (k, m) and
    (Gauss-Newton) Hessian (k, m, m) of the fits ``idx`` at ``x`` (k, m). Steps are projected onto the box and
    accepted only if the objective decreases; a slot not in ``free`` keeps each start's own value. Every batched
    fitter in loopscale is this loop with its own objective (the law's, ``lm_batch``; the paired Δφ's)."""
    x = np.clip(np.array(x0, dtype=float), lower, upper)
    S, m = x.shape
    f, g, H = evaluate(np.arange(S), x)
    lam = np.full(S, 1e-3)
    active = np.isfinite(f)
    fixed = ~np.asarray(free, dtype=bool)
    eye = np.eye(m)
    for _ in range(max_iter):
        idx = np.flatnonzero(active)
        if not idx.size:
            break
        Hs, gs = H[idx].copy(), g[idx].copy()
        gs[:, fixed] = 0.0
        Hs[:, fixed, :] = 0.0
        Hs[:, :, fixed] = 0.0
        diag = np.diagonal(Hs, axis1=1, axis2=2)
        scale = diag.max(axis=1, keepdims=True) + 1e-300
        damp = lam[idx, None] * (diag + 1e-9 * scale) + fixed * 1.0
        A = Hs + damp[:, :, None] * eye
        with np.errstate(all="ignore"):
            try:
                step = -np.linalg.solve(A, gs[..., None])[..., 0]
            except np.linalg.LinAlgError:
                step = -(np.linalg.pinv(A) @ gs[..., None])[..., 0]
        step = np.where(np.isfinite(step), step, 0.0)
        new = np.clip(x[idx] + step, lower, upper)
        fn, gn, Hn = evaluate(idx, new)
        better = fn < f[idx]
        gain = np.where(better, (f[idx] - fn) / np.maximum(np.abs(f[idx]), 1e-300), 0.0)
        acc = idx[better]
        x[acc], f[acc], g[acc], H[acc] = new[better], fn[better], gn[better], Hn[better]
        lam[acc] = np.maximum(lam[acc] / 3.0, 1e-12)
        lam[idx[~better]] *= 4.0
        done = (better & (gain < tol)) | (lam[idx] > 1e10)
        active[idx[done]] = False
    return x, f


def lm_batch(
    theta: np.ndarray,
    data: LawData,
    weights: np.ndarray,
    bounds: Bounds,
    free: np.ndarray,
    loss: str,
    delta: float,
    max_iter: int = 150,
    tol: float = 1e-11,
) -> tuple[np.ndarray, np.ndarray]:
    """Batched projected Levenberg-Marquardt (``lm_minimise``) on the IRLS form of the law's objective.

    theta (S, 6) starts, weights (S, n). Returns end points (S, 6) and their objectives (S,). ``data`` may
    carry one row of observations per start (``LawData.with_y``). A slot not in ``free`` keeps each start's
    own value, so one batch can hold phi fixed at a different value per start (a profile).
    """
    S = len(np.atleast_2d(theta))
    weights = np.broadcast_to(weights, (S, len(data)))

    def evaluate(idx: np.ndarray, th: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = objective(th, data.take(idx), weights[idx], loss=loss, delta=delta, hess=True)
        return out[0], out[1], out[2]

    return lm_minimise(theta, evaluate, bounds.lower, bounds.upper, free, max_iter=max_iter, tol=tol)


def polish_lbfgsb(
    theta0: np.ndarray,
    data: LawData,
    weights: np.ndarray,
    bounds: Bounds,
    free: np.ndarray,
    loss: str,
    delta: float,
    max_iter: int = 15000,
) -> Minimum:
    """L-BFGS-B from theta0 on the exact objective, analytic gradient, tight tolerances."""
    from scipy.optimize import minimize

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        f, g = objective(x, data, weights, loss=loss, delta=delta)
        return float(f[0]), g[0]

    x0 = np.clip(theta0, bounds.lower, bounds.upper)
    bnds = [(lo, hi) if fr else (x, x) for lo, hi, fr, x in zip(bounds.lower, bounds.upper, free, x0, strict=True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = minimize(
            fun,
            x0,
            jac=True,
            method="L-BFGS-B",
            bounds=bnds,
            options={
                "maxiter": max_iter,
                "maxfun": 2 * max_iter,
                "ftol": 1e-15,
                "gtol": 1e-12,
                "maxcor": 30,
                "maxls": 60,
            },
        )
    x = np.asarray(res.x, dtype=float)
    f0 = fun(x0)[0]
    if not res.fun <= f0:  # never return something worse than the start
        x = x0
    f, g = fun(x)
    return Minimum(x, f, *_convergence(x, g, data, weights, bounds, free, loss, delta, res))


def _projected_grad(x: np.ndarray, g: np.ndarray, bounds: Bounds, free: np.ndarray) -> np.ndarray:
    pg = np.where(free, g, 0.0)
    span = bounds.upper - bounds.lower
    at_lo = x <= bounds.lower + 1e-9 * span
    at_hi = x >= bounds.upper - 1e-9 * span
    pg = np.where(at_lo & (pg > 0), 0.0, pg)
    return np.where(at_hi & (pg < 0), 0.0, pg)


def _convergence(
    x: np.ndarray,
    g: np.ndarray,
    data: LawData,
    weights: np.ndarray,
    bounds: Bounds,
    free: np.ndarray,
    loss: str,
    delta: float,
    res: Any,
) -> tuple[bool, int, str, float]:
    """Converged if L-BFGS-B says so, or its projected gradient is tiny next to the per-run gradients.

    With ``ftol = 1e-15`` L-BFGS-B usually ends in "ABNORMAL_TERMINATION_IN_LNSRCH" once the
    objective is flat to machine precision; that is convergence when the gradient is ~0.
    """
    pg = _projected_grad(x, g, bounds, free)
    r, J = residuals(x[None], data, jac=True)
    _, psi, _ = robust_loss(r, loss, delta)
    assert J is not None
    scale = float(np.sum(np.abs(weights * psi)[..., None] * np.abs(J))) + 1e-300
    grad_max = float(np.max(np.abs(pg))) if pg.size else 0.0
    ok = bool(res.success) or grad_max <= 1e-6 * scale
    return ok, int(res.nit), str(res.message), grad_max


def _distinct(thetas: list[np.ndarray], theta: np.ndarray) -> bool:
    """Distinct minima differ by > 0.01 in an exponent or > 0.05 in a log-coefficient."""
    tol = np.where(np.arange(N_THETA) < Slot.ALPHA, 0.05, 0.01)  # log-coefficients a, b, e; exponents
    return all(np.any(np.abs(theta - t) > tol) for t in thetas)


#: above this many runs, the batched screening of starts runs on the design points (see ``Screen``).
SCREEN_ROWS = 1024


@dataclass(frozen=True)
class Screen:
    """The table the batched Levenberg-Marquardt stages run on when it has more than ``SCREEN_ROWS`` runs.

    Why: the batched stages cost starts x runs x steps (10,000 runs: 576 s and 3.4 GB for the default fit),
    but they only decide *where* L-BFGS-B starts; the fit itself is always L-BFGS-B on every run. Runs of
    one design point (r, N_once, N_rec, D: seeds) become one row with their mean loss and their summed
    weight; above ``SCREEN_ROWS`` design points a fixed random subset of them is kept, reweighted.
    """

    data: LawData
    group: np.ndarray  # (n,) row of ``data`` each run maps to; -1 for runs left out of the subset
    scale: float

    @classmethod
    def of(cls, data: LawData, limit: int = SCREEN_ROWS) -> Screen | None:
        if len(data) <= limit:
            return None
        key = np.stack(
            [
                data.r,
                np.round(np.log(data.N_once + 1.0), 9),
                np.round(np.log(data.N_rec + 1.0), 9),
                np.round(data.log_D, 9),
            ],
            axis=1,
        )
        _, first, group = np.unique(key, axis=0, return_index=True, return_inverse=True)
        group = group.ravel()
        m = len(first)
        scale = 1.0
        if m > limit:  # too many design points: a fixed random subset of them (seed 0: reproducible)
            keep = np.sort(np.random.default_rng(0).choice(m, limit, replace=False))
            new = np.full(m, -1)
            new[keep] = np.arange(limit)
            group, first, scale, m = new[group], first[keep], m / limit, limit
        mean_L: np.ndarray = np.bincount(group[group >= 0], weights=data.L[group >= 0], minlength=m)
        mean_L /= np.bincount(group[group >= 0], minlength=m)
        d = LawData.from_arrays(data.N_once[first], data.N_rec[first], np.exp(data.log_D[first]), data.r[first], mean_L)
        return cls(d, group, scale)

    def weights(self, w: np.ndarray) -> np.ndarray:
        """Run weights (n,) or (S, n) -> design-point weights (S, m): the sum over each point's runs."""
        w2 = np.atleast_2d(np.asarray(w, dtype=float))
        keep = self.group >= 0
        out = np.zeros((len(self.data), len(w2)))
        np.add.at(out, self.group[keep], w2[:, keep].T)
        return out.T * self.scale


@single_thread
def multistart(
    data: LawData,
    *,
    weights: np.ndarray | None = None,
    bounds: Bounds | None = None,
    fixed_phi: float | None = None,
    loss: str = PAPER_LOSS,
    delta: float = PAPER_HUBER_DELTA,
    restarts: int = PAPER_RESTARTS,
    polish: int = 8,
    seed: int | np.random.Generator = 0,
    extra_starts: np.ndarray | None = None,
    screen_iter: int = 30,
    advance: int = 64,
) -> list[Minimum]:
    """Best of many starts: the distinct polished minima, best first.

    ``restarts`` uniform starts in the box (plus ``extra_starts``) are advanced together by
    ``screen_iter`` batched Levenberg-Marquardt steps; the ``advance`` best continue to convergence;
    the ``polish`` best distinct end points are polished by L-BFGS-B. With ``fixed_phi`` (or data
    that cannot identify phi) phi is held fixed.
    """
    bounds = bounds or Bounds.paper()
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    c = np.ones(len(data)) if weights is None else np.asarray(weights, dtype=float)
    bounds, free = bounds.pin_phi(fixed_phi, data.phi_identifiable)
    starts = bounds.sample(max(restarts, 1), rng)
    if extra_starts is not None and len(extra_starts):
        starts = np.vstack([np.atleast_2d(extra_starts), starts])
    if not free[PHI]:
        starts[:, PHI] = bounds.lower[PHI]
    screen = Screen.of(data)
    sdata, sc = (data, c[None]) if screen is None else (screen.data, screen.weights(c))
    # Stage 1: every start, a few damped Gauss-Newton steps (most reach their basin in ~20).
    ends, f = lm_batch(starts, sdata, sc, bounds, free, loss, delta, max_iter=screen_iter)
    # Stage 2: the most promising starts run to convergence.
    keep = np.argsort(f, kind="stable")[: max(advance, polish)]
    ends[keep], f[keep] = lm_batch(ends[keep], sdata, sc, bounds, free, loss, delta, max_iter=200)
    order = np.argsort(f, kind="stable")
    chosen: list[np.ndarray] = []
    chosen_f: list[float] = []
    for i in order:
        if not np.isfinite(f[i]):
            break
        if _distinct(chosen, ends[i]):
            chosen.append(ends[i])
            chosen_f.append(float(f[i]))
        if len(chosen) >= max(polish, 1):
            break
    if screen is not None and chosen:  # large table: polish on every run only the end points within 1% of
        # the best screened objective (at most 3): each full polish costs as much as the whole screen
        chosen = [t for t, fi in zip(chosen, chosen_f, strict=True) if fi <= chosen_f[0] * 1.01 + 1e-12][:3]
    minima = [polish_lbfgsb(t, data, c, bounds, free, loss, delta) for t in chosen]
    minima.sort(key=lambda m: m.objective)
    out: list[Minimum] = []
    for m in minima:
        if _distinct([o.theta for o in out], m.theta):
            out.append(m)
    return out
