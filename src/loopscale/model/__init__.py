"""The looped transformer: ``LoopedLM(ModelConfig(...))``.

The names below load on first use (PEP 562): importing a torch-free part of the model (``loopscale.model.chunks``,
which ``loopscale.memory`` and so ``sweep plan`` read) does not load torch.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopscale.model.injection import AdditiveInjection, HyperConnect, Injection, LinearInjection, Passthrough
    from loopscale.model.layers import MLP, Attention, Block, RMSNorm, Rotary
    from loopscale.model.looped import KVCache, LoopedLM

_INJECTION = ("AdditiveInjection", "HyperConnect", "Injection", "LinearInjection", "Passthrough")
_LAYERS = ("MLP", "Attention", "Block", "RMSNorm", "Rotary")
_LOOPED = ("KVCache", "LoopedLM")


def __getattr__(name: str) -> Any:
    """The model's classes (torch) load on first use."""
    if name in _INJECTION:
        from loopscale.model import injection

        return getattr(injection, name)
    if name in _LAYERS:
        from loopscale.model import layers

        return getattr(layers, name)
    if name in _LOOPED:
        from loopscale.model import looped

        return getattr(looped, name)
    raise AttributeError(f"module 'loopscale.model' has no attribute {name!r}")


__all__ = [
    "MLP",
    "AdditiveInjection",
    "Attention",
    "Block",
    "HyperConnect",
    "Injection",
    "KVCache",
    "LinearInjection",
    "LoopedLM",
    "Passthrough",
    "RMSNorm",
    "Rotary",
]
