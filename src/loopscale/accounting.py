"""Parameter and FLOP accounting: the one source of truth (arXiv 2604.21106 §3).

Pure functions of a ModelConfig; nothing here instantiates a model or imports torch, so the fit,
the planner and the sweep can use it on any machine. ``tests/test_accounting.py`` checks it against
the paper's fixtures, and ``tests/test_flops.py`` against the real model and
``torch.utils.flop_counter``.

Conventions (the paper's):
* ``n_b = 12 d^2`` per block (4 d^2 attention + 2 * mlp_ratio * d^2 MLP), no biases;
* ``N_once`` = prelude + coda blocks; ``N_rec`` = one recurrent block stack + its injection
  (``2 d^2`` for the linear injection, ``r (K^2 + 2K)`` lane scalars for hyperconnect);
  embeddings, LM head and norm scales are excluded (they are reported separately);
* training FLOPs/token ``F = 6 (N_once + N_head) + 6 r N_rec + 12 h q T L_eff`` with full ``T`` in
  the attention term (no causal halving) and a free embedding lookup. As in the paper's code
  (``GPT.estimate_flops``, which counts every parameter of the prelude, recur and coda modules), each
  block's two RMSNorm scales count as 2 d "params" per use: ``2 d / 12 d^2`` of F (0.03 % at s = 10),
  but it moves ``steps = round(C / (F B))`` by one step in most paper-grid runs, so parity needs it;
* truncated BPTT: detached recurrences cost ``2x`` (matmuls) and ``4 h q T`` (attention) instead of
  ``6x`` and ``12 h q T``; hyperconnect adds ``(K^2 + 2K) d`` equivalent params per recurrence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from loopscale.config import ModelConfig


# ---- parameters ---------------------------------------------------------------------------
def block_params(cfg: ModelConfig) -> int:
    """n_b: matrices of one transformer block (q, k, v, out and the two MLP matrices)."""
    d = cfg.width
    return 4 * d * d + 2 * cfg.mlp_ratio * d * d


def injection_params(cfg: ModelConfig) -> int:
    """Parameters of the loop's input injection (0 for the plain r = 1 stack); for a user's technique, those
    it runs per recurrence (measured: ``loopscale.technique.cost``)."""
    if not cfg.is_looped:
        return 0
    if cfg.technique is not None:
        return _technique(cfg).params_rec
    if cfg.injection == "linear":
        return 2 * cfg.width * cfg.width
    if cfg.injection == "hyperconnect":
        k = cfg.hc_lanes
        return cfg.r * (k * k + 2 * k)
    return 0  # additive, passthrough


def N_once(cfg: ModelConfig) -> int:
    once = _technique(cfg).params_once if cfg.technique is not None else 0
    return (cfg.n_prelude + cfg.n_coda) * block_params(cfg) + once


def _technique(cfg: ModelConfig) -> Any:
    from loopscale import technique

    return technique.cost(cfg)


def N_rec(cfg: ModelConfig) -> int:
    return cfg.n_recur * block_params(cfg) + injection_params(cfg)


def N_unique(cfg: ModelConfig) -> int:
    """Unique non-embedding parameters as the law counts them (N_once + N_rec)."""
    return N_once(cfg) + N_rec(cfg)


def N_emb(cfg: ModelConfig) -> int:
    """Token embedding plus the untied LM head, both over the padded vocabulary."""
    return 2 * cfg.vocab_padded * cfg.width


def N_head(cfg: ModelConfig) -> int:
    return cfg.vocab_padded * cfg.width


def N_norm(cfg: ModelConfig) -> int:
    """RMSNorm scales: two per unique block, plus embedding, final and (looped) recurrent norms.

    The paper's Table 6 totals include these (its s = 10, r = 4 entry is 40.2M, not the 40.1M of
    98 d^2 alone), so ``N_unique + N_norm`` is what reproduces that table.
    """
    d = cfg.width
    unique_blocks = cfg.n_prelude + cfg.n_coda + cfg.n_recur
    return 2 * d * unique_blocks + d * (2 + int(cfg.is_looped))


def N_total(cfg: ModelConfig) -> int:
    """Every trainable parameter of the model (what ``sum(p.numel())`` gives)."""
    return N_unique(cfg) + N_emb(cfg) + N_norm(cfg)


def effective_params(cfg: ModelConfig, reuse: int | None = None) -> int:
    """Non-embedding parameters counted once per use, in the paper code's convention.

    ``GPT.effective_params(exclude_embedding=True)`` of the paper's code (``nanochat/gpt.py``): prelude and
    coda blocks *with* their RMSNorm scales, plus the model-level norm scales, once; the recurrent blocks
    (with their norm scales) and the injection ``reuse`` times (default ``r``). Only the lr rule's
    reference D_ref uses this count (:func:`reference_tokens`); the law's N_once / N_rec exclude norms.
    """
    d = cfg.width
    reuse = cfg.r if reuse is None else reuse
    once = N_once(cfg) + 2 * d * (cfg.n_prelude + cfg.n_coda) + d * (2 + int(cfg.is_looped))
    per_use = N_rec(cfg) + 2 * d * cfg.n_recur
    return once + reuse * per_use


REF_DATA_RATIO = 10  # the paper's D_ref = 10 x the reference model's effective parameters


def reference_model(r: int, d_ref: int) -> ModelConfig:
    """The paper's architecture-matched lr reference at width ``d_ref`` (``build_reference_model`` in
    the paper's ``scripts/base_train.py``): 0+20+0 passthrough with one recurrence for r = 1, 2+4x4+2
    with the linear injection for r > 1. The head count does not enter any parameter count."""
    if r > 1:
        return ModelConfig(
            d_model=d_ref, head_dim=d_ref, L_eff=20, r=4, n_prelude=2, n_coda=2, injection="linear", vocab_size=1
        )
    return ModelConfig(
        d_model=d_ref,
        head_dim=d_ref,
        L_eff=20,
        r=1,
        n_prelude=0,
        n_coda=0,
        injection="passthrough",
        r1_looped=True,
        vocab_size=1,
    )


def reference_tokens(r: int, d_ref: int = 640) -> int:
    """D_ref of the matrix-lr data rule for a run with ``r`` recurrences (arXiv 2604.21106 §4, the
    paper's ``scripts/base_train.py``): 10 x the effective parameters of :func:`reference_model`,
    counted with the *training* run's r as the reuse count, so D_ref depends on r
    (9.83e8 / 6.06e8 / 1.016e9 / 1.835e9 for r = 1 / 2 / 4 / 8 at d_ref = 640)."""
    return REF_DATA_RATIO * effective_params(reference_model(r, d_ref), reuse=r)


# ---- FLOPs --------------------------------------------------------------------------------
def _block_flop_params(cfg: ModelConfig, norm_scales: bool = True) -> int:
    """A block's params as the paper's FLOP count sees them: its matrices plus its two norm scales."""
    return block_params(cfg) + (2 * cfg.width if norm_scales else 0)


def _once_flop_params(cfg: ModelConfig, norm_scales: bool = True) -> float:
    """Params run once per token in the FLOP count: prelude and coda blocks and the LM head (and a technique's
    once-per-token matmuls, as FLOPs / 2)."""
    once = _technique(cfg).flops_once / 2 if cfg.technique is not None else 0
    return (cfg.n_prelude + cfg.n_coda) * _block_flop_params(cfg, norm_scales) + N_head(cfg) + once


def _rec_matmul_params(cfg: ModelConfig, norm_scales: bool = True) -> float:
    """Per-recurrence 'equivalent params' of the recurrent stack (matmul FLOPs / 2 per token)."""
    d = cfg.width
    base = cfg.n_recur * _block_flop_params(cfg, norm_scales)
    if not cfg.is_looped:
        return base
    if cfg.technique is not None:
        return base + _technique(cfg).flops_rec / 2
    if cfg.injection == "linear":
        return base + 2 * d * d
    if cfg.injection == "hyperconnect":
        k = cfg.hc_lanes
        return base + (k * k + 2 * k) * d
    return base


def _attn_flops_per_layer(cfg: ModelConfig, context: int) -> int:
    """Forward attention FLOPs per token per layer: QK^T and AV, 2 h q T each."""
    return 4 * cfg.n_head * cfg.head_dim * context


def train_flops_per_token(cfg: ModelConfig, *, include_attention: bool = True, norm_scales: bool = True) -> float:
    """F: training (forward + backward) FLOPs per token (arXiv 2604.21106 §3, as the paper's code counts).

    ``norm_scales = False`` leaves out the blocks' norm scales: the matmul and attention FLOPs alone,
    what ``torch.utils.flop_counter`` sees (tests/test_flops.py).
    """
    once = _once_flop_params(cfg, norm_scales)
    rec = _rec_matmul_params(cfg, norm_scales)
    k = _technique(cfg).grad_recurrences if cfg.technique is not None else cfg.k_grad
    detached = cfg.r - k
    matmul = 6 * once + 6 * k * rec + 2 * detached * rec
    if not include_attention:
        return float(matmul)
    attn = _attn_flops_per_layer(cfg, cfg.seq_len)
    layers_full = cfg.n_prelude + cfg.n_coda + k * cfg.n_recur
    layers_detached = detached * cfg.n_recur
    return float(matmul + 3 * attn * layers_full + attn * layers_detached)


def inference_flops_per_token(cfg: ModelConfig, context: int | None = None) -> float:
    """Forward FLOPs per token at a given attention context (default: the training T)."""
    ctx = cfg.seq_len if context is None else context
    matmul = 2 * _once_flop_params(cfg) + 2 * cfg.r * _rec_matmul_params(cfg)
    return float(matmul + _attn_flops_per_layer(cfg, ctx) * cfg.L_eff)


def attention_share(cfg: ModelConfig) -> float:
    """Fraction of training FLOPs spent in attention (large at tiny widths and long T)."""
    total = train_flops_per_token(cfg)
    return 1.0 - train_flops_per_token(cfg, include_attention=False) / total


# ---- budgets -----------------------------------------------------------------------------
def tokens_for_budget(cfg: ModelConfig, budget: float) -> float:
    """D = C / F."""
    return budget / train_flops_per_token(cfg)


def steps_for_budget(cfg: ModelConfig, budget: float, tokens_per_step: int) -> int:
    """steps = round(C / (F * tokens_per_step))."""
    return round(budget / (train_flops_per_token(cfg) * tokens_per_step))


# ---- summary -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Accounting:
    """Every number `loopscale info` prints for one model, and what run results record."""

    layout: str
    r: int
    d_model: int
    n_head: int
    n_prelude: int
    n_recur: int
    n_coda: int
    N_once: int
    N_rec: int
    N_unique: int
    N_emb: int
    N_norm: int
    N_total: int
    flops_per_token: float
    inference_flops_per_token: float
    attention_share: float
    budget: float | None = None
    tokens: float | None = None
    tokens_per_param: float | None = None
    steps: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def account(cfg: ModelConfig, budget: float | None = None, tokens_per_step: int | None = None) -> Accounting:
    tokens = tokens_for_budget(cfg, budget) if budget else None
    steps = steps_for_budget(cfg, budget, tokens_per_step) if budget and tokens_per_step else None
    return Accounting(
        layout=cfg.layout,
        r=cfg.r,
        d_model=cfg.width,
        n_head=cfg.n_head,
        n_prelude=cfg.n_prelude,
        n_recur=cfg.n_recur,
        n_coda=cfg.n_coda,
        N_once=N_once(cfg),
        N_rec=N_rec(cfg),
        N_unique=N_unique(cfg),
        N_emb=N_emb(cfg),
        N_norm=N_norm(cfg),
        N_total=N_total(cfg),
        flops_per_token=train_flops_per_token(cfg),
        inference_flops_per_token=inference_flops_per_token(cfg),
        attention_share=attention_share(cfg),
        budget=budget,
        tokens=tokens,
        tokens_per_param=(tokens / N_unique(cfg)) if tokens else None,
        steps=steps,
    )
