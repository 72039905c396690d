"""The user's own data: text folders, JSONL/Parquet, pretokenized shards, HF tokenizers."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_MODEL
from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.data import sources
from loopscale.errors import ConfigError
from loopscale.train import load_train_config, train
from loopscale.train.batches import load_token_data

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wise",
    "owls",
    "count",
    "silver",
    "stars",
]


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(20, 60))) + "." for _ in range(n)]


def data_cfg(**kw) -> DataConfig:
    return validate(DataConfig, kw, prefix="data")


def test_text_folder_gives_one_document_per_file_and_a_fixed_holdout(tmp_path: Path) -> None:
    for i, d in enumerate(make_docs(40)):
        (tmp_path / f"{i:02d}.txt").write_text(d)
    a = load_token_data(data_cfg(source="text", paths=[str(tmp_path)], val_fraction=0.1), 32, use_cache=False)
    b = load_token_data(data_cfg(source="text", paths=[str(tmp_path)], val_fraction=0.1, seed=3), 32, use_cache=False)
    assert a.train.shape[1] == 33 and (a.train[:, 0] == 256).all()
    assert a.val.shape == b.val.shape and bool((a.val == b.val).all())  # validation does not depend on the seed


def test_jsonl_and_parquet_read_the_text_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = make_docs(30)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)))
    pq.write_table(pa.table({"body": docs}), tmp_path / "d.parquet")
    js = load_token_data(
        data_cfg(source="jsonl", paths=[str(tmp_path / "d.jsonl")], text_field="body"), 32, use_cache=False
    )
    pa_ = load_token_data(
        data_cfg(source="parquet", paths=[str(tmp_path / "d.parquet")], text_field="body"), 32, use_cache=False
    )
    assert js.fingerprint == pa_.fingerprint and np.array_equal(js.train, pa_.train)


def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "fine"}\n{"text": broken\n')
    with pytest.raises(ConfigError, match=rf"{f}:2: malformed JSON"):
        sources.read_jsonl([f], "text")
    f.write_text('{"body": "x"}\n')
    with pytest.raises(ConfigError, match=rf"{f}:1: no 'text' field"):
        sources.read_jsonl([f], "text")


def test_bin_shards_round_trip_and_headerless_arrays_need_a_dtype(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    stream = []
    for _ in range(50):
        stream += [255, *rng.integers(0, 250, size=rng.integers(5, 80)).tolist()]
    toks = np.array(stream)
    sources.write_shard(tmp_path / "a.bin", toks)
    assert np.array_equal(sources.read_shard(tmp_path / "a.bin"), toks)
    toks.astype(np.uint32).tofile(tmp_path / "b.u32")
    assert np.array_equal(sources.read_shard(tmp_path / "b.u32"), toks)
    toks.astype(np.uint16).tofile(tmp_path / "c.raw")
    with pytest.raises(ConfigError, match=r"set data\.shard_dtype"):
        sources.read_shard(tmp_path / "c.raw")
    docs = list(sources.shard_documents(toks, 255))
    assert len(docs) == 50 and all(255 not in d for d in docs)
    td = load_token_data(data_cfg(source="shards", paths=[str(tmp_path / "a.bin")], bos_id=255), 16, use_cache=False)
    assert (td.train[:, 0] == 255).all()
    (tmp_path / "trunc.bin").write_bytes((tmp_path / "a.bin").read_bytes()[:-10])
    with pytest.raises(ConfigError, match="truncated shard"):
        sources.read_shard(tmp_path / "trunc.bin")


def test_bad_data_configs_fail_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.paths: source 'text' needs data.paths"):
        data_cfg(source="text")
    with pytest.raises(ConfigError, match="no such file or folder"):
        load_token_data(data_cfg(source="text", paths=[str(tmp_path / "missing")]), 32, use_cache=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no \.txt/\.md files in the folder"):
        load_token_data(data_cfg(source="text", paths=[str(tmp_path / "empty")]), 32, use_cache=False)


def test_tokenizer_train_cli_then_training_with_the_bpe(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, d in enumerate(make_docs(200)):
        (corpus / f"{i:03d}.txt").write_text(d)
    tok = tmp_path / "tok.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopscale",
            "tokenizer",
            "train",
            str(corpus),
            "--vocab-size",
            "300",
            "--out",
            str(tok),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    from loopscale.data.hf_tokenizer import HFTokenizer

    t = HFTokenizer(tok)
    assert t.vocab_size == 300 and t.bos_token == "<|bos|>"
    assert t.decode(t.encode("seven wise owls")) == "seven wise owls"
    assert len(t.encode("seven wise owls")) < len("seven wise owls")  # merges learned
    sets = [f"model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()]
    sets += [
        "model.r=2",
        "model.vocab_size=300",
        "data.source='text'",
        f"data.paths=['{corpus}']",
        f"data.tokenizer='{tok}'",
        "run.steps=10",
        "run.batch_size=4",
        "run.min_steps=5",
        "run.threads=1",
        "optim.transfer=false",
        "model.seq_len=32",
        "run.val_tokens=256",
    ]
    res = train(load_train_config(None, sets), tmp_path / "run", progress=False)
    assert res.status == "ok" and res.val_loss is not None and res.val_loss < np.log(300)
    with pytest.raises(ConfigError, match=r"model.vocab_size: smaller than the tokenizer's vocabulary \(300\)"):
        train(load_train_config(None, [*sets, "model.vocab_size=257"]), tmp_path / "run2", progress=False)


@pytest.mark.long
def test_a_bpe_trained_on_the_embedded_default_tokenizes_the_default_mixture(tmp_path: Path, capsys) -> None:
    from loopscale.cli import run_app
    from loopscale.data.hf_tokenizer import HFTokenizer

    tok = tmp_path / "bpe.json"
    assert run_app(["tokenizer", "train", "--default", "--vocab-size", "300", "--out", str(tok)]) == 0
    assert "bytes/token" in capsys.readouterr().out
    t = HFTokenizer(tok)
    # split packing keeps every token, so the row count measures the merges (crop caps each document)
    bpe = load_token_data(DataConfig(tokenizer=str(tok), packing="best_fit_split"), 64, use_cache=False)
    raw = load_token_data(DataConfig(packing="best_fit_split"), 64, use_cache=False)
    assert bpe.tokenizer.vocab_size == 300 and int(bpe.train.max()) < 300
    assert bpe.train.size < 0.8 * raw.train.size  # merges shorten the same documents
    assert bool((bpe.train == t.bos_id).any())  # documents still separated by the BPE's BOS
    text = t.decode(bpe.val[0].tolist())
    assert len(text) > 64 and sum(c.isalpha() for c in text) > 0.5 * len(text)
    assert run_app(["tokenizer", "train", "--default", str(tmp_path), "--out", str(tok)]) == 2
    assert "exactly one of the two" in capsys.readouterr().err
    assert run_app(["tokenizer", "train", "--out", str(tok)]) == 2  # neither
    assert "exactly one of the two" in capsys.readouterr().err
