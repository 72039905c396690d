"""Where a run executes: device, threads, autocast, distributed setup, peak FLOP/s for MFU."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

import torch

from loopscale.cores import SLOT_CORES_ENV, available_cores, uses_cuda  # also imported from here

# Dense bf16 tensor-core peak FLOP/s by device name, as torch reports it (``torch.cuda.get_device_name``),
# most specific first: the first listed substring found in the name wins. NVIDIA's data sheets list bf16
# "with sparsity"; these are half of that (dense). H100 data sheet: SXM 1,979 -> 989 (torch: "NVIDIA H100
# 80GB HBM3"), NVL 1,671 -> 835 per GPU ("NVIDIA H100 NVL"); H100 PCIe product brief (PB-11133): 1,513 ->
# 756 ("NVIDIA H100 PCIe"); H200 data sheet: SXM 1,979 -> 989, NVL 1,671 -> 835. A100 (SXM and PCIe) 312,
# L40S 362, L40 181, A10G 125, L4 121, RTX 4090 165, V100 125 (fp16: it has no bf16 units).
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200 NVL", 835e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("A10G", 125e12),
    ("L4", 121e12),
    ("4090", 165e12),
    ("V100", 125e12),
)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_dist(device_pref: str) -> tuple[Dist, torch.device]:
    """Initialise torch.distributed when launched by torchrun (gloo on CPU, NCCL on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = uses_cuda(device_pref)
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
    """Set torch's intra-op threads: ``threads`` (``run.threads``) when given, else this process's share.

    The share is the cores this process may use over the processes on this node: all available cores, or a
    local sweep slot's part of them (``LOOPSCALE_SLOT_CORES``, so 8 slots on 8 GPUs do not each take every
    core), divided among the node's ranks (``LOCAL_WORLD_SIZE``).
    """
    from loopscale.cores import check_threads

    check_threads(threads)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.world)))
    n = threads or max(1, _cores_for_this_slot() // max(1, local_world))
    torch.set_num_threads(n)
    return n


#: glibc mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MALLOC_ENV = "LOOPSCALE_MALLOC"


def tune_cpu_malloc() -> bool:
    """Keep freed activations in the heap for the next step instead of returning them to the kernel (glibc).

    A CPU training step allocates and frees megabytes of activations per op. glibc serves blocks above its
    mmap threshold with fresh ``mmap``s, so every such tensor is zero-filled by page faults on first touch,
    and trims the heap back to the kernel when its free top grows. Raising the mmap threshold to glibc's
    maximum (32 MiB) and the trim threshold to 1 GiB keeps those pages mapped (at d = 128 minor page faults
    per step fell from 7,765 to 208; bench/RESULTS.md, issue 20); the process's resident size stays at its
    high-water mark instead. ``LOOPSCALE_MALLOC=default`` keeps glibc's defaults (``tuned`` or unset: these
    settings; anything else is refused); a no-op on other C libraries. Returns whether they were applied.
    """
    choice = os.environ.get(MALLOC_ENV, "").strip().lower()
    if choice not in ("", "tuned", "default"):
        from loopscale.errors import ConfigError

        raise ConfigError(MALLOC_ENV, "expected 'tuned' (or unset) or 'default'", value=choice, source="environment")
    if choice == "default" or platform.libc_ver()[0] != "glibc":
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    settings = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)


def _cores_for_this_slot() -> int:
    text = os.environ.get(SLOT_CORES_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else available_cores()


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager[Any]:
    want = dtype if dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    if want == "float32":
        return contextlib.nullcontext()
    ctx: contextlib.AbstractContextManager[Any] = torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return ctx


def resolved_dtype(device: torch.device, dtype: str) -> str:
    return dtype if dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")


def peak_bf16(name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``name`` (as torch reports it), or None if not listed."""
    low = name.lower()
    return next((peak for key, peak in PEAK_BF16 if key.lower() in low), None)


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """Peak FLOP/s per device for MFU, or None where it is unknown (CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    peak = peak_bf16(torch.cuda.get_device_name(device))
    if peak is None:
        return None
    return peak if resolved_dtype(device, dtype) == "bfloat16" else peak / 2


def hardware_info(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "device": str(device),
        "cpu": cpu,
        "cores": available_cores(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cpu":  # whether the compiled kernels run (or the torch ops, and why)
        from loopscale.model import cpu_kernels

        info["cpu_kernels"] = cpu_kernels.status()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def versions() -> dict[str, str]:
    import loopscale

    return {
        "loopscale": loopscale.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
