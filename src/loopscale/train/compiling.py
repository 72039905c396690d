"""How a run compiles its model: the whole model on CUDA, per block as the fallback, nothing on CPU.

One graph for the whole forward (embedding, every recurrence, the fused loss) lets inductor fuse the
elementwise work between the matmuls (norms, RoPE, the squared ReLU, the injection, the softcap) that
per-block compilation cannot reach at the loop's and the loss's seams; docs/training.md has the
estimates. On CPU at the presets' sizes compiling costs more than it returns (docs/cpu-scale.md, V),
so ``auto`` leaves CPU runs eager. Inductor caches compiled graphs on disk; a sweep points the cache at
its own directory so that every run and rank of the same shape reuses one compilation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn


def resolved_mode(mode: str, device: torch.device) -> str:
    """``auto``: the whole model on CUDA, eager on CPU."""
    if mode == "auto":
        return "model" if device.type == "cuda" else "off"
    return mode


def use_cache_dir(path: str | Path) -> None:
    """Inductor's on-disk cache in ``path`` unless the user chose one (TORCHINDUCTOR_CACHE_DIR)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(path))


def _dynamo_errors() -> tuple[type[BaseException], ...]:
    from torch._dynamo import exc

    return (exc.TorchDynamoException,)


class WholeModel:
    """Calls the compiled model; if compiling fails on the first call, compiles per block and goes on.

    Only dynamo/inductor errors fall back (an out-of-memory or a bad batch is the run's error), and only
    before the first successful call: after that the graph exists and errors are real.
    """

    def __init__(
        self,
        module: nn.Module,
        blocks: Iterable[nn.Module],
        *,
        backend: str | Callable[..., Any] = "inductor",
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.module = module
        self.blocks = list(blocks)
        self.compiled: Callable[..., Any] = torch.compile(module, backend=backend, dynamic=False)
        self.mode = "model"
        self._proven = False
        self._warn = warn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._proven:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except _dynamo_errors() as e:
            self._fall_back(e)
            return self.compiled(*args, **kwargs)
        self._proven = True
        return out

    def _fall_back(self, error: BaseException) -> None:
        cause = getattr(error, "inner_exception", None) or error.__cause__ or error  # the backend's own error
        lines = str(cause).strip().splitlines()
        if self._warn is not None:
            self._warn(
                f"whole-model torch.compile failed ({type(error).__name__}: {type(cause).__name__}: "
                f"{(lines[0] if lines else '')[:200]}); compiling each block instead"
            )
        torch._dynamo.reset()
        for b in self.blocks:
            b.compile()
        self.compiled, self.mode, self._proven = self.module, "blocks", True


def compile_for_training(
    module: nn.Module,
    blocks: Iterable[nn.Module],
    mode: str,
    device: torch.device,
    *,
    warn: Callable[[str], None] | None = None,
    backend: str | Callable[..., Any] = "inductor",
) -> tuple[Callable[..., Any], str]:
    """What a training step calls (``module``: the model or its DDP wrapper) and the mode in effect."""
    mode = resolved_mode(mode, device)
    if mode == "blocks":
        for b in blocks:
            b.compile()
    if mode != "model":
        return module, mode
    whole = WholeModel(module, blocks, backend=backend, warn=warn)
    return whole, whole.mode
