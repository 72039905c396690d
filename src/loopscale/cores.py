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
