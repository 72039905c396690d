"""Transformer block of arXiv 2604.21106 §2: pre-norm, RoPE, QK-norm, squared-ReLU MLP, no biases."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from loopscale.model import fused


class RMSNorm(nn.Module):
    """RMSNorm with a learnable scale (eps 1e-6), the paper's only normalisation."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.use_fused(x):
            return fused.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


class Rotary(nn.Module):
    """Rotary position embedding in the paper code's form (``nanochat/gpt.py`` of arXiv 2604.21106).

    Half-split pairs ``(x1, x2)`` rotate as ``(x1 cos + x2 sin, x2 cos - x1 sin)``, and the cos/sin
    table is rounded to bfloat16 as the paper's model stores it (``self.cos`` is bf16 on every device),
    so fp32 CPU runs see exactly the paper's rotation. cos/sin are cached up to the longest position seen.
    """

    inv_freq: torch.Tensor  # a (non-persistent) buffer, registered in __init__

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache: tuple[int, torch.device, torch.Tensor, torch.Tensor] | None = None
        self._turn: torch.Tensor | None = None

    def _cos_sin(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cache is None or self._cache[0] < n or self._cache[1] != device:
            t = torch.arange(max(n, 64), device=device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq.to(device))
            bf16 = torch.bfloat16
            self._cache = (t.numel(), device, freqs.cos().to(bf16).float(), freqs.sin().to(bf16).float())
            self._turn = None
        return self._cache[2], self._cache[3]

    def turn(self, offset: int, T: int, like: torch.Tensor) -> torch.Tensor:
        """The rotation as complex numbers, cos - i sin, [T, hd/2] in the complex dtype of ``like``
        (``fused.rope_qk_norm``; its inverse is the conjugate); cached beside cos and sin."""
        cos, sin = self._cos_sin(offset + T, like.device)
        dtype = torch.complex128 if like.dtype == torch.float64 else torch.complex64
        if self._turn is None or self._turn.dtype != dtype:
            self._turn = torch.complex(cos, -sin).to(dtype)
        return self._turn[offset : offset + T]

    def table(self, offset: int, T: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, hd/2] for positions offset..offset+T-1, in ``like``'s dtype."""
        cos, sin = self._cos_sin(offset + T, like.device)
        return cos[offset : offset + T].to(like.dtype), sin[offset : offset + T].to(like.dtype)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: [..., T, hd]; positions offset..offset+T-1."""
        cos, sin = self.table(offset, x.size(-2), x)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


KV = tuple[torch.Tensor, torch.Tensor]


class KVSlot:
    """The keys and values of one block application while decoding, in buffers that double when full.

    Appending T tokens copies only those tokens (torch.cat would copy the whole prefix for every new
    token: quadratic in the length), so decoding is O(1) amortised per token outside attention itself.
    Keys are kept in the values' dtype, the model's compute dtype (bf16 under autocast, where the
    parameter-free QK-norm may return fp32): attention reads them in that dtype anyway.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> KV:
        """Store k, v [B, H, T, hd] after what is cached; returns views of everything cached so far."""
        n, T = self.length, k.size(2)
        if self.k is None or self.v is None or n + T > self.k.size(2):
            cap = max(n + T, 2 * (0 if self.k is None else self.k.size(2)))
            B, H, _, hd = v.shape
            k_buf, v_buf = v.new_empty(B, H, cap, hd), v.new_empty(B, H, cap, hd)
            if self.k is not None and self.v is not None and n:
                k_buf[:, :, :n] = self.k[:, :, :n]
                v_buf[:, :, :n] = self.v[:, :, :n]
            self.k, self.v = k_buf, v_buf
        self.k[:, :, n : n + T] = k
        self.v[:, :, n : n + T] = v
        self.length = n + T
        return self.k[:, :, : n + T], self.v[:, :, : n + T]

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.size(2)


def qk_norm(qk: torch.Tensor, eps: float) -> torch.Tensor:
    """Parameter-free RMSNorm over the head dimension, in q and k's own dtype.

    CUDA autocast lists ``rms_norm`` as an fp32 op: q and k would be upcast, saved and normed in fp32
    (8 bytes per element instead of 2) although SDPA reads them in bf16. Outside autocast the bf16 kernel
    still accumulates in fp32, so the result is the fp32 norm rounded to bf16, which is what SDPA saw.
    """
    if not torch.is_autocast_enabled(qk.device.type):
        return F.rms_norm(qk, (qk.size(-1),), eps=eps)
    with torch.autocast(qk.device.type, enabled=False):
        return F.rms_norm(qk, (qk.size(-1),), eps=eps)


class Attention(nn.Module):
    """Causal self-attention through SDPA; q/k get RoPE, then a parameter-free RMSNorm (QK-norm)."""

    def __init__(self, d_model: int, head_dim: int, rotary: Rotary, eps: float) -> None:
        super().__init__()
        self.n_head = d_model // head_dim
        self.head_dim = head_dim
        self.eps = eps
        self.rotary = rotary
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: KVSlot | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        # One GEMM for q, k, v (the weights stay separate matrices, as the optimiser sees them).
        past = 0 if cache is None else cache.length
        # RoPE, then QK-norm, as the paper's code orders them (with its bf16-rounded table the rotation is
        # not exactly norm-preserving, so the order matters at the last bit); q and k share both calls.
        if fused.use_fused(x):  # q and k rows reordered so that RoPE is one complex product (fused.py)
            w = fused.interleaved_qkv(self.q.weight, self.k.weight, self.v.weight, self.head_dim)
            qkv = F.linear(x, w).view(B, T, 3, self.n_head, self.head_dim)
            turn = self.rotary.turn(past, T, qkv)
            if cache is None and fused.attention_kernel_serves(qkv):  # training and scoring: all in C
                return self.out(fused.rope_qk_norm_attention(qkv, turn, self.eps))
            q, k, v = (t.transpose(1, 2) for t in fused.rope_qk_norm(qkv, turn, self.eps))
        else:
            w = torch.cat((self.q.weight, self.k.weight, self.v.weight))
            qkv = F.linear(x, w).view(B, T, 3, self.n_head, self.head_dim)
            qk = qkv[:, :, :2].permute(2, 0, 3, 1, 4)  # [2, B, H, T, hd]
            v = qkv[:, :, 2].transpose(1, 2)
            qk = qk_norm(self.rotary(qk, past), self.eps)
            q, k = qk[0], qk[1]
        if cache is not None:
            k, v = cache.append(k, v)
        if past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:
            y = F.scaled_dot_product_attention(q, k, v)
        else:  # a chunk after a cached prefix: query i sees keys up to past + i
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.out(y)


class _SquaredReLU(torch.autograd.Function):
    """relu(x)^2 with its gradient in one product: d/dx = 2 relu(x), exactly autograd's
    ``(g h + g h) * relu'(x)`` (doubling is exact), without its three [rows, 4d] passes."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        h = F.relu(x)
        ctx.save_for_backward(h)
        return h * h

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (h,) = ctx.saved_tensors
        return fused.squared_relu_grad(grad, h)


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 with ``_SquaredReLU``'s one-product gradient (the plain MLP's activation; ``model/packed.py``)."""
    return _SquaredReLU.apply(x)


class MLP(nn.Module):
    """d -> ratio*d -> d with squared ReLU.

    The square is a product, not ``h.square()``: CUDA autocast runs ``pow`` in fp32 (and keeps an fp32
    copy of the hidden for backward); a bf16 product of bf16 factors is the fp32 square rounded once to
    bf16, bit for bit what ``proj`` received before, and in fp32 ``pow(h, 2)`` is ``h * h``.
    """

    def __init__(self, d_model: int, ratio: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, ratio * d_model, bias=False)
        self.proj = nn.Linear(ratio * d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.use_fused(x):
            return fused.squared_relu_mlp(x, self.fc.weight, self.proj.weight)
        if torch.is_grad_enabled():
            return self.proj(squared_relu(self.fc(x)))
        h = F.relu(self.fc(x))  # no graph: the pre-activation is freed before the square exists
        return self.proj(h * h)


class Block(nn.Module):
    """x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x))."""

    def __init__(self, d_model: int, head_dim: int, mlp_ratio: int, rotary: Rotary, eps: float) -> None:
        super().__init__()
        self.norm1 = RMSNorm(d_model, eps)
        self.attn = Attention(d_model, head_dim, rotary, eps)
        self.norm2 = RMSNorm(d_model, eps)
        self.mlp = MLP(d_model, mlp_ratio)

    def forward(self, x: torch.Tensor, cache: KVSlot | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache)
        return x + self.mlp(self.norm2(x))

    @torch.no_grad()
    def init_paper(self) -> None:
        """U(+-sqrt(3)/sqrt(d)) for q, k, v, out and the MLP input; U(+-sqrt(3)/sqrt(4d)) for MLP out."""
        for lin in (self.attn.q, self.attn.k, self.attn.v, self.attn.out, self.mlp.fc):
            bound = math.sqrt(3.0) / math.sqrt(lin.in_features)
            lin.weight.uniform_(-bound, bound)
        bound = math.sqrt(3.0) / math.sqrt(self.mlp.proj.in_features)
        self.mlp.proj.weight.uniform_(-bound, bound)
