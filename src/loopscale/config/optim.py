"""``OptimConfig``: every optimiser setting in one typed, strict config (arXiv 2604.21106 §4, "Optimiser").

Defaults are the paper's. Semantic errors raise :class:`loopscale.errors.ConfigError` naming the field;
build it with ``loopscale.config.validate(OptimConfig, data)`` to get one-line errors for type errors too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from loopscale.config import StrictModel
from loopscale.errors import ConfigError

OptimName = Literal["muonh", "adamw"]
ScheduleName = Literal["linear_decay", "cosine", "wsd"]

# The paper's reference point for the transfer rules (docs/optim.md, "Transfer rules").
D_REF = 640  # d_model of s = 10
TOKENS_PER_STEP_REF = 2**18  # the paper's global batch
# loopscale's former fixed D_ref (before parity with the paper's code): the tokens of the s = 10, r = 1 run
# at the smallest budget, C / F = 4.64e17 / 1.0275e9. Kept as a documented value for ``tokens_ref``;
# the default is the paper's per-r rule ``"matched"`` (docs/optim.md, "Transfer rules").
TOKENS_REF = 4.5168e8


class OptimConfig(StrictModel):
    """MuonH + AdamW groups (the paper) or plain AdamW; transfer rules; lr schedule; grad clipping.

    Learning rates are the paper's values *at the reference point* (d = ``d_ref``,
    B = ``tokens_per_step_ref``, D = ``tokens_ref``); with ``transfer = true`` they are moved to the
    run's (d, B, D) by :func:`loopscale.optim.resolve_lrs`.
    """

    name: OptimName = Field("muonh", description="'muonh': MuonH matrices + AdamW rest; 'adamw': all AdamW")
    # ---- learning rates at the reference point ---------------------------------------------------
    matrix_lr: float = Field(0.014, ge=0, description="MuonH relative step size for 2-D block matrices")
    embed_lr: float = Field(0.3, ge=0, description="AdamW, token embedding")
    head_lr: float = Field(0.004, ge=0, description="AdamW, LM head")
    norm_lr: float = Field(0.005, ge=0, description="AdamW, RMSNorm scales")
    scalar_lr: float = Field(0.01, ge=0, description="AdamW, hyper-connection lane scalars")
    adamw_lr: float = Field(0.003, ge=0, description="plain AdamW: matrix group lr (not in paper)")
    adamw_single_lr: bool = Field(False, description="plain AdamW only: every group uses adamw_lr")
    lr_scale: float = Field(1.0, gt=0, description="multiplies every lr (per-r learning-rate checks)")
    # ---- AdamW -----------------------------------------------------------------------------------
    betas: tuple[float, float] = (0.8, 0.95)
    eps: float = Field(1e-10, gt=0)
    weight_decay: float = Field(0.0, ge=0, description="AdamW matrix/embed/head groups; MuonH has none")
    # ---- MuonH -----------------------------------------------------------------------------------
    momentum: float = Field(0.95, ge=0, lt=1, description="MuonH Nesterov momentum")
    nesterov: bool = True
    orthogonalizer: Literal["polar_express", "ns5"] = Field(
        "polar_express",
        description="'polar_express' (the paper's per-step coefficients, 1.02 safety) "
        "or 'ns5' (Muon's fixed quintic Newton-Schulz)",
    )
    ns_steps: int = Field(5, ge=1, description="orthogonalisation iterations (polar_express: at most 5)")
    ns_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="orthogonalisation precision; 'auto' = bfloat16 on CUDA (the paper's), "
        "float32 elsewhere (the paper's code uses bfloat16 on every device)",
    )
    ns_shard: bool = Field(
        True,
        description="under DDP each rank orthogonalises 1/world of the matrices and "
        "all-gathers the rest (the paper's DistMuonAdamW); false: every rank does all of them",
    )
    # ---- transfer rules --------------------------------------------------------------------------
    transfer: bool = Field(True, description="apply the paper's width / batch / data transfer rules")
    d_ref: int = Field(D_REF, gt=0)
    tokens_per_step_ref: int = Field(TOKENS_PER_STEP_REF, gt=0)
    tokens_ref: Literal["matched"] | float = Field(
        "matched",
        description="D_ref of the data rule: 'matched' = the paper's per-r reference "
        "(10 x effective params of an s = 10 model with the run's r), or a fixed token count",
    )
    # ---- schedule --------------------------------------------------------------------------------
    schedule: ScheduleName = "linear_decay"
    warmup_frac: float = Field(0.0, ge=0, lt=1, description="fraction of steps of linear warmup")
    final_lr_frac: float = Field(0.1, ge=0, le=1, description="lr multiplier at the last step")
    decay_frac: float = Field(0.2, gt=0, le=1, description="WSD: fraction of steps in the final decay")
    # ---- clipping --------------------------------------------------------------------------------
    grad_clip: float | None = Field(None, gt=0, description="max global gradient norm; None = off")

    @model_validator(mode="before")
    @classmethod
    def _tokens_ref(cls, data: Any) -> Any:
        """One readable error for both halves of the union (a number or the word 'matched')."""
        v = data.get("tokens_ref") if isinstance(data, dict) else None
        if isinstance(v, str) and v != "matched":
            raise ConfigError("tokens_ref", "expected 'matched' or a positive token count", value=v)
        return data

    @model_validator(mode="after")
    def _check(self) -> OptimConfig:
        for i, b in enumerate(self.betas):
            if not 0.0 <= b < 1.0:
                raise ConfigError(f"betas[{i}]", "must be in [0, 1)", value=b)
        if self.orthogonalizer == "polar_express" and self.ns_steps > 5:
            raise ConfigError("ns_steps", "polar_express has coefficients for at most 5 steps", value=self.ns_steps)
        if not isinstance(self.tokens_ref, str) and not self.tokens_ref > 0:
            raise ConfigError("tokens_ref", "must be 'matched' or a positive token count", value=self.tokens_ref)
        if self.schedule == "wsd" and self.warmup_frac + self.decay_frac > 1.0:
            raise ConfigError(
                "decay_frac",
                f"warmup_frac + decay_frac must be at most 1 (warmup_frac = {self.warmup_frac})",
                value=self.decay_frac,
            )
        return self
