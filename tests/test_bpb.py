"""Bits per byte (nanochat's convention): nats of the target tokens / (ln 2 x their UTF-8 bytes), BOS left out;
in result.json, the final metrics line and the runs table."""

import math
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL
from loopscale.config import ModelConfig
from loopscale.data.hf_tokenizer import HFTokenizer, train_bpe
from loopscale.data.token_bytes import token_bytes
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.model import LoopedLM
from loopscale.train.validate import val_loss_stats
from test_train import cfg_with

TEXTS = ["héllo wörld, the king and the queen", "Ünïcødé ∑ x = 1", "plain ascii text"]


def test_token_bytes_add_up_to_the_texts_bytes(tmp_path: Path) -> None:
    tb = token_bytes(ByteTokenizer())
    assert tb.tolist() == [1] * 256 + [0]
    tok = HFTokenizer(train_bpe([" ".join(TEXTS) * 40], 300, tmp_path / "tok.json"))
    tb = token_bytes(tok)
    assert tb[tok.bos_id] == 0
    for text in TEXTS:
        ids = tok.encode(text)
        assert len(ids) < len(text.encode())  # merges happened
        assert int(tb[ids].sum()) == len(text.encode("utf-8"))


def test_val_bpb_is_the_nats_of_text_tokens_over_ln2_bytes() -> None:
    torch.manual_seed(0)
    model = LoopedLM(ModelConfig(**TINY_MODEL)).eval()
    tok = ByteTokenizer()
    rows = torch.tensor([[tok.bos_id, *tok.encode(t)][:17] for t in TEXTS])
    rows[1, 8] = tok.bos_id  # a document boundary inside a row: its loss and bytes are left out
    stats = val_loss_stats(
        model,
        rows,
        micro_batch=2,
        device=torch.device("cpu"),
        dtype="float32",
        token_bytes=torch.from_numpy(token_bytes(tok)),
    )
    with torch.no_grad():
        nll = model(rows[:, :-1], rows[:, 1:], reduction="none").view(3, -1).double()
    text = rows[:, 1:] != tok.bos_id
    assert stats.loss == pytest.approx(float(nll.mean()))
    assert stats.bpb == pytest.approx(float(nll[text].sum()) / (math.log(2) * int(text.sum())), rel=1e-9)
    no_bytes = val_loss_stats(model, rows, micro_batch=2, device=torch.device("cpu"), dtype="float32")
    assert no_bytes.bpb is None and no_bytes.loss == pytest.approx(stats.loss)


def test_result_metrics_and_runs_table_carry_val_bpb(tmp_path: Path) -> None:
    import json

    from loopscale.sweep.collect import EXTRA
    from loopscale.train import train

    res = train(cfg_with(steps=10), tmp_path / "run", progress=False)
    assert res.val_bpb > 0 and math.isfinite(res.val_bpb)
    # bytes: one byte per text token, so bpb is close to the loss in bits (BOS targets are few)
    assert res.val_bpb == pytest.approx(res.val_loss / math.log(2), rel=0.1)
    final = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["final"] and final["val_bpb"] == res.val_bpb
    assert "val_bpb" in EXTRA
