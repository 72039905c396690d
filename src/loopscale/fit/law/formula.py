"""The joint law's mathematics, written once: every other module evaluates the law through here.

The law (arXiv 2604.21106, Sec. 1 / Eq. 1)::

    L(N_once, N_rec, D, r) = E + A N_eq^-alpha + B D^-beta,    N_eq = N_once + r^phi N_rec

is fitted in log space (arXiv 2604.21106, Sec. 5) on ``theta = (a, b, e, alpha, beta, phi)`` with
``a = log A``, ``b = log B``, ``e = log E``. :class:`Slot` names the six positions, so no module
indexes theta by a literal number. :func:`residuals` gives ``res_i = LSE(t1, t2, t3) - log L_i``
(``t1 = a - alpha log N_eq``, ``t2 = b - beta log D``, ``t3 = e``) and its Jacobian; the derivation
is in ``loopscale.fit.law.solver``'s docstring, which minimises the objective built on them.

Why one module: the law used to be written three times and N_eq five times; a fit, the frontier, the
planner and the report must all mean the same ``r^phi`` (computed as ``exp(phi log r)`` everywhere,
so they agree to the last bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from typing import Any

import numpy as np
import pandas as pd


class Slot(IntEnum):
    """Position of each coefficient in theta (log-space: a = log A, b = log B, e = log E)."""

    A = 0
    B = 1
    E = 2
    ALPHA = 3
    BETA = 4
    PHI = 5


#: names of theta's slots, in order (the keys of the paper's box, ``paper.PAPER_BOX``).
PARAMS: tuple[str, ...] = ("a", "b", "e", "alpha", "beta", "phi")
#: the coefficients as reported (linear scale), in the fit file's order.
COEFFICIENTS: tuple[str, ...] = ("E", "A", "B", "alpha", "beta", "phi")
N_THETA = len(Slot)
PHI = Slot.PHI


class PhiState(StrEnum):
    """What a fit says about phi: estimated, fixed by the user, or undetermined (no looped runs: the law is
    then Chinchilla's and phi has no value). One name for what used to be ``phi is None`` checks."""

    ESTIMATED = "estimated"
    FIXED = "fixed"
    UNDETERMINED = "undetermined"


def slot(theta: np.ndarray, k: Slot) -> np.ndarray:
    """Column ``k`` of a batch of thetas (S, 6) as (S, 1), so it broadcasts against per-run arrays."""
    return np.atleast_2d(theta)[:, int(k) : int(k) + 1]


# ---- N_eq ------------------------------------------------------------------------------------
def r_power(r: Any, phi: Any) -> np.ndarray:
    """r^phi, as exp(phi log r) (the objective's form: every module gets the same bits)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out: np.ndarray = np.exp(np.asarray(phi, dtype=float) * np.log(np.asarray(r, dtype=float)))
    return out


def equivalent_N(N_once: Any, N_rec: Any, r: Any, phi: Any) -> np.ndarray:
    """Quality-equivalent non-looped size N_eq = N_once + r^phi N_rec (arXiv 2604.21106, Eq. 1)."""
    out: np.ndarray = np.asarray(N_once, dtype=float) + r_power(r, phi) * np.asarray(N_rec, dtype=float)
    return out


def cost_equivalent_N(N_once: Any, N_rec: Any, r: Any) -> np.ndarray:
    """Cost-equivalent non-looped size N_once + r N_rec (same training FLOPs for the blocks)."""
    out: np.ndarray = np.asarray(N_once, dtype=float) + np.asarray(r, dtype=float) * np.asarray(N_rec, dtype=float)
    return out


# ---- the law ---------------------------------------------------------------------------------
def loss(theta: np.ndarray, N_once: Any, N_rec: Any, D: Any, r: Any) -> np.ndarray:
    """L for a batch of thetas (S, 6) at points that broadcast against (S, 1): (n,) shared by every
    theta, or (S, K) one row per theta. Returns (S, n) or (S, K)."""
    t = np.atleast_2d(np.asarray(theta, dtype=float))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        m = equivalent_N(N_once, N_rec, r, slot(t, Slot.PHI))
        out: np.ndarray = (
            np.exp(slot(t, Slot.E))
            + np.exp(slot(t, Slot.A) - slot(t, Slot.ALPHA) * np.log(m))
            + np.exp(slot(t, Slot.B) - slot(t, Slot.BETA) * np.log(np.asarray(D, dtype=float)))
        )
    return out


def predict(theta: np.ndarray, N_once: Any, N_rec: Any, D: Any, r: Any) -> np.ndarray:
    """Raw-nat predictions for one theta (6,) or a batch (S, 6) -> the inputs' shape, or (S, *shape)."""
    t = np.asarray(theta, dtype=float)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (N_once, N_rec, D, r)))
    cols = [np.broadcast_to(np.asarray(x, dtype=float), shape).ravel() for x in (N_once, N_rec, D, r)]
    out = loss(t, *cols)
    return out.reshape(shape) if t.ndim == 1 else out.reshape((len(out), *shape))


def r2_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """R^2 on raw nats (NaN when the observations do not vary)."""
    ss_res = float(np.sum((y_true - y_pred) ** 2))
    ss_tot = float(np.sum((y_true - np.mean(y_true)) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


# ---- theta <-> coefficients ------------------------------------------------------------------
def theta_to_params(theta: np.ndarray) -> dict[str, float]:
    """Linear-scale coefficients (E, A, B, alpha, beta, phi) of one theta."""
    t = [float(x) for x in theta]
    return {
        "E": math.exp(t[Slot.E]),
        "A": math.exp(t[Slot.A]),
        "B": math.exp(t[Slot.B]),
        "alpha": t[Slot.ALPHA],
        "beta": t[Slot.BETA],
        "phi": t[Slot.PHI],
    }


def params_to_theta(p: dict[str, Any]) -> np.ndarray:
    """theta of linear-scale coefficients; an undetermined phi (None) is stored as 0."""
    theta = np.empty(N_THETA)
    theta[Slot.A], theta[Slot.B], theta[Slot.E] = math.log(p["A"]), math.log(p["B"]), math.log(p["E"])
    theta[Slot.ALPHA], theta[Slot.BETA] = p["alpha"], p["beta"]
    theta[Slot.PHI] = float(p.get("phi") or 0.0)
    return theta


# ---- the data the objective needs, and its residuals -----------------------------------------
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
        obs = np.full(n_once.shape, np.nan) if L is None else np.broadcast_to(np.asarray(L, float), n_once.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            return cls(
                n_once.ravel(),
                n_rec.ravel(),
                rr.ravel(),
                np.log(rr).ravel(),
                np.log(d).ravel(),
                obs.ravel(),
                np.log(obs).ravel(),
            )

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> LawData:
        return cls.from_arrays(df["N_once"], df["N_rec"], df["D"], df["r"], df["val_loss"])

    def __len__(self) -> int:
        return len(self.N_once)

    def with_y(self, y: np.ndarray) -> LawData:
        """The same runs with other observations: ``y`` (S, n) is one row of log losses per fit, so a
        batch of fits can each see its own simulated table (the wild bootstrap of ``fit.inference.profile``)."""
        y = np.asarray(y, dtype=float)
        return replace(self, y=y, L=np.exp(y))

    def take(self, idx: np.ndarray) -> LawData:
        """The fits ``idx`` of a batch (``with_y``); unbatched data is shared by every fit."""
        return self if self.y.ndim == 1 else replace(self, y=self.y[idx], L=self.L[idx])

    @property
    def phi_identifiable(self) -> bool:
        """phi moves the prediction only through runs with r > 1 and N_rec > 0."""
        return bool(((self.r > 1) & (self.N_rec > 0)).any())


def residuals(theta: np.ndarray, data: LawData, jac: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """res (S, n) in log space and d res / d theta (S, n, 6) for a batch of thetas (S, 6)."""
    a, b, e = slot(theta, Slot.A), slot(theta, Slot.B), slot(theta, Slot.E)
    alpha, beta, phi = slot(theta, Slot.ALPHA), slot(theta, Slot.BETA), slot(theta, Slot.PHI)
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
    J = np.empty((*res.shape, N_THETA))
    J[..., Slot.A] = w1
    J[..., Slot.B] = w2
    J[..., Slot.E] = w3
    J[..., Slot.ALPHA] = -w1 * log_m
    J[..., Slot.BETA] = -w2 * data.log_D
    J[..., Slot.PHI] = -w1 * alpha * (r_phi * data.log_r * data.N_rec) / m
    return res, J
