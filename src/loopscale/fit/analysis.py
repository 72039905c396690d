"""The whole fit of a runs table, as the CLI runs it: one function in, one fit-file dict out.

For each variant (its r > 1 runs plus every r = 1 run): the joint law (best of many starts),
the restricted fits phi = 0 and phi = 1, per-r Chinchilla fits, a block bootstrap over
(budget, r) cells with percentile CIs for every coefficient and derived quantity, the empirical
and law-based compute-optimal analysis, the validation checks, and the calibrated inference
(``fit/inference.py``: phi's profile-likelihood interval and tests from a wild cluster bootstrap, the
record every verdict and sentence reads). Between variants: Delta-phi with its calibrated interval and
test, and the bootstrap CI from *paired* resamples (one cell draw is shared by all variants, so the
shared r = 1 runs enter both fits identically).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscale import grids
from loopscale.errors import ConfigError
from loopscale.fit import checks as checks_mod
from loopscale.fit import inference as inference_mod
from loopscale.fit import optima
from loopscale.fit import shared as shared_mod
from loopscale.fit.bootstrap import cell_counts, percentile_ci, refit_batch
from loopscale.fit.formula import COEFFICIENTS, LawData, params_to_theta, r_power, theta_to_params
from loopscale.fit.law import JointLaw, validate_settings
from loopscale.fit.paper import PAPER_BOOTSTRAP, PAPER_HUBER_DELTA, PAPER_RESTARTS
from loopscale.fit.table import as_runs, budget_values, is_control_refit, r1_anchor, tokens_per_step
from loopscale.fit.variants import REGISTRY
from loopscale.fit.verdict import data_rule

#: FitSettings field -> JointLaw parameter: the law's settings, under the names the CLI and config use.
LAW_FIELDS: dict[str, str] = {
    "loss": "loss",
    "delta": "delta",
    "phi_bounds": "phi_bounds",
    "fixed_phi": "phi",
    "restarts": "restarts",
    "polish": "polish",
    "seed": "seed",
}
#: the command-line flag of each law setting (for one-line errors).
_FLAGS = {"loss": "--loss", "delta": "--delta", "phi_bounds": "--phi-bounds", "restarts": "--restarts"}


@dataclass
class FitSettings:
    """Every option of a fit; stored verbatim in the fit file.

    The law's own settings (``LAW_FIELDS``) are validated by ``law.validate_settings`` and become a
    ``JointLaw`` through :meth:`law`, so the two never disagree; ``fixed_phi`` is JointLaw's ``phi``.
    """

    loss: str = "huber"
    delta: float = PAPER_HUBER_DELTA
    phi_bounds: tuple[float, float] = (-3.0, 3.0)
    fixed_phi: float | None = None
    restarts: int = PAPER_RESTARTS
    polish: int = 8
    bootstrap: int = PAPER_BOOTSTRAP
    bootstrap_random_starts: int = 8
    lr_draws: int = 2000  # wild-bootstrap tables calibrating the profile-likelihood interval and tests (0: off)
    ci_level: float = 0.95
    seed: int = 0
    restricted: tuple[float, ...] = (0.0, 1.0)
    per_r: bool = True
    checks: bool = True
    checks_restarts: int = 100
    shared: bool = True  # Δφ also under the shared-law reading (fit/shared.py), held-out-tested when checks
    variants: list[str] | None = None
    reference_variant: str | None = None
    reference_r: int | None = None  # a looped-only fit's declared reference r (CLI: --r without 1)
    law_variants: tuple[str, ...] = field(default_factory=lambda: tuple(REGISTRY))  # beyond phi = 0 / 1
    template: dict[str, Any] = field(default_factory=lambda: dict(grids.PAPER_MODEL))

    def validate(self) -> None:
        validate_settings(loss=self.loss, delta=self.delta, phi_bounds=self.phi_bounds, restarts=self.restarts,
                          names=_FLAGS)
        if self.bootstrap < 0:
            raise ConfigError("--bootstrap", "expected 0 (off) or a number of resamples", value=self.bootstrap)
        if self.lr_draws < 0 or 0 < self.lr_draws < 100:
            raise ConfigError("--lr-draws", "expected 0 (off) or at least 100 bootstrap tables", value=self.lr_draws)
        if not 0 < self.ci_level < 1:
            raise ConfigError("--ci", "expected a level between 0 and 1", value=self.ci_level)

    def law(self, phi: float | None = None, restarts: int | None = None) -> JointLaw:
        """The (unfitted) joint law of these settings; ``phi`` / ``restarts`` override the settings'."""
        law = JointLaw().set_params(**{p: getattr(self, f) for f, p in LAW_FIELDS.items()})
        if phi is not None:
            law.set_params(phi=phi)
        if restarts:
            law.set_params(restarts=restarts)
        return law


# ---- helpers -------------------------------------------------------------------------------
def bootstrap_cells(df: pd.DataFrame) -> tuple[np.ndarray, str]:
    """Cell id per run and the unit's name: (budget, r) cells, else single runs."""
    if "C" in df.columns:
        C = budget_values(df)
    elif "flops_per_token" in df.columns:
        C = np.array([float(f"{v:.3g}") for v in df["D"].to_numpy(float) * df["flops_per_token"].to_numpy(float)])
    else:
        return np.arange(len(df)), "run"
    key = pd.Series([f"{c:.3g}|{r}" for c, r in zip(C, df["r"], strict=True)])
    return pd.factorize(key)[0], "cell (budget, r)"


def derived_from_params(p: dict[str, Any], rs: list[int]) -> dict[str, Any]:
    """Quantities derived from the six coefficients (works on floats or on arrays of draws)."""
    alpha, beta, phi = (np.asarray(p[k], dtype=float) for k in ("alpha", "beta", "phi"))
    out: dict[str, Any] = {}
    for r in rs:
        if r > 1:  # a repeated block's worth in unique blocks (formula.r_power: the law's own r^phi)
            out[f"r_phi_{r}"] = r_power(float(r), phi)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["N_exponent_6ND"] = beta / (alpha + beta)  # Chinchilla's a = beta/(alpha+beta) for C = 6ND
        out["D_exponent_6ND"] = alpha / (alpha + beta)
    return out


def _float(x: Any) -> float:
    return float(np.asarray(x))


def _law_record(law: JointLaw) -> dict[str, Any]:
    return {
        "params": law.params_,
        "theta": law.theta_.tolist(),
        "objective": law.objective_,
        "converged": law.converged_,
        "n_iter": law.n_iter_,
        "message": law.message_,
        "grad_max": law.grad_max_,
        "at_bounds": law.at_bounds_,
        "minima": law.minima_,
        "n_near_optimal": law.n_near_optimal_,
        "phi_identifiable": law.phi_identifiable_,
    }


def _metrics(law: JointLaw) -> dict[str, Any]:
    return {
        "r2": law.r2_,
        "rmse": law.rmse_,
        "rmse_per_r": {str(k): v for k, v in law.rmse_per_r_.items()},
        "n_runs": law.n_runs_,
    }


# ---- the fit ---------------------------------------------------------------------------------
def fit_runs(
    table: Any, settings: FitSettings | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Fit a runs table; returns the fit-file dict (see docs/fit.md)."""
    settings = settings or FitSettings()
    settings.validate()
    say = progress or (lambda _msg: None)
    t_start = time.perf_counter()
    runs = as_runs(table)
    variants = list(settings.variants) if settings.variants else runs.variants
    for v in variants:
        runs.for_variant(v)  # raises a one-line error for an unknown variant
    ref = settings.reference_variant or ("baseline" if "baseline" in variants else variants[0])
    if ref not in variants:
        variants.insert(0, ref)
    selected = runs.subset(np.logical_or.reduce([runs.variant_mask(v) for v in variants]))
    df_all = selected.df
    warnings_: list[str] = []
    if runs.n_excluded:
        warnings_.append(
            f"excluded {runs.n_excluded} run(s) that did not finish: "
            + ", ".join(f"{k} x{n}" for k, n in sorted(runs.excluded.items()))
        )

    cells, unit = bootstrap_cells(df_all)
    if settings.bootstrap and unit == "run":
        warnings_.append(
            "no budget column C (or flops_per_token): bootstrap resamples single runs, not "
            "(budget, r) cells; CIs may be too narrow"
        )
    # cells are 0..K-1 (pd.factorize); one (B, K) draw of cell counts serves every variant (paired).
    counts = cell_counts(int(cells.max()) + 1, settings.bootstrap, np.random.default_rng(settings.seed))
    W_all = counts[:, cells]
    # one wild-bootstrap draw per cell, shared by every variant (paired, as the block bootstrap's counts)
    V_all = inference_mod.webb_weights(int(cells.max()) + 1, settings.lr_draws,
                                       np.random.default_rng([settings.seed, 1]))
    inf_state: dict[str, inference_mod.VariantInference] = {}

    budgets = sorted(set(budget_values(df_all))) if "C" in df_all.columns else list(grids.PAPER_BUDGETS)
    template = dict(settings.template)

    out_variants: dict[str, Any] = {}
    phi_draws: dict[str, np.ndarray] = {}
    frames: dict[str, pd.DataFrame] = {}
    for v in variants:
        mask = selected.variant_mask(v)
        vruns = selected.subset(mask)
        vdf = vruns.df
        frames[v] = vdf
        fits = None
        rs = sorted(int(r) for r in set(vdf["r"]))
        rule = data_rule(vdf, phi_free=settings.fixed_phi is None, reference_r=settings.reference_r)
        warnings_ += [f"[{v}] {w}" for w in rule.warnings]
        say(f"[{v}] joint law: {settings.restarts} starts on {len(vdf)} runs")
        law = settings.law().fit(vruns)
        rec: dict[str, Any] = {
            "n_runs": len(vdf),
            "rs": rs,
            "law": _law_record(law),
            "metrics": _metrics(law),
            "identifiability": rule.as_dict(),
        }
        if not law.converged_:
            warnings_.append(f"[{v}] the optimiser did not converge ({law.message_})")
        if law.at_bounds_:
            warnings_.append(f"[{v}] parameters at the box's bounds: {', '.join(law.at_bounds_)}")
        if law.n_near_optimal_ > 1:
            warnings_.append(
                f"[{v}] {law.n_near_optimal_} distinct minima within 1% of the best objective; "
                "see law.minima in the fit file"
            )
        derived = derived_from_params(law.params_ | {"phi": np.nan if law.phi_undetermined else law.phi_}, rs)
        rec["derived"] = {k: _float(x) for k, x in derived.items()}

        # restricted fits and per-r Chinchilla fits
        rec["restricted"] = {}
        if law.phi_identifiable_ and settings.fixed_phi is None:
            for phi in settings.restricted:
                say(f"[{v}] restricted fit phi = {phi:g}")
                rl = settings.law(phi=phi).fit(vruns, extra_starts=law.theta_[None])
                rec["restricted"][f"phi={phi:g}"] = {
                    "params": rl.params_,
                    "objective": rl.objective_,
                    "converged": rl.converged_,
                    **_metrics(rl),
                }
                if settings.checks:
                    rec["restricted"][f"phi={phi:g}"]["held_out"] = checks_mod.run_checks(
                        rl, vruns, restarts=settings.checks_restarts, split=False)["held_out"]
        rec["law_variants"] = _law_variants(law, vruns, settings, say, v) if law.phi_identifiable_ else {}
        rec["per_r"] = {}
        if settings.per_r:
            for r in rs:
                sub = vruns.subset(vdf["r"] == r)
                if len(sub.df) < 6:
                    continue
                say(f"[{v}] Chinchilla fit r = {r}")
                cl = settings.law(phi=0.0, restarts=max(settings.restarts // 2, 50)).fit(sub)
                p = {k: cl.params_[k] for k in ("E", "A", "B", "alpha", "beta")}
                rec["per_r"][str(r)] = {
                    "params": p,
                    "objective": cl.objective_,
                    "converged": cl.converged_,
                    **_metrics(cl),
                }

        # bootstrap
        boot: dict[str, Any] = {
            "n": int(settings.bootstrap),
            "unit": unit,
            "n_cells": len(np.unique(cells[mask])),
        }
        if settings.bootstrap:
            say(f"[{v}] bootstrap: {settings.bootstrap} resamples")
            W = W_all[:, mask]
            warm = np.array([law.theta_] + [_theta_of(m) for m in law.minima_[1:] if m["near_optimal"]])
            fits = refit_batch(
                LawData.from_frame(vdf),
                W,
                warm,
                bounds=law.bounds(),
                fixed_phi=law.phi,
                loss=settings.loss,
                delta=settings.delta,
                random_starts=settings.bootstrap_random_starts,
                seed=settings.seed + 1,
                progress=lambda done, total, v=v: say(f"[{v}] bootstrap: {done}/{total} resamples"),
            )
            P = {k: np.array([theta_to_params(t)[k] for t in fits.theta]) for k in COEFFICIENTS}
            if law.phi_undetermined:
                P["phi"] = np.full(len(fits.theta), np.nan)
            else:
                P["phi"] = np.where(fits.phi_identifiable | (law.phi is not None), P["phi"], np.nan)
            phi_draws[v] = P["phi"]
            D = derived_from_params(P, rs)
            boot["ci_level"] = settings.ci_level
            boot["converged_fraction"] = float(fits.converged.mean())
            boot["phi_undetermined_draws"] = int(np.sum(~np.isfinite(P["phi"]))) if not law.phi_undetermined else None
            boot["ci"] = {k: percentile_ci(x, settings.ci_level) for k, x in {**P, **D}.items()}
            boot["at_bounds"] = _at_bounds_counts(fits.theta, law.bounds(), law.phi is None)
            boot["data_rule_draws"] = _data_rule_draws(W, vdf["r"].to_numpy(int))
            boot["draws"] = {
                **{k: x for k, x in P.items()},
                "objective": fits.objective,
                "converged": fits.converged,
            }
            if fits.converged.mean() < 0.95:
                warnings_.append(f"[{v}] {100 * (1 - fits.converged.mean()):.0f}% of bootstrap refits did not converge")
        rec["bootstrap"] = boot

        # compute-optimal analysis
        say(f"[{v}] compute-optimal analysis")
        rec["optima"] = _optima(law, vdf, template, budgets, rs, boot, fits, settings, warnings_, v)

        if settings.checks:
            say(f"[{v}] validation: extrapolation, leave-one-r-out, half split")
            rec["checks"] = checks_mod.run_checks(law, vruns, restarts=settings.checks_restarts)
            if not law.phi_undetermined and len(rs) == 2:
                warnings_.append(
                    f"[{v}] leave-one-r-out skipped: with two r values each refit sees one r, where φ is "
                    "undetermined or confounded with A, so held-out comparisons of φ = 0 / 1 rest on the "
                    "top-budget extrapolation alone"
                )
        if settings.lr_draws and law.phi_identifiable_ and settings.fixed_phi is None:
            say(f"[{v}] inference: profile of φ, {settings.lr_draws} wild-bootstrap tables")
            state = inference_mod.VariantInference.run(
                law.theta_, law.objective_, law.bounds(), LawData.from_frame(vdf), cells[mask], V_all,
                settings.loss, settings.delta, settings.seed)
            inf_state[v] = state
            rec["inference"] = state.record(settings.ci_level, rec, boot, tuple(settings.restricted),
                                             paper=not is_control_refit(v))
            if settings.checks:
                _held_out_of_rejected(rec, law, vruns, settings)
        out_variants[v] = rec

    delta_phi = []
    for v in variants:
        if v == ref or r1_anchor(v) != r1_anchor(ref) or not ((v in phi_draws and ref in phi_draws) or
                                                   (v in inf_state and ref in inf_state)):
            continue
        a, b = out_variants[ref]["law"]["params"]["phi"], out_variants[v]["law"]["params"]["phi"]
        if a is None or b is None:
            continue
        d = phi_draws[v] - phi_draws[ref] if v in phi_draws and ref in phi_draws else np.array([])
        finite = d[np.isfinite(d)]
        entry: dict[str, Any] = {
            "reference": ref,
            "variant": v,
            "delta_phi": b - a,
            "ci": percentile_ci(d, settings.ci_level),
            "fraction_above_zero": float(np.mean(finite > 0)) if finite.size else None,
            "draws": d,
        }
        if ref in inf_state and v in inf_state:
            say(f"[{v}] inference: Δφ against {ref}")
            entry["inference"] = inference_mod.delta_record(inf_state[ref], inf_state[v], settings.ci_level, d)
            entry["ci"] = entry["inference"]["ci"]
            entry["secondary_ci"] = percentile_ci(d, settings.ci_level)
        entry["loss_gap"] = shared_mod.loss_gap(frames[ref], frames[v], settings.ci_level)
        if settings.shared:
            say(f"[{v}] shared-law Δφ against {ref}" + (" with held-out cells" if settings.checks else ""))
            fv = frames[v]  # the runs the reference also holds (shared r = 1 runs, a control's) enter once
            own = fv[~fv["run_id"].astype(str).isin(set(frames[ref]["run_id"].astype(str)))]
            entry["shared"] = shared_mod.shared_record(frames[ref], own, settings.law(), checks=settings.checks)
        delta_phi.append(entry)

    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loopscale_version": _version(),
        "source": {
            "path": runs.source,
            "n_rows": len(runs.df) + runs.n_excluded,
            "n_used": len(df_all),
            "excluded": runs.excluded,
        },
        "settings": {**asdict(settings), "template": template},
        "template": template,
        "budgets": budgets,
        "tokens_per_step": tokens_per_step(df_all),
        "reference_variant": ref,
        "resamples": {
            "unit": unit,
            "seed": settings.seed,
            "run_id": df_all["run_id"].astype(str).tolist(),
            "cell_of_run": cells,
            "cell_counts": counts.astype(int),
        },
        "variants": out_variants,
        "delta_phi": delta_phi,
        "warnings": warnings_,
        "wall_s": time.perf_counter() - t_start,
    }


def _law_variants(law: JointLaw, vruns: Any, settings: FitSettings, say: Callable[[str], None],
                  v: str) -> dict[str, Any]:
    """Law variants beyond phi = 0 / 1 (``variants.REGISTRY``: e.g. a loop-structure factor), each with its
    own phi, judged by the same held-out errors as the free and restricted laws (docs/extending.md)."""
    from loopscale.fit import variants

    out: dict[str, Any] = {}
    # Half the checks' starts: every fit of a variant is warm-started (from the free law's optimum, or the
    # variant's own for its held-out refits); the loop tax's profile re-tries 12 fixed random starts at each s.
    restarts = max(settings.checks_restarts // 2, 20)
    for name in settings.law_variants:
        tl = variants.make(name, settings.law(restarts=restarts))
        if settings.fixed_phi is not None or not tl.applies(vruns.df):
            continue
        say(f"[{v}] law variant {name}")
        tl.fit(vruns, extra_starts=law.theta_[None])
        out[name] = tl.record()
        if settings.checks:
            out[name]["held_out"] = checks_mod.run_checks(tl, vruns, restarts=restarts, split=False)["held_out"]
    return out


def _held_out_of_rejected(rec: dict[str, Any], law: JointLaw, vruns: Any, settings: FitSettings) -> None:
    """A rejected phi = x without a restricted fit (the paper's 0.46): fit it and run the held-out checks, so
    "rules out" can rest on both the test and the held-out error (docs/fit.md, "Inference")."""
    free_held = (rec.get("checks") or {}).get("held_out")
    for t in rec["inference"]["tests"].values():
        if not t["rejected"] or t["held_out_worse"] is not None:
            continue
        rl = settings.law(phi=t["value"], restarts=max(settings.checks_restarts, 50)).fit(
            vruns, extra_starts=law.theta_[None])
        held = checks_mod.run_checks(rl, vruns, restarts=settings.checks_restarts, split=False)["held_out"]
        t["held_out"] = held
        t["held_out_worse"] = inference_mod.held_out_worse(free_held, held)
        t["ruled_out"] = bool(t["held_out_worse"])


def _at_bounds_counts(theta: np.ndarray, bounds: Any, phi_free: bool) -> dict[str, int]:
    """Per coefficient: bootstrap draws whose optimum sits at its box bound."""
    from loopscale.fit.formula import PARAMS

    at = inference_mod.at_bounds(theta, bounds)
    names = {"a": "A", "b": "B", "e": "E"}
    return {names.get(p, p): int(at[:, k].sum()) for k, p in enumerate(PARAMS) if phi_free or p != "phi"}


def _data_rule_draws(W: np.ndarray, r: np.ndarray) -> dict[str, int]:
    """Block-bootstrap draws without an r = 1 run, and draws missing some r the table has."""
    rs = np.unique(r)
    has = np.stack([(W[:, r == k] > 0).any(axis=1) for k in rs], axis=1)
    no_r1 = int((~has[:, list(rs).index(1)]).sum()) if 1 in rs else 0
    return {"no_r1": no_r1, "missing_r": int((~has.all(axis=1)).sum())}


def _theta_of(minimum: dict[str, Any]) -> np.ndarray:
    return params_to_theta(minimum["params"])


def _optima(
    law: JointLaw,
    df: pd.DataFrame,
    template: dict[str, Any],
    budgets: list[float],
    rs: list[int],
    boot: dict[str, Any],
    fits: Any,
    settings: FitSettings,
    warnings_: list[str],
    v: str,
) -> dict[str, Any]:
    out: dict[str, Any] = {"template": template}
    if "C" in df.columns:
        emp = optima.empirical_optima(df)
        out["empirical"] = emp.to_dict(orient="records")
        out["empirical_exponents"] = optima.empirical_exponents(emp)
        unbracketed = emp[~emp["bracketed"]]
        if len(unbracketed):
            cells = [f"C={c:.3g} r={r}" for c, r in zip(unbracketed["C"], unbracketed["r"], strict=True)]
            more = f", +{len(cells) - 4} more" if len(cells) > 4 else ""
            warnings_.append(
                f"[{v}] empirical optimum not bracketed by the widths tried in {len(cells)} of {len(emp)} "
                f"cells ({', '.join(cells[:4])}{more}); see optima.empirical"
            )
    frs = optima.valid_rs(template, rs)
    skipped = sorted(set(rs) - set(frs))
    if skipped:
        warnings_.append(
            f"[{v}] law-based frontier skips r = {skipped}: not a divisor of the template's "
            "recurrent depth (set --set model.L_eff=...)"
        )
    if law.phi_undetermined:
        frs = [r for r in frs if r == 1]
    if not frs:
        return out
    table, exps = optima.frontier_table(law.theta_, template, budgets, frs)
    out["frontier"] = table.to_dict(orient="records")
    out["frontier_exponents"] = exps
    if fits is not None:
        thetas = fits.theta[np.isfinite(fits.theta).all(axis=1)]
        fd = optima.frontier_draws(thetas, template, budgets, frs)
        boot["ci"].update({k: percentile_ci(x, settings.ci_level) for k, x in fd.items()})
    return out


def _version() -> str:
    from loopscale import __version__

    return __version__


def law_from_fit(fit: Any, variant: str | None = None) -> tuple[JointLaw, np.ndarray | None]:
    """The fitted law of one variant of a fit (a ``FitResult`` or a fit dict), and its bootstrap draws as
    thetas (or None)."""
    from loopscale.fit.result import FitResult

    res = FitResult.of(fit)
    name = variant or res.reference
    if name not in res.variants:
        raise ConfigError("--variant", f"not in the fit file; it has {sorted(res.variants)}", value=name)
    rec = res.variant(name)
    p = rec.params.as_dict()
    law = JointLaw.from_params(**{**p, "phi": rec.phi})
    boot = rec.bootstrap
    thetas = None
    if boot.draws and boot.draws_of("E").size:
        arr = {k: boot.draws_of(k) for k in COEFFICIENTS}
        if rec.phi_undetermined:
            arr["phi"] = np.zeros_like(arr["E"])
        thetas = np.array([params_to_theta({k: arr[k][i] for k in COEFFICIENTS}) for i in range(len(arr["E"]))])
        thetas = thetas[np.isfinite(thetas).all(axis=1)]
    return law, thetas
