"""Plan a technique study before buying it: how narrow will Δφ be, read separately and paired?

`loopscale design SPEC --technique NAME` simulates the planned sweep of the reference and the technique on
the same cells (``fit.design.simulate_table``: the prior law, the technique's with phi moved by the true Δφ;
the lack of fit by cell and point that ``fit.design.Noise`` carries, correlated ``shared`` between the two
recipes; each run's own noise) and reads every simulated study the way `loopscale fit` does: the two
separate fits' calibrated Δφ (``inference.profile.delta_record``), the paired reading
(``inference.paired.paired_delta_phi``, with its held-out test) and the one that leads
(``inference.paired.leading``). The same simulations measure the estimators' coverage and false-positive
rate under a misspecified law (``bench/paired_calibration.py``; docs/fit.md, "Paired Δφ").

Cheaper than `loopscale fit` where the module docstring of ``fit.design`` says (fewer starts, fewer
wild-bootstrap tables), and stated in each result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.design import (
    DesignSettings,
    Noise,
    check_grid,
    point_keys,
    run_jobs,
    seed_means,
    simulate_table,
    study_cost,
)
from loopscale.fit.law.formula import PHI, LawData, params_to_theta
from loopscale.fit.result import DeltaInference, Leading, PairedReading

READINGS: tuple[str, ...] = ("separate fits", "paired (shared law)", "paired (separate laws)", "leading")


@dataclass(frozen=True)
class PairJob:
    grid: pd.DataFrame  # the reference's runs (its r = 1 runs included)
    tech: pd.DataFrame  # the technique's own runs (r > 1)
    theta: np.ndarray
    delta_phi: float
    noise: Noise
    settings: DesignSettings
    i: int
    pattern: dict[str, float] | None  # a fixed lack of fit per design point (``point_keys``), both recipes
    ref_misfit: bool = True  # False: the reference's runs carry the pattern and their run noise only


def _table(grid: pd.DataFrame, L: np.ndarray, variant: str, means: bool) -> pd.DataFrame:
    """A simulated runs table of one recipe (seed means with ``means``, as `fit --seed-means` reads it)."""
    if means:
        grid, L = seed_means(grid, L)
    df = grid.assign(val_loss=L, variant=variant, status="ok").reset_index(drop=True)
    df["run_id"] = [f"{variant}_{k}_s{s}" for k, s in zip(point_keys(df), df["seed"], strict=True)]
    return df


def _reading(rec: Leading | PairedReading | DeltaInference | None, truth: float) -> dict[str, Any]:
    if rec is None:
        return {"estimate": np.nan, "lo": np.nan, "hi": np.nan, "p": np.nan, "covers": np.nan, "rejects": np.nan}
    lo, hi = (float(x) for x in (rec.ci or [np.nan, np.nan]))
    zero = rec.p if isinstance(rec, Leading) else (rec.zero.p if rec.zero is not None else None)
    p = np.nan if zero is None else float(zero)
    return {
        "estimate": np.nan if rec.estimate is None else float(rec.estimate),
        "lo": lo,
        "hi": hi,
        "p": p,
        "covers": float(lo <= truth <= hi),
        "rejects": float(lo > 0 or hi < 0),
    }


def one_study(job: PairJob) -> dict[str, Any]:
    """Simulate one paired study and read it three ways (runs in a worker process)."""
    from loopscale.fit.inference import paired, profile
    from loopscale.fit.law.joint import JointLaw
    from loopscale.fit.law.solver import Bounds, multistart
    from loopscale.fit.parts import bootstrap_cells

    st = job.settings
    rng = np.random.default_rng([st.seed, job.i, 7])
    theta_v = job.theta.copy()
    theta_v[PHI] += job.delta_phi
    ref_noise = job.noise if job.ref_misfit else Noise(job.noise.run_sd, 0.0, job.noise.source)
    L_r = simulate_table(job.grid, job.theta, ref_noise, st.seed, job.i)
    L_v = simulate_table(job.tech, theta_v, job.noise, st.seed, job.i, recipe="technique")
    if job.pattern:
        L_r = L_r + np.array([job.pattern.get(k, 0.0) for k in point_keys(job.grid)])
        L_v = L_v + np.array([job.pattern.get(k, 0.0) for k in point_keys(job.tech)])
    if not (np.all(L_r > 0) and np.all(L_v > 0)):
        return {k: _reading(None, job.delta_phi) for k in READINGS} | {"lead": None}
    ref = _table(job.grid, L_r, "baseline", st.seed_means)
    var = _table(job.tech, L_v, "technique", st.seed_means)
    own = pd.concat([ref[ref["r"] == 1], var], ignore_index=True)  # the technique's fit: the shared r = 1 runs
    cells, _ = bootstrap_cells(pd.concat([ref, var], ignore_index=True))
    cells_r, cells_v = cells[: len(ref)], cells[len(ref) :]
    cells_own = np.r_[cells_r[ref["r"].to_numpy() == 1], cells_v]
    V = profile.webb_weights(int(cells.max()) + 1, st.lr_draws, rng)
    bounds = Bounds.paper(st.phi_bounds)
    states = []
    for df, c in ((ref, cells_r), (own, cells_own)):
        data = LawData.from_frame(df)
        best = multistart(
            data, bounds=bounds, loss=st.loss, delta=st.delta, restarts=st.restarts, polish=2, advance=16, seed=rng
        )[0]
        states.append(
            profile.VariantInference.run(
                best.theta, best.objective, bounds, data, c, V, st.loss, st.delta, st.seed + job.i
            )
        )
    sep = profile.delta_record(states[0], states[1], st.ci_level)
    law = JointLaw(loss=st.loss, delta=st.delta, restarts=st.restarts, phi_bounds=st.phi_bounds)
    starts = paired.starts_from(states[0].theta_hat, states[1].theta_hat)
    pr = paired.paired_delta_phi(ref, var, cells_r, cells_v, V, law, starts, st.ci_level, seed=st.seed + job.i)
    lead = paired.leading(pr, sep)
    return {
        "separate fits": _reading(sep, job.delta_phi),
        **{f"paired ({m})": _reading(paired.reading(pr, m), job.delta_phi) for m in paired.MODELS},
        "leading": _reading(lead, job.delta_phi),
        "lead": None if lead is None else lead.reading,
    }


@dataclass
class ReadingSummary:
    """One Δφ reading over the simulated studies."""

    median_half_width: float
    mean_half_width: float
    coverage: float
    reject_0: float  # P(the interval excludes 0): the false-positive rate where the true Δφ is 0
    bias: float  # median estimate - truth
    n: int

    @classmethod
    def of(cls, rows: list[dict[str, Any]], truth: float) -> ReadingSummary:
        est = np.array([r["estimate"] for r in rows], float)
        hw = np.array([(r["hi"] - r["lo"]) / 2 for r in rows], float)
        ok = np.isfinite(hw)
        cov = np.array([r["covers"] for r in rows], float)
        rej = np.array([r["rejects"] for r in rows], float)
        return cls(
            float(np.median(hw[ok])) if ok.any() else np.nan,
            float(np.mean(hw[ok])) if ok.any() else np.nan,
            float(np.nanmean(cov)) if ok.any() else np.nan,
            float(np.nanmean(rej)) if ok.any() else np.nan,
            float(np.nanmedian(est) - truth) if ok.any() else np.nan,
            int(ok.sum()),
        )


@dataclass
class PairedDesignResult:
    """What simulated paired studies tell about the planned grid (module docstring)."""

    n_runs: int
    n_technique_runs: int
    cost_flops: float
    delta_phi: float
    noise: Noise
    settings: DesignSettings
    sims: int
    readings: dict[str, ReadingSummary]
    leads: dict[str, float]  # share of studies whose leading reading is each one
    wall_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("rows")
        return out


def simulate_pair(
    grid: pd.DataFrame,
    tech: pd.DataFrame,
    prior: dict[str, float],
    delta_phi: float,
    noise: Noise,
    settings: DesignSettings | None = None,
    *,
    pattern: dict[str, float] | None = None,
    ref_misfit: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> PairedDesignResult:
    """``settings.sims`` paired studies of ``grid`` (the reference's planned runs) and ``tech`` (the technique's
    own, r > 1) with true Δφ ``delta_phi``; each read separately, paired and by the leading rule."""
    import time
    import warnings

    st = settings or DesignSettings()
    check_grid(grid)
    t0 = time.perf_counter()
    theta = params_to_theta(prior)
    cols = ["C", "r", "N_once", "N_rec", "D", "d_model", "seed"]
    g = grid[[c for c in cols if c in grid.columns]].reset_index(drop=True)
    t = tech[[c for c in cols if c in tech.columns]].reset_index(drop=True)
    t = t[t["r"] > 1].reset_index(drop=True)
    for df in (g, t):
        if "seed" not in df.columns:
            df["seed"] = 0
    jobs = [PairJob(g, t, theta, float(delta_phi), noise, st, i, pattern, ref_misfit) for i in range(st.sims)]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        rows = run_jobs(one_study, jobs, st.workers, progress)
    leads = [r["lead"] for r in rows if r["lead"] is not None]
    return PairedDesignResult(
        n_runs=len(g),
        n_technique_runs=len(t),
        cost_flops=study_cost(g) + study_cost(t),
        delta_phi=float(delta_phi),
        noise=noise,
        settings=st,
        sims=len(rows),
        readings={k: ReadingSummary.of([r[k] for r in rows], float(delta_phi)) for k in READINGS},
        leads={k: float(np.mean([x == k for x in leads])) if leads else np.nan for k in READINGS[:3]},
        wall_s=time.perf_counter() - t0,
        rows=rows,
    )


# ---- the search: which grid reaches a Δφ half-width? ------------------------------------------
def _quick_delta(job: PairJob) -> dict[str, Any]:
    """The shared-law paired Δφ of one simulated study, no bootstrap (the search's sampling spread)."""
    from loopscale.fit.inference import paired
    from loopscale.fit.law.solver import Bounds
    from loopscale.fit.parts import bootstrap_cells

    st = job.settings
    theta_v = job.theta.copy()
    theta_v[PHI] += job.delta_phi
    L_r = simulate_table(job.grid, job.theta, job.noise, st.seed, job.i)
    L_v = simulate_table(job.tech, theta_v, job.noise, st.seed, job.i, recipe="technique")
    ref = _table(job.grid, L_r, "baseline", st.seed_means)
    var = _table(job.tech, L_v, "technique", st.seed_means)
    cells, _ = bootstrap_cells(pd.concat([ref, var], ignore_index=True))
    pair = paired.Pairing.of(ref, var, cells[: len(ref)], cells[len(ref) :])
    bounds = Bounds.paper(st.phi_bounds)
    fit = paired.fit_paired(pair, bounds, paired.starts_from(job.theta), seed=st.seed + job.i, random=8)
    lo, hi = paired.DELTA_BOUNDS
    return {"delta_phi": fit.delta_phi, "at_bound": min(fit.delta_phi - lo, hi - fit.delta_phi) < 1e-3}


def pair_variants(grid: pd.DataFrame, tech: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, pd.DataFrame, float]]:
    """Dearer and cheaper versions of a paired grid, each with its cost relative to the planned one: seeds per
    point halved, doubled, quadrupled; budgets x2 and x4 (same widths, tokens scaled with C); both."""
    n = int(grid["seed"].nunique())

    def seeds(df: pd.DataFrame, k: int) -> pd.DataFrame:
        first = df[df["seed"] == df["seed"].min()]
        return pd.concat([first.assign(seed=j) for j in range(k)], ignore_index=True)

    def budgets(df: pd.DataFrame, f: float) -> pd.DataFrame:
        return df.assign(C=df["C"] * f, D=df["D"] * f)

    out: dict[str, tuple[pd.DataFrame, pd.DataFrame, float]] = {"as planned": (grid, tech, 1.0)}
    for k in sorted({max(1, n // 2), 2 * n, 4 * n} - {n}):
        out[f"{k} seeds per point"] = (seeds(grid, k), seeds(tech, k), k / n)
    for f in (2.0, 4.0):
        out[f"budgets x {f:g}"] = (budgets(grid, f), budgets(tech, f), f)
        out[f"budgets x {f:g}, {2 * n} seeds"] = (budgets(seeds(grid, 2 * n), f), budgets(seeds(tech, 2 * n), f), 2 * f)
    return out


@dataclass
class PairSearchRow:
    name: str
    n_runs: int
    relative_cost: float
    sampling_half_width: float  # z x sd of the shared-law paired Δφ over simulations (no bootstrap)
    bias: float
    at_bound: float


def search_pair(
    grid: pd.DataFrame,
    tech: pd.DataFrame,
    prior: dict[str, float],
    delta_phi: float,
    noise: Noise,
    settings: DesignSettings | None = None,
    *,
    sims: int = 16,
    progress: Callable[[str], None] | None = None,
) -> list[PairSearchRow]:
    """Every variant of ``pair_variants``, its relative cost and the shared-law paired Δφ's sampling half-width,
    cheapest first."""
    import warnings

    from scipy.stats import norm

    st = settings or DesignSettings()
    z = float(norm.ppf(0.5 + st.ci_level / 2))
    theta = params_to_theta(prior)
    rows = []
    for name, (g, t, cost) in pair_variants(grid, tech).items():
        if progress:
            progress(f"search: {name} ({len(g) + len(t)} runs)")
        jobs = [PairJob(g, t, theta, float(delta_phi), noise, st, i, None) for i in range(sims)]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            out = run_jobs(_quick_delta, jobs, st.workers, None)
        d = np.array([o["delta_phi"] for o in out], dtype=float)
        bound = np.array([o["at_bound"] for o in out], dtype=bool)
        ok = d[~bound & np.isfinite(d)]
        hw = z * float(np.std(ok, ddof=1)) if ok.size >= 3 else float("nan")
        bias = float(np.median(ok) - delta_phi) if ok.size else float("nan")
        rows.append(PairSearchRow(name, len(g) + len(t), cost, hw, bias, float(np.mean(bound))))
    rows.sort(key=lambda r: r.relative_cost)
    return rows
