"""Fit the joint scaling law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta to a runs table.

Never imports torch: a user fitting a CSV on a laptop needs only numpy, scipy and pandas.

    from loopscale.fit import JointLaw, load_runs
    law = JointLaw().fit(load_runs("runs.csv"))      # the paper's fit: 500 starts, Huber 1e-3
    law.phi_, law.r2_, law.predict(N_once, N_rec, D, r)

``fit_runs`` runs everything the CLI reports (bootstrap, restricted fits, Delta-phi, optima,
checks) and returns the fit-file dict (``FitResult.of`` types it; ``load_fit`` reads a file typed);
``plan`` recommends (r, width, tokens) for a budget. The law's mathematics is ``fit.formula``, its
optimiser ``fit.optimiser``; law variants are registered in ``fit.variants``.
"""

from loopscale.fit.analysis import FitSettings, derived_from_params, fit_runs, law_from_fit
from loopscale.fit.bootstrap import cell_weights, percentile_ci, refit_batch, restart_check
from loopscale.fit.checks import extrapolation, half_split, leave_one_r_out, run_checks
from loopscale.fit.fitfile import load_fit, read_fit, write_fit
from loopscale.fit.formula import LawData, PhiState, Slot
from loopscale.fit.law import JointLaw, NotFittedError, clone
from loopscale.fit.optima import empirical_optima, law_frontier, width_polynomials
from loopscale.fit.optimiser import multistart, objective
from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI, PAPER_PROBES_PHI
from loopscale.fit.plan import plan
from loopscale.fit.result import FitResult
from loopscale.fit.synthetic import paper_grid_table, synthetic_runs
from loopscale.fit.table import RunsTable, load_runs, validate_runs

__all__ = [
    "PAPER_COEFFICIENTS",
    "PAPER_PHI_CI",
    "PAPER_PROBES_PHI",
    "FitResult",
    "FitSettings",
    "JointLaw",
    "LawData",
    "NotFittedError",
    "PhiState",
    "RunsTable",
    "Slot",
    "cell_weights",
    "clone",
    "derived_from_params",
    "empirical_optima",
    "extrapolation",
    "fit_runs",
    "half_split",
    "law_from_fit",
    "law_frontier",
    "leave_one_r_out",
    "load_fit",
    "load_runs",
    "multistart",
    "objective",
    "paper_grid_table",
    "percentile_ci",
    "plan",
    "read_fit",
    "refit_batch",
    "restart_check",
    "run_checks",
    "synthetic_runs",
    "validate_runs",
    "width_polynomials",
    "write_fit",
]
