"""Analytic training FLOPs agree with torch.utils.flop_counter on a real forward + backward.

The counter sees matmuls (linear layers, the injection, the LM head, the einsums of the lane
mixing) and, with SDPA forced to its math backend, the attention products QK^T and AV. It cannot
see elementwise work: RMSNorm, RoPE, softmax, squared ReLU, softcap and the hyper-connection
``beta * s`` broadcast (counted by the accounting as (K^2+2K)d, of which the counter sees K^2 d + K d).
On CPU the fused SDPA kernel is invisible to the counter, hence the math backend here.
"""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from loopscale import accounting as acc
from loopscale.config import ModelConfig
from loopscale.model import LoopedLM


def counted_train_flops_per_token(cfg: ModelConfig, B: int = 2) -> float:
    m = LoopedLM(cfg)
    x = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m.loss(x, x).backward()
    return counter.get_total_flops() / (B * cfg.seq_len)


CASES = [
    {"r": 1},
    {"r": 2},
    {"r": 4},
    {"r": 8},
    {"r": 8, "bptt_k": 4},
    {"r": 4, "bptt_k": 1},
    {"r": 4, "injection": "hyperconnect"},
    {"r": 8, "injection": "additive"},
    {"r": 1, "r1_looped": True},
]


@pytest.mark.parametrize("d_model", [32, 64])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_analytic_flops_match_flop_counter_within_2_percent(case: dict, d_model: int) -> None:
    cfg = ModelConfig(d_model=d_model, head_dim=16, L_eff=12, seq_len=32, vocab_size=256, **case)
    analytic = acc.train_flops_per_token(cfg, norm_scales=False)
    counted = counted_train_flops_per_token(cfg)
    assert counted == pytest.approx(analytic, rel=0.02)
    if case.get("injection") != "hyperconnect":  # the counter cannot see the lanes' elementwise beta (x) s
        assert counted == pytest.approx(analytic, rel=1e-9)
    # the paper's convention adds the blocks' norm scales as 2 d params per block use
    uses = cfg.n_prelude + cfg.n_coda + cfg.n_recur * cfg.k_grad
    extra = 6 * 2 * d_model * uses + 2 * 2 * d_model * cfg.n_recur * (cfg.r - cfg.k_grad)
    assert acc.train_flops_per_token(cfg) - analytic == pytest.approx(extra, rel=1e-12)


def test_attention_term_is_what_the_counter_sees_beyond_matmuls() -> None:
    cfg = ModelConfig(d_model=32, head_dim=16, L_eff=12, seq_len=64, vocab_size=256, r=4)
    total = counted_train_flops_per_token(cfg)
    matmul = acc.train_flops_per_token(cfg, include_attention=False, norm_scales=False)
    assert total - matmul == pytest.approx(12 * cfg.n_head * cfg.head_dim * cfg.seq_len * cfg.L_eff, rel=1e-6)
