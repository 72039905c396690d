"""Token rows for training and validation, identical for every architecture, cached on disk.

The row stream depends only on the data config, the tokenizer and T — never on the model — so
r = 1 and r = 8 runs with the same data seed read exactly the same tokens. Step ``s`` reads global
rows ``s B .. s B + B - 1`` (wrapping into a freshly shuffled epoch if the budget needs more than
one), so a resumed run continues at the exact position from the step number alone.

The rows are built once per data config by streaming (``loopscale.data.cache``: bounded memory,
whatever the corpus size), published atomically under ``$LOOPSCALE_CACHE/tokens/<key>/`` and mapped
read-only, so every slot worker and DDP rank on a node shares one copy in the page cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from loopscale.config.data import DataConfig
from loopscale.data import cache, sources
from loopscale.data.tokenizer import Tokenizer
from loopscale.errors import ConfigError
from loopscale.io import cache_dir

CACHE_FORMAT = cache.FORMAT  # 2: a folder of mapped .bin files (1: one torch .pt file; now ignored)


@dataclass
class TokenData:
    """The rows a run reads. ``train`` holds them in packed order and ``order`` says which row each
    position of epoch 0 reads (the seeded shuffle), so ``batch`` returns exactly the rows it returned
    when the shuffled rows themselves were stored. From the cache, the arrays are read-only maps."""

    train: np.ndarray  # [n_rows, T + 1], uint16 or int32, packed order
    val: np.ndarray  # [n_val_rows, T + 1], packed order
    tokenizer: Tokenizer
    fingerprint: str
    order: np.ndarray | None = None  # int64 [n_rows]; None: ``train`` is already in epoch-0 order
    max_id: int = -1  # the largest id in train and val (-1: not given; computed by scanning the rows)
    path: Path | None = None  # the cache entry, if mapped from one
    built: bool = False  # this process built the rows (rather than reusing a cache entry)
    _perms: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.max_id < 0:
            self.max_id = int(max(self.train.max(), self.val.max()))

    @property
    def seq_len(self) -> int:
        return int(self.train.shape[1]) - 1

    def _row(self, g: torch.Tensor, seed: int) -> np.ndarray:
        n = self.train.shape[0]
        epoch, pos = g // n, g % n
        out = pos.clone()
        for e in epoch.unique().tolist():
            if e == 0:
                continue  # epoch 0: the packed order, shuffled by ``order``
            if e not in self._perms:  # 8 B per row per epoch reached
                gen = torch.Generator().manual_seed((seed * 1_000_003 + e) % (2**31))
                self._perms[e] = torch.randperm(n, generator=gen)
            sel = epoch == e
            out[sel] = self._perms[e][pos[sel]]
        idx: np.ndarray = out.numpy()
        return self.order[idx] if self.order is not None else idx

    def batch(self, step: int, batch_size: int, lo: int, hi: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Rows ``lo..hi-1`` of global step ``step``'s batch as (inputs, targets), int64."""
        g = torch.arange(step * batch_size + lo, step * batch_size + hi)
        rows = torch.from_numpy(np.asarray(self.train[self._row(g, seed)], dtype=np.int64))
        return rows[:, :-1], rows[:, 1:]

    def val_rows(self, val_tokens: int) -> torch.Tensor:
        n = min(self.val.shape[0], max(1, -(-val_tokens // self.seq_len)))
        return torch.from_numpy(np.array(self.val[:n], dtype=np.int64))


def make_tokenizer(cfg: DataConfig) -> Tokenizer:
    """``bytes`` (the default) or a HuggingFace tokenizer.json."""
    from loopscale.data.tokenizer import ByteTokenizer

    if cfg.tokenizer == "bytes":
        return ByteTokenizer()
    from loopscale.data.hf_tokenizer import HFTokenizer

    return HFTokenizer(cfg.tokenizer, cfg.bos_token)


def _files_signature(cfg: DataConfig) -> list[Any]:
    """Sizes and mtimes of the user's files (and the tokenizer), so edited data invalidates the cache."""

    sig: list[Any] = []
    if cfg.source != "default":
        for field, paths in (("data.paths", cfg.paths), ("data.val_paths", cfg.val_paths)):
            if paths:
                for f in sources.expand_paths(paths, _SUFFIXES[cfg.source], field):
                    st = f.stat()
                    sig.append([str(f), st.st_size, st.st_mtime_ns])
    if cfg.tokenizer != "bytes" and Path(cfg.tokenizer).is_file():
        sig.append(hashlib.sha256(Path(cfg.tokenizer).read_bytes()).hexdigest())
    return sig


_SUFFIXES = sources.SUFFIXES


def _cache_key(cfg: DataConfig, seq_len: int) -> str:
    from loopscale import __version__
    from loopscale.data import corpus, mixture

    data = cfg.model_dump(mode="json", exclude={"allow_default"})  # a permission, not part of the rows
    blob = json.dumps(
        {
            "data": data,
            "T": seq_len,
            "files": _files_signature(cfg),
            "fmt": CACHE_FORMAT,
            "loopscale": __version__,
            "corpus": corpus.CORPUS_VERSION,
            "generator": mixture.GENERATOR_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _encoder(tokenizer: Tokenizer) -> Callable[[str], Any]:
    """``encode_bytes`` where the tokenizer has it (bytes: ids without a list), else ``encode``."""
    return getattr(tokenizer, "encode_bytes", None) or tokenizer.encode


def _doc_bytes(doc: str | np.ndarray) -> bytes:
    """What the fingerprint hashes of a document: its UTF-8 text, or its ids as int64."""
    return doc.encode("utf-8") if isinstance(doc, str) else np.asarray(doc, dtype=np.int64).tobytes()


def _select(docs: Iterable[Any], mask: np.ndarray, held_out: bool) -> Iterator[Any]:
    """The documents whose hold-out flag is ``held_out``; the stream must have ``len(mask)`` documents."""
    flags = mask.tobytes()  # 1 B per document
    n = 0
    for doc in docs:
        if n == len(flags):
            raise ConfigError("data.paths", f"the files changed while being read (more than the {n} documents counted)")
        if flags[n] == held_out:
            yield doc
        n += 1
    if n != len(flags):
        raise ConfigError(
            "data.paths", f"the files changed while being read ({len(flags)} documents counted, {n} read)"
        )


def _cap_text(docs: Iterable[str], max_bytes: int) -> Iterator[str]:
    """Whole documents until ``max_bytes`` characters are reached (the one that crosses it included)."""
    total = 0
    for d in docs:
        if total >= max_bytes:
            break
        yield d
        total += len(d)


def _user_streams(
    cfg: DataConfig, tokenizer: Tokenizer
) -> tuple[Callable[[], Iterator[Any]], Callable[[], Iterator[Any]], Callable[[], str], int, np.dtype]:
    """The user's text/jsonl/parquet/shards as two document streams (train, then validation), the
    fingerprint they feed, the BOS id and the storage dtype. Nothing is held: each stream re-reads
    the files, and the hold-out (no ``val_paths``) costs one more counting pass and 1 B per document."""

    shards = cfg.source == "shards"
    bos = cfg.bos_id if cfg.bos_id is not None else tokenizer.bos_id
    files = sources.expand_paths(cfg.paths, _SUFFIXES[cfg.source], "data.paths")
    val_files = sources.expand_paths(cfg.val_paths, _SUFFIXES[cfg.source], "data.val_paths") if cfg.val_paths else None

    def docs(fs: list[Path]) -> Iterator[str | np.ndarray]:
        return sources.iter_documents(
            cfg.source,
            fs,
            text_field=cfg.text_field,
            bos_id=bos,
            shard_dtype=cfg.shard_dtype,
            max_tokens=cfg.max_tokens if shards else None,
        )

    mask = (
        None if val_files else sources.holdout(sum(1 for _ in docs(files)), cfg.val_fraction, salt="loopscale.holdout")
    )

    def train_src() -> Iterator[str | np.ndarray]:
        return docs(files) if mask is None else _select(docs(files), mask, False)

    def val_src() -> Iterator[str | np.ndarray]:
        if val_files:
            return docs(val_files)
        assert mask is not None  # no val_paths: the hold-out mask was drawn above
        return _select(docs(files), mask, True)

    encode = _encoder(tokenizer)
    h = hashlib.sha256()

    def train() -> Iterator[Any]:
        it = train_src()
        if not shards and cfg.max_tokens is not None:
            it = _cap_text(cast(Iterator[str], it), cfg.max_tokens)  # text sources yield str documents
        for d in it:
            h.update(_doc_bytes(d))
            yield d if shards else encode(cast(str, d))

    def val() -> Iterator[Any]:
        h.update(b"\x00val")
        for d in val_src():
            h.update(_doc_bytes(d))
            yield d if shards else encode(cast(str, d))

    if shards:
        fits = bos < 2**16 and all(
            sources.shard_layout(f, cfg.shard_dtype)[0].itemsize == 2 for f in [*files, *(val_files or [])]
        )
        dtype = cache.row_dtype(2**16 if fits else 2**31)
    else:
        dtype = cache.row_dtype(max(tokenizer.vocab_size, bos + 1))
    return train, val, h.hexdigest, bos, dtype


def _packing(cfg: DataConfig) -> dict[str, Any]:
    """The packer's settings; both are in ``cfg`` and so in the cache key: one mode's rows never serve the other."""
    return {"packing": cfg.packing, "buffer": cfg.packing_buffer}


def _build(cfg: DataConfig, tokenizer: Tokenizer, seq_len: int, folder: Path) -> dict[str, Any]:
    """Stream the configured data into a cache folder (``loopscale.data.cache.build``)."""
    if cfg.source == "default":  # bytes, or a BPE (e.g. `loopscale tokenizer train --default`)
        from loopscale.data.mixture import build_default

        data = build_default(cfg)  # ~8M tokens, built in memory in about a second
        encode = _encoder(tokenizer)
        train: Callable[[], Iterator[Any]] = functools.partial(map, encode, data.train_docs)
        val: Callable[[], Iterator[Any]] = functools.partial(map, encode, data.val_docs)
        fingerprint, bos = data.fingerprint, tokenizer.bos_id
        dtype = cache.row_dtype(max(tokenizer.vocab_size, bos + 1))
    else:
        train, val, fingerprint, bos, dtype = _user_streams(cfg, tokenizer)
    return cache.build(
        folder,
        train_docs=train,
        val_docs=val,
        seq_len=seq_len,
        bos_id=bos,
        seed=cfg.seed,
        dtype=dtype,
        fingerprint=fingerprint,
        extra={"source": cfg.source},
        **_packing(cfg),
    )


def check_allowed(cfg: DataConfig) -> None:
    """``data.allow_default = false`` (the paper preset) refuses the embedded default: it is an 8M-token
    stand-in that a paper-scale run would repeat 40-1,303 times, so training on it must be asked for."""
    if cfg.source == "default" and not cfg.allow_default:
        raise ConfigError(
            "data.source",
            "the embedded default (an 8M-token stand-in) is refused by "
            "data.allow_default = false ([train.data] of the paper preset): set data.source and "
            "data.paths to your data, or data.allow_default = true to train on the stand-in anyway",
        )


def load_token_data(cfg: DataConfig, seq_len: int, *, use_cache: bool = True) -> TokenData:
    """The packed training and validation rows: mapped from the cache, built into it first if needed.

    ``use_cache=False`` builds into a temporary folder and keeps the rows in memory (small data only).
    """
    check_allowed(cfg)
    tokenizer = make_tokenizer(cfg)
    build_into = functools.partial(_build, cfg, tokenizer, seq_len)
    if use_cache:
        rows = cache.get_or_build(cache_dir() / "tokens", _cache_key(cfg, seq_len), build_into)
    else:
        rows = cache.build_in_memory(build_into)
    return TokenData(
        rows.train,
        rows.val,
        tokenizer,
        rows.meta["fingerprint"],
        order=rows.order,
        max_id=int(rows.meta["max_id"]),
        path=rows.path,
        built=rows.built,
    )
