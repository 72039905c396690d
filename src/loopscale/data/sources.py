"""The user's own data: plain-text files, JSONL/Parquet with a text column, pretokenized shards.

Each reader returns documents (strings, or token arrays for shards) in a fixed order, and errors
name the file (and line) that is wrong. The validation split is either explicit files
(``data.val_paths``) or a seed-free hold-out of ``val_fraction`` of the documents chosen by sha256
of their position key, so every run and every seed validates on the same documents.

Shards: the modded-nanogpt ``.bin`` format (a 256 x int32 header: magic 20240520, version 1, token
count; then uint16 tokens) and headerless ``.u16`` / ``.u32`` (or ``.bin`` with ``shard_dtype``)
arrays. A shard is a token stream whose documents are separated by the BOS id; they are read with
``numpy.memmap`` and split at BOS.

Everything here also streams (``iter_documents``): one document, one JSONL line, one Parquet batch or
one window of ``SHARD_WINDOW`` shard tokens at a time, so that a corpus far larger than memory can
be packed (``loopscale.data.cache``). The ``read_*`` functions are the same readers collected into
lists, for small data.
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
#: the files each ``data.source`` reads from a folder
SUFFIXES = {
    "text": (".txt", ".md"),
    "jsonl": (".jsonl", ".json"),
    "parquet": (".parquet",),
    "shards": (".bin", ".u16", ".u32"),
}


def expand_paths(paths: list[str], suffixes: tuple[str, ...], field: str) -> list[Path]:
    """Files and folders -> a sorted list of files with one of ``suffixes``; missing paths are errors."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            found = sorted(
                (f for f in p.rglob("*") if f.is_file() and f.suffix in suffixes), key=lambda f: f.as_posix()
            )
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


def iter_text_files(files: list[Path]) -> Iterator[str]:
    """One document per file (UTF-8); blank files are skipped."""
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(str(f), f"not UTF-8 text at byte {exc.start}") from None
        if text.strip():
            yield text


def read_text_files(files: list[Path]) -> list[str]:
    """One document per file (UTF-8)."""
    return list(iter_text_files(files))


def iter_jsonl(files: list[Path], text_field: str) -> Iterator[str]:
    """One document per line: the ``text_field`` of each JSON object."""
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
                yield text


def read_jsonl(files: list[Path], text_field: str) -> list[str]:
    """One document per line: the ``text_field`` of each JSON object."""
    return list(iter_jsonl(files, text_field))


def iter_parquet(files: list[Path], text_field: str, batch_rows: int = 1024) -> Iterator[str]:
    """One document per row of column ``text_field`` (non-strings skipped), ``batch_rows`` rows at a time."""
    import pyarrow.parquet as pq

    for f in files:
        try:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
            if text_field not in names:
                raise ConfigError(str(f), f"no '{text_field}' column (set data.text_field)", value=names)
            for batch in pf.iter_batches(batch_size=batch_rows, columns=[text_field]):
                yield from (t for t in batch.column(0).to_pylist() if isinstance(t, str))
        except (KeyError, ValueError, OSError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(str(f), f"unreadable Parquet: {exc}") from None


def read_parquet(files: list[Path], text_field: str) -> list[str]:
    return list(iter_parquet(files, text_field))


def shard_layout(path: Path, dtype: str = "auto") -> tuple[np.dtype, int, int]:
    """``(token dtype, byte offset of the first token, number of tokens)`` of a shard, checked."""
    with open(path, "rb") as fh:
        raw = fh.read(SHARD_HEADER_INTS * 4)
    head = np.frombuffer(raw if len(raw) == SHARD_HEADER_INTS * 4 else b"", dtype=np.int32)
    if head.size == SHARD_HEADER_INTS and head[0] == SHARD_MAGIC:
        if head[1] != 1:
            raise ConfigError(str(path), f"unsupported .bin version {int(head[1])} (expected 1)")
        n = int(head[2])
        expected = SHARD_HEADER_INTS * 4 + 2 * n
        if path.stat().st_size != expected:
            raise ConfigError(
                str(path),
                f"truncated shard: header says {n} tokens ({expected} bytes), file has {path.stat().st_size} bytes",
            )
        return np.dtype(np.uint16), SHARD_HEADER_INTS * 4, n
    if dtype == "auto":
        dtype = {".u16": "uint16", ".u32": "uint32"}.get(path.suffix, "")
        if not dtype:
            raise ConfigError(
                str(path), "headerless shard: set data.shard_dtype to uint16 or uint32 (or use the .u16/.u32 suffix)"
            )
    itemsize = np.dtype(dtype).itemsize
    if path.stat().st_size % itemsize:
        raise ConfigError(str(path), f"size {path.stat().st_size} is not a multiple of {itemsize} ({dtype})")
    return np.dtype(dtype), 0, path.stat().st_size // itemsize


def read_shard(path: Path, dtype: str = "auto") -> np.ndarray:
    """A shard's tokens as a read-only memmap (modded-nanogpt .bin header, or headerless)."""
    dt, offset, n = shard_layout(path, dtype)
    if n == 0:
        return np.zeros(0, dtype=dt)
    return np.memmap(path, dtype=dt, mode="r", offset=offset, shape=(n,))


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


SHARD_WINDOW = 1 << 22  # tokens read at a time: 8 MB of uint16, 16 MB of uint32


def iter_shard_documents(
    path: Path, bos_id: int, dtype: str = "auto", max_tokens: int | None = None, window: int = SHARD_WINDOW
) -> Iterator[np.ndarray]:
    """``shard_documents(read_shard(path, dtype), bos_id, max_tokens)``, read ``window`` tokens at a time.

    The same documents in the same order, but the file is read with plain reads into a window
    buffer, not mapped: the process holds one window (plus a document spanning windows), never the
    shard's pages, however large the shard.
    """
    dt, offset, n = shard_layout(path, dtype)
    if max_tokens is not None:
        n = min(n, max_tokens)
    carry: list[np.ndarray] = []  # the open document's tokens from earlier windows
    with open(path, "rb") as fh:
        fh.seek(offset)
        done = 0
        while done < n:
            buf = np.empty(min(window, n - done), dtype=dt)
            if fh.readinto(buf.data.cast("B")) != buf.nbytes:  # buf.data: the array's memoryview
                raise ConfigError(str(path), "truncated shard: the file ended while it was read")
            done += buf.size
            cuts = np.flatnonzero(buf == bos_id).tolist()
            if not cuts:
                carry.append(buf)
                continue
            head = np.concatenate([*carry, buf[: cuts[0]]]) if carry else buf[: cuts[0]]
            if head.size:
                yield head
            for a, b in itertools.pairwise(cuts):
                if b > a + 1:
                    yield buf[a + 1 : b]
            carry = [buf[cuts[-1] + 1 :]] if cuts[-1] + 1 < buf.size else []
    if carry:
        yield np.concatenate(carry)


def iter_documents(
    source: str,
    files: list[Path],
    *,
    text_field: str = "text",
    bos_id: int | None = None,
    shard_dtype: str = "auto",
    max_tokens: int | None = None,
) -> Iterator[str | np.ndarray]:
    """The documents of ``files`` in order: strings (text/jsonl/parquet) or token arrays (shards).

    Shards: ``max_tokens`` caps the token stream over all ``files`` (whole files first, the last one
    cut); the documents are views of a read window, to be used before the next one is taken.
    """
    if source == "text":
        yield from iter_text_files(files)
    elif source == "jsonl":
        yield from iter_jsonl(files, text_field)
    elif source == "parquet":
        yield from iter_parquet(files, text_field)
    elif source == "shards":
        if bos_id is None:
            raise ConfigError("data.bos_id", "shards need the BOS id (or a tokenizer.json that has one)")
        budget = max_tokens
        for f in files:
            yield from iter_shard_documents(f, bos_id, shard_dtype, budget)
            if budget is not None:
                budget -= min(budget, shard_layout(f, shard_dtype)[2])
                if budget == 0:
                    break
    else:
        raise ConfigError("data.source", "not a source of files", value=source)


def holdout(n_docs: int, val_fraction: float, salt: str) -> np.ndarray:
    """Boolean mask of held-out documents: the val_fraction with the smallest sha256(salt#i).

    Memory: the mask (1 byte per document) and, while it is computed, 16 bytes per document (the
    first 8 bytes of each digest and a partitioned copy) — not a list of hex strings (~150 bytes per
    document) — so that it scales to the ~1e7 documents of a 1e10-token corpus. Ordering by the
    big-endian prefix is ordering by the hex digest; documents whose prefix equals the cut-off are
    ordered by their full digest, so the mask is exactly the ``n_val`` smallest keys.
    """
    return _holdout(n_docs, val_fraction, salt, 8)


def _holdout(n_docs: int, val_fraction: float, salt: str, prefix: int) -> np.ndarray:
    n_val = min(max(1, round(n_docs * val_fraction)), n_docs - 1) if n_docs > 1 else 0
    mask = np.zeros(n_docs, dtype=bool)
    if n_val == 0:
        return mask

    def digest(i: int) -> bytes:
        return hashlib.sha256(f"{salt}#{i}".encode()).digest()

    keys = np.fromiter(
        (int.from_bytes(digest(i)[:prefix], "big") for i in range(n_docs)), dtype=np.uint64, count=n_docs
    )
    cut = np.partition(keys, n_val - 1)[n_val - 1]
    np.less(keys, cut, out=mask)
    ties = sorted(np.flatnonzero(keys == cut).tolist(), key=digest)
    mask[ties[: n_val - int(mask.sum())]] = True
    return mask
