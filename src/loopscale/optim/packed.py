"""The optimisers of a pack (``loopscale.model.packed``): MuonH and AdamW over ``[k, ...]`` parameter stacks.

Each member keeps what its solo run has: its learning rate per group (its transfer rules and schedule, at its own
step), its AdamW step count and moments, its MuonH momentum and initial norms, its gradient clipping. The update
is the solo optimiser's sequence of operations (``optim/muonh.py``; torch's foreach AdamW, which on a CPU runs
the plain op per tensor) on the stacks, with the per-member numbers as ``[k, 1, ...]`` tensors where they differ
between members and as the solo run's Python scalars where they do not. Elementwise operations compute each
element as the solo run does; the orthogonalisation's batched products are MuonH's own (one call over every
member's matrices of a shape). ``tests/test_pack.py`` checks a pack's updates against each member's solo
optimiser.

``member_state_dict(i)`` writes member ``i``'s state into its own ``Optimizers`` and returns its
``state_dict()``: a packed run's checkpoint is a solo run's checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from loopscale.optim.build import Optimizers
from loopscale.optim.muonh import MuonH, ns_compute_dtype, orthogonalize, wide


@dataclass
class _Group:
    """One torch param group of the members' optimisers: its kind, settings and the parameters' names."""

    kind: str  # "muonh" or "adamw"
    name: str
    names: list[str]
    settings: dict[str, Any]
    base_lrs: list[float]  # per member
    lrs: list[float] = field(default_factory=list)  # per member, after the schedule


def _scalars(values: Sequence[float], like: torch.Tensor, dtype: torch.dtype | None = None) -> float | torch.Tensor:
    """One Python number when every member has the same (the solo run's scalar argument), else ``[k, 1, ...]``
    (a float32 tensor of the doubles, as torch casts a scalar argument to the tensor's float type)."""
    if all(v == values[0] for v in values):
        return values[0]
    t = torch.tensor(list(values), dtype=torch.float32, device=like.device)
    return t.to(dtype or like.dtype).view(len(values), *([1] * (like.dim() - 1)))


class PackedOptimizers:
    """The members' ``Optimizers`` as one update over the pack's stacks (``stacked``: name -> ``[k, ...]``)."""

    def __init__(
        self,
        stacked: dict[str, torch.nn.Parameter],
        members: Sequence[Optimizers],
        member_params: Sequence[dict[int, str]],
    ) -> None:
        self.members = list(members)
        self.stacked = stacked
        self.k = len(self.members)
        first = self.members[0]
        self.groups: list[_Group] = []
        for j, opt in enumerate(first.optimizers):
            kind = "muonh" if isinstance(opt, MuonH) else "adamw"
            for g_i, group in enumerate(opt.param_groups):
                names = [member_params[0][id(p)] for p in group["params"]]
                settings = {k: v for k, v in group.items() if k not in ("params", "lr", "base_lr", "name")}
                base = [float(m.optimizers[j].param_groups[g_i]["base_lr"]) for m in self.members]
                self.groups.append(_Group(kind, str(group["name"]), names, settings, base))
        self.grad_clip = first.grad_clip
        self.multipliers = [m.multiplier for m in self.members]
        order = [n for grp in self.groups for n in grp.names]
        self._names = [{id(p): n for n, p in zip(order, _params_of(m), strict=True)} for m in self.members]
        # state, stacked: MuonH momentum and initial norms; AdamW moments and step counts (per member, per name)
        self.momentum: dict[str, torch.Tensor] = {}
        self.init_norm: dict[str, list[float]] = {}
        self.exp_avg: dict[str, torch.Tensor] = {}
        self.exp_avg_sq: dict[str, torch.Tensor] = {}
        self.steps: dict[str, list[float]] = {}
        self.stepped = [False] * self.k  # a member's MuonH momentum exists (its solo optimiser has stepped)
        for grp in self.groups:
            for n in grp.names:
                states = [self._member_state(i, n) for i in range(self.k)]
                p = stacked[n]
                if grp.kind == "muonh":
                    self.init_norm[n] = [float(st["init_norm"]) for st in states]
                    self.momentum[n] = _stack_or_zeros([st.get("momentum_buffer") for st in states], p)
                    self.stepped = [a or "momentum_buffer" in st for a, st in zip(self.stepped, states, strict=True)]
                else:
                    self.exp_avg[n] = _stack_or_zeros([st.get("exp_avg") for st in states], p)
                    self.exp_avg_sq[n] = _stack_or_zeros([st.get("exp_avg_sq") for st in states], p)
                    self.steps[n] = [float(st["step"]) if "step" in st else 0.0 for st in states]
        self.set_lr(self.multipliers)

    def _member_state(self, i: int, name: str) -> dict[str, Any]:
        """Member ``i``'s optimiser state for parameter ``name`` (empty before its first step)."""
        for opt in self.members[i].optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if self._names[i][id(p)] == name:
                        return dict(opt.state.get(p, {}))
        raise KeyError(name)

    @property
    def _order(self) -> list[str]:
        return [n for grp in self.groups for n in grp.names]

    # ---- learning rates -------------------------------------------------------------------------------------------
    def set_lr(self, multipliers: Sequence[float]) -> None:
        """Every member's lrs: its base lr per group times its schedule's multiplier (``Optimizers.set_lr``)."""
        self.multipliers = [float(m) for m in multipliers]
        for grp in self.groups:
            grp.lrs = [b * m for b, m in zip(grp.base_lrs, self.multipliers, strict=True)]

    def set_lr_for_steps(self, steps: Sequence[int], totals: Sequence[int]) -> list[float]:
        """Each member's schedule at its own step (``Optimizers.set_lr_for_step``); returns the multipliers."""
        mults = [m.schedule(s, t) for m, s, t in zip(self.members, steps, totals, strict=True)]
        self.set_lr(mults)
        return mults

    # ---- the update -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> torch.Tensor | None:
        """Clip each member's gradients (if configured) and update every stack; returns the pre-clip norms [k]."""
        norms = self._clip() if self.grad_clip is not None else None
        for grp in self.groups:
            if grp.kind == "muonh":
                self._muonh(grp)
            else:
                self._adamw(grp)
        self.stepped = [True] * self.k
        return norms

    def zero_grad(self) -> None:
        for p in self.stacked.values():
            p.grad = None

    def _clip(self) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_(foreach=True)`` per member: per-tensor norms, their norm, the clamped
        coefficient max / (norm + 1e-6)."""
        assert self.grad_clip is not None
        grads = [p.grad for n in self._order if (p := self.stacked[n]).grad is not None]
        per = torch.stack([torch.linalg.vector_norm(g.reshape(self.k, -1), 2, dim=1) for g in grads], dim=1)
        total = torch.linalg.vector_norm(per, 2, dim=1)
        coef = (self.grad_clip / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(self.k, *([1] * (g.dim() - 1))))
        return total

    def _muonh(self, grp: _Group) -> None:
        s = grp.settings
        params = [(n, self.stacked[n]) for n in grp.names if self.stacked[n].grad is not None]
        buckets: dict[tuple, list[tuple[str, torch.nn.Parameter]]] = {}
        for n, p in params:
            buckets.setdefault((min(p.shape[1:]), max(p.shape[1:]), p.dtype, p.device), []).append((n, p))
        mu = s["momentum"]
        for bucket in buckets.values():
            updates = []
            for n, p in bucket:
                grad = p.grad
                assert grad is not None
                buf = self.momentum[n]
                buf.lerp_(grad, 1.0 - mu)
                updates.append(wide(grad.lerp(buf, mu) if s["nesterov"] else buf))
            U = torch.stack(updates, dim=1)  # [k, bucket, a, b]: member-major, as one call over every matrix
            k, nb = U.shape[:2]
            dt = ns_compute_dtype(s["ns_dtype"], U.device)
            O = orthogonalize(U.reshape(k * nb, *U.shape[2:]), s["ns_steps"], dt, s.get("orthogonalizer", "ns5"))
            O = O.view(k, nb, *O.shape[1:])
            rho = torch.tensor(
                [[self.init_norm[n][i] for n, _ in bucket] for i in range(k)], dtype=torch.float32, device=U.device
            ).view(k, nb, 1, 1)
            O = O * (rho.to(dt) / O.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))
            W = torch.stack([wide(p.detach()).float() for _, p in bucket], dim=1)
            lr = torch.tensor(grp.lrs, dtype=torch.float32, device=U.device).to(dt).view(k, 1, 1, 1)
            W = W - lr * O
            W = W * (rho / W.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))
            for j, (_, p) in enumerate(bucket):
                w = W[:, j]
                p.copy_(w.mT if p.size(1) > p.size(2) else w)

    def _adamw(self, grp: _Group) -> None:
        """torch's foreach AdamW (``torch.optim.adam._multi_tensor_adam``, decoupled decay, no amsgrad) per member."""
        s = grp.settings
        beta1, beta2 = s["betas"]
        eps, wd = s["eps"], s["weight_decay"]
        for n in grp.names:
            p = self.stacked[n]
            grad = p.grad
            if grad is None:
                continue
            steps = self.steps[n] = [v + 1.0 for v in self.steps[n]]
            if wd != 0:
                p.mul_(_scalars([1 - lr * wd for lr in grp.lrs], p))
            exp_avg, exp_avg_sq = self.exp_avg[n], self.exp_avg_sq[n]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2)
            exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
            step_size = [(lr / (1 - beta1**t)) * -1 for lr, t in zip(grp.lrs, steps, strict=True)]
            bc2_sqrt = [(1 - beta2**t) ** 0.5 for t in steps]
            denom = exp_avg_sq.sqrt()
            denom.div_(_scalars(bc2_sqrt, denom))
            denom.add_(eps)
            size = _scalars(step_size, p)
            if isinstance(size, float):
                p.addcdiv_(exp_avg, denom, value=size)
            else:  # addcdiv's own order, self + (value * t1) / t2, with a value per member
                p.add_(exp_avg.mul(size).div_(denom))

    # ---- members ---------------------------------------------------------------------------------------------
    def keep(self, indices: Sequence[int], stacked: dict[str, torch.nn.Parameter]) -> None:
        """Keep only the members at ``indices`` (the pack's ``keep``), over the pack's new stacks."""
        idx = list(indices)
        self.members = [self.members[i] for i in idx]
        self.k = len(idx)
        self.stacked = stacked
        self.multipliers = [self.multipliers[i] for i in idx]
        self.stepped = [self.stepped[i] for i in idx]
        self._names = [self._names[i] for i in idx]
        for grp in self.groups:
            grp.base_lrs = [grp.base_lrs[i] for i in idx]
            grp.lrs = [grp.lrs[i] for i in idx]
        for table in (self.momentum, self.exp_avg, self.exp_avg_sq):
            for n, t in table.items():
                table[n] = t[idx]
        for lists in (self.init_norm, self.steps):
            for n, v in lists.items():
                lists[n] = [v[i] for i in idx]

    def member_state_dict(self, i: int) -> dict[str, Any]:
        """Member ``i``'s optimiser state as its solo ``Optimizers.state_dict()`` (copies, for a checkpoint)."""
        opt = self.members[i]
        names = self._names[i]
        lrs = {grp.name: grp.lrs[i] for grp in self.groups}
        for torch_opt in opt.optimizers:
            for group in torch_opt.param_groups:
                group["lr"] = lrs[str(group["name"])]
                for p in group["params"]:
                    n = names[id(p)]
                    if isinstance(torch_opt, MuonH):
                        state: dict[str, Any] = {"init_norm": self.init_norm[n][i]}
                        if self.stepped[i]:
                            state["momentum_buffer"] = self.momentum[n][i].clone()
                    elif self.steps[n][i] > 0:
                        state = {
                            "step": torch.tensor(self.steps[n][i], dtype=torch.float32),
                            "exp_avg": self.exp_avg[n][i].clone(),
                            "exp_avg_sq": self.exp_avg_sq[n][i].clone(),
                        }
                    else:
                        continue
                    torch_opt.state[p] = state
        opt.multiplier = self.multipliers[i]
        return opt.state_dict()


def _params_of(opt: Optimizers) -> list[torch.nn.Parameter]:
    return [p for o in opt.optimizers for g in o.param_groups for p in g["params"]]


def _stack_or_zeros(values: Sequence[torch.Tensor | None], like: torch.Tensor) -> torch.Tensor:
    """The members' state tensors stacked, a member without one (not stepped yet) as zeros (what its optimiser
    would create at its first step)."""
    return torch.stack([v.to(like.dtype) if v is not None else torch.zeros_like(like[i]) for i, v in enumerate(values)])
