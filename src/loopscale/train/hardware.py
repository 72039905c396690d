"""Where a run executes: device, threads, autocast, distributed setup, peak FLOP/s for MFU."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

import torch

# Dense bf16 peak FLOP/s by device-name substring (vendor data sheets, without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12,
             "L4": 121e12, "4090": 165e12, "V100": 125e12}


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def setup_dist(device_pref: str) -> tuple[Dist, torch.device]:
    """Initialise torch.distributed when launched by torchrun (gloo on CPU, NCCL on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if device_pref == "cuda" and not torch.cuda.is_available():
        from loopscale.errors import ConfigError

        raise ConfigError("run.device", "CUDA requested but torch sees no GPU", value="cuda")
    device = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world, local), device


def setup_threads(threads: int | None, dist: Dist) -> int:
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.world)))
    n = threads or max(1, available_cores() // max(1, local_world))
    torch.set_num_threads(n)
    return n


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    want = dtype if dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    if want == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def resolved_dtype(device: torch.device, dtype: str) -> str:
    return dtype if dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """Peak FLOP/s per device for MFU, or None where it is unknown (CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16.items():
        if key in name:
            return peak if resolved_dtype(device, dtype) == "bfloat16" else peak / 2
    return None


def hardware_info(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {"device": str(device), "cpu": cpu, "cores": available_cores(),
                            "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def versions() -> dict[str, str]:
    import loopscale

    return {"loopscale": loopscale.__version__, "torch": torch.__version__,
            "python": sys.version.split()[0], "platform": platform.platform()}
