"""Compilation modes (train/compiling.py): the whole model in one graph, its per-block fallback, config."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from conftest import TINY_MODEL, spawn_ranks
from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model import LoopedLM
from loopscale.train.compiling import WholeModel, compile_for_training, resolved_mode, use_cache_dir
from loopscale.train.settings import RunConfig


def test_auto_compiles_the_whole_model_on_cuda_and_nothing_on_cpu() -> None:
    assert resolved_mode("auto", torch.device("cuda")) == "model"
    assert resolved_mode("auto", torch.device("cpu")) == "off"
    assert resolved_mode("blocks", torch.device("cpu")) == "blocks"


def test_compile_accepts_the_old_booleans_and_names_the_modes() -> None:
    assert RunConfig(compile=True).compile == "blocks" and RunConfig(compile=False).compile == "off"
    assert RunConfig().compile == "auto"
    with pytest.raises((ConfigError, ValueError)):
        RunConfig(compile="whole")


def _pair(**kw: object) -> tuple[LoopedLM, LoopedLM]:
    # 1 + 2 x 1 + 1 blocks, truncated BPTT (no_grad inside the graph); small, as inductor's C++ builds are slow
    cfg = ModelConfig(**{**TINY_MODEL, "L_eff": 4, "r": 2, "bptt_k": 1, **kw})
    model = LoopedLM(cfg)
    return model, copy.deepcopy(model)


@pytest.mark.long
def test_the_whole_compiled_model_matches_eager_loss_and_gradients(tmp_path, monkeypatch) -> None:
    use_cache_dir(tmp_path / "inductor")  # a fresh cache: this test compiles for real
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # scalar C++ kernels: what is tested is the graph (capture, truncated BPTT, the fused loss), not
    # inductor's SIMD codegen, and they build in about two thirds of the time
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "vec_isa_ok", False)
    eager, model = _pair()
    x = torch.randint(0, 257, (4, 64))
    y = torch.randint(0, 257, (4, 64))
    y[0, :7] = -1
    step, mode = compile_for_training(model, model.blocks(), "model", torch.device("cpu"))
    assert mode == "model" and isinstance(step, WholeModel)
    for _ in range(2):  # the second call runs the cached graph
        model.zero_grad()
        eager.zero_grad()
        loss, ref = step(x, y), eager(x, y)
        loss.backward()
        ref.backward()
        assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            scale = float(q.grad.abs().max())  # inductor reorders sums; errors grow toward the embedding
            assert float((p.grad - q.grad).abs().max()) <= 1e-2 * scale, name
    assert step.mode == "model" and any((tmp_path / "inductor").iterdir())


def test_a_failing_whole_model_compile_falls_back_to_blocks_with_a_warning(monkeypatch) -> None:
    def broken(gm, example_inputs):  # a backend that cannot compile this graph
        raise RuntimeError("no kernel for this graph")

    compiled_blocks: list[object] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled_blocks.append(self))
    eager, model = _pair()
    warnings: list[str] = []
    whole = WholeModel(model, model.blocks(), backend=broken, warn=warnings.append)
    x = torch.randint(0, 257, (2, 64))
    assert float(whole(x, x).detach()) == pytest.approx(float(eager(x, x).detach()), rel=1e-6)
    assert whole.mode == "blocks" and len(compiled_blocks) == len(list(model.blocks()))
    assert len(warnings) == 1 and "compiling each block instead" in warnings[0]
    assert "no kernel for this graph" in warnings[0]


def test_errors_after_the_first_compiled_call_propagate() -> None:
    _, model = _pair()
    whole = WholeModel(model, model.blocks(), backend=lambda gm, ex: gm)
    x = torch.randint(0, 257, (2, 64))
    whole(x, x)
    assert whole.mode == "model"
    with pytest.raises(ConfigError):  # a bad r is the caller's error, not a reason to stop compiling
        whole(x, x, r=0)
    assert whole.mode == "model"


# ---- DDP: the compiled wrapper under DistributedDataParallel with gradient accumulation ----------------
def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        _, model = _pair()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        # aot_eager: dynamo and AOTAutograd as inductor sees them (DDP's graph split, the fused loss's
        # autograd.Function), without inductor's slow C++ builds
        step, _ = compile_for_training(ddp, model.blocks(), "model", torch.device("cpu"), backend="aot_eager")
        xs = torch.randint(0, 257, (2 * world, 2, 65), generator=torch.Generator().manual_seed(1))
        for i in (0, 1):  # two micro-batches: the first without gradient sync, as the trainer runs them
            x = xs[rank * 2 + i]
            with ddp.no_sync() if i == 0 else contextlib.nullcontext():
                (step(x[:, :-1], x[:, 1:]) / 2).backward()
        assert step.mode == "model"
        torch.save({n: p.grad for n, p in model.named_parameters()}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.long
def test_the_whole_compiled_model_under_ddp_averages_gradients_like_one_process(tmp_path) -> None:
    spawn_ranks(_ddp_worker, 2, tmp_path)
    g0, g1 = (torch.load(tmp_path / f"rank{k}.pt") for k in (0, 1))
    torch.manual_seed(0)
    _, ref = _pair()
    xs = torch.randint(0, 257, (4, 2, 65), generator=torch.Generator().manual_seed(1))
    for x in xs:  # one process, all four micro-batches: the mean over ranks of each rank's mean
        (ref(x[:, :-1], x[:, 1:]) / 4).backward()
    for name, p in ref.named_parameters():
        assert torch.equal(g0[name], g1[name]), name  # every rank holds the same averaged gradient
        assert torch.allclose(g0[name], p.grad, rtol=1e-4, atol=1e-7), name
