"""The packed-row cache: built by streaming with bounded memory, published atomically, read through mmap.

An entry is a folder ``<LOOPSCALE_CACHE>/tokens/<key>/`` (``LOOPSCALE_CACHE`` defaults to
``~/.cache/loopscale``) of raw arrays that any process can map:

- ``train.bin``: the training rows in *packed* order, ``[n_train, T + 1]``, C order, ``uint16`` when
  every id fits (< 65,536; half the disk and page cache) and ``int32`` otherwise;
- ``order.bin``: ``int64 [n_train]``, ``order[k]`` = the packed index of row ``k`` of epoch 0 — the
  seeded shuffle ``pack_rows`` has always applied (``packing.shuffle_order``), kept as an index so
  that no process ever holds the rows to shuffle them; a step reads exactly the rows it read before;
- ``val.bin``: the validation rows, ``[n_val, T + 1]``, in packed order (never shuffled);
- ``meta.json``: shapes, dtype, fingerprint, largest id and the packing stats; written last.

**Building** streams: documents are read one file / window at a time (``sources.iter_documents``),
packed by ``packing.RowStream`` (the same algorithms as ``pack_rows``, so the same rows, bit for bit)
and appended to ``train.bin`` in chunks of ``CHUNK_ROWS`` rows. The builder's memory is bounded by
the packer, not by the corpus:

    packer buffer   <= buffer x (T + 1) ids as Python ints (~40 B each: pointer + int object):
                       82 MB at T = 2048 with buffer 1000 (crop; split: 1024 pieces, 84 MB)
    + read window   4 Mi tokens (8-16 MB) + the one document being read (text: its ids as a list)
    + write chunk   CHUNK_ROWS x (T + 1) x 10 B (int64 + storage copy): 5 MB at T = 2048
    + hold-out      1 B per document (16 B per document while it is chosen, before packing starts)
    + row order     8 B per training row (an array('q'), shuffled in place once all rows are written)

— about 100 MB plus 8 B per row above the interpreter (``import torch`` alone is ~230 MB). The
paper's largest run (1.04e10 tokens, 5.1 M rows of 2,049, ~1e7 documents) stays below ~200 MB above
it, where packing in memory took ~52 B per token (~540 GB). Measured on 1e8 tokens of shards at T = 2048 (the
numbers are in docs/data.md): peak RSS 325 MiB, 96 MiB above the interpreter, with best_fit_crop;
``tests/test_data_cache.py`` asserts it, ``bench/data_cache_rss.py`` reproduces it.

**Publishing**: a builder takes an exclusive ``flock`` on ``tokens/<key>.lock`` (concurrent builders
of the same key wait and then reuse the entry; where the file system refuses locks they build side
by side), writes into a unique ``tokens/.<key>.<random>.tmp/``, fsyncs every file, then renames the
folder to ``<key>`` in one step and fsyncs ``tokens/``. A crash leaves only a ``.tmp`` folder, which
is never read and is removed by the next builder that holds the lock; an entry whose files do not
match its ``meta.json`` is rebuilt, never trusted.

**Reading** maps the files read-only (``np.memmap``): every slot worker and every DDP rank on a node
shares one copy in the page cache instead of holding its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loopscale.data.packing import RowStream, shuffle_order
from loopscale.errors import ConfigError
from loopscale.io import fsync_dir

FORMAT = 2
CHUNK_ROWS = 256


def row_dtype(id_bound: int) -> np.dtype:
    """``uint16`` if every id is below ``id_bound`` <= 65,536, else ``int32``."""
    return np.dtype(np.uint16) if id_bound <= 2**16 else np.dtype(np.int32)


@dataclass
class PackedRows:
    """An opened cache entry: read-only maps of its files (or arrays, for a build kept in memory)."""

    train: np.ndarray  # [n_train, T + 1], packed order
    val: np.ndarray  # [n_val, T + 1]
    order: np.ndarray  # int64 [n_train]: packed index of each row of epoch 0
    meta: dict[str, Any]
    path: Path | None = None
    built: bool = False  # True in the process that built it


class RowWriter:
    """Appends rows to a raw file ``CHUNK_ROWS`` at a time; checks every id fits the storage dtype."""

    def __init__(self, path: Path, width: int, dtype: np.dtype, chunk_rows: int = CHUNK_ROWS) -> None:
        self.path, self.width, self.dtype = path, width, np.dtype(dtype)
        self._fh = open(path, "wb")  # noqa: SIM115  (closed in close())
        self._chunk = np.empty((chunk_rows, width), dtype=np.int64)
        self._fill = 0
        self.rows = 0
        self.max_id = -1

    def write(self, row: Sequence[int]) -> None:
        self._chunk[self._fill] = row
        self._fill += 1
        if self._fill == len(self._chunk):
            self._flush()

    def _flush(self) -> None:
        part = self._chunk[: self._fill]
        if self._fill:
            top, low = int(part.max()), int(part.min())
            info = np.iinfo(self.dtype)
            if low < 0 or top > info.max:
                raise ConfigError(
                    "data",
                    f"token id {top if top > info.max else low} does not fit the "
                    f"cache's {self.dtype} storage (ids must be in 0..{info.max})",
                )
            self.max_id = max(self.max_id, top)
            self._fh.write(part.astype(self.dtype).tobytes())
            self.rows += self._fill
        self._fill = 0

    def close(self) -> None:
        self._flush()
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def abort(self) -> None:
        self._fh.close()


def write_rows(path: Path, rows: Iterable[Sequence[int]], width: int, dtype: np.dtype) -> tuple[int, int]:
    """Write ``rows`` to ``path``; returns ``(rows written, largest id)``."""
    writer = RowWriter(path, width, dtype)
    try:
        for row in rows:
            writer.write(row)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return writer.rows, writer.max_id


def build(
    folder: Path,
    *,
    train_docs: Callable[[], Iterable[Sequence[int]]],
    val_docs: Callable[[], Iterable[Sequence[int]]],
    seq_len: int,
    bos_id: int,
    packing: str,
    buffer: int | None,
    seed: int,
    dtype: np.dtype,
    fingerprint: Callable[[], str],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Pack the two document streams into ``folder`` (train first, then validation) and write meta.json.

    ``train_docs`` / ``val_docs`` are called once each, in that order, so a fingerprint computed while
    they are read covers the training documents before the validation ones; ``fingerprint`` is called
    after both are exhausted.
    """
    width = seq_len + 1
    out: dict[str, Any] = {}
    for split, docs in (("train", train_docs), ("val", val_docs)):
        it = iter(docs())
        stream = RowStream(it, seq_len, bos_id, packing=packing, buffer=buffer, count_rest=True)
        n, top = write_rows(folder / f"{split}.bin", stream, width, dtype)
        for _ in it:  # the packer may stop early; read the rest so the fingerprint sees it
            pass
        out[split] = {"rows": n, "max_id": top, "stats": asdict(stream.stats) if stream.stats else None}
    n_train, n_val = out["train"]["rows"], out["val"]["rows"]
    if n_train == 0 or n_val == 0:
        raise ConfigError(
            "data", f"yields no complete row of T+1 = {width} tokens (train rows {n_train}, validation rows {n_val})"
        )
    order = shuffle_order(n_train, seed)  # 8 B per row
    with open(folder / "order.bin", "wb") as fh:
        fh.write(memoryview(order).cast("B"))
        fh.flush()
        os.fsync(fh.fileno())
    del order
    meta = {
        "format": FORMAT,
        "seq_len": seq_len,
        "width": width,
        "dtype": dtype.name,
        "train_rows": n_train,
        "val_rows": n_val,
        "max_id": max(out["train"]["max_id"], out["val"]["max_id"]),
        "fingerprint": fingerprint(),
        "seed": seed,
        "packing": packing,
        "bos_id": bos_id,
        "order": f"random.Random('loopscale.packing:{seed}').shuffle(range(train_rows))",
        "train_stats": out["train"]["stats"],
        "val_stats": out["val"]["stats"],
        **(extra or {}),
    }
    _write_synced(folder / "meta.json", json.dumps(meta, indent=1) + "\n")
    fsync_dir(folder)
    return meta


def open_rows(folder: Path, *, in_memory: bool = False) -> PackedRows | None:
    """The entry in ``folder``, mapped read-only (or read into memory); None if it is missing or does not
    match its meta.json (a file of the wrong size, an older format)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if meta.get("format") != FORMAT:
            return None
        dtype, width = np.dtype(meta["dtype"]), int(meta["width"])
        shapes = {
            "train.bin": (int(meta["train_rows"]), width),
            "val.bin": (int(meta["val_rows"]), width),
            "order.bin": (int(meta["train_rows"]),),
        }
        arrays = {}
        for name, shape in shapes.items():
            dt = np.dtype(np.int64) if name == "order.bin" else dtype
            f = folder / name
            if f.stat().st_size != int(np.prod(shape)) * dt.itemsize or shape[0] == 0:
                return None
            arrays[name] = (
                np.fromfile(f, dtype=dt).reshape(shape) if in_memory else np.memmap(f, dtype=dt, mode="r", shape=shape)
            )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return PackedRows(arrays["train.bin"], arrays["val.bin"], arrays["order.bin"], meta, None if in_memory else folder)


def get_or_build(root: Path, key: str, build_into: Callable[[Path], Any]) -> PackedRows:
    """The published entry ``root/key``, built by ``build_into(folder)`` under the key's lock if needed."""
    final = root / key
    rows = open_rows(final)
    if rows is not None:
        return rows
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f"{key}.lock") as locked:
        rows = open_rows(final)  # built by the process we waited for
        if rows is not None:
            return rows
        if locked:
            _remove_leftovers(root, key)
        if final.exists():  # unreadable or half-removed: set it aside, never trust it
            bad = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=root))
            os.replace(final, bad / "bad")
            shutil.rmtree(bad, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=root))
        try:
            build_into(tmp)
            os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes 0700; an entry is as readable as any folder
            try:
                os.rename(tmp, final)
            except OSError:  # published meanwhile by a builder that could not lock either
                if open_rows(final) is None:
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                return open_rows(final)  # type: ignore[return-value]
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(root)
    rows = open_rows(final)
    if rows is None:
        raise ConfigError(str(final), "the token cache just built cannot be read back")
    rows.built = True
    return rows


def build_in_memory(build_into: Callable[[Path], Any]) -> PackedRows:
    """Build into a temporary folder and read the rows into memory (``use_cache=False``: small data)."""
    with tempfile.TemporaryDirectory(prefix="loopscale-rows-") as tmp:
        build_into(Path(tmp))
        rows = open_rows(Path(tmp), in_memory=True)
    if rows is None:
        raise ConfigError("data", "the packed rows just built cannot be read back")
    rows.built = True
    return rows


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[bool]:
    """An exclusive flock on ``path`` (True), or nothing where the platform / file system has none (False)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: unique temporary folders and the rename still keep entries whole
        yield False
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"loopscale: waiting for another process building the token cache {path.stem}",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # e.g. ENOLCK on a network file system without locks
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _remove_leftovers(root: Path, key: str) -> None:
    """Temporary folders of this key's crashed builders (only called while holding the key's lock)."""
    for p in root.glob(f".{key}.*.tmp"):
        shutil.rmtree(p, ignore_errors=True)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()
