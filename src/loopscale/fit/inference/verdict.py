"""Is phi resolved? One verdict, used by `loopscale fit`, `plan`, `report`, `design` and `--json`.

Two halves, both about the same question:

* :func:`data_rule` looks at a runs table *before* the fit: what the design can identify at all
  (arXiv 2604.21106 §5: phi enters the law only through runs with r > 1, and only relative to a
  reference — r = 1, or a declared looped reference). The fit stores its answer per variant
  (``identifiability``: reasons and caveats) in the fit file.
* :func:`phi_verdict` reads a fit file's record of one variant and returns the label and every
  reason that applies. "Resolved" certifies this much and no more: the fit is sound (none of the
  reasons below) and the calibrated interval (``inference.phi.ci``: profile likelihood with a
  wild-bootstrap critical value, ``fit/inference/profile.py``; the percentile bootstrap's for fit files written
  before it) is narrower than ``MAX_CI_WIDTH``. Reasons (any one -> "not resolved"):

  - no r > 1 runs (phi undetermined)                            -> not resolved
  - the data rule's reasons (one width at some r, one looped r
    without r = 1, no r = 1 and no declared reference)           -> not resolved
  - phi at a bound of its box, or a CI end at a bound           -> not resolved
  - interval wider than ``MAX_CI_WIDTH`` (0.5), or of zero width -> not resolved
  - more than 10% of bootstrap draws could not determine phi     -> not resolved
  - the law explains little of the loss (R^2 < 0.9)              -> not resolved
  - the optimiser did not converge                              -> not resolved
  - near-optimal minima that disagree on phi by > 0.1           -> not resolved
  - no bootstrap at all                                          -> "phi = x (uncertainty not estimated)"

Caveats (shown with the label, whatever it is): phi above 1 or below 0, a looped-only fit, an interval
in more than one piece, bootstrap refits whose coefficients sit at their box bounds, A's interval
spanning orders of magnitude, block-bootstrap draws that break the data rule (no r = 1 cell, or a
missing r), and r = 1 runs that fit far worse than the looped ones. What the data say about phi = 0,
phi = 1 and the paper's 0.46 is :func:`claims` (tests, not interval endpoints).

For reference, the paper's CI is 0.41-0.53 (width 0.12); synthetic tables on the paper's grid give
widths 0.06-0.10 (docs/fit.md), so 0.5 only fails a fit that cannot tell phi = 0 from phi = 1 at
roughly the 95% level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loopscale.fit.paper import PAPER_COEFFICIENTS
from loopscale.fit.result import FitResult, Identifiability, Inference, VariantFit
from loopscale.numbers import phi as phi_txt
from loopscale.numbers import phi_ci

#: a CI for phi wider than this cannot separate "a repeat is worth nothing" from "worth a block".
MAX_CI_WIDTH = 0.5
#: share of bootstrap draws allowed to leave phi undetermined.
MAX_UNDETERMINED_SHARE = 0.10
#: a law that explains less of the loss variance than this (R^2 on raw nats) says nothing about phi.
MIN_R2 = 0.9
#: near-optimal minima whose phi differs by more than this make phi ambiguous.
MINIMA_PHI_SPREAD = 0.1
#: coefficients of the joint law: E, A, B, alpha, beta, phi.
N_PARAMS = 6

PAPER_PHI = float(PAPER_COEFFICIENTS["phi"])
NOT_IDENTIFIED = "φ not resolved at this scale"
#: share of bootstrap refits with a coefficient at its box bound above which the verdict says so.
MAX_AT_BOUNDS_SHARE = 0.25
#: Monte-Carlo sd of an interval end above which the verdict says so.
MAX_MC_SD = 0.01
#: A's interval spanning more than this many orders of magnitude: A is not determined.
MAX_A_DECADES = 3.0
#: r = 1 runs fitting this many times worse (RMSE) than the worst looped r: the law's anchor is poor.
MAX_R1_RMSE_RATIO = 2.0


# ---- before the fit: what can this table identify? ----------------------------------------
@dataclass
class DataRule:
    """What a runs table can identify: free parameters, and why phi would not be identified."""

    n_runs: int
    n_params: int
    reasons: list[str] = field(default_factory=list)  # phi not identified, whatever the fit says
    caveats: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # for the CLI's warning lines (legacy wording)

    def as_dict(self) -> dict[str, Any]:
        return {"n_runs": self.n_runs, "n_params": self.n_params, "reasons": self.reasons, "caveats": self.caveats}


def data_rule(df: Any, *, phi_free: bool = True, reference_r: int | None = None) -> DataRule:
    """The minimum-data rule: more runs than free parameters, >= 2 widths per r, r = 1 or a declared
    reference (``reference_r``: the looped r a looped-only fit is read against, e.g. from ``--r 2 --r 4``)."""
    r = np.asarray(df["r"], dtype=int)
    size = np.asarray(df["N_once"], dtype=float) + np.asarray(df["N_rec"], dtype=float)
    looped_rs = sorted({int(x) for x in r[r > 1]})
    phi_in = phi_free and bool(looped_rs)
    out = DataRule(len(r), N_PARAMS if phi_in else N_PARAMS - 1)
    if not looped_rs:
        out.warnings.append(
            "phi is NOT identifiable: the table has no r > 1 runs; fitted the Chinchilla law "
            "L = E + A N^-alpha + B D^-beta with N = N_once + N_rec, phi undetermined"
        )
        return out
    widths = {int(k): len(np.unique(np.round(size[r == k], 6))) for k in sorted(set(r.tolist()))}
    single = [k for k, n in widths.items() if n < 2]
    if single and set(looped_rs) <= set(single):
        out.reasons.append("every r > 1 has a single width, so φ rests on one model size per r")
        out.warnings.append(
            "phi is POORLY identifiable: every r > 1 has a single width, so phi rests on one model size per r; "
            "add widths"
        )
    elif single:
        out.reasons.append(
            f"r = {', '.join(map(str, single))} {'has' if len(single) == 1 else 'have'} a single width, so the "
            "size term (α) and φ cannot be separated there; give every r at least two widths"
        )
        out.warnings.append(f"phi is POORLY identifiable: r = {single} with a single width; add widths")
    if 1 not in widths:
        if len(looped_rs) == 1:
            out.reasons.append(
                f"one looped r ({looped_rs[0]}) and no r = 1 runs: r^φ only rescales N_rec, so φ is confounded with A"
            )
            out.warnings.append(
                f"phi is NOT identifiable: one looped r ({looped_rs[0]}) and no r = 1 runs; phi is confounded "
                "with A (add r = 1 runs or a second looped r)"
            )
        elif reference_r is None:
            out.reasons.append("no r = 1 runs and no declared reference (fit with --r to read φ among looped models)")
            out.warnings.append("phi is POORLY identifiable: no r = 1 runs; φ rests on the looped r alone")
        else:
            out.caveats.append(f"φ is read among looped models only (reference r = {reference_r}, no r = 1 runs)")
    return out


# ---- after the fit: the verdict ---------------------------------------------------------------
@dataclass
class Verdict:
    """The headline label for phi of one variant."""

    variant: str
    resolved: bool
    label: str  # the headline, e.g. "φ = 0.459 [0.410, 0.530]" or "φ not resolved at this scale"
    phi: float | None
    ci: tuple[float, float] | None
    ci_level: float
    reasons: list[str] = field(default_factory=list)  # why phi is not resolved (empty if it is)
    caveats: list[str] = field(default_factory=list)  # things to know even when it is
    method: str = "percentile bootstrap"  # how ``ci`` was computed
    claims: list[str] = field(default_factory=list)  # what the tests say about phi = 0, 1, 0.46 (``claims``)

    @property
    def identified(self) -> bool:
        """Old name of ``resolved`` (kept for library callers)."""
        return self.resolved

    @property
    def phi_undetermined(self) -> bool:
        """No estimate at all (no looped runs), as opposed to an estimate that is not identified."""
        return self.phi is None

    @property
    def ci_width(self) -> float | None:
        return None if self.ci is None else self.ci[1] - self.ci[0]

    @property
    def sentence(self) -> str:
        """ "resolved ..." or "not resolved, because ..." (the words `fit`, `plan` and `--json` print)."""
        if not self.resolved:
            return "not resolved, because " + "; ".join(self.reasons)
        if self.ci is None:
            return "resolved only as a point estimate (no interval)"
        return f"resolved: sound fit, {self.ci_level:.0%} interval {self.ci_width:.2f} wide (< {MAX_CI_WIDTH:g})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "resolved": self.resolved,
            "identified": self.resolved,
            "verdict": self.sentence,
            "label": self.label,
            "phi": self.phi,
            "ci": self.ci,
            "ci_level": self.ci_level,
            "method": self.method,
            "reasons": self.reasons,
            "caveats": self.caveats,
            "claims": self.claims,
        }


def finite_or_none(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None


def phi_verdict(fit: Any, variant: str | None = None) -> Verdict:
    """Decide whether phi of ``variant`` (default: the reference) is resolved, and say why not.

    ``fit`` is a ``result.FitResult`` or a fit dict (of ``fit_runs``, or a fit file)."""
    res = FitResult.of(fit)
    name = variant or res.reference
    rec = res.variant(name)
    law = rec.law
    phi = rec.phi
    boot = rec.bootstrap
    inf = rec.inference
    inf_phi = inf.phi if inf is not None else None
    if inf_phi is not None and inf_phi.ci is not None:
        level = float(inf_phi.level or res.ci_level)
        ci = inf_phi.ends
        method = "profile likelihood"
    else:
        level = float(boot.ci_level or res.ci_level)
        ci = boot.ci_of("phi")
        method = "percentile bootstrap"
    lo_b, hi_b = res.phi_bounds
    span = float(hi_b) - float(lo_b)
    ident = rec.identifiability or Identifiability()
    reasons: list[str] = []
    caveats: list[str] = list(ident.caveats)
    fixed = res.fixed_phi

    if phi is None:
        reasons.append("the table has no looped (r > 1) runs, so φ does not enter the fit")
        return Verdict(name, False, NOT_IDENTIFIED, None, None, level, reasons)
    if fixed is not None:
        caveats.append(f"φ was fixed to {float(fixed):g} by the fit's settings (--fix-phi), not estimated")
        return Verdict(name, True, f"φ = {phi_txt(phi)} (fixed, not estimated)", phi, ci, level, [], caveats, method)

    reasons += list(ident.reasons)
    if "phi" in law.at_bounds:
        reasons.append(f"the fit ran to a bound of φ's box [{lo_b:g}, {hi_b:g}] (φ = {phi_txt(phi)})")
    r2 = finite_or_none(rec.metrics.r2)
    if r2 is not None and r2 < MIN_R2:
        reasons.append(f"the joint law explains little of the loss (R² = {r2:.3f} < {MIN_R2}), so its φ means nothing")
    if law.converged is False:
        reasons.append(f"the optimiser did not converge ({law.message or 'no message'})")
    near = [m for m in law.minima if m.get("near_optimal")]
    phis = [x for x in (finite_or_none(m["params"].get("phi")) for m in near) if x is not None]
    if len(phis) > 1 and max(phis) - min(phis) > MINIMA_PHI_SPREAD:
        reasons.append(
            f"{len(phis)} near-optimal minima (within 1% of the best objective) disagree on φ "
            f"({min(phis):.2f} to {max(phis):.2f})"
        )
    if rec.identifiability is None:  # fit files written before the data rule was stored
        for w in res.warnings:
            if w.startswith(f"[{name}]") and "POORLY identifiable" in w:
                reasons.append("every r > 1 has a single width, so φ rests on one model size per r")
    if ci is None:
        if not boot.n and inf_phi is None:
            caveats.append("no bootstrap was run, so φ's uncertainty is unknown (rerun with --lr-draws 1000)")
        else:
            reasons.append("no finite interval for φ")
    else:
        width = ci[1] - ci[0]
        if width > MAX_CI_WIDTH:
            reasons.append(
                f"the {level:.0%} interval is {width:.2f} wide (> {MAX_CI_WIDTH}): [{ci[0]:.2f}, {ci[1]:.2f}]"
            )
        elif width <= 1e-9 * max(1.0, abs(phi)):
            reasons.append("the interval has zero width: the law passes through every run (too few runs for one)")
        tol = 1e-3 * span
        if ci[0] <= lo_b + tol or ci[1] >= hi_b - tol:
            reasons.append(f"the interval reaches a bound of φ's box [{lo_b:g}, {hi_b:g}]")
    if method == "percentile bootstrap" and boot.n:
        caveats.append(
            "the interval is the percentile bootstrap's (a fit file without the calibrated inference; "
            "refit for the profile-likelihood interval and tests)"
        )
    n_boot = int(boot.n or 0)
    undet = boot.phi_undetermined_draws
    if n_boot and undet and undet / n_boot > MAX_UNDETERMINED_SHARE:
        reasons.append(f"{undet} of {n_boot} bootstrap draws left φ undetermined (no r > 1 cell drawn)")
    conv = finite_or_none(boot.converged_fraction)
    if conv is not None and conv < 0.9:
        caveats.append(f"only {conv:.0%} of bootstrap refits converged")
    caveats += fit_caveats(rec, inf)

    if "phi" not in law.at_bounds:  # at a bound the reason says it all
        caveats += range_caveats(phi, None if inf_phi is not None else ci)  # with tests, the claims say it
    reasons = list(dict.fromkeys(reasons))
    said = claims(rec, level, resolved=not reasons)
    if reasons:
        return Verdict(name, False, NOT_IDENTIFIED, phi, ci, level, reasons, caveats, method, said)
    if ci is None:
        return Verdict(
            name, True, f"φ = {phi_txt(phi)} (uncertainty not estimated)", phi, None, level, [], caveats, method, said
        )
    return Verdict(name, True, f"φ = {phi_ci(phi, ci)}", phi, ci, level, [], caveats, method, said)


def fit_caveats(rec: VariantFit, inf: Inference | None) -> list[str]:
    """What the whole fit says beyond phi's interval: coefficients at their box, A undetermined, draws that
    break the data rule, r = 1 runs fitting far worse than the looped ones, an interval in pieces."""
    out: list[str] = []
    inf_phi = inf.phi if inf is not None else None
    null = inf.null if inf is not None else None
    mc = [x for x in ((inf_phi.mc_sd if inf_phi else None) or []) if finite_or_none(x) is not None]
    if mc and max(mc) > MAX_MC_SD:
        n = int(null.n if null is not None else 0)
        out.append(
            f"the interval's ends carry a Monte-Carlo sd of up to {max(mc):.3f} from {n} bootstrap tables "
            "(a flat profile there); another --seed moves them by about that, more --lr-draws less"
        )
    if inf_phi is not None and inf_phi.disjoint:
        out.append("the profile interval is more than one piece (the profile has several dips); it gives their hull")
    share = finite_or_none(null.at_bounds_fraction if null is not None else None)
    if share is not None and share > MAX_AT_BOUNDS_SHARE:
        out.append(
            f"in {share:.0%} of the wild-bootstrap refits a coefficient sits at its box bound: the law's "
            "other coefficients are poorly pinned at this scale"
        )
    boot = rec.bootstrap
    at = boot.at_bounds or None
    if at and boot.n:
        named = ", ".join(f"{k} {n}" for k, n in sorted(at.items(), key=lambda kv: -kv[1]) if n)
        if named and max(at.values()) / boot.n > MAX_AT_BOUNDS_SHARE:
            out.append(f"block-bootstrap draws at a box bound, of {boot.n}: {named}")
    a_ci = boot.ci_of("A")
    if a_ci and a_ci[0] > 0 and a_ci[1] > 0 and np.log10(a_ci[1] / a_ci[0]) > MAX_A_DECADES:
        out.append(
            f"A's interval spans {np.log10(a_ci[1] / a_ci[0]):.0f} orders of magnitude (A and α trade off): "
            "the size term is not determined, only its effect on the runs fitted"
        )
    broken = boot.data_rule_draws or None
    if broken and boot.n and (broken.get("no_r1") or broken.get("missing_r")):
        out.append(
            f"of the block bootstrap's {boot.n} draws, {broken.get('no_r1', 0)} have no r = 1 cell and "
            f"{broken.get('missing_r', 0)} lack some r: its percentile interval (secondary) rests partly on "
            "tables that cannot identify φ"
        )
    rm = {int(k): x for k, v in (rec.metrics.rmse_per_r or {}).items() if (x := finite_or_none(v)) is not None}
    looped = [v for k, v in rm.items() if k > 1]
    if 1 in rm and looped and rm[1] > MAX_R1_RMSE_RATIO * max(looped):
        out.append(
            f"the r = 1 runs fit {rm[1] / max(looped):.1f}× worse than the looped ones (RMSE {rm[1]:.3f} vs "
            f"{min(looped):.3f}–{max(looped):.3f}): the law's r = 1 anchor, against which φ is read, is poor"
        )
    return out


def claims(rec: VariantFit, level: float, *, resolved: bool) -> list[str]:
    """What the calibrated tests say about each tested phi (``inference.tests``), in words.

    "rules out φ = x" only when the test rejects at ``level`` *and* the phi = x law predicts held-out runs
    worse than the free law, and only for a resolved fit; otherwise the sentence says the data cannot tell
    φ = x apart from the fit, and why."""
    tests = rec.inference.tests if rec.inference is not None else {}
    null = rec.inference.null if rec.inference is not None else None
    n_null = int(null.n if null is not None else 0)
    out: list[str] = []
    alpha = 1 - level

    def ptxt(p: float) -> str:  # the smallest p the bootstrap can give is 1 / (B + 1)
        return f"p ≤ {1 / (n_null + 1):.2g}" if n_null and p <= 1 / (n_null + 1) + 1e-12 else f"p = {p:.2g}"

    for t in tests.values():
        x, p = finite_or_none(t.value), finite_or_none(t.p)
        if x is None or p is None:
            continue
        what = f"the paper's φ = {x:.2f}" if abs(x - PAPER_PHI) < 1e-9 else f"φ = {x:g}"
        if not resolved:
            out.append(f"{what}: no claim ({ptxt(p)}), the fit is not resolved")
        elif t.ruled_out:
            out.append(f"rules out {what} ({ptxt(p)} < {alpha:g}; a law with it also predicts held-out runs worse)")
        elif t.rejected:
            why = (
                "it predicts held-out runs as well or better"
                if t.held_out_worse is False
                else "no held-out check ran for it"
            )
            out.append(f"cannot tell {what} apart from the fit: the test rejects it ({ptxt(p)}), but {why}")
        else:
            out.append(f"cannot tell {what} apart from the fit ({ptxt(p)} ≥ {alpha:g})")
    return out


def range_caveats(phi: float, ci: tuple[float, float] | None) -> list[str]:
    """Where phi sits against the two readings that matter: 0 (a repeat is worth nothing), 1 (worth a block)."""
    out = []
    if phi > 1 + 5e-3:  # above 1 at the digits printed (1.00 is not "above 1")
        out.append(f"φ = {phi:.2f} > 1: a recurrence is worth more than a unique block, outside the paper's (0, 1)")
    elif phi < -5e-3:
        out.append(f"φ = {phi:.2f} < 0: looping lowers capacity below the unique blocks run once")
    if ci is not None:
        for value, meaning in ((0.0, "a recurrence adds nothing"), (1.0, "a recurrence is worth a unique block")):
            if ci[0] <= value <= ci[1]:
                out.append(f"the CI includes φ = {value:g} ({meaning})")
    return out


def verdicts(fit: Any) -> dict[str, Verdict]:
    """Every variant's verdict, by name (``fit``: a ``FitResult`` or a fit dict)."""
    res = FitResult.of(fit)
    return {name: phi_verdict(res, name) for name in res.variants}
