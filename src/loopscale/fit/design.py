"""Plan a study before buying the compute: how narrow will phi's CI be with this grid?

`loopscale design` simulates a planned sweep many times and fits every simulated table with the
real fitter (``law.multistart`` + the block bootstrap of ``bootstrap.refit_batch``, the same code
`loopscale fit` runs). Inputs:

* the grid: one row per planned run with C, r, N_once, N_rec, D (and a seed), from the accounting
  of a spec (`loopscale sweep plan` computes the same numbers) - nothing is trained;
* a prior law: the paper's coefficients (arXiv 2604.21106 §1) or a fit file's;
* a noise model (:class:`Noise`): an independent per-run sd (seeds average it away) and a per-cell
  sd shared by every run of a (C, r) cell (seeds do not) - the correlation that makes the fit
  resample cells (docs/fit.md, "Why cells").

Reported (:func:`simulate`): mean CI width of phi, bias and spread of phi-hat, coverage of the true
phi, P(the CI excludes 0), P(the CI excludes 1), the share of fits whose phi ended at its box, and
per (C, r) cell the probability that the empirical optimum is bracketed by the widths, and the share
of simulated fits the verdict would call resolved (its CI-width and box rules: fit/inference/verdict.py) - from
the percentile interval; the fit quotes the calibrated one, whose coverage bench/inference_coverage.py
measures (docs/fit.md, "Inference").

Where it is cheaper than `loopscale fit` (stated in every result): ``restarts`` random starts per
simulated fit (default 100, not 500: the restart check of docs/fit.md finds the same optimum from
warm starts) and ``bootstrap`` resamples per simulated fit (default 50, not 200: the CI *width* is
averaged over simulations, so each one needs a rough interval, not a precise one; percentile ends
from 50 draws are the 2nd and 49th order statistics, which slightly widen the interval).

:func:`search` ranks variants of the grid (drop a budget, drop the extreme widths, more seeds,
scaled budgets) by cost in FLOPs and reports the cheapest whose expected CI width reaches a target.
To stay interactive it uses the *sampling* spread of phi-hat over simulations without bootstraps
(width = 2 z x sd), the width a calibrated CI would have, with an eighth of the starts (4 advanced to
convergence instead of 16, the best one polished) plus the prior as one more start, and common random
numbers (a run kept by two variants has the same noise in both).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from loopscale.fit.inference.bootstrap import cell_counts, percentile_ci, refit_batch
from loopscale.fit.inference.verdict import MAX_CI_WIDTH
from loopscale.fit.law.formula import PHI, LawData, params_to_theta
from loopscale.fit.law.formula import predict as predict_theta
from loopscale.fit.law.solver import Bounds, multistart
from loopscale.fit.law.threads import single_thread_blas
from loopscale.fit.paper import PAPER_HUBER_DELTA, PAPER_LOSS
from loopscale.fit.table import budget_values

REQUIRED = ("C", "r", "N_once", "N_rec", "D")


@dataclass(frozen=True)
class Noise:
    """What a simulated table scatters by around the prior law (nats), in three parts a real study has:

    ``val_loss = law + u_cell + m_point + e_run``, with ``u_cell ~ N(0, cell_sd^2)`` per (C, r) cell (shared by
    its runs), ``m_point ~ N(0, point_sd^2)`` per design point (C, r, width: shared by its seeds) and ``e_run ~
    N(0, run_sd^2)`` per run (seeds average it away). ``u_cell`` and ``m_point`` are the law's lack of fit
    there: more seeds do not shrink them, which is why 8 seeds of the probe study were no narrower than 4
    (docs/cpu-scale.md). A paired technique's lack of fit is correlated ``shared`` with the reference's (1: the
    same at every point; its runs' own noise is independent)."""

    run_sd: float = 0.01
    cell_sd: float = 0.0
    source: str = "flags"
    point_sd: float = 0.0
    shared: float = 1.0

    @property
    def misfit_sd(self) -> float:
        """The lack of fit of one design point (cell and point parts together)."""
        return float(np.hypot(self.cell_sd, self.point_sd))


@dataclass(frozen=True)
class DesignSettings:
    """How each simulated study is fitted (see the module docstring for why these defaults)."""

    sims: int = 32
    bootstrap: int = 50
    restarts: int = 100
    bootstrap_random_starts: int = 2
    lr_draws: int = 200  # wild-bootstrap tables of the profile interval `fit` quotes (fit/inference/profile.py); 0: off
    ci_level: float = 0.95
    loss: str = PAPER_LOSS
    delta: float = PAPER_HUBER_DELTA
    phi_bounds: tuple[float, float] = (-3.0, 3.0)
    seed: int = 0
    workers: int = 0  # 0: one per CPU core (at most sims)
    seed_means: bool = False  # fit one row per design point, its seeds' mean loss (as `fit --seed-means`)


# ---- the grid --------------------------------------------------------------------------------
def grid_cells(grid: pd.DataFrame) -> np.ndarray:
    """(C, r) cell id per planned run (budgets grouped to 3 significant digits, as the fit does)."""
    key = pd.Series([f"{c:.3g}|{r}" for c, r in zip(budget_values(grid), grid["r"], strict=True)])
    codes: np.ndarray = pd.factorize(key)[0]
    return codes


def point_keys(grid: pd.DataFrame) -> list[str]:
    """The design point (C, r, width) of each run: its width where the table has one (a technique's runs then
    share the reference's points although their accounting differs), else its unique parameters."""
    C = budget_values(grid)
    width = grid["d_model"] if "d_model" in grid.columns else grid["N_once"] + grid["N_rec"]
    return [f"{c:.3g}|{r}|{w:.6g}" for c, r, w in zip(C, grid["r"], width, strict=True)]


def study_cost(grid: pd.DataFrame) -> float:
    """Training FLOPs of the whole grid: each run spends its budget C."""
    return float(np.sum(grid["C"].to_numpy(float)))


def estimate_noise(runs: pd.DataFrame, theta: np.ndarray, source: str = "runs table", fitted: bool = False) -> Noise:
    """Per-run, per-point and per-cell sds from a finished table's residuals against a law.

    Seeds of a design point give the run noise (their spread); what the point means vary within their
    (C, r) cell beyond it is the point misfit, what the cell means vary beyond both the cell misfit:
    ``E[mean_point^2] = cell^2 + point^2 + run^2 / n_seeds``. ``fitted``: the law was fitted to these runs, so
    its six coefficients absorbed part of the misfit; the misfit variances are scaled by ``n / (n - 6)`` over
    the design points (the degrees of freedom the fit used). Without seeds the within-cell spread is all
    called run noise, as before (no point misfit can be told apart)."""
    df = runs.reset_index(drop=True)
    res = df["val_loss"].to_numpy(float) - predict_theta(theta, df["N_once"], df["N_rec"], df["D"], df["r"])
    cells = grid_cells(df) if "C" in df.columns else np.arange(len(df))
    point = pd.factorize(pd.Series(point_keys(df) if "C" in df.columns else np.arange(len(df)).astype(str)))[0]
    frame = pd.DataFrame({"res": res, "cell": cells, "point": point})
    seeds = frame.groupby("point")["res"]
    n_points = int(frame["point"].nunique())
    scale = n_points / (n_points - 6) if fitted and n_points > 12 else 1.0
    if (seeds.size() > 1).any():
        ss = float((seeds.var(ddof=1) * (seeds.size() - 1)).sum())
        dof = int((seeds.size() - 1).sum())
        run_var, how = ss / dof, "seeds"
        pts = frame.groupby("point").agg(res=("res", "mean"), cell=("cell", "first"), n=("res", "size"))
        g = pts.groupby("cell")["res"]
        within = float((g.var(ddof=1).fillna(0) * (g.size() - 1)).sum()) / max(int((g.size() - 1).sum()), 1)
        point_var = max(0.0, within - run_var * float(np.mean(1 / pts["n"])))
        cell_var = max(
            0.0,
            float(np.mean(g.mean() ** 2))
            - point_var / float(g.size().mean())
            - run_var / float(frame.groupby("cell").size().mean()),
        )
        return Noise(
            float(np.sqrt(run_var)),
            float(np.sqrt(cell_var * scale)),
            f"{source} ({how}{', dof-corrected' if scale > 1 else ''})",
            point_sd=float(np.sqrt(point_var * scale)),
        )
    g = frame.groupby("cell")["res"]
    dof = int((g.size() - 1).sum())
    run_var = float((g.var(ddof=1).fillna(0) * (g.size() - 1)).sum()) / max(dof, 1)
    cell_var = max(0.0, float(np.mean(g.mean() ** 2 - run_var / g.size())))
    return Noise(float(np.sqrt(run_var)), float(np.sqrt(cell_var * scale)), f"{source} (within-cell residuals)")


def seed_means(grid: pd.DataFrame, L: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """One row per design point (``point_keys``) with its seeds' mean loss and ``n_seeds``: the table
    `loopscale fit --seed-means` fits."""
    keys = point_keys(grid)
    g = grid.assign(_p=keys, _L=L).groupby("_p", sort=False)
    out = g.head(1).drop(columns=["_p", "_L"]).reset_index(drop=True)
    out["n_seeds"] = g.size().to_numpy()
    return out, g["_L"].mean().to_numpy()


def _keyed_normal(keys: Iterable[str], seed: int, i: int) -> np.ndarray:
    """One standard normal per key, the same for the same key in every grid (common random numbers: a grid
    variant that keeps a run keeps its noise, so variants differ by design, not by draw)."""
    import zlib

    return np.array([np.random.default_rng([seed, i, zlib.crc32(k.encode())]).standard_normal() for k in keys])


def _keyed(keys: list[str], seed: int, i: int) -> np.ndarray:
    uniq, inv = np.unique(keys, return_inverse=True)
    return _keyed_normal(uniq, seed, i)[inv.ravel()]


def misfit_draw(grid: pd.DataFrame, noise: Noise, seed: int, i: int, recipe: str = "") -> np.ndarray:
    """The lack of fit of every planned run in simulation ``i`` (cell + point parts, nats); ``recipe`` names a
    paired technique, whose draw is correlated ``noise.shared`` with the reference's ("")."""
    C = budget_values(grid)
    cell = [f"cell|{c:.3g}|{r}" for c, r in zip(C, grid["r"], strict=True)]
    point = [f"point|{k}" for k in point_keys(grid)]
    m = noise.cell_sd * _keyed(cell, seed, i) + noise.point_sd * _keyed(point, seed, i)
    if not recipe or noise.shared >= 1:
        return m
    own = noise.cell_sd * _keyed([f"{recipe}|{k}" for k in cell], seed, i) + noise.point_sd * _keyed(
        [f"{recipe}|{k}" for k in point], seed, i
    )
    rho = float(np.clip(noise.shared, 0.0, 1.0))
    out: np.ndarray = rho * m + np.sqrt(1 - rho * rho) * own
    return out


def simulate_table(
    grid: pd.DataFrame, theta: np.ndarray, noise: Noise, seed: int, i: int, recipe: str = ""
) -> np.ndarray:
    """Simulated val_loss of every planned run (nats) in simulation ``i``; ``recipe``: a paired technique's runs
    (its own run noise, its lack of fit correlated ``noise.shared`` with the reference's)."""
    clean = predict_theta(theta, grid["N_once"], grid["N_rec"], grid["D"], grid["r"])
    seeds = grid["seed"] if "seed" in grid.columns else np.zeros(len(grid), dtype=int)
    run_keys = [f"{recipe}run|{k}|{sd}" for k, sd in zip(point_keys(grid), seeds, strict=True)]
    out: np.ndarray = clean + misfit_draw(grid, noise, seed, i, recipe) + noise.run_sd * _keyed(run_keys, seed, i)
    return out


# ---- one simulated study -------------------------------------------------------------------
@dataclass
class Simulated:
    """What one simulated study's fit gave: phi-hat, whether it ran to the box, the block bootstrap's percentile
    interval and each (C, r) cell's bracketing (with the bootstrap), and the calibrated profile interval (with
    ``lr_draws``: the one `fit` quotes)."""

    phi: float
    at_bound: bool
    ci: tuple[float, float] = (np.nan, np.nan)
    bracketed: dict[str, bool] = field(default_factory=dict)
    lr_ci: tuple[float, float] = (np.nan, np.nan)


def _one(job: tuple[pd.DataFrame, np.ndarray, Noise, DesignSettings, int, bool]) -> Simulated:
    """Simulate and fit one study (runs in a worker process)."""
    grid, theta, noise, st, i, with_bootstrap = job
    rng = np.random.default_rng([st.seed, i])
    L = simulate_table(grid, theta, noise, st.seed, i)
    if st.seed_means:
        grid, L = seed_means(grid, L)
    cells = grid_cells(grid)
    data = LawData.from_arrays(grid["N_once"], grid["N_rec"], grid["D"], grid["r"], L)
    bounds = Bounds.paper(st.phi_bounds)
    if not np.all(L > 0):
        return Simulated(np.nan, False)
    # The search (no bootstrap) also starts from the prior: it measures each grid's precision, and P(at box)
    # still shows grids whose fits escape to the box. Full simulations use random starts only, as `fit` does.
    extra = None if with_bootstrap else theta[None]
    best = multistart(
        data,
        bounds=bounds,
        loss=st.loss,
        delta=st.delta,
        restarts=st.restarts,
        polish=2 if with_bootstrap else 1,
        advance=16 if with_bootstrap else 4,
        seed=rng,
        extra_starts=extra,
    )[0]
    phi = float(best.theta[PHI])
    span = bounds.upper[PHI] - bounds.lower[PHI]
    out = Simulated(phi, bool(min(phi - bounds.lower[PHI], bounds.upper[PHI] - phi) <= 1e-6 * span))
    if with_bootstrap and st.bootstrap:
        W = cell_counts(int(cells.max()) + 1, st.bootstrap, rng)[:, cells]
        fits = refit_batch(
            data,
            W,
            best.theta[None],
            bounds=bounds,
            loss=st.loss,
            delta=st.delta,
            random_starts=st.bootstrap_random_starts,
            seed=rng,
        )
        draws = np.where(fits.phi_identifiable, fits.theta[:, PHI], np.nan)
        lo, hi = percentile_ci(draws, st.ci_level)
        out.ci, out.bracketed = (lo, hi), _bracketed(grid, L)
    if with_bootstrap and st.lr_draws:  # the interval `loopscale fit` quotes (docs/fit.md, "Inference")
        from loopscale.fit.inference import profile as inference

        v = inference.webb_weights(int(cells.max()) + 1, st.lr_draws, rng)
        state = inference.VariantInference.run(
            best.theta, best.objective, bounds, data, cells, v, st.loss, st.delta, st.seed + i
        )
        lo, hi = state.interval(st.ci_level).ci or (np.nan, np.nan)
        out.lr_ci = (lo, hi)
    return out


def _bracketed(grid: pd.DataFrame, L: np.ndarray) -> dict[str, bool]:
    """Per (C, r) cell: is the parabola-in-log-N vertex inside the widths tried (``allocation.empirical_optima``)?"""
    from loopscale.fit.allocation import empirical_optima

    emp = empirical_optima(grid.assign(val_loss=L))
    return {f"{c:.3g}|{r}": bool(b) for c, r, b in zip(emp["C"], emp["r"], emp["bracketed"], strict=True)}


T = TypeVar("T")
_WORKER_BLAS: list[Any] = []


def _worker_init() -> None:
    """A worker limits BLAS to one thread for its whole life (2 workers on 2 cores; no per-fit cost).

    ``process_pool`` has already made it ignore Ctrl-C and die with the parent (``loopscale.pool``)."""
    ctx = single_thread_blas()
    ctx.__enter__()
    _WORKER_BLAS.append(ctx)


def run_jobs(
    fn: Callable[[Any], T],
    jobs: list[Any],
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> list[T]:
    """``fn`` of every job in worker processes (fork: numpy and scipy are already imported), results in job order.

    Ctrl-C (or a failing job) kills the workers and drops the queued jobs at once (``loopscale.pool``)."""
    from loopscale.pool import process_pool

    n = len(jobs)
    workers = min(workers or (os.cpu_count() or 1), n)
    out: list[T | None] = [None] * n
    if workers <= 1:
        with single_thread_blas():  # once for all jobs: the fitter's own (nested) limits are then free
            for i, job in enumerate(jobs):
                out[i] = fn(job)
                if progress:
                    progress(i + 1, n)
        return [o for o in out if o is not None]
    with process_pool(workers, _worker_init) as pool:
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        for done, fut in enumerate(as_completed(futures), start=1):
            out[futures[fut]] = fut.result()
            if progress:
                progress(done, n)
    return [o for o in out if o is not None]


# ---- summaries ---------------------------------------------------------------------------------
@dataclass
class DesignResult:
    """What a simulated study tells about the grid (see the module docstring)."""

    n_runs: int
    n_cells: int
    cost_flops: float
    phi_true: float
    noise: Noise
    settings: DesignSettings
    sims: int
    ci_width: float  # mean over simulations of the bootstrap CI width
    ci_width_sd: float
    sampling_width: float  # 2 z x sd of phi-hat (fits off the box): what a calibrated CI would span
    bias: float  # median phi-hat - phi
    coverage: float
    reject_0: float
    reject_1: float
    at_bound: float
    identified: float = float("nan")  # share the verdict calls resolved (width, box: fit/inference/verdict.py)
    lr_ci_width: float = float("nan")  # the profile interval `fit` quotes: mean and median width, coverage, tests
    lr_ci_width_median: float = float("nan")
    lr_coverage: float = float("nan")
    lr_reject_0: float = float("nan")
    lr_reject_1: float = float("nan")
    bracketed: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def spread(x: np.ndarray, at_bound: np.ndarray) -> float:
    """sd of phi-hat over the fits that did not end at the box (those are counted in ``at_bound`` instead:
    one fit at -3 would otherwise decide the width)."""
    x = x[np.isfinite(x) & ~at_bound]
    return float(np.std(x, ddof=1)) if x.size >= 3 else float("nan")


def simulate(
    grid: pd.DataFrame,
    prior: dict[str, float],
    noise: Noise,
    settings: DesignSettings | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    with_bootstrap: bool = True,
) -> DesignResult:
    """Simulate the study ``settings.sims`` times and fit each simulated table with the real fitter.

    A grid where no simulated fit determines φ gives NaN widths (shown as such), not numpy's warnings."""
    import warnings

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _simulate(grid, prior, noise, settings, progress=progress, with_bootstrap=with_bootstrap)


def _simulate(
    grid: pd.DataFrame,
    prior: dict[str, float],
    noise: Noise,
    settings: DesignSettings | None,
    *,
    progress: Callable[[int, int], None] | None,
    with_bootstrap: bool,
) -> DesignResult:
    import time

    st = settings or DesignSettings()
    check_grid(grid)
    t0 = time.perf_counter()
    theta = params_to_theta(prior)
    g = grid[list(REQUIRED)].reset_index(drop=True).astype(float)
    g["r"] = g["r"].astype(int)
    g["seed"] = grid["seed"].to_numpy() if "seed" in grid.columns else 0  # keys each run's noise
    rows = run_jobs(_one, [(g, theta, noise, st, i, with_bootstrap) for i in range(st.sims)], st.workers, progress)
    phi_true = float(prior["phi"])
    phis = np.array([r.phi for r in rows], dtype=float)
    bound = np.array([r.at_bound for r in rows], dtype=bool)
    z = _z(st.ci_level)
    res = DesignResult(
        n_runs=len(g),
        n_cells=int(grid_cells(g).max()) + 1,
        cost_flops=study_cost(g),
        phi_true=phi_true,
        noise=noise,
        settings=st,
        sims=len(rows),
        ci_width=float("nan"),
        ci_width_sd=float("nan"),
        sampling_width=2 * z * spread(phis, bound),
        bias=float(np.nanmedian(phis) - phi_true),
        coverage=float("nan"),
        reject_0=float("nan"),
        reject_1=float("nan"),
        at_bound=float(np.mean(bound)),
    )
    if with_bootstrap and st.bootstrap:
        iv = _intervals(np.array([r.ci for r in rows], dtype=float), phi_true, bound, st)
        res.ci_width, res.ci_width_sd = iv["mean"], iv["sd"]
        res.coverage, res.reject_0, res.reject_1, res.identified = (
            iv["coverage"],
            iv["reject_0"],
            iv["reject_1"],
            iv["resolved"],
        )
        keys = sorted(
            {k for r in rows for k in r.bracketed}, key=lambda k: (float(k.split("|")[0]), int(k.split("|")[1]))
        )
        res.bracketed = {k: float(np.mean([r.bracketed.get(k, False) for r in rows])) for k in keys}
    if with_bootstrap and st.lr_draws:  # the interval `fit` quotes; the verdict reads it, so "resolved" too
        iv = _intervals(np.array([r.lr_ci for r in rows], dtype=float), phi_true, bound, st)
        res.lr_ci_width, res.lr_ci_width_median = iv["mean"], iv["median"]
        res.lr_coverage, res.lr_reject_0, res.lr_reject_1, res.identified = (
            iv["coverage"],
            iv["reject_0"],
            iv["reject_1"],
            iv["resolved"],
        )
    res.wall_s = time.perf_counter() - t0
    return res


def _intervals(ci: np.ndarray, phi_true: float, bound: np.ndarray, st: DesignSettings) -> dict[str, float]:
    """Width (mean, sd, median), coverage, P(excludes 0 / 1) and P(verdict: resolved) of simulated intervals."""
    ok = np.isfinite(ci).all(axis=1)
    width = ci[ok, 1] - ci[ok, 0]
    lo, hi = st.phi_bounds
    tol = 1e-3 * (hi - lo)
    width_all = np.where(ok, ci[:, 1] - ci[:, 0], np.inf)
    resolved = (
        ok & (width_all <= MAX_CI_WIDTH) & (width_all > 0) & ~bound & (ci[:, 0] > lo + tol) & (ci[:, 1] < hi - tol)
    )
    return {
        "mean": float(np.mean(width)),
        "sd": float(np.std(width)),
        "median": float(np.median(width)),
        "coverage": float(np.mean((ci[ok, 0] <= phi_true) & (phi_true <= ci[ok, 1]))),
        "reject_0": float(np.mean((ci[ok, 0] > 0) | (ci[ok, 1] < 0))),
        "reject_1": float(np.mean((ci[ok, 0] > 1) | (ci[ok, 1] < 1))),
        "resolved": float(np.mean(resolved)),
    }


def check_grid(grid: pd.DataFrame) -> None:
    from loopscale.errors import ConfigError

    for col in REQUIRED:
        if col not in grid.columns:
            raise ConfigError(col, f"missing from the planned grid; expected {', '.join(REQUIRED)}")
    if len(grid) <= 6:
        raise ConfigError("grid", "the law has 6 parameters; plan more runs than that", value=len(grid))


# ---- grid variants and the search ------------------------------------------------------------
def variants(
    grid: pd.DataFrame, seeds: Iterable[int] = (1, 2, 3), scales: Iterable[float] = (0.5, 2.0)
) -> dict[str, pd.DataFrame]:
    """Cheaper and dearer versions of a grid: as planned, every other budget, each budget dropped, the extreme
    widths dropped, fewer or more seeds per run, all budgets scaled (same widths, D scaled with C)."""
    out: dict[str, pd.DataFrame] = {"as planned": grid}
    C = budget_values(grid)
    budgets = sorted(set(C))
    if len(budgets) >= 4:
        half = budgets[::2]
        out[f"every other budget ({len(half)} of {len(budgets)})"] = grid[np.isin(C, half)]
    if len(budgets) > 2:
        for c in budgets:
            out[f"without C = {c:.3g}"] = grid[c != C]
    size = grid["N_once"] + grid["N_rec"]
    keyed = grid.assign(_C=C, _N=size)
    rank = keyed.groupby(["_C", "r"])["_N"].rank(method="dense")
    top = keyed.groupby(["_C", "r"])["_N"].transform(lambda x: x.nunique())
    inner = grid[(rank > 1) & (rank < top) | (top <= 3)]
    if len(inner) < len(grid):
        out["without each cell's extreme widths (cells with > 3 widths)"] = inner
    base_seeds = grid["seed"].nunique() if "seed" in grid.columns else 1
    points = grid[grid["seed"] == grid["seed"].min()] if "seed" in grid.columns else grid
    for k in seeds:
        if k != base_seeds:
            out[f"{k} seed{'s' if k > 1 else ''} per run"] = pd.concat(
                [points.assign(seed=j) for j in range(k)], ignore_index=True
            )
    for f in scales:
        out[f"budgets x {f:g}"] = grid.assign(C=grid["C"] * f, D=grid["D"] * f)
    return out


@dataclass
class SearchRow:
    name: str
    n_runs: int
    cost_flops: float
    relative_cost: float
    sampling_width: float
    bias: float
    at_bound: float


def search(
    grid: pd.DataFrame,
    prior: dict[str, float],
    noise: Noise,
    settings: DesignSettings | None = None,
    *,
    target: float | None = None,
    sims: int = 20,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[SearchRow], SearchRow | None]:
    """Every grid variant, its cost and expected phi width (sampling spread, no bootstrap), cheapest first;
    and the cheapest that reaches ``target`` (None if none does)."""
    st = settings or DesignSettings()
    st = DesignSettings(**{**asdict(st), "sims": sims, "restarts": max(10, st.restarts // 8)})
    base_cost = study_cost(grid)
    rows = []
    for name, g in variants(grid).items():
        if progress:
            progress(f"search: {name} ({len(g)} runs)")
        r = simulate(g, prior, noise, st, with_bootstrap=False)
        rows.append(
            SearchRow(name, r.n_runs, r.cost_flops, r.cost_flops / base_cost, r.sampling_width, r.bias, r.at_bound)
        )
    rows.sort(key=lambda x: x.cost_flops)
    best = None
    if target is not None:
        ok = [x for x in rows if x.sampling_width <= target and x.at_bound < 0.05]
        best = min(ok, key=lambda x: x.cost_flops) if ok else None
    return rows, best
