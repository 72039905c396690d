"""The embedded default data: Shakespeare scenes + the seeded task world, interleaved by seed.

``build_default(cfg)`` gives the training documents, the fixed validation documents (the stream
whose loss the scaling-law fit uses) and the evaluation items. Shares are by UTF-8 bytes, which
are the tokens of the byte tokenizer (plus one BOS per document).

Interleaving: real and world documents are each shuffled with the seed, then merged by always
taking the next document from the source that is furthest below its target share, so every
prefix of the stream has (to within one document) the configured mixture.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from loopscale.config.data import DataConfig
from loopscale.data import corpus
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.data.world import CONTROL_TASKS, TASKS, EvalItem, World, build_world

REAL = "real"
GENERATOR_VERSION = 1
"""Bumped whenever the bytes ``build_default`` produces change (the fingerprint test pins them);
caches of packed rows should include it in their key."""


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def real_text(cfg: DataConfig) -> tuple[list[str], list[str]]:
    """Training and validation real-text documents (scenes) for ``cfg``.

    The validation scenes are fixed by the corpus alone (``corpus.split_scenes``); a
    ``real_text_bytes`` cap keeps whole training scenes in the seed's order until the cap.
    """
    scenes = corpus.load_scenes(cfg.text_dir)
    if len(scenes) < 2:
        from loopscale.errors import ConfigError

        raise ConfigError("data.text_dir", "need at least two documents (one is held out)", value=cfg.text_dir)
    train, val = corpus.split_scenes(scenes, cfg.val_fraction)
    if cfg.real_text_bytes is not None:
        order = list(train)
        random.Random(f"loopscale.mixture:{cfg.seed}:real-cap").shuffle(order)
        kept: set[str] = set()
        used = 0
        for s in order:
            if used >= cfg.real_text_bytes:
                break
            kept.add(s.key)
            used += _nbytes(s.text)
        train = [s for s in train if s.key in kept]
    return [s.text for s in train], [s.text for s in val]


def world_budget(cfg: DataConfig) -> tuple[int, int]:
    """Bytes of task-world text for training and validation so that it makes ``world_share``."""
    train, val = real_text(cfg)
    ratio = cfg.world_share / (1.0 - cfg.world_share)
    return round(sum(map(_nbytes, train)) * ratio), round(sum(map(_nbytes, val)) * ratio)


def interleave(
    real: list[str],
    world: list[str],
    share: float,
    rng: random.Random,
    real_tag: list[str] | None = None,
    world_tag: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Shuffle each source with ``rng`` and merge them at ``share`` world bytes.

    Returns the merged documents and, parallel to them, their family tags.
    """
    ri = list(range(len(real)))
    wi = list(range(len(world)))
    rng.shuffle(ri)
    rng.shuffle(wi)
    rtag = real_tag or [REAL] * len(real)
    wtag = world_tag or ["world"] * len(world)
    out: list[str] = []
    tags: list[str] = []
    used_r = used_w = 0
    a = b = 0
    while a < len(ri) or b < len(wi):
        take_world = b < len(wi) and (a >= len(ri) or used_w < share * (used_r + used_w + 1))
        if take_world:
            doc, tag = world[wi[b]], wtag[wi[b]]
            b += 1
            used_w += _nbytes(doc)
        else:
            doc, tag = real[ri[a]], rtag[ri[a]]
            a += 1
            used_r += _nbytes(doc)
        out.append(doc)
        tags.append(tag)
    return out, tags


@dataclass
class DefaultData:
    """The embedded default: training and validation documents, evaluation items, provenance."""

    config: DataConfig
    train_docs: list[str]
    val_docs: list[str]
    eval_items: list[EvalItem]
    train_family: list[str] = field(repr=False)  # "real" or a world family, parallel to train_docs
    val_family: list[str] = field(repr=False)
    world: World = field(repr=False)

    @property
    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    def fingerprint(self) -> str:
        """sha256 of the training, validation and evaluation sets (record it with every run)."""
        import hashlib
        import json

        h = hashlib.sha256()
        for name, docs in (("train", self.train_docs), ("val", self.val_docs)):
            h.update(f"{name}:{len(docs)}\n".encode())
            for d in docs:
                b = d.encode("utf-8")
                h.update(f"{len(b)}:".encode())
                h.update(b)
        for it in self.eval_items:
            h.update(
                json.dumps(
                    [it.task, it.axis, it.prompt, it.gold, it.choices, it.meta], sort_keys=True, ensure_ascii=True
                ).encode()
            )
        return h.hexdigest()

    def describe(self) -> dict[str, Any]:
        """Sizes, shares and the unigram entropy of the training tokens (a floor for a model that
        ignores context; a trained model should beat it, and one that does not is broken)."""
        tok = self.tokenizer
        stats: dict[str, Any] = {
            "source": self.config.source,
            "seed": self.config.seed,
            "real_text": (
                f"{corpus.CORPUS_PACKAGE}=={corpus.CORPUS_VERSION} Shakespeare plays, one document per scene"
                if self.config.text_dir is None
                else f"files in {self.config.text_dir}"
            ),
            "tokenizer": "bytes (UTF-8 bytes + BOS)",
            "vocab_size": tok.vocab_size,
        }
        for split, docs, fams in (
            ("train", self.train_docs, self.train_family),
            ("val", self.val_docs, self.val_family),
        ):
            nbytes = [_nbytes(d) for d in docs]
            total = sum(nbytes)
            fam_bytes: dict[str, int] = {}
            fam_docs: dict[str, int] = {}
            for f, n in zip(fams, nbytes, strict=True):
                fam_bytes[f] = fam_bytes.get(f, 0) + n
                fam_docs[f] = fam_docs.get(f, 0) + 1
            real_b = fam_bytes.get(REAL, 0)
            stats[split] = {
                "documents": len(docs),
                "real_documents": fam_docs.get(REAL, 0),
                "world_documents": len(docs) - fam_docs.get(REAL, 0),
                "bytes": total,
                "tokens": total + len(docs),  # one BOS per document (before packing splits)
                "world_share": (total - real_b) / total if total else 0.0,
                "families": {
                    f: {"documents": fam_docs[f], "bytes": fam_bytes[f], "share": fam_bytes[f] / total}
                    for f in _family_order(fam_bytes)
                },
            }
        stats["train"]["unigram_entropy_nats"] = unigram_entropy(self.train_docs)
        stats["train"]["unigram_entropy_bits"] = stats["train"]["unigram_entropy_nats"] / _LN2
        stats["entities"] = {"seen": len(self.world.entities), "unseen": len(self.world.unseen_entities)}
        counts: dict[str, int] = {}
        for it in self.eval_items:
            counts[it.task] = counts.get(it.task, 0) + 1
        stats["eval"] = {t: {"axis": TASKS[t], "items": counts.get(t, 0), "control": t in CONTROL_TASKS} for t in TASKS}
        return stats


_LN2 = 0.6931471805599453


def _family_order(fam_bytes: dict[str, int]) -> list[str]:
    known = [REAL, "bio", "bio_qa_train", *TASKS]
    return [f for f in known if f in fam_bytes] + sorted(f for f in fam_bytes if f not in known)


def unigram_entropy(docs: list[str]) -> float:
    """Entropy (nats per token) of the byte-token unigram distribution, one BOS per document."""
    import numpy as np

    counts = np.bincount(np.frombuffer("".join(docs).encode("utf-8"), dtype=np.uint8), minlength=256)
    counts = np.append(counts, len(docs)).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def build_default(cfg: DataConfig | None = None) -> DefaultData:
    """Build the embedded default mixture for ``cfg`` (``DataConfig()`` when omitted)."""
    cfg = cfg or DataConfig()
    if cfg.source != "default":
        from loopscale.errors import ConfigError

        raise ConfigError(
            "data.source",
            "the embedded mixture is source 'default'; the user's data is read by loopscale.train.batches",
            value=cfg.source,
        )
    real_train, real_val = real_text(cfg)
    ratio = cfg.world_share / (1.0 - cfg.world_share)
    world = build_world(
        cfg,
        train_bytes=round(sum(map(_nbytes, real_train)) * ratio),
        val_bytes=round(sum(map(_nbytes, real_val)) * ratio),
    )
    rng = random.Random(f"loopscale.mixture:{cfg.seed}:order")
    train, train_fam = interleave(real_train, world.train_docs, cfg.world_share, rng, world_tag=world.train_family)
    val, val_fam = interleave(real_val, world.val_docs, cfg.world_share, rng, world_tag=world.val_family)
    return DefaultData(cfg, train, val, list(world.eval_items), train_fam, val_fam, world)
