"""A law variant with a loop-structure term: every looped run pays a constant factor on its loss.

docs/cpu-scale.md measured a "loop-structure tax": a loop that runs once, with exactly the r = 1
model's unique layers, loses 0.03-0.40 nats to the plain stack, and every looped r pays it. The
paper's law (arXiv 2604.21106 §1, eq. 1) has no term for it, so a fit reads it as "a recurrence is
worth less" and pushes phi down. The variant ``loop_tax``::

    L = (1 + kappa [r > 1]) (E + A (N_once + r^phi N_rec)^-alpha + B D^-beta)

has its own phi and one more coefficient, kappa. Why a factor and not an added constant: in the
paper's objective (Huber on log L, §5) a factor is an offset ``s = log(1 + kappa)`` of the looped
runs' log loss, so for a fixed s the fit *is* the joint law on shifted data. The variant is fitted
by profiling s (bounded Brent over s, each step a warm-started batched refit of the joint law),
then the best s gets a full multi-start fit. It is compared with the free law and with phi = 0 / 1 by
the same held-out errors (``checks.run_checks``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.law.formula import LawData, r2_score
from loopscale.fit.law.joint import EstimatorParams, JointLaw, NotFittedError
from loopscale.fit.law.solver import Screen, lm_batch, multistart, polish_lbfgsb, single_thread

#: name of the variant in the fit file and on the CLI.
NAME = "loop_tax"


def _shifted(data: LawData, s: float) -> LawData:
    """The looped runs' log loss lowered by s: fitting the joint law to this is fitting the variant."""
    looped = (data.r > 1).astype(float)
    return dataclasses.replace(data, y=data.y - s * looped, L=data.L * np.exp(-s * looped))


class LoopTaxLaw(EstimatorParams):
    """The joint law times (1 + kappa) on looped runs; same settings and attributes as ``JointLaw``
    (``phi_``, ``theta_``, ``r2_``, ...) plus ``kappa_`` and ``log_tax_`` (s = log(1 + kappa))."""

    name = NAME

    def __init__(self, base: JointLaw | None = None, *, tax_bounds: tuple[float, float] = (-0.7, 0.7)) -> None:
        self.base = base if base is not None else JointLaw()
        self.tax_bounds = tax_bounds

    def __getattr__(self, key: str) -> Any:  # settings (loss, delta, seed, ...) are the base law's
        if key in ("base", "tax_bounds") or key.startswith("__"):
            raise AttributeError(key)
        if key.endswith("_"):  # a learned value: only after fit
            raise NotFittedError(f"this LoopTaxLaw is not fitted yet (no {key}); call fit(table) first")
        return getattr(self.base, key)

    @staticmethod
    def applies(df: pd.DataFrame) -> bool:
        """The factor is measured against r = 1 runs: without them there is nothing to fit."""
        return bool((df["r"] == 1).any())

    def record(self) -> dict[str, Any]:
        """What the fit file stores for this variant (``variants.<v>.law_variants.loop_tax``)."""
        return {
            "params": self.params_,
            "phi": self.phi_,
            "kappa": self.kappa_,
            "objective": self.objective_,
            "converged": self.converged_,
            "r2": self.r2_,
            "rmse": self.rmse_,
            "n_runs": self.n_runs_,
        }

    def clone(self, **overrides: Any) -> LoopTaxLaw:
        """The same variant, unfitted; ``overrides`` are the base law's settings (what ``checks`` refits with)."""
        return LoopTaxLaw(self.base.clone(**overrides), tax_bounds=self.tax_bounds)

    @single_thread
    def fit(self, table: Any, *, extra_starts: np.ndarray | None = None) -> LoopTaxLaw:
        from scipy.optimize import minimize_scalar

        from loopscale.fit.table import as_runs

        runs = as_runs(table)
        data = LawData.from_frame(runs.df)
        law = self.base.clone()
        has_both = bool((data.r == 1).any() and (data.r > 1).any())
        if not has_both:  # without r = 1 the factor is the scale of A, B and E: nothing to profile
            law.fit(runs, extra_starts=extra_starts)
            self._set(law, 0.0, data)
            return self
        bounds, free = law.bounds().pin_phi(law.phi)
        first = multistart(
            data,
            bounds=bounds,
            fixed_phi=law.phi,
            loss=law.loss,
            delta=law.delta,
            restarts=law.restarts,
            polish=4,
            advance=16,
            seed=law.seed,
            extra_starts=extra_starts,
        )
        # The same starts at every s (the basins of s = 0, 12 fixed random points, the last optimum), so the
        # profile is a function of s alone and can switch basins as s moves (a tax moves phi a lot).
        fixed = np.vstack([[m.theta for m in first], bounds.sample(12, np.random.default_rng(law.seed + 3))])
        warm = [first[0].theta]
        ones = np.ones((1, len(data)))
        screen = Screen.of(data)  # large tables: the profile runs on the design points, the polish on every run
        pdata, pw = (data, ones) if screen is None else (screen.data, screen.weights(ones[0]))

        def profile(s: float) -> float:  # the joint law's best objective on data shifted by s
            starts = np.vstack([warm[-1:], fixed])
            ends, f = lm_batch(starts, _shifted(pdata, s), pw, bounds, free, law.loss, law.delta, max_iter=60)
            k = int(np.argmin(f))
            warm.append(ends[k])
            return float(f[k])

        res = minimize_scalar(profile, bounds=self.tax_bounds, method="bounded", options={"xatol": 1e-4})
        s = float(res.x)
        shifted = _shifted(data, s)
        best = polish_lbfgsb(warm[-1], shifted, ones[0], bounds, free, law.loss, law.delta)
        law.phi_identifiable_ = data.phi_identifiable
        law._set(best.theta, fitted_phi=law.phi is None)
        law.objective_, law.converged_ = best.objective, best.converged
        self._set(law, s, data)
        return self

    def _set(self, law: JointLaw, s: float, data: LawData) -> None:
        self.law_ = law
        self.log_tax_ = s
        self.kappa_ = math.expm1(s)
        self.theta_ = law.theta_
        self.phi_ = law.phi_
        self.params_ = {**law.params_, "kappa": self.kappa_}
        self.objective_ = law.objective_
        self.converged_ = law.converged_
        pred = self.predict(data.N_once, data.N_rec, np.exp(data.log_D), data.r)
        self.r2_ = r2_score(data.L, pred)
        self.rmse_ = float(np.sqrt(np.mean((pred - data.L) ** 2)))
        self.n_runs_ = len(data)

    def predict(self, N_once: Any, N_rec: Any = None, D: Any = None, r: Any = None) -> np.ndarray:
        """Loss in nats. Pass arrays, or one DataFrame with columns N_once, N_rec, D, r."""
        if isinstance(N_once, pd.DataFrame):
            df = N_once
            N_once, N_rec, D, r = df["N_once"], df["N_rec"], df["D"], df["r"]
        base = self.law_.predict(N_once, N_rec, D, r)
        out: np.ndarray = base * np.exp(self.log_tax_ * (np.asarray(r, dtype=float) > 1))
        return out
