"""The looped transformer: ``LoopedLM(ModelConfig(...))``."""

from loopscale.model.injection import (
    AdditiveInjection,
    HyperConnect,
    Injection,
    LinearInjection,
    Passthrough,
)
from loopscale.model.layers import MLP, Attention, Block, RMSNorm, Rotary
from loopscale.model.looped import KVCache, LoopedLM

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
