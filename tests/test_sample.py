"""Sampling in ``LoopedLM.generate`` (greedy stays the default) and `loopscale sample` with the looped KV cache."""

import json
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import TINY_MODEL
from loopscale.config import ModelConfig
from loopscale.errors import ConfigError
from loopscale.model import LoopedLM
from loopscale.train import load_train_config
from loopscale.train.checkpoint import CONFIG, save_weights


def _model() -> LoopedLM:
    torch.manual_seed(0)
    m = LoopedLM(ModelConfig(**{**TINY_MODEL, "r": 2})).eval()
    with torch.no_grad():
        m.head.weight.normal_(0.0, 0.5)  # a spread-out next-token distribution, so draws differ
        m.inject.weight.add_(0.3 * torch.randn_like(m.inject.weight))
    return m


def test_greedy_is_the_default_and_matches_a_full_recompute() -> None:
    m = _model()
    idx = torch.tensor([[256, 72, 105, 33], [256, 65, 66, 67]])
    out = m.generate(idx, 8, r=3)
    assert torch.equal(out, m.generate(idx, 8, r=3, temperature=0.0))
    assert torch.equal(out, m.generate(idx, 8, r=3, temperature=1.0, top_k=1))  # top-1 sampling is greedy
    seq = idx
    with torch.no_grad():
        for _ in range(8):  # no cache: the whole sequence every step
            seq = torch.cat([seq, m(seq, r=3)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq[:, idx.size(1) :])


def test_sampling_is_seeded_and_stays_in_the_top_k() -> None:
    m = _model()
    idx = torch.tensor([[256, 72, 105]])

    def draw(seed: int, **kw) -> torch.Tensor:
        return m.generate(idx, 12, temperature=1.0, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))
    out = draw(3, top_k=3)
    seq = torch.cat([idx, out], dim=1)
    with torch.no_grad():
        logits = m(seq)[0, idx.size(1) - 1 : -1]
    top3 = logits.topk(3, dim=-1).indices
    assert all(int(t) in top3[i].tolist() for i, t in enumerate(out[0]))
    with pytest.raises(ConfigError, match="temperature"):
        m.generate(idx, 2, temperature=-1.0)
    with pytest.raises(ConfigError, match="top_k"):
        m.generate(idx, 2, temperature=1.0, top_k=0)


def test_sample_cli_is_reproducible_and_takes_r(tmp_path: Path, capsys) -> None:
    from loopscale.cli import run_app

    cfg = load_train_config(None, [f"model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()] + ["model.r=2"])
    (tmp_path / CONFIG).write_text(tomli_w.dumps(cfg.as_toml_dict()))
    save_weights(tmp_path, _model())
    argv = ["sample", str(tmp_path), "--prompt", "Once", "--max-tokens", "10", "--seed", "7", "--top-k", "50"]
    texts = []
    for extra in ([], [], ["--r", "4"], ["--temperature", "0"]):
        assert run_app([*argv, *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("Once")
    assert texts[2] != texts[0] and texts[3] != texts[0]
    assert run_app([*argv, "--temperature", "-1"]) == 2


def test_control_bytes_in_a_sample_are_printed_as_escapes_not_sent_to_the_terminal() -> None:
    """A byte-level model can emit ESC, NUL or a bell; `sample` printed them raw to the terminal (issue 29)."""
    from loopscale.console import printable

    assert printable("ok\x1b[2Jgone\x00\x07\nnext\tline") == "ok\\x1b[2Jgone\\x00\\x07\nnext\tline"
    assert printable("plain text, ünïcode") == "plain text, ünïcode"
