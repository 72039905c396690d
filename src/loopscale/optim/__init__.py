"""Optimisation (arXiv 2604.21106 §4, "Optimiser"): MuonH + AdamW groups, transfer rules, lr schedules.

- ``config``     ``OptimConfig``, the paper's defaults and reference point
- ``muonh``      ``MuonH`` (hyperspherical Muon), ``orthogonalize`` (Polar Express or NS5)
- ``transfer``   ``resolve_lrs``: the paper's width / batch / data transfer rules
- ``schedules``  ``linear_decay`` (the paper), ``cosine``, ``wsd`` as ``multiplier(step, total_steps)``
- ``build``      ``build_optimizers`` -> ``Optimizers`` (step, zero_grad, set_lr, state_dict)

Typical use in a trainer::

    opt = build_optimizers(model.param_groups(), cfg, d_model=d, tokens_per_step=B, total_tokens=D, r=r)
    log(opt.base_lrs)
    for step in range(total_steps):
        opt.set_lr_for_step(step, total_steps)   # or opt.set_lr(schedule(step, total_steps))
        loss.backward(); (all-reduce under DDP); opt.step(); opt.zero_grad()

The update rules, defaults and assumptions are written up in docs/optim.md.
"""

from typing import TYPE_CHECKING, Any

from loopscale.config.optim import OptimConfig
from loopscale.optim.schedules import cosine, linear_decay, lr_schedule, wsd
from loopscale.optim.transfer import reference_lrs, resolve_lrs, tokens_ref, transfer_factors

if TYPE_CHECKING:
    from loopscale.optim.build import Optimizers, build_optimizers
    from loopscale.optim.muonh import MuonH, newton_schulz5, orthogonalize

# The optimisers need torch; configs, schedules and transfer rules do not (``loopscale info`` and
# ``sweep plan`` read configs without paying torch's import): the torch names load on first use.
_LAZY = {
    "Optimizers": "build",
    "build_optimizers": "build",
    "MuonH": "muonh",
    "newton_schulz5": "muonh",
    "orthogonalize": "muonh",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"loopscale.optim.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'loopscale.optim' has no attribute {name!r}")


__all__ = [
    "MuonH",
    "OptimConfig",
    "Optimizers",
    "build_optimizers",
    "cosine",
    "linear_decay",
    "lr_schedule",
    "newton_schulz5",
    "orthogonalize",
    "reference_lrs",
    "resolve_lrs",
    "tokens_ref",
    "transfer_factors",
    "wsd",
]
