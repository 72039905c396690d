"""Fit the joint scaling law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta to a runs table.

Never imports torch: a user fitting a CSV on a laptop needs only numpy, scipy and pandas. Names load on
first use (PEP 562), so ``from loopscale.fit.settings import FitSettings`` (the CLI's defaults) costs no numpy.

    from loopscale.fit import fit_sweep, JointLaw, load_runs
    res = fit_sweep("sweeps/demo")                   # what `loopscale fit` runs: a typed FitResult
    law = JointLaw().fit(load_runs("runs.csv"))      # the law alone: 500 starts, Huber 1e-3
    law.phi_, law.r2_, law.predict(N_once, N_rec, D, r)

Where things live (docs/fit.md, "Layout"):

* ``prepare`` — ``fit_sweep`` / ``prepare_fit``: the use case (spec defaults, seed means, controls, template);
* ``pipeline`` — ``fit_runs``: every part for every variant, then Delta-phi; ``parts`` — the parts;
* ``settings`` — ``FitSettings`` and the spec's ``[fit]`` table, each default once;
* ``result`` / ``fitfile`` — the typed ``FitResult`` and its file; ``table`` — runs tables;
* ``law/`` — the law (``formula``), its solver and estimator (``joint.JointLaw``), law variants;
* ``inference/`` — calibrated intervals and tests, the block bootstrap, shared-law Delta-phi, checks,
  comparison with the paper, the verdict;
* ``allocation`` — compute-optimal allocation (empirical optima, the law's frontier); ``recommend`` —
  ``plan``: what to train at a budget; ``design`` — how wide phi's interval a planned grid gives;
  ``paper`` — the paper's published numbers; ``synthetic`` — tables drawn from a known law.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "PAPER_COEFFICIENTS": "loopscale.fit.paper",
    "PAPER_PHI_CI": "loopscale.fit.paper",
    "PAPER_PROBES_PHI": "loopscale.fit.paper",
    "FitResult": "loopscale.fit.result",
    "FitSettings": "loopscale.fit.settings",
    "FitTable": "loopscale.fit.settings",
    "JointLaw": "loopscale.fit.law.joint",
    "NotFittedError": "loopscale.fit.law.joint",
    "clone": "loopscale.fit.law.joint",
    "LawData": "loopscale.fit.law.formula",
    "PhiState": "loopscale.fit.law.formula",
    "Slot": "loopscale.fit.law.formula",
    "multistart": "loopscale.fit.law.solver",
    "objective": "loopscale.fit.law.solver",
    "RunsTable": "loopscale.fit.table",
    "load_runs": "loopscale.fit.table",
    "validate_runs": "loopscale.fit.table",
    "bootstrap_cells": "loopscale.fit.parts",
    "derived_from_params": "loopscale.fit.parts",
    "fit_runs": "loopscale.fit.pipeline",
    "fit_sweep": "loopscale.fit.prepare",
    "prepare_fit": "loopscale.fit.prepare",
    "cell_weights": "loopscale.fit.inference.bootstrap",
    "percentile_ci": "loopscale.fit.inference.bootstrap",
    "refit_batch": "loopscale.fit.inference.bootstrap",
    "restart_check": "loopscale.fit.inference.bootstrap",
    "extrapolation": "loopscale.fit.inference.checks",
    "half_split": "loopscale.fit.inference.checks",
    "leave_one_r_out": "loopscale.fit.inference.checks",
    "run_checks": "loopscale.fit.inference.checks",
    "law_from_fit": "loopscale.fit.fitfile",
    "load_fit": "loopscale.fit.fitfile",
    "read_fit": "loopscale.fit.fitfile",
    "write_fit": "loopscale.fit.fitfile",
    "empirical_optima": "loopscale.fit.allocation",
    "law_frontier": "loopscale.fit.allocation",
    "width_polynomials": "loopscale.fit.allocation",
    "plan": "loopscale.fit.recommend",
    "paper_grid_table": "loopscale.fit.synthetic",
    "synthetic_runs": "loopscale.fit.synthetic",
}

__all__ = [
    "PAPER_COEFFICIENTS",
    "PAPER_PHI_CI",
    "PAPER_PROBES_PHI",
    "FitResult",
    "FitSettings",
    "FitTable",
    "JointLaw",
    "LawData",
    "NotFittedError",
    "PhiState",
    "RunsTable",
    "Slot",
    "bootstrap_cells",
    "cell_weights",
    "clone",
    "derived_from_params",
    "empirical_optima",
    "extrapolation",
    "fit_runs",
    "fit_sweep",
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
    "prepare_fit",
    "read_fit",
    "refit_batch",
    "restart_check",
    "run_checks",
    "synthetic_runs",
    "validate_runs",
    "width_polynomials",
    "write_fit",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'loopscale.fit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from loopscale.fit.allocation import empirical_optima, law_frontier, width_polynomials
    from loopscale.fit.fitfile import law_from_fit, load_fit, read_fit, write_fit
    from loopscale.fit.inference.bootstrap import cell_weights, percentile_ci, refit_batch, restart_check
    from loopscale.fit.inference.checks import extrapolation, half_split, leave_one_r_out, run_checks
    from loopscale.fit.law.formula import LawData, PhiState, Slot
    from loopscale.fit.law.joint import JointLaw, NotFittedError, clone
    from loopscale.fit.law.solver import multistart, objective
    from loopscale.fit.paper import PAPER_COEFFICIENTS, PAPER_PHI_CI, PAPER_PROBES_PHI
    from loopscale.fit.parts import bootstrap_cells, derived_from_params
    from loopscale.fit.pipeline import fit_runs
    from loopscale.fit.prepare import fit_sweep, prepare_fit
    from loopscale.fit.recommend import plan
    from loopscale.fit.result import FitResult
    from loopscale.fit.settings import FitSettings, FitTable
    from loopscale.fit.synthetic import paper_grid_table, synthetic_runs
    from loopscale.fit.table import RunsTable, load_runs, validate_runs
