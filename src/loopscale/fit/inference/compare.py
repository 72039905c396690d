"""Is a fit consistent with a reference (the paper's law, or another fit file)? `loopscale fit --compare`.

For phi, alpha and beta: the difference fitted - reference, its percentile interval and a two-sided
bootstrap p-value ``2 min(P(d <= 0), P(d >= 0))`` over the draws of the difference (the smallest
level whose percentile interval excludes 0). Draws of the difference:

* reference = a fit file with bootstrap draws: this fit's draws minus the reference's, paired at random
  (the two fits' resamples are independent);
* reference = the paper (arXiv 2604.21106 §1, §5): its coefficients are point values, except phi's 95%
  CI [0.41, 0.53], read as a normal sampling spread (sd = width / 3.92) and added to the difference.
  alpha and beta have no published CI, so their test treats them as exact.

"consistent" means the interval at the fit's CI level contains 0 (p >= 1 - level). For phi the row also
carries ``p_calibrated``: the fit's calibrated likelihood-ratio test of "phi = the reference's value"
(``inference.test_value``; docs/fit.md, "Inference"), which treats that value as exact - the reference's
own uncertainty (the paper's CI, another fit's draws) is in ``p_value`` only. The paper's
alpha and beta were fitted on FineWeb-Edu with the Llama-2 tokenizer at 10^17-10^19 FLOPs; another
corpus or scale moves them for reasons the law does not model, so read those two as a scale check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loopscale.fit.inference.bootstrap import percentile_ci
from loopscale.fit.inference.profile import test_value
from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI
from loopscale.fit.result import FitResult

QUANTITIES: tuple[str, ...] = ("phi", "alpha", "beta")
_Z95 = 1.959963984540054


def _draws(fit: Any, variant: str | None) -> tuple[str, dict[str, float | None], dict[str, np.ndarray]]:
    res = FitResult.of(fit)
    name = variant or res.reference
    rec = res.variant(name)
    params = rec.params.as_dict()
    return name, {k: params[k] for k in QUANTITIES}, {k: rec.bootstrap.draws_of(k) for k in QUANTITIES}


def p_value(d: np.ndarray) -> float | None:
    """Two-sided bootstrap p-value of "the difference is 0" from draws of the difference."""
    d = d[np.isfinite(d)]
    if not d.size:
        return None
    return min(1.0, 2 * min(float(np.mean(d <= 0)), float(np.mean(d >= 0))))


def compare(
    fit: FitResult | dict[str, Any],
    reference: str | FitResult | dict[str, Any],
    *,
    variant: str | None = None,
    reference_variant: str | None = None,
    level: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Per quantity: fitted value, reference value (and CI), difference with interval and p-value, verdict."""
    res = FitResult.of(fit)
    level = float(level or res.ci_level)
    name, own, own_draws = _draws(res, variant)
    rng = np.random.default_rng(seed)
    if isinstance(reference, str):
        if reference != "paper":
            raise ValueError(f"unknown reference {reference!r}; expected 'paper' or a fit file")
        label = "paper (arXiv 2604.21106)"
        ref: dict[str, float | None] = {k: PAPER_COEFFICIENTS[k] for k in QUANTITIES}
        ref_ci: dict[str, tuple[float, float] | None] = {"phi": PAPER_PHI_CI, "alpha": None, "beta": None}
        sd: dict[str, float | None] = {
            "phi": (PAPER_PHI_CI[1] - PAPER_PHI_CI[0]) / (2 * _Z95),
            "alpha": 0.0,
            "beta": 0.0,
        }
        ref_draws = None
    else:
        rname, ref, ref_draws = _draws(reference, reference_variant)
        label = f"{FitResult.of(reference).source.get('path', 'fit file')} [{rname}]"
        ref_ci = {k: percentile_ci(ref_draws[k], level) if ref_draws[k].size else None for k in QUANTITIES}
        sd = {}
    rows = []
    for k in QUANTITIES:
        mine, theirs = own.get(k), ref.get(k)
        row: dict[str, Any] = {
            "quantity": k,
            "fitted": mine,
            "fitted_ci": None,
            "reference": theirs,
            "reference_ci": ref_ci.get(k),
            "difference": None,
            "difference_ci": None,
            "p_value": None,
            "consistent": None,
        }
        d = own_draws[k]
        d = d[np.isfinite(d)]
        if mine is None or theirs is None or not d.size:
            rows.append(row)
            continue
        row["fitted_ci"] = percentile_ci(d, level)
        if ref_draws is None:
            diff = d - theirs - sd[k] * rng.standard_normal(d.size)
        else:
            other = ref_draws[k][np.isfinite(ref_draws[k])]
            if not other.size:
                rows.append(row)
                continue
            diff = d - rng.choice(other, size=d.size, replace=True)
        row["difference"] = float(mine - theirs)
        row["difference_ci"] = percentile_ci(diff, level)
        row["p_value"] = p_value(diff)
        row["consistent"] = bool(row["p_value"] >= 1 - level)
        if k == "phi":  # the calibrated test of phi = the reference's value (fit/inference/profile.py)
            inf = res.variant(name).inference
            row["p_calibrated"] = None if not inf else test_value(inf, float(theirs))
        rows.append(row)
    return {"variant": name, "reference": label, "level": level, "rows": rows}
