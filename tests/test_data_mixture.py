"""The default mixture: real text + task world at the configured share, fixed validation stream."""

from __future__ import annotations

from functools import lru_cache

import pytest

from loopscale.config.data import DataConfig
from loopscale.data.mixture import REAL, DefaultData, build_default, interleave, unigram_entropy

SMALL = DataConfig(real_text_bytes=150_000, world={"n_entities": 40, "n_unseen_entities": 20, "eval_per_task": 30})


@lru_cache(maxsize=4)
def data(share: float = 0.4) -> DefaultData:
    return build_default(SMALL.model_copy(update={"world_share": share}))


def _world_share(docs: list[str], fams: list[str]) -> float:
    total = sum(len(d.encode()) for d in docs)
    return sum(len(d.encode()) for d, f in zip(docs, fams, strict=True) if f != REAL) / total


@pytest.mark.parametrize("share", [0.1, 0.4, 0.7])
def test_the_training_stream_has_the_configured_world_share(share: float) -> None:
    d = data(share)
    assert _world_share(d.train_docs, d.train_family) == pytest.approx(share, abs=0.01)
    assert _world_share(d.val_docs, d.val_family) == pytest.approx(share, abs=0.03)


def test_every_prefix_of_the_stream_has_about_the_configured_share() -> None:
    d = data()
    n = len(d.train_docs)
    for k in (n // 4, n // 2, 3 * n // 4):
        assert _world_share(d.train_docs[:k], d.train_family[:k]) == pytest.approx(0.4, abs=0.05)


def test_interleaving_is_a_permutation_of_both_sources() -> None:
    import random

    real, world = [f"r{i}" * 10 for i in range(20)], [f"w{i}" for i in range(50)]
    out, tags = interleave(real, world, 0.25, random.Random(0))
    assert sorted(out) == sorted(real + world)
    assert tags.count("real") == 20


def test_validation_documents_are_not_training_documents() -> None:
    d = build_default(DataConfig())
    train = set(d.train_docs)
    real_val = [v for v, f in zip(d.val_docs, d.val_family, strict=True) if f == REAL]
    assert not any(v in train for v in real_val)
    world_val = [v for v, f in zip(d.val_docs, d.val_family, strict=True) if f != REAL]
    assert sum(v in train for v in world_val) < 0.05 * len(world_val)  # only a few short, common items


def test_describe_reports_documents_tokens_vocabulary_shares_and_entropy() -> None:
    stats = data().describe()
    tr = stats["train"]
    assert stats["vocab_size"] == 257
    assert tr["documents"] == len(data().train_docs)
    assert tr["tokens"] == tr["bytes"] + tr["documents"]
    assert tr["world_share"] == pytest.approx(0.4, abs=0.01)
    assert sum(f["share"] for f in tr["families"].values()) == pytest.approx(1.0)
    assert 3.0 < tr["unigram_entropy_nats"] < 4.5
    assert stats["eval"]["bio_qa_unseen"]["control"] is True
    assert stats["entities"] == {"seen": 40, "unseen": 20}


def test_unigram_entropy_of_one_repeated_byte_is_the_bos_mixture() -> None:
    # "aaa" and one BOS: p = (3/4, 1/4)
    import math

    assert unigram_entropy(["aaa"]) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
