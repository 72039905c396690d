"""This machine's CPU cores and whether it could have a CUDA device, answered without importing torch.

Planning commands (``sweep plan``, the local executor's slot count) ask these before any run starts;
torch is a 1.5 s import, and on a host with no NVIDIA driver there is no CUDA device to ask it about.
"""

from __future__ import annotations

import os
import shutil

# A sweep's local slot tells its worker how many cores it may use (the slot's share of the machine).
SLOT_CORES_ENV = "LOOPSCALE_SLOT_CORES"


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def check_slots(slots: int | None, flag: str = "--slots") -> None:
    """CPU slots above the cores only slow every run down (1000 slots started one worker per pending run and
    printed 1000 threads): refused in one line. GPU slots come from ``--gpus``, not from this."""
    from loopscale.errors import ConfigError

    cores = available_cores()
    if slots is not None and slots > cores:
        raise ConfigError(
            flag,
            f"expected at most {cores} (this machine's cores: each slot trains one run on its own share of them)",
            value=slots,
        )


def check_threads(threads: int | None, field: str = "run.threads") -> None:
    """More intra-op threads than cores wait for each other (run.threads = 1000 ran 18x slower): refused."""
    from loopscale.errors import ConfigError

    cores = available_cores()
    if threads is not None and threads > cores:
        raise ConfigError(
            field, f"expected at most {cores} (this machine's cores); unset it to use them all", value=threads
        )


def nvidia_driver() -> bool:
    """An NVIDIA driver on this host (its proc file or nvidia-smi): without one, CUDA cannot be available."""
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def uses_cuda(device_pref: str) -> bool:
    """Whether a run with ``run.device = device_pref`` trains on CUDA (and so under NCCL, else gloo)."""
    if device_pref == "cuda":
        return True
    if device_pref != "auto" or not nvidia_driver():
        return False
    import torch

    return torch.cuda.is_available()
