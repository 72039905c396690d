"""``FitSettings``: every option of a fit, with each default written once.

The defaults are the paper's (``fit.paper``: 500 starts, Huber delta 1e-3, 200 resamples); the CLI's
flags, the sweep spec's ``[fit]`` table and ``fit_sweep`` read them from here. Light on purpose (no numpy,
no pandas at import), so ``loopscale fit --help`` can show the defaults without loading the fitter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from loopscale import grids
from loopscale.config import StrictModel
from loopscale.errors import ConfigError
from loopscale.fit.paper import PAPER_BOOTSTRAP, PAPER_HUBER_DELTA, PAPER_LOSS, PAPER_RESTARTS

if TYPE_CHECKING:
    from loopscale.fit.law.joint import JointLaw

#: FitSettings field -> JointLaw parameter: the law's settings, under the names the CLI and config use.
LAW_FIELDS: dict[str, str] = {
    "loss": "loss",
    "delta": "delta",
    "phi_bounds": "phi_bounds",
    "fixed_phi": "phi",
    "restarts": "restarts",
    "polish": "polish",
    "seed": "seed",
}
#: the command-line flag of each setting (for one-line errors).
FLAGS = {"loss": "--loss", "delta": "--delta", "phi_bounds": "--phi-bounds", "restarts": "--restarts"}


class FitTable(StrictModel):
    """A sweep spec's ``[fit]`` table: how ``fit_sweep`` (``loopscale fit``, ``loopscale demo``) fits the sweep
    unless told otherwise; the CLI's --loss / --delta override it."""

    loss: Literal["huber", "mse"] = Field(PAPER_LOSS, description="objective (the paper's: huber)")
    delta: float = Field(PAPER_HUBER_DELTA, gt=0, description="Huber delta in log space (the paper's: 1e-3)")


def _law_variant_names() -> tuple[str, ...]:
    from loopscale.fit.law.variants import REGISTRY

    return tuple(REGISTRY)


@dataclass
class FitSettings:
    """Every option of a fit; stored verbatim in the fit file.

    The law's own settings (``LAW_FIELDS``) are validated by ``law.joint.validate_settings`` and become a
    ``JointLaw`` through :meth:`law`, so the two never disagree; ``fixed_phi`` is JointLaw's ``phi``.
    """

    loss: str = PAPER_LOSS
    delta: float = PAPER_HUBER_DELTA
    phi_bounds: tuple[float, float] = (-3.0, 3.0)
    fixed_phi: float | None = None
    restarts: int = PAPER_RESTARTS
    polish: int = 8
    bootstrap: int = PAPER_BOOTSTRAP
    bootstrap_random_starts: int = 8
    lr_draws: int = 2000  # wild-bootstrap tables calibrating the profile-likelihood interval and tests (0: off)
    ci_level: float = 0.95
    seed: int = 0
    restricted: tuple[float, ...] = (0.0, 1.0)
    per_r: bool = True
    checks: bool = True
    checks_restarts: int = 100
    shared: bool = True  # Δφ also under the shared-law reading (inference/shared.py), held-out-tested when checks
    variants: list[str] | None = None
    reference_variant: str | None = None
    reference_r: int | None = None  # a looped-only fit's declared reference r (CLI: --r without 1)
    law_variants: tuple[str, ...] = field(default_factory=_law_variant_names)  # beyond phi = 0 / 1
    template: dict[str, Any] = field(default_factory=lambda: dict(grids.PAPER_MODEL))

    def validate(self) -> None:
        from loopscale.fit.law.joint import validate_settings

        validate_settings(
            loss=self.loss, delta=self.delta, phi_bounds=self.phi_bounds, restarts=self.restarts, names=FLAGS
        )
        if self.bootstrap < 0:
            raise ConfigError("--bootstrap", "expected 0 (off) or a number of resamples", value=self.bootstrap)
        if self.lr_draws < 0 or 0 < self.lr_draws < 100:
            raise ConfigError("--lr-draws", "expected 0 (off) or at least 100 bootstrap tables", value=self.lr_draws)
        if not 0 < self.ci_level < 1:
            raise ConfigError("--ci", "expected a level between 0 and 1", value=self.ci_level)

    def law(self, phi: float | None = None, restarts: int | None = None) -> JointLaw:
        """The (unfitted) joint law of these settings; ``phi`` / ``restarts`` override the settings'."""
        from loopscale.fit.law.joint import JointLaw

        law = JointLaw().set_params(**{p: getattr(self, f) for f, p in LAW_FIELDS.items()})
        if phi is not None:
            law.set_params(phi=phi)
        if restarts:
            law.set_params(restarts=restarts)
        return law
