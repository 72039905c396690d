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
from typing import Any

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


def make_tokenizer(cfg: DataConfig) -> Tokenizer:
    """``bytes`` (the default) or a HuggingFace tokenizer.json."""
    from loopscale.data.tokenizer import ByteTokenizer

    if cfg.tokenizer == "bytes":
        return ByteTokenizer()
    from loopscale.data.hf_tokenizer import HFTokenizer

    return HFTokenizer(cfg.tokenizer, cfg.bos_token)


def _files_signature(cfg: DataConfig) -> list:
    """Sizes and mtimes of the user's files (and the tokenizer), so edited data invalidates the cache."""
    from loopscale.data import sources

    sig = []
    if cfg.source != "default":
        for field, paths in (("data.paths", cfg.paths), ("data.val_paths", cfg.val_paths)):
            if paths:
                for f in sources.expand_paths(paths, _SUFFIXES[cfg.source], field):
                    st = f.stat()
                    sig.append([str(f), st.st_size, st.st_mtime_ns])
    if cfg.tokenizer != "bytes" and Path(cfg.tokenizer).is_file():
        sig.append(hashlib.sha256(Path(cfg.tokenizer).read_bytes()).hexdigest())
    return sig


_SUFFIXES = {"text": (".txt", ".md"), "jsonl": (".jsonl", ".json"), "parquet": (".parquet",),
             "shards": (".bin", ".u16", ".u32")}


def _cache_key(cfg: DataConfig, seq_len: int) -> str:
    from loopscale import __version__
    from loopscale.data import corpus, mixture

    blob = json.dumps({"data": cfg.model_dump(mode="json"), "T": seq_len, "files": _files_signature(cfg),
                       "fmt": CACHE_FORMAT, "loopscale": __version__,
                       "corpus": corpus.CORPUS_VERSION, "generator": mixture.GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _user_rows(cfg: DataConfig, tokenizer: Tokenizer, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Pack the user's text/jsonl/parquet/shards into train and validation rows."""
    import numpy as np

    from loopscale.data import sources
    from loopscale.data.packing import pack_rows, pack_texts

    def read(paths: list[str], field: str) -> list:
        files = sources.expand_paths(paths, _SUFFIXES[cfg.source], field)
        if cfg.source == "text":
            return sources.read_text_files(files)
        if cfg.source == "jsonl":
            return sources.read_jsonl(files, cfg.text_field)
        if cfg.source == "parquet":
            return sources.read_parquet(files, cfg.text_field)
        bos = cfg.bos_id if cfg.bos_id is not None else tokenizer.bos_id
        docs: list = []
        budget = cfg.max_tokens
        for f in files:
            toks = sources.read_shard(f, cfg.shard_dtype)
            docs += list(sources.shard_documents(toks, bos, budget))
            if budget is not None:
                budget -= min(budget, len(toks))
                if budget == 0:
                    break
        return docs

    train_docs = read(cfg.paths, "data.paths")
    if cfg.val_paths:
        val_docs = read(cfg.val_paths, "data.val_paths")
    else:
        mask = sources.holdout(len(train_docs), cfg.val_fraction, salt="loopscale.holdout")
        val_docs = [d for d, m in zip(train_docs, mask, strict=True) if m]
        train_docs = [d for d, m in zip(train_docs, mask, strict=True) if not m]
    if cfg.source != "shards" and cfg.max_tokens is not None:
        train_docs = _cap_text(train_docs, cfg.max_tokens)
    h = hashlib.sha256()
    for d in [*train_docs, "\x00val", *val_docs]:
        h.update(d.encode("utf-8") if isinstance(d, str) else np.asarray(d, dtype=np.int64).tobytes())
    if cfg.source == "shards":
        bos = cfg.bos_id if cfg.bos_id is not None else tokenizer.bos_id
        train = pack_rows((d.tolist() for d in train_docs), seq_len, bos, seed=cfg.seed, **_packing(cfg))
        val = pack_rows((d.tolist() for d in val_docs), seq_len, bos, seed=cfg.seed, shuffle=False,
                        **_packing(cfg))
    else:
        train = pack_texts(train_docs, tokenizer, seq_len, seed=cfg.seed, **_packing(cfg))
        val = pack_texts(val_docs, tokenizer, seq_len, seed=cfg.seed, shuffle=False, **_packing(cfg))
    return train, val, h.hexdigest()


def _packing(cfg: DataConfig) -> dict[str, Any]:
    """The packer's settings; both are in ``cfg`` and so in the cache key: one mode's rows never serve the other."""
    return {"packing": cfg.packing, "buffer": cfg.packing_buffer}


def _cap_text(docs: list[str], max_bytes: int) -> list[str]:
    out, total = [], 0
    for d in docs:
        if total >= max_bytes:
            break
        out.append(d)
        total += len(d)
    return out


def load_token_data(cfg: DataConfig, seq_len: int, *, use_cache: bool = True) -> TokenData:
    """Build (or load from the cache) the packed training and validation rows."""
    from loopscale.data.mixture import build_default
    from loopscale.data.packing import pack_texts
    from loopscale.io import atomic_save_torch

    tokenizer = make_tokenizer(cfg)
    key = _cache_key(cfg, seq_len)
    path = cache_dir() / "tokens" / f"{key}.pt"
    if use_cache and path.exists():
        try:
            blob = torch.load(path, weights_only=True)
            return TokenData(blob["train"], blob["val"], tokenizer, blob["fingerprint"])
        except Exception:  # a corrupt cache entry is rebuilt, never trusted
            path.unlink(missing_ok=True)
    if cfg.source == "default":  # bytes, or a BPE (e.g. `loopscale tokenizer train --default`)
        data = build_default(cfg)
        train = pack_texts(data.train_docs, tokenizer, seq_len, seed=cfg.seed, **_packing(cfg))
        val = pack_texts(data.val_docs, tokenizer, seq_len, seed=cfg.seed, shuffle=False, **_packing(cfg))
        fingerprint = data.fingerprint()
    else:
        train, val, fingerprint = _user_rows(cfg, tokenizer, seq_len)
    if train.size(0) == 0 or val.size(0) == 0:
        raise ConfigError("data", f"yields no complete row of T+1 = {seq_len + 1} tokens "
                          f"(train rows {train.size(0)}, validation rows {val.size(0)})")
    dtype = torch.int32
    td = TokenData(train.to(dtype), val.to(dtype), tokenizer, fingerprint)
    if use_cache:
        atomic_save_torch(path, {"train": td.train, "val": td.val, "fingerprint": fingerprint})
    return td
