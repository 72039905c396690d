"""``fit_runs``: the whole fit of a runs table, one typed ``FitResult`` out (docs/fit.md).

For each variant the parts of ``fit.parts`` (law, restricted, law variants, per-r, bootstrap, optima, checks,
inference); between variants, Delta-phi (:func:`delta_phi`) with its calibrated interval and test, the
bootstrap CI from *paired* resamples (one cell draw is shared by all variants, so the shared r = 1 runs
enter both fits identically), the shared-law reading and the loss gap on the same runs. ``fit_sweep``
(``fit.sweep``) prepares a table the way the CLI does and calls this.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscale import grids
from loopscale.fit import parts
from loopscale.fit.inference import paired as paired_mod
from loopscale.fit.inference import profile
from loopscale.fit.inference import shared as shared_mod
from loopscale.fit.inference.bootstrap import cell_counts, percentile_ci
from loopscale.fit.inference.verdict import data_rule
from loopscale.fit.result import DeltaPhi, FitResult, PairedDelta, VariantFit
from loopscale.fit.settings import FitSettings
from loopscale.fit.table import as_runs, budget_values, is_control_refit, r1_anchor, tokens_per_step


def fit_runs(
    table: Any, settings: FitSettings | None = None, progress: Callable[[str], None] | None = None
) -> FitResult:
    """Fit a runs table (a ``RunsTable``, a DataFrame or a path); returns the fit (docs/fit.md)."""
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

    cells, unit = parts.bootstrap_cells(df_all)
    if settings.bootstrap and unit == "run":
        warnings_.append(
            "no budget column C (or flops_per_token): bootstrap resamples single runs, not "
            "(budget, r) cells; CIs may be too narrow"
        )
    # cells are 0..K-1 (pd.factorize); one (B, K) draw of cell counts serves every variant (paired).
    counts = cell_counts(int(cells.max()) + 1, settings.bootstrap, np.random.default_rng(settings.seed))
    W_all = counts[:, cells]
    # one wild-bootstrap draw per cell, shared by every variant (paired, as the block bootstrap's counts)
    V_all = profile.webb_weights(int(cells.max()) + 1, settings.lr_draws, np.random.default_rng([settings.seed, 1]))
    budgets = sorted(set(budget_values(df_all))) if "C" in df_all.columns else list(grids.PAPER_BUDGETS)
    template = dict(settings.template)

    fitted: dict[str, _Fitted] = {}
    for v in variants:
        mask = selected.variant_mask(v)
        vr = parts.VariantRuns(v, selected.subset(mask), cells[mask], unit, settings, say, warnings_)
        fitted[v] = _fit_variant(vr, mask, W_all, V_all, template, budgets)
        fitted[v].cells = cells[mask]

    return FitResult(
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        loopscale_version=_version(),
        source={
            "path": runs.source,
            "n_rows": len(runs.df) + runs.n_excluded,
            "n_used": len(df_all),
            "excluded": runs.excluded,
        },
        settings={**asdict(settings), "template": template},
        template=template,
        budgets=budgets,
        tokens_per_step=tokens_per_step(df_all),
        reference_variant=ref,
        resamples={
            "unit": unit,
            "seed": settings.seed,
            "run_id": df_all["run_id"].astype(str).tolist(),
            "cell_of_run": cells,
            "cell_counts": counts.astype(int),
        },
        variants={v: f.record for v, f in fitted.items()},
        delta_phi=delta_phi(fitted, ref, settings, say, V_all),
        warnings=warnings_,
        wall_s=time.perf_counter() - t_start,
    )


@dataclass
class _Fitted:
    """One variant's record and what Delta-phi pairs across variants (its runs, phi draws, inference state)."""

    record: VariantFit
    frame: pd.DataFrame
    phi_draws: np.ndarray | None
    state: profile.VariantInference | None
    cells: np.ndarray | None = None  # (budget, r) cell of each of its runs, numbered over the whole table


def _fit_variant(
    vr: parts.VariantRuns,
    mask: np.ndarray,
    W_all: np.ndarray,
    V_all: np.ndarray,
    template: dict[str, Any],
    budgets: list[float],
) -> _Fitted:
    st = vr.settings
    rule = data_rule(vr.df, phi_free=st.fixed_phi is None, reference_r=st.reference_r)
    vr.warnings += [f"[{vr.name}] {w}" for w in rule.warnings]
    law = parts.fit_law(vr)
    restricted = parts.fit_restricted(vr, law)
    law_variants = parts.fit_law_variants(vr, law)
    per_r = parts.fit_per_r(vr)
    boot = parts.fit_bootstrap(vr, law, W_all[:, mask])
    optima = parts.fit_optima(vr, law, template, budgets, boot)
    rec = VariantFit(
        n_runs=len(vr.df),
        rs=vr.rs,
        law=parts.law_record(law),
        metrics=parts.metrics(law),
        identifiability=rule.as_dict(),
        derived=parts.derived(law, vr.rs),
        restricted=restricted,
        law_variants=law_variants,
        per_r=per_r,
        bootstrap=boot.record,
        optima=optima,
    )
    checks = parts.fit_checks(vr, law)
    if checks is not None:
        rec.checks = checks
    inf = parts.fit_inference(vr, law, V_all, rec, paper=not is_control_refit(vr.name))
    if inf is not None:
        rec.inference = inf[0]
    return _Fitted(rec, vr.df, boot.phi_draws, None if inf is None else inf[1])


def delta_phi(
    fitted: dict[str, _Fitted],
    ref: str,
    settings: FitSettings,
    say: Callable[[str], None],
    V: np.ndarray | None = None,
) -> list[DeltaPhi]:
    """phi of each variant read against the same r = 1 runs as the reference, minus the reference's: from the
    separate fits (calibrated), paired on the runs both recipes share (``inference.paired``; it joins the
    variant's ``inference`` record), and under the shared law; ``leading`` says which reading is quoted."""
    out = []
    a_fit = fitted[ref]
    for v, b_fit in fitted.items():
        comparable = (b_fit.phi_draws is not None and a_fit.phi_draws is not None) or (
            b_fit.state is not None and a_fit.state is not None
        )
        if v == ref or r1_anchor(v) != r1_anchor(ref) or not comparable:
            continue
        a, b = a_fit.record.params.phi, b_fit.record.params.phi
        if a is None or b is None:
            continue
        d = (
            b_fit.phi_draws - a_fit.phi_draws
            if b_fit.phi_draws is not None and a_fit.phi_draws is not None
            else np.array([])
        )
        finite = d[np.isfinite(d)]
        entry = DeltaPhi(
            reference=ref,
            variant=v,
            delta_phi=b - a,
            ci=percentile_ci(d, settings.ci_level),
            fraction_above_zero=float(np.mean(finite > 0)) if finite.size else None,
            draws=d,
        )
        if a_fit.state is not None and b_fit.state is not None:
            say(f"[{v}] inference: Δφ against {ref}")
            entry.inference = profile.delta_record(a_fit.state, b_fit.state, settings.ci_level, d)
            entry.ci = entry.inference.ci
            entry.secondary_ci = percentile_ci(d, settings.ci_level)
        entry.loss_gap = shared_mod.loss_gap(a_fit.frame, b_fit.frame, settings.ci_level)
        fv = b_fit.frame  # the runs the reference also holds (shared r = 1 runs, a control's) enter once
        shared_rows = fv["run_id"].astype(str).isin(set(a_fit.frame["run_id"].astype(str))).to_numpy()
        own = fv[~shared_rows]
        if settings.shared:
            say(f"[{v}] shared-law Δφ against {ref}" + (" with held-out cells" if settings.checks else ""))
            entry.shared = shared_mod.shared_record(a_fit.frame, own, settings.law(), checks=settings.checks)
        paired: PairedDelta | None = None
        if V is not None and b_fit.record.inference is not None and a_fit.cells is not None:
            say(f"[{v}] paired Δφ against {ref}: {settings.lr_draws} wild-bootstrap tables")
            assert b_fit.cells is not None
            starts = paired_mod.starts_from(np.asarray(a_fit.record.law.theta), np.asarray(b_fit.record.law.theta))
            paired = paired_mod.paired_delta_phi(
                a_fit.frame,
                own,
                a_fit.cells,
                b_fit.cells[~shared_rows],
                V,
                settings.law(),
                starts,
                settings.ci_level,
                checks=settings.checks,
                seed=settings.seed,
            )
            if paired is not None:
                paired.reference = ref
                b_fit.record.inference.paired_delta_phi = paired
        entry.leading = paired_mod.leading(paired, entry.inference)
        if entry.leading is not None:
            entry.ci = entry.leading.ci
        out.append(entry)
    return out


def _version() -> str:
    from loopscale import __version__

    return __version__
