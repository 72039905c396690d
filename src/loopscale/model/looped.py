"""The prelude - recur - coda language model (arXiv 2604.21106 §2), readable top to bottom.

    x = norm_emb(embed(idx)); x = prelude(x); e = x
    state = init(e); repeat r times: u = input(i, e, state); s = norm_recur(recur(u)); state = update(i, state, s)
    x = coda(readout(state)); logits = 15 tanh(head(norm_final(x))[:, :, :V] / 15)   (fp32, real vocabulary V)

With ``r = 1`` the model is the plain non-looped stack of ``L_eff`` unique layers (no injection,
no recurrent norm), unless ``r1_looped``: then it is a loop of one. The paper's own r = 1 baseline is
such a loop: 0 + 20 + 0 layers, passthrough injection, its recurrent norm applied once
(``presets/paper.toml`` builds it that way). Truncated BPTT runs the first ``r - k`` recurrences
without autograd, so they cost a forward pass only, as the accounting charges them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model.injection import make_injection
from loopscale.model.layers import Block, KVSlot, RMSNorm, Rotary
from loopscale.model.loss import softcap_cross_entropy
from loopscale.technique import Technique


class KVCache:
    """Per-application key/value cache: one slot for every block *application*, so a shared block
    used at recurrence i has its own entries for each i (the keys differ between recurrences).
    Each slot preallocates and doubles (``KVSlot``): decoding appends without copying the prefix."""

    def __init__(self) -> None:
        self.slots: list[KVSlot] = []
        self._cursor = 0

    def begin(self) -> None:
        self._cursor = 0

    def take(self) -> KVSlot:
        """The next application's slot (created on the first forward)."""
        if self._cursor >= len(self.slots):
            self.slots.append(KVSlot())
        slot = self.slots[self._cursor]
        self._cursor += 1
        return slot

    @property
    def length(self) -> int:
        return self.slots[0].length if self.slots else 0


def loop_of(cfg: ModelConfig) -> Technique:
    """The loop's technique for a looped config: the user's class (``model.technique``) or a built-in
    injection, whose truncated BPTT is its ``grad``."""
    if cfg.technique is not None:
        from loopscale import technique

        return technique.build(cfg)
    inject = make_injection(cfg.injection, cfg.width, cfg.r, cfg.hc_lanes)
    inject.backprop = (cfg.r, cfg.k_grad)
    return inject


def supports_r(cfg: ModelConfig, r: int) -> bool:
    """Can a looped model of ``cfg`` run ``r`` recurrences at test time? Asked of its technique built on
    the meta device (nothing allocated), so eval can skip an r before loading any weights."""
    with torch.device("meta"):
        return bool(loop_of(cfg).supports_r(int(r)))


def cannot_run(cfg: ModelConfig, r: int) -> str:
    what = cfg.technique or (
        f"{cfg.injection} has lane scalars for its training recurrences only:"
        if cfg.injection == "hyperconnect"
        else cfg.injection
    )
    return f"{what} cannot run {r} recurrences (trained with {cfg.r})"


class LoopedLM(nn.Module):
    #: the loss by row chunks with its gradient in the same pass (``model/loss.py``); False: plain autograd
    fused_loss: bool = True
    #: the loop's technique (looped configs only; ``loop_of``)
    inject: Technique

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.width
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base)

        def block() -> Block:
            return Block(d, cfg.head_dim, cfg.mlp_ratio, self.rotary, cfg.norm_eps)

        self.embed = nn.Embedding(cfg.vocab_padded, d)
        self.norm_emb = RMSNorm(d, cfg.norm_eps)
        self.prelude = nn.ModuleList(block() for _ in range(cfg.n_prelude))
        self.recur = nn.ModuleList(block() for _ in range(cfg.n_recur))
        self.coda = nn.ModuleList(block() for _ in range(cfg.n_coda))
        if cfg.technique is not None:
            from loopscale import technique

            technique.cost(cfg)  # the contract (shapes, placements, declared costs) checked before any training
        if cfg.is_looped:
            self.inject = loop_of(cfg)
            self.norm_recur = RMSNorm(d, cfg.norm_eps)
        self.norm_final = RMSNorm(d, cfg.norm_eps)
        self.head = nn.Linear(d, cfg.vocab_padded, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The paper's init: embedding N(0, 1), head N(0, 1e-3), blocks uniform, injection [I | 0]."""
        nn.init.normal_(self.embed.weight, 0.0, 1.0)
        nn.init.normal_(self.head.weight, 0.0, 1e-3)
        for b in self.blocks():
            b.init_paper()
        for m in self.modules():
            if isinstance(m, RMSNorm):
                m.weight.fill_(1.0)
        if self.cfg.is_looped:
            self.inject.reset_parameters()

    def blocks(self) -> Iterator[Block]:
        # nn.ModuleList iterates as Module; these three hold only Blocks (``__init__``)
        yield from cast(Iterable[Block], self.prelude)
        yield from cast(Iterable[Block], self.recur)
        yield from cast(Iterable[Block], self.coda)

    # ---- forward ---------------------------------------------------------------------------
    def _stack(self, blocks: nn.ModuleList, x: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        for b in blocks:
            x = b(x, cache.take() if cache is not None else None)
        return x

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        r: int | None = None,
        cache: KVCache | None = None,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """Logits [B, T, vocab_size] in fp32, or with ``targets`` the next-token loss in nats.

        This is loopscale's one loss path (training, validation, calibration): cross-entropy over the
        *real* vocabulary, as the paper's code computes it (padded ids never enter the softmax), with
        targets -1 ignored; ``reduction`` as in ``F.cross_entropy``. ``r`` overrides the recurrences
        (looped models only).
        """
        cfg = self.cfg
        r = self._check_r(r)
        if cache is not None:
            cache.begin()
        x = self.norm_emb(self.embed(idx))
        x = self._stack(self.prelude, x, cache)
        x = self._stack(self.recur, x, cache) if not cfg.is_looped else self._loop(x, r, cache)
        x = self.norm_final(self._stack(self.coda, x, cache))
        if targets is not None and self.fused_loss and reduction != "none":
            return softcap_cross_entropy(
                x.reshape(-1, x.size(-1)),
                self.head.weight[: cfg.vocab_size],
                targets,
                softcap=cfg.softcap,
                reduction=reduction,
            )
        logits = self.head(x)[..., : cfg.vocab_size].float()
        if cfg.softcap is not None:
            logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
        if targets is None:
            return logits
        return F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1, reduction=reduction
        )

    def _loop(self, e: torch.Tensor, r: int, cache: KVCache | None) -> torch.Tensor:
        """The loop, through the technique interface (``loopscale.technique``): the built-in injections and
        truncated BPTT (``Injection.grad``) run this same code as a user's technique."""
        tech = self.inject
        grad = torch.is_grad_enabled()
        state = tech.init(e)
        for i in range(r):
            with torch.no_grad() if grad and not tech.grad(i, r) else contextlib.nullcontext():
                u = tech.input(i, e, state)
                s = self.norm_recur(tech.block(i, lambda x: self._stack(self.recur, x, cache), u))
                state = tech.update(i, state, s)
        return tech.readout(state)

    def _check_r(self, r: int | None) -> int:
        if r is None or r == self.cfg.r:
            return self.cfg.r
        if r < 1:
            raise ConfigError("r", "must be a positive number of recurrences", value=r)
        if not self.cfg.is_looped:
            raise ConfigError("r", "the r = 1 baseline is a plain stack; only looped models can change r", value=r)
        if not self.inject.supports_r(r):
            raise ConfigError("r", cannot_run(self.cfg, r), value=r)
        return r

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, *, r: int | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy in nats (targets -1 are ignored); ``self(idx, targets)``."""
        return self(idx, targets, r=r)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        r: int | None = None,
        stop: int | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Decoding with the looped KV cache (logits cover the real vocabulary only): greedy by default;
        ``temperature > 0`` samples from softmax(logits / temperature), over the ``top_k`` likeliest if given,
        drawing from ``generator`` (seeded: the same tokens every time)."""
        if temperature < 0:
            raise ConfigError("temperature", "must be >= 0 (0: greedy)", value=temperature)
        if top_k is not None and top_k < 1:
            raise ConfigError("top_k", "must be a positive number of tokens", value=top_k)
        cache = KVCache()
        logits = self(idx, r=r, cache=cache)
        out = []
        for _ in range(max_new_tokens):
            nxt = _pick(logits[:, -1], temperature, top_k, generator)
            out.append(nxt)
            if stop is not None and bool((nxt == stop).all()):
                break
            logits = self(nxt, r=r, cache=cache)
        return torch.cat(out, dim=1) if out else idx[:, :0]

    # ---- parameter bookkeeping ---------------------------------------------------------------
    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Optimiser groups: 2-D block/injection matrices, embedding, head, norm scales, lane scalars."""
        groups: dict[str, list[nn.Parameter]] = {"matrix": [], "embed": [], "head": [], "norm": [], "scalar": []}
        for b in self.blocks():
            for name, p in b.named_parameters():
                groups["norm" if name.startswith("norm") else "matrix"].append(p)
        # torch annotates Embedding/Linear.weight as Tensor; they are Parameters
        groups["embed"].append(cast(nn.Parameter, self.embed.weight))
        groups["head"].append(cast(nn.Parameter, self.head.weight))
        groups["norm"] += [self.norm_emb.weight, self.norm_final.weight]
        if self.cfg.is_looped:  # the injection or technique names each parameter's group
            groups["norm"].append(self.norm_recur.weight)
            for name, p in self.inject.named_parameters():
                group = self.inject.param_group(name, p)
                if group not in ("matrix", "scalar", "norm"):
                    raise ConfigError(
                        "model.technique", f"param_group({name!r}) must be 'matrix', 'scalar' or 'norm'", value=group
                    )
                groups[group].append(p)
        return groups

    def count_params(self) -> dict[str, int]:
        """The accounting's grouping, counted from the real parameters (tests compare the two)."""

        def n(ps: Iterator[nn.Parameter] | list[nn.Parameter]) -> int:
            return sum(p.numel() for p in ps)

        def block_matrices(bs: nn.ModuleList) -> int:
            return sum(p.numel() for b in bs for name, p in b.named_parameters() if not name.startswith("norm"))

        N_once = block_matrices(self.prelude) + block_matrices(self.coda)
        N_rec = block_matrices(self.recur)
        if self.cfg.is_looped:
            for name, p in self.inject.named_parameters():
                if self.inject.placement(name, p) == "once":
                    N_once += p.numel()
                else:
                    N_rec += p.numel()
        groups = self.param_groups()
        return {
            "N_once": N_once,
            "N_rec": N_rec,
            "N_emb": n(groups["embed"]) + n(groups["head"]),
            "N_norm": n(groups["norm"]),
            "N_total": n(self.parameters()),
        }


def _pick(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """The next token [B, 1] from the last position's logits [B, V]: argmax at temperature 0, else a draw."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)
