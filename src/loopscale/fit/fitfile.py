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
from pydantic import BaseModel

from loopscale.errors import ConfigError
from loopscale.fit.law.formula import COEFFICIENTS, params_to_theta
from loopscale.fit.law.joint import JointLaw
from loopscale.fit.result import FORMAT, VERSION, FitResult
from loopscale.io import atomic_write_text


def json_ready(obj: Any) -> Any:
    """numpy and NaN-free, JSON-ready copy of obj (a record of ``fit.result``: its fit-file dict)."""
    if isinstance(obj, BaseModel):
        return json_ready(obj.model_dump(exclude_unset=True))
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist())
    if isinstance(obj, np.bool_ | bool):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating | float):
        x = float(obj)
        return x if math.isfinite(x) else None
    return obj


def write_fit(path: str | Path, fit: Any) -> Path:
    """Write ``fit`` (a ``result.FitResult``, as ``fit_runs`` returns, or its dict) atomically; returns the path."""
    if hasattr(fit, "to_dict"):
        fit = {k: v for k, v in fit.to_dict().items() if k not in ("format", "version")}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "version": VERSION, **json_ready(fit)}
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
    except RecursionError:
        raise ConfigError("fit file", "nested too deeply to be a fit file", source=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("fit file", f"cannot be read ({exc.__class__.__name__})", source=str(p)) from None
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
    check_numbers(doc, str(p))
    return doc


#: |phi| beyond this is no fitted value (the box is [-3, 3] unless --phi-bounds widens it).
MAX_ABS_PHI = 100.0


def check_numbers(doc: dict[str, Any], source: str) -> None:
    """The numbers every reader of a fit file computes with, checked once with one-line errors: each variant's
    coefficients (E, A, B > 0 and finite; alpha, beta finite; phi finite within +-100 or null) and the
    runs' ``tokens_per_step`` (a positive integer or null)."""
    if not isinstance(doc["variants"], dict):
        raise ConfigError(
            "variants", "expected an object of variants", value=type(doc["variants"]).__name__, source=source
        )
    for name, rec in doc["variants"].items():
        where = f"variants.{name}"
        if not isinstance(rec, dict):
            raise ConfigError(where, "expected an object (a fitted variant)", value=type(rec).__name__, source=source)
        params = (rec.get("law") or {}).get("params") if isinstance(rec.get("law"), dict) else None
        if not isinstance(params, dict) or not params:
            raise ConfigError(f"{where}.law.params", "missing; expected E, A, B, alpha, beta and phi", source=source)
        for k in ("E", "A", "B", "alpha", "beta", "phi"):
            x = params.get(k)
            if k == "phi" and x is None:
                continue  # phi undetermined (no looped runs)
            ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            if ok and k in ("E", "A", "B"):
                ok = float(x or 0) > 0
            if ok and k == "phi":
                ok = abs(float(x or 0)) <= MAX_ABS_PHI
            if not ok:
                want = {
                    "E": "a number > 0",
                    "A": "a number > 0",
                    "B": "a number > 0",
                    "phi": f"a finite number within ±{MAX_ABS_PHI:g}, or null",
                }.get(k, "a finite number")
                raise ConfigError(f"{where}.law.params.{k}", f"expected {want}", value=x, source=source)
    tps = doc.get("tokens_per_step")
    if tps is not None and not (
        isinstance(tps, int | float)
        and not isinstance(tps, bool)
        and math.isfinite(tps)
        and tps >= 1
        and float(tps).is_integer()
    ):
        raise ConfigError(
            "tokens_per_step", "expected a positive whole number of tokens, or null", value=tps, source=source
        )


def load_fit(path: str | Path) -> Any:
    """Read a fit file as a typed ``result.FitResult`` (``read_fit``'s checks, then the types')."""
    from pydantic import ValidationError

    try:
        return FitResult.of(read_fit(path))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(where or "fit file", f"not a valid fit file ({err['msg']})", source=str(path)) from None


def law_from_fit(fit: Any, variant: str | None = None) -> tuple[JointLaw, np.ndarray | None]:
    """The fitted law of one variant of a fit (a ``FitResult`` or a fit dict), and its bootstrap draws as
    thetas (or None)."""
    res = FitResult.of(fit)
    name = variant or res.reference
    if name not in res.variants:
        raise ConfigError("--variant", f"not in the fit file; it has {sorted(res.variants)}", value=name)
    rec = res.variant(name)
    p = rec.params.as_dict()
    law = JointLaw.from_params(**{**p, "phi": rec.phi})  # type: ignore[arg-type]  # read_fit checked E..beta
    boot = rec.bootstrap
    thetas = None
    if boot.draws and boot.draws_of("E").size:
        arr = {k: boot.draws_of(k) for k in COEFFICIENTS}
        if rec.phi_undetermined:
            arr["phi"] = np.zeros_like(arr["E"])
        thetas = np.array([params_to_theta({k: arr[k][i] for k in COEFFICIENTS}) for i in range(len(arr["E"]))])
        thetas = thetas[np.isfinite(thetas).all(axis=1)]
    return law, thetas
