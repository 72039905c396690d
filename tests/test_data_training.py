"""A tiny model trained on the default mixture learns the task world: continuation loss falls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loopscale.config import ModelConfig
from loopscale.config.data import DataConfig
from loopscale.data.mixture import build_default
from loopscale.data.packing import pack_rows
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.data.world import CONTROL_TASKS, EvalItem

T = 128


def continuation_loss(model: torch.nn.Module, items: list[EvalItem], tok: ByteTokenizer) -> float:
    """Mean per-token loss (nats) of each gold continuation given BOS + prompt, over all items."""
    seqs, spans = [], []
    for it in items:
        prompt, gold = [tok.bos_id, *tok.encode(it.prompt)], tok.encode(it.gold)
        seqs.append(prompt + gold)
        spans.append((len(prompt), len(prompt) + len(gold)))
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width - 1)
    for i, (s, (a, b)) in enumerate(zip(seqs, spans, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, a - 1 : b - 1] = 1.0  # position j predicts token j + 1
    model.eval()
    with torch.no_grad():
        logits = model(ids[:, :-1])[..., : tok.vocab_size]
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    model.train()
    return float((nll * mask).sum() / mask.sum())


@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from a second thread, and on two shared cores two threads were
    8x slower (311 s vs 36 s for this test at load 5); one thread keeps it well under a minute."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_tiny_model_trained_on_the_mixture_lowers_the_task_world_continuation_loss() -> None:
    from loopscale.model import LoopedLM

    data = build_default(
        DataConfig(real_text_bytes=200_000, world={"n_entities": 40, "n_unseen_entities": 10, "eval_per_task": 16})
    )
    tok = ByteTokenizer()
    rows = pack_rows((tok.encode_bytes(d) for d in data.train_docs), T, tok.bos_id, seed=0)
    items = [it for it in data.eval_items if it.task not in CONTROL_TASKS]
    model = LoopedLM(
        ModelConfig(vocab_size=tok.vocab_size, d_model=64, head_dim=16, L_eff=4, n_prelude=1, n_coda=1, r=1, seq_len=T)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    before = continuation_loss(model, items, tok)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        batch = rows[torch.randint(0, rows.shape[0], (8,), generator=gen)]
        loss = model.loss(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    after = continuation_loss(model, items, tok)
    unigram = data.describe()["train"]["unigram_entropy_nats"]
    print(f"task-world continuation loss: {before:.3f} -> {after:.3f} nats (unigram {unigram:.3f})")
    assert before > 5.0  # about ln 257 at the paper's init
    assert after < before - 2.0
    assert after < unigram
