"""`loopscale lm-eval ...`: lm-eval's own CLI reaches loopscale runs (the model registered, CPU without a GPU)."""

import json
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import TINY_MODEL
from loopscale.cli.lm_eval import lm_eval_argv
from loopscale.model import LoopedLM
from loopscale.train import load_train_config
from loopscale.train.checkpoint import CONFIG, save_weights

TASK_DIR = Path(__file__).parent / "data" / "lm_eval"


def test_device_is_added_only_to_runs_that_name_none() -> None:
    assert lm_eval_argv(["--model", "loopscale"], cuda=False)[-2:] == ["--device", "cpu"]
    assert lm_eval_argv(["run", "--model", "loopscale"], cuda=True)[-2:] == ["--device", "cuda:0"]
    assert lm_eval_argv(["--device=cuda:1"], cuda=False) == ["--device=cuda:1"]
    assert lm_eval_argv(["ls", "tasks"], cuda=False) == ["ls", "tasks"]
    assert lm_eval_argv(["--help"], cuda=False) == lm_eval_argv([], cuda=False) == ["--help"]


def test_lm_eval_cli_runs_a_loopscale_run_end_to_end(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("lm_eval")
    import lm_eval.tasks

    from loopscale.cli import run_app

    cfg = load_train_config(None, [f"model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()] + ["model.r=2"])
    run = tmp_path / "run"
    run.mkdir()
    (run / CONFIG).write_text(tomli_w.dumps(cfg.as_toml_dict()))
    save_weights(run, LoopedLM(cfg.model))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # lm-eval's default would be cuda:0

    class LocalOnly(lm_eval.tasks.TaskManager):  # index the toy tasks only: lm-eval's own 10k+ yamls take ~30 s
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalOnly)
    out = tmp_path / "out"
    argv = [
        "lm-eval",
        "--model",
        "loopscale",
        "--model_args",
        f"pretrained={run},r=3",
        "--tasks",
        "loopscale_toy_mc",
        "--include_path",
        str(TASK_DIR),
        "--output_path",
        str(out),
        "--limit",
        "3",
    ]
    assert run_app(argv) == 0
    [results] = out.rglob("results_*.json")
    doc = json.loads(results.read_text())
    assert doc["config"]["model"] == "loopscale" and doc["config"]["model_args"]["r"] == 3
    assert 0.0 <= doc["results"]["loopscale_toy_mc"]["acc,none"] <= 1.0
    assert run_app(["lm-eval", "--model", "loopscale", "--no-such-flag"]) == 2
