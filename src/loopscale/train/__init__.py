"""Training engine: ``train(load_train_config(path, overrides), run_dir)``."""

from loopscale.train.config import RunConfig, TrainConfig, load_train_config
from loopscale.train.loop import RunInterrupted, TrainingFailed, read_result, train

__all__ = ["RunConfig", "RunInterrupted", "TrainConfig", "TrainingFailed", "load_train_config",
           "read_result", "train"]
