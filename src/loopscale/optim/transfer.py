"""The paper's learning-rate transfer rules: resolve the reference lrs for a run's (d, B, D, r).

arXiv 2604.21106 §4, as the paper's code applies them (``scripts/base_train.py`` and
``GPT.setup_optimizer`` in ``nanochat/gpt.py``), with d = d_model, B = tokens per optimiser step,
D = training tokens and r the run's recurrences::

    embed, head        lr = lr_ref * (d / d_ref)^-0.5 * (B / B_ref)^0.558
    norm, scalar       lr = lr_ref * (d / d_ref)^-0.5                      (no batch rule in the paper)
    matrix (MuonH)     lr = lr_ref *                   (B / B_ref)^0.558 * (D / D_ref(r))^-0.32

D_ref(r) is 10 x the effective parameters of an architecture-matched s = 10 reference counted with the
run's r (``tokens_ref = "matched"``, :func:`loopscale.accounting.reference_tokens`), or a fixed number.
Every lr is multiplied by ``lr_scale``. Under plain AdamW (``name = 'adamw'``) the matrix group is an
AdamW group too, so it takes the width rule as well as the batch and data rules (an assumption: the
paper only trains MuonH). With ``transfer = false`` only ``lr_scale`` applies.
"""

from __future__ import annotations

from loopscale.config.optim import OptimConfig
from loopscale.errors import ConfigError

GROUPS: tuple[str, ...] = ("matrix", "embed", "head", "norm", "scalar")
BATCH_SCALED: tuple[str, ...] = ("matrix", "embed", "head")  # the paper batch-scales only these
WIDTH_EXPONENT = -0.5  # AdamW lrs vs d_model
BATCH_EXPONENT = 0.558  # embed, head and matrix lrs vs tokens per step
DATA_EXPONENT = -0.32  # matrix lr vs training tokens


def tokens_ref(cfg: OptimConfig, r: int) -> float:
    """D_ref of the data rule for a run with ``r`` recurrences."""
    if cfg.tokens_ref == "matched":
        from loopscale.accounting import reference_tokens

        return float(reference_tokens(r, cfg.d_ref))
    return float(cfg.tokens_ref)


def transfer_factors(
    cfg: OptimConfig, *, d_model: int, tokens_per_step: int, total_tokens: float, r: int
) -> dict[str, float]:
    """The three multipliers ``width``, ``batch``, ``data`` (all 1.0 when ``cfg.transfer`` is off)."""
    for field, v in (
        ("d_model", d_model),
        ("tokens_per_step", tokens_per_step),
        ("total_tokens", total_tokens),
        ("r", r),
    ):
        if not v > 0:
            raise ConfigError(field, "must be positive", value=v)
    if not cfg.transfer:
        return {"width": 1.0, "batch": 1.0, "data": 1.0}
    return {
        "width": (d_model / cfg.d_ref) ** WIDTH_EXPONENT,
        "batch": (tokens_per_step / cfg.tokens_per_step_ref) ** BATCH_EXPONENT,
        "data": (total_tokens / tokens_ref(cfg, r)) ** DATA_EXPONENT,
    }


def reference_lrs(cfg: OptimConfig) -> dict[str, float]:
    """The config's lrs at the reference point, per group, before transfer and ``lr_scale``."""
    if cfg.name == "adamw" and cfg.adamw_single_lr:
        return dict.fromkeys(GROUPS, cfg.adamw_lr)
    return {
        "matrix": cfg.matrix_lr if cfg.name == "muonh" else cfg.adamw_lr,
        "embed": cfg.embed_lr,
        "head": cfg.head_lr,
        "norm": cfg.norm_lr,
        "scalar": cfg.scalar_lr,
    }


def resolve_lrs(
    cfg: OptimConfig, *, d_model: int, tokens_per_step: int, total_tokens: float, r: int
) -> dict[str, float]:
    """Peak (schedule multiplier 1) learning rate per group for this run, ready to log.

    At the reference point (d = d_ref, B = tokens_per_step_ref, D = D_ref(r), lr_scale = 1) these are
    the paper's values: matrix 0.014, embed 0.3, head 0.004, norm 0.005, scalar 0.01.
    """
    f = transfer_factors(cfg, d_model=d_model, tokens_per_step=tokens_per_step, total_tokens=total_tokens, r=r)
    out = {}
    for group, lr in reference_lrs(cfg).items():
        mult = f["batch"] if group in BATCH_SCALED else 1.0
        if group != "matrix" or cfg.name == "adamw":
            mult *= f["width"]
        if group == "matrix":
            mult *= f["data"]
        out[group] = lr * mult * cfg.lr_scale
    return out
