"""The training engine: budgets, results, divergence, failures, resume, identical token streams."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY_DATA, TINY_MODEL, free_port
from loopscale.errors import ConfigError
from loopscale.train import RunInterrupted, TrainingFailed, load_train_config, read_result, train
from loopscale.train.batches import TokenData

FAST_OPTIM = ["optim.transfer=false"]


def cfg_with(*overrides: str, r: int = 2, steps: int = 30, path: Path | None = None):
    sets = [f"model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()] + [f"model.r={r}"]
    sets += [f"data.real_text_bytes={TINY_DATA['real_text_bytes']}"]
    sets += [f"data.world.{k}={v}" for k, v in TINY_DATA["world"].items()]
    sets += [
        f"run.steps={steps}",
        "run.batch_size=8",
        "run.threads=1",
        "run.val_tokens=4096",
        "run.log_every=5",
        "run.min_steps=5",
        *FAST_OPTIM,
        *overrides,
    ]
    return load_train_config(path, sets)


def write_toml(tmp_path: Path, cfg) -> Path:
    import tomli_w

    p = tmp_path / "cfg.toml"
    p.write_text(tomli_w.dumps(cfg.as_toml_dict()))
    return p


def test_tiny_looped_model_learns_far_below_unigram_entropy(tmp_path: Path) -> None:
    from loopscale.data.mixture import build_default

    cfg = cfg_with(r=4, steps=150)
    res = train(cfg, tmp_path / "run", progress=False)
    entropy = build_default(cfg.data).describe()["train"]["unigram_entropy_nats"]
    assert res.status == "ok"
    assert res.val_loss < entropy - 0.4, (res.val_loss, entropy)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["train_loss"] > lines[-2]["train_loss"]
    assert {"step", "tokens", "lr_mult", "train_loss", "tokens_per_s", "flops_per_s"} <= set(lines[0])
    for key in ("r", "N_once", "N_rec", "D", "C", "val_loss", "val_loss_se", "flops_per_token", "wall_s", "hardware"):
        assert key in res.dump()
    assert (tmp_path / "run" / "model.safetensors").exists() and not (tmp_path / "run" / "ckpt.pt").exists()


def test_budget_sets_steps_from_accounting_and_short_runs_are_refused() -> None:
    from loopscale import accounting

    cfg = cfg_with("run.budget=2e11", "run.steps=null")
    f = accounting.train_flops_per_token(cfg.model)
    assert cfg.total_steps() == round(2e11 / (f * 8 * 64))
    with pytest.raises(ConfigError, match=r"run\.budget: gives \d+ steps"):
        cfg_with("run.budget=1e9", "run.steps=null", "run.min_steps=20").check_length()


def test_finished_run_is_returned_not_retrained(tmp_path: Path) -> None:
    cfg = cfg_with(steps=10)
    first = train(cfg, tmp_path / "run", progress=False)
    mtime = (tmp_path / "run" / "result.json").stat().st_mtime_ns
    again = train(cfg, tmp_path / "run", progress=False)
    assert again == first and (tmp_path / "run" / "result.json").stat().st_mtime_ns == mtime


def test_failure_is_recorded_with_its_error(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailed, match="injected failure"):
        train(cfg_with("run.fail_at_step=3"), tmp_path / "run", progress=False)
    res = read_result(tmp_path / "run")
    assert res.status == "failed" and "injected failure at step 3" in res.error
    assert "Traceback" in res.traceback and res.N_once > 0


def test_nan_loss_stops_the_run_as_diverged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopscale.model import LoopedLM

    calls = {"n": 0}
    forward = LoopedLM.forward

    def poisoned(self, idx, targets=None, **kw):
        calls["n"] += 1
        out = forward(self, idx, targets, **kw)
        return out * math.nan if calls["n"] > 4 else out

    monkeypatch.setattr(LoopedLM, "forward", poisoned)
    res = train(cfg_with(steps=20), tmp_path / "run", progress=False)
    assert res.status == "diverged" and res.val_loss is None and res.steps == 5
    assert "non-finite" in res.error


def test_r1_and_r8_consume_identical_token_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[int, list[torch.Tensor]] = {1: [], 8: []}
    current = {"r": 1}
    batch = TokenData.batch

    def spy(self, *a, **kw):
        x, y = batch(self, *a, **kw)
        seen[current["r"]].append(x.clone())
        return x, y

    monkeypatch.setattr(TokenData, "batch", spy)
    for r in (1, 8):
        current["r"] = r
        train(cfg_with("model.L_eff=10", r=r, steps=6), tmp_path / f"r{r}", progress=False)
    assert len(seen[1]) == len(seen[8]) == 6
    assert all(torch.equal(a, b) for a, b in zip(seen[1], seen[8], strict=True))


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "loopscale", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout
        time.sleep(0.05)


def test_sigkill_then_resume_gives_bitwise_the_same_val_loss(tmp_path: Path) -> None:
    cfg = cfg_with("run.ckpt_every=5", steps=40)
    cfg_path = write_toml(tmp_path, cfg)
    straight = train(cfg, tmp_path / "straight", progress=False)

    proc = _cli(["train", str(cfg_path), "--out", str(tmp_path / "killed"), "--no-progress"])
    _wait_for(tmp_path / "killed" / "ckpt.pt", proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert read_result(tmp_path / "killed") is None
    resumed = train(cfg, tmp_path / "killed", progress=False)
    assert resumed.val_loss == straight.val_loss
    steps = [json.loads(x)["step"] for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) + 1  # the final line repeats the last step


def test_sigterm_leaves_a_resumable_checkpoint_and_exits_cleanly(tmp_path: Path) -> None:
    cfg = cfg_with("run.ckpt_every=0", steps=400)
    cfg_path = write_toml(tmp_path, cfg)
    proc = _cli(["train", str(cfg_path), "--out", str(tmp_path / "run"), "--no-progress"])
    _wait_for(tmp_path / "run" / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "checkpoint saved" in err and "Traceback" not in err
    state = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
    assert 0 < state["step"] < 400
    assert read_result(tmp_path / "run") is None


def test_run_interrupted_is_raised_in_process_on_sigterm(tmp_path: Path) -> None:
    cfg = cfg_with(steps=50)

    def on_step(step: int, total: int) -> None:
        if step == 7:
            os.kill(os.getpid(), signal.SIGTERM)

    from loopscale.train.loop import train as run

    with pytest.raises(RunInterrupted, match="step 7/50"):
        run(cfg, tmp_path / "run", progress=False, on_step=on_step)
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)["step"] == 7


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2], ids=["SIGTERM", "SIGUSR2"])
def test_a_signal_in_the_final_evaluation_stops_and_the_rerun_only_evaluates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    from loopscale.model import LoopedLM

    cfg = cfg_with("run.ckpt_every=0", "run.micro_batch=4", steps=12)  # 64 validation rows: 16 batches
    straight = train(cfg, tmp_path / "straight", progress=False)
    forward, batches, evals = LoopedLM.forward, TokenData.batch, {"n": 0}

    def signalled(self, idx, targets=None, **kw):
        if kw.get("reduction") == "none":  # a validation batch
            evals["n"] += 1
            if evals["n"] == 3:
                os.kill(os.getpid(), signum)  # preempted in the middle of the final evaluation
        return forward(self, idx, targets, **kw)

    monkeypatch.setattr(LoopedLM, "forward", signalled)
    with pytest.raises(RunInterrupted, match="during the final evaluation") as info:
        train(cfg, tmp_path / "run", progress=False)
    assert info.value.exit_code == 128 + signum and evals["n"] == 3
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)["step"] == 12
    assert read_result(tmp_path / "run") is None

    def no_training(self, *a, **kw):
        raise AssertionError("a resumed run with every step done must not train")

    monkeypatch.setattr(LoopedLM, "forward", forward)
    monkeypatch.setattr(TokenData, "batch", no_training)
    resumed = train(cfg, tmp_path / "run", progress=False)
    monkeypatch.setattr(TokenData, "batch", batches)
    assert resumed.val_loss == straight.val_loss and resumed.val_loss_se == straight.val_loss_se
    assert resumed.train_loss == straight.train_loss and resumed.steps == 12
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [5, 10, 12, 12] and lines[-1]["final"]
    assert not (tmp_path / "run" / "ckpt.pt").exists()  # removed once finished (keep_checkpoint = false)


def test_the_last_step_is_checkpointed_before_the_final_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopscale.train import validate

    seen: list[int | None] = []
    stats = validate.val_loss_stats

    def spy(*a, **kw):
        state = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
        seen.append(state["step"])
        return stats(*a, **kw)

    monkeypatch.setattr(validate, "val_loss_stats", spy)
    res = train(cfg_with("run.ckpt_every=0", "run.keep_checkpoint=true", steps=8), tmp_path / "run", progress=False)
    assert seen == [8] and res.status == "ok"


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["run.epochs=3"], r"run\.epochs: unknown key"),
        (["run.batch_size='many'"], r"run\.batch_size: .*integer"),
        (["data.text_dir='/nonexistent/loopscale'"], r"text_dir"),
        (["model.vocab_size=200"], r"model\.vocab_size: smaller than the tokenizer's vocabulary \(257\)"),
        (["run.micro_batch=3"], r"run\.micro_batch: must divide"),
    ],
)
def test_bad_training_configs_fail_with_one_line_naming_the_culprit(tmp_path: Path, sets, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        cfg = cfg_with(*sets)
        train(cfg, tmp_path / "run", progress=False)
    assert "\n" not in str(info.value)


def test_cli_reports_user_errors_in_one_line_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nstepz = 3\n")
    proc = _cli(["train", str(bad)])
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        f"error: {bad} + --set: run.stepz: unknown key (got 3)"
    ] or err.strip().startswith(f"error: {bad}: run.stepz: unknown key")
    assert "Traceback" not in err


def test_torchrun_two_cpu_processes_reproduce_the_single_process_curve(tmp_path: Path) -> None:
    cfg = cfg_with("run.log_every=2", steps=12)
    cfg_path = write_toml(tmp_path, cfg)
    single = train(cfg, tmp_path / "single", progress=False)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "loopscale",
            "train",
            str(cfg_path),
            "--out",
            str(tmp_path / "ddp"),
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = read_result(tmp_path / "ddp")
    assert ddp.world_size == 2 and ddp.status == "ok"

    def curve(run: str) -> list[float]:
        rows = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [r["train_loss"] for r in rows if "train_loss" in r]

    assert curve("ddp") == pytest.approx(curve("single"), rel=1e-4, abs=1e-5)
    assert ddp.val_loss == pytest.approx(single.val_loss, rel=1e-4)


def test_two_node_torchrun_rendezvous_matches_the_single_process_curve(tmp_path: Path) -> None:
    """Multi-node through torchrun's standard c10d rendezvous: two launchers (one per "node", one
    process each) meet at an endpoint, as on a cluster with a shared filesystem; only global rank 0
    writes the run dir, even though each node has a LOCAL_RANK 0."""
    cfg = cfg_with("run.log_every=2", steps=8)
    cfg_path = write_toml(tmp_path, cfg)
    single = train(cfg, tmp_path / "single", progress=False)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={i}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=loopscale-test",
                "-m",
                "loopscale",
                "train",
                str(cfg_path),
                "--out",
                str(tmp_path / "multi"),
                "--no-progress",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for node in nodes:
        _out, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    multi = read_result(tmp_path / "multi")
    assert multi.world_size == 2 and multi.status == "ok"
    rows = [json.loads(x) for x in (tmp_path / "multi" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "train_loss" in r]) == len(  # one writer: no duplicated log lines
        [
            r
            for r in (json.loads(x) for x in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines())
            if "train_loss" in r
        ]
    )
    assert multi.val_loss == pytest.approx(single.val_loss, rel=1e-4)


def test_resolved_config_round_trips_through_toml_including_nulls(tmp_path: Path) -> None:
    cfg = cfg_with("model.softcap=null", "model.bptt_k=1")
    again = load_train_config(write_toml(tmp_path, cfg))
    assert again == cfg and again.model.softcap is None


def test_val_loss_stats_are_the_mean_and_the_standard_error_over_rows() -> None:
    from loopscale.config import ModelConfig
    from loopscale.model import LoopedLM
    from loopscale.train.validate import val_loss_stats

    torch.manual_seed(0)
    model = LoopedLM(ModelConfig(**{**TINY_MODEL, "r": 2}))
    rows = torch.randint(0, model.cfg.vocab_size, (7, model.cfg.seq_len + 1))
    mean, se, _ = val_loss_stats(model, rows, micro_batch=3, device=torch.device("cpu"), dtype="float32")
    with torch.no_grad():
        logits = model(rows[:, :-1])
        tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none").double()
    per_row = tok.mean(dim=1)
    assert mean == pytest.approx(float(tok.mean()), rel=1e-6)
    assert se == pytest.approx(float(per_row.std(unbiased=True)) / 7**0.5, rel=1e-4)
