"""BOS-aligned best-fit packing: rows of T+1 tokens, every row starts with BOS, nothing padded."""

from __future__ import annotations

import random
from collections import Counter

import torch

from loopscale.data.packing import pack_rows, pack_texts
from loopscale.data.tokenizer import ByteTokenizer, Tokenizer

BOS = 256


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


def test_every_row_has_t_plus_one_tokens_and_starts_with_bos() -> None:
    rows = pack_rows(_docs(), 64, BOS)
    assert rows.dtype == torch.long and rows.shape[1] == 65
    assert bool((rows[:, 0] == BOS).all())


def test_packing_loses_and_pads_nothing_but_the_last_partial_row() -> None:
    docs = _docs()
    rows, st = pack_rows(docs, 64, BOS, with_stats=True)
    produced = sum(len(d) + 1 for d in docs) + st.bos_added
    assert rows.numel() + st.dropped == produced
    assert st.dropped < 65
    placed = Counter(rows[rows != BOS].tolist())
    wanted = Counter(t for d in docs for t in d)
    assert sum((wanted - placed).values()) <= st.dropped and not placed - wanted


def test_documents_reappear_in_order_when_rows_are_split_at_bos() -> None:
    docs = [[1 + i % 200] * (5 + 7 * i) for i in range(60)]  # each document one repeated token
    rows = pack_rows(docs, 32, BOS, shuffle=False)
    pieces: dict[int, int] = {}
    for row in rows.tolist():
        for chunk in " ".join(map(str, row)).split(str(BOS)):
            toks = chunk.split()
            if toks:
                assert len(set(toks)) == 1  # a piece never mixes two documents
                pieces[int(toks[0])] = pieces.get(int(toks[0]), 0) + len(toks)
    assert len(pieces) > 50


def test_a_document_longer_than_a_row_fills_whole_rows_each_led_by_bos() -> None:
    rows, st = pack_rows([list(range(100))], 16, BOS, shuffle=False, with_stats=True)
    assert rows[0].tolist() == [BOS, *range(16)]
    assert rows[1].tolist() == [BOS, *range(16, 32)]
    assert st.crops == 0 and st.rows == 6


def test_best_fit_rarely_crops() -> None:
    _, st = pack_rows(_docs(2000), 256, BOS, with_stats=True)
    assert st.crops < 0.2 * st.rows


def test_packing_is_deterministic_and_depends_only_on_the_seed_and_seq_len() -> None:
    docs = _docs()
    a = pack_rows(docs, 64, BOS, seed=3)
    assert torch.equal(a, pack_rows(docs, 64, BOS, seed=3))
    assert not torch.equal(a, pack_rows(docs, 64, BOS, seed=4))
    assert torch.equal(pack_rows(docs, 64, BOS, seed=3, shuffle=False),
                       pack_rows(docs, 64, BOS, seed=4, shuffle=False))


def test_pack_texts_uses_the_tokenizer() -> None:
    rows = pack_texts(["hello world"] * 10, ByteTokenizer(), 23, shuffle=False)
    assert ByteTokenizer().decode(rows[0].tolist()) == "hello worldhello world"
