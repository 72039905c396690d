"""A plain nanoGPT-style PyTorch GPT (fused qkv, LayerNorm, GELU MLP, SDPA), the speed reference.

Same shape as a loopscale model: L_eff layers of width d, head_dim, 4d MLP, untied head, no biases.
It is deliberately ordinary PyTorch, the way most research code is written.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d, bias=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.fc_out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_layer: int, head_dim: int, seq_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(PlainBlock(d, d // head_dim) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def _rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    T, hd = x.size(-2), x.size(-1)
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class PaperBlock(nn.Module):
    """The paper's block (RMSNorm, RoPE then QK-norm, squared ReLU), written the straightforward way."""

    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.fc, self.proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        h = self.n1(x)
        q, k, v = (lin(h).view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for lin in (self.q, self.k, self.v))
        q = F.rms_norm(_rope(q), (q.size(-1),), eps=1e-6)
        k = F.rms_norm(_rope(k), (k.size(-1),), eps=1e-6)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        return x + self.proj(F.relu(self.fc(self.n2(x))).square())


class PlainPaperGPT(nn.Module):
    """A non-looped GPT with the paper's block and model-level norms, no loop machinery: the
    same mathematics as loopscale's r = 1, written plainly."""

    def __init__(self, vocab: int, d: int, n_layer: int, head_dim: int, seq_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.n_emb, self.n_f = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.blocks = nn.ModuleList(PaperBlock(d, d // head_dim) for _ in range(n_layer))
        self.head = nn.Linear(d, vocab, bias=False)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.n_emb(self.wte(idx))
        for b in self.blocks:
            x = b(x)
        logits = 15 * torch.tanh(self.head(self.n_f(x)).float() / 15)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class PlainMuonH(torch.optim.Optimizer):
    """MuonH written the way reference Muon code is: one matrix at a time, no batching, fp32.

    The speed reference for loopscale's optimiser (same update rule as ``loopscale.optim.MuonH``).
    """

    def __init__(self, params, lr: float = 0.014, momentum: float = 0.95) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["rho"] = p.detach().norm()
                self.state[p]["buf"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            mu, lr = group["momentum"], group["lr"]
            for p in group["params"]:
                st = self.state[p]
                st["buf"].lerp_(p.grad, 1 - mu)
                u = p.grad.lerp(st["buf"], mu)
                x = u.T if u.size(0) > u.size(1) else u
                x = x / (x.norm() + 1e-7)
                for _ in range(5):
                    a = x @ x.T
                    x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
                o = x.T if u.size(0) > u.size(1) else x
                w = p - lr * st["rho"] * o / o.norm()
                p.copy_(w * (st["rho"] / w.norm()))


def plain_optimizer(model: nn.Module, name: str) -> list[torch.optim.Optimizer]:
    """AdamW for everything, or PlainMuonH for the blocks' matrices plus AdamW for the rest."""
    if name == "adamw":
        return [torch.optim.AdamW(model.parameters(), lr=1e-3)]
    mats = [p for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]
    rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and n.startswith("blocks."))]
    return [PlainMuonH(mats), torch.optim.AdamW(rest, lr=1e-3)]
