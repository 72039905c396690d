"""A looped technique that is not in the paper: a learned, per-recurrence gate on the state update.

    u_i = W [e || h_i]                         (the paper's linear injection, W initialised to [I | 0])
    h_{i+1} = h_i + sigmoid(g_i) * (s_i - h_i)  (g_i: one vector per recurrence, initialised to 2)

At init sigmoid(2) = 0.88, close to the plain update h <- s; training can learn to carry more of the old
state through some recurrences. Use it with `model.technique = "loopscale.examples.gated_loop:GatedLoop"`,
or copy the file anywhere and name it by path, `"gated_loop.py:GatedLoop"` (docs/extending.md, "A new looped
technique"); the `probes` preset runs it beside the paper's probes.
"""

import torch
from torch import nn

from loopscale.technique import Technique


class GatedLoop(Technique):
    def __init__(self, d_model: int, r: int, gate_init: float = 2.0) -> None:
        super().__init__()
        self.r, self.gate_init = r, gate_init
        self.weight = nn.Parameter(torch.empty(d_model, 2 * d_model))  # a matrix: Muon trains it
        self.gate = nn.Parameter(torch.empty(r, d_model))  # not 2-D in spirit: AdamW, like lane scalars
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        d = self.weight.size(0)
        self.weight.zero_()
        self.weight[:, :d].copy_(torch.eye(d))
        self.gate.fill_(self.gate_init)

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(torch.cat((e, state), dim=-1), self.weight)

    def update(self, i: int, state: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return state + torch.sigmoid(self.gate[i]).to(s.dtype) * (s - state)

    def supports_r(self, r: int) -> bool:
        return r <= self.r  # one gate per trained recurrence

    def param_group(self, name: str, p: nn.Parameter) -> str:
        return "matrix" if name == "weight" else "scalar"

    @classmethod
    def declared(cls, d_model: int, r: int, options: dict) -> dict:
        return {"params_rec": 2 * d_model * d_model + r * d_model, "flops_rec": 2 * (2 * d_model) * d_model}
