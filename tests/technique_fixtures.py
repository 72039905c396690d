"""Looped techniques defined outside the package, as a user would write them (tests/test_technique.py)."""

import torch
from torch import nn

from loopscale.technique import Technique


class LinearAgain(Technique):
    """The built-in linear injection, rewritten by a user: it must train to the same bits."""

    def __init__(self, d_model: int, r: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_model, 2 * d_model))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        d = self.weight.size(0)
        self.weight.zero_()
        self.weight[:, :d].copy_(torch.eye(d))

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(torch.cat((e, state), dim=-1), self.weight)


class Adapter(Technique):
    """Wraps the shared block with a per-recurrence low-rank adapter, and adds a once-per-token output bias."""

    def __init__(self, d_model: int, r: int, rank: int = 4) -> None:
        super().__init__()
        self.down = nn.ParameterList(nn.Parameter(torch.randn(rank, d_model) * 0.02) for _ in range(r))
        self.up = nn.ParameterList(nn.Parameter(torch.zeros(d_model, rank)) for _ in range(r))
        self.out_bias = nn.Parameter(torch.zeros(d_model))

    def block(self, i, recur, u):
        return recur(u) + nn.functional.linear(nn.functional.linear(u, self.down[i]), self.up[i])

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return state + self.out_bias

    def placement(self, name: str, p: nn.Parameter) -> str:
        return "once" if name == "out_bias" else "recurrence"

    @classmethod
    def declared(cls, d_model: int, r: int, options: dict) -> dict:
        rank = options.get("rank", 4)
        return {"params_rec": 2 * r * rank * d_model, "params_once": d_model, "flops_rec": 2 * 2 * rank * d_model}


class LastOnlyGrad(LinearAgain):
    """Back-propagates the last recurrence only (truncated BPTT with k = 1, written as a technique)."""

    def grad(self, i: int, r: int) -> bool:
        return i == r - 1


class WrongShape(Technique):
    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return torch.cat((e, state), dim=-1)


class OverDeclared(LinearAgain):
    @classmethod
    def declared(cls, d_model: int, r: int, options: dict) -> dict:
        return {"params_rec": d_model * d_model}


class BadPlacement(LinearAgain):
    def placement(self, name: str, p: nn.Parameter) -> str:
        return "sometimes"


class NotATechnique(nn.Module):
    pass
