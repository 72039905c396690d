"""loopscale.optim: MuonH, AdamW groups, transfer rules, schedules, config errors (docs/optim.md)."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from torch import nn

from loopscale.accounting import reference_tokens
from loopscale.config import validate
from loopscale.config.optim import TOKENS_REF
from loopscale.errors import ConfigError
from loopscale.optim import (
    MuonH,
    OptimConfig,
    build_optimizers,
    cosine,
    linear_decay,
    lr_schedule,
    newton_schulz5,
    orthogonalize,
    resolve_lrs,
    transfer_factors,
    wsd,
)
from loopscale.optim.muonh import POLAR_EXPRESS_COEFFS

PAPER_LRS = {"matrix": 0.014, "embed": 0.3, "head": 0.004, "norm": 0.005, "scalar": 0.01}
REF = {"d_model": 640, "tokens_per_step": 2**18, "total_tokens": reference_tokens(1), "r": 1}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny problems run fastest (and politest on a shared machine) on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Tiny(nn.Module):
    """All five parameter groups, with same-shape matrices (batched NS) and a tall one (transposed NS)."""

    def __init__(self, vocab: int = 16, d: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.a = nn.Linear(d, d, bias=False)
        self.b = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 4 * d, bias=False)  # weight is tall: 32 x 8
        self.down = nn.Linear(4 * d, d, bias=False)
        self.norm = nn.Parameter(torch.ones(d))
        self.gate = nn.Parameter(torch.full((2,), 0.5))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        x = x + self.b(torch.tanh(self.a(x))) * self.gate[0]
        x = x + self.down(torch.relu(self.up(x * self.norm))) * self.gate[1]
        return self.head(x)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {
            "matrix": [self.a.weight, self.b.weight, self.up.weight, self.down.weight],
            "embed": [self.embed.weight],
            "head": [self.head.weight],
            "norm": [self.norm],
            "scalar": [self.gate],
        }


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (4, 12), generator=g), torch.randint(0, 16, (4, 12), generator=g)


def _train(model: Tiny, opt, steps: range, total: int) -> None:
    for step in steps:
        opt.set_lr_for_step(step, total)
        x, y = _batch(step)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _build(model: Tiny, **cfg) -> object:
    return build_optimizers(
        model.param_groups(), OptimConfig(**cfg), d_model=8, tokens_per_step=48, total_tokens=48 * 30, r=2
    )


# ---- MuonH -------------------------------------------------------------------------------------------
def test_muonh_keeps_each_matrix_on_the_sphere_of_its_initial_norm():
    torch.manual_seed(0)
    ws = [nn.Parameter(torch.randn(*s) * 0.1) for s in [(8, 8), (8, 8), (32, 8), (8, 32), (5, 7)]]
    rho = [w.detach().norm().item() for w in ws]
    opt = MuonH(ws, lr=0.05)
    for _ in range(100):
        for w in ws:
            w.grad = torch.randn_like(w)
        opt.step()
    for w, r in zip(ws, rho, strict=True):
        assert w.detach().norm().item() == pytest.approx(r, rel=1e-5)


def test_muonh_step_moves_each_matrix_by_the_learning_rate_in_angle():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(16, 24))
    before = w.detach().clone()
    opt = MuonH([w], lr=0.02, momentum=0.0)
    w.grad = torch.randn_like(w)
    opt.step()
    cos = (before * w.detach()).sum() / (before.norm() * w.detach().norm())
    assert math.acos(min(cos.item(), 1.0)) == pytest.approx(math.atan(0.02), rel=0.05)


def test_newton_schulz5_output_is_close_to_orthogonal():
    torch.manual_seed(0)
    mats = [torch.randn(*s) for s in [(32, 96), (96, 32), (64, 256), (16, 48)]]
    u, _ = torch.linalg.qr(torch.randn(64, 64))
    v, _ = torch.linalg.qr(torch.randn(64, 64))
    mats.append(u @ torch.diag(torch.logspace(-2, 0, 64)) @ v.T)  # square, condition number 100
    for g in mats:
        o = newton_schulz5(g)
        assert o.shape == g.shape and o.dtype == g.dtype
        s = torch.linalg.svdvals(o)
        assert s.min().item() >= 0.65 and s.max().item() <= 1.25, (tuple(g.shape), s.min(), s.max())


def test_newton_schulz5_batches_same_shape_matrices_like_one_at_a_time():
    torch.manual_seed(0)
    g = torch.randn(3, 24, 40)
    batched = newton_schulz5(g)
    for i in range(3):
        torch.testing.assert_close(batched[i], newton_schulz5(g[i]), atol=1e-5, rtol=1e-5)


def test_polar_express_maps_singular_values_closer_to_one_than_ns5_in_fp32_and_bf16():
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(64, 64))
    v, _ = torch.linalg.qr(torch.randn(64, 64))
    mats = [torch.randn(*s) for s in [(32, 96), (96, 32), (16, 48)]]
    mats.append(u @ torch.diag(torch.logspace(-2, 0, 64)) @ v.T)
    for g in mats:
        for dtype in (torch.float32, torch.bfloat16):
            o = orthogonalize(g, dtype=dtype)
            assert o.dtype == dtype and o.shape == g.shape
            s = torch.linalg.svdvals(o.float())
            assert s.min().item() >= 0.8 and s.max().item() <= 1.2, (tuple(g.shape), dtype, s.min(), s.max())
        ns5 = torch.linalg.svdvals(newton_schulz5(g))
        pe = torch.linalg.svdvals(orthogonalize(g))
        assert (pe - 1).abs().max() < (ns5 - 1).abs().max()


def test_polar_express_has_coefficients_for_at_most_five_steps():
    with pytest.raises(ValueError, match=r"1\.\.5 steps"):
        orthogonalize(torch.randn(4, 4), steps=6)
    with pytest.raises(ConfigError, match="at most 5"):
        validate(OptimConfig, {"ns_steps": 6})
    assert OptimConfig(ns_steps=6, orthogonalizer="ns5").ns_steps == 6


def test_muonh_step_in_bfloat16_equals_the_paper_codes_update_arithmetic():
    """The paper's muon_step_fused: Nesterov, bf16 Polar Express, scale to rho and step in bf16, re-project."""
    torch.manual_seed(0)
    w0 = torch.randn(24, 8) * 0.3
    grads = [torch.randn(24, 8) for _ in range(3)]
    w = nn.Parameter(w0.clone())
    opt = MuonH([w], lr=0.014, ns_dtype="bfloat16")
    ref, buf, rho = w0.clone().unsqueeze(0), torch.zeros(1, 24, 8), w0.norm(dim=(-2, -1), keepdim=True)
    for g in grads:
        w.grad = g.clone()
        opt.step()
        gg = g.clone().unsqueeze(0)
        buf.lerp_(gg, 1 - 0.95)
        X = gg.lerp_(buf, 0.95).bfloat16()
        X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)
        for a, b, c in POLAR_EXPRESS_COEFFS:  # tall: the paper multiplies on the right
            A = X.mT @ X
            X = a * X + X @ (b * A + c * (A @ A))
        X = X * (rho.bfloat16() / X.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))
        ref.sub_(torch.tensor(0.014).bfloat16() * X)
        ref.mul_(rho / ref.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))
    torch.testing.assert_close(w.detach(), ref[0], atol=2e-6, rtol=0)


def test_newton_schulz5_computes_in_the_requested_dtype_and_returns_the_input_dtype():
    torch.manual_seed(0)
    g = torch.randn(16, 32)
    o = newton_schulz5(g, dtype=torch.bfloat16)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o, newton_schulz5(g), atol=0.05, rtol=0.05)


def test_muonh_beats_tuned_sgd_on_an_ill_conditioned_regression():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(256, 32, generator=g) * torch.logspace(0, -1.5, 32)
    W0 = torch.randn(16, 32, generator=g) / 32**0.5
    A = torch.randn(16, 32, generator=g)
    Y = X @ (A / A.norm() * W0.norm()).T  # the target lies on the sphere MuonH keeps W on

    def final_loss(make_opt, lr: float, steps: int = 100) -> float:
        w = nn.Parameter(W0.clone())
        opt = make_opt([w], lr)
        for t in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr * linear_decay(t, steps)
            opt.zero_grad()
            ((X @ w.T - Y) ** 2).mean().backward()
            opt.step()
        return ((X @ w.T - Y) ** 2).mean().item()

    start = ((X @ W0.T - Y) ** 2).mean().item()
    muonh = final_loss(lambda p, lr: MuonH(p, lr=lr), 0.1)
    sgd = [final_loss(lambda p, lr: torch.optim.SGD(p, lr=lr), lr) for lr in (1.0, 3.0, 10.0, 20.0, 30.0)]
    best_sgd = min(v for v in sgd if math.isfinite(v))
    assert muonh < 1e-3 * start
    assert muonh <= best_sgd


def test_muonh_rejects_non_matrix_parameters_and_zero_norm_matrices():
    with pytest.raises(ValueError, match="2-D"):
        MuonH([nn.Parameter(torch.ones(4))])
    with pytest.raises(ValueError, match="zero Frobenius norm"):
        MuonH([nn.Parameter(torch.zeros(4, 4))])


# ---- resume ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["muonh", "adamw"])
def test_state_dict_round_trip_continues_a_bitwise_identical_trajectory(name):
    torch.manual_seed(0)
    model = Tiny()
    opt = _build(model, name=name, grad_clip=1.0)
    _train(model, opt, range(10), 30)
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    _train(model, opt, range(10, 20), 30)

    torch.manual_seed(123)  # rebuilt on other weights: the stored initial norms must win
    resumed = Tiny()
    opt2 = _build(resumed, name=name, grad_clip=1.0)
    resumed.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    _train(resumed, opt2, range(10, 20), 30)
    for (k, a), b in zip(model.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_loading_state_for_another_optimiser_kind_is_an_error():
    torch.manual_seed(0)
    sd = _build(Tiny(), name="adamw").state_dict()
    with pytest.raises(ValueError, match="optimiser state is for"):
        _build(Tiny(), name="muonh").load_state_dict(sd)


# ---- builder -----------------------------------------------------------------------------------------
def test_muonh_builder_puts_matrices_in_muonh_and_the_rest_in_adamw_with_the_paper_settings():
    torch.manual_seed(0)
    model = Tiny()
    opt = build_optimizers(model.param_groups(), OptimConfig(), **REF)
    muon, adamw = opt.optimizers
    assert isinstance(muon, MuonH) and isinstance(adamw, torch.optim.AdamW)
    assert [g["name"] for g in muon.param_groups] == ["matrix"]
    assert [g["name"] for g in adamw.param_groups] == ["embed", "head", "norm", "scalar"]
    for g in adamw.param_groups:
        assert g["betas"] == (0.8, 0.95) and g["eps"] == 1e-10 and g["weight_decay"] == 0.0
    assert opt.base_lrs == pytest.approx(PAPER_LRS)
    assert muon.param_groups[0]["momentum"] == 0.95 and muon.param_groups[0]["ns_steps"] == 5


def test_set_lr_applies_the_multiplier_to_every_group_base_lr():
    torch.manual_seed(0)
    opt = build_optimizers(Tiny().param_groups(), OptimConfig(), **REF)
    opt.set_lr(0.5)
    assert opt.lrs == pytest.approx({k: 0.5 * v for k, v in PAPER_LRS.items()})
    assert opt.set_lr_for_step(99, 100) == pytest.approx(0.109)
    assert opt.lrs == pytest.approx({k: 0.109 * v for k, v in PAPER_LRS.items()})


def test_plain_adamw_trains_every_group_with_one_optimiser():
    torch.manual_seed(0)
    model = Tiny()
    opt = _build(model, name="adamw", transfer=False)
    assert len(opt.optimizers) == 1 and isinstance(opt.optimizers[0], torch.optim.AdamW)
    assert opt.base_lrs == pytest.approx({**PAPER_LRS, "matrix": 0.003})
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(0)
    loss0 = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    _train(model, opt, range(30), 30)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() < loss0


def test_plain_adamw_single_lr_gives_every_group_adamw_lr():
    opt = build_optimizers(
        Tiny().param_groups(), OptimConfig(name="adamw", adamw_single_lr=True, adamw_lr=1e-3, transfer=False), **REF
    )
    assert set(opt.base_lrs.values()) == {1e-3}


def test_grad_clip_bounds_the_global_gradient_norm_and_returns_the_unclipped_norm():
    torch.manual_seed(0)
    model = Tiny()
    opt = _build(model, grad_clip=1e-3)
    x, y = _batch(0)
    nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    norm = opt.step()
    assert norm == pytest.approx(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert clipped.item() == pytest.approx(1e-3, rel=1e-3)
    assert _build(Tiny()).step() is None  # no clipping configured: nothing computed


def test_builder_accepts_empty_groups_and_rejects_unknown_or_duplicated_parameters():
    torch.manual_seed(0)
    model = Tiny()
    groups = {"matrix": model.param_groups()["matrix"], "embed": [], "head": [], "norm": [], "scalar": []}
    assert len(build_optimizers(groups, OptimConfig(), **REF).optimizers) == 1
    with pytest.raises(ValueError, match="unknown group"):
        build_optimizers({"matrices": []}, OptimConfig(), **REF)
    tied = {**groups, "head": [model.embed.weight], "embed": [model.embed.weight]}
    with pytest.raises(ValueError, match="appears twice"):
        build_optimizers(tied, OptimConfig(), **REF)


# ---- transfer rules ----------------------------------------------------------------------------------
def test_transfer_gives_the_paper_lrs_at_the_reference_point():
    assert resolve_lrs(OptimConfig(), **REF) == pytest.approx(PAPER_LRS, rel=1e-12)


def test_transfer_scales_with_the_paper_exponents():
    cfg = OptimConfig()
    base = resolve_lrs(cfg, **REF)
    wide = resolve_lrs(cfg, **{**REF, "d_model": 4 * 640})
    big_batch = resolve_lrs(cfg, **{**REF, "tokens_per_step": 2**20})
    long = resolve_lrs(cfg, **{**REF, "total_tokens": 10 * REF["total_tokens"]})
    for k in PAPER_LRS:
        assert wide[k] / base[k] == pytest.approx(1.0 if k == "matrix" else 4**-0.5)
        assert big_batch[k] / base[k] == pytest.approx(4**0.558 if k in ("matrix", "embed", "head") else 1.0)
        assert long[k] / base[k] == pytest.approx(10**-0.32 if k == "matrix" else 1.0)
    f = transfer_factors(cfg, d_model=1280, tokens_per_step=2**17, total_tokens=2 * reference_tokens(4), r=4)
    assert f == pytest.approx({"width": 2**-0.5, "batch": 2**-0.558, "data": 2**-0.32})


def test_the_paper_batch_scales_neither_norm_nor_lane_scalar_lrs():
    half = resolve_lrs(OptimConfig(), **{**REF, "tokens_per_step": 2**17})
    assert half["norm"] == pytest.approx(0.005) and half["scalar"] == pytest.approx(0.01)
    assert half["embed"] == pytest.approx(0.3 * 2**-0.558)


def test_the_data_rule_reference_depends_on_r_as_in_the_papers_code():
    # 10 x effective params of the s = 10 reference (0+20+0 passthrough / 2+4x4+2 linear) with the run's r
    assert [reference_tokens(r) for r in (1, 2, 4, 8)] == [983315200, 606380800, 1016083200, 1835488000]
    D = 5e8
    per_r = {r: resolve_lrs(OptimConfig(), **{**REF, "total_tokens": D, "r": r})["matrix"] for r in (1, 2, 4, 8)}
    for r, lr in per_r.items():
        assert lr == pytest.approx(0.014 * (D / reference_tokens(r)) ** -0.32)
    fixed = {
        r: resolve_lrs(OptimConfig(tokens_ref=TOKENS_REF), **{**REF, "total_tokens": D, "r": r})["matrix"]
        for r in (1, 2, 4, 8)
    }
    assert len(set(fixed.values())) == 1 and fixed[1] == pytest.approx(0.014 * (D / TOKENS_REF) ** -0.32)


def test_transfer_off_applies_only_lr_scale_and_d_ref_is_configurable():
    off = resolve_lrs(OptimConfig(transfer=False, lr_scale=2.0), d_model=64, tokens_per_step=8, total_tokens=1e3, r=4)
    assert off == pytest.approx({k: 2 * v for k, v in PAPER_LRS.items()})
    moved = resolve_lrs(
        OptimConfig(tokens_ref=1e9, d_ref=128), d_model=128, tokens_per_step=2**18, total_tokens=1e9, r=2
    )
    assert moved == pytest.approx(PAPER_LRS)


def test_plain_adamw_matrix_lr_takes_the_width_and_data_rules():
    cfg = OptimConfig(name="adamw")
    base = resolve_lrs(cfg, **REF)
    moved = resolve_lrs(cfg, **{**REF, "d_model": 2560, "total_tokens": 10 * REF["total_tokens"]})
    assert moved["matrix"] / base["matrix"] == pytest.approx(4**-0.5 * 10**-0.32)


def test_transfer_rejects_non_positive_run_sizes():
    with pytest.raises(ConfigError, match="tokens_per_step"):
        resolve_lrs(OptimConfig(), d_model=640, tokens_per_step=0, total_tokens=1e9, r=1)
    with pytest.raises(ConfigError, match="tokens_ref"):
        validate(OptimConfig, {"tokens_ref": -1.0})


# ---- schedules ---------------------------------------------------------------------------------------
def test_linear_decay_is_the_paper_codes_multiplier_reaching_final_frac_one_step_past_the_end():
    # scripts/base_train.py get_lr_multiplier with warmdown_ratio 1: p + (1 - p) 0.1, p = (N - it) / N
    for n in (1, 7, 100):
        for it in range(n):
            p = (n - it) / n
            assert linear_decay(it, n) == pytest.approx(p + (1 - p) * 0.1, abs=1e-15)
    assert linear_decay(99, 100) == pytest.approx(0.109)  # the last trained step
    assert linear_decay(150, 100) == pytest.approx(0.1)  # stays at the floor past the end
    assert linear_decay(0, 1) == 1.0


def test_cosine_warms_up_then_falls_to_its_floor():
    vals = [cosine(s, 100, final_lr_frac=0.05, warmup_frac=0.1) for s in range(100)]
    assert vals[0] == pytest.approx(0.1) and vals[9] == 1.0
    assert all(a < b for a, b in itertools.pairwise(vals[:10]))
    assert all(a >= b for a, b in itertools.pairwise(vals[9:]))
    assert vals[-1] == pytest.approx(0.05, abs=1e-3) and vals[-1] > 0.05
    assert cosine(100, 100, final_lr_frac=0.05, warmup_frac=0.1) == pytest.approx(0.05)
    mid = 10 + (100 - 10) / 2
    assert cosine(mid, 100, final_lr_frac=0.05, warmup_frac=0.1) == pytest.approx(0.525)


def test_wsd_is_flat_then_decays_linearly_over_its_decay_fraction():
    vals = [wsd(s, 101, decay_frac=0.2) for s in range(101)]  # the paper's warmdown: round(0.2 * 101) = 20
    assert vals[:82] == [1.0] * 82
    assert vals[91] == pytest.approx(0.55) and vals[100] == pytest.approx(0.1 + 0.9 / 20)
    assert [wsd(s, 50, decay_frac=1.0) for s in range(50)] == pytest.approx([linear_decay(s, 50) for s in range(50)])


def test_lr_schedule_picks_the_configured_shape():
    assert lr_schedule(OptimConfig())(99, 100) == pytest.approx(0.109)
    assert lr_schedule(OptimConfig(schedule="wsd", decay_frac=0.5))(10, 101) == 1.0
    assert lr_schedule(OptimConfig(schedule="cosine", final_lr_frac=0.0))(100, 100) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="total_steps"):
        linear_decay(0, 0)


# ---- config errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"schedule": "exponential"}, "schedule"),
        ({"matrix_lr": -0.01}, "matrix_lr"),
        ({"lr": 0.1}, "lr"),
        ({"name": "sgd"}, "name"),
        ({"betas": [0.9, 1.5]}, "betas[1]"),
        ({"schedule": "wsd", "warmup_frac": 0.5, "decay_frac": 0.6}, "decay_frac"),
        ({"grad_clip": 0.0}, "grad_clip"),
        ({"warmup_frac": 1.0}, "warmup_frac"),
        ({"tokens_ref": "paper"}, "tokens_ref"),
        ({"tokens_ref": -1.0}, "tokens_ref"),
        ({"orthogonalizer": "ns7"}, "orthogonalizer"),
    ],
)
def test_bad_configs_raise_one_line_config_errors_naming_the_field(data, field):
    with pytest.raises(ConfigError) as err:
        validate(OptimConfig, data, prefix="optim")
    assert err.value.field == f"optim.{field}"
    assert "\n" not in str(err.value)


# ---- sharded orthogonalisation under torch.distributed -------------------------------------------------
SHARD_SHAPES = [(8, 8)] * 3 + [(32, 8), (8, 32)] * 2 + [(5, 7)]  # buckets of 3, 4 and 1 matrices


def _shard_run(shard: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    ws = [nn.Parameter(torch.randn(*s) * 0.3) for s in SHARD_SHAPES]
    opt = MuonH(ws, lr=0.02, shard=shard)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for w in ws:
            w.grad = torch.randn(w.shape, generator=g)
        opt.step()
    return [w.detach().clone() for w in ws]


def _shard_worker(rank: int, world: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        torch.save({"sharded": _shard_run(True), "every_rank": _shard_run(False)}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_sharded_orthogonalisation_gives_every_rank_the_same_weights_as_one_process(tmp_path) -> None:
    from conftest import spawn_ranks

    spawn_ranks(_shard_worker, 2, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{k}.pt") for k in (0, 1))
    single = _shard_run(True)  # no process group: the ordinary path
    for a, b, c, d, ref in zip(r0["sharded"], r1["sharded"], r0["every_rank"], r1["every_rank"], single, strict=True):
        assert torch.equal(a, b)  # each matrix has one owner: the ranks agree bit for bit
        assert torch.equal(c, d) and torch.equal(c, ref)  # shard = False: every rank as one process
        torch.testing.assert_close(a, ref, atol=1e-6, rtol=0)  # sharding only regroups the batched matmuls
