"""Checkpoints (resume) and final weights (safetensors + config.toml), written atomically.

A checkpoint holds only tensors, dicts, lists, strings and numbers, and is read back with
``torch.load(weights_only=True)``: a ``ckpt.pt`` crafted to run code (run dirs are shared and copied)
is refused, never unpickled. An unreadable one (truncated, not a checkpoint) is moved aside and the
run starts again from step 0: only the last checkpoint is kept, so there is no earlier state to go
back to, and a restarted run follows the same trajectory (docs/training.md).
"""

from __future__ import annotations

import pickle
import sys
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from loopscale.errors import ConfigError
from loopscale.io import atomic_save_torch, atomic_write_bytes, remove_stale_temps, set_aside

if TYPE_CHECKING:  # imported where loaded: a checkpoint read for resume needs neither
    from loopscale.model import LoopedLM
    from loopscale.train.settings import TrainConfig

CKPT = "ckpt.pt"
WEIGHTS = "model.safetensors"
CONFIG = "config.toml"
#: the files only the run's trainer writes: their atomic-write leftovers are removed when it starts
OWN_FILES = (CKPT, WEIGHTS, CONFIG, "metrics.jsonl")
_KEYS = ("step", "model", "optim", "torch_rng")


class _Unreadable(Exception):
    """The checkpoint cannot be read back as one (the reason is the message)."""


def save_checkpoint(
    run_dir: Path,
    *,
    model: Any,
    optimizers: Any,
    step: int,
    extra: dict[str, Any],
    torch_rng: torch.Tensor | None = None,
) -> None:
    """``ckpt.pt``: the state dicts of ``model`` and ``optimizers`` (anything with ``state_dict()``), the step,
    the RNG state (``torch_rng``, default this process's: a pack's member passes its own) and ``extra``."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optim": optimizers.state_dict(),
        "torch_rng": torch.get_rng_state() if torch_rng is None else torch_rng,
        "extra": extra,
    }
    atomic_save_torch(run_dir / CKPT, state)


def load_checkpoint(run_dir: Path, *, is_main: bool = True) -> dict[str, Any] | None:
    """The run's checkpoint, or None to start from step 0 (none, or unreadable and moved aside).

    At a run's start: the main process also removes the temporary files a kill left mid-write.
    Raises ConfigError (one line naming the file) for a checkpoint the safe loader refuses.
    """
    if is_main:
        remove_stale_temps(run_dir, OWN_FILES)
    path = run_dir / CKPT
    if not path.exists():
        return None
    try:
        return _read(path)
    except FileNotFoundError:  # another rank set it aside first
        return None
    except _Unreadable as why:
        if is_main:  # other ranks read the same bytes, fail the same way and also start from step 0
            aside = set_aside(path)
            print(
                f"warning: {path} is unreadable ({why}); moved to {aside.name}, the run restarts from step 0",
                file=sys.stderr,
                flush=True,
            )
        return None


def _read(path: Path) -> dict[str, Any]:
    """Load with the safe (weights-only) unpickler; _Unreadable for damage, ConfigError for refused content."""
    try:
        with warnings.catch_warnings():  # a raw pickle makes torch warn about its protocol: noise here
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not zipfile.is_zipfile(path):  # not torch.save's format: damaged (it is never unpickled)
            raise _Unreadable(f"not a checkpoint: {_first_line(exc)}") from None
        raise ConfigError(
            "checkpoint",
            "refused to load: it holds objects a loopscale checkpoint never contains "
            "(unpickling them could run code); delete it only if you trust it was meant to be "
            "here, then rerun to start the run from step 0",
            source=str(path),
        ) from None
    except OSError:
        raise  # missing, or an I/O error that may pass: never a reason to drop the run's progress
    except Exception as exc:  # truncated or damaged archive, empty file
        raise _Unreadable(f"{type(exc).__name__}: {_first_line(exc)}") from None
    if not isinstance(state, dict) or any(k not in state for k in _KEYS):
        raise _Unreadable(f"not a loopscale checkpoint (expected the keys {', '.join(_KEYS)})")
    return state


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "no message")[:160]


def tidy_finished(run_dir: Path, *, keep_checkpoint: bool) -> None:
    """Remove what a finished run no longer needs: ``ckpt.pt`` (unless kept) and atomic-write leftovers.

    The trainer removes ``ckpt.pt`` right after ``result.json``; a kill in between left it behind.
    Evaluation reads ``model.safetensors`` and ``config.toml`` only (``load_model``).
    """
    remove_stale_temps(run_dir, OWN_FILES)
    if not keep_checkpoint:
        (run_dir / CKPT).unlink(missing_ok=True)


def save_weights(run_dir: Path, model: torch.nn.Module) -> None:
    from safetensors.torch import save

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(run_dir / WEIGHTS, save(tensors, metadata={"format": "loopscale-1"}))


def load_model(path: str | Path, *, device: str = "cpu") -> tuple[LoopedLM, TrainConfig]:
    """Load a trained model from a run dir (or its model.safetensors) with its resolved config."""
    from safetensors.torch import load_file

    from loopscale.config import load_mapping, validate
    from loopscale.errors import ConfigError
    from loopscale.model import LoopedLM
    from loopscale.train.settings import TrainConfig

    p = Path(path)
    run_dir = p if p.is_dir() else p.parent
    weights = run_dir / WEIGHTS
    if not weights.exists():
        raise ConfigError("checkpoint", f"no {WEIGHTS} in {run_dir} (is the run finished?)", value=str(p))
    cfg = validate(TrainConfig, load_mapping(run_dir / CONFIG), source=str(run_dir / CONFIG))
    model = LoopedLM(cfg.model)
    model.load_state_dict(load_file(weights, device=device))
    return model.to(device).eval(), cfg
