"""bench: peak memory of building the packed-row cache from a sharded corpus, by streaming.

    python bench/data_cache_rss.py                       # 1e8 tokens, T = 2048, best_fit_crop
    python bench/data_cache_rss.py --tokens 2e7 --packing best_fit_split

Writes a corpus of ``--tokens`` tokens as modded-nanogpt .bin shards of 2M tokens (random ids below
50,000, BOS = 50,000, log-normal document lengths with median ~400 tokens), then builds the cache in a
fresh subprocess with ``load_token_data`` (hold-out validation: a counting pass, a training pass and a
validation pass over the shards) and reports that process's peak resident set (``VmHWM``: anonymous
memory *and* any mapped file pages it touched), its resident set after ``import torch`` and
loopscale and before building (the interpreter's own share), and the wall time; then, in another
process, reads every training row once through ``TokenData.batch`` and reports how much of its
memory is private (``RssAnon``) and how much is the mapped cache (``RssFile``, the page cache every
reader on the machine shares). docs/data.md records
the numbers measured here; tests/test_data_cache.py asserts the same bound on a 2e7-token corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BOS = 50_000
SHARD_TOKENS = 2_000_000

CHILD = r"""
import json, sys, time
def rss(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) * 1024
from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.train.batches import load_token_data
cfg = validate(DataConfig, json.loads(sys.argv[1]), prefix="data")
before = rss("VmRSS:")
t0 = time.time()
td = load_token_data(cfg, int(sys.argv[2]))
print(json.dumps({"before": before, "peak": rss("VmHWM:"), "wall_s": time.time() - t0, "built": td.built,
                  "rows": int(td.train.shape[0]), "val_rows": int(td.val.shape[0]), "dtype": str(td.train.dtype)}))
"""


READER = r"""
import json, sys
def kib(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))
from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.train.batches import load_token_data
anon, file = kib("RssAnon:"), kib("RssFile:")
td = load_token_data(validate(DataConfig, json.loads(sys.argv[1]), prefix="data"), int(sys.argv[2]))
B = 128
for step in range(td.train.shape[0] // B):  # one epoch: every row once
    td.batch(step, B, 0, B)
print(json.dumps({"anon": (kib("RssAnon:") - anon) * 1024, "file": (kib("RssFile:") - file) * 1024,
                  "built": td.built, "bytes": td.train.nbytes}))
"""


def write_corpus(folder: Path, tokens: int, seed: int = 0) -> int:
    """``tokens`` tokens as 2M-token .bin shards of BOS-separated documents; returns the document count."""
    from loopscale.data.sources import write_shard

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    docs = 0
    for i in range(-(-tokens // SHARD_TOKENS)):
        n = min(SHARD_TOKENS, tokens - i * SHARD_TOKENS)
        toks = rng.integers(0, BOS, size=n, dtype=np.uint16)
        lengths = np.clip(rng.lognormal(6.0, 1.0, size=n // 100 + 10).astype(np.int64), 1, 50_000) + 1
        starts = np.cumsum(lengths) - lengths
        starts = starts[starts < n]
        toks[starts] = BOS
        docs += len(starts)
        write_shard(folder / f"shard_{i:04d}.bin", toks)
    return docs


def measure(shards: Path, cache: Path, seq_len: int = 2048, child: str = CHILD, **data: object) -> dict:
    """Run ``child`` (build, or read) on the cache for ``shards`` in a fresh process; what it reports."""
    cfg = {"source": "shards", "paths": [str(shards)], "bos_id": BOS, **data}
    env = {**os.environ, "LOOPSCALE_CACHE": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", child, json.dumps(cfg), str(seq_len)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=float, default=1e8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--packing", default="best_fit_crop", choices=["best_fit_crop", "best_fit_split"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        docs = write_corpus(Path(tmp) / "shards", int(args.tokens))
        print(
            f"corpus: {int(args.tokens):,} tokens, {docs:,} documents in "
            f"{-(-int(args.tokens) // SHARD_TOKENS)} shards ({time.time() - t0:.1f} s)"
        )
        m = measure(Path(tmp) / "shards", Path(tmp) / "cache", args.seq_len, packing=args.packing)
        r = measure(Path(tmp) / "shards", Path(tmp) / "cache", args.seq_len, READER, packing=args.packing)
    mb = 2**20
    print(
        f"build ({args.packing}, T = {args.seq_len}): {m['rows']:,} train + {m['val_rows']:,} val rows "
        f"({m['dtype']}) in {m['wall_s']:.1f} s"
    )
    print(
        f"peak RSS {m['peak'] / mb:.0f} MiB; after imports {m['before'] / mb:.0f} MiB; "
        f"build adds {(m['peak'] - m['before']) / mb:.0f} MiB "
        f"(the corpus as int64 would be {8 * int(args.tokens) / mb:,.0f} MiB)"
    )
    print(
        f"a reader of every row (one epoch, batches of 128): +{r['anon'] / mb:.0f} MiB private, "
        f"+{r['file'] / mb:.0f} MiB of mapped, shared page cache (train rows: {r['bytes'] / mb:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
