"""Numbers as loopscale prints them, one formatter per kind, shared by the CLI and the report.

`loopscale fit` and the report used to format the same φ with different code (0.4612 [0.4101, 0.5302]
in one, φ = 0.461 [0.410, 0.530] in the other, "-" or "–" for a missing CI), and four count formatters
disagreed on "850K" vs "850k" (issue 18). Every caller goes through this module, so the terminal,
summary.md and index.html print a quantity the same way. Pure Python, no numpy: any light command can
import it.

Counts (parameters, tokens) get the unit that fits them: 24.6k, 35.4M, 1.20B, 3.1T. A fixed unit
("M" for params, "B" for tokens) printed a CPU-scale model of 40k parameters as "0.0M" and its 2M
tokens as "0.0002B" (issue 17); three significant digits at any scale.
"""

from __future__ import annotations

import math
from typing import Any

#: what a missing or non-finite number prints as, everywhere.
MISSING = "–"
#: decimals of φ, its CI and Δφ, in every table and sentence that quotes them (not prose; see ``phi``).
PHI_DIGITS = 3
#: what an unestimated φ prints as (no r > 1 runs in the fit).
UNDETERMINED = "undetermined"

_PREFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def _finite(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def count(n: Any, digits: int = 3, *, trim: bool = False) -> str:
    """A parameter or token count with a k / M / B / T suffix and ``digits`` significant digits.

    ``trim`` drops trailing zeros ("1M", not "1.00M"): for axis ticks, where the digits say nothing.
    """
    x = _finite(n)
    if x is None:
        return MISSING
    for scale, suffix in _PREFIXES:
        if abs(x) >= scale * 0.9995:
            return f"{_sig(x / scale, digits, trim)}{suffix}"
    return _sig(x, digits, trim)


def _sig(x: float, digits: int, trim: bool = False) -> str:
    if x == 0:
        return "0"
    whole = len(str(int(abs(x)))) if abs(x) >= 1 else 1
    out = f"{x:.{max(digits - whole, 0)}f}"
    return out.rstrip("0").rstrip(".") if trim and "." in out else out


def flops(c: Any) -> str:
    """A FLOP budget, compact for titles and tables: 4.64e17 (no '+', no leading zero in the exponent)."""
    x = _finite(c)
    if x is None:
        return MISSING
    s = f"{x:.3g}"
    if "e" not in s:
        return s
    mant, exp = s.split("e")
    return f"{mant}e{int(exp)}"


def num(x: Any, digits: int = 4) -> str:
    """A fitted coefficient or metric: fixed point at O(1), scientific beyond 1e4 or below 1e-3."""
    v = _finite(x)
    if v is None:
        return MISSING
    if abs(v) >= 1e4 or (abs(v) < 1e-3 and v != 0):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}f}" if abs(v) < 10 else f"{v:.{max(digits - 2, 1)}f}"


def signed(x: Any, digits: int = 4) -> str:
    """A difference (Δφ, a loss gap): always with its sign."""
    v = _finite(x)
    return MISSING if v is None else f"{v:+.{digits}f}"


def interval(ci: Any, digits: int = 4, *, is_signed: bool = False) -> str:
    """A confidence interval "[lo, hi]"; ``MISSING`` when either end is unknown."""
    if not ci or _finite(ci[0]) is None or _finite(ci[1]) is None:
        return MISSING
    if is_signed:
        return f"[{signed(ci[0], digits)}, {signed(ci[1], digits)}]"
    return f"[{num(ci[0], digits)}, {num(ci[1], digits)}]"


def phi(x: Any, digits: int = PHI_DIGITS) -> str:
    """φ alone: fixed point (its box is [-3, 3], so never scientific), or "undetermined".

    Prose (the plain headline) passes ``digits=2``; tables and verdicts keep ``PHI_DIGITS``.
    """
    v = _finite(x)
    return UNDETERMINED if v is None else f"{v:.{digits}f}"


def phi_interval(ci: Any, digits: int = PHI_DIGITS) -> str:
    """φ's CI in φ's own digits: "[0.410, 0.530]"."""
    if not ci or _finite(ci[0]) is None or _finite(ci[1]) is None:
        return MISSING
    return f"[{phi(ci[0], digits)}, {phi(ci[1], digits)}]"


def phi_ci(x: Any, ci: Any = None, digits: int = PHI_DIGITS) -> str:
    """φ with its CI, as `loopscale fit`, the verdict and the report all print it: "0.461 [0.410, 0.530]"."""
    if _finite(x) is None:
        return UNDETERMINED
    bracket = phi_interval(ci, digits)
    return phi(x, digits) if bracket == MISSING else f"{phi(x, digits)} {bracket}"


# ---- the names intervals are shown with (docs/report.md, "Which interval is quoted") ----------------
#: φ's and Δφ's quoted interval: the calibrated profile-likelihood interval of the variant's ``inference`` record.
PROFILE = "profile likelihood"
#: the same, in full, where there is room for it (the verdict box, the fit table's note).
PROFILE_LONG = "profile likelihood, calibrated by a wild cluster bootstrap over (budget, r) cells"
#: the coefficients' (α, β, E, A, B) and every derived quantity's interval: the block bootstrap's percentiles.
BLOCK_BOOTSTRAP = "block bootstrap"
#: φ's and Δφ's second interval, beside the quoted one (``bootstrap.ci.phi``, ``delta_phi[].secondary_ci``).
SECONDARY = "block bootstrap percentile, secondary"


def interval_method(method: str | None) -> str:
    """The short name of the method ``Verdict.method`` names: the profile likelihood, or (a fit file written
    before the calibrated inference) the block bootstrap's percentile interval, then the only one there is."""
    return PROFILE if method in (None, "profile likelihood") else "block bootstrap percentile"
