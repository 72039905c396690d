"""BOS-aligned best-fit packing: rows of T+1 tokens, every row starts with BOS, nothing padded.

``best_fit_crop`` (the default) must be the paper's packer row for row: ``_paper_rows`` below is an
independent re-implementation of its ``_pack_row`` / ``_pack_rows`` (scripts/prepack.py, arXiv
2604.21106 §4), written as plainly as the paper's, as the oracle. ``best_fit_split`` is loopscale's
earlier packer and must stay bit for bit what it was (pinned hashes).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.data.packing import pack_rows
from loopscale.data.tokenizer import ByteTokenizer, Tokenizer
from loopscale.errors import ConfigError

BOS = 256
SPLIT = "best_fit_split"
CROP = "best_fit_crop"


def _paper_rows(docs: list[list[int]], seq_len: int, bos: int, buffer_size: int) -> list[list[int]]:
    """The paper's packer, from its description: the oracle for ``best_fit_crop``."""
    capacity = seq_len + 1
    stream = iter([[bos, *d] for d in docs])
    buf: list[list[int]] = []
    exhausted = False
    rows: list[list[int]] = []
    while True:
        while len(buf) < buffer_size and not exhausted:  # refill before each row only
            try:
                buf.append(next(stream))
            except StopIteration:
                exhausted = True
        if not buf:
            break
        row: list[int] = []
        while len(row) < capacity and buf:
            space = capacity - len(row)
            fits = [i for i, d in enumerate(buf) if len(d) <= space]
            if fits:  # the largest document that fits entirely (first one on ties)
                row += buf.pop(max(fits, key=lambda i: len(buf[i])))
            else:  # none fits: crop the shortest, discard the rest of it
                row += buf.pop(min(range(len(buf)), key=lambda i: len(buf[i])))[:space]
        if len(row) < capacity:  # the buffer ran dry: stop
            break
        rows.append(row)
    return rows


def _mixed_docs(n: int, seq_len: int, seed: int) -> list[list[int]]:
    """Lengths from empty to 5 rows: short ones, ones right at the row size, long ones, many ties."""
    rng = random.Random(seed)
    lengths = [0, 1, 2, seq_len // 3, seq_len // 2, seq_len - 1, seq_len, seq_len + 1, 2 * seq_len, 5 * seq_len]
    return [
        [rng.randrange(256) for _ in range(rng.choice(lengths) if rng.random() < 0.5 else rng.randrange(3 * seq_len))]
        for _ in range(n)
    ]


def _tagged_docs(n: int, seq_len: int, seed: int = 0) -> list[list[int]]:
    """Document i is token i repeated, so every token says which document it came from."""
    rng = random.Random(seed)
    return [[i] * rng.choice([1, 5, seq_len // 2, seq_len, 3 * seq_len]) for i in range(n)]


def _docs(n: int = 300, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.choice([3, 10, 40, 90, 300]))] for _ in range(n)]


def test_the_byte_tokenizer_round_trips_utf8_and_has_a_bos() -> None:
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 257 and tok.bos_id == 256
    text = "Fair is foul — and foul is fair"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([tok.bos_id, *tok.encode("hi")]) == "hi"


@pytest.mark.parametrize("packing", [CROP, SPLIT])
def test_every_row_has_t_plus_one_tokens_and_starts_with_bos(packing: str) -> None:
    rows = pack_rows(_docs(), 64, BOS, packing=packing)
    assert rows.dtype == torch.long and rows.shape[1] == 65
    assert bool((rows[:, 0] == BOS).all())


def test_split_packing_loses_and_pads_nothing_but_the_last_partial_row() -> None:
    docs = _docs()
    rows, st = pack_rows(docs, 64, BOS, packing=SPLIT, with_stats=True)
    produced = sum(len(d) + 1 for d in docs) + st.bos_added
    assert rows.numel() + st.dropped == produced
    assert st.dropped < 65
    placed = Counter(rows[rows != BOS].tolist())
    wanted = Counter(t for d in docs for t in d)
    assert sum((wanted - placed).values()) <= st.dropped and not placed - wanted


def test_documents_reappear_in_order_when_rows_are_split_at_bos() -> None:
    docs = [[1 + i % 200] * (5 + 7 * i) for i in range(60)]  # each document one repeated token
    rows = pack_rows(docs, 32, BOS, packing=SPLIT, shuffle=False)
    pieces: dict[int, int] = {}
    for row in rows.tolist():
        for chunk in " ".join(map(str, row)).split(str(BOS)):
            toks = chunk.split()
            if toks:
                assert len(set(toks)) == 1  # a piece never mixes two documents
                pieces[int(toks[0])] = pieces.get(int(toks[0]), 0) + len(toks)
    assert len(pieces) > 50


def test_split_mode_fills_whole_rows_from_a_long_document_each_led_by_bos() -> None:
    rows, st = pack_rows([list(range(100))], 16, BOS, packing=SPLIT, shuffle=False, with_stats=True)
    assert rows[0].tolist() == [BOS, *range(16)]
    assert rows[1].tolist() == [BOS, *range(16, 32)]
    assert st.crops == 0 and st.rows == 6


def test_split_best_fit_rarely_crops() -> None:
    _, st = pack_rows(_docs(2000), 256, BOS, packing=SPLIT, with_stats=True)
    assert st.crops < 0.2 * st.rows


@pytest.mark.parametrize("packing", [CROP, SPLIT])
def test_packing_is_deterministic_and_depends_only_on_the_seed_and_seq_len(packing: str) -> None:
    docs = _docs()
    a = pack_rows(docs, 64, BOS, seed=3, packing=packing)
    assert torch.equal(a, pack_rows(docs, 64, BOS, seed=3, packing=packing))
    assert not torch.equal(a, pack_rows(docs, 64, BOS, seed=4, packing=packing))
    assert torch.equal(
        pack_rows(docs, 64, BOS, seed=3, shuffle=False, packing=packing),
        pack_rows(docs, 64, BOS, seed=4, shuffle=False, packing=packing),
    )


def test_packed_rows_of_tokenized_text_decode_to_the_text() -> None:
    tok = ByteTokenizer()
    rows = pack_rows((tok.encode_bytes(t) for t in ["hello world"] * 10), 23, tok.bos_id, shuffle=False)
    assert tok.decode(rows[0].tolist()) == "hello worldhello world"


@pytest.mark.parametrize(
    ("seq_len", "n_docs", "buffer", "seed"),
    [
        (16, 400, 1000, 0),
        (16, 400, 7, 1),
        (31, 600, 50, 2),
        (64, 300, 20, 3),
        (8, 2500, None, 4),
    ],
)
def test_default_packing_reproduces_the_paper_packer_row_for_row(
    seq_len: int, n_docs: int, buffer: int | None, seed: int
) -> None:
    docs = _mixed_docs(n_docs, seq_len, seed)
    rows, st = pack_rows(docs, seq_len, BOS, buffer=buffer, shuffle=False, with_stats=True)
    want = _paper_rows(docs, seq_len, BOS, 1000 if buffer is None else buffer)  # the paper's buffer_size
    assert len(want) > 10 and st.crops > 0
    assert any(len(d) + 1 < seq_len + 1 for d in docs) and any(len(d) + 1 > seq_len + 1 for d in docs)
    assert rows.tolist() == want
    shuffled = pack_rows(docs, seq_len, BOS, buffer=buffer, seed=seed)  # same rows, seeded order
    assert sorted(shuffled.tolist()) == sorted(want)


def test_the_paper_packer_stops_at_the_first_row_its_buffer_cannot_fill() -> None:
    docs = [[7] * 3 for _ in range(20)]  # two 4-token documents cannot fill a 17-token row
    rows, st = pack_rows(docs, 16, BOS, buffer=2, shuffle=False, with_stats=True)
    assert rows.shape == (0, 17) and _paper_rows(docs, 16, BOS, 2) == []
    assert st.dropped == st.tokens == 80 and st.discard_fraction == 1.0


def test_default_packing_never_splits_a_document_across_rows() -> None:
    seq_len = 32
    docs = _tagged_docs(500, seq_len)
    bos = 10**6
    rows, st = pack_rows(docs, seq_len, bos, shuffle=False, with_stats=True)
    seen: set[int] = set()
    for row in rows.tolist():
        assert row[0] == bos
        cuts = [i for i, t in enumerate(row) if t == bos] + [len(row)]
        for k, (a, b) in enumerate(itertools.pairwise(cuts)):
            piece = row[a + 1 : b]
            doc = piece[0]
            assert set(piece) == {doc} and doc not in seen  # one document, placed once
            seen.add(doc)
            if len(piece) < len(docs[doc]):  # cropped: only ever the last piece of its row
                assert k == len(cuts) - 2 and b == len(row)
    assert st.crops > 0 and len(seen) == st.pieces  # every document placed is whole or cropped


@pytest.mark.parametrize("packing", [CROP, SPLIT])
def test_the_discarded_token_fraction_is_reported(packing: str) -> None:
    seq_len = 24
    docs = _mixed_docs(700, seq_len, 5)
    rows, st = pack_rows(docs, seq_len, BOS, packing=packing, shuffle=False, with_stats=True)
    tokens = sum(len(d) + 1 for d in docs)
    assert st.packing == packing and st.tokens == tokens and st.documents == len(docs)
    assert rows.numel() == tokens + st.bos_added - st.discarded
    assert st.discard_fraction == pytest.approx(st.discarded / tokens)
    if packing == CROP:  # whole documents only: no BOS added, crop tails and long documents lost
        assert st.bos_added == 0 and st.cropped > 0 and st.discard_fraction > 0.2
        placed = Counter(t for row in rows.tolist() for t in row if t != BOS)
        lost = sum((Counter(t for d in docs for t in d) - placed).values())
        assert lost == st.discarded - (len(docs) - int((rows == BOS).sum()))  # BOS of unplaced docs
    else:  # split: only the final, incomplete row
        assert st.cropped == 0 and st.discarded == st.dropped < seq_len + 1


def test_split_mode_is_bit_for_bit_the_earlier_packer() -> None:
    """Hashes of loopscale's packer before the crop mode existed: old runs stay reproducible."""

    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]

    a, sa = pack_rows(_docs(300, 0), 64, BOS, seed=0, packing=SPLIT, with_stats=True)
    b, sb = pack_rows(_docs(500, 1), 16, BOS, seed=1, packing=SPLIT, with_stats=True)
    assert (digest(a), tuple(a.shape), sa.crops, sa.bos_added, sa.dropped) == (
        "16da9d1b33d83fe6",
        (448, 65),
        109,
        438,
        17,
    )
    assert (digest(b), tuple(b.shape), sb.crops, sb.bos_added, sb.dropped) == (
        "d8ea5c54dc1e8087",
        (2805, 17),
        162,
        2673,
        6,
    )
    assert torch.equal(a, pack_rows(_docs(300, 0), 64, BOS, seed=0, packing=SPLIT, buffer=1024))


def test_the_packing_setting_defaults_to_the_papers_and_rejects_unknown_modes() -> None:
    cfg = DataConfig()
    assert cfg.packing == CROP and cfg.packing_buffer is None
    with pytest.raises(ConfigError, match=r"^data\.packing: .*'best_fit_crop'.*\(got 'greedy'\)$"):
        validate(DataConfig, {"packing": "greedy"}, prefix="data")
    with pytest.raises(ConfigError, match=r"^data\.packing_buffer: .*greater than 0"):
        validate(DataConfig, {"packing_buffer": 0}, prefix="data")
    with pytest.raises(ConfigError, match=r"^data\.packing: must be one of"):
        pack_rows(_docs(), 16, BOS, packing="greedy")


def test_the_two_modes_never_share_a_cached_packing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopscale.train import batches

    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "docs"
    folder.mkdir()
    rng = random.Random(0)
    texts = ["".join(rng.choice("abcdef ") for _ in range(rng.choice([5, 20, 70, 200]))) for _ in range(120)]
    for i, t in enumerate(texts):
        (folder / f"{i:03d}.txt").write_text(t)
    base = {"source": "text", "paths": [str(folder)], "val_fraction": 0.1}
    crop, split = (validate(DataConfig, {**base, "packing": p}, prefix="data") for p in (CROP, SPLIT))
    assert batches._cache_key(crop, 32) != batches._cache_key(split, 32)
    assert batches._cache_key(crop, 32) != batches._cache_key(crop.model_copy(update={"packing_buffer": 5}), 32)
    a = batches.load_token_data(crop, 32)
    b = batches.load_token_data(split, 32)  # cached crop rows exist now; they must not be reused
    assert a.train.shape[0] < b.train.shape[0]
    again = batches.load_token_data(crop, 32)  # from the cache
    assert not again.built and again.path == a.path and np.array_equal(again.train, a.train)
    assert len(list((tmp_path / "cache" / "tokens").glob("*/meta.json"))) == 2
