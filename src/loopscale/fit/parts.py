"""The parts of one variant's fit, each a function that returns a typed record of ``fit.result``.

``fit.pipeline.fit_runs`` calls them in this order for every variant (its r > 1 runs plus every r = 1 run):
the joint law (best of many starts, :func:`fit_law`), the restricted fits phi = 0 and phi = 1
(:func:`fit_restricted`), the law variants (:func:`fit_law_variants`), per-r Chinchilla fits
(:func:`fit_per_r`), the block bootstrap over (budget, r) cells (:func:`fit_bootstrap`), the empirical and
law-based compute-optimal analysis (:func:`fit_optima`), the validation checks (:func:`fit_checks`) and the
calibrated inference (:func:`fit_inference`: phi's profile-likelihood interval and tests from a wild cluster
bootstrap, the record every verdict and sentence reads; docs/fit.md, "Inference").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit import allocation
from loopscale.fit.inference import checks as checks_mod
from loopscale.fit.inference import profile
from loopscale.fit.inference.bootstrap import percentile_ci, refit_batch
from loopscale.fit.law.formula import COEFFICIENTS, PARAMS, LawData, params_to_theta, r_power, theta_to_params
from loopscale.fit.law.joint import JointLaw
from loopscale.fit.result import (
    Bootstrap,
    Checks,
    HeldOutErrors,
    Inference,
    LawRecord,
    LawVariantFit,
    Metrics,
    Optima,
    SubFit,
)
from loopscale.fit.settings import FitSettings
from loopscale.fit.table import RunsTable, budget_values


@dataclass
class VariantRuns:
    """What every part of one variant's fit reads: its runs, their bootstrap cells, the settings, and where
    progress and warnings go (warnings are prefixed with the variant's name)."""

    name: str
    runs: RunsTable
    cells: np.ndarray  # (budget, r) cell of each of its runs, numbered over the whole table (paired resamples)
    unit: str  # what the block bootstrap resamples: "cell (budget, r)", or "run" without budgets
    settings: FitSettings
    say: Callable[[str], None]
    warnings: list[str] = field(default_factory=list)

    @property
    def df(self) -> pd.DataFrame:
        return self.runs.df

    @property
    def rs(self) -> list[int]:
        return sorted(int(r) for r in set(self.df["r"]))

    def warn(self, message: str) -> None:
        self.warnings.append(f"[{self.name}] {message}")


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


def law_record(law: JointLaw) -> LawRecord:
    """The joint law's optimum and how the optimiser got there."""
    return LawRecord(
        params=law.params_,
        theta=law.theta_.tolist(),
        objective=law.objective_,
        converged=law.converged_,
        n_iter=law.n_iter_,
        message=law.message_,
        grad_max=law.grad_max_,
        at_bounds=law.at_bounds_,
        minima=law.minima_,
        n_near_optimal=law.n_near_optimal_,
        phi_identifiable=law.phi_identifiable_,
    )


def metrics(law: JointLaw) -> Metrics:
    return Metrics(
        r2=law.r2_, rmse=law.rmse_, rmse_per_r={str(k): v for k, v in law.rmse_per_r_.items()}, n_runs=law.n_runs_
    )


def _sub_fit(law: JointLaw, params: dict[str, Any]) -> SubFit:
    return SubFit(
        params=params, objective=law.objective_, converged=law.converged_, **metrics(law).model_dump(exclude_unset=True)
    )


def fit_law(vr: VariantRuns) -> JointLaw:
    """The joint law of the variant's runs (best of ``settings.restarts`` starts); warns on a doubtful optimum."""
    st = vr.settings
    vr.say(f"[{vr.name}] joint law: {st.restarts} starts on {len(vr.df)} runs")
    law = st.law().fit(vr.runs)
    if not law.converged_:
        vr.warn(f"the optimiser did not converge ({law.message_})")
    if law.at_bounds_:
        vr.warn(f"parameters at the box's bounds: {', '.join(law.at_bounds_)}")
    if law.n_near_optimal_ > 1:
        vr.warn(
            f"{law.n_near_optimal_} distinct minima within 1% of the best objective; see law.minima in the fit file"
        )
    return law


def derived(law: JointLaw, rs: list[int]) -> dict[str, float]:
    d = derived_from_params(law.params_ | {"phi": np.nan if law.phi_undetermined else law.phi_}, rs)
    return {k: float(np.asarray(x)) for k, x in d.items()}


def fit_restricted(vr: VariantRuns, law: JointLaw) -> dict[str, SubFit]:
    """phi fixed at each of ``settings.restricted`` (the paper's phi = 0 and phi = 1), warm-started from the
    free optimum; with checks, each is held out as the free law is."""
    st, out = vr.settings, dict[str, SubFit]()
    if not (law.phi_identifiable_ and st.fixed_phi is None):
        return out
    for phi in st.restricted:
        vr.say(f"[{vr.name}] restricted fit phi = {phi:g}")
        rl = st.law(phi=phi).fit(vr.runs, extra_starts=law.theta_[None])
        rec = _sub_fit(rl, rl.params_)
        if st.checks:
            rec.held_out = checks_mod.run_checks(rl, vr.runs, restarts=st.checks_restarts, split=False).held_out
        out[f"phi={phi:g}"] = rec
    return out


def fit_law_variants(vr: VariantRuns, law: JointLaw) -> dict[str, LawVariantFit]:
    """Law variants beyond phi = 0 / 1 (``law.variants.REGISTRY``: e.g. a loop-structure factor), each with its
    own phi, judged by the same held-out errors as the free and restricted laws (docs/extending.md)."""
    from loopscale.fit.law import variants

    st, out = vr.settings, dict[str, LawVariantFit]()
    if not law.phi_identifiable_:
        return out
    # Half the checks' starts: every fit of a variant is warm-started (from the free law's optimum, or the
    # variant's own for its held-out refits); the loop tax's profile re-tries 12 fixed random starts at each s.
    restarts = max(st.checks_restarts // 2, 20)
    for name in st.law_variants:
        tl = variants.make(name, st.law(restarts=restarts))
        if st.fixed_phi is not None or not tl.applies(vr.df):
            continue
        vr.say(f"[{vr.name}] law variant {name}")
        tl.fit(vr.runs, extra_starts=law.theta_[None])
        out[name] = LawVariantFit(**tl.record())
        if st.checks:
            out[name].held_out = checks_mod.run_checks(tl, vr.runs, restarts=restarts, split=False).held_out
    return out


def fit_per_r(vr: VariantRuns) -> dict[str, SubFit]:
    """Chinchilla's law (phi = 0) on each r's runs alone, where an r has at least 6 runs."""
    st, out = vr.settings, dict[str, SubFit]()
    if not st.per_r:
        return out
    for r in vr.rs:
        sub = vr.runs.subset(vr.df["r"] == r)
        if len(sub.df) < 6:
            continue
        vr.say(f"[{vr.name}] Chinchilla fit r = {r}")
        cl = st.law(phi=0.0, restarts=max(st.restarts // 2, 50)).fit(sub)
        out[str(r)] = _sub_fit(cl, {k: cl.params_[k] for k in ("E", "A", "B", "alpha", "beta")})
    return out


@dataclass
class BootstrapFit:
    """The block bootstrap's record, with the refits the optima and Delta-phi read (not stored twice)."""

    record: Bootstrap
    fits: Any = None  # bootstrap.refit_batch's result, None when off
    phi_draws: np.ndarray | None = None


def fit_bootstrap(vr: VariantRuns, law: JointLaw, W: np.ndarray) -> BootstrapFit:
    """The paper's block bootstrap: refit on each resample of (budget, r) cells (``W``: the variant's columns of
    the draws every variant shares, so Delta-phi's draws are paired) and take percentile intervals."""
    st = vr.settings
    boot = Bootstrap(n=int(st.bootstrap), unit=vr.unit, n_cells=len(np.unique(vr.cells)))
    if not st.bootstrap:
        return BootstrapFit(boot)
    vr.say(f"[{vr.name}] bootstrap: {st.bootstrap} resamples")
    warm = np.array([law.theta_] + [params_to_theta(m["params"]) for m in law.minima_[1:] if m["near_optimal"]])
    fits = refit_batch(
        LawData.from_frame(vr.df),
        W,
        warm,
        bounds=law.bounds(),
        fixed_phi=law.phi,
        loss=st.loss,
        delta=st.delta,
        random_starts=st.bootstrap_random_starts,
        seed=st.seed + 1,
        progress=lambda done, total: vr.say(f"[{vr.name}] bootstrap: {done}/{total} resamples"),
    )
    P = {k: np.array([theta_to_params(t)[k] for t in fits.theta]) for k in COEFFICIENTS}
    if law.phi_undetermined:
        P["phi"] = np.full(len(fits.theta), np.nan)
    else:
        P["phi"] = np.where(fits.phi_identifiable | (law.phi is not None), P["phi"], np.nan)
    D = derived_from_params(P, vr.rs)
    boot.ci_level = st.ci_level
    boot.converged_fraction = float(fits.converged.mean())
    boot.phi_undetermined_draws = int(np.sum(~np.isfinite(P["phi"]))) if not law.phi_undetermined else None
    boot.ci = {k: percentile_ci(x, st.ci_level) for k, x in {**P, **D}.items()}
    boot.at_bounds = _at_bounds_counts(fits.theta, law.bounds(), law.phi is None)
    boot.data_rule_draws = _data_rule_draws(W, vr.df["r"].to_numpy(int))
    boot.draws = {**P, "objective": fits.objective, "converged": fits.converged}
    if fits.converged.mean() < 0.95:
        vr.warn(f"{100 * (1 - fits.converged.mean()):.0f}% of bootstrap refits did not converge")
    return BootstrapFit(boot, fits, P["phi"])


def _at_bounds_counts(theta: np.ndarray, bounds: Any, phi_free: bool) -> dict[str, int]:
    """Per coefficient: bootstrap draws whose optimum sits at its box bound."""
    at = profile.at_bounds(theta, bounds)
    names = {"a": "A", "b": "B", "e": "E"}
    return {names.get(p, p): int(at[:, k].sum()) for k, p in enumerate(PARAMS) if phi_free or p != "phi"}


def _data_rule_draws(W: np.ndarray, r: np.ndarray) -> dict[str, int]:
    """Block-bootstrap draws without an r = 1 run, and draws missing some r the table has."""
    rs = np.unique(r)
    has = np.stack([(W[:, r == k] > 0).any(axis=1) for k in rs], axis=1)
    no_r1 = int((~has[:, list(rs).index(1)]).sum()) if 1 in rs else 0
    return {"no_r1": no_r1, "missing_r": int((~has.all(axis=1)).sum())}


def fit_optima(
    vr: VariantRuns, law: JointLaw, template: dict[str, Any], budgets: list[float], boot: BootstrapFit
) -> Optima:
    """Empirical optimum per (C, r) cell and the law's frontier at the template, with bootstrap CIs of the
    frontier (added to the bootstrap record's ``ci``)."""
    vr.say(f"[{vr.name}] compute-optimal analysis")
    out = Optima(template=template)
    df, rs = vr.df, vr.rs
    if "C" in df.columns:
        emp = allocation.empirical_optima(df)
        out.empirical = emp.to_dict(orient="records")
        out.empirical_exponents = {**allocation.empirical_exponents(emp)}
        unbracketed = emp[~emp["bracketed"]]
        if len(unbracketed):
            cells = [f"C={c:.3g} r={r}" for c, r in zip(unbracketed["C"], unbracketed["r"], strict=True)]
            more = f", +{len(cells) - 4} more" if len(cells) > 4 else ""
            vr.warn(
                f"empirical optimum not bracketed by the widths tried in {len(cells)} of {len(emp)} "
                f"cells ({', '.join(cells[:4])}{more}); see optima.empirical"
            )
    frs = allocation.valid_rs(template, rs)
    skipped = sorted(set(rs) - set(frs))
    if skipped:
        vr.warn(
            f"law-based frontier skips r = {skipped}: not a divisor of the template's recurrent depth "
            "(set --set model.L_eff=...)"
        )
    if law.phi_undetermined:
        frs = [r for r in frs if r == 1]
    if not frs:
        return out
    table, exps = allocation.frontier_table(law.theta_, template, budgets, frs)
    out.frontier = table.to_dict(orient="records")
    out.frontier_exponents = {**exps}
    if boot.fits is not None:
        thetas = boot.fits.theta[np.isfinite(boot.fits.theta).all(axis=1)]
        fd = allocation.frontier_draws(thetas, template, budgets, frs)
        boot.record.ci.update({k: percentile_ci(x, vr.settings.ci_level) for k, x in fd.items()})
    return out


def fit_checks(vr: VariantRuns, law: JointLaw) -> Checks | None:
    """Extrapolation to the top budget, leave-one-r-out and the half split (None with checks off)."""
    if not vr.settings.checks:
        return None
    vr.say(f"[{vr.name}] validation: extrapolation, leave-one-r-out, half split")
    out = checks_mod.run_checks(law, vr.runs, restarts=vr.settings.checks_restarts)
    if not law.phi_undetermined and len(vr.rs) == 2:
        vr.warn(
            "leave-one-r-out skipped: with two r values each refit sees one r, where φ is undetermined or "
            "confounded with A, so held-out comparisons of φ = 0 / 1 rest on the top-budget extrapolation alone"
        )
    return out


def fit_inference(
    vr: VariantRuns, law: JointLaw, V: np.ndarray, rec: Any, *, paper: bool
) -> tuple[Inference, profile.VariantInference] | None:
    """phi's profile-likelihood interval and its tests (phi = 0, 1, the paper's 0.46 when ``paper``), calibrated
    by the wild bootstrap tables ``V`` every variant shares; a rejected value without a restricted fit gets
    one, with its held-out checks, so "rules out" rests on both (docs/fit.md, "Inference")."""
    st = vr.settings
    if not (st.lr_draws and law.phi_identifiable_ and st.fixed_phi is None):
        return None
    vr.say(f"[{vr.name}] inference: profile of φ, {st.lr_draws} wild-bootstrap tables")
    state = profile.VariantInference.run(
        law.theta_, law.objective_, law.bounds(), LawData.from_frame(vr.df), vr.cells, V, st.loss, st.delta, st.seed
    )
    inf = state.record(st.ci_level, rec, rec.bootstrap, tuple(st.restricted), paper=paper)
    if st.checks:
        _held_out_of_rejected(vr, inf, rec.checks.held_out if rec.checks is not None else None, law)
    return inf, state


def _held_out_of_rejected(vr: VariantRuns, inf: Inference, free_held: HeldOutErrors | None, law: JointLaw) -> None:
    st = vr.settings
    for t in inf.tests.values():
        if not t.rejected or t.held_out_worse is not None:
            continue
        rl = st.law(phi=t.value, restarts=max(st.checks_restarts, 50)).fit(vr.runs, extra_starts=law.theta_[None])
        held = checks_mod.run_checks(rl, vr.runs, restarts=st.checks_restarts, split=False).held_out
        t.held_out = held
        t.held_out_worse = profile.held_out_worse(free_held, held)
        t.ruled_out = bool(t.held_out_worse)
