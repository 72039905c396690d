"""Learning-rate schedules as pure functions ``multiplier(step, total_steps) -> float``.

Steps are 0-based: a run of ``N = total_steps`` steps calls the schedule with ``step = 0 .. N - 1`` and
the multiplier applies to every group's base lr. All three share the paper code's shape
(``get_lr_multiplier`` in its ``scripts/base_train.py``): an optional linear warmup ``(step + 1) / n_warmup``,
a flat part at 1.0, and a decay over the last ``n_decay`` steps that would reach ``final_lr_frac`` at
step ``N`` (one past the last step), i.e. ``p + (1 - p) final_lr_frac`` with ``p = (N - step) / n_decay``.
The last trained step therefore uses ``final_lr_frac + (1 - final_lr_frac) / n_decay``, as in the paper;
steps past the end stay at ``final_lr_frac``.

- ``linear_decay`` (the paper): no warmup, the decay spans all N steps -> 1.0 at step 0,
  ``0.1 + 0.9 / N`` at the last (after a warmup the decay spans the remaining steps).
- ``cosine``: warmup, then a half cosine from 1.0 towards the floor ``final_lr_frac``.
- ``wsd``: warmup, stable at 1.0, then a linear decay over the last ``round(decay_frac N)`` steps
  (the paper code's ``--warmdown-ratio``; Hu et al. 2024, MiniCPM, arXiv:2404.06395).
  ``wsd`` with ``decay_frac = 1`` is ``linear_decay``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loopscale.config.optim import OptimConfig

Schedule = Callable[[int, int], float]


def _shape(
    step: int, total_steps: int, *, warmup_frac: float, decay_steps: int | None, final_lr_frac: float, cosine: bool
) -> float:
    if total_steps < 1:
        raise ValueError(f"total_steps must be at least 1 (got {total_steps})")
    if step < 0:
        raise ValueError(f"step must be non-negative (got {step})")
    n = total_steps
    n_warmup = round(warmup_frac * n)
    if step < n_warmup:
        return (step + 1) / n_warmup
    n_decay = n - n_warmup if decay_steps is None else min(decay_steps, n - n_warmup)
    if n_decay <= 0 or step <= n - n_decay:
        return 1.0
    p = min(max((n - step) / n_decay, 0.0), 1.0)  # 1 where the decay starts, 0 at step N
    if cosine:
        return final_lr_frac + (1.0 - final_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * (1.0 - p)))
    return p + (1.0 - p) * final_lr_frac


def linear_decay(step: int, total_steps: int, *, final_lr_frac: float = 0.1, warmup_frac: float = 0.0) -> float:
    """The paper's: 1.0 at step 0 (after any warmup), linear towards ``final_lr_frac`` at step N."""
    return _shape(
        step, total_steps, warmup_frac=warmup_frac, decay_steps=None, final_lr_frac=final_lr_frac, cosine=False
    )


def cosine(step: int, total_steps: int, *, final_lr_frac: float = 0.1, warmup_frac: float = 0.0) -> float:
    """Linear warmup, then a half cosine from 1.0 towards the floor ``final_lr_frac`` at step N."""
    return _shape(
        step, total_steps, warmup_frac=warmup_frac, decay_steps=None, final_lr_frac=final_lr_frac, cosine=True
    )


def wsd(
    step: int, total_steps: int, *, decay_frac: float = 0.2, final_lr_frac: float = 0.1, warmup_frac: float = 0.0
) -> float:
    """Warmup-stable-decay: flat at 1.0, then linear towards ``final_lr_frac`` over the last ``decay_frac``.

    The decay spans ``round(decay_frac * total_steps)`` steps (the paper code's warmdown).
    """
    return _shape(
        step,
        total_steps,
        warmup_frac=warmup_frac,
        decay_steps=round(decay_frac * total_steps),
        final_lr_frac=final_lr_frac,
        cosine=False,
    )


def lr_schedule(cfg: OptimConfig) -> Schedule:
    """The config's schedule as ``multiplier(step, total_steps)``."""
    final, warmup = cfg.final_lr_frac, cfg.warmup_frac
    if cfg.schedule == "linear_decay":
        return partial(linear_decay, final_lr_frac=final, warmup_frac=warmup)
    if cfg.schedule == "cosine":
        return partial(cosine, final_lr_frac=final, warmup_frac=warmup)
    return partial(wsd, decay_frac=cfg.decay_frac, final_lr_frac=final, warmup_frac=warmup)
