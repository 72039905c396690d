"""Compute-optimal analysis: empirical parabola minima and the law-based frontier.

* Empirical optima (arXiv 2604.21106 §4): in each (budget, r) cell, a parabola of loss in
  ``log N`` (N = N_once + N_rec, unique non-embedding params) through the cell's runs; its vertex
  is the compute-optimal size N*, the loss there L*, and D* comes from the cell's own log D vs
  log N line (exact for a fixed budget up to the FLOP formula's curvature). Tokens per parameter
  is D*/N*. A vertex outside the widths tried is flagged ``bracketed = False``.
* Law-based frontier: for a fitted law and the architecture family (a ModelConfig template,
  prelude-recur-coda), minimise L(N_once(d), N_rec(d), D = C / F(d), r) over a continuous width d.
  N_once, N_rec and F come from ``loopscale.accounting``: they are polynomials of degree 2 in d
  (12 d^2 per block, 2 d^2 injection, V d head, 4 d T attention), so three integer widths
  determine them exactly; :func:`width_polynomials` interpolates and checks a fourth width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscale import accounting
from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.fit.law import formula
from loopscale.fit.table import budget_values

_STRIP = ("s", "d_model", "r")


# ---- accounting as a function of a continuous width --------------------------------------
@dataclass(frozen=True)
class WidthPolynomials:
    """N_once(d), N_rec(d), F(d) (training FLOPs/token) for one r, as degree-2 polynomials in d."""

    r: int
    N_once: np.ndarray  # polynomial coefficients, highest power first (np.polyval)
    N_rec: np.ndarray
    flops: np.ndarray
    head_dim: int

    def at(self, d: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d = np.asarray(d, dtype=float)
        return np.polyval(self.N_once, d), np.polyval(self.N_rec, d), np.polyval(self.flops, d)


def template_config(template: dict[str, Any], r: int, d_model: int) -> ModelConfig:
    fields = {k: v for k, v in template.items() if k not in _STRIP}
    return ModelConfig(**{**fields, "r": r, "d_model": d_model})


def width_polynomials(template: dict[str, Any], r: int) -> WidthPolynomials:
    """Interpolate the accounting exactly through three widths; verify at a fourth."""
    head_dim = int(template.get("head_dim", ModelConfig.model_fields["head_dim"].default))
    widths = head_dim * np.array([1, 2, 3, 5])
    vals = []
    for d in widths:
        cfg = template_config(template, r, int(d))
        vals.append((accounting.N_once(cfg), accounting.N_rec(cfg), accounting.train_flops_per_token(cfg)))
    v = np.array(vals, dtype=float)
    coef = np.array([np.polyfit(widths[:3].astype(float), v[:3, j], 2) for j in range(3)])
    check = np.array([np.polyval(coef[j], widths[3]) for j in range(3)])
    if not np.allclose(check, v[3], rtol=1e-9):
        raise RuntimeError("accounting is no longer quadratic in the width; update fit.allocation.width_polynomials")
    return WidthPolynomials(r, coef[0], coef[1], coef[2], head_dim)


def valid_rs(template: dict[str, Any], rs: list[int]) -> list[int]:
    """The r values the template's depth allows (r must divide L_eff - n_prelude - n_coda)."""
    out = []
    for r in rs:
        try:
            template_config(template, int(r), int(template.get("head_dim", 128)))
        except Exception:
            continue
        out.append(int(r))
    return out


# ---- law-based frontier -------------------------------------------------------------------
def law_frontier(
    theta: np.ndarray,
    template: dict[str, Any],
    budgets: list[float] | np.ndarray,
    r: int,
    *,
    d_range: tuple[float, float] | None = None,
    grid: int = 480,
) -> dict[str, np.ndarray]:
    """Compute-optimal width, size, tokens and loss per budget for one r.

    ``theta`` is (6,) or (S, 6) (bootstrap draws): results are (K,) or (S, K) for K budgets.
    Returns d, N (= N_once + N_rec), N_once, N_rec, D, L, tokens_per_param, N_eq, and
    ``interior`` (False where the optimum hit the ends of the width range searched).
    """
    poly = width_polynomials(template, r)
    t = np.atleast_2d(np.asarray(theta, dtype=float))
    C = np.asarray(budgets, dtype=float)
    lo, hi = d_range or (float(poly.head_dim), 2.0**17)
    logd = np.linspace(np.log(lo), np.log(hi), grid)
    d = np.exp(logd)
    n_once, n_rec, flops = poly.at(d)
    D = C[:, None] / flops[None, :]  # (K, G)
    loss = formula.predict(
        t, np.broadcast_to(n_once, D.shape), np.broadcast_to(n_rec, D.shape), D, np.full(D.shape, float(r))
    )  # (S, K, G)
    loss = np.where(np.isfinite(loss), loss, np.inf)
    k = np.argmin(loss, axis=-1)
    interior = (k > 0) & (k < grid - 1)
    kk = np.clip(k, 1, grid - 2)
    idx = np.indices(kk.shape)
    y0 = loss[(*idx, kk - 1)]
    y1 = loss[(*idx, kk)]
    y2 = loss[(*idx, kk + 1)]
    h = logd[1] - logd[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        denom = y0 - 2 * y1 + y2
        shift = np.where(interior & (denom > 0), 0.5 * (y0 - y2) / denom, 0.0)
    shift = np.clip(np.nan_to_num(shift), -1.0, 1.0)
    d_star = np.exp(logd[kk] + shift * h)
    d_star = np.where(interior, d_star, d[k])
    no, nr, f = poly.at(d_star)
    D_star = C / f
    L_star = formula.loss(t, no, nr, D_star, r)  # each theta row at its own optimum: (S, K)
    out = {
        "d": d_star,
        "N_once": no,
        "N_rec": nr,
        "N": no + nr,
        "D": D_star,
        "L": L_star,
        "tokens_per_param": D_star / (no + nr),
        "N_eq": formula.equivalent_N(no, nr, r, formula.slot(t, formula.Slot.PHI)),
        "interior": interior,
    }
    if np.ndim(theta) == 1:
        out = {key: v[0] for key, v in out.items()}
    return out


def power_slope(C: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of log y against log C along the last axis (y: (K,) or (S, K))."""
    x = np.log(np.asarray(C, dtype=float))
    ly = np.log(np.asarray(y, dtype=float))
    xc = x - x.mean()
    with np.errstate(invalid="ignore"):
        slope: np.ndarray = np.sum(xc * (ly - ly.mean(axis=-1, keepdims=True)), axis=-1) / np.sum(xc * xc)
    return slope


def frontier_table(
    theta: np.ndarray, template: dict[str, Any], budgets: list[float], rs: list[int]
) -> tuple[pd.DataFrame, dict[str, float]]:
    """The law-based frontier for one theta as a table, plus fitted exponents per r."""
    rows, exps = [], {}
    base = law_frontier(theta, template, budgets, 1) if 1 in rs else None
    for r in rs:
        fr = law_frontier(theta, template, budgets, r)
        for j, c in enumerate(budgets):
            rows.append(
                {
                    "C": float(c),
                    "r": r,
                    "d": float(fr["d"][j]),
                    "N": float(fr["N"][j]),
                    "N_once": float(fr["N_once"][j]),
                    "N_rec": float(fr["N_rec"][j]),
                    "D": float(fr["D"][j]),
                    "L": float(fr["L"][j]),
                    "tokens_per_param": float(fr["tokens_per_param"][j]),
                    "N_eq": float(fr["N_eq"][j]),
                    "gap_to_r1": float(fr["L"][j] - base["L"][j]) if base is not None else float("nan"),
                    "interior": bool(fr["interior"][j]),
                }
            )
        if len(budgets) >= 2:
            exps[f"N_exponent_r{r}"] = float(power_slope(np.asarray(budgets), fr["N"]))
            exps[f"D_exponent_r{r}"] = float(power_slope(np.asarray(budgets), fr["D"]))
    return pd.DataFrame(rows), exps


def frontier_draws(
    thetas: np.ndarray, template: dict[str, Any], budgets: list[float], rs: list[int]
) -> dict[str, np.ndarray]:
    """Frontier quantities for every bootstrap draw: name -> (B,) arrays, for percentile CIs."""
    out: dict[str, np.ndarray] = {}
    base = law_frontier(thetas, template, budgets, 1)["L"] if 1 in rs else None
    for r in rs:
        fr = law_frontier(thetas, template, budgets, r)
        for j, c in enumerate(budgets):
            tag = f"r{r}_C{c:.3g}"
            out[f"N_opt_{tag}"] = fr["N"][:, j]
            out[f"D_opt_{tag}"] = fr["D"][:, j]
            out[f"L_opt_{tag}"] = fr["L"][:, j]
            out[f"tokens_per_param_{tag}"] = fr["tokens_per_param"][:, j]
            if base is not None and r != 1:
                out[f"gap_to_r1_{tag}"] = fr["L"][:, j] - base[:, j]
        if len(budgets) >= 2:
            out[f"N_exponent_r{r}"] = power_slope(np.asarray(budgets), fr["N"])
            out[f"D_exponent_r{r}"] = power_slope(np.asarray(budgets), fr["D"])
    return out


# ---- empirical optima ---------------------------------------------------------------------
def empirical_optima(df: pd.DataFrame) -> pd.DataFrame:
    """Per (budget, r) cell: the parabola-in-log-N minimum (needs C and >= 3 widths per cell)."""
    if "C" not in df.columns:
        raise ConfigError("C", "empirical optima need a budget column C (FLOPs)")
    work = df.assign(_C=budget_values(df), _N=df["N_once"] + df["N_rec"])
    rows = []
    for (c, r), cell in work.groupby(["_C", "r"], sort=True):
        x = np.log(cell["_N"].to_numpy(float))
        y = cell["val_loss"].to_numpy(float)
        logD = np.log(cell["D"].to_numpy(float))
        row: dict[str, Any] = {"C": float(c), "r": int(r), "n_runs": len(cell), "n_widths": len(np.unique(x))}
        best = int(np.argmin(y))
        xs, method, bracketed = x[best], "best run", False
        if row["n_widths"] >= 3:
            c2, c1, _ = np.polyfit(x, y, 2)
            span = float(x.max() - x.min())
            xv = -c1 / (2 * c2) if c2 > 0 else np.nan
            # a vertex more than one width-range beyond the widths (a cell whose loss is nearly linear in
            # log N) is an extrapolation, not an optimum: the best run stands in (exp of it overflowed)
            if np.isfinite(xv) and x.min() - span <= xv <= x.max() + span:
                bracketed = bool(x.min() <= xv <= x.max())
                xs, method = xv, "parabola"
        L_star = float(np.polyval(np.polyfit(x, y, 2), xs)) if method == "parabola" else float(y[best])
        if len(np.unique(x)) >= 2:
            slope, icpt = np.polyfit(x, logD, 1)
            D_star = float(np.exp(icpt + slope * xs))
        else:
            D_star = float(np.exp(logD[best]))
        N_star = float(np.exp(xs))
        row.update(
            {
                "N_opt": N_star,
                "D_opt": D_star,
                "L_opt": L_star,
                "tokens_per_param": D_star / N_star,
                "method": method,
                "bracketed": bracketed,
            }
        )
        rows.append(row)
    out = pd.DataFrame(rows)
    if len(out) and (out["r"] == 1).any():
        base = out[out["r"] == 1].set_index("C")["L_opt"]
        out["gap_to_r1"] = [L - base.get(c, np.nan) for c, L in zip(out["C"], out["L_opt"], strict=True)]
    else:
        out["gap_to_r1"] = np.nan
    return out


def empirical_exponents(optima: pd.DataFrame) -> dict[str, float]:
    """Slopes of log N*, log D* against log C per r (from the cells whose optimum is bracketed)."""
    out: dict[str, float] = {}
    for r, g in optima.groupby("r"):
        g = g[g["bracketed"]]
        if len(g) >= 2:
            out[f"N_exponent_r{r}"] = float(power_slope(g["C"].to_numpy(), g["N_opt"].to_numpy()))
            out[f"D_exponent_r{r}"] = float(power_slope(g["C"].to_numpy(), g["D_opt"].to_numpy()))
    return out
