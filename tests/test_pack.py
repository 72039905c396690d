"""Packs (issue 41): k same-shaped runs trained as one stacked model, each member the run it would have been alone.

- the packed step against each member's solo run, per-step losses, on every optimiser group (MuonH's matrices,
  AdamW's embedding, head, norms and lane scalars; plain AdamW), the injections, truncated BPTT, the plain r = 1
  stack and a user's technique under vmap: within the solo run's own rounding noise on any CPU, and bitwise
  where this machine's kernels are batch-invariant (``bitwise_here``, which the full-run tests then demand);
- ``train_pack`` writes each member's run dir as ``train`` does; a diverging, NaN or failing member is set aside;
  a signal checkpoints every member, and a resumed pack is bitwise the unkilled one; a packed checkpoint resumes
  solo;
- grouping (``sweep.packs``), the ``--pack`` flag's errors, a technique that cannot be packed trains alone.

The sweep-level SIGKILL test is in tests/test_sweep_run.py (``test_sigkill_mid_pack...``).
"""

import functools
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from conftest import TINY_DATA, TINY_MODEL
from loopscale.config import ModelConfig
from loopscale.model import LoopedLM
from loopscale.model.packed import PackedLM
from loopscale.optim import OptimConfig, build_optimizers
from loopscale.optim.packed import PackedOptimizers
from loopscale.train import microbatch

#: last-bit perturbations of the initial weights (each weight moved by 8 ulps up or down at random, two draws): the
#: solo run's rounding noise. (tests/test_parity.py scales the loss instead; AdamW's normalised step is blind to
#: that, and the norms are to a uniform scaling of the weights)
NOISE_SEEDS = (1, 2)
STEPS = (6, 9, 8)  # members leave the pack at their own step
LR_SCALES = (1.0, 2.0, 0.5)

CASES = {
    "linear": ({}, {}),  # MuonH matrices + AdamW embed, head, norms; the linear injection
    "additive-adamw": ({"injection": "additive"}, {"name": "adamw"}),
    "hyperconnect": ({"injection": "hyperconnect"}, {}),  # + AdamW lane scalars
    "passthrough-tbptt": ({"injection": "passthrough", "r": 4, "L_eff": 6, "bptt_k": 2}, {}),
    "plain-r1": ({"r": 1}, {"grad_clip": 0.5}),  # the plain stack; per-member clipping
    "gated-technique": ({"technique": "loopscale.examples.gated_loop:GatedLoop"}, {}),  # under vmap
}


def _cfg(model: dict) -> ModelConfig:
    base = {"d_model": 32, "head_dim": 16, "L_eff": 4, "n_prelude": 1, "n_coda": 1, "r": 2, "seq_len": 32}
    return ModelConfig(**{**base, "vocab_size": 257, **model})


def _member(cfg: ModelConfig, optim: dict, i: int):
    torch.manual_seed(i)
    model = LoopedLM(cfg)
    ocfg = OptimConfig(**{"lr_scale": LR_SCALES[i], **optim})
    opt = build_optimizers(
        model.param_groups(), ocfg, d_model=cfg.width, tokens_per_step=128, total_tokens=1e5, r=cfg.r
    )
    return model, opt


def _batches(cfg: ModelConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    return torch.randint(0, cfg.vocab_size, (max(STEPS), len(STEPS), 4, cfg.seq_len + 1), generator=g)


def _solo(cfg: ModelConfig, optim: dict, i: int, noise: int | None = None) -> list[float]:
    model, opt = _member(cfg, optim, i)
    if noise is not None:
        g = torch.Generator().manual_seed(noise)
        with torch.no_grad():
            for p in model.parameters():
                signs = torch.randint(0, 2, p.shape, generator=g).mul_(2).sub_(1)
                p.mul_(1 + 2**-20 * signs)
    xs, losses = _batches(cfg), []
    for t in range(STEPS[i]):
        opt.set_lr_for_step(t, STEPS[i])
        loss = model(xs[t, i, :, :-1], xs[t, i, :, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _packed(cfg: ModelConfig, optim: dict, poison: int | None = None) -> list[list[float]]:
    """Every member in one pack; each leaves at its own step (``keep``). ``poison``: that member's weights NaN."""
    members = [_member(cfg, optim, i) for i in range(len(STEPS))]
    models = [m for m, _ in members]
    pack = PackedLM(models)
    popt = PackedOptimizers(pack.stacked(), [o for _, o in members], [dict(_names(m)) for m in models])
    if poison is not None:
        with torch.no_grad():
            for p in pack.stacked().values():
                p[poison] = float("nan")
    xs = _batches(cfg)
    active = list(range(len(STEPS)))
    losses: list[list[float]] = [[] for _ in STEPS]
    for t in range(max(STEPS)):
        popt.set_lr_for_steps([t] * len(active), [STEPS[i] for i in active])
        out = pack(xs[t, active, :, :-1], xs[t, active, :, 1:])
        out.sum().backward()
        popt.step()
        popt.zero_grad()
        for slot, i in enumerate(active):
            losses[i].append(out[slot].item())
        keep = [slot for slot, i in enumerate(active) if t + 1 < STEPS[i]]
        if len(keep) < len(active):
            active = [active[s] for s in keep]
            if not active:
                break
            pack.keep(keep)
            popt.keep(keep, pack.stacked())
    return losses


def _names(model: LoopedLM):
    return ((id(p), n) for n, p in model.named_parameters())


@functools.cache
def _gap_and_band(case: str) -> tuple[float, float]:
    model, optim = CASES[case]
    cfg = _cfg(model)
    packed = _packed(cfg, optim)
    gap = band = 0.0
    for i in range(len(STEPS)):
        solo = _solo(cfg, optim, i)
        gap = max(gap, *(abs(a - b) for a, b in zip(packed[i], solo, strict=True)))
        for seed in NOISE_SEEDS:
            band = max(band, *(abs(a - b) for a, b in zip(_solo(cfg, optim, i, seed), solo, strict=True)))
    return gap, band


def bitwise_here() -> bool:
    """Whether this machine's packed steps are bitwise the solo runs (MKL's batched products and the elementwise
    loops batch-invariant here); the full-run tests then demand bitwise results too."""
    return _gap_and_band("linear")[0] == 0.0


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_packed_member_steps_as_its_solo_run_within_its_own_rounding_noise(case: str) -> None:
    gap, band = _gap_and_band(case)
    assert band > 0  # the perturbation moves the solo run: a band of 0 would make this test vacuous
    assert gap <= 2 * band, f"{case}: packed vs solo {gap:.3g} nats, solo's own rounding noise {band:.3g}"
    print(f"{case}: packed vs solo {gap:.3g} nats ({'bitwise' if gap == 0 else 'not bitwise'}), noise {band:.3g}")


def test_a_nan_member_does_not_reach_the_others() -> None:
    cfg, optim = _cfg({}), {}
    clean, poisoned = _packed(cfg, optim), _packed(cfg, optim, poison=1)
    assert all(x != x for x in poisoned[1])  # NaN
    assert poisoned[0] == clean[0] and poisoned[2] == clean[2]  # the same shapes and code: the same bits


def test_a_pack_refuses_members_of_different_shapes() -> None:
    with pytest.raises(ValueError, match="same parameters"):
        PackedLM([LoopedLM(_cfg({})), LoopedLM(_cfg({"d_model": 48}))])


# ---- train_pack: run dirs, results, divergence, failures, signals --------------------------------------------------


def _train_cfg(*overrides: str, steps: int = 12, seed: int = 0):
    from loopscale.train import load_train_config

    sets = [f"model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()] + ["model.r=2"]
    sets += [f"data.real_text_bytes={TINY_DATA['real_text_bytes']}"]
    sets += [f"data.world.{k}={v}" for k, v in TINY_DATA["world"].items()]
    sets += [
        f"run.steps={steps}",
        f"run.seed={seed}",
        "run.batch_size=8",
        "run.threads=1",
        "run.val_tokens=2048",
        "run.log_every=2",
        "run.ckpt_every=4",
        "run.min_steps=5",
        "optim.transfer=false",
        *overrides,
    ]
    return load_train_config(None, sets)


def _three() -> list:
    """Three members: different seeds, lengths and learning rates."""
    return [
        _train_cfg(f"optim.lr_scale={s}", steps=n, seed=i) for i, (s, n) in enumerate(((1.0, 10), (2.0, 14), (0.5, 12)))
    ]


def _metrics(run_dir: Path) -> list[float]:
    return [json.loads(x).get("train_loss") for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_train_pack_writes_each_members_run_dir_as_train_would(tmp_path: Path) -> None:
    from loopscale.train import train
    from loopscale.train.pack import train_pack

    cfgs = _three()
    ends = train_pack(cfgs, [tmp_path / f"p{i}" for i in range(3)])
    for i, (cfg, e) in enumerate(zip(cfgs, ends, strict=True)):
        solo = train(cfg, tmp_path / f"s{i}", progress=False)
        assert e.kind == "result" and e.result is not None and e.result.status == "ok"
        res = e.result
        assert res.hardware["pack"]["size"] == 3
        for key in ("steps", "D", "C", "flops", "N_once", "N_rec", "micro_batch", "predicted_peak_bytes"):
            assert getattr(res, key) == getattr(solo, key), key
        assert sorted(p.name for p in (tmp_path / f"p{i}").iterdir()) == sorted(
            p.name for p in (tmp_path / f"s{i}").iterdir()
        )
        packed, alone = _metrics(tmp_path / f"p{i}"), _metrics(tmp_path / f"s{i}")
        if bitwise_here():
            assert res.val_loss == solo.val_loss and packed == alone
        else:
            assert res.val_loss == pytest.approx(solo.val_loss, rel=1e-3)
        # finished: asked again, the pack returns the result without training
    again = train_pack(cfgs, [tmp_path / f"p{i}" for i in range(3)])
    assert [e.result.dump() if e.result else None for e in again] == [
        json.loads((tmp_path / f"p{i}" / "result.json").read_text()) for i in range(3)
    ]


def test_a_diverging_and_a_failing_member_are_set_aside_and_the_others_finish(tmp_path: Path) -> None:
    from loopscale.train.pack import train_pack

    cfgs = _three()
    cfgs[0] = _train_cfg("optim.lr_scale=1e30", steps=10, seed=0)  # non-finite within a few steps on any CPU
    cfgs[1] = _train_cfg("optim.lr_scale=2.0", "run.fail_at_step=5", steps=14, seed=1)
    ends = train_pack(cfgs, [tmp_path / f"p{i}" for i in range(3)])
    assert ends[0].kind == "result" and ends[0].result is not None and ends[0].result.status == "diverged"
    assert "at step" in ends[0].result.error
    assert ends[1].kind == "failed" and "injected failure at step 5" in ends[1].error
    failed = json.loads((tmp_path / "p1" / "result.json").read_text())
    assert failed["status"] == "failed" and "Traceback" in failed["traceback"]
    assert (tmp_path / "p1" / "ckpt.pt").exists()  # its retry resumes from step 4
    assert ends[2].kind == "result" and ends[2].result is not None and ends[2].result.status == "ok"
    alone = train_pack([cfgs[2]], [tmp_path / "alone"])[0].result
    assert alone is not None
    if bitwise_here():
        assert ends[2].result.val_loss == alone.val_loss
    else:
        assert ends[2].result.val_loss == pytest.approx(alone.val_loss, rel=1e-3)


def _interrupt_at(step: int):
    def hook(s: int, total: int) -> None:
        if s == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def test_a_signal_checkpoints_every_member_and_the_resumed_pack_is_bitwise_the_unkilled_one(tmp_path: Path) -> None:
    from loopscale.train import train
    from loopscale.train.pack import train_pack

    cfgs = _three()
    straight = train_pack(cfgs, [tmp_path / f"u{i}" for i in range(3)])
    dirs = [tmp_path / f"k{i}" for i in range(3)]
    ends = train_pack(cfgs, dirs, on_step=[_interrupt_at(6), None, None])
    assert [e.kind for e in ends] == ["interrupted"] * 3
    assert all(torch.load(d / "ckpt.pt", weights_only=True)["step"] == 6 for d in dirs)
    resumed = train_pack(cfgs, dirs)
    for a, b, d, u in zip(resumed, straight, dirs, range(3), strict=True):
        assert a.result is not None and b.result is not None
        assert a.result.val_loss == b.result.val_loss  # packed against packed: no tolerance
        assert _metrics(d) == _metrics(tmp_path / f"u{u}")
    # a packed member's checkpoint is a solo run's: the solo trainer resumes it
    solo_dirs = [tmp_path / f"solo{i}" for i in range(2)]
    train_pack(cfgs[:2], solo_dirs, on_step=[_interrupt_at(5), None])
    for i, d in enumerate(solo_dirs):
        res = train(cfgs[i], d, progress=False)
        assert res.status == "ok" and res.steps == cfgs[i].run.steps
        ref = straight[i].result
        assert ref is not None
        if bitwise_here():
            assert res.val_loss == ref.val_loss
        else:
            assert res.val_loss == pytest.approx(ref.val_loss, rel=1e-3)


def test_a_pack_resumes_a_solo_runs_checkpoint(tmp_path: Path) -> None:
    from loopscale.train import RunInterrupted, train
    from loopscale.train.pack import train_pack

    cfgs = _three()
    with pytest.raises(RunInterrupted):
        train(cfgs[1], tmp_path / "m1", progress=False, on_step=_interrupt_at(7))
    ends = train_pack(cfgs[:2], [tmp_path / "m0", tmp_path / "m1"])
    alone = train(cfgs[1], tmp_path / "alone", progress=False)
    res = ends[1].result
    assert res is not None and res.steps == 14
    if bitwise_here():
        assert res.val_loss == alone.val_loss
    else:
        assert res.val_loss == pytest.approx(alone.val_loss, rel=1e-3)


def test_members_resumed_at_different_steps_train_on_together(tmp_path: Path) -> None:
    from loopscale.train.pack import train_pack

    cfgs = _three()
    dirs = [tmp_path / f"m{i}" for i in range(3)]
    train_pack(cfgs[:1], dirs[:1], on_step=[_interrupt_at(4)])  # member 0 at step 4, the others at 0
    ends = train_pack(cfgs, dirs)
    straight = train_pack(cfgs, [tmp_path / f"u{i}" for i in range(3)])
    for a, b in zip(ends, straight, strict=True):
        assert a.result is not None and b.result is not None and a.result.status == "ok"
        if bitwise_here():
            assert a.result.val_loss == b.result.val_loss
        else:
            assert a.result.val_loss == pytest.approx(b.result.val_loss, rel=1e-3)


# ---- grouping and the flag ------------------------------------------------------------------------------------


def _runs(**sweep):
    from conftest import tiny_sweep_spec
    from loopscale.sweep import spec_from_dict

    return spec_from_dict(tiny_sweep_spec(**sweep), source="tiny.toml").runs()


def test_runs_pack_by_shape_across_seeds_and_budgets_and_split_evenly() -> None:
    from loopscale.sweep.packs import make_packs, pack_key

    runs = _runs(seeds=[0, 1, 2])
    packs = make_packs(runs, "auto")
    assert sum(len(p) for p in packs) == len(runs) == 24
    for p in packs:  # one shape per pack: r and d agree, seeds and budgets differ
        assert len({(rs.r, rs.d_model) for rs in p}) == 1 and len({pack_key(rs.config) for rs in p}) == 1
    assert sorted(len(p) for p in packs) == [6, 6, 6, 6]  # 3 seeds x 2 budgets per (r, d)
    assert sorted(len(p) for p in make_packs(runs, 4)) == [3] * 8  # at most 4: 6 as 3 + 3
    assert make_packs(runs, "off") == [[rs] for rs in runs]
    order = [rs.run_id for p in make_packs(runs, "auto") for rs in p]
    assert order[0] == runs[0].run_id  # in plan order: a pack where its first run stands


def test_what_a_member_keeps_for_itself_does_not_split_a_pack_and_the_rest_does() -> None:
    from loopscale.sweep.packs import pack_key

    a = _train_cfg()
    same = _train_cfg("optim.lr_scale=3", "optim.schedule=cosine", "run.ckpt_every=7", "data.seed=5", steps=30, seed=4)
    assert pack_key(a) == pack_key(same)
    for other in ("model.r=1", "run.batch_size=4", "optim.momentum=0.9", "optim.name=adamw", "model.bptt_k=1"):
        assert pack_key(_train_cfg(other)) != pack_key(a), other
    assert pack_key(_train_cfg("run.track=tensorboard")) is None  # a tracked run trains alone


@pytest.mark.parametrize("value", ["0", "banana", "-3", "1.5"])
def test_a_bad_pack_value_is_one_line_naming_the_flag(value: str, capsys) -> None:
    from loopscale.cli import run_app

    assert run_app(["sweep", "plan", "quick", "--no-calibrate", "--pack", value]) == 2
    err = capsys.readouterr().err
    assert "--pack" in err and "expected auto, off or the most runs per pack" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_parse_pack() -> None:
    from loopscale.sweep.packs import parse_pack

    assert parse_pack("auto") == "auto" and parse_pack(None) == "auto"
    assert parse_pack("OFF") == "off" and parse_pack("1") == "off" and parse_pack(8) == 8


def test_plan_shows_the_packs_and_estimates_them(capsys) -> None:
    from loopscale.cli import run_app

    assert run_app(["sweep", "plan", "quick", "--no-calibrate", "--set", "sweep.seeds=[0,1]"]) == 0
    out = capsys.readouterr().out
    assert "packs:" in out and "40 runs as" in out
    assert run_app(["sweep", "plan", "quick", "--no-calibrate", "--pack", "off"]) == 0
    assert "packs:" not in capsys.readouterr().out


def test_a_pack_estimate_counts_members_leaving_at_their_own_steps() -> None:
    from loopscale.sweep.calibrate import Timing, pack_seconds

    cfg = _train_cfg()
    solo, packed = Timing(0.01, 0.02, 1.0, True), Timing(0.005, 0.01, 1.0, True)  # a member-step halves in a pack
    one = cfg.run.batch_size * 0.01 + 0.02
    overhead = solo.run_seconds(cfg, 0)
    # 2 members of 10 and 20 steps, measured as a pack of 2: 10 steps of 2 at half cost, then 10 alone at full
    got = pack_seconds([(cfg, 10), (cfg, 20)], solo, packed, 2)
    assert got == pytest.approx(10 * 2 * one / 2 + 10 * one + 2 * overhead)
    assert pack_seconds([(cfg, 10), (cfg, 20)], solo, None, 1) == pytest.approx(30 * one + 2 * overhead)


TECHNIQUE = """
from loopscale.technique import Technique


class Wrapped(Technique):
    def block(self, i, recur, u):
        return recur(u) * 1.0  # wraps the recurrent block: cannot run batched
"""


def test_a_technique_that_cannot_run_packed_trains_alone(tmp_path: Path, capsys) -> None:
    from loopscale.sweep import prepare, run_sweep, runs_table, spec_from_dict
    from loopscale.train.pack import why_not_packable

    path = tmp_path / "wrapped.py"
    path.write_text(TECHNIQUE)
    cfg = _train_cfg(f"model.technique={json.dumps(str(path) + ':Wrapped')}")
    assert "overrides block()" in (why_not_packable([cfg]) or "")
    from conftest import tiny_sweep_spec

    spec = tiny_sweep_spec(seeds=[0, 1], r=[1, 2], widths={"2e9": [16], "4e9": [16]})
    spec["sweep"]["variants"] = {"wrapped": {"model": {"technique": f"{path}:Wrapped"}}}
    sweep = spec_from_dict(spec, source="tiny.toml")
    store = prepare(sweep, tmp_path / "sw")
    summary = run_sweep(sweep, store, progress=False, slots=1)
    assert summary.count("done") == 12, summary.outcomes  # 8 baseline runs in packs, 4 of the technique alone
    assert "train one at a time: Wrapped overrides block()" in capsys.readouterr().err
    df, _ = runs_table(store)
    assert (df["status"] == "ok").all()
    # a member's books are kept when it ends, not when its pack does: the shorter budget's runs are done first
    events = store.events()
    assert {e.get("pack") for e in events if e["event"] == "start" and "baseline" in e["run_id"]} == {4}
    done = {e["run_id"]: e["time"] for e in events if e["event"] == "done"}
    for r in (1, 2):
        short = max(done[f"C2e+09_r{r}_d16_baseline_s{s}"] for s in (0, 1))
        assert short < min(done[f"C4e+09_r{r}_d16_baseline_s{s}"] for s in (0, 1))


# ---- memory: a pack is its members side by side -----------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # CPU autocast's composite norm
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", [{}, {"injection": "hyperconnect"}, {"r": 1}], ids=str)
def test_a_pack_keeps_for_backward_what_its_members_would_alone(model: dict, dtype: str) -> None:
    from test_memory import autocast, saving

    cfg = _cfg(model)
    members = [LoopedLM(cfg) for _ in range(3)]
    x = torch.randint(0, cfg.vocab_size, (3, 2, cfg.seq_len))
    with saving({p.untyped_storage().data_ptr() for p in members[0].parameters()}) as solo, autocast(dtype):
        members[0](x[0], x[0])
    pack = PackedLM(members)
    with saving({p.untyped_storage().data_ptr() for p in pack.parameters()}) as packed, autocast(dtype):
        pack(x, x)
    assert sum(packed.values()) == pytest.approx(3 * sum(solo.values()), rel=0.02)


def test_the_memory_model_plans_a_pack_as_its_members_side_by_side() -> None:

    cfg = _train_cfg()
    one = microbatch.micro_batches(cfg, device="cpu", limit=None)
    four = microbatch.micro_batches(cfg, device="cpu", limit=None, pack=4)
    assert four.train == one.train and four.train_peak == 4 * one.train_peak and four.val_peak == 4 * one.val_peak
    assert microbatch.pack_peak(cfg, 4, device="cpu") == four.train_peak
    auto = _train_cfg('run.micro_batch="auto"')
    limit = microbatch.micro_batches(_train_cfg("run.micro_batch=4"), device="cpu", limit=None, pack=4).train_peak
    alone = microbatch.micro_batches(auto, device="cpu", limit=limit)  # 4 runs' worth of 4 rows: one run takes all 8
    packed = microbatch.micro_batches(auto, device="cpu", limit=limit, pack=4)
    assert alone.train == 8 and packed.train == 4 and packed.train_peak == limit


def test_auto_packs_no_more_runs_than_the_device_holds() -> None:
    from loopscale import memory
    from loopscale.sweep.packs import pack_cap

    cfg = _train_cfg("run.device=cpu")
    peak = microbatch.pack_peak(cfg, 1, device="cpu")
    total = 3.5 * peak / memory.CPU_FRACTION  # usable: 3.5 runs' peaks
    assert pack_cap(cfg, "auto", device_memory=total) == 3
    assert pack_cap(cfg, "auto", device_memory=1e15) == 8 and pack_cap(cfg, 5) == 5 and pack_cap(cfg, "off") == 1


def test_the_calibration_times_a_shape_that_packs_as_a_pack_too(tmp_path: Path) -> None:
    from loopscale.sweep.calibrate import Calibration

    cfg = _train_cfg()
    cal = Calibration(tmp_path / "calibration.json")
    measured, total = cal.ensure([cfg], budget_s=60, rows=1, packs={cal.key(cfg): 3})
    assert (measured, total) == (1, 1)
    found = cal.pack_timing(cfg)
    assert found is not None and found[0] == 3 and found[1].s_per_row > 0 and found[1].measured
    again = Calibration(tmp_path / "calibration.json")  # cached: nothing measured again
    again.ensure([cfg], budget_s=0.0, packs={again.key(cfg): 3})
    assert again.pack_timing(cfg) == found
