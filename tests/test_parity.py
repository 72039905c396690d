"""Paper parity: loopscale reproduces numbers that the paper's own code computed (arXiv 2604.21106).

The fixtures in tests/fixtures/parity were written by ``dev/paper_parity.py`` from the paper's code
(github kschwethelm/looped-lm-scaling); no code of the paper is needed here. Tolerances:

- logits at identical weights: 2e-5 absolute (fp32 reassociation only; values are O(1));
- per-group learning rates: 1e-12 relative (float rounding only), on the tiny runs and the paper grid;
- FLOPs per token, D_ref, target tokens and the number of steps: exactly equal;
- losses of the first 8 optimiser steps and after them: twice the larger of the paper code's noise
  (measured where the fixtures were made) and loopscale's own on the machine that runs the test
  (``_tolerance``; 4.7e-4 to 8.7e-4 nats on an AVX-512 EPYC); every recipe deviation the issue tracker
  listed exceeds it by 3x to 27x in its most affected case there (``test_the_step_comparison_detects_...``
  asks for 1.5x on every CPU).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from loopscale import accounting
from loopscale.config import ModelConfig
from loopscale.model import LoopedLM
from loopscale.model.paper_compat import model_config_from_paper, state_dict_from_paper
from loopscale.optim import OptimConfig, build_optimizers
from loopscale.train.settings import RunConfig, TrainConfig

FIXTURES = Path(__file__).parent / "fixtures" / "parity"
CASES: dict[str, dict[str, Any]] = json.loads((FIXTURES / "cases.json").read_text())["cases"]
GRID: list[dict[str, Any]] = json.loads((FIXTURES / "grid.json").read_text())["runs"]
PARITY_OPTIM = OptimConfig(ns_dtype="bfloat16")  # the paper orthogonalises in bf16 on every device


def _case(name: str) -> tuple[dict[str, Any], ModelConfig, LoopedLM, torch.Tensor, torch.Tensor, torch.Tensor]:
    case = CASES[name]
    tensors = load_file(str(FIXTURES / f"{name}.safetensors"))
    weights = {k.removeprefix("weight/"): v.float() for k, v in tensors.items() if k.startswith("weight/")}
    cfg = ModelConfig(**model_config_from_paper(case["gpt_config"]))
    model = LoopedLM(cfg)
    model.load_state_dict(state_dict_from_paper(weights), strict=True)
    tokens = tensors["tokens"]
    return case, cfg, model, tokens[..., :-1], tokens[..., 1:], tensors["logits"]


def _train_config(cfg: ModelConfig, run: dict[str, Any], optim: OptimConfig = PARITY_OPTIM) -> TrainConfig:
    return TrainConfig(model=cfg, optim=optim, run=RunConfig(min_steps=1, **run))


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_at_identical_weights_match_the_papers_model(name: str) -> None:
    _, cfg, model, x, _, logits = _case(name)
    with torch.no_grad():
        got = model(x[0, :2])
    assert got.shape == logits.shape == (2, cfg.seq_len, cfg.vocab_size)  # sliced to the real vocabulary
    torch.testing.assert_close(got, logits, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_accounting_of_the_tiny_models_matches_the_papers_code(name: str) -> None:
    case, cfg, model, *_ = _case(name)
    assert accounting.reference_tokens(cfg.r) == case["D_ref"]
    assert accounting.train_flops_per_token(cfg) == case["flops_per_token"]
    assert sum(p.numel() for p in model.parameters()) == accounting.N_total(cfg)


def _first_steps(
    name: str, optim: OptimConfig, lr_factors: dict[str, float] | None = None, loss_scale: float = 1.0
) -> tuple[list[float], list[float], dict[str, float]]:
    """loopscale's first 8 steps on a case: losses (and the loss after them), lr multipliers, peak lrs.
    ``loss_scale`` multiplies the loss that is back-propagated (not the one reported)."""
    case, cfg, model, x, y, _ = _case(name)
    tcfg = _train_config(cfg, {"steps": case["steps"], "batch_size": case["rows"]}, optim)
    opt = build_optimizers(
        model.param_groups(),
        tcfg.optim,
        d_model=cfg.width,
        tokens_per_step=tcfg.tokens_per_step,
        total_tokens=tcfg.lr_tokens(),
        r=cfg.r,
    )
    for o in opt.optimizers:  # deliberate deviations, to show that the comparison can fail
        for g in o.param_groups:
            g["base_lr"] *= (lr_factors or {}).get(g["name"], 1.0)
    losses, mults = [], []
    for step in range(case["steps"]):
        mults.append(opt.set_lr_for_step(step, case["steps"]))
        loss = model(x[step], y[step])
        (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(model(x[-1], y[-1]).item())
    return losses, mults, opt.base_lrs


def _loss_gap(name: str, losses: list[float]) -> float:
    case = CASES[name]
    return max(abs(a - b) for a, b in zip(losses, [*case["losses"], case["loss_after"]], strict=True))


#: last-bit perturbations of the back-propagated loss: exactly the same updates in exact arithmetic
NOISE_SCALES = (1 + 2**-20, 1 - 2**-20, 1 + 2**-21, 1 + 2**-19)


@functools.cache
def _own_noise(name: str) -> float:
    """loopscale's run-to-run noise on this machine: the largest move of its 8-step losses when the loss is
    scaled by each of ``NOISE_SCALES`` (2.2e-4 to 3.9e-4 nats on an AVX-512 EPYC)."""
    losses = _first_steps(name, PARITY_OPTIM)[0]
    return max(
        max(abs(a - b) for a, b in zip(losses, _first_steps(name, PARITY_OPTIM, loss_scale=s)[0], strict=True))
        for s in NOISE_SCALES
    )


def _tolerance(name: str) -> float:
    """Twice the larger of two noises. The paper code's: its 8 steps rerun with the loss scaled by 1 + 2^-20
    move by ``self_noise`` (1.5e-4 to 4.4e-4 nats), because bf16 Polar Express amplifies last-bit differences
    in the gradients. And loopscale's on the machine that runs the test (``_own_noise``): the fixtures were
    made on an AVX2-only CPU, and on another CPU the bf16 GEMMs (oneDNN picks its kernels by instruction set:
    ``ONEDNN_MAX_CPU_ISA=AVX2`` moves r4's gap from 4.5e-4 to 3.2e-4 nats on an AVX-512 EPYC) differ from
    the fixture machine's in the last bits, which the same amplification carries into the losses."""
    return 2 * max(CASES[name]["self_noise"], _own_noise(name))


@pytest.mark.parametrize("name", sorted(CASES))
def test_first_eight_optimiser_steps_match_the_papers_losses_and_learning_rates(name: str) -> None:
    case = CASES[name]
    losses, mults, lrs = _first_steps(name, PARITY_OPTIM)
    assert lrs == pytest.approx(case["lrs"], rel=1e-12)
    assert mults == pytest.approx(case["lr_multipliers"], rel=1e-12)
    assert _loss_gap(name, losses) <= _tolerance(name)


BATCH_FACTOR = (4 * 16 / 2**18) ** 0.558  # the tiny runs' batch rule, (B / 2^18)^0.558
DEVIATIONS: dict[str, tuple[OptimConfig, dict[str, float]]] = {
    "ns5 instead of polar express": (OptimConfig(ns_dtype="bfloat16", orthogonalizer="ns5"), {}),
    "fixed D_ref for every r": (OptimConfig(ns_dtype="bfloat16", tokens_ref=4.5168e8), {}),
    "batch-scaled norm and lane lrs": (PARITY_OPTIM, {"norm": BATCH_FACTOR, "scalar": BATCH_FACTOR}),
    "matrix lr 5% high": (PARITY_OPTIM, {"matrix": 1.05}),
}


@pytest.mark.parametrize("deviation", sorted(DEVIATIONS))
def test_the_step_comparison_detects_recipe_deviations_the_papers_code_does_not_have(deviation: str) -> None:
    optim, factors = DEVIATIONS[deviation]
    gaps = {name: _loss_gap(name, _first_steps(name, optim, factors)[0]) / _tolerance(name) for name in CASES}
    assert max(gaps.values()) > 1.5, gaps  # outside the tolerance, by a margin, in at least one case


@pytest.mark.parametrize(
    "run", GRID, ids=lambda r: f"s{r['s']}-r{r['r']}-C{r['C']:.3g}-B{r['tokens_per_step']}-{r['probe']}"
)
def test_paper_grid_learning_rates_and_horizon_match_the_papers_code(run: dict[str, Any]) -> None:
    cfg = ModelConfig(**model_config_from_paper(run["gpt_config"]))
    tcfg = _train_config(cfg, {"budget": run["C"], "batch_size": run["tokens_per_step"] // cfg.seq_len}, OptimConfig())
    assert accounting.train_flops_per_token(cfg) == run["flops_per_token"]
    assert accounting.reference_tokens(cfg.r) == run["D_ref"]
    assert tcfg.lr_tokens() == run["target_tokens"]
    assert tcfg.total_steps() == run["num_iterations"]
    lrs = tcfg.lrs()
    assert {k: lrs[k] for k in run["lrs"]} == pytest.approx(run["lrs"], rel=1e-12)


def test_info_prints_the_learning_rates_the_papers_code_gives_a_paper_grid_run(capsys, tmp_path: Path) -> None:
    from loopscale.cli import run_app

    run = next(r for r in GRID if (r["s"], r["r"], r["C"], r["probe"]) == (20, 4, 2.15e19, "baseline"))
    assert run_app(["info", "--set", "model.s=20", "--set", "model.r=4", "--budget", "2.15e19", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["lrs"] == pytest.approx(run["lrs"] | {"scalar": row["lrs"]["scalar"]}, rel=1e-12)
    assert row["steps"] == run["num_iterations"] and row["D_ref"] == run["D_ref"]
    assert row["lr_tokens"] == run["target_tokens"]

    config = tmp_path / "run.toml"  # a training config: its own batch, lr_scale and length
    config.write_text(
        "[model]\nd_model = 64\nhead_dim = 16\nL_eff = 12\nr = 4\nseq_len = 128\nvocab_size = 257\n"
        "[optim]\nlr_scale = 10.0\n[run]\nbudget = 3e11\nbatch_size = 16\n"
    )
    assert run_app(["info", str(config)]) == 0
    out = capsys.readouterr().out
    assert "learning rates" in out and "2,048 tokens/step" in out
    tcfg = _train_config(
        ModelConfig(d_model=64, head_dim=16, L_eff=12, r=4, seq_len=128, vocab_size=257),
        {"budget": 3e11, "batch_size": 16},
        OptimConfig(lr_scale=10.0),
    )
    assert f"{tcfg.lrs()['matrix']:.6g}" in out
