"""The SLURM executor without a cluster: a fake sbatch records the arrays; submitit's local executor requeues."""

import json
import os
import re
import signal
import stat
import time
from pathlib import Path

import pytest
import submitit

from conftest import OK_RESULT, tiny_sweep_spec
from loopscale.sweep import executor, prepare, spec_from_dict
from loopscale.sweep.slurm import SlurmSettings, SweepTask, resources, submit
from loopscale.sweep.store import SweepStore


def tiny_spec(**sweep) -> dict:
    return {
        **tiny_sweep_spec({"log_every": 5}, **sweep),
        # at 2e6 FLOP/s per GPU these runs take 0.3 h (2e9) and 0.6 h (4e9): the larger budget gets 2 GPUs
        "slurm": {
            "partition": "gpu",
            "gpus_per_run": "auto",
            "target_hours": 0.4,
            "flops_per_gpu": 2e6,
            "array_parallelism": 3,
            "setup": ["source venv/bin/activate"],
        },
    }


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch records each script and answers with a job id; squeue lists the ids in FAKE/alive."""
    rec = tmp_path / "fake_slurm"
    bin_dir = rec / "bin"
    bin_dir.mkdir(parents=True)
    _script(
        bin_dir / "sbatch",
        f"""#!/bin/bash
n=$(( $(ls {rec}/*.sh 2>/dev/null | wc -l) + 1 ))
cp "$1" {rec}/sbatch_$n.sh
echo "Submitted batch job $((1000 + n))"
""",
    )
    _script(bin_dir / "squeue", f"#!/bin/bash\ncat {rec}/alive 2>/dev/null\n")
    _script(bin_dir / "srun", "#!/bin/bash\nexit 0\n")
    (rec / "alive").write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return rec


def _sbatch_flags(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=?(.*)$", text, flags=re.M))


def test_resources_grow_with_the_runs_flops() -> None:
    s = SlurmSettings(
        gpus_per_run="auto",
        flops_per_gpu=1e14,
        target_hours=10,
        max_gpus_per_run=8,
        mem_gb_per_gpu=80,
        cpus_per_gpu=12,
        max_time_min=1440,
    )
    small, big, huge = resources(1e17, s), resources(1e19, s), resources(1e21, s)
    assert (small["gpus"], small["time_min"], small["mem_gb"], small["cpus_per_task"]) == (1, 60, 80, 12)
    assert big["gpus"] == 4 and big["time_min"] == 720 and big["mem_gb"] == 320
    assert huge["gpus"] == 8 and huge["time_min"] == 1440  # capped: the run is requeued and resumes
    assert resources(1e17, SlurmSettings(gpus_per_run=0, mem_gb_per_run=16))["gpus"] == 0


def test_time_limits_use_finished_runs_then_the_calibration_then_the_assumed_flops(
    fake_slurm: Path, tmp_path: Path
) -> None:
    from loopscale import accounting
    from loopscale.sweep.calibrate import shape_key
    from loopscale.sweep.slurm import run_speeds

    spec = spec_from_dict(tiny_spec())
    store = prepare(spec, tmp_path / "sw")
    s = SlurmSettings(gpus_per_run=1, flops_per_gpu=3e14)
    runs = sorted(spec.runs(), key=lambda rs: accounting.train_flops_per_token(rs.config.model))
    f = {rs.run_id: accounting.train_flops_per_token(rs.config.model) for rs in runs}
    small, big = runs[0], runs[-1]
    assert f[small.run_id] < f[big.run_id]
    assert run_speeds(store, runs, s) == {}  # nothing measured: every run assumes flops_per_gpu

    # a calibration cached by `sweep plan` on two GPU machines: the slower one counts; exact shapes only
    key = shape_key(small.config, "cuda")
    (store.root / "calibration.json").write_text(
        json.dumps(
            {
                "NVIDIA H100 80GB HBM3|16 cores": {key: {"flops_per_s": 2e12}},
                "NVIDIA A100-SXM4-80GB|16 cores": {key: {"flops_per_s": 1e12}},
                "some CPU|2 cores": {shape_key(big.config, "cpu"): {"flops_per_s": 1e10}},
            }
        )
    )
    same_shape = {rs.run_id for rs in runs if shape_key(rs.config, "cuda") == key}
    assert run_speeds(store, runs, s) == {rid: (1e12, "calibration") for rid in same_shape}

    def finish(rs, fps: float, device: str = "cuda:0", world: int = 1) -> None:
        (store.run_dir(rs.run_id) / "result.json").write_text(
            json.dumps(
                {
                    "status": "ok",
                    "flops_per_token": f[rs.run_id],
                    "flops": 1e13,
                    "wall_s": 1e13 / fps / world,
                    "world_size": world,
                    "hardware": {"device": device},
                }
            )
        )

    finish(small, 4e9, world=2)  # 4e9 FLOP/s per GPU on 2 GPUs
    finish(runs[1], 1e15, device="cpu")  # another device type: ignored for GPU runs
    speeds = run_speeds(store, runs, s)
    assert speeds == {rs.run_id: (4e9, "finished") for rs in runs}  # the nearest smaller shape: the small one
    finish(big, 8e9)
    speeds = run_speeds(store, runs, s)
    assert speeds[big.run_id] == (8e9, "finished") and speeds[small.run_id] == (4e9, "finished")
    assert all(speeds[rs.run_id][0] == (8e9 if f[rs.run_id] >= f[big.run_id] else 4e9) for rs in runs)
    assert run_speeds(store, runs, SlurmSettings(gpus_per_run=0))[big.run_id] == (1e15, "finished")

    assumed, measured = resources(3e13, s), resources(3e13, s, 4e9)
    assert assumed["time_min"] == 15 and measured["est_min"] == pytest.approx(125)
    assert measured["time_min"] == 240  # 125 min x 1.5 + 10 -> the next rung
    assert resources(3e13, s, 8e9)["time_min"] == 120

    submit(store, runs, {rs.run_id: 3e13 for rs in runs}, s, max_retries=0)
    times = sorted(_sbatch_flags(p.read_text())["time"] for p in fake_slurm.glob("sbatch_*.sh"))
    left = [rs for rs in runs if rs not in (small, runs[1], big)]  # the finished runs are not submitted
    assert times == sorted({"240" if speeds[rs.run_id][0] == 4e9 else "120" for rs in left})


def test_fake_sbatch_gets_one_throttled_array_per_resource_group_and_only_unfinished_runs_are_resubmitted(
    fake_slurm: Path, tmp_path: Path
) -> None:
    from loopscale.cli import run_app

    spec = spec_from_dict(tiny_spec())
    store = prepare(spec, tmp_path / "sw")
    assert run_app(["sweep", "run", str(store.root), "--executor", "slurm"]) == 0
    scripts = sorted(fake_slurm.glob("sbatch_*.sh"))
    assert len(scripts) == 2
    flags = [_sbatch_flags(p.read_text()) for p in scripts]
    assert [f["array"] for f in flags] == ["0-3%3", "0-3%3"]
    assert [f["gpus-per-node"] for f in flags] == ["1", "2"] and [f["ntasks-per-node"] for f in flags] == ["1", "2"]
    assert [f["mem"] for f in flags] == ["64GB", "128GB"]  # per node
    assert [f["cpus-per-task"] for f in flags] == ["8", "8"]  # per rank
    assert [f["time"] for f in flags] == ["60", "60"] and {f["partition"] for f in flags} == {"gpu"}
    assert {f["signal"] for f in flags} == {"USR2@120"}
    text = scripts[0].read_text()
    assert "source venv/bin/activate" in text and "submitit.core._submit" in text

    queued = {rs.run_id: store.state(rs.run_id) for rs in spec.runs()}
    assert {st.status for st in queued.values()} == {"queued"}
    first = spec.runs()[0].run_id
    assert queued[first].lock["job_id"] == "1001_0"
    pickled = submitit.helpers.DelayedSubmission.load(tmp_path / "sw" / "slurm" / "1001_0" / "1001_0_submitted.pkl")
    assert isinstance(pickled.function, SweepTask) and pickled.args == (first,)

    # two runs finished, one is still in the queue: a second `sweep run` submits the other five
    runs = spec.runs()
    for rs in runs[1:3]:
        (store.run_dir(rs.run_id) / "result.json").write_text(json.dumps(OK_RESULT))
    (fake_slurm / "alive").write_text(f"{queued[runs[3].run_id].lock['job_id']}\n")
    assert run_app(["sweep", "run", str(tmp_path / "sw"), "--executor", "slurm"]) == 0
    again = sorted(fake_slurm.glob("sbatch_*.sh"))[2:]
    arrays = [_sbatch_flags(p.read_text()).get("array") for p in again]
    assert arrays == [None, "0-3%3"]  # a group of one run is a plain job
    assert store.state(runs[3].run_id).lock["job_id"] == queued[runs[3].run_id].lock["job_id"]


def test_slurm_settings_come_from_the_spec_and_bad_ones_name_the_field() -> None:
    from loopscale.errors import ConfigError

    slurm = executor.get("slurm")  # what `sweep run --executor slurm` validates the spec's [slurm] table with
    s = slurm.settings(tiny_spec()["slurm"], "spec.toml")
    assert isinstance(s, SlurmSettings) and s.partition == "gpu" and s.array_parallelism == 3
    with pytest.raises(ConfigError, match=r"spec\.toml: slurm\.gpus_per_node: unknown key"):
        slurm.settings({"gpus_per_node": 2}, "spec.toml")


def test_checkpoint_of_an_array_task_resubmits_the_same_run() -> None:
    task = SweepTask("/sweeps/x", 2)
    again = task.checkpoint("C1e+12_r4_d64_baseline_s0")
    assert isinstance(again, submitit.helpers.DelayedSubmission)
    assert isinstance(again.function, SweepTask) and again.function.sweep_dir == "/sweeps/x"
    assert again.function.max_retries == 2 and again.args == ("C1e+12_r4_d64_baseline_s0",)


def test_preempted_task_checkpoints_is_requeued_and_resumes_to_done(tmp_path: Path) -> None:
    spec = spec_from_dict(tiny_spec(budgets=[8e9], r=[2], widths={"8e9": [16]}))
    store = prepare(spec, tmp_path / "sw")
    rid = spec.runs()[0].run_id
    (rec,) = submit(
        store,
        spec.runs(),
        {rid: 1e9},
        SlurmSettings(max_requeues=3),
        max_retries=0,
        cluster="local",
        parameters={"timeout_min": 10},
    )
    job = rec["jobs"][0]
    run_dir = store.run_dir(rid)
    t0 = time.time()
    while not (run_dir / "metrics.jsonl").exists():  # training has started: preempt it (SLURM's USR2)
        assert job.state == "RUNNING" and time.time() - t0 < 120, job.stderr()
        time.sleep(0.05)
    pid = json.loads((run_dir / "lock.json").read_text())["pid"]
    os.kill(pid, signal.SIGUSR2)
    assert job.result() == "done", job.stderr()
    events = [e["event"] for e in SweepStore(store.root).events() if e["run_id"] == rid]
    assert events == ["start", "interrupted", "start", "done"]
    starts = [e for e in store.events() if e["event"] == "start"]
    assert starts[1]["resume"] is True and starts[0]["pid"] != starts[1]["pid"]
    res = json.loads((run_dir / "result.json").read_text())
    assert res["status"] == "ok" and res["steps"] == spec.runs()[0].config.total_steps()
    assert "Caught signal SIGUSR2" in job.stderr()  # submitit's handler requeued the task after our checkpoint
