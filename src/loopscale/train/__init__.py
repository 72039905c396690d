"""Training engine: ``train(load_train_config(path, overrides), run_dir)`` -> the run's ``RunRecord``."""

from typing import TYPE_CHECKING, Any

from loopscale.train.settings import RunConfig, TrainConfig, load_train_config

if TYPE_CHECKING:
    from loopscale.train.loop import RunInterrupted, TrainingFailed, train
    from loopscale.train.rundir import read_result

#: names imported on first use: the trainer loads torch; the config (what light commands read) does not need it
_LAZY = {
    "RunInterrupted": "loopscale.train.loop",
    "TrainingFailed": "loopscale.train.loop",
    "train": "loopscale.train.loop",
    "read_result": "loopscale.train.rundir",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loopscale.train' has no attribute {name!r}")


__all__ = ["RunConfig", "RunInterrupted", "TrainConfig", "TrainingFailed", "load_train_config", "read_result", "train"]
