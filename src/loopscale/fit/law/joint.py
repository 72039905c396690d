"""The joint scaling law as a scikit-learn-style estimator: ``JointLaw().fit(table)``.

The law (arXiv 2604.21106, Sec. 1 / Eq. 1)::

    L(N_once, N_rec, D, r) = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta

is written once in ``loopscale.fit.law.formula`` (N_eq, named theta slots, residuals and Jacobian,
predictions, R^2); it is fitted the paper's way (arXiv 2604.21106, Sec. 5: Huber on log L, many
starts, L-BFGS-B) by ``loopscale.fit.law.solver``. This module holds the estimator and its settings:
parameters only from ``__init__``, ``get_params`` / ``set_params`` / :func:`clone` with scikit-learn's
semantics (hand-written: no scikit-learn dependency), and :class:`NotFittedError` from ``predict``
before ``fit``. The names re-exported below keep ``from loopscale.fit.law.joint import ...`` working.
"""

from __future__ import annotations

import inspect
from typing import Any, Self, TypeVar

import numpy as np
import pandas as pd

from loopscale.errors import ConfigError
from loopscale.fit.law.formula import (
    PARAMS,
    PHI,
    LawData,
    PhiState,
    Slot,
    cost_equivalent_N,
    equivalent_N,
    params_to_theta,
    r2_score,
    theta_to_params,
)
from loopscale.fit.law.formula import predict as predict_theta
from loopscale.fit.law.solver import LOSSES, Bounds, Minimum, Screen, multistart, objective
from loopscale.fit.paper import PAPER_HUBER_DELTA, PAPER_LOSS, PAPER_RESTARTS

__all__ = [
    "LOSSES",
    "PARAMS",
    "PHI",
    "Bounds",
    "JointLaw",
    "LawData",
    "Minimum",
    "NotFittedError",
    "PhiState",
    "Screen",
    "Slot",
    "clone",
    "cost_equivalent_N",
    "equivalent_N",
    "multistart",
    "objective",
    "params_to_theta",
    "predict_theta",
    "r2_score",
    "theta_to_params",
    "validate_settings",
]


class NotFittedError(ValueError, AttributeError):
    """A law was used before ``fit`` (scikit-learn's name; a ValueError and an AttributeError, so callers
    catching either keep working)."""


def validate_settings(
    *,
    loss: str,
    delta: float,
    phi_bounds: tuple[float, float],
    restarts: int,
    polish: int = 1,
    names: dict[str, str] | None = None,
) -> None:
    """The one check of a law's settings (``JointLaw.fit`` and ``FitSettings.validate`` both call it);
    ``names`` maps a setting to the name the user typed (a CLI flag), for the error message."""
    name = {
        "loss": "loss",
        "delta": "delta",
        "phi_bounds": "phi_bounds",
        "restarts": "restarts",
        "polish": "polish",
        **(names or {}),
    }
    if loss not in LOSSES:
        raise ConfigError(name["loss"], f"unknown objective; expected one of {', '.join(LOSSES)}", value=loss)
    if not delta > 0:
        raise ConfigError(name["delta"], "Huber delta must be > 0", value=delta)
    lo, hi = phi_bounds
    if not lo < hi:  # lo == hi is a fixed phi: say so with phi=, so the fit knows phi is not estimated
        raise ConfigError(name["phi_bounds"], "expected lower < upper (to fix phi, set phi)", value=phi_bounds)
    if restarts < 1:
        raise ConfigError(name["restarts"], "expected at least 1", value=restarts)
    if polish < 1:
        raise ConfigError(name["polish"], "expected at least 1", value=polish)


_E = TypeVar("_E")


def clone(estimator: _E, **overrides: Any) -> _E:
    """An unfitted copy with the same parameters (``overrides`` replace some): scikit-learn's ``clone``.

    Parameters are copied as ``get_params(deep=False)`` returns them (a nested estimator is cloned
    too), so a setting added to ``__init__`` can never be lost on a copy again.
    """
    got: dict[str, Any] = estimator.get_params(deep=False)  # type: ignore[attr-defined]  # any estimator
    params = {k: clone(v) if hasattr(v, "get_params") else v for k, v in got.items()}
    return type(estimator)(**{**params, **overrides})


class EstimatorParams:
    """``get_params`` / ``set_params`` read from ``__init__``'s signature (scikit-learn's convention: every
    ``__init__`` argument is stored unchanged as an attribute of the same name)."""

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self._param_names():
            v = getattr(self, k)
            if deep and hasattr(v, "get_params"):
                out.update({f"{k}__{kk}": vv for kk, vv in v.get_params(deep=True).items()})
            out[k] = v
        return out

    def set_params(self, **params: Any) -> Self:
        valid = self._param_names()
        for key, value in params.items():
            head, _, rest = key.partition("__")
            if head not in valid:
                raise ValueError(f"invalid parameter {head!r} for {type(self).__name__}; valid: {', '.join(valid)}")
            if rest:
                getattr(self, head).set_params(**{rest: value})
            else:
                setattr(self, head, value)
        return self

    def clone(self, **overrides: Any) -> Self:
        """An unfitted law with the same settings (``overrides`` replace some): what a refit starts from."""
        return clone(self, **overrides)


# ---- estimator -----------------------------------------------------------------------------
class JointLaw(EstimatorParams):
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
        loss: str = PAPER_LOSS,
        delta: float = PAPER_HUBER_DELTA,
        phi: float | None = None,
        phi_bounds: tuple[float, float] = (-3.0, 3.0),
        restarts: int = PAPER_RESTARTS,
        polish: int = 8,
        seed: int = 0,
        box: dict[str, Any] | None = None,
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

    # -- fitting --
    def bounds(self) -> Bounds:
        return Bounds.paper(self.phi_bounds, self.box)

    def fit(self, table: Any, *, weights: np.ndarray | None = None, extra_starts: np.ndarray | None = None) -> JointLaw:
        from loopscale.fit.table import as_runs

        validate_settings(loss=self.loss, delta=self.delta, phi_bounds=self.phi_bounds, restarts=self.restarts)
        runs = as_runs(table)
        data = LawData.from_frame(runs.df)
        n_free = len(PARAMS) if self.phi is None and data.phi_identifiable else len(PARAMS) - 1
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
        free = np.ones(len(PARAMS), dtype=bool)
        free[PHI] = self.phi is None and self.phi_identifiable_
        span = b.upper - b.lower
        self.at_bounds_ = [
            PARAMS[k]
            for k in range(len(PARAMS))
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
        self.phi_state_ = (
            PhiState.UNDETERMINED
            if self.phi_ is None
            else PhiState.FIXED
            if self.phi is not None
            else PhiState.ESTIMATED
        )
        self.params_ = {**p, "phi": self.phi_}

    @property
    def phi_undetermined(self) -> bool:
        """True when the data cannot determine phi (no looped runs): the fitted law is Chinchilla's."""
        return self._fitted("phi_state_") is PhiState.UNDETERMINED

    def _fitted(self, name: str = "theta_") -> Any:
        try:
            return self.__dict__[name]
        except KeyError:
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet; call fit(table) (or from_params) first"
            ) from None

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
        return predict_theta(self._fitted(), N_once, N_rec, D, r)

    def score(self, table: Any) -> float:
        """R^2 on raw nats for a runs table (DataFrame with val_loss, or a RunsTable/path)."""
        from loopscale.fit.table import as_runs

        df = as_runs(table).df
        return r2_score(df["val_loss"].to_numpy(float), self.predict(df))

    def equivalent_N(self, N_once: Any, N_rec: Any, r: Any) -> np.ndarray:
        """Quality-equivalent non-looped size N_eq = N_once + r^phi N_rec (same loss)."""
        return equivalent_N(N_once, N_rec, r, 1.0 if self.phi_undetermined else self.phi_)

    cost_equivalent_N = staticmethod(cost_equivalent_N)

    def __repr__(self) -> str:
        if "theta_" not in self.__dict__:
            return f"JointLaw(loss={self.loss!r}, delta={self.delta}, phi={self.phi}, restarts={self.restarts})"
        phi = "undetermined" if self.phi_undetermined else f"{self.phi_:.4f}"
        return (
            f"JointLaw(E={self.E_:.4f}, A={self.A_:.4g}, alpha={self.alpha_:.4f}, B={self.B_:.4g}, "
            f"beta={self.beta_:.4f}, phi={phi})"
        )
