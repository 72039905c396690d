"""The trainer's pieces alone: when to log, validate and checkpoint, the micro-batch split, a step, the signals."""

import os
import signal
from pathlib import Path

import pytest
import torch

from loopscale import signals
from loopscale.errors import ConfigError
from loopscale.train.loop import (
    Batching,
    Step,
    diverged,
    should_checkpoint,
    should_log,
    should_validate,
    train_step,
)
from loopscale.train.validate import Validator
from test_train import cfg_with


def test_validation_is_periodic_never_after_the_last_step_and_off_at_zero() -> None:
    assert [s for s in range(1, 11) if should_validate(s, 10, 3)] == [3, 6, 9]
    assert [s for s in range(1, 11) if should_validate(s, 10, 5)] == [5]  # step 10: the final evaluation
    assert not any(should_validate(s, 10, 0) for s in range(1, 11))


def test_checkpoints_are_periodic_before_the_last_step_and_always_on_a_signal() -> None:
    assert [s for s in range(1, 11) if should_checkpoint(s, 10, 4)] == [4, 8]
    assert [s for s in range(1, 11) if should_checkpoint(s, 10, 5)] == [5]  # step 10: before the final evaluation
    assert not any(should_checkpoint(s, 10, 0) for s in range(1, 11))
    assert should_checkpoint(3, 10, 0, stopping=True) and should_checkpoint(10, 10, 4, stopping=True)


def test_metrics_lines_are_periodic_and_after_the_last_step() -> None:
    assert [s for s in range(1, 11) if should_log(s, 10, 4)] == [4, 8, 10]


def test_divergence_is_a_non_finite_loss_or_one_above_the_limit() -> None:
    assert diverged(float("nan"), 12.0) and diverged(float("inf"), 12.0) and diverged(12.5, 12.0)
    assert not diverged(11.9, 12.0)


def test_the_batch_splits_into_processes_then_micro_batches() -> None:
    cpu = torch.device("cpu")
    b = Batching.for_run(cfg_with("run.micro_batch=2"), cpu, 2)
    assert (b.batch, b.per_rank, b.micro, b.n_micro) == (8, 4, 2, 2)
    with pytest.raises(ConfigError, match=r"run\.batch_size: must be divisible by the 3 processes"):
        Batching.for_run(cfg_with(), cpu, 3)


def test_a_step_in_micro_batches_is_the_whole_batch_step(tmp_path: Path) -> None:
    """Gradient accumulation over 4 micro-batches updates the model as one batch of 8 rows does."""
    from loopscale.model import LoopedLM
    from loopscale.optim import build_optimizers
    from loopscale.train.loop import load_data

    def one_step(micro: int) -> tuple[float, torch.Tensor]:
        cfg = cfg_with(f"run.micro_batch={micro}")
        torch.manual_seed(0)
        model = LoopedLM(cfg.model)
        opt = build_optimizers(
            model.param_groups(),
            cfg.optim,
            d_model=cfg.model.width,
            tokens_per_step=cfg.tokens_per_step,
            total_tokens=cfg.lr_tokens(),
            r=cfg.model.r,
        )
        cpu = torch.device("cpu")
        s = Step(model, None, opt, load_data(cfg), Batching.for_run(cfg, cpu, 1), cfg.data.seed, cpu, "float32", 0, 1)
        loss, _lr = train_step(s, 0, 10)
        return loss, torch.cat([p.detach().flatten() for p in model.parameters()])

    loss_1, params_1 = one_step(8)
    loss_4, params_4 = one_step(2)
    assert loss_4 == pytest.approx(loss_1, rel=1e-5)
    torch.testing.assert_close(params_4, params_1, rtol=1e-4, atol=1e-6)


def test_the_validator_scores_the_same_rows_periodically_and_finally() -> None:
    from loopscale.model import LoopedLM
    from loopscale.train.loop import load_data

    cfg = cfg_with()
    model = LoopedLM(cfg.model)
    rows = load_data(cfg).val_rows(cfg.run.val_tokens)
    v = Validator(model, rows, micro_batch=4, device=torch.device("cpu"), dtype="float32")
    assert v.tokens == rows.size(0) * (rows.size(1) - 1)
    final = v.final(lambda: False, None)
    assert v.loss() == pytest.approx(final.loss, rel=1e-12) and final.bpb is None and final.se > 0


# ---- the one signal handler ----------------------------------------------------------------------------


def test_a_signal_sets_the_flag_calls_back_and_the_old_handlers_return() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    calls: list[tuple[int, bool]] = []
    with signals.StopSignals(signals.STOP_OR_WARN, lambda s, first: calls.append((s, first))) as sig:
        assert sig.caught is None
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        assert sig.caught == signal.SIGTERM
    assert calls == [(signal.SIGUSR2, True), (signal.SIGTERM, False)]
    assert signal.getsignal(signal.SIGUSR2) is before


def test_the_trainers_second_ctrl_c_stops_at_once() -> None:
    with signals.StopSignals(signals.STOP_OR_WARN, signals.second_ctrl_c_stops_at_once) as sig:
        os.kill(os.getpid(), signal.SIGINT)  # the first waits for the end of the step
        assert sig.caught == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_the_trainer_and_the_sweep_executors_share_the_one_signal_handler() -> None:
    import loopscale
    import loopscale.sweep.local as local
    import loopscale.train.loop as loop

    assert loop.StopSignals is signals.StopSignals and local.StopSignals is signals.StopSignals
    installs = sorted(
        str(p.relative_to(Path(loopscale.__file__).parent))
        for p in Path(loopscale.__file__).parent.rglob("*.py")
        if "signal.signal(" in p.read_text()
    )
    assert installs == ["signals.py"]
