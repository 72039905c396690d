"""Executors behind one protocol: the registry resolves them, and a new one is a class plus a registration."""

from pathlib import Path
from typing import ClassVar

import pytest
import tomli_w

from conftest import tiny_sweep_spec
from loopscale.config import StrictModel
from loopscale.errors import ConfigError
from loopscale.sweep import executor as executors
from loopscale.sweep import spec_from_dict
from loopscale.sweep.attempt import execute_run, runnable
from loopscale.sweep.executor import Executor, SweepJob
from loopscale.sweep.store import SweepStore


def one_run_spec() -> dict:
    return tiny_sweep_spec({"ckpt_every": 0}, budgets=[2e9], r=[2], widths={"2e9": [16]})


def test_the_registry_resolves_local_and_slurm_and_names_them_when_asked_for_another() -> None:
    from loopscale.sweep.local import LocalExecutor, LocalSettings
    from loopscale.sweep.slurm import SlurmExecutor, SlurmSettings

    assert executors.names()[:2] == ["local", "slurm"]
    local, slurm = executors.get("local"), executors.get("slurm")
    assert isinstance(local, LocalExecutor) and local.Settings is LocalSettings and local.name == "local"
    assert isinstance(slurm, SlurmExecutor) and slurm.Settings is SlurmSettings and slurm.name == "slurm"
    with pytest.raises(ConfigError, match=r"--executor: expected local or slurm \(got 'k8s'\)"):
        executors.get("k8s")


class ToySettings(StrictModel):
    """The spec's [toy] table."""

    reverse: bool = False


class ToyExecutor(Executor):
    """Trains the runs one after another in this process, in the order its table asks for."""

    name = "toy"
    Settings = ToySettings
    seen: ClassVar[list[SweepJob]] = []

    def launch(self, job: SweepJob) -> None:
        settings: ToySettings = self.settings(job.table, job.source)
        self.seen.append(job)
        for rs in (reversed if settings.reverse else list)(job.runs):
            if runnable(job.store, rs.run_id, job.max_retries)[0]:
                execute_run(job.store, rs.run_id, max_retries=job.max_retries, executor=self.name)
        job.console.print(f"toy: {len(job.runs)} run(s)", highlight=False)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> type[ToyExecutor]:
    """ToyExecutor registered as "toy" for one test (the one registration line a new executor needs)."""
    monkeypatch.setitem(executors.EXECUTORS, "toy", ToyExecutor)
    monkeypatch.setattr(ToyExecutor, "seen", [])
    return ToyExecutor


def test_a_registered_executor_runs_a_tiny_sweep_through_the_cli_with_its_own_spec_table(
    toy, tmp_path: Path, capsys
) -> None:
    from loopscale.cli import run_app

    spec = one_run_spec()
    spec["toy"] = {"reverse": True}
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec))
    root = tmp_path / "sw"
    assert run_app(["sweep", "run", str(path), "--out", str(root), "--executor", "toy", "--no-progress"]) == 0
    assert "toy: 1 run(s)" in capsys.readouterr().err
    (job,) = toy.seen
    assert job.table == {"reverse": True} and job.max_retries == 1 and job.name == "tiny"
    assert set(job.flops) == {rs.run_id for rs in job.runs} and all(f > 0 for f in job.flops.values())
    store = SweepStore(root)
    (rs,) = store.planned()
    st = store.state(rs.run_id)
    assert st.status == "done" and st.result is not None and st.result["status"] == "ok"
    assert run_app(["sweep", "run", str(root), "--executor", "toy", "--no-progress"]) == 0  # nothing left to do
    assert store.state(rs.run_id).attempts["attempts"] == 1


def test_a_registered_executors_table_is_validated_when_the_spec_loads(toy) -> None:
    spec = one_run_spec()
    spec["toy"] = {"revrse": True}
    with pytest.raises(ConfigError, match=r"^spec.toml: toy.revrse"):
        spec_from_dict(spec, source="spec.toml")
    spec["toy"] = {"reverse": True}
    assert spec_from_dict(spec, source="spec.toml").executors["toy"] == {"reverse": True}
    spec["k8s"] = {}
    with pytest.raises(ConfigError, match=r"expected \[sweep\], \[train\], \[local\], \[slurm\], \[toy\], \[fit\]"):
        spec_from_dict(spec, source="spec.toml")


def test_an_executor_whose_module_cannot_be_imported_fails_only_when_asked_for(monkeypatch) -> None:
    monkeypatch.setitem(executors.EXECUTORS, "gone", "loopscale_no_such_module:Gone")
    with pytest.raises(executors.ExecutorUnavailable, match="gone needs loopscale_no_such_module"):
        executors.get("gone")
    spec = one_run_spec()
    spec["gone"] = {"anything": 1}  # not checked: it cannot be
    assert spec_from_dict(spec, source="spec.toml").executors["gone"] == {"anything": 1}


def test_an_unknown_executor_fails_before_the_sweep_dir_is_made(tmp_path: Path, capsys) -> None:
    from loopscale.cli.app import run_app

    out = tmp_path / "sweep"
    assert run_app(["sweep", "run", "quick", "--executor", "k8s", "--out", str(out)]) == 2
    assert "expected local or slurm" in capsys.readouterr().err
    assert not out.exists()
