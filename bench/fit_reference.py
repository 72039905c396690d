"""A straightforward scipy implementation of the paper's fit, for comparison with loopscale.fit.

What a careful researcher would write first (and what the Chinchilla replications do): the same
objective (log-space LSE, summed Huber delta = 1e-3), scipy's L-BFGS-B from each of 500 uniform
starts in the paper's box, gradients by finite differences (``jac=None``), the best end point
wins; the bootstrap refits each resample the same way. No vectorisation, no warm starts.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber, logsumexp

BOX = np.array([[-5, 35], [-5, 35], [-3, 2], [0, 2.5], [0, 2.5], [-3, 3]], dtype=float)  # a, b, e, alpha, beta, phi


def objective(theta, n_once, n_rec, r, D, L, w, delta=1e-3):
    a, b, e, alpha, beta, phi = theta
    n_eff = n_once + r**phi * n_rec
    pred = logsumexp([a - alpha * np.log(n_eff), b - beta * np.log(D), np.full_like(D, e)], axis=0)
    return float(np.sum(w * huber(delta, pred - np.log(L))))


def fit(df, *, starts=500, seed=0, weights=None, tight=False):
    """Best of ``starts`` L-BFGS-B runs; returns (theta, objective, n_starts_run).

    ``tight``: ftol = 1e-15, gtol = 1e-12 instead of scipy's defaults (which stop early on an
    objective this small, the pitfall arXiv 2604.21106 §5 names).
    """
    options = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 15000} if tight else {}
    cols = [df[c].to_numpy(float) for c in ("N_once", "N_rec", "r", "D", "val_loss")]
    w = np.ones(len(df)) if weights is None else weights
    rng = np.random.default_rng(seed)
    best = None
    for x0 in BOX[:, 0] + rng.random((starts, 6)) * (BOX[:, 1] - BOX[:, 0]):
        res = minimize(objective, x0, args=(*cols, w), method="L-BFGS-B", options=options)
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    return best.x, best.fun, starts
