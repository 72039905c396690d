"""``build_optimizers``: the model's parameter groups -> one or two torch optimisers behind one object.

The model's ``param_groups()`` gives exactly the keys ``matrix`` (2-D block and injection matrices),
``embed``, ``head``, ``norm`` (RMSNorm scales) and ``scalar`` (hyper-connection lane scalars); any may be
empty. ``name = 'muonh'``: MuonH for ``matrix``, AdamW for the rest. ``name = 'adamw'``: one AdamW for all.
Each torch param group carries ``name`` and ``base_lr``; ``set_lr(m)`` sets ``lr = base_lr * m``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from loopscale.config.optim import OptimConfig
from loopscale.optim.muonh import MuonH
from loopscale.optim.schedules import Schedule, lr_schedule
from loopscale.optim.transfer import GROUPS, resolve_lrs

NO_DECAY = ("norm", "scalar")  # AdamW groups never weight-decayed (gains and lane mixing scalars)


@dataclass
class Optimizers:
    """One or two torch optimisers stepped together; ``base_lrs`` are the resolved peak lrs per group."""

    optimizers: list[torch.optim.Optimizer]
    base_lrs: dict[str, float]
    schedule: Schedule
    grad_clip: float | None = None
    multiplier: float = field(default=1.0)

    def params(self) -> list[torch.nn.Parameter]:
        return [p for opt in self.optimizers for g in opt.param_groups for p in g["params"]]

    def set_lr(self, multiplier: float) -> None:
        """Set every group's lr to ``base_lr * multiplier`` (the schedule's value for this step)."""
        self.multiplier = float(multiplier)
        for opt in self.optimizers:
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * self.multiplier

    def set_lr_for_step(self, step: int, total_steps: int) -> float:
        """Apply the config's schedule at ``step`` of ``total_steps``; returns the multiplier."""
        m = self.schedule(step, total_steps)
        self.set_lr(m)
        return m

    @property
    def lrs(self) -> dict[str, float]:
        """Current lr per group (after the schedule), for logging."""
        return {g["name"]: g["lr"] for opt in self.optimizers for g in opt.param_groups}

    def step(self) -> torch.Tensor | None:
        """Clip (if configured) and step every optimiser; returns the pre-clip global grad norm or None."""
        norm = None
        if self.grad_clip is not None:
            params = [p for p in self.params() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip, foreach=True)
        for opt in self.optimizers:
            opt.step()
        return norm

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizers": [opt.state_dict() for opt in self.optimizers],
            "kinds": [type(opt).__name__ for opt in self.optimizers],
            "multiplier": self.multiplier,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore every optimiser (moments, MuonH's initial norms, and the checkpoint's lrs)."""
        kinds = [type(opt).__name__ for opt in self.optimizers]
        if state.get("kinds") != kinds:
            raise ValueError(f"optimiser state is for {state.get('kinds')}, this run has {kinds}")
        for opt, sd in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(sd)
        self.multiplier = float(state.get("multiplier", 1.0))
        self.base_lrs = {g["name"]: g["base_lr"] for opt in self.optimizers for g in opt.param_groups}


def _adamw(groups: list[dict], cfg: OptimConfig) -> torch.optim.AdamW:
    on_cuda = all(p.is_cuda for g in groups for p in g["params"])
    impl = {"fused": True} if on_cuda else {"foreach": True}
    return torch.optim.AdamW(groups, betas=cfg.betas, eps=cfg.eps, weight_decay=0.0, **impl)


def build_optimizers(
    param_groups: dict[str, list[torch.nn.Parameter]],
    cfg: OptimConfig,
    *,
    d_model: int,
    tokens_per_step: int,
    total_tokens: float,
    r: int,
) -> Optimizers:
    """Build the run's optimisers with lrs resolved for (d_model, tokens_per_step, total_tokens, r).

    Empty groups and parameters with ``requires_grad = False`` are left out.
    """
    unknown = set(param_groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"param_groups: unknown group(s) {sorted(unknown)}; expected keys {list(GROUPS)}")
    seen: set[int] = set()
    for name, ps in param_groups.items():
        for p in ps:
            if id(p) in seen:
                raise ValueError(
                    f"param_groups: a parameter of shape {tuple(p.shape)} appears twice "
                    f"(again in '{name}'); tied weights must be listed once"
                )
            seen.add(id(p))
    lrs = resolve_lrs(cfg, d_model=d_model, tokens_per_step=tokens_per_step, total_tokens=total_tokens, r=r)
    groups = {k: [p for p in param_groups.get(k, []) if p.requires_grad] for k in GROUPS}

    def group(name: str) -> dict:
        wd = 0.0 if name in NO_DECAY else cfg.weight_decay
        return {"params": groups[name], "name": name, "lr": lrs[name], "base_lr": lrs[name], "weight_decay": wd}

    optimizers: list[torch.optim.Optimizer] = []
    adamw_names = list(GROUPS)
    if cfg.name == "muonh":
        adamw_names.remove("matrix")
        if groups["matrix"]:
            muon = MuonH(
                [{"params": groups["matrix"], "name": "matrix", "base_lr": lrs["matrix"]}],
                lr=lrs["matrix"],
                momentum=cfg.momentum,
                nesterov=cfg.nesterov,
                ns_steps=cfg.ns_steps,
                ns_dtype=cfg.ns_dtype,
                orthogonalizer=cfg.orthogonalizer,
                shard=cfg.ns_shard,
            )
            optimizers.append(muon)
    adamw_groups = [group(n) for n in adamw_names if groups[n]]
    if adamw_groups:
        optimizers.append(_adamw(adamw_groups, cfg))
    if not optimizers:
        raise ValueError("param_groups: no trainable parameters")
    base = {g["name"]: g["base_lr"] for opt in optimizers for g in opt.param_groups}
    return Optimizers(optimizers, base, lr_schedule(cfg), cfg.grad_clip)
