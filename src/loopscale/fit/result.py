"""The fit result, typed: what ``fit_runs`` returns and a fit file holds, read by attribute, not by key.

Why: the fit file's nested dict was read by string keys in eight modules, and "phi undetermined" was a
``None`` tested in each of them. :class:`FitResult` names the parts every reader uses (the law's
coefficients, the bootstrap's CIs and draws, the settings the verdict needs) and keeps every other key
as it is (``extra="allow"``), so ``FitResult.of(doc).to_dict()`` is the same document and old fit files
load unchanged. The verdict is data computed from it: ``fit.inference.verdict.phi_verdict(res, name)`` and
``fit.inference.verdict.verdicts(res)`` (verdict builds on this module, not the reverse).

Serialised by ``fitfile.write_fit`` to the same JSON as before (``format`` and ``version`` first).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from loopscale.fit.law.formula import COEFFICIENTS, PhiState

FORMAT = "loopscale.fit"
#: the fit file's format version (``FitResult.version``); a reader accepts exactly this one.
VERSION = 1


class _Record(BaseModel):
    """A part of the fit file: named fields typed, every other key kept as it came.

    Read by attribute. ``rec["key"]``, ``rec.get("key")`` and ``"key" in rec`` read the fit file's document
    (the keys that were set, as in the JSON), so code written against the fit file's dicts reads a typed part
    unchanged."""

    model_config = ConfigDict(
        extra="allow", arbitrary_types_allowed=True, protected_namespaces=(), ignored_types=(cached_property,)
    )

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self.model_fields_set or key in (self.__pydantic_extra__ or {}))

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __iter__(self) -> Any:  # the keys, as a dict's (pydantic's own yields (name, value) pairs)
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def keys(self) -> list[str]:
        """The keys set, in the order the fit file writes them (declared fields, then the others)."""
        return [k for k in type(self).model_fields if k in self.model_fields_set] + list(self.__pydantic_extra__ or {})

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]


def _floats(values: Any) -> np.ndarray:
    """A list of numbers with ``None`` (a NaN in the JSON) as a float array with NaN."""
    return np.array([np.nan if x is None else x for x in (values if values is not None else [])], dtype=float)


def _ci(raw: Any) -> tuple[float, float] | None:
    """A CI with two finite ends, or None (missing, or NaN / None ends)."""
    if raw is None or len(raw) < 2 or raw[0] is None or raw[1] is None:
        return None
    lo, hi = float(raw[0]), float(raw[1])
    return (lo, hi) if lo == lo and hi == hi else None


class Coefficients(_Record):
    """E, A, B, alpha, beta and phi; phi is None when the data cannot determine it (no looped runs).

    Every field may be missing (a hand-written record with phi alone still gets a verdict, as before)."""

    E: float | None = None
    A: float | None = None
    B: float | None = None
    alpha: float | None = None
    beta: float | None = None
    phi: float | None = None

    @property
    def phi_undetermined(self) -> bool:
        return self.phi is None or self.phi != self.phi

    def as_dict(self) -> dict[str, float | None]:
        return {k: getattr(self, k) for k in COEFFICIENTS}


class LawRecord(_Record):
    """The joint law's optimum and how the optimiser got there (fields in the fit file's order)."""

    params: Coefficients = Coefficients()
    theta: Any = None
    objective: float | None = None
    converged: bool | None = None
    n_iter: int | None = None
    message: str | None = None
    grad_max: float | None = None
    at_bounds: list[str] = []
    minima: list[dict[str, Any]] = []
    n_near_optimal: int | None = None
    phi_identifiable: bool | None = None


class Metrics(_Record):
    r2: float | None = None
    rmse: float | None = None
    rmse_per_r: dict[str, float | None] = {}
    n_runs: int | None = None


class Bootstrap(_Record):
    """The block bootstrap: its size, percentile CIs of every quantity and the draws of the coefficients."""

    n: int = 0
    unit: str | None = None
    n_cells: int | None = None
    ci_level: float | None = None
    converged_fraction: float | None = None
    phi_undetermined_draws: int | None = None
    ci: dict[str, Any] = {}
    at_bounds: dict[str, int] = {}
    data_rule_draws: dict[str, int] = {}
    draws: dict[str, Any] = {}

    def ci_of(self, name: str) -> tuple[float, float] | None:
        """The CI of ``name`` with two finite ends, else None."""
        return _ci(self.ci.get(name))

    def draws_of(self, name: str) -> np.ndarray:
        """The draws of ``name`` as floats (NaN where a draw left it undetermined); empty if none."""
        return _floats(self.draws.get(name))


class SubFit(_Record):
    """A fit of the law with something fixed: a restricted fit (phi = 0, phi = 1) or a per-r Chinchilla fit
    (phi = 0 on one r's runs); ``held_out`` (restricted fits, with checks) is judged as the free law's."""

    params: dict[str, float | None] = {}
    objective: float | None = None
    converged: bool | None = None
    r2: float | None = None
    rmse: float | None = None
    rmse_per_r: dict[str, float | None] = {}
    n_runs: int | None = None
    held_out: dict[str, Any] | None = None


class Optima(_Record):
    """The compute-optimal analysis: empirical optimum per (C, r) cell and the law-based frontier."""

    template: dict[str, Any] = {}
    empirical: list[dict[str, Any]] = []
    empirical_exponents: dict[str, Any] = {}
    frontier: list[dict[str, Any]] = []
    frontier_exponents: dict[str, Any] = {}


class Checks(_Record):
    """Validation (``inference.checks``): top-budget extrapolation, leave-one-r-out, half split, held-out RMSEs."""

    extrapolation: dict[str, Any] | None = None
    leave_one_r_out: dict[str, Any] | None = None
    half_split: dict[str, Any] | None = None
    held_out: dict[str, Any] | None = None


class Inference(_Record):
    """The calibrated inference of one variant (``inference.profile``; docs/fit.md, "The inference record")."""

    phi: dict[str, Any] | None = None
    tests: dict[str, dict[str, Any]] = {}
    secondary: dict[str, Any] | None = None
    null: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    paired_delta_phi: dict[str, Any] | None = None  # Δφ against ``reference``, paired (inference/paired.py)


class VariantFit(_Record):
    """Everything fitted for one variant (its r > 1 runs plus every r = 1 run)."""

    n_runs: int | None = None
    rs: list[int] = []
    law: LawRecord = LawRecord()
    metrics: Metrics = Metrics()
    identifiability: dict[str, Any] | None = None
    derived: dict[str, Any] = {}
    restricted: dict[str, SubFit] = {}
    law_variants: dict[str, dict[str, Any]] = {}
    per_r: dict[str, SubFit] = {}
    bootstrap: Bootstrap = Bootstrap()
    optima: Optima = Optima()
    checks: Checks | None = None
    inference: Inference | None = None  # absent in fit files written before the calibrated inference

    @property
    def params(self) -> Coefficients:
        return self.law.params

    @property
    def phi(self) -> float | None:
        """The fitted phi; None when undetermined (see ``phi_undetermined``)."""
        return None if self.law.params.phi_undetermined else self.law.params.phi

    @property
    def phi_undetermined(self) -> bool:
        return self.law.params.phi_undetermined


class DeltaPhi(_Record):
    """phi of a variant minus the reference's, with its paired-bootstrap CI."""

    reference: str
    variant: str
    delta_phi: float | None = None
    ci: Any = None  # the leading reading's interval (``leading.ci``), else the calibrated separate one, else the
    # paired percentile one
    fraction_above_zero: float | None = None
    draws: Any = None
    inference: dict[str, Any] | None = None
    secondary_ci: Any = None
    loss_gap: dict[str, Any] | None = None  # inference/shared.py ``loss_gap``: val loss on the same runs
    shared: dict[str, Any] | None = None  # the shared-law reading (inference/shared.py)
    leading: dict[str, Any] | None = None  # the reading quoted (inference/paired.py ``leading``) and why


class FitResult(_Record):
    """A fit (of ``fit_runs``, or read from a fit file); see the module docstring."""

    format: str = FORMAT
    version: int = VERSION
    created: Any = None
    loopscale_version: Any = None
    source: dict[str, Any] = {}
    settings: dict[str, Any] = {}  # settings.FitSettings as stored (typed reads: fixed_phi, phi_bounds, ci_level)
    template: dict[str, Any] | None = None
    budgets: Any = None
    tokens_per_step: Any = None
    reference_variant: str | None = None
    resamples: Any = None
    variants: dict[str, VariantFit]
    delta_phi: list[DeltaPhi] = []
    warnings: list[str] = []
    wall_s: float | None = None
    compare: dict[str, Any] | None = None  # ``fit --compare``: inference/compare.py's record

    @classmethod
    def of(cls, fit: FitResult | dict[str, Any]) -> FitResult:
        """The typed result of a fit dict (``fit_runs``'s, or a fit file's); a FitResult passes through."""
        return fit if isinstance(fit, FitResult) else cls.model_validate(fit)

    def to_dict(self) -> dict[str, Any]:
        """The fit-file dict: exactly the keys that came in (or were set), in the order they were written."""
        return self.model_dump(exclude_unset=True, mode="python")

    # -- reading --
    @property
    def reference(self) -> str:
        """The reference variant (the one Delta-phi is measured against, and the report's)."""
        return self.reference_variant or next(iter(self.variants))

    def variant(self, name: str | None = None) -> VariantFit:
        """One variant's record (default: the reference)."""
        return self.variants[name or self.reference]

    def phi_state(self, name: str | None = None) -> PhiState:
        """Estimated, fixed by ``--fix-phi``, or undetermined (no looped runs)."""
        if self.variant(name).phi_undetermined:
            return PhiState.UNDETERMINED
        return PhiState.FIXED if self.fixed_phi is not None else PhiState.ESTIMATED

    @property
    def fixed_phi(self) -> float | None:
        """phi as fixed by the fit's settings (``--fix-phi``), or None when it was estimated."""
        x = self.settings.get("fixed_phi")
        return None if x is None else float(x)

    @property
    def phi_bounds(self) -> tuple[float, float]:
        lo, hi = self.settings.get("phi_bounds") or (-3.0, 3.0)
        return float(lo), float(hi)

    @property
    def ci_level(self) -> float:
        """The CIs' level (the settings', else 0.95)."""
        return float(self.settings.get("ci_level") or 0.95)
