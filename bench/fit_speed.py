"""bench: the full default fit on a 116-run table, and the ratio to a straightforward scipy fit.

    python bench/fit_speed.py            # ~1-2 minutes on 2 cores

1. loopscale's full default fit (``loopscale fit`` without options: 500 paper-style starts,
   restricted fits, per-r fits, 200-resample block bootstrap, optima, checks) on a synthetic
   116-run table drawn from the law on the paper's grid (phi = 0.46, sigma = 0.01 nats);
   also the acceptance core alone: main fit + 200-resample bootstrap.
2. Warm-start check: 5 bootstrap draws refitted with 500 fresh starts each vs. loopscale's
   warm-started refits (same optimum, or the CIs would be too narrow).
3. The reference (``bench/fit_reference.py``: scipy L-BFGS-B, finite-difference gradients, one
   start at a time). Timing all 500 x 201 fits would take over an hour, so it times ``REF_STARTS``
   starts and scales linearly to 500 starts per fit and 201 fits (main + 200 resamples).
Both run with single-threaded BLAS (see loopscale/fit/_threads.py), so the ratio is about the
algorithms, not about OpenBLAS thread contention.
"""

from __future__ import annotations

import os
import time

import numpy as np

import fit_reference  # bench/ is on sys.path when run as a script
from loopscale.fit import (
    FitSettings,
    JointLaw,
    LawData,
    cell_weights,
    fit_runs,
    refit_batch,
    restart_check,
    synthetic_runs,
)
from loopscale.fit.law.threads import single_thread_blas
from loopscale.fit.parts import bootstrap_cells
from startup import hardware

REF_STARTS = 40


def main() -> None:
    df = synthetic_runs(0.46, sigma=0.01, seed=0)
    print(f"hardware: {hardware()}")
    print(f"load average at start: {os.getloadavg()}")

    t = time.perf_counter()
    full = fit_runs(df, FitSettings())
    t_full = time.perf_counter() - t
    v = full.variant("baseline")
    assert v.inference is not None and v.inference.phi is not None and v.inference.phi.ci is not None
    print(
        f"full default fit (500 starts, restricted, per-r, 200 bootstrap, 2000-table inference, optima, checks): "
        f"{t_full:.2f} s; phi = {v.law.params.phi:.4f} profile interval "
        f"{np.round(v.inference.phi.ci, 4).tolist()}, percentile CI "
        f"{np.round(v.bootstrap.ci['phi'], 4).tolist()}"
    )

    t = time.perf_counter()
    law = JointLaw().fit(df)
    t_main = time.perf_counter() - t
    cells, _ = bootstrap_cells(df)
    W = cell_weights(cells, 200, np.random.default_rng(1))
    data = LawData.from_frame(df)
    t = time.perf_counter()
    refits = refit_batch(data, W, law.theta_[None], bounds=law.bounds(), seed=2)
    t_boot = time.perf_counter() - t
    core = t_main + t_boot
    print(
        f"core: main fit {t_main:.2f} s + 200 bootstrap refits {t_boot:.2f} s = {core:.2f} s "
        f"(converged {refits.converged.mean():.0%})"
    )

    t = time.perf_counter()
    chk = restart_check(data, W[:5], law.theta_[None], bounds=law.bounds(), restarts=500)
    print(
        f"warm-start check on 5 draws vs 500 fresh starts each: max |dphi| = {chk['max_abs_dphi']:.2e}, "
        f"max rel. objective excess = {chk['max_rel_objective_excess']:.2e} ({time.perf_counter() - t:.1f} s)"
    )

    with single_thread_blas():
        t = time.perf_counter()
        theta, obj, n = fit_reference.fit(df, starts=REF_STARTS, seed=0)
        t_ref = time.perf_counter() - t
    per_fit = t_ref / n * 500
    ref_core = per_fit * 201
    print(
        f"reference: {REF_STARTS} starts in {t_ref:.2f} s -> {per_fit:.1f} s per 500-start fit, "
        f"{ref_core / 60:.1f} min for main + 200 resamples (extrapolated)"
    )
    print(
        f"reference best of {REF_STARTS}: phi = {theta[5]:.4f}, objective {obj:.6e} "
        f"(loopscale: phi = {law.phi_:.4f}, objective {law.objective_:.6e})"
    )
    with single_thread_blas():
        t = time.perf_counter()
        theta_t, obj_t, n_t = fit_reference.fit(df, starts=REF_STARTS // 4, seed=0, tight=True)
        t_tight = time.perf_counter() - t
    print(
        f"reference with tight tolerances: {n_t} starts in {t_tight:.2f} s -> "
        f"{t_tight / n_t * 500:.0f} s per 500-start fit; best phi = {theta_t[5]:.4f}, objective {obj_t:.6e}"
    )
    warm = per_fit + 200 * t_ref / n  # if the reference also warm-started each resample from one start
    print(f"reference with one warm start per resample instead: {warm:.0f} s")
    print(
        f"ratio (reference / loopscale), main fit: {per_fit / t_main:.0f}x; main + 200 bootstrap: "
        f"{ref_core / core:.0f}x; vs warm-started reference: {warm / core:.0f}x"
    )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
