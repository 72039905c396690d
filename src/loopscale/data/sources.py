"""The user's own data: plain-text files, JSONL/Parquet with a text column, pretokenized shards.

Each reader returns documents (strings, or token arrays for shards) in a fixed order, and errors
name the file (and line) that is wrong. The validation split is either explicit files
(``data.val_paths``) or a seed-free hold-out of ``val_fraction`` of the documents chosen by sha256
of their position key, so every run and every seed validates on the same documents.

Shards: the modded-nanogpt ``.bin`` format (a 256 x int32 header: magic 20240520, version 1, token
count; then uint16 tokens) and headerless ``.u16`` / ``.u32`` (or ``.bin`` with ``shard_dtype``)
arrays. A shard is a token stream whose documents are separated by the BOS id; they are read with
``numpy.memmap`` and split at BOS.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from loopscale.errors import ConfigError

SHARD_MAGIC = 20240520
SHARD_HEADER_INTS = 256
TEXT_SUFFIXES = (".txt", ".md")


def expand_paths(paths: list[str], suffixes: tuple[str, ...], field: str) -> list[Path]:
    """Files and folders -> a sorted list of files with one of ``suffixes``; missing paths are errors."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            found = sorted((f for f in p.rglob("*") if f.is_file() and f.suffix in suffixes),
                           key=lambda f: f.as_posix())
            if not found:
                raise ConfigError(field, f"no {'/'.join(suffixes)} files in the folder", value=raw)
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise ConfigError(field, "no such file or folder", value=raw)
    if not out:
        raise ConfigError(field, "empty: give at least one file or folder", value=paths)
    return out


def read_text_files(files: list[Path]) -> list[str]:
    """One document per file (UTF-8)."""
    docs = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(str(f), f"not UTF-8 text at byte {exc.start}") from None
        if text.strip():
            docs.append(text)
    return docs


def read_jsonl(files: list[Path], text_field: str) -> list[str]:
    """One document per line: the ``text_field`` of each JSON object."""
    docs = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{f}:{n}", f"malformed JSON ({exc.msg})") from None
                if not isinstance(obj, dict) or text_field not in obj:
                    raise ConfigError(f"{f}:{n}", f"no '{text_field}' field (set data.text_field)")
                text = obj[text_field]
                if not isinstance(text, str):
                    raise ConfigError(f"{f}:{n}", f"'{text_field}' is not a string", value=type(text).__name__)
                docs.append(text)
    return docs


def read_parquet(files: list[Path], text_field: str) -> list[str]:
    import pyarrow.parquet as pq

    docs = []
    for f in files:
        try:
            table = pq.read_table(f, columns=[text_field])
        except (KeyError, ValueError) as exc:
            if text_field not in pq.read_schema(f).names:
                raise ConfigError(str(f), f"no '{text_field}' column (set data.text_field)",
                                  value=pq.read_schema(f).names) from None
            raise ConfigError(str(f), f"unreadable Parquet: {exc}") from None
        docs += [t for t in table.column(text_field).to_pylist() if isinstance(t, str)]
    return docs


def read_shard(path: Path, dtype: str = "auto") -> np.ndarray:
    """A shard's tokens as a read-only memmap (modded-nanogpt .bin header, or headerless)."""
    with open(path, "rb") as fh:
        head = np.frombuffer(fh.read(SHARD_HEADER_INTS * 4), dtype=np.int32)
    if head.size == SHARD_HEADER_INTS and head[0] == SHARD_MAGIC:
        if head[1] != 1:
            raise ConfigError(str(path), f"unsupported .bin version {int(head[1])} (expected 1)")
        n = int(head[2])
        expected = SHARD_HEADER_INTS * 4 + 2 * n
        if path.stat().st_size != expected:
            raise ConfigError(str(path), f"truncated shard: header says {n} tokens ({expected} bytes), "
                              f"file has {path.stat().st_size} bytes")
        return np.memmap(path, dtype=np.uint16, mode="r", offset=SHARD_HEADER_INTS * 4, shape=(n,))
    if dtype == "auto":
        dtype = {".u16": "uint16", ".u32": "uint32"}.get(path.suffix, "")
        if not dtype:
            raise ConfigError(str(path), "headerless shard: set data.shard_dtype to uint16 or uint32 "
                              "(or use the .u16/.u32 suffix)")
    itemsize = np.dtype(dtype).itemsize
    if path.stat().st_size % itemsize:
        raise ConfigError(str(path), f"size {path.stat().st_size} is not a multiple of {itemsize} ({dtype})")
    return np.memmap(path, dtype=dtype, mode="r")


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """Write a modded-nanogpt .bin shard (uint16 tokens), atomically."""
    from loopscale.io import atomic_write_bytes

    toks = np.asarray(tokens)
    if toks.size and (toks.max() >= 2**16 or toks.min() < 0):
        raise ConfigError(str(path), ".bin shards hold uint16 tokens; use a headerless .u32 file")
    header = np.zeros(SHARD_HEADER_INTS, dtype=np.int32)
    header[:3] = (SHARD_MAGIC, 1, toks.size)
    atomic_write_bytes(path, header.tobytes() + toks.astype(np.uint16).tobytes())


def shard_documents(tokens: np.ndarray, bos_id: int, max_tokens: int | None = None) -> Iterator[np.ndarray]:
    """Split a token stream into documents at BOS (the BOS itself is dropped; packing adds it)."""
    stream = tokens if max_tokens is None else tokens[:max_tokens]
    starts = np.flatnonzero(np.asarray(stream) == bos_id)
    bounds = [0, *starts.tolist(), len(stream)]
    for a, b in itertools.pairwise(bounds):
        lo = a + 1 if a < len(stream) and stream[a] == bos_id else a
        if b > lo:
            yield np.asarray(stream[lo:b])


def holdout(n_docs: int, val_fraction: float, salt: str) -> np.ndarray:
    """Boolean mask of held-out documents: the val_fraction with the smallest sha256(salt#i)."""
    n_val = min(max(1, round(n_docs * val_fraction)), n_docs - 1) if n_docs > 1 else 0
    keys = [hashlib.sha256(f"{salt}#{i}".encode()).hexdigest() for i in range(n_docs)]
    order = sorted(range(n_docs), key=keys.__getitem__)
    mask = np.zeros(n_docs, dtype=bool)
    mask[order[:n_val]] = True
    return mask
