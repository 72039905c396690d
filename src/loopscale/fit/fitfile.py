"""The fit file: one JSON document with everything a fit produced (docs/fit.md lists the fields).

Written atomically (temp file in the same folder, fsync, rename), so a crash never leaves a half
file that the report or the planner would read as finished. NaN and infinities are written as
``null`` (strict JSON). ``read_fit`` checks the format tag and version and gives one-line errors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from loopscale.errors import ConfigError
from loopscale.fit.result import FORMAT, VERSION, FitResult
from loopscale.io import atomic_write_text


def _clean(obj: Any) -> Any:
    """numpy and NaN-free, JSON-ready copy of obj."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, np.bool_ | bool):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating | float):
        x = float(obj)
        return x if math.isfinite(x) else None
    return obj


def write_fit(path: str | Path, fit: Any) -> Path:
    """Write ``fit`` (the dict of ``fit_runs``, or a ``result.FitResult``) as JSON atomically; returns the path."""
    if hasattr(fit, "to_dict"):
        fit = {k: v for k, v in fit.to_dict().items() if k not in ("format", "version")}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "version": VERSION, **_clean(fit)}
    text = json.dumps(doc, indent=1, allow_nan=False)
    atomic_write_text(p, text)  # loopscale.io imports no torch at module level
    return p


def read_fit(path: str | Path) -> dict[str, Any]:
    """Read a fit file written by :func:`write_fit`."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("--fit", "fit file not found", value=str(p))
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError("fit file", f"not valid JSON ({exc.msg} at line {exc.lineno})", source=str(p)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(
            "format",
            f"not a loopscale fit file; expected format '{FORMAT}'",
            value=doc.get("format") if isinstance(doc, dict) else type(doc).__name__,
            source=str(p),
        )
    if doc.get("version") != VERSION:
        raise ConfigError(
            "version",
            f"unsupported fit-file version; expected {VERSION}",
            value=doc.get("version"),
            source=str(p),
        )
    if not doc.get("variants"):
        raise ConfigError("variants", "fit file holds no fitted variant", source=str(p))
    return doc


def load_fit(path: str | Path) -> Any:
    """Read a fit file as a typed ``result.FitResult`` (``read_fit``'s checks, then the types')."""
    from pydantic import ValidationError

    try:
        return FitResult.of(read_fit(path))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(where or "fit file", f"not a valid fit file ({err['msg']})", source=str(path)) from None
