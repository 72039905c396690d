"""Bad data configs fail with one line naming the field; `loopscale data describe` reports the stream."""

from __future__ import annotations

import json

import pytest

from loopscale.cli import app as _registered  # noqa: F401  (registers all commands)
from loopscale.cli.app import run_app
from loopscale.config import validate
from loopscale.config.data import DataConfig
from loopscale.data.mixture import build_default
from loopscale.errors import ConfigError

SMALL = [
    "--set",
    "data.real_text_bytes=100000",
    "--set",
    "data.world.n_entities=30",
    "--set",
    "data.world.n_unseen_entities=10",
    "--set",
    "data.world.eval_per_task=20",
]


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"source": "csv"}, "data.source", "'default'"),
        ({"source": "shards"}, "data.paths", "needs data.paths"),
        ({"world_share": 0}, "data.world_share", "greater than 0"),
        ({"world_share": 1}, "data.world_share", "less than 1"),
        ({"colour": "red"}, "data.colour", "unknown key"),
        ({"world": {"n_entities": 0}}, "data.world.n_entities", "greater than 0"),
        (
            {"world": {"mix": {a: 0 for a in ("knowledge", "reading", "math", "reasoning", "symbolic")}}},
            "data.world.mix",
            "positive weight",
        ),
    ],
)
def test_a_bad_data_config_is_a_one_line_error_naming_the_field(data: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(DataConfig, data, source="cfg.toml", prefix="data")
    msg = str(err.value)
    assert msg.startswith(f"cfg.toml: {field}:") and words in msg and "\n" not in msg


def test_an_empty_text_folder_is_a_one_line_error(tmp_path) -> None:
    one_line = r"^data.text_dir: no .md or .txt files in the folder \(got '.*'\)$"
    with pytest.raises(ConfigError, match=one_line):
        build_default(DataConfig(text_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="folder not found"):
        build_default(DataConfig(text_dir=str(tmp_path / "nope")))


def test_data_describe_prints_one_line_for_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(["data", "describe", "--set", "data.world_share=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --set: data.world_share:") and "\n" not in err


def test_data_describe_json_reports_tokens_shares_and_entropy(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(["data", "describe", "--json", *SMALL]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["vocab_size"] == 257
    assert stats["train"]["tokens"] > 100_000
    assert stats["train"]["world_share"] == pytest.approx(0.4, abs=0.01)
    assert 3.0 < stats["train"]["unigram_entropy_nats"] < 4.5
    assert stats["eval"]["bio_qa"]["items"] == 20


def test_data_describe_reads_the_data_table_of_a_config_file(tmp_path, capsys) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        "[model]\nd_model = 64\n\n[data]\nseed = 3\nreal_text_bytes = 100000\n"
        "[data.world]\nn_entities = 30\nn_unseen_entities = 10\neval_per_task = 20\n"
    )
    assert run_app(["data", "describe", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "seed=3" in out and "unigram entropy" in out and "bio_qa_unseen" in out
