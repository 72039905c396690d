"""Checkpoints (resume) and final weights (safetensors + config.toml), written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from loopscale.io import atomic_save_torch, atomic_write_bytes

CKPT = "ckpt.pt"
WEIGHTS = "model.safetensors"
CONFIG = "config.toml"


def save_checkpoint(run_dir: Path, *, model: torch.nn.Module, optimizers: Any, step: int,
                    extra: dict[str, Any]) -> None:
    state = {
        "step": step,
        "model": model.state_dict(),
        "optim": optimizers.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "extra": extra,
    }
    atomic_save_torch(run_dir / CKPT, state)


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CKPT
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def save_weights(run_dir: Path, model: torch.nn.Module) -> None:
    from safetensors.torch import save

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(run_dir / WEIGHTS, save(tensors, metadata={"format": "loopscale-1"}))


def load_model(path: str | Path, *, device: str = "cpu"):
    """Load a trained model from a run dir (or its model.safetensors) with its resolved config."""
    from safetensors.torch import load_file

    from loopscale.config import load_mapping, validate
    from loopscale.errors import ConfigError
    from loopscale.model import LoopedLM
    from loopscale.train.config import TrainConfig

    p = Path(path)
    run_dir = p if p.is_dir() else p.parent
    weights = run_dir / WEIGHTS
    if not weights.exists():
        raise ConfigError("checkpoint", f"no {WEIGHTS} in {run_dir} (is the run finished?)", value=str(p))
    cfg = validate(TrainConfig, load_mapping(run_dir / CONFIG), source=str(run_dir / CONFIG))
    model = LoopedLM(cfg.model)
    model.load_state_dict(load_file(weights, device=device))
    return model.to(device).eval(), cfg
