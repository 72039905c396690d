"""Learning-rate schedules as pure functions ``multiplier(step, total_steps) -> float``.

Steps are 0-based: a run of ``total_steps`` steps calls the schedule with ``step = 0 .. total_steps - 1``
and the multiplier applies to every group's base lr. All three share one shape: an optional linear
warmup ``(step + 1) / n_warmup``, a flat part at 1.0, and a decay from 1.0 at ``decay_start`` to
``final_lr_frac`` exactly at the last step; steps past the end stay at ``final_lr_frac``.

- ``linear_decay`` (the paper): no warmup, the decay starts at step 0 -> 1.0 at step 0, 0.1 at the last.
- ``cosine``: warmup, then a half cosine from 1.0 to the floor ``final_lr_frac``.
- ``wsd``: warmup, stable at 1.0, then a linear decay over the last ``decay_frac`` of the steps
  (Hu et al. 2024, MiniCPM, arXiv:2404.06395). ``wsd`` with ``decay_frac = 1`` is ``linear_decay``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loopscale.optim.config import OptimConfig

Schedule = Callable[[int, int], float]


def _shape(step: int, total_steps: int, *, warmup_frac: float, decay_steps: int | None,
           final_lr_frac: float, cosine: bool) -> float:
    if total_steps < 1:
        raise ValueError(f"total_steps must be at least 1 (got {total_steps})")
    if step < 0:
        raise ValueError(f"step must be non-negative (got {step})")
    last = total_steps - 1
    n_warmup = round(warmup_frac * total_steps)
    if step < n_warmup:
        return (step + 1) / n_warmup
    # the decay runs from decay_start (multiplier 1.0) to last (final_lr_frac), after any warmup
    first_flat = max(n_warmup - 1, 0)
    decay_start = first_flat if decay_steps is None else max(first_flat, last - decay_steps)
    span = last - decay_start
    if span <= 0:  # no room to decay (a one-step run, or warmup to the end)
        return 1.0
    progress = min(max((step - decay_start) / span, 0.0), 1.0)
    if cosine:
        return final_lr_frac + (1.0 - final_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - (1.0 - final_lr_frac) * progress


def linear_decay(step: int, total_steps: int, *, final_lr_frac: float = 0.1,
                 warmup_frac: float = 0.0) -> float:
    """The paper's: 1.0 at step 0 (after any warmup), linear to ``final_lr_frac`` at the last step."""
    return _shape(step, total_steps, warmup_frac=warmup_frac, decay_steps=None,
                  final_lr_frac=final_lr_frac, cosine=False)


def cosine(step: int, total_steps: int, *, final_lr_frac: float = 0.1, warmup_frac: float = 0.0) -> float:
    """Linear warmup, then a half cosine from 1.0 to the floor ``final_lr_frac`` at the last step."""
    return _shape(step, total_steps, warmup_frac=warmup_frac, decay_steps=None,
                  final_lr_frac=final_lr_frac, cosine=True)


def wsd(step: int, total_steps: int, *, decay_frac: float = 0.2, final_lr_frac: float = 0.1,
        warmup_frac: float = 0.0) -> float:
    """Warmup-stable-decay: flat at 1.0, then linear to ``final_lr_frac`` over the last ``decay_frac``.

    The decay spans ``round(decay_frac * (total_steps - 1))`` steps ending at the last step.
    """
    return _shape(step, total_steps, warmup_frac=warmup_frac,
                  decay_steps=round(decay_frac * (total_steps - 1)),
                  final_lr_frac=final_lr_frac, cosine=False)


def lr_schedule(cfg: OptimConfig) -> Schedule:
    """The config's schedule as ``multiplier(step, total_steps)``."""
    common = {"final_lr_frac": cfg.final_lr_frac, "warmup_frac": cfg.warmup_frac}
    if cfg.schedule == "linear_decay":
        return partial(linear_decay, **common)
    if cfg.schedule == "cosine":
        return partial(cosine, **common)
    return partial(wsd, decay_frac=cfg.decay_frac, **common)
