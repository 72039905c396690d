"""Accounting against the paper's fixtures (arXiv 2604.21106 §3)."""

import pytest

from loopscale import accounting as acc
from loopscale import grids
from loopscale.config import ModelConfig, validate
from loopscale.errors import ConfigError

TABLE6 = {  # s: N in millions for r = 1, 2, 4, 8 (paper Table 6)
    6: (35.4, 21.5, 14.5, 10.9),
    10: (98.3, 59.8, 40.2, 30.3),
    20: (393.3, 239.2, 160.6, 121.3),
    34: (1136.5, 691.4, 464.1, 350.4),
}


def paper(s: int, r: int, **kw) -> ModelConfig:
    return ModelConfig(**{**grids.PAPER_MODEL, "s": s, "r": r, **kw})


@pytest.mark.parametrize("s", sorted(TABLE6))
def test_unique_params_match_table6_to_printed_precision(s: int) -> None:
    for r, expected in zip(grids.PAPER_R, TABLE6[s], strict=True):
        cfg = paper(s, r)
        assert round((acc.N_unique(cfg) + acc.N_norm(cfg)) / 1e6, 1) == expected


@pytest.mark.parametrize(("r", "coef"), [(1, 240), (2, 146), (4, 98), (8, 74)])
def test_law_params_are_the_papers_multiples_of_d_squared(r: int, coef: int) -> None:
    cfg = paper(10, r)
    assert acc.N_unique(cfg) == coef * cfg.width**2
    assert acc.N_once(cfg) == 4 * 12 * cfg.width**2


def test_flops_per_token_fixture_s10_r1() -> None:
    cfg = paper(10, 1)
    assert cfg.vocab_padded == 32064
    F = acc.train_flops_per_token(cfg)
    assert abs(F / 1.0275e9 - 1) < 5e-4
    assert F == 1_027_676_160  # the paper code's estimate_flops (block norm scales included)
    assert abs(acc.tokens_for_budget(cfg, 1e18) / 0.973e9 - 1) < 5e-4


@pytest.mark.parametrize("r", [2, 4, 8])
def test_injection_overhead_is_r_over_120_of_r1(r: int) -> None:
    base, looped = paper(10, 1), paper(10, r)
    extra = acc.train_flops_per_token(looped, include_attention=False) - acc.train_flops_per_token(
        base, include_attention=False
    )
    assert extra / (6 * acc.N_unique(base)) == pytest.approx(r / 120, rel=1e-12)
    # attention and LM head are identical across r: only the injection differs
    assert acc.train_flops_per_token(looped) - acc.train_flops_per_token(base) == pytest.approx(extra)


def test_truncated_bptt_charges_detached_recurrences_forward_only() -> None:
    full, trunc = paper(10, 8), paper(10, 8, bptt_k=4)
    rec = 2 * (12 * 640**2 + 2 * 640) + 2 * 640**2  # two recurrent blocks (with norm scales) + injection
    hqT = 5 * 128 * 2048
    detached_layers = 4 * 2  # r - k = 4 recurrences of 2 blocks
    saved = 4 * (6 - 2) * rec + detached_layers * (12 - 4) * hqT  # 6x->2x matmuls, 12hqT->4hqT attention
    assert acc.train_flops_per_token(full) - acc.train_flops_per_token(trunc) == pytest.approx(saved)


def test_hyperconnect_adds_lane_flops_and_scalars() -> None:
    lin, hc = paper(10, 4), paper(10, 4, injection="hyperconnect")
    d, K = 640, 2
    assert acc.N_rec(lin) - acc.N_rec(hc) == 2 * d * d - 4 * (K * K + 2 * K)
    delta = acc.train_flops_per_token(lin) - acc.train_flops_per_token(hc)
    assert delta == pytest.approx(6 * 4 * (2 * d * d - (K * K + 2 * K) * d))


def test_budget_gives_tokens_and_steps() -> None:
    cfg = paper(10, 4)
    F = acc.train_flops_per_token(cfg)
    assert acc.tokens_for_budget(cfg, 1e18) == pytest.approx(1e18 / F)
    assert acc.steps_for_budget(cfg, 1e18, 2**18) == round(1e18 / (F * 2**18))
    a = acc.account(cfg, budget=1e18, tokens_per_step=2**18)
    assert a.tokens_per_param == pytest.approx(a.tokens / a.N_unique)


def test_inference_flops_are_a_third_of_training_without_truncation() -> None:
    cfg = paper(10, 4)
    assert acc.inference_flops_per_token(cfg) * 3 == pytest.approx(acc.train_flops_per_token(cfg))


def test_paper_grid_has_116_runs_29_per_r() -> None:
    g = grids.paper_grid()
    assert len(g) == 116
    assert all(sum(1 for _, _, r in g if r == rr) == 29 for rr in grids.PAPER_R)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"d_model": 64, "head_dim": 16, "r": 3}, "model.r"),
        ({"d_model": 64, "head_dim": 24}, "model.head_dim"),
        ({"d_model": 64, "head_dim": 16, "r": 4, "injection": "hyperconnect", "bptt_k": 2}, "model.bptt_k"),
        ({"d_model": 0, "head_dim": 16}, "model.d_model"),
        ({"d_model": 64, "head_dim": 16, "L_eff": -1}, "model.L_eff"),
        ({"d_model": 64, "head_dim": 16, "injection": "gated"}, "model.injection"),
        ({"d_model": 64, "head_dim": 16, "bptt_k": 9, "r": 8}, "model.bptt_k"),
        ({"head_dim": 16}, "model.d_model"),
        ({"d_model": 64, "head_dim": 16, "widht": 3}, "model.widht"),
        ({"d_model": 64, "s": 2, "head_dim": 16}, "model.d_model"),
    ],
)
def test_bad_model_configs_fail_with_one_line_naming_the_field(bad: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(ModelConfig, bad, source="run.toml", prefix="model")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"run.toml: {field}:"), msg
