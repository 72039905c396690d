"""Counts (parameters, tokens, FLOPs) in the unit that fits them: 24.6k, 35.4M, 1.20B, 3.1T.

A fixed unit ("M" for params, "B" for tokens) prints a CPU-scale model of 40k parameters as "0.0M" and
its 2M tokens as "0.0002B" (the planner did, issue 17); three significant digits at any scale.
"""

from __future__ import annotations

from typing import Any

_PREFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def count(n: Any, digits: int = 3) -> str:
    """A parameter or token count with a k / M / B / T suffix and ``digits`` significant digits."""
    if n is None:
        return "-"
    x = float(n)
    if x != x:
        return "-"
    for scale, suffix in _PREFIXES:
        if abs(x) >= scale * 0.9995:
            return f"{_sig(x / scale, digits)}{suffix}"
    return _sig(x, digits)


def _sig(x: float, digits: int) -> str:
    if x == 0:
        return "0"
    whole = len(str(int(abs(x)))) if abs(x) >= 1 else 1
    return f"{x:.{max(digits - whole, 0)}f}"
