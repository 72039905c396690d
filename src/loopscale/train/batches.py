"""Token rows for training and validation, identical for every architecture, cached on disk.

The row stream depends only on the data config, the tokenizer and T — never on the model — so
r = 1 and r = 8 runs with the same data seed read exactly the same tokens. Step ``s`` reads global
rows ``s B .. s B + B - 1`` (wrapping into a freshly shuffled epoch if the budget needs more than
one), so a resumed run continues at the exact position from the step number alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loopscale.data.config import DataConfig
from loopscale.data.tokenizer import Tokenizer
from loopscale.errors import ConfigError

CACHE_FORMAT = 1


def cache_dir() -> Path:
    return Path(os.environ.get("LOOPSCALE_CACHE", Path.home() / ".cache" / "loopscale"))


@dataclass
class TokenData:
    train: torch.Tensor  # [n_rows, T + 1], int32
    val: torch.Tensor  # [n_val_rows, T + 1], int32
    tokenizer: Tokenizer
    fingerprint: str
    _perms: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def seq_len(self) -> int:
        return self.train.size(1) - 1

    def _row(self, g: torch.Tensor, seed: int) -> torch.Tensor:
        n = self.train.size(0)
        epoch, pos = g // n, g % n
        out = pos.clone()
        for e in epoch.unique().tolist():
            if e == 0:
                continue  # epoch 0: the packed (already shuffled) order
            if e not in self._perms:
                gen = torch.Generator().manual_seed((seed * 1_000_003 + e) % (2**31))
                self._perms[e] = torch.randperm(n, generator=gen)
            sel = epoch == e
            out[sel] = self._perms[e][pos[sel]]
        return out

    def batch(self, step: int, batch_size: int, lo: int, hi: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Rows ``lo..hi-1`` of global step ``step``'s batch as (inputs, targets), int64."""
        g = torch.arange(step * batch_size + lo, step * batch_size + hi)
        rows = self.train[self._row(g, seed)].long()
        return rows[:, :-1], rows[:, 1:]

    def val_rows(self, val_tokens: int) -> torch.Tensor:
        n = min(self.val.size(0), max(1, -(-val_tokens // self.seq_len)))
        return self.val[:n].long()


def _cache_key(cfg: DataConfig, seq_len: int, tokenizer_name: str) -> str:
    from loopscale import __version__
    from loopscale.data import corpus

    blob = json.dumps({"data": cfg.model_dump(mode="json"), "T": seq_len, "tok": tokenizer_name,
                       "fmt": CACHE_FORMAT, "loopscale": __version__,
                       "corpus": getattr(corpus, "CORPUS_VERSION", "")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def load_token_data(cfg: DataConfig, seq_len: int, *, use_cache: bool = True) -> TokenData:
    """Build (or load from the cache) the packed training and validation rows."""
    from loopscale.data.mixture import build_default
    from loopscale.data.packing import pack_texts
    from loopscale.data.tokenizer import ByteTokenizer
    from loopscale.io import atomic_save_torch

    tokenizer: Tokenizer = ByteTokenizer()
    key = _cache_key(cfg, seq_len, getattr(tokenizer, "name", type(tokenizer).__name__))
    path = cache_dir() / "tokens" / f"{key}.pt"
    if use_cache and path.exists():
        try:
            blob = torch.load(path, weights_only=True)
            return TokenData(blob["train"], blob["val"], tokenizer, blob["fingerprint"])
        except Exception:  # a corrupt cache entry is rebuilt, never trusted
            path.unlink(missing_ok=True)
    data = build_default(cfg)
    train = pack_texts(data.train_docs, tokenizer, seq_len, seed=cfg.seed).to(torch.int32)
    val = pack_texts(data.val_docs, tokenizer, seq_len, seed=cfg.seed, shuffle=False).to(torch.int32)
    if train.size(0) == 0 or val.size(0) == 0:
        raise ConfigError("data", f"yields no complete row of T+1 = {seq_len + 1} tokens "
                          f"(train rows {train.size(0)}, validation rows {val.size(0)})")
    td = TokenData(train, val, tokenizer, data.fingerprint())
    if use_cache:
        atomic_save_torch(path, {"train": train, "val": val, "fingerprint": td.fingerprint})
    return td
