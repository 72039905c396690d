"""How the loop's state is fed back (arXiv 2604.21106 §2, "Input injection" and the HC probe).

Each mode is a small module with the same four steps, so the loop in ``LoopedLM.forward`` reads
like the paper: ``state = init(e)``; per recurrence ``u = input(i, e, state)``, run the recurrent
blocks on ``u``, ``s = norm_recur(.)``, ``state = update(i, state, s)``; the coda gets ``readout(state)``.
"""

from __future__ import annotations

import torch
from torch import nn

from loopscale.technique import Technique


class Injection(Technique):
    """The built-in modes are techniques (``loopscale.technique``) whose accounting ``loopscale.accounting``
    writes out in closed form; the base is the passthrough: h0 = e, u = h, h <- s."""

    backprop: tuple[int, int] = (1, 1)  # (training r, k): truncated BPTT back-propagates the last k recurrences

    def grad(self, i: int, r: int) -> bool:
        r_train, k = self.backprop
        return i >= r - (k if r == r_train else r)  # at a test-time r every recurrence counts (no gradients anyway)


class LinearInjection(Injection):
    """u = W [e || h], W (d x 2d, no bias) initialised to [I | 0] so the first input is e; h0 = e."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_model, 2 * d_model))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        d = self.weight.size(0)
        self.weight.zero_()
        self.weight[:, :d].copy_(torch.eye(d))

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.cat((e, state), dim=-1), self.weight)


class AdditiveInjection(Injection):
    """u = h + e with h0 = 0 (the paper's 'additive' ablation)."""

    def init(self, e: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(e)

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return state + e


class Passthrough(Injection):
    """No injection: u = h, h0 = e (the ablation that fails to train in the paper)."""


class HyperConnect(Injection):
    """Loop-level static hyper-connections with K lanes (Zhu et al. 2025, as the paper's probe).

    State: lanes [K, ...], all initialised to e. Recurrence i: u = sum_k alpha_i[k] lane_k; after the
    blocks, s = norm_recur(.); lanes <- M_i lanes + beta_i (x) s. The coda gets the sum of the lanes.
    Cyclic init alpha_i = e_{i mod K}, M_i = I, beta_i = 1: at init every lane holds the same
    residual stream h <- h + s, so the loop equals a plain residual loop whose coda input is K h.
    """

    def supports_r(self, r: int) -> bool:
        return r <= self.r  # lane scalars for the training recurrences only

    def param_group(self, name: str, p: nn.Parameter) -> str:
        return "scalar"  # lane mixing scalars (AdamW), though alpha and beta are 2-D

    def __init__(self, r: int, lanes: int) -> None:
        super().__init__()
        self.r, self.lanes = r, lanes
        self.alpha = nn.Parameter(torch.empty(r, lanes))
        self.mix = nn.Parameter(torch.empty(r, lanes, lanes))
        self.beta = nn.Parameter(torch.empty(r, lanes))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.alpha.zero_()
        for i in range(self.r):
            self.alpha[i, i % self.lanes] = 1.0
        self.mix.copy_(torch.eye(self.lanes).expand(self.r, -1, -1))
        self.beta.fill_(1.0)

    def init(self, e: torch.Tensor) -> torch.Tensor:
        return e.unsqueeze(0).expand(self.lanes, *e.shape).clone()

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        a = self.alpha[i].to(state.dtype)
        return torch.einsum("k,k...->...", a, state)

    def update(self, i: int, state: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        m = self.mix[i].to(state.dtype)
        b = self.beta[i].to(state.dtype)
        return torch.einsum("kj,j...->k...", m, state) + b.view(-1, *([1] * s.dim())) * s

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return state.sum(dim=0)


def make_injection(mode: str, d_model: int, r: int, lanes: int) -> Injection:
    if mode == "linear":
        return LinearInjection(d_model)
    if mode == "additive":
        return AdditiveInjection()
    if mode == "passthrough":
        return Passthrough()
    if mode == "hyperconnect":
        return HyperConnect(r, lanes)
    from loopscale.errors import ConfigError

    raise ConfigError(
        "model.injection", "unknown mode; expected linear, additive, passthrough or hyperconnect", value=mode
    )
