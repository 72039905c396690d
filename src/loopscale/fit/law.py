"""The joint scaling law, its objective and gradients, the multi-start optimiser, and the estimator.

The law (arXiv 2604.21106 §1)::

    L(N_once, N_rec, D, r) = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta

is fitted the paper's way (section 5): in log space, with ``a = log A``, ``b = log B``,
``e = log E`` and ``theta = (a, b, e, alpha, beta, phi)``, minimise over the runs ``i``::

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

and ``df/dtheta = sum_i c_i psi(res_i) d res_i/dtheta`` with ``psi = rho'``: ``psi(x) = x`` for
``|x| <= delta``, ``delta sign(x)`` beyond (Huber), ``psi(x) = x`` (MSE). Stacking the rows of
``d res/d theta`` as the Jacobian ``J`` gives ``grad = J^T (c psi)``.

Optimiser. Each random start of the paper's box is first advanced by a batched, damped
Gauss-Newton (Levenberg-Marquardt) step on the IRLS form of the objective,
``H = J^T diag(c omega) J`` with ``omega = psi(res)/res = min(1, delta/|res|)``, for all starts at
once in numpy (restarts vectorised); steps are projected onto the box and accepted only if ``f``
decreases. The best distinct end points are then polished with scipy's L-BFGS-B on the exact
objective with the analytic gradient and tight tolerances (``ftol = 1e-15``: an objective this
small would otherwise stop L-BFGS-B early, the pitfall arXiv 2604.21106 §5 names). The optimum is
a local minimum of the paper's objective; the batched stage only decides where L-BFGS-B starts.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit._threads import single_thread_blas
from loopscale.fit.paper import PAPER_BOX, PAPER_HUBER_DELTA, PAPER_RESTARTS

PARAMS: tuple[str, ...] = ("a", "b", "e", "alpha", "beta", "phi")
PHI = 5
LOSSES: tuple[str, ...] = ("huber", "mse")


# ---- data ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LawData:
    """The columns the objective needs, as float arrays (one entry per run)."""

    N_once: np.ndarray
    N_rec: np.ndarray
    r: np.ndarray
    log_r: np.ndarray
    log_D: np.ndarray
    L: np.ndarray
    y: np.ndarray  # log L

    @classmethod
    def from_arrays(cls, N_once: Any, N_rec: Any, D: Any, r: Any, L: Any | None = None) -> LawData:
        n_once, n_rec, d, rr = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (N_once, N_rec, D, r)))
        loss = np.full(n_once.shape, np.nan) if L is None else np.broadcast_to(np.asarray(L, float), n_once.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            return cls(
                n_once.ravel(),
                n_rec.ravel(),
                rr.ravel(),
                np.log(rr).ravel(),
                np.log(d).ravel(),
                loss.ravel(),
                np.log(loss).ravel(),
            )

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> LawData:
        return cls.from_arrays(df["N_once"], df["N_rec"], df["D"], df["r"], df["val_loss"])

    def __len__(self) -> int:
        return len(self.y)

    @property
    def phi_identifiable(self) -> bool:
        """phi moves the prediction only through runs with r > 1 and N_rec > 0."""
        return bool(((self.r > 1) & (self.N_rec > 0)).any())


# ---- objective -----------------------------------------------------------------------------
def _residuals(theta: np.ndarray, data: LawData, jac: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """res (S, n) and d res/d theta (S, n, 6) for a batch of parameter vectors theta (S, 6)."""
    a, b, e, alpha, beta, phi = (theta[:, k : k + 1] for k in range(6))
    r_phi = np.exp(phi * data.log_r)
    m = data.N_once + r_phi * data.N_rec
    log_m = np.log(m)
    t1 = a - alpha * log_m
    t2 = b - beta * data.log_D
    t3 = np.broadcast_to(e, t1.shape)
    top = np.maximum(np.maximum(t1, t2), t3)
    w1, w2, w3 = np.exp(t1 - top), np.exp(t2 - top), np.exp(t3 - top)
    total = w1 + w2 + w3
    res = top + np.log(total) - data.y
    if not jac:
        return res, None
    w1, w2, w3 = w1 / total, w2 / total, w3 / total
    J = np.empty((*res.shape, 6))
    J[..., 0] = w1
    J[..., 1] = w2
    J[..., 2] = w3
    J[..., 3] = -w1 * log_m
    J[..., 4] = -w2 * data.log_D
    J[..., 5] = -w1 * alpha * (r_phi * data.log_r * data.N_rec) / m
    return res, J


def _rho(res: np.ndarray, loss: str, delta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    loss: str = "huber",
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
        res, J = _residuals(theta, data, jac=grad or hess)
        rho, psi, omega = _rho(res, loss, delta)
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
def _single_thread(fn: Any) -> Any:
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
    def paper(cls, phi_bounds: tuple[float, float] | None = None, box: dict | None = None) -> Bounds:
        spec = dict(PAPER_BOX if box is None else box)
        if phi_bounds is not None:
            spec["phi"] = tuple(phi_bounds)
        lo = np.array([float(spec[k][0]) for k in PARAMS])
        hi = np.array([float(spec[k][1]) for k in PARAMS])
        return cls(lo, hi)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.lower + rng.random((n, 6)) * (self.upper - self.lower)


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


def theta_to_params(theta: np.ndarray) -> dict[str, float]:
    a, b, e, alpha, beta, phi = (float(x) for x in theta)
    return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta, "phi": phi}


def params_to_theta(p: dict[str, float]) -> np.ndarray:
    return np.array(
        [
            math.log(p["A"]),
            math.log(p["B"]),
            math.log(p["E"]),
            p["alpha"],
            p["beta"],
            float(p.get("phi") or 0.0),
        ]
    )


def _lm_batch(
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
    """Batched projected Levenberg-Marquardt on the IRLS form of the objective.

    theta (S, 6) starts, weights (S, n). Returns end points (S, 6) and their objectives (S,).
    """
    theta = np.clip(np.array(theta, dtype=float), bounds.lower, bounds.upper)
    S = len(theta)
    weights = np.broadcast_to(weights, (S, len(data)))
    f, g, H = objective(theta, data, weights, loss=loss, delta=delta, hess=True)
    lam = np.full(S, 1e-3)
    active = np.isfinite(f)
    fixed = ~free
    eye = np.eye(6)
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
        new = np.clip(theta[idx] + step, bounds.lower, bounds.upper)
        fn, gn, Hn = objective(new, data, weights[idx], loss=loss, delta=delta, hess=True)
        better = fn < f[idx]
        gain = np.where(better, (f[idx] - fn) / np.maximum(np.abs(f[idx]), 1e-300), 0.0)
        acc = idx[better]
        theta[acc], f[acc], g[acc], H[acc] = new[better], fn[better], gn[better], Hn[better]
        lam[acc] = np.maximum(lam[acc] / 3.0, 1e-12)
        lam[idx[~better]] *= 4.0
        done = (better & (gain < tol)) | (lam[idx] > 1e10)
        active[idx[done]] = False
    return theta, f


def _polish(
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
    r, J = _residuals(x[None], data, jac=True)
    _, psi, _ = _rho(r, loss, delta)
    assert J is not None
    scale = float(np.sum(np.abs(weights * psi)[..., None] * np.abs(J))) + 1e-300
    grad_max = float(np.max(np.abs(pg))) if pg.size else 0.0
    ok = bool(res.success) or grad_max <= 1e-6 * scale
    return ok, int(res.nit), str(res.message), grad_max


def _distinct(thetas: list[np.ndarray], theta: np.ndarray) -> bool:
    """Distinct minima differ by > 0.01 in an exponent or > 0.05 in a log-coefficient."""
    tol = np.array([0.05, 0.05, 0.05, 0.01, 0.01, 0.01])
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
        key = np.stack([data.r, np.round(np.log(data.N_once + 1.0), 9), np.round(np.log(data.N_rec + 1.0), 9),
                        np.round(data.log_D, 9)], axis=1)
        _, first, group = np.unique(key, axis=0, return_index=True, return_inverse=True)
        group = group.ravel()
        m = len(first)
        scale = 1.0
        if m > limit:  # too many design points: a fixed random subset of them (seed 0: reproducible)
            keep = np.sort(np.random.default_rng(0).choice(m, limit, replace=False))
            new = np.full(m, -1)
            new[keep] = np.arange(limit)
            group, first, scale, m = new[group], first[keep], m / limit, limit
        mean_L = np.bincount(group[group >= 0], weights=data.L[group >= 0], minlength=m)
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


@_single_thread
def multistart(
    data: LawData,
    *,
    weights: np.ndarray | None = None,
    bounds: Bounds | None = None,
    fixed_phi: float | None = None,
    loss: str = "huber",
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
    free = np.ones(6, dtype=bool)
    if fixed_phi is not None or not data.phi_identifiable:
        free[PHI] = False
    phi_value = fixed_phi if fixed_phi is not None else 0.0
    if not free[PHI]:
        lo, hi = bounds.lower.copy(), bounds.upper.copy()
        lo[PHI] = hi[PHI] = phi_value
        bounds = Bounds(lo, hi)
    starts = bounds.sample(max(restarts, 1), rng)
    if extra_starts is not None and len(extra_starts):
        starts = np.vstack([np.atleast_2d(extra_starts), starts])
    if not free[PHI]:
        starts[:, PHI] = phi_value
    screen = Screen.of(data)
    sdata, sc = (data, c[None]) if screen is None else (screen.data, screen.weights(c))
    # Stage 1: every start, a few damped Gauss-Newton steps (most reach their basin in ~20).
    ends, f = _lm_batch(starts, sdata, sc, bounds, free, loss, delta, max_iter=screen_iter)
    # Stage 2: the most promising starts run to convergence.
    keep = np.argsort(f, kind="stable")[: max(advance, polish)]
    ends[keep], f[keep] = _lm_batch(ends[keep], sdata, sc, bounds, free, loss, delta, max_iter=200)
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
    minima = [_polish(t, data, c, bounds, free, loss, delta) for t in chosen]
    minima.sort(key=lambda m: m.objective)
    out: list[Minimum] = []
    for m in minima:
        if _distinct([o.theta for o in out], m.theta):
            out.append(m)
    return out


# ---- metrics -------------------------------------------------------------------------------
def r2_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    ss_res = float(np.sum((y_true - y_pred) ** 2))
    ss_tot = float(np.sum((y_true - np.mean(y_true)) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def predict_theta(theta: np.ndarray, N_once: Any, N_rec: Any, D: Any, r: Any) -> np.ndarray:
    """Raw-nat predictions for one theta (6,) or a batch (S, 6) -> (n,) or (S, n)."""
    t = np.asarray(theta, dtype=float)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (N_once, N_rec, D, r)))
    data = LawData.from_arrays(N_once, N_rec, D, r)
    a, b, e, alpha, beta, phi = (np.atleast_2d(t)[:, k : k + 1] for k in range(6))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        m = data.N_once + np.exp(phi * data.log_r) * data.N_rec
        out = np.exp(e) + np.exp(a - alpha * np.log(m)) + np.exp(b - beta * data.log_D)
    return out.reshape(shape) if t.ndim == 1 else out.reshape((len(out), *shape))


# ---- estimator -----------------------------------------------------------------------------
class JointLaw:
    """L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta as a scikit-learn-style estimator.

    ``JointLaw().fit(table)`` returns the fitted law; learned values end in ``_`` (``phi_``,
    ``alpha_``, ``params_``, ``r2_``, ...). Settings:

    loss         "huber" (the paper's: summed Huber in log space) or "mse" (summed squares / 2)
    delta        Huber delta (1e-3, the paper's)
    phi          fix phi to this value (restricted fit); None fits it
    phi_bounds   (lo, hi) box for phi (default the paper's [-3, 3])
    restarts     random starts in the paper's box (500, the paper's)
    polish       distinct best end points polished by L-BFGS-B
    seed         seed of the random starts
    advance      starts run to convergence after the batched screening (the rest stop there)
    """

    def __init__(
        self,
        *,
        loss: str = "huber",
        delta: float = PAPER_HUBER_DELTA,
        phi: float | None = None,
        phi_bounds: tuple[float, float] = (-3.0, 3.0),
        restarts: int = PAPER_RESTARTS,
        polish: int = 8,
        seed: int = 0,
        box: dict | None = None,
        advance: int = 64,
    ) -> None:
        self.loss = loss
        self.delta = delta
        self.phi = phi
        self.phi_bounds = phi_bounds
        self.restarts = restarts
        self.polish = polish
        self.seed = seed
        self.box = box
        self.advance = advance

    def clone(self, **overrides: Any) -> JointLaw:
        """An unfitted law with the same settings (``overrides`` replace some): what a refit starts from."""
        keys = ("loss", "delta", "phi", "phi_bounds", "restarts", "polish", "seed", "box", "advance")
        return type(self)(**{**{k: getattr(self, k) for k in keys}, **overrides})

    # -- fitting --
    def bounds(self) -> Bounds:
        return Bounds.paper(self.phi_bounds, self.box)

    def fit(self, table: Any, *, weights: np.ndarray | None = None, extra_starts: np.ndarray | None = None) -> JointLaw:
        from loopscale.errors import ConfigError
        from loopscale.fit.table import as_runs

        if self.loss not in LOSSES:
            raise ConfigError("loss", f"unknown objective; expected one of {', '.join(LOSSES)}", value=self.loss)
        lo, hi = self.phi_bounds
        if not lo <= hi:
            raise ConfigError("phi_bounds", "lower bound above upper bound", value=self.phi_bounds)
        runs = as_runs(table)
        data = LawData.from_frame(runs.df)
        n_free = 6 if self.phi is None and data.phi_identifiable else 5
        if len(data) <= n_free:  # as many runs as parameters fit exactly: a zero-width CI, no information
            raise ConfigError(
                "rows",
                f"the law has {n_free} free parameters here; need more runs than that ({n_free + 1} or more) to fit",
                value=len(data),
                source=runs.source,
            )
        minima = multistart(
            data,
            weights=weights,
            bounds=self.bounds(),
            fixed_phi=self.phi,
            loss=self.loss,
            delta=self.delta,
            restarts=self.restarts,
            polish=self.polish,
            seed=self.seed,
            extra_starts=extra_starts,
            advance=self.advance,
        )
        if not minima:
            raise ConfigError(
                "rows",
                "the objective is not finite at any start; check the table's units",
                source=runs.source,
            )
        best = minima[0]
        self.phi_identifiable_ = data.phi_identifiable
        self._set(best.theta, fitted_phi=self.phi is None and self.phi_identifiable_)
        self.objective_ = best.objective
        self.converged_ = best.converged
        self.n_iter_ = best.n_iter
        self.message_ = best.message
        self.grad_max_ = best.grad_max
        b = self.bounds()
        free = np.ones(6, dtype=bool)
        free[PHI] = self.phi is None and self.phi_identifiable_
        span = b.upper - b.lower
        self.at_bounds_ = [
            PARAMS[k]
            for k in range(6)
            if free[k]
            and (best.theta[k] <= b.lower[k] + 1e-6 * span[k] or best.theta[k] >= b.upper[k] - 1e-6 * span[k])
        ]
        rtol = 0.01
        self.minima_ = [
            {
                "params": m.params(),
                "objective": m.objective,
                "converged": m.converged,
                "near_optimal": m.objective <= best.objective * (1 + rtol) + 1e-12,
            }
            for m in minima
        ]
        self.n_near_optimal_ = sum(m["near_optimal"] for m in self.minima_)
        self.n_runs_ = len(data)
        pred = self.predict(data.N_once, data.N_rec, np.exp(data.log_D), data.r)
        self.r2_ = r2_score(data.L, pred)
        self.rmse_ = float(np.sqrt(np.mean((pred - data.L) ** 2)))
        self.rmse_per_r_ = {
            int(r): float(np.sqrt(np.mean((pred[data.r == r] - data.L[data.r == r]) ** 2))) for r in np.unique(data.r)
        }
        return self

    def _set(self, theta: np.ndarray, fitted_phi: bool = True) -> None:
        self.theta_ = np.asarray(theta, dtype=float).copy()
        p = theta_to_params(self.theta_)
        self.E_, self.A_, self.B_ = p["E"], p["A"], p["B"]
        self.alpha_, self.beta_ = p["alpha"], p["beta"]
        # phi_ is None when the data cannot determine it (r = 1 only): the law is then Chinchilla's.
        self.phi_ = p["phi"] if fitted_phi or self.phi is not None else None
        self.params_ = {**p, "phi": self.phi_}

    @classmethod
    def from_params(
        cls, *, E: float, A: float, B: float, alpha: float, beta: float, phi: float | None, **settings: Any
    ) -> JointLaw:
        """A law with given coefficients (e.g. the paper's), ready to predict."""
        law = cls(**settings)
        theta = params_to_theta(
            {"E": E, "A": A, "B": B, "alpha": alpha, "beta": beta, "phi": 0.0 if phi is None else phi}
        )
        law.phi_identifiable_ = phi is not None
        law._set(theta, fitted_phi=phi is not None)
        return law

    # -- using a fitted law --
    def predict(self, N_once: Any, N_rec: Any = None, D: Any = None, r: Any = None) -> np.ndarray:
        """Loss in nats. Pass arrays, or one DataFrame with columns N_once, N_rec, D, r."""
        if isinstance(N_once, pd.DataFrame):
            df = N_once
            N_once, N_rec, D, r = df["N_once"], df["N_rec"], df["D"], df["r"]
        return predict_theta(self.theta_, N_once, N_rec, D, r)

    def score(self, table: Any) -> float:
        """R^2 on raw nats for a runs table (DataFrame with val_loss, or a RunsTable/path)."""
        from loopscale.fit.table import as_runs

        df = as_runs(table).df
        return r2_score(df["val_loss"].to_numpy(float), self.predict(df))

    def equivalent_N(self, N_once: Any, N_rec: Any, r: Any) -> np.ndarray:
        """Quality-equivalent non-looped size N_eq = N_once + r^phi N_rec (same loss)."""
        phi = 1.0 if self.phi_ is None else self.phi_
        return np.asarray(N_once, float) + np.power(np.asarray(r, float), phi) * np.asarray(N_rec, float)

    @staticmethod
    def cost_equivalent_N(N_once: Any, N_rec: Any, r: Any) -> np.ndarray:
        """Cost-equivalent non-looped size N_once + r N_rec (same training FLOPs for the blocks)."""
        return np.asarray(N_once, float) + np.asarray(r, float) * np.asarray(N_rec, float)

    def __repr__(self) -> str:
        if not hasattr(self, "theta_"):
            return f"JointLaw(loss={self.loss!r}, delta={self.delta}, phi={self.phi}, restarts={self.restarts})"
        phi = "undetermined" if self.phi_ is None else f"{self.phi_:.4f}"
        return (
            f"JointLaw(E={self.E_:.4f}, A={self.A_:.4g}, alpha={self.alpha_:.4f}, B={self.B_:.4g}, "
            f"beta={self.beta_:.4f}, phi={phi})"
        )
