"""Crash-safe file writes: a reader never sees a half-written result.

Write to a temporary file in the same folder, fsync it, rename over the target, fsync the folder.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the temporary file of ``atomic_write_bytes(folder / name)`` is ``folder/.<name>.<random>.tmp``
TMP_SUFFIX = ".tmp"


def cache_dir() -> Path:
    """Where loopscale keeps what it can rebuild (token caches, compiled CPU kernels): ``LOOPSCALE_CACHE``."""
    return Path(os.environ.get("LOOPSCALE_CACHE", Path.home() / ".cache" / "loopscale"))


def _tmp_prefix(name: str) -> str:
    return f".{name}."


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path.name), suffix=TMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; results should be as readable as any file
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def stale_temp_files(folder: str | Path, names: Iterable[str]) -> list[Path]:
    """Temporary files ``atomic_write_bytes`` left in ``folder`` for the files ``names`` (a kill mid-write).

    Only the writer's own pattern (``.<name>.<mkstemp letters>.tmp``) matches, never another ``.tmp``.
    """
    folder = Path(folder)
    patterns = [re.compile(re.escape(_tmp_prefix(n)) + r"[A-Za-z0-9_]+" + re.escape(TMP_SUFFIX)) for n in names]
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if any(pat.fullmatch(p.name) for pat in patterns) and p.is_file())


def remove_stale_temps(folder: str | Path, names: Iterable[str]) -> list[Path]:
    """Delete what ``stale_temp_files`` finds (checkpoint temporaries are gigabytes at paper scale).

    Call it only where no other process can be writing those files (the run's owner, at its start):
    a live writer's temporary file looks the same. Returns the files removed.
    """
    removed = []
    for p in stale_temp_files(folder, names):
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        removed.append(p)
    return removed


def set_aside(path: str | Path) -> Path:
    """Rename an unreadable ``path`` to ``<name>.corrupt-<time>``: kept for inspection, never read again."""
    import time

    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.replace(dest)
    return dest


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_save_torch(path: str | Path, obj: Any) -> None:
    """torch.save through a temporary file and a rename."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one line and flush it to disk (a crash loses at most the line being written)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, default=_json_default) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL file, skipping a torn last line left by a crash."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (best effort: some file systems refuse directory fsync)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
