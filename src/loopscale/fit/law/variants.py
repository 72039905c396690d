"""The registry of law variants `loopscale fit` fits beyond phi = 0 / 1 (``--law-variants``).

Why a registry: a new variant of the law is one new module (its class) plus one line here; the fit
(``pipeline``), the CLI's switch and the fit file's ``law_variants`` record read it from this table.
A variant class takes the base ``JointLaw`` (its settings) and provides ``name``, ``applies(df)``,
``clone(**overrides)``, ``fit(runs, extra_starts=...)``, ``predict(...)`` and ``record()`` (the dict
stored under ``variants.<v>.law_variants.<name>``); ``docs/extending.md`` walks through one.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import pandas as pd

from loopscale.fit.law import structure
from loopscale.fit.law.joint import JointLaw


class LawVariant(Protocol):
    """What ``fit_runs`` and ``checks.run_checks`` need from a variant."""

    name: str
    phi_: float | None

    def applies(self, df: pd.DataFrame) -> bool: ...

    def clone(self, **overrides: Any) -> LawVariant: ...

    def fit(self, table: Any, *, extra_starts: np.ndarray | None = None) -> LawVariant: ...

    def predict(self, N_once: Any, N_rec: Any = None, D: Any = None, r: Any = None) -> np.ndarray: ...

    def record(self) -> dict[str, Any]: ...


#: name -> class (built from the base law: ``REGISTRY[name](base)``).
REGISTRY: dict[str, type] = {
    structure.NAME: structure.LoopTaxLaw,
}


def make(name: str, base: JointLaw) -> LawVariant:
    """The variant ``name`` on the base law's settings; a one-line error for an unknown name."""
    from loopscale.errors import ConfigError

    if name not in REGISTRY:
        raise ConfigError("--law-variant", f"unknown law variant; expected one of {', '.join(REGISTRY)}", value=name)
    law: LawVariant = REGISTRY[name](base)
    return law
