"""The memory model (loopscale.memory) against what autograd saves and what a CPU step allocates.

Three measures, all on CPU: the bytes autograd saves for backward (unique storages through
``saved_tensors_hooks``); the peak of the bytes alive during a whole step (every storage an op creates
is counted until it is freed, through a dispatch mode); and the saved bytes at the paper's shapes
under FakeTensorMode, which allocates nothing. The model agrees to about 0.1 % on saved bytes and
1 % on peaks, far inside the 15 % the micro-batch choice needs.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from conftest import TINY_DATA, TINY_MODEL
from loopscale import accounting, memory
from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model import LoopedLM
from loopscale.optim import OptimConfig, build_optimizers
from loopscale.train import microbatch

TINY = {"d_model": 64, "head_dim": 16, "L_eff": 6, "n_prelude": 1, "n_coda": 1, "seq_len": 32, "vocab_size": 300}
CPU32 = memory.Regime("cpu", "float32")


def tiny(**kw: object) -> ModelConfig:
    return ModelConfig(**{**TINY, **kw})


def paper(s: int, r: int, **kw: object) -> ModelConfig:
    """A paper-grid model (L_eff 20, head_dim 128, T 2048, Llama-2 vocabulary; r = 1 as the 0+20+0 loop)."""
    layout = {"n_prelude": 2, "n_coda": 2, "injection": "linear"}
    if r == 1:
        layout = {"n_prelude": 0, "n_coda": 0, "injection": "passthrough", "r1_looped": True}
    return ModelConfig(s=s, head_dim=128, L_eff=20, r=r, vocab_size=32001, seq_len=2048, **{**layout, **kw})


def autocast(dtype: str) -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()


@contextlib.contextmanager
def saving(params: set[int], fake: bool = False) -> Iterator[dict[int, int]]:
    """Bytes of every storage autograd saves for backward (weights excluded), by storage."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        key = s._cdata if fake else s.data_ptr()  # fake storages have no address
        if key not in params:
            seen[key] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def saved_bytes(cfg: ModelConfig, rows: int, dtype: str = "float32", math: bool = False) -> int:
    model = LoopedLM(cfg)
    x = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len))
    sdpa = contextlib.nullcontext()
    if math:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        sdpa = sdpa_kernel(SDPBackend.MATH)
    with saving({p.untyped_storage().data_ptr() for p in model.parameters()}) as seen, autocast(dtype), sdpa:
        model(x, x)
    return sum(seen.values())


def predicted_saved(cfg: ModelConfig, rows: int, rg: memory.Regime) -> float:
    return rows * cfg.seq_len * memory.activation_bytes(cfg, rg) + memory.weight_copy_bytes(cfg, rg)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # CPU autocast's composite norm
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "kw",
    [
        {"r": 1},
        {"r": 4},
        {"r": 4, "bptt_k": 2},
        {"r": 2, "injection": "additive"},
        {"r": 4, "injection": "hyperconnect", "hc_lanes": 3},
        {"r": 2, "softcap": "none", "mlp_ratio": 2},
        {"r": 1, "r1_looped": True, "injection": "passthrough", "n_prelude": 0, "n_coda": 0},
    ],
    ids=str,
)
def test_activations_equal_what_autograd_saves_on_cpu(kw: dict, dtype: str) -> None:
    cfg = tiny(**kw)
    measured = saved_bytes(cfg, 3, dtype)
    assert predicted_saved(cfg, 3, memory.Regime("cpu", dtype)) == pytest.approx(measured, rel=0.01)


def test_math_attention_keeps_the_t_by_t_probabilities_instead() -> None:
    cfg = tiny(r=2, seq_len=64)
    measured = saved_bytes(cfg, 2, math=True)
    assert predicted_saved(cfg, 2, memory.Regime("cpu", "float32", "math")) == pytest.approx(measured, rel=0.01)
    assert measured > saved_bytes(cfg, 2)  # at T = 64 the probabilities outweigh the q/k/v output it drops


def fake_saved(cfg: ModelConfig, rows: int, policy: contextlib.AbstractContextManager) -> int:
    """Saved bytes at any size, with FakeTensorMode (shapes and dtypes only, nothing allocated)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = LoopedLM(cfg)
        x = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len))
        with saving({p.untyped_storage()._cdata for p in model.parameters()}, fake=True) as seen, policy:
            model(x, x)
    return sum(seen.values())


@pytest.mark.parametrize(("s", "r", "kw"), [(6, 1, {}), (34, 4, {"bptt_k": 2}), (10, 4, {"injection": "hyperconnect"})])
def test_paper_shapes_at_t_2048_with_fake_tensors(s: int, r: int, kw: dict) -> None:
    cfg = paper(s, r, **kw)
    assert predicted_saved(cfg, 2, CPU32) == pytest.approx(fake_saved(cfg, 2, contextlib.nullcontext()), rel=0.002)


class _FusedRMSNorm(torch.autograd.Function):
    """CUDA's fused rms_norm (pytorch/pytorch#153666): keeps its input and 1/rms, not x / rms."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, eps: float | None) -> torch.Tensor:  # type: ignore[override]
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + (eps or 1e-6))
        ctx.save_for_backward(x, rstd, weight)
        y = (x * rstd).to(x.dtype)
        return y * weight if weight is not None else y


class _CudaAutocastPolicy(torch.overrides.TorchFunctionMode):
    """What CUDA's autocast does beyond CPU's (autocast_mode.h, AT_FORALL_FP32): rms_norm and pow (so
    ``square``) run in fp32 while autocast is on. With CPU autocast's bf16 GEMMs and SDPA underneath, this
    is CUDA's policy; an rms_norm outside autocast (the model's QK-norm) keeps its input's dtype."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.rms_norm:
            weight = args[2] if len(args) > 2 else kwargs.get("weight")
            eps = args[3] if len(args) > 3 else kwargs.get("eps")
            x = args[0].float() if torch.is_autocast_enabled("cpu") else args[0]
            with torch.autocast("cpu", enabled=False):
                return _FusedRMSNorm.apply(x, weight, eps)
        if func in (torch.Tensor.square, torch.square):
            with torch.autocast("cpu", enabled=False):
                return args[0].float().pow(2)
        return func(*args, **kwargs)


@pytest.mark.parametrize(("s", "r", "kw"), [(6, 1, {}), (34, 4, {}), (18, 2, {"injection": "hyperconnect"})])
def test_cuda_bf16_prediction_equals_an_emulation_of_cudas_autocast_at_paper_shapes(s: int, r: int, kw: dict) -> None:
    """No GPU here: CPU bf16 autocast plus CUDA's extra fp32 ops, on fake tensors. It checks the bookkeeping
    (which casts autograd keeps, which tensors alias) under the policy the model assumes for CUDA."""
    cfg = paper(s, r, **kw)

    @contextlib.contextmanager
    def cuda_policy() -> Iterator[None]:
        with torch.autocast("cpu", dtype=torch.bfloat16), _CudaAutocastPolicy():
            yield

    measured = fake_saved(cfg, 2, cuda_policy())
    assert predicted_saved(cfg, 2, memory.regime("cuda")) == pytest.approx(measured, rel=0.002)


def test_cuda_prediction_against_the_reviewers_estimate_for_the_papers_widths() -> None:
    """The issue's estimate: 1530 d + 20 V_padded bytes per token and 10 bytes per parameter, at 128 x 2048,
    for the model as it was: plain loss path, QK-norm and the squared ReLU upcast by CUDA's autocast.

    That model, rebuilt from today's terms (the plain loss path with the reviewer's two extra terms: the
    composite norm's x / rms and the fp32 logits kept through backward, 4V; plus per block application
    the fp32 QK-norm input, +4d, and pow's fp32 copy of the hidden, +4md), reproduces the estimate within
    6 %. The shipped model (fused loss, bf16 QK-norm and square) needs 0.28-0.58 of it.
    """
    tokens = 128 * 2048
    for s in (6, 34):
        for r in (1, 4):
            cfg = paper(s, r)
            d, m = cfg.width, cfg.mlp_ratio
            reviewer = (1530 * d + 20 * cfg.vocab_padded) * tokens + 10 * accounting.N_total(cfg)
            plain = memory.Regime("cuda", "bfloat16", fused_norm=False, fused_loss=False)
            blocks, _ = memory.grad_applications(cfg)
            then = (
                memory.train_peak(cfg, 128, plain).total
                + 4 * cfg.vocab_size * tokens
                + blocks * (4 * d + 4 * m * d) * tokens
            )
            assert then == pytest.approx(reviewer, rel=0.06), (s, r)
            ours = memory.train_peak(cfg, 128, memory.regime("cuda")).total
            assert 0.28 < ours / reviewer < 0.58, (s, r, ours / reviewer)


def test_the_fused_loss_saves_most_at_small_widths() -> None:
    """At the paper's V = 32001 the plain loss path's 8V bytes per token outweigh the blocks at s = 6."""
    rg, plain = memory.regime("cuda"), memory.regime("cuda", fused_loss=False)
    small, large = paper(6, 4), paper(34, 4)
    assert memory.train_peak(small, 32, plain).total > 2 * memory.train_peak(small, 32, rg).total
    assert memory.train_peak(large, 8, plain).total > 1.1 * memory.train_peak(large, 8, rg).total


def test_papers_smallest_and_largest_width_fit_an_80gb_gpu_in_micro_batches() -> None:
    limit = memory.usable_memory(80e9)
    rg = memory.regime("cuda")

    def micro(cfg: ModelConfig) -> int | None:
        return memory.largest_fitting(128, limit, lambda k: memory.train_peak(cfg, k, rg, accumulate=k < 128))

    assert micro(paper(6, 1)) == 64 and micro(paper(6, 8)) == 64
    assert micro(paper(34, 1)) == 8 and micro(paper(34, 4)) == 8
    assert memory.train_peak(paper(34, 1), 8, rg).total == pytest.approx(53.1e9, rel=0.01)
    assert memory.train_peak(paper(6, 1), 128, rg).total > 90e9  # all rows at once: the OOM


# ---- a whole step on CPU --------------------------------------------------------------------
class LiveBytes(TorchDispatchMode):
    """Bytes of the storages ops create while the mode is on, counted until freed; their peak."""

    def __init__(self, external: set[int]) -> None:
        super().__init__()
        self.external, self.alive, self.live, self.peak = external, {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                p = s.data_ptr()
                if p in self.external or p in self.alive or not s.nbytes():
                    continue
                self.alive[p] = s.nbytes()
                self.live += s.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(s, self._free, p)
        return out

    def _free(self, p: int) -> None:
        self.live -= self.alive.pop(p, 0)


def _storages(tensors: list[torch.Tensor]) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def _setup(cfg: ModelConfig, rows: int, n_micro: int, dtype: str) -> tuple:
    """A model and its optimisers after one step (so the optimiser state exists, as in steady state)."""
    model = LoopedLM(cfg)
    opt = build_optimizers(
        model.param_groups(),
        OptimConfig(transfer=False),
        d_model=cfg.width,
        tokens_per_step=rows * n_micro * cfg.seq_len,
        total_tokens=1e9,
        r=cfg.r,
    )
    xs = [torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len + 1)) for _ in range(n_micro)]

    def step() -> None:
        for x in xs:
            with autocast(dtype):
                loss = model(x[:, :-1], x[:, 1:])
            (loss / n_micro).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    state = [v for o in opt.optimizers for st in o.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return model, step, xs, _storages([*model.parameters(), *state, *xs])


@pytest.mark.parametrize(
    ("kw", "rows", "n_micro", "dtype"),
    [
        ({"r": 2, "vocab_size": 1000}, 4, 2, "float32"),  # peaks in log-softmax's backward, grads of micro-batch 1 live
        ({"r": 4, "injection": "hyperconnect", "d_model": 128, "vocab_size": 64}, 8, 1, "float32"),  # squared-ReLU's
        ({"r": 1, "d_model": 128, "vocab_size": 64}, 4, 2, "bfloat16"),  # peaks in MuonH's orthogonalisation
        ({"r": 2}, 8, 1, "bfloat16"),
    ],
    ids=str,
)
def test_training_step_peak_on_cpu(kw: dict, rows: int, n_micro: int, dtype: str) -> None:
    cfg = tiny(**kw)
    _, step, _, external = _setup(cfg, rows, n_micro, dtype)
    mode = LiveBytes(set(external))
    with mode:
        step()
    measured = sum(external.values()) + mode.peak
    predicted = memory.train_peak(cfg, rows, memory.Regime("cpu", dtype), accumulate=n_micro > 1).total
    assert predicted == pytest.approx(measured, rel=0.02)


def test_live_bytes_agree_with_the_profilers_memory_timeline() -> None:
    """The dispatch-mode measure is the allocator's view: torch.profiler's memory timeline (a private API,
    hence the skip) records every CPU allocation and free, and its peak is the same to a few bytes."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfileTimeline
    except ImportError:
        pytest.skip("no torch.profiler memory timeline")
    cfg = tiny(r=2, vocab_size=1000)
    _, step, _, external = _setup(cfg, 4, 2, "float32")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    mode = LiveBytes(set(external))
    with mode:
        step()
    assert max(sum(s) for s in sizes) == pytest.approx(sum(external.values()) + mode.peak, rel=1e-4)


@pytest.mark.parametrize(
    ("kw", "dtype"),
    [
        ({"r": 2, "vocab_size": 1000}, "float32"),
        ({"r": 1, "d_model": 128, "vocab_size": 64}, "float32"),
        ({"r": 2, "vocab_size": 1000}, "bfloat16"),
        ({"r": 4, "d_model": 128, "vocab_size": 64}, "float32"),
    ],
)
def test_validation_peak_on_cpu(kw: dict, dtype: str) -> None:
    cfg = tiny(**kw)
    model, _, xs, external = _setup(cfg, 8, 1, dtype)
    mode = LiveBytes(set(external))
    with mode, torch.no_grad(), autocast(dtype):
        model(xs[0][:, :-1], xs[0][:, 1:], reduction="none")
    predicted = memory.eval_peak(cfg, 8, memory.Regime("cpu", dtype)).total
    assert predicted == pytest.approx(sum(external.values()) + mode.peak, rel=0.03)


# ---- choosing micro-batches -------------------------------------------------------------------
def _run_cfg(*overrides: str, batch: int = 8):
    from loopscale.train import load_train_config

    sets = [f"model.{k}={v}" for k, v in TINY_MODEL.items()] + ["model.r=2", f"run.batch_size={batch}"]
    sets += [f"data.real_text_bytes={TINY_DATA['real_text_bytes']}"]
    sets += [f"data.world.{k}={v}" for k, v in TINY_DATA["world"].items()]
    sets += [
        "run.steps=6",
        "run.threads=1",
        "run.val_tokens=4096",
        "run.log_every=3",
        "run.min_steps=2",
        "optim.transfer=false",
        *overrides,
    ]
    return load_train_config(None, sets)


def test_micro_batch_accepts_auto_and_explains_bad_values() -> None:
    assert _run_cfg("run.micro_batch=auto").run.micro_batch == "auto"
    assert _run_cfg("run.micro_batch=4").run.micro_batch == 4
    with pytest.raises(ConfigError, match=r'run\.micro_batch: expected a positive number of rows or "auto"'):
        _run_cfg("run.micro_batch=most")


def test_auto_takes_the_largest_divisor_that_fits_and_validation_takes_more() -> None:
    cfg = _run_cfg("run.micro_batch=auto", batch=16)
    rg = memory.regime("cpu")
    between = (memory.train_peak(cfg.model, 4, rg).total + memory.train_peak(cfg.model, 8, rg).total) / 2
    mb = microbatch.micro_batches(cfg, device="cpu", limit=between)
    assert (mb.train, mb.rows_per_process) == (4, 16) and mb.val >= 4 and mb.fits
    assert microbatch.micro_batches(cfg, device="cpu", limit=None).train == 16  # no limit known: every row
    assert microbatch.micro_batches(cfg, device="cpu", limit=1e3).train is None  # not one row
    assert microbatch.micro_batches(cfg, device="cpu", limit=between, world=2).rows_per_process == 8
    fixed = microbatch.micro_batches(_run_cfg("run.micro_batch=2", batch=16), device="cpu", limit=1e3)
    assert (fixed.train, fixed.val, fixed.fits) == (2, 2, False)  # an explicit value is kept, and flagged


def test_sizes_parse_in_decimal_and_binary_units() -> None:
    assert memory.parse_bytes("80GB") == 80 * 10**9 and memory.parse_bytes("79.6 GiB") == int(79.6 * 2**30)
    assert memory.parse_bytes("80") == 80 * 10**9 and memory.parse_bytes(" 8e10b ") == 8 * 10**10
    with pytest.raises(ValueError, match="80GB"):
        memory.parse_bytes("80XB")
    assert memory.usable_memory(80e9) == int(72e9) - 2**30 and memory.usable_memory(8e9, "cpu") == 4e9


def test_trainer_records_its_auto_micro_batch_and_refuses_a_run_that_cannot_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopscale.train import train

    cfg = _run_cfg("run.micro_batch=auto")
    rg = memory.regime("cpu")
    limit = (memory.train_peak(cfg.model, 2, rg).total + memory.train_peak(cfg.model, 4, rg).total) / 2
    monkeypatch.setattr(memory, "device_total_memory", lambda device: int(limit / memory.CPU_FRACTION) + 1)
    res = train(cfg, tmp_path / "run", progress=False)
    assert res.status == "ok" and res.micro_batch == 2 and res.val_micro_batch >= 2
    assert res.predicted_peak_bytes <= res.memory_limit_bytes and res.predicted_val_peak_bytes > 0
    monkeypatch.setattr(memory, "device_total_memory", lambda device: 10**6)
    with pytest.raises(ConfigError, match=r"run\.micro_batch: auto: one row of 64 tokens needs .* usable") as err:
        train(cfg, tmp_path / "small", progress=False)
    assert "\n" not in str(err.value)


# ---- the planner ------------------------------------------------------------------------------
def test_paper_plan_for_80gb_gives_every_run_a_micro_batch_that_fits() -> None:
    from loopscale.sweep import load_spec, make_plan

    plan = make_plan(load_spec("paper", ['train.run.micro_batch="auto"']), device_memory=80e9)
    limit = memory.usable_memory(80e9)
    assert plan.rows and all(r.micro_batch and r.peak_bytes <= limit and not r.warnings for r in plan.rows)
    by = {(r.run.variant, r.run.r, r.run.d_model // 64): r for r in plan.rows if r.run.C in (4.64e17, 2.15e19)}
    assert by["baseline", 1, 6].micro_batch == 64 and by["baseline", 1, 34].micro_batch == 8
    assert all(by["baseline", r, 34].micro_batch == 8 for r in (2, 4, 8))
    assert by["baseline", 1, 6].val_micro_batch == 64 and 40e9 < by["baseline", 1, 34].peak_bytes < limit
    assert "70.9 GB usable" in plan.memory_note


def test_plan_refuses_runs_that_cannot_fit_one_row_and_flags_fixed_micro_batches() -> None:
    from loopscale.sweep import load_spec, make_plan

    small = make_plan(load_spec("paper", ['train.run.micro_batch="auto"']), device_memory=16e9)
    refused = [r for r in small.rows if r.refused]
    assert refused and all(r.micro_batch is None for r in refused)
    assert refused[0].warnings[0].startswith("refused: one row of 2048 tokens needs")
    unset = load_spec("paper", ["train.run.micro_batch=null"])  # no micro_batch: all 128 rows at once
    fixed = make_plan(unset, device_memory=80e9).rows[0]
    assert fixed.micro_batch == 128 and fixed.warnings[-1].startswith("memory: ")
    assert 'set run.micro_batch = "auto" (64 rows)' in fixed.warnings[-1]


def test_cli_plan_prints_micro_batch_and_peak_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from loopscale.cli import run_app

    argv = [
        "sweep",
        "plan",
        "paper",
        "--no-calibrate",
        "--variant",
        "baseline",
        "--set",
        'train.run.micro_batch="auto"',
    ]
    assert run_app([*argv, "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "micro" in out and "68.7 GB" in out and "memory: 80.0 GB per GPU" in out
    assert run_app([*argv, "--device-memory", "lots"]) == 2
