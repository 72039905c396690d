"""UTF-8 bytes per token id, for bits per byte: a loss comparable across tokenizers (nanochat's convention).

bpb = total nats / (ln 2 x total UTF-8 bytes of the target tokens); special tokens (BOS) count 0 bytes and their
loss is left out of the numerator, as nanochat's ``evaluate_bpb`` does.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def token_bytes(tokenizer: Any) -> np.ndarray:
    """int64 [vocab_size]: how many UTF-8 bytes of text each id stands for (0 for special tokens)."""
    from loopscale.data.tokenizer import ByteTokenizer

    if isinstance(tokenizer, ByteTokenizer):
        out = np.ones(tokenizer.vocab_size, dtype=np.int64)
        out[tokenizer.bos_id] = 0
        return out
    return _hf_token_bytes(tokenizer._tok)


def _hf_token_bytes(tok: Any) -> np.ndarray:
    """A ``tokenizers.Tokenizer``'s ids: byte-level BPE tokens are one byte per character of the token string
    (GPT-2's byte alphabet); byte-fallback ``<0xHH>`` tokens one byte; others their text with ``▁`` as a space."""
    import json

    spec = json.loads(tok.to_str())
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    out = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        if i in special or i >= out.size:
            continue
        if byte_level:
            out[i] = len(text)
        elif _BYTE_FALLBACK.match(text):
            out[i] = 1
        else:
            out[i] = len(text.replace("▁", " ").encode("utf-8"))
    return out
