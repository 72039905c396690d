"""What users would pick instead of loopscale, loaded from their own clones (never vendored).

    --nanogpt PATH   a clone of github.com/karpathy/nanoGPT: its model.py GPT and configure_optimizers (AdamW)
    --paper PATH     a clone of github.com/kschwethelm/looped-lm-scaling (arXiv 2604.21106's code):
                     nanochat/gpt.py's GPT and its setup_optimizer (MuonAdamW: MuonH + AdamW)

Each builder returns ``step()``: forward, backward, optimiser step, zero_grad at the given shape, as its
own training script runs them. The paper's fused optimiser steps are ``torch.compile``d
(``fullgraph=True``); on CPU they crash in inductor with torch 2.13, so on CPU they run as the plain
functions they wrap (eagerly, as loopscale's do).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from pathlib import Path

import torch


def _on_path(path: Path) -> None:
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def nanogpt_step(
    path: Path, *, vocab: int, d: int, n_layer: int, head_dim: int, seq_len: int, x: torch.Tensor
) -> Callable[[], None]:
    _on_path(path)
    import model as nanogpt  # nanoGPT's model.py

    cfg = nanogpt.GPTConfig(
        block_size=seq_len, vocab_size=vocab, n_layer=n_layer, n_head=d // head_dim, n_embd=d, dropout=0.0, bias=False
    )
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count and optimiser groups
        m = nanogpt.GPT(cfg).to(x.device)
        opt = m.configure_optimizers(0.1, 6e-4, (0.9, 0.95), x.device.type)

    idx, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()  # nanoGPT's loss views its targets

    def step() -> None:
        _, loss = m(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def paper_step(
    path: Path, *, vocab: int, d: int, L_eff: int, head_dim: int, seq_len: int, r: int, x: torch.Tensor
) -> Callable[[], None]:
    """The paper's model in its sweep layout: 2 + (L_eff - 4)/r x r + 2, or r = 1 as its 0 + L_eff + 0 loop."""
    _on_path(path)
    import nanochat.gpt as gpt
    import nanochat.optim as paper_optim

    if x.device.type == "cpu":
        for name in ("adamw_step_fused", "muon_step_fused"):
            fn = getattr(paper_optim, name, None)
            plain = getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", None)
            if plain is not None:
                setattr(paper_optim, name, plain)

    if r == 1:
        layout = dict(n_prelude=0, n_recur_block=L_eff, n_coda=0, num_recur=1, bptt_k=1, input_injection="passthrough")
    else:
        layout = dict(n_prelude=2, n_recur_block=(L_eff - 4) // r, n_coda=2, num_recur=r, bptt_k=r)
    cfg = gpt.GPTConfig(
        sequence_len=seq_len, vocab_size=vocab, n_head=d // head_dim, n_kv_head=d // head_dim, n_embd=d, **layout
    )
    with contextlib.redirect_stdout(io.StringIO()):
        with torch.device("meta"):
            m = gpt.GPT(cfg)
        m.to_empty(device=x.device)
        m.init_weights()
        opt = m.setup_optimizer()

    idx, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()  # its loss views its targets

    def step() -> None:
        loss = m(idx, targets)
        loss.backward()
        opt.step()
        m.zero_grad(set_to_none=True)

    return step
