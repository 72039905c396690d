"""Training engine: ``train(load_train_config(path, overrides), run_dir)``."""

from typing import TYPE_CHECKING, Any

from loopscale.train.settings import RunConfig, TrainConfig, load_train_config

if TYPE_CHECKING:
    from loopscale.train.loop import RunInterrupted, TrainingFailed, read_result, train

_LOOP = ("RunInterrupted", "TrainingFailed", "read_result", "train")


def __getattr__(name: str) -> Any:
    """The trainer (torch) loads on first use; the config (what light commands read) does not need it."""
    if name in _LOOP:
        from loopscale.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'loopscale.train' has no attribute {name!r}")


__all__ = ["RunConfig", "RunInterrupted", "TrainConfig", "TrainingFailed", "load_train_config", "read_result", "train"]
