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

import dataclasses
from functools import cached_property
from typing import Annotated, Any

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    field_serializer,
    model_validator,
)

from loopscale.fit.law.formula import COEFFICIENTS, PhiState
from loopscale.fit.settings import FitSettings

FORMAT = "loopscale.fit"
#: the fit file's format version (``FitResult.version``); a reader accepts exactly this one.
VERSION = 1


class _Record(BaseModel):
    """A part of the fit file: named fields typed, every other key kept as it came.

    Read by attribute only: the fit file's dict is made where the file is written (``to_dict``: the keys that came
    in or were set, in the order written) and read (``fitfile.read_fit``), nowhere else."""

    model_config = ConfigDict(
        extra="allow", arbitrary_types_allowed=True, protected_namespaces=(), ignored_types=(cached_property,)
    )

    def to_dict(self, exclude: Any = None) -> dict[str, Any]:
        """The fit file's dict of this part: exactly the keys that came in (or were set), in the order written;
        ``exclude`` as pydantic's (nested sets of keys to leave out)."""
        return self.model_dump(exclude_unset=True, mode="python", exclude=exclude)


def _floats(values: Any) -> np.ndarray:
    """A list of numbers with ``None`` (a NaN in the JSON) as a float array with NaN."""
    return np.array([np.nan if x is None else x for x in (values if values is not None else [])], dtype=float)


def finite_ends(raw: Any) -> tuple[float, float] | None:
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
        return finite_ends(self.ci.get(name))

    def draws_of(self, name: str) -> np.ndarray:
        """The draws of ``name`` as floats (NaN where a draw left it undetermined); empty if none."""
        return _floats(self.draws.get(name))


class HeldOutErrors(_Record):
    """What a law predicts of runs it did not see (``checks.held_out``): the RMSE at the held-out top budget and
    the RMSE pooled over every leave-one-r-out prediction, nats; how laws are compared (``profile.held_out_worse``)."""

    extrapolation_rmse: float | None = None
    leave_one_r_out_rmse: float | None = None


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
    held_out: HeldOutErrors | None = None


class LawVariantFit(_Record):
    """A law variant's fit (``law.variants``: ``record()``), with its own phi, judged by the same held-out errors;
    a variant's own coefficients beyond these (``kappa``: the loop tax's looped-loss factor) are kept as they come."""

    params: dict[str, float | None] = {}
    phi: float | None = None
    kappa: float | None = None
    objective: float | None = None
    converged: bool | None = None
    r2: float | None = None
    rmse: float | None = None
    n_runs: int | None = None
    held_out: HeldOutErrors | None = None


class Identifiability(_Record):
    """The minimum-data rule (``verdict.data_rule``): why phi cannot be read from this table, and what to doubt."""

    n_runs: int | None = None
    n_params: int | None = None
    reasons: list[str] = []
    caveats: list[str] = []


class Optima(_Record):
    """The compute-optimal analysis: empirical optimum per (C, r) cell and the law-based frontier.

    ``empirical`` and ``frontier`` are tables (one row per cell, the report reads them as DataFrames): rows of
    numbers, kept as the fit file's row dicts (``allocation.empirical_optima``, ``allocation.frontier``)."""

    template: dict[str, Any] = {}
    empirical: list[dict[str, Any]] = []
    empirical_exponents: dict[str, float | None] = {}  # null where a fit left one undetermined (NaN)
    frontier: list[dict[str, Any]] = []
    frontier_exponents: dict[str, float | None] = {}


class Extrapolation(_Record):
    """The law fitted below the top budget, predicting the top budget's runs (``checks.extrapolation``)."""

    held_out_budget: float | None = None
    phi: float | None = None
    n: int | None = None
    rmse: float | None = None
    bias: float | None = None
    max_abs: float | None = None
    rmse_per_r: dict[str, float | None] = {}


class LeftOut(_Record):
    """The law fitted without one r, predicting that r's runs (``checks.leave_one_r_out``)."""

    phi: float | None = None
    n: int | None = None
    rmse: float | None = None
    bias: float | None = None
    max_abs: float | None = None


class HalfFit(_Record):
    """The law fitted on one half of the budgets (``checks.half_split``)."""

    budgets: list[float] = []
    phi: float | None = None
    r2: float | None = None


class HalfSplit(_Record):
    lower: HalfFit | None = None
    upper: HalfFit | None = None
    phi_difference: float | None = None


class Checks(_Record):
    """Validation (``inference.checks``): top-budget extrapolation, leave-one-r-out, half split, held-out RMSEs."""

    extrapolation: Extrapolation | None = None
    leave_one_r_out: dict[str, LeftOut] | None = None
    half_split: HalfSplit | None = None
    held_out: HeldOutErrors | None = None


# ---- the calibrated inference (fit/inference/profile.py, paired.py; docs/fit.md, "The inference record") -------
def _nan_for_none(values: Any) -> Any:
    """The fit file writes NaN as null (``fitfile.json_ready``): read it back as NaN."""
    return [np.nan if v is None else v for v in values] if isinstance(values, list | tuple) else values


#: numbers where the fit file may hold null for NaN: an interval's ends, a profile's grid and statistic
Floats = Annotated[list[float], BeforeValidator(_nan_for_none)]
Ends = Floats


class Test(_Record):
    """A test of one value (phi = 0, Delta-phi = 0, ...): its statistic, bootstrap p, and whether it rules it out
    (rejected and a worse held-out error, ``held_out_worse``; phi's tests only)."""

    __test__ = False  # a test of a value, not a pytest class

    value: float | None = None
    stat: float | None = None
    p: float | None = None
    rejected: bool | None = None
    held_out_worse: bool | None = None
    ruled_out: bool | None = None
    held_out: HeldOutErrors | None = None  # the restricted fit's held-out errors, when a rejection needed one


class Interval(_Record):
    """A calibrated interval: the profile likelihood inverted at the wild bootstrap's critical value."""

    estimate: float | None = None
    ci: Ends | None = None
    level: float | None = None
    method: str | None = None
    open: list[bool] | None = None  # an end at the profile grid's edge
    disjoint: bool | None = None  # the set is more than one piece (``ci`` is its hull)
    mc_sd: Ends | None = None  # Monte-Carlo sd of each end (finite bootstrap draws)
    critical_value: float | None = None

    @property
    def ends(self) -> tuple[float, float] | None:
        """``ci`` with two finite ends, else None."""
        return finite_ends(self.ci)


class Secondary(_Record):
    """The interval quoted beside the calibrated one, named by its method (a block-bootstrap percentile one)."""

    method: str | None = None
    n: int | None = None
    ci: Ends | None = None
    mc_sd: Ends | None = None


class NullTables(_Record):
    """The wild bootstrap's tables: how many, over which unit, and (phi's) their statistics for later tests."""

    n: int = 0
    unit: str | None = None
    weights: str | None = None
    lam: Any = None  # the paired models': the variance ratio held at the table's
    stat: Floats = []
    phi_percentile_ci: Ends | None = None
    at_bounds_fraction: float | None = None


class ProfileCurve(_Record):
    """phi's profile statistic on its grid (what ``profile.test_value`` tests any value against)."""

    phi: Floats = []
    stat: Floats = []


class DeltaInference(Interval):
    """Delta-phi from the separate fits, calibrated by the paired wild bootstrap (``profile.delta_record``)."""

    tests: dict[str, Test] = {}
    secondary: Secondary | None = None
    null: NullTables | None = None

    @property
    def zero(self) -> Test | None:
        """The test of Delta-phi = 0."""
        return self.tests.get("delta_phi=0")


class Misfit(_Record):
    """The law's misfit as a paired model splits it (``paired.variance_components``): the part the two recipes
    share in a cell and the part they do not (log loss), and the variance ratio the fit held."""

    shared_sd: float | None = None
    not_shared_sd: float | None = None
    shared_fraction: float | None = None
    lam: float | None = None
    unit: str | None = None


class DeltaProfile(_Record):
    """A paired model's profile statistic of Delta-phi on its grid."""

    delta_phi: Floats = []
    stat: Floats = []


class PairedReading(_Record):
    """One paired model's Delta-phi (``paired.record``; docs/fit.md, "Paired Δφ")."""

    model: str | None = None
    estimate: float | None = None
    ci: Ends | None = None
    level: float | None = None
    method: str | None = None
    assumption: str | None = None
    open: list[bool] | None = None
    disjoint: bool | None = None
    mc_sd: Ends | None = None
    critical_value: float | None = None
    tests: dict[str, Test] = {}
    phi_reference: float | None = None
    phi_variant: float | None = None
    at_bound: bool | None = None
    misfit: Misfit | None = None
    null: NullTables | None = None
    profile: DeltaProfile | None = None

    @property
    def zero(self) -> Test | None:
        return self.tests.get("delta_phi=0")


class Comparison(_Record):
    """Held-out: one model against a simpler-assumption one, per technique cell."""

    mean_excess_sq_error: float | None = None
    se: float | None = None
    worse: bool | None = None


class PairedHeldOut(_Record):
    """Leave-one-technique-cell-out errors of each paired model and the technique's own law (``paired.held_out``)."""

    cells: int | None = None
    rmse: dict[str, float | None] = {}
    comparisons: dict[str, Comparison] | None = None
    note: str | None = None


class PairedDelta(_Record):
    """The paired Delta-phi of a technique against its reference under both models (``paired.paired_delta_phi``)."""

    reference: str | None = None
    n_pairs: int | None = None
    match: list[str] = []
    shared_law: PairedReading | None = None
    separate_laws: PairedReading | None = None
    held_out: PairedHeldOut | None = None

    def reading(self, model: str) -> PairedReading | None:
        """The reading of ``model`` ("shared law" or "separate laws")."""
        return getattr(self, model.replace(" ", "_"), None)


class Inference(_Record):
    """phi's calibrated profile interval and tests (docs/fit.md, "Inference")."""

    phi: Interval | None = None
    tests: dict[str, Test] = {}
    secondary: Secondary | None = None
    null: NullTables | None = None
    profile: ProfileCurve | None = None
    paired_delta_phi: PairedDelta | None = None  # Δφ against ``reference``, paired (inference/paired.py)


class VariantFit(_Record):
    """Everything fitted for one variant (its r > 1 runs plus every r = 1 run)."""

    n_runs: int | None = None
    rs: list[int] = []
    law: LawRecord = LawRecord()
    metrics: Metrics = Metrics()
    identifiability: Identifiability | None = None  # absent in fit files written before the data rule was stored
    derived: dict[str, float | None] = {}  # r^phi per r, the 6ND exponents (``allocation.derived``)
    restricted: dict[str, SubFit] = {}
    law_variants: dict[str, LawVariantFit] = {}
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


class LossGap(_Record):
    """The variant's val loss minus the reference's on the same looped runs (``shared.loss_gap``), nats."""

    mean: float | None = None
    ci: Ends | None = None
    level: float | None = None
    n_runs: int | None = None
    n_cells: int | None = None
    per_budget: dict[str, float | None] = {}
    lower_in_cells: float | None = None  # the fraction of (budget, r, width) cells where the variant is lower


class SharedHeldOut(_Record):
    """Leave-one-variant-cell-out errors of the shared and the separate readings (``shared.held_out``): which one
    the held-out cells support."""

    cells: int | None = None
    shared_rmse: float | None = None
    separate_rmse: float | None = None
    mean_excess_sq_error: float | None = None
    se: float | None = None
    supported: str | None = None  # "shared", "separate", or None (no test)
    note: str | None = None


class SharedReading(_Record):
    """Delta-phi under one law with phi alone moved (``shared.shared_record``): not calibrated; its held-out test."""

    assumption: str | None = None
    delta_phi: float | None = None
    phi_reference: float | None = None
    phi_variant: float | None = None
    objective: float | None = None
    converged: bool | None = None
    at_bound: bool | None = None
    interval: Any = None
    interval_note: str | None = None
    held_out: SharedHeldOut | None = None


class Leading(_Record):
    """The Delta-phi reading quoted, and why (``paired.leading``)."""

    reading: str | None = None
    estimate: float | None = None
    ci: Ends | None = None
    p: float | None = None
    rejected: bool | None = None
    reason: str | None = None


class DeltaPhi(_Record):
    """phi of a variant minus the reference's, with its paired-bootstrap CI."""

    reference: str
    variant: str
    delta_phi: float | None = None
    ci: Any = None  # the leading reading's interval (``leading.ci``), else the calibrated separate one, else the
    # paired percentile one
    fraction_above_zero: float | None = None
    draws: Any = None
    inference: DeltaInference | None = None
    secondary_ci: Any = None
    loss_gap: LossGap | None = None  # inference/shared.py ``loss_gap``: val loss on the same runs
    shared: SharedReading | None = None  # the shared-law reading (inference/shared.py)
    leading: Leading | None = None  # the reading quoted (inference/paired.py ``leading``) and why


def _settings_of(raw: Any) -> FitSettings:
    """The fit file's ``settings`` object as the ``FitSettings`` it was made with: the keys this version knows, as
    stored (not coerced: ``FitResult.to_dict`` writes them back as they came); a missing key is the default."""
    if isinstance(raw, FitSettings):
        return raw
    known = {f.name for f in dataclasses.fields(FitSettings)}
    return FitSettings(**{k: v for k, v in (raw or {}).items() if k in known})


class FitResult(_Record):
    """A fit (of ``fit_runs``, or read from a fit file); see the module docstring."""

    format: str = FORMAT
    version: int = VERSION
    created: Any = None
    loopscale_version: Any = None
    source: dict[str, Any] = {}
    settings: Annotated[InstanceOf[FitSettings], BeforeValidator(_settings_of)] = Field(default_factory=FitSettings)
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
    _settings_doc: dict[str, Any] | None = PrivateAttr(default=None)  # the settings object as read, for its keys

    @model_validator(mode="wrap")
    @classmethod
    def _keep_settings_keys(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Remember which settings keys the document had (and any this version does not know), so a fit file
        written by another version is written back with exactly its keys."""
        raw = data.get("settings") if isinstance(data, dict) else None
        res = handler(data)
        if isinstance(raw, dict) and isinstance(res, FitResult):
            res._settings_doc = dict(raw)
        return res

    @field_serializer("settings", mode="wrap")
    def _settings_out(self, st: FitSettings, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        full = dataclasses.asdict(st)
        doc = self._settings_doc
        return full if doc is None else {k: full.get(k, v) for k, v in doc.items()}

    @classmethod
    def of(cls, fit: FitResult | dict[str, Any]) -> FitResult:
        """The typed result of a fit dict (``fit_runs``'s, or a fit file's); a FitResult passes through."""
        return fit if isinstance(fit, FitResult) else cls.model_validate(fit)

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
        x = self.settings.fixed_phi
        return None if x is None else float(x)

    @property
    def phi_bounds(self) -> tuple[float, float]:
        lo, hi = self.settings.phi_bounds or (-3.0, 3.0)
        return float(lo), float(hi)

    @property
    def ci_level(self) -> float:
        """The CIs' level (the settings', else 0.95)."""
        return float(self.settings.ci_level or 0.95)
