"""A loopscale looped transformer (arXiv 2604.21106 §2) as a Hugging Face ``transformers`` model.

``loopscale export RUN --format hf OUT`` copies this file into OUT, so that
``AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)`` loads the model where loopscale is
not installed: it imports only torch and transformers. The forward pass re-implements loopscale's
``LoopedLM`` (``loopscale/model/looped.py``) step for step, and loopscale's tests compare the two::

    x = norm_emb(embed(ids)); x = prelude(x); e = x
    state = init(e); r times: u = input(i, e, state); s = norm_recur(recur(u)); state = update(i, state, s)
    logits = softcap tanh(head(norm_final(coda(readout(state)))) / softcap)

Test-time recurrences: ``model.config.num_recur = 8`` or ``model(ids, r=8)`` / ``model.generate(ids, r=8)``.
``generate`` recomputes the prefix at every step (no key/value cache: a looped model needs one slot per
block *application*, which transformers' caches do not model); ``loopscale sample`` decodes with one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput


class LoopscaleConfig(PretrainedConfig):
    """The prelude-recur-coda layout; ``num_recur`` is the r a forward pass uses (default: the training r)."""

    model_type = "loopscale"

    def __init__(
        self,
        vocab_size: int = 257,
        hidden_size: int = 64,
        head_dim: int = 16,
        n_prelude: int = 1,
        n_recur: int = 1,
        n_coda: int = 1,
        train_recur: int = 1,
        num_recur: int | None = None,
        injection: str = "linear",
        hc_lanes: int = 2,
        r1_looped: bool = False,
        mlp_ratio: int = 4,
        softcap: float | None = 15.0,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-6,
        max_position_embeddings: int = 2048,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.head_dim = head_dim
        self.num_attention_heads = hidden_size // head_dim
        self.n_prelude, self.n_recur, self.n_coda = n_prelude, n_recur, n_coda
        self.train_recur = train_recur
        self.num_recur = train_recur if num_recur is None else num_recur
        self.injection, self.hc_lanes, self.r1_looped = injection, hc_lanes, r1_looped
        self.mlp_ratio = mlp_ratio
        self.softcap = softcap
        self.rope_base = rope_base
        self.norm_eps = norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.num_hidden_layers = n_prelude + train_recur * n_recur + n_coda
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @property
    def is_looped(self) -> bool:
        return self.train_recur > 1 or self.r1_looped


def _rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """loopscale's RoPE: half-split pairs rotate as (x1 cos + x2 sin, x2 cos - x1 sin) with a bf16-rounded table.

    x [B, H, T, hd]; pos [B, T] (the positions counted over the attention mask).
    """
    hd = x.size(-1)
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd))
    freqs = torch.outer(torch.arange(int(pos.max()) + 1, device=x.device, dtype=torch.float32), inv_freq)
    cos = freqs.cos().to(torch.bfloat16).float()[pos].unsqueeze(1).to(x.dtype)  # [B, 1, T, hd/2]
    sin = freqs.sin().to(torch.bfloat16).float()[pos].unsqueeze(1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


class Attention(nn.Module):
    """Causal attention; q and k get RoPE, then a parameter-free RMSNorm (QK-norm), in that order."""

    def __init__(self, cfg: LoopscaleConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.n_head, self.head_dim, self.eps, self.base = d // cfg.head_dim, cfg.head_dim, cfg.norm_eps, cfg.rope_base
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        w = torch.cat((self.q.weight, self.k.weight, self.v.weight))
        qkv = F.linear(x, w).view(B, T, 3, self.n_head, self.head_dim)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        q = F.rms_norm(_rope(q, pos, self.base), (self.head_dim,), eps=self.eps)
        k = F.rms_norm(_rope(k, pos, self.base), (self.head_dim,), eps=self.eps)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LoopscaleConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size, cfg.mlp_ratio * cfg.hidden_size, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        return self.proj(h * h)  # squared ReLU


class Block(nn.Module):
    def __init__(self, cfg: LoopscaleConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), pos, mask)
        return x + self.mlp(self.norm2(x))


class Injection(nn.Module):
    """The loop's state and input: linear ``u = W [e || h]``, additive ``u = h + e``, passthrough ``u = h``,
    or hyperconnect (K lanes mixed by per-recurrence scalars), as in loopscale/model/injection.py."""

    def __init__(self, cfg: LoopscaleConfig) -> None:
        super().__init__()
        self.mode = cfg.injection
        d, r, K = cfg.hidden_size, cfg.train_recur, cfg.hc_lanes
        if self.mode == "linear":
            self.weight = nn.Parameter(torch.zeros(d, 2 * d))
        elif self.mode == "hyperconnect":
            self.alpha = nn.Parameter(torch.zeros(r, K))
            self.mix = nn.Parameter(torch.zeros(r, K, K))
            self.beta = nn.Parameter(torch.zeros(r, K))
            self.lanes = K
        elif self.mode not in ("additive", "passthrough"):
            raise ValueError(f"unknown injection {self.mode!r}")

    def init(self, e: torch.Tensor) -> torch.Tensor:
        if self.mode == "additive":
            return torch.zeros_like(e)
        if self.mode == "hyperconnect":
            return e.unsqueeze(0).expand(self.lanes, *e.shape).clone()
        return e

    def input(self, i: int, e: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if self.mode == "linear":
            return F.linear(torch.cat((e, state), dim=-1), self.weight)
        if self.mode == "additive":
            return state + e
        if self.mode == "hyperconnect":
            return torch.einsum("k,k...->...", self.alpha[i].to(state.dtype), state)
        return state

    def update(self, i: int, state: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if self.mode != "hyperconnect":
            return s
        m, b = self.mix[i].to(state.dtype), self.beta[i].to(state.dtype)
        return torch.einsum("kj,j...->k...", m, state) + b.view(-1, *([1] * s.dim())) * s

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return state.sum(dim=0) if self.mode == "hyperconnect" else state


class LoopscaleForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LoopscaleConfig
    base_model_prefix = "loopscale"
    main_input_name = "input_ids"
    _no_split_modules: set[str] | list[str] | None = ["Block"]  # noqa: RUF012  (an instance variable upstream)

    def __init__(self, config: LoopscaleConfig) -> None:
        super().__init__(config)
        d = config.hidden_size
        self.embed: nn.Module = nn.Embedding(config.vocab_size, d)  # any module: set_input_embeddings
        self.norm_emb = RMSNorm(d, config.norm_eps)
        self.prelude = nn.ModuleList(Block(config) for _ in range(config.n_prelude))
        self.recur = nn.ModuleList(Block(config) for _ in range(config.n_recur))
        self.coda = nn.ModuleList(Block(config) for _ in range(config.n_coda))
        if config.is_looped:
            self.inject = Injection(config)
            self.norm_recur = RMSNorm(d, config.norm_eps)
        self.norm_final = RMSNorm(d, config.norm_eps)
        self.head = nn.Linear(d, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Weights come from model.safetensors; fresh modules get loopscale-like values (norms at 1)."""
        if isinstance(module, RMSNorm):
            module.weight.data.fill_(1.0)
        elif isinstance(module, nn.Linear | nn.Embedding):
            module.weight.data.normal_(0.0, 0.02)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed = value

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def _check_r(self, r: int | None) -> int:
        cfg = self.config
        r = int(cfg.num_recur if r is None else r)
        if r == cfg.train_recur:
            return r
        if r < 1:
            raise ValueError(f"r must be a positive number of recurrences, not {r}")
        if not cfg.is_looped:
            raise ValueError("the r = 1 baseline is a plain stack; only looped models can change r")
        if cfg.injection == "hyperconnect" and r > cfg.train_recur:
            raise ValueError(f"hyperconnect has lane scalars for {cfg.train_recur} recurrences only, not r = {r}")
        return r

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        r: int | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutput:
        """Logits [B, T, vocab] in fp32. A 0/1 ``attention_mask`` (left padding) masks keys and counts positions."""
        r = self._check_r(r)
        B, T = input_ids.shape
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keep = attention_mask.bool()
            pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
            mask = (causal & keep[:, None, :]) | torch.eye(T, dtype=torch.bool, device=input_ids.device)
            mask = mask.unsqueeze(1)  # [B, 1, T, T]; the diagonal keeps padded queries finite
        else:
            pos = torch.arange(T, device=input_ids.device).expand(B, T)
        x = self.norm_emb(self.embed(input_ids))
        for b in self.prelude:
            x = b(x, pos, mask)
        if self.config.is_looped:
            e, state = x, self.inject.init(x)
            for i in range(r):
                u = self.inject.input(i, e, state)
                for b in self.recur:
                    u = b(u, pos, mask)
                state = self.inject.update(i, state, self.norm_recur(u))
            x = self.inject.readout(state)
        else:
            for b in self.recur:
                x = b(x, pos, mask)
        for b in self.coda:
            x = b(x, pos, mask)
        logits = self.head(self.norm_final(x)).float()
        if self.config.softcap is not None:
            logits = self.config.softcap * torch.tanh(logits / self.config.softcap)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None, r: int | None = None, **kwargs
    ) -> dict:
        """The whole sequence at every step: no cache (see the module docstring)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask, "r": r}

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False
