"""HuggingFace ``tokenizers`` support: load a ``tokenizer.json`` (e.g. the user's Llama-2 one) or
train a byte-level BPE on local text (``loopscale tokenizer train``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from loopscale.errors import ConfigError

BOS_CANDIDATES = ("<|bos|>", "<s>", "<|begin_of_text|>", "<|endoftext|>", "[BOS]", "<bos>")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` behind loopscale's ``Tokenizer`` protocol (encode without BOS)."""

    def __init__(self, path: str | Path, bos_token: str | None = None) -> None:
        from tokenizers import Tokenizer

        p = Path(path)
        if not p.is_file():
            raise ConfigError("data.tokenizer", "tokenizer.json not found", value=str(path))
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise ConfigError("data.tokenizer", f"not a HuggingFace tokenizer.json ({exc})", value=str(p)) from None
        vocab = self._tok.get_vocab(with_added_tokens=True)
        names = [bos_token] if bos_token else list(BOS_CANDIDATES)
        found = next((t for t in names if t in vocab), None)
        if found is None:
            raise ConfigError("data.bos_token", f"none of {names} is in the tokenizer's vocabulary", value=bos_token)
        self.bos_id = vocab[found]
        self.bos_token = found
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.name = f"hf:{p.name}"

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def train_bpe(texts: Iterable[str], vocab_size: int, out: str | Path, *, min_frequency: int = 2) -> Path:
    """Train a byte-level BPE with a ``<|bos|>`` special token and save it as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 + 1:
        raise ConfigError(
            "--vocab-size", "a byte-level BPE needs at least 258 tokens (256 bytes + BOS)", value=vocab_size
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=["<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size(with_added_tokens=True) <= 257:  # 256 bytes + <|bos|>: nothing learned
        raise ConfigError(
            "paths",
            f"the text yields no BPE merge (no pair of tokens occurs {min_frequency} times); "
            "give more text; nothing written",
            value=str(out),
        )
    from loopscale.io import atomic_write_text

    out = Path(out)
    atomic_write_text(out, tok.to_str())
    return out
