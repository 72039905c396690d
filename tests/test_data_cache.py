"""The packed-row cache: streamed with bounded memory, the same rows as packing in memory, published
atomically, built once by concurrent processes, mapped read-only; and the paper preset's refusal of
the embedded default data."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.data import cache, packing, sources
from loopscale.data.packing import pack_rows, shuffle_order
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.errors import ConfigError
from loopscale.train import batches
from loopscale.train.batches import load_token_data

BOS = 50_000

LOAD = r"""
import json, sys
from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.train.batches import load_token_data
td = load_token_data(validate(DataConfig, json.loads(sys.argv[1]), prefix="data"), int(sys.argv[2]))
print(json.dumps({"built": td.built, "path": str(td.path), "fingerprint": td.fingerprint,
                  "rows": int(td.train.shape[0])}))
"""

CRASH = r"""
import json, os, signal, sys
from loopscale.config import validate
from loopscale.data import cache
from loopscale.config.data import DataConfig
from loopscale.train.batches import load_token_data
write, count = cache.RowWriter.write, [0]
def write_then_die(self, row):
    count[0] += 1
    if count[0] == 600:  # two chunks of rows are on disk by now
        os.kill(os.getpid(), signal.SIGKILL)
    write(self, row)
cache.RowWriter.write = write_then_die
load_token_data(validate(DataConfig, json.loads(sys.argv[1]), prefix="data"), int(sys.argv[2]))
"""

MEASURE = r"""
import json, sys
def kib(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))
from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.train.batches import load_token_data
cfg = validate(DataConfig, json.loads(sys.argv[1]), prefix="data")
before = kib("VmRSS:")
td = load_token_data(cfg, int(sys.argv[2]))
print(json.dumps({"before_mib": before / 1024, "peak_mib": kib("VmHWM:") / 1024, "built": td.built,
                  "rows": int(td.train.shape[0])}))
"""


def child_env(cache_home: Path) -> dict[str, str]:
    """A child process's environment, with its cache always set (never the user's)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "LOOPSCALE_CACHE": str(cache_home)}


def data_cfg(**kw) -> DataConfig:
    return validate(DataConfig, kw, prefix="data")


def write_shards(folder: Path, n_shards: int, tokens: int, seed: int = 0, long_docs: int = 300) -> Path:
    """.bin shards of BOS-separated documents, lengths 1..``long_docs`` (and a few of ~5 rows)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n_shards):
        parts, n = [], 0
        while n < tokens:
            k = int(rng.integers(1, long_docs)) if rng.random() < 0.97 else int(rng.integers(300, 700))
            parts += [np.array([BOS]), rng.integers(0, BOS, size=k)]
            n += k + 1
        sources.write_shard(folder / f"s{i:03d}.bin", np.concatenate(parts)[:tokens])
    return folder


def old_holdout(n_docs: int, val_fraction: float, salt: str) -> np.ndarray:
    """The hold-out as it was: hex digests of every document, sorted (the oracle)."""
    n_val = min(max(1, round(n_docs * val_fraction)), n_docs - 1) if n_docs > 1 else 0
    keys = [hashlib.sha256(f"{salt}#{i}".encode()).hexdigest() for i in range(n_docs)]
    mask = np.zeros(n_docs, dtype=bool)
    mask[sorted(range(n_docs), key=keys.__getitem__)[:n_val]] = True
    return mask


def in_memory(docs: list, seq_len: int, bos: int, cfg: DataConfig, encode=None):
    """Today's in-memory path: every document in a list, the hold-out, ``pack_rows`` (shuffled rows)."""
    mask = old_holdout(len(docs), cfg.val_fraction, "loopscale.holdout")
    train = [d for d, m in zip(docs, mask, strict=True) if not m]
    val = [d for d, m in zip(docs, mask, strict=True) if m]
    if encode is not None and cfg.max_tokens is not None:
        kept, total = [], 0
        for d in train:
            if total >= cfg.max_tokens:
                break
            kept.append(d)
            total += len(d)
        train = kept
    h = hashlib.sha256()
    for d in [*train, "\x00val", *val]:
        h.update(d.encode("utf-8") if isinstance(d, str) else np.asarray(d, dtype=np.int64).tobytes())
    opts = {"packing": cfg.packing, "buffer": cfg.packing_buffer}
    if encode is None:
        rows = pack_rows((d.tolist() for d in train), seq_len, bos, seed=cfg.seed, **opts)
        vrows = pack_rows((d.tolist() for d in val), seq_len, bos, seed=cfg.seed, shuffle=False, **opts)
    else:
        tok = ByteTokenizer()
        rows = pack_rows((tok.encode_bytes(d) for d in train), seq_len, tok.bos_id, seed=cfg.seed, **opts)
        vrows = pack_rows((tok.encode_bytes(d) for d in val), seq_len, tok.bos_id, seed=cfg.seed, shuffle=False, **opts)
    return rows.numpy(), vrows.numpy(), h.hexdigest()


def old_batch(rows: np.ndarray, step: int, B: int, seed: int) -> np.ndarray:
    """The rows step ``step`` read when the shuffled rows themselves were stored (epochs re-permuted)."""
    n = rows.shape[0]
    g = torch.arange(step * B, step * B + B)
    epoch, pos = g // n, g % n
    out = pos.clone()
    for e in epoch.unique().tolist():
        if e:
            gen = torch.Generator().manual_seed((seed * 1_000_003 + e) % (2**31))
            sel = epoch == e
            out[sel] = torch.randperm(n, generator=gen)[pos[sel]]
    return rows[out.numpy()]


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokens"


@pytest.mark.parametrize("packing_mode", ["best_fit_crop", "best_fit_split"])
def test_the_streamed_cache_reads_every_step_the_rows_packing_in_memory_gave(
    tmp_path: Path, own_cache: Path, packing_mode: str
) -> None:
    shards = write_shards(tmp_path / "shards", 4, 30_000)
    cfg = data_cfg(source="shards", paths=[str(shards)], bos_id=BOS, seed=7, packing=packing_mode)
    docs = [d for f in sorted(shards.iterdir()) for d in sources.shard_documents(sources.read_shard(f), BOS)]
    rows, vrows, fingerprint = in_memory(docs, 64, BOS, cfg)
    td = load_token_data(cfg, 64)
    assert td.built and td.train.dtype == np.uint16 and td.fingerprint == fingerprint
    assert td.train.shape == rows.shape and np.array_equal(td.val, vrows)
    B = 16
    for step in range(2 * rows.shape[0] // B + 3):  # into the third epoch: re-permuted epochs too
        x, y = td.batch(step, B, 0, B, seed=cfg.seed)
        want = old_batch(rows, step, B, cfg.seed)
        assert np.array_equal(x.numpy(), want[:, :-1]) and np.array_equal(y.numpy(), want[:, 1:]), step
    assert x.dtype == torch.int64
    assert torch.equal(td.val_rows(10 * 64), torch.from_numpy(vrows[:10]).long())


def test_text_streams_tokenize_cap_and_hold_out_as_in_memory(tmp_path: Path) -> None:
    rng = random.Random(0)
    texts = ["".join(rng.choice("abc de") for _ in range(rng.randrange(1, 200))) for _ in range(800)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = data_cfg(source="jsonl", paths=[str(tmp_path / "d.jsonl")], max_tokens=40_000, seed=3)
    rows, vrows, fingerprint = in_memory(texts, 32, 256, cfg, encode=True)
    td = load_token_data(cfg, 32, use_cache=False)
    assert td.fingerprint == fingerprint and np.array_equal(td.val, vrows)
    assert np.array_equal(td.train[td.order], rows)  # epoch 0 reads the packed rows in the seeded order


def test_shard_documents_are_the_same_read_whole_or_window_by_window(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for t in range(60):
        toks = rng.integers(0, 4, size=int(rng.integers(0, 200))).astype(np.uint16)  # BOS = 0, often adjacent
        toks.tofile(tmp_path / f"{t}.u16")
        for window in (1, 2, 5, 64, 10_000):
            for cap in (None, 7, 150):
                whole = [d.tolist() for d in sources.shard_documents(sources.read_shard(tmp_path / f"{t}.u16"), 0, cap)]
                streamed = [
                    d.tolist()
                    for d in sources.iter_shard_documents(tmp_path / f"{t}.u16", 0, max_tokens=cap, window=window)
                ]
                assert streamed == whole, (t, window, cap)


@pytest.mark.parametrize("prefix", [8, 1])
def test_the_holdout_is_the_smallest_digests_even_when_their_prefixes_tie(prefix: int) -> None:
    for n in (0, 1, 2, 3, 40, 1000, 3000):
        for frac in (0.05, 0.3):
            assert np.array_equal(
                sources._holdout(n, frac, "loopscale.holdout", prefix), old_holdout(n, frac, "loopscale.holdout")
            ), (n, frac)


def test_the_row_order_is_the_list_shuffle_packing_always_used() -> None:
    for n, seed in ((0, 0), (1, 0), (1000, 0), (4321, 9)):
        order = list(range(n))
        random.Random(f"loopscale.packing:{seed}").shuffle(order)
        assert list(shuffle_order(n, seed)) == order


@pytest.mark.parametrize("packing_mode", ["best_fit_crop", "best_fit_split"])
def test_the_packer_never_holds_more_than_its_buffer_of_pieces_of_one_row(
    monkeypatch: pytest.MonkeyPatch, packing_mode: str
) -> None:
    peak = {"size": 0, "piece": 0}
    add = packing._Buffer.add

    def watched(self, piece, n=None):
        add(self, piece, n)
        peak["size"], peak["piece"] = max(peak["size"], self.size), max(peak["piece"], len(piece))

    monkeypatch.setattr(packing._Buffer, "add", watched)
    rng = random.Random(2)  # many documents far longer than a row: they pile up in the crop buffer
    docs = ([7] * rng.choice([1, 5, 20, 300, 2000]) for _ in range(5000))
    assert sum(1 for _ in packing.RowStream(docs, 32, BOS, packing=packing_mode, buffer=50)) > 100
    assert peak["size"] == 50 and peak["piece"] <= 33


def test_rows_are_stored_as_uint16_when_ids_fit_and_int32_otherwise(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    stream = np.concatenate(
        [np.concatenate([[70_000], rng.integers(0, 69_999, size=int(k))]) for k in rng.integers(1, 50, size=400)]
    )
    stream.astype(np.uint32).tofile(tmp_path / "big.u32")
    td = load_token_data(
        data_cfg(source="shards", paths=[str(tmp_path / "big.u32")], bos_id=70_000), 16, use_cache=False
    )
    assert td.train.dtype == np.int32 and td.max_id == 70_000 and int(td.train.max()) == 70_000
    (stream % 1000).astype(np.uint32).tofile(tmp_path / "small.u32")
    assert (
        load_token_data(
            data_cfg(source="shards", paths=[str(tmp_path / "small.u32")], bos_id=0), 16, use_cache=False
        ).train.dtype
        == np.int32
    )  # u32 files: ids may not fit
    (stream % 1000).astype(np.uint16).tofile(tmp_path / "small.u16")
    assert (
        load_token_data(
            data_cfg(source="shards", paths=[str(tmp_path / "small.u16")], bos_id=0), 16, use_cache=False
        ).train.dtype
        == np.uint16
    )
    assert (
        load_token_data(
            DataConfig(real_text_bytes=50_000, world={"n_entities": 5, "n_unseen_entities": 5, "eval_per_task": 5}),
            32,
            use_cache=False,
        ).train.dtype
        == np.uint16
    )  # bytes: 257 ids


def test_readers_map_the_published_entry_read_only_and_do_not_rebuild_it(tmp_path: Path, own_cache: Path) -> None:
    cfg = data_cfg(source="shards", paths=[str(write_shards(tmp_path / "shards", 2, 20_000))], bos_id=BOS)
    first, second = load_token_data(cfg, 64), load_token_data(cfg, 64)
    assert first.built and not second.built
    assert first.path == second.path == own_cache / batches._cache_key(cfg, 64)
    for arr in (second.train, second.val, second.order):
        assert isinstance(arr, np.memmap) and not arr.flags.writeable
        assert Path(arr.filename).parent == second.path
    meta = json.loads((second.path / "meta.json").read_text())
    assert meta["train_rows"] == second.train.shape[0] and meta["dtype"] == "uint16"
    assert sorted(p.name for p in second.path.iterdir()) == ["meta.json", "order.bin", "train.bin", "val.bin"]
    assert not list(own_cache.glob(".*.tmp"))


def test_a_build_killed_midway_publishes_nothing_and_the_next_run_rebuilds(tmp_path: Path, own_cache: Path) -> None:
    shards = write_shards(tmp_path / "shards", 2, 100_000)
    raw = {"source": "shards", "paths": [str(shards)], "bos_id": BOS}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, json.dumps(raw), "16"],
        env=child_env(own_cache.parent),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr
    key = batches._cache_key(data_cfg(**raw), 16)
    leftovers = list(own_cache.glob(f".{key}.*.tmp"))
    assert not (own_cache / key).exists() and len(leftovers) == 1
    assert (leftovers[0] / "train.bin").stat().st_size >= 512 * 17 * 2  # rows were on disk, unpublished
    td = load_token_data(data_cfg(**raw), 16)
    assert td.built and not list(own_cache.glob(f".{key}.*.tmp"))  # the crashed builder's folder is gone
    assert np.array_equal(td.train, load_token_data(data_cfg(**raw), 16, use_cache=False).train)


def test_an_entry_whose_files_do_not_match_its_meta_is_rebuilt(tmp_path: Path, own_cache: Path) -> None:
    cfg = data_cfg(source="shards", paths=[str(write_shards(tmp_path / "shards", 1, 20_000))], bos_id=BOS)
    good = np.array(load_token_data(cfg, 64).train)
    train_bin = own_cache / batches._cache_key(cfg, 64) / "train.bin"
    train_bin.write_bytes(train_bin.read_bytes()[:-100])  # truncated
    again = load_token_data(cfg, 64)
    assert again.built and np.array_equal(again.train, good)


def test_a_builder_that_loses_the_race_to_publish_keeps_the_winners_entry(
    tmp_path: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file system has no locks, two builders may run at once: the rename decides."""
    import contextlib

    monkeypatch.setattr(cache, "_lock", lambda path: contextlib.nullcontext(False))
    cfg = data_cfg(source="shards", paths=[str(write_shards(tmp_path / "shards", 1, 20_000))], bos_id=BOS)
    key = batches._cache_key(cfg, 64)
    build = batches._build

    def build_while_another_publishes(cfg_, tok, seq_len, folder):
        meta = build(cfg_, tok, seq_len, folder)
        monkeypatch.setattr(batches, "_build", build)
        winner = cache.get_or_build(own_cache, key, lambda f: build(cfg_, tok, seq_len, f))
        assert winner.built
        return meta

    monkeypatch.setattr(batches, "_build", build_while_another_publishes)
    td = load_token_data(cfg, 64)
    assert not td.built and td.path == own_cache / key and not list(own_cache.glob(".*.tmp"))


def test_concurrent_builders_of_one_key_wait_for_the_lock_and_build_once(tmp_path: Path, own_cache: Path) -> None:
    shards = write_shards(tmp_path / "shards", 2, 30_000)
    raw = {"source": "shards", "paths": [str(shards)], "bos_id": BOS}
    key = batches._cache_key(data_cfg(**raw), 64)
    own_cache.mkdir(parents=True)
    env = child_env(own_cache.parent)
    with open(own_cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as if a third process were building
        procs = []
        for i in range(2):
            err = open(tmp_path / f"err{i}", "w+")  # noqa: SIM115
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-c", LOAD, json.dumps(raw), "64"],
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    ),
                    err,
                )
            )
        t0 = time.time()
        while not all("waiting for another process" in (tmp_path / f"err{i}").read_text() for i in range(2)):
            assert time.time() - t0 < 120 and all(p.poll() is None for p, _ in procs)
            time.sleep(0.2)
        assert not (own_cache / key).exists() and all(p.poll() is None for p, _ in procs)
        fcntl.flock(lock, fcntl.LOCK_UN)
    results = []
    for p, err in procs:
        out, _ = p.communicate(timeout=120)
        err.seek(0)
        assert p.returncode == 0, err.read()
        results.append(json.loads(out.strip().splitlines()[-1]))
        err.close()
    assert sorted(r["built"] for r in results) == [False, True]
    assert len({(r["path"], r["fingerprint"], r["rows"]) for r in results}) == 1


@pytest.fixture(scope="module")
def corpus_1e8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1e8 tokens as 50 .bin shards of 2M tokens: log-normal document lengths (median ~400, 5% longer than
    a row of 2,049), BOS-separated, written in ~3 s."""
    folder = tmp_path_factory.mktemp("corpus_1e8")
    rng = np.random.default_rng(0)
    for i in range(50):
        toks = rng.integers(0, BOS, size=2_000_000, dtype=np.uint16)
        starts = np.cumsum(np.clip(rng.lognormal(6.0, 1.0, size=25_000).astype(np.int64), 1, 50_000) + 1)
        toks[np.concatenate([[0], starts[starts < toks.size]])] = BOS
        sources.write_shard(folder / f"shard_{i:02d}.bin", toks)
    return folder


@pytest.mark.long
@pytest.mark.parametrize("packing_mode", ["best_fit_crop", "best_fit_split"])
def test_building_the_cache_from_1e8_tokens_peaks_far_below_holding_them(
    corpus_1e8: Path, tmp_path: Path, packing_mode: str
) -> None:
    """Peak RSS of a fresh process building the cache (T = 2048, hold-out validation: three passes).

    Bounds: under 600 MiB in all (the interpreter with torch is ~230 MiB), and under 200 MiB above the
    interpreter — what the corpus would take as uint16, 1/4 of it as int64 (763 MiB), 1/26 of the
    ~5.2 GB packing it in memory took. Measured: ~96 MiB above (crop: 1,000 buffered documents of up
    to 2,049 ids) and ~42 MiB (split).
    """
    raw = {"source": "shards", "paths": [str(corpus_1e8)], "bos_id": BOS, "packing": packing_mode}
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(raw), "2048"],
        capture_output=True,
        text=True,
        env=child_env(tmp_path / "cache"),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{packing_mode}: peak {m['peak_mib']:.0f} MiB, after imports {m['before_mib']:.0f} MiB, {m['rows']} rows")
    assert m["built"] and m["rows"] * 2049 > 0.3e8
    assert m["peak_mib"] < 600
    assert m["peak_mib"] - m["before_mib"] < 200


def test_the_paper_preset_refuses_the_embedded_default_but_the_cpu_presets_use_it(tmp_path: Path) -> None:
    from loopscale.sweep import load_spec
    from loopscale.train import train

    paper = load_spec("paper", ["train.run.device='cpu'"]).runs()[0].config
    assert paper.data.source == "default" and not paper.data.allow_default
    one_line = (
        r"^data\.source: the embedded default \(an 8M-token stand-in\) is refused by "
        r"data\.allow_default = false \(\[train\.data\] of the paper preset\): set data\.source and "
        r"data\.paths to your data, or data\.allow_default = true to train on the stand-in anyway$"
    )
    with pytest.raises(ConfigError, match=one_line):
        load_token_data(paper.data, 2048)

    def no_build(*args, **kwargs):
        raise AssertionError("the refused data was built")

    with pytest.MonkeyPatch.context() as mp:  # the whole run: it fails before building anything
        mp.setattr(batches, "_build", no_build)
        mp.setattr(batches, "make_tokenizer", no_build)
        with pytest.raises(ConfigError, match=one_line):
            train(paper, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    batches.check_allowed(load_spec("paper", ["train.data.allow_default=true"]).runs()[0].config.data)
    batches.check_allowed(
        load_spec("paper", ["train.data.source='shards'", f"train.data.paths=['{tmp_path}']", "train.data.bos_id=1"])
        .runs()[0]
        .config.data
    )
    for preset in ("demo", "quick", "study"):
        assert all(rs.config.data.allow_default for rs in load_spec(preset).runs()), preset
    assert DataConfig().allow_default
    assert batches._cache_key(DataConfig(), 64) == batches._cache_key(DataConfig(allow_default=False), 64)
