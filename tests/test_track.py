"""Tracking: the final val_loss reaches the tracker before it closes; W&B project/entity from the environment
or the config; a stored random run id (resume continues it, same-named runs of two sweeps never merge);
sweep runs grouped by sweep and tagged with budget, r and variant. Offline: fake wandb / SummaryWriter modules."""

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from loopscale.train import train
from loopscale.train.track import run_id, sweep_labels
from test_train import cfg_with


class FakeWandb(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("wandb")
        self.inits: list[dict[str, Any]] = []
        self.logged: list[tuple[dict[str, Any], int]] = []
        self.finished = 0

    def init(self, **kwargs: Any) -> Any:
        self.inits.append(kwargs)
        fake = self

        class Run:
            def log(self, data: dict[str, Any], step: int) -> None:
                fake.logged.append((data, step))

            def finish(self) -> None:
                fake.finished += 1

        return Run()


@pytest.fixture
def wandb(monkeypatch) -> FakeWandb:
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    return fake


def _sweep_run(root: Path, sweep: str, run: str) -> Path:
    d = root / "runs" / run
    d.mkdir(parents=True)
    (root / "spec.toml").write_text(f'[sweep]\nname = "{sweep}"\n')
    (d / "sweep.json").write_text(
        json.dumps({"run_id": run, "variant": "main", "seed": 0, "C": 2e9, "r": 2, "d_model": 32})
    )
    return d


def test_wandb_gets_the_final_val_loss_sweep_labels_and_env_project(
    tmp_path: Path, wandb: FakeWandb, monkeypatch
) -> None:
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("WANDB_ENTITY", "team")
    run_dir = _sweep_run(tmp_path / "sweepA", "study-1", "C2e9-r2-d32")
    res = train(cfg_with("run.track=wandb", steps=10), run_dir, progress=False)
    [init] = wandb.inits
    assert init["project"] == "from-env" and init["entity"] == "team" and init["resume"] == "allow"
    assert init["group"] == "study-1" and init["tags"] == ["C=2e+09", "r=2", "variant=main"]
    assert init["id"].startswith("C2e9-r2-d32-") and init["id"] == (run_dir / "wandb_id").read_text().strip()
    final, step = wandb.logged[-1]
    assert step == 10 and final["val_loss"] == pytest.approx(res.val_loss)
    assert wandb.finished == 1 and all("train_loss" in d for d, _ in wandb.logged[:-1])


def test_config_project_wins_and_ids_are_stable_per_dir_unique_across_sweeps(
    tmp_path: Path, wandb: FakeWandb, monkeypatch
) -> None:
    from loopscale.train.track import make_tracker

    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    a = _sweep_run(tmp_path / "sweepA", "same", "r2")
    b = _sweep_run(tmp_path / "sweepB", "same", "r2")
    assert run_id(a) == run_id(a) != run_id(b)  # stored, so a resumed run continues it
    make_tracker("wandb", a, {"run": {"wandb_project": "mine", "wandb_entity": "me"}})
    assert wandb.inits[-1]["project"] == "mine" and wandb.inits[-1]["entity"] == "me"
    monkeypatch.delenv("WANDB_PROJECT")
    lone = tmp_path / "lone"
    lone.mkdir()
    make_tracker("wandb", lone, {})
    assert wandb.inits[-1]["project"] == "loopscale" and wandb.inits[-1]["group"] is None
    assert sweep_labels(lone) == (None, [])


def test_wandb_settings_are_not_part_of_the_run_identity(tmp_path: Path, wandb: FakeWandb) -> None:
    run_dir = tmp_path / "run"
    train(cfg_with("run.track=wandb", steps=10), run_dir, progress=False)
    again = train(cfg_with("run.track=wandb", "run.wandb_project=elsewhere", steps=10), run_dir, progress=False)
    assert again.status == "ok"  # the finished run, not a refusal for a different config


def test_tensorboard_gets_the_final_val_loss(tmp_path: Path, monkeypatch) -> None:
    scalars: list[tuple[str, float, int]] = []
    closed: list[bool] = []

    class Writer:
        def __init__(self, log_dir: str) -> None:
            self.log_dir = log_dir

        def add_scalar(self, key: str, value: float, step: int) -> None:
            scalars.append((key, value, step))

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    res = train(cfg_with("run.track=tensorboard", steps=10), tmp_path / "run", progress=False)
    vals = [(v, s) for k, v, s in scalars if k == "val_loss"]
    assert vals == [(pytest.approx(res.val_loss), 10)] and closed == [True]
    assert scalars.index(next(x for x in scalars if x[0] == "val_loss")) > 0  # after the training records
