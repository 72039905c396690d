"""Tokenizers. The embedded default is byte-level: no training, no file, same ids everywhere.

Anything with ``encode``, ``decode``, ``vocab_size`` and ``bos_id`` is a ``Tokenizer``; a BPE
(HuggingFace ``tokenizers``) can be added later without changing packing, training or eval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of loopscale needs from a tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Number of token ids, including special tokens (ids are 0 .. vocab_size - 1)."""
        ...

    @property
    def bos_id(self) -> int:
        """Begin-of-sequence id; every packed row and every document starts with it."""
        ...

    def encode(self, text: str) -> list[int]:
        """Text -> ids, without BOS (packing adds it)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; special tokens are dropped."""
        ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; BOS is 256; ``vocab_size = 257``.

    A model config for it uses ``vocab_size=257`` (padded to ``vocab_multiple`` by the model).
    """

    vocab_size = 257
    bos_id = 256
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, text: str) -> bytes:
        """The same ids as ``encode`` as a ``bytes`` object (fast path for packing large streams)."""
        return text.encode("utf-8")

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=257, bos_id=256)"
