"""Is phi identified? The report's headline label comes from ``loopscale.fit.verdict`` (docs/report.md).

The rules live in one place, ``loopscale.fit.verdict.phi_verdict``, so `loopscale fit`, `plan`, `report`
and every ``--json`` say the same thing; this module re-exports them and adds the Δφ sentence.
"""

from __future__ import annotations

from typing import Any

from loopscale.fit.verdict import (
    MAX_CI_WIDTH,
    MAX_UNDETERMINED_SHARE,
    MIN_R2,
    MINIMA_PHI_SPREAD,
    NOT_IDENTIFIED,
    Verdict,
    _f,
    phi_verdict,
    range_caveats,
)

__all__ = [
    "MAX_CI_WIDTH",
    "MAX_UNDETERMINED_SHARE",
    "MINIMA_PHI_SPREAD",
    "MIN_R2",
    "NOT_IDENTIFIED",
    "Verdict",
    "delta_phi_reading",
    "phi_verdict",
    "range_caveats",
]


def delta_phi_reading(d: dict[str, Any]) -> str:
    """One honest sentence for a Delta-phi record of the fit file."""
    ci = d.get("ci")
    dphi = _f(d.get("delta_phi"))
    if dphi is None:
        return "Δφ undetermined"
    if not ci or _f(ci[0]) is None or _f(ci[1]) is None:
        return f"Δφ = {dphi:+.3f} (no CI)"
    lo, hi = float(ci[0]), float(ci[1])
    if lo > 0:
        return f"Δφ = {dphi:+.3f} [{lo:+.3f}, {hi:+.3f}]: {d['variant']} raises φ (a capacity gain per repeat)"
    if hi < 0:
        return f"Δφ = {dphi:+.3f} [{lo:+.3f}, {hi:+.3f}]: {d['variant']} lowers φ (less capacity per repeat)"
    return f"Δφ = {dphi:+.3f} [{lo:+.3f}, {hi:+.3f}]: not distinguishable from 0 at this scale"
