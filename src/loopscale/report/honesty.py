"""Is phi resolved? The report's headline label comes from ``loopscale.fit.inference.verdict`` (docs/report.md).

The rules live in one place, ``loopscale.fit.inference.verdict.phi_verdict``, so `loopscale fit`, `plan`, `report`
and every ``--json`` say the same thing; this module re-exports them and adds the Δφ sentence.
"""

from __future__ import annotations

from typing import Any

from loopscale.fit.inference.verdict import (
    MAX_CI_WIDTH,
    MAX_UNDETERMINED_SHARE,
    MIN_R2,
    MINIMA_PHI_SPREAD,
    NOT_IDENTIFIED,
    Verdict,
    finite_or_none,
    phi_verdict,
    range_caveats,
)
from loopscale.fit.result import DeltaPhi, Leading, Test

__all__ = [
    "MAX_CI_WIDTH",
    "MAX_UNDETERMINED_SHARE",
    "MINIMA_PHI_SPREAD",
    "MIN_R2",
    "NOT_IDENTIFIED",
    "Verdict",
    "delta_phi_quote",
    "delta_phi_reading",
    "loss_gap_reading",
    "loss_gap_verdict",
    "phi_verdict",
    "range_caveats",
]


def delta_phi_reading(d: DeltaPhi) -> str:
    """One honest sentence for a Delta-phi record of the fit file: the leading reading's interval and test
    (``leading``: paired or separate fits, fit/inference/paired.py) with its name, else the calibrated separate
    one (fit/inference/profile.py), else the paired percentile interval."""
    lead = d.leading
    ci = (lead.ci if lead is not None else None) or d.ci
    dphi = finite_or_none(lead.estimate if lead is not None else d.delta_phi)
    if dphi is None:
        return "Δφ undetermined"
    if not ci or finite_or_none(ci[0]) is None or finite_or_none(ci[1]) is None:
        return f"Δφ = {dphi:+.3f} (no CI)"
    lo, hi = float(ci[0]), float(ci[1])
    test: Leading | Test | None = lead if lead is not None else d.inference.zero if d.inference is not None else None
    label = lead.reading if lead is not None else ""
    head = f"Δφ = {dphi:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (f" ({label})" if label else "")
    if test is not None:
        p = finite_or_none(test.p)
        if test.rejected and lo > 0:
            return f"{head}, p = {p:.3g} for Δφ = 0: {d.variant} raises φ (a capacity gain per repeat)"
        if test.rejected and hi < 0:
            return f"{head}, p = {p:.3g} for Δφ = 0: {d.variant} lowers φ (less capacity per repeat)"
        return f"{head}, p = {p:.3g} for Δφ = 0: the data cannot tell {d.variant}'s φ from the reference's"
    if lo > 0:
        return f"{head} (percentile): {d.variant} raises φ (a capacity gain per repeat)"
    if hi < 0:
        return f"{head} (percentile): {d.variant} lowers φ (less capacity per repeat)"
    return f"{head} (percentile): not distinguishable from 0 at this scale"


def _side(ci: Any) -> int:
    """+1 / -1 when an interval lies above / below 0, else 0."""
    lo, hi = (finite_or_none(ci[0]), finite_or_none(ci[1])) if ci else (None, None)
    if lo is None or hi is None:
        return 0
    return 1 if lo > 0 else -1 if hi < 0 else 0


def loss_gap_verdict(d: DeltaPhi) -> str | None:
    """The paper's two readings of a recipe (arXiv 2604.21106 §5), from its val loss on the reference's own
    looped runs and its Δφ: lower loss while φ falls is a token-budget gain (truncated BPTT's cheaper
    backward buys tokens), lower loss while φ rises a capacity gain (hyperconnections)."""
    gap = d.loss_gap
    if gap is None or finite_or_none(gap.mean) is None:
        return None
    loss, phi = _side(gap.ci), _side(d.ci)
    if loss < 0 and phi < 0:
        return "lower loss while φ falls: a token-budget gain, not capacity per repeat (the paper's TBPTT reading)"
    if loss < 0 and phi > 0:
        return "lower loss and φ rises: a capacity gain per repeat (the paper's hyperconnection reading)"
    if loss < 0:
        return "lower loss at equal compute; whether by tokens or by capacity, Δφ cannot tell"
    if loss > 0 and phi > 0:
        return "higher loss although φ rises: a repeat is worth more, the runs lose elsewhere"
    if loss > 0:
        return "higher loss at equal compute"
    return "no loss difference resolved"


def loss_gap_reading(d: DeltaPhi) -> str | None:
    """``loss_gap_verdict`` with its numbers, for prose."""
    verdict, gap = loss_gap_verdict(d), d.loss_gap
    if verdict is None or gap is None or gap.mean is None:
        return None
    lo, hi = gap.ci or (float("nan"), float("nan"))
    return f"val loss {gap.mean:+.3f} nats [{lo:+.3f}, {hi:+.3f}] on the same {gap.n_runs} looped runs: {verdict}"


def delta_phi_quote(d: DeltaPhi) -> str:
    """The line a reader can quote for one technique: who against whom, Δφ with its leading interval and test
    (``delta_phi_reading``), the val loss on the same runs and the paper's reading of the pair
    (``loss_gap_reading``). The page's Δφ section opens with it, summary.md and the demo's terminal print it."""
    gap = loss_gap_reading(d)
    return f"{d.variant} − {d.reference}: {delta_phi_reading(d)}" + (f"; {gap}" if gap else "")
