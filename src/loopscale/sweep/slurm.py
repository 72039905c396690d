"""The SLURM executor (submitit): job arrays grouped by resources, throttled, requeued on preemption.

Each run becomes one array task that calls :class:`SweepTask` with its run id; the task goes through
``execute_run`` like every other executor (lock, attempts, failure record), so results do not depend
on the executor. A multi-GPU run is one task per rank: ``execute_run`` makes every rank agree on
skip, retry and give-up (rank 0 decides), so the retry loop runs on all ranks in step.

Runs are grouped by (GPUs, time limit, memory, CPUs) — one ``sbatch --array`` per group,
``%array_parallelism`` throttling each.

Resources from the run's size (``[slurm]`` table, see docs/sweep.md): the estimated time is the
run's FLOPs over (FLOP/s per GPU x GPUs); ``gpus_per_run = "auto"`` doubles the GPUs (up to
``max_gpus_per_run``) until that fits in ``target_hours``; the time limit is the estimate x
``time_margin`` plus 10 minutes, rounded up to a ladder of limits and capped at ``max_time_min``
(a longer run is requeued and resumes from its checkpoint).

The FLOP/s per GPU (``run_speeds``) is measured where it can be, since small eager models reach far
less than the assumed ``flops_per_gpu`` and would be requeued again and again:
1. finished runs of this sweep (``result.json``: flops / wall_s / world_size, so the final evaluation
   and start-up count too) on the run's device type, those of the largest FLOPs per token not above
   the run's own (the same shape, else the nearest smaller one: smaller models run slower per FLOP,
   so the limit errs long), the slowest of them;
2. else ``SWEEP_DIR/calibration.json`` (``sweep plan``'s timing, e.g. run on a GPU node) for exactly
   this shape on the run's device type, the slowest machine cached;
3. else the assumed ``flops_per_gpu``.

Preemption and time limits: submitit asks SLURM for ``USR2`` ``signal_delay_s`` seconds before the
limit. The trainer takes USR2 like SIGTERM: it finishes the step (or, in the final evaluation, the
batch), saves ``ckpt.pt`` (already there before the final evaluation) and raises RunInterrupted; the
task then hands over to submitit's handler, which calls ``SweepTask.checkpoint`` (the same run again)
and requeues the array task. A USR2 between runs is turned into a SIGTERM at the next step. A plain
SIGTERM (``scancel``, preemption without USR2) also checkpoints; the next submission resumes it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import submitit
from pydantic import Field, field_validator

from loopscale.config import StrictModel
from loopscale.errors import ConfigError, LoopscaleError
from loopscale.io import append_jsonl
from loopscale.signals import StopSignals
from loopscale.sweep.attempt import execute_run, runnable
from loopscale.sweep.executor import Executor, SubmitFailed, SweepJob
from loopscale.sweep.store import SweepStore

if TYPE_CHECKING:
    from loopscale.sweep.runspec import RunSpec

TIME_LADDER_MIN = (15, 30, 60, 120, 240, 480, 720, 1440, 2880, 4320, 10080)


class SlurmSettings(StrictModel):
    """The spec's ``[slurm]`` table (CLI flags override some)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    job_name: str = "loopscale"
    gpus_per_run: int | Literal["auto"] = Field(1, description="GPUs (DDP ranks) per run; 0 = CPU-only")
    max_gpus_per_run: int = Field(8, gt=0, description="'auto' never asks for more (one node)")
    target_hours: float = Field(12.0, gt=0, description="'auto': fewest GPUs finishing within this")
    flops_per_gpu: float = Field(
        3e14,
        gt=0,
        description="assumed achieved training FLOP/s per GPU (or per run when gpus_per_run = 0) for time limits",
    )
    time_margin: float = Field(1.5, ge=1, description="time limit = estimate x margin + 10 min")
    min_time_min: int = Field(15, gt=0)
    max_time_min: int = Field(1440, gt=0, description="cluster limit; longer runs are requeued and resume")
    cpus_per_gpu: int = Field(8, gt=0)
    cpus_per_run: int = Field(8, gt=0, description="CPUs when gpus_per_run = 0")
    mem_gb_per_gpu: float = Field(64.0, gt=0)
    mem_gb_per_run: float = Field(32.0, gt=0, description="memory when gpus_per_run = 0")
    array_parallelism: int = Field(64, gt=0, description="tasks of one array running at once (%N)")
    max_requeues: int = Field(20, ge=0, description="requeues after time limits / preemption per task")
    signal_delay_s: int = Field(120, gt=0, description="USR2 this long before the time limit")
    setup: list[str] = Field(default_factory=list, description="shell lines before the run, e.g. module load")
    additional: dict[str, Any] = Field(default_factory=dict, description="extra #SBATCH flags")

    @field_validator("partition", "account", "qos", "constraint", "job_name")
    @classmethod
    def _one_line(cls, v: str | None) -> str | None:
        """Each becomes one ``#SBATCH`` line: a newline would start another line of the job script."""
        if v is not None and _breaks_line(v):
            raise ValueError("must be one line (no newline or other control character): it becomes an #SBATCH line")
        return v

    @field_validator("additional")
    @classmethod
    def _one_line_flags(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, val in v.items():
            if any(_breaks_line(text) for text in (key, *_strings(val))):
                raise ValueError(
                    f"{key!r} must be one line (no newline or other control character): it becomes an #SBATCH line"
                )
        return v


def _breaks_line(text: str) -> bool:
    """A control character (newline, carriage return, ...) other than a tab."""
    return any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text)


def _strings(value: Any) -> list[str]:
    """Every string in a value (lists and tables included)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_strings(k), *_strings(v))]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _strings(v)]
    return []


def resources(flops: float, s: SlurmSettings, flops_per_s: float | None = None) -> dict[str, Any]:
    """GPUs, time limit (minutes), memory and CPUs of one run from its planned FLOPs.

    ``flops_per_s``: the run's measured FLOP/s per GPU (``run_speeds``), else ``s.flops_per_gpu`` is assumed.
    """
    fps = flops_per_s or s.flops_per_gpu
    if s.gpus_per_run == "auto":
        gpus = 1
        while flops / (fps * gpus) > 3600 * s.target_hours and gpus * 2 <= s.max_gpus_per_run:
            gpus *= 2
    else:
        gpus = int(s.gpus_per_run)
    est_min = flops / (fps * max(gpus, 1)) / 60
    want = est_min * s.time_margin + 10
    ladder = [t for t in TIME_LADDER_MIN if t >= s.min_time_min] or [s.min_time_min]
    time_min = next((t for t in ladder if t >= want), ladder[-1])
    time_min = max(s.min_time_min, min(time_min, s.max_time_min))
    mem = s.mem_gb_per_gpu * gpus if gpus else s.mem_gb_per_run
    cpus = s.cpus_per_gpu if gpus else s.cpus_per_run
    return {
        "gpus": gpus,
        "time_min": int(time_min),
        "mem_gb": float(mem),
        "cpus_per_task": int(cpus),
        "est_min": est_min,
    }


def run_speeds(store: SweepStore, runs: list[RunSpec], s: SlurmSettings) -> dict[str, tuple[float, str]]:
    """Each run's FLOP/s per GPU for its time limit, and where it comes from ("finished" or "calibration").

    Runs with neither are left out: they get the assumed ``flops_per_gpu``. The rule is the module docstring's.
    """
    from loopscale import accounting
    from loopscale.sweep.calibrate import Calibration, shape_key

    finished: list[tuple[str, float, float]] = []  # (device type, FLOPs per token, FLOP/s per GPU)
    for path in sorted(store.runs_dir.glob("*/result.json")) if store.runs_dir.is_dir() else []:
        try:
            res = json.loads(path.read_text(encoding="utf-8"))
            fpt, fps = float(res["flops_per_token"]), float(res["flops"]) / float(res["wall_s"])
            fps /= max(1, int(res.get("world_size") or 1))
            device = str((res.get("hardware") or {}).get("device", "cpu")).split(":")[0]
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
        if res.get("status") == "ok" and fps > 0 and math.isfinite(fps):
            finished.append((device, fpt, fps))
    cal = Calibration(store.root / "calibration.json")
    out: dict[str, tuple[float, str]] = {}
    for rs in runs:
        cfg = rs.config
        device = "cpu" if s.gpus_per_run == 0 or cfg.run.device == "cpu" else "cuda"
        f = accounting.train_flops_per_token(cfg.model)
        below = [(fpt, fps) for dev, fpt, fps in finished if dev == device and fpt <= f * (1 + 1e-9)]
        if below:
            nearest = max(fpt for fpt, _ in below)
            out[rs.run_id] = (min(fps for fpt, fps in below if fpt == nearest), "finished")
            continue
        measured = cal.measured_flops_per_s(shape_key(cfg, device))
        if measured is not None:
            out[rs.run_id] = (measured, "calibration")
    return out


class SweepTask(submitit.helpers.Checkpointable):
    """One array task: ``SweepTask(sweep_dir, max_retries)(run_id)`` trains that run of the sweep."""

    def __init__(self, sweep_dir: str, max_retries: int) -> None:
        self.sweep_dir = str(sweep_dir)
        self.max_retries = int(max_retries)

    def checkpoint(self, run_id: str) -> submitit.helpers.DelayedSubmission:  # type: ignore[override]
        """Requeue the same run: the trainer resumes it from ckpt.pt."""
        return submitit.helpers.DelayedSubmission(SweepTask(self.sweep_dir, self.max_retries), run_id)

    def __call__(self, run_id: str) -> str:
        """Train the run, retrying in this process while ``execute_run`` says ``retry``.

        Every rank runs this loop; ``execute_run`` returns the same outcome on each (rank 0 decides and
        tells the others), so the ranks retry together, each attempt in a fresh process group. An
        attempt the ranks could not end together returns ``failed`` and ends the task (see
        ``execute._execute_ranks``); the run stays retryable for the next submission.
        """
        from loopscale.train import RunInterrupted

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # one rank per task: torch.distributed through env://
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
            os.environ.setdefault("LOCAL_WORLD_SIZE", str(env.num_tasks // max(env.num_nodes, 1)))
        store = SweepStore(self.sweep_dir)
        usr = env._usr_sig()
        requeue = signal.getsignal(usr)  # submitit's checkpoint-and-requeue handler, back after the run
        sent = False

        def on_step(step: int, total: int) -> None:
            nonlocal sent
            if warning.caught is not None and not sent:
                sent = True
                os.kill(os.getpid(), signal.SIGTERM)  # the trainer checkpoints after this step

        with StopSignals((usr,)) as warning:  # a USR2 between runs (the trainer takes it itself inside one)
            try:
                while True:
                    outcome = execute_run(
                        store,
                        run_id,
                        max_retries=self.max_retries,
                        on_step=on_step,
                        executor="slurm",
                        job_id=str(env.job_id),
                    )
                    if outcome != "retry":
                        return outcome
            except RunInterrupted as exc:
                warned = warning.caught is not None or exc.signum == usr
                if warned and callable(requeue) and env.global_rank == 0:
                    requeue(usr, None)  # calls self.checkpoint(run_id), requeues this task, exits
                raise


def _alive_jobs(job_ids: list[str]) -> set[str] | None:
    """Job ids (array tasks as 123_4) that squeue still lists; None when squeue is not available."""
    if not job_ids:
        return set()
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(
            ["squeue", "--noheader", "--array", "--format=%i", f"--jobs={','.join(job_ids)}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def make_executor(folder: Path, cluster: str, s: SlurmSettings) -> Any:
    if cluster == "slurm":
        if shutil.which("sbatch") is None:
            raise ConfigError(
                "--executor", "slurm: no `sbatch` on PATH (run this on the cluster's login node)", value="slurm"
            )
        return submitit.SlurmExecutor(folder=folder, max_num_timeout=s.max_requeues)
    if cluster == "local":
        return submitit.LocalExecutor(folder=folder, max_num_timeout=s.max_requeues)
    if cluster == "debug":
        return submitit.DebugExecutor(folder=folder)
    raise ConfigError("cluster", "expected slurm, local or debug", value=cluster)


def _parameters(cluster: str, res: dict[str, Any], s: SlurmSettings) -> dict[str, Any]:
    gpus = res["gpus"]
    if cluster == "slurm":
        p: dict[str, Any] = {
            "job_name": s.job_name,
            "time": res["time_min"],
            "nodes": 1,
            "ntasks_per_node": max(gpus, 1),
            "cpus_per_task": res["cpus_per_task"],
            "mem": f"{math.ceil(res['mem_gb'])}GB",
            "array_parallelism": s.array_parallelism,
            "signal_delay_s": s.signal_delay_s,
            "setup": list(s.setup),
        }
        if gpus:
            p["gpus_per_node"] = gpus
        for k in ("partition", "account", "qos", "constraint"):
            if getattr(s, k):
                p[k] = getattr(s, k)
        if s.additional:
            p["additional_parameters"] = dict(s.additional)
        return p
    if cluster == "local":
        return {
            "timeout_min": res["time_min"],
            "gpus_per_node": gpus,
            "tasks_per_node": max(gpus, 1),
            "signal_delay_s": s.signal_delay_s,
        }
    return {}


def submit(
    store: SweepStore,
    runs: list[RunSpec],
    flops: dict[str, float],
    s: SlurmSettings,
    *,
    max_retries: int,
    cluster: str = "slurm",
    resubmit_queued: bool = False,
    parameters: dict[str, Any] | None = None,
    log: Any = None,
) -> list[dict[str, Any]]:
    """Submit every runnable run as array tasks grouped by resources. Returns one record per array.

    Runs already finished, running, failed for good, or queued in a job that squeue still lists are
    skipped (``resubmit_queued`` submits queued runs again when squeue cannot be asked).
    ``parameters`` overrides executor parameters (tests: a short local timeout).
    """
    queued = {rs.run_id: store.state(rs.run_id) for rs in runs}
    queued_ids = {rid: str((st.lock or {}).get("job_id")) for rid, st in queued.items() if st.status == "queued"}
    alive = _alive_jobs(sorted(set(queued_ids.values())))
    todo: list[RunSpec] = []
    for rs in runs:
        ok, _why = runnable(store, rs.run_id, max_retries)
        if not ok:
            continue
        if rs.run_id in queued_ids:
            jid = queued_ids[rs.run_id]
            if alive is None and not resubmit_queued:
                if log:
                    log(
                        f"{rs.run_id}: queued as job {jid}; squeue unavailable, not resubmitted "
                        "(--resubmit-queued to force)"
                    )
                continue
            if alive is not None and jid in alive:
                continue
        todo.append(rs)
    groups: dict[tuple, list[RunSpec]] = {}
    res_of: dict[str, dict[str, Any]] = {}
    speeds = run_speeds(store, todo, s)
    if log and todo:
        sources = [speeds[rs.run_id][1] if rs.run_id in speeds else "assumed" for rs in todo]
        counts = ", ".join(
            f"{sources.count(k)} {k}" for k in ("finished", "calibration", "assumed") if sources.count(k)
        )
        log(
            f"time limits from FLOP/s per GPU measured by finished runs / the calibration, else assumed "
            f"({s.flops_per_gpu:.3g}): {counts}"
        )
    for rs in todo:
        res = resources(flops[rs.run_id], s, speeds.get(rs.run_id, (None, ""))[0])
        res_of[rs.run_id] = res
        key = (res["gpus"], res["time_min"], res["mem_gb"], res["cpus_per_task"])
        groups.setdefault(key, []).append(rs)
    records = []
    folder = store.root / "slurm" / "%j"
    for key, members in sorted(groups.items()):
        ex = make_executor(folder, cluster, s)
        params = {**_parameters(cluster, res_of[members[0].run_id], s), **(parameters or {})}
        if params:
            ex.update_parameters(**params)
        task = SweepTask(str(store.root), max_retries)
        ids = [rs.run_id for rs in members]
        jobs = ex.map_array(task, ids)
        for rid, job in zip(ids, jobs, strict=True):
            store.mark_queued(rid, str(job.job_id))
        rec = {
            "cluster": cluster,
            "gpus": key[0],
            "time_min": key[1],
            "mem_gb": key[2],
            "cpus_per_task": key[3],
            "runs": ids,
            "job_ids": [str(j.job_id) for j in jobs],
            "jobs": jobs,
        }
        (store.root / "slurm").mkdir(parents=True, exist_ok=True)
        append_jsonl(store.root / "slurm" / "submissions.jsonl", {k: v for k, v in rec.items() if k != "jobs"})
        records.append(rec)
        if log:
            log(
                f"submitted {len(ids)} run(s) as array {str(jobs[0].job_id).split('_')[0]}: {key[0]} GPU(s), "
                f"{key[1]} min, {key[2]:g} GB"
            )
    return records


class SlurmExecutor(Executor):
    """``--executor slurm``: job arrays through submitit (``submit``); the spec's ``[slurm]`` table.

    Flags: ``cluster`` (submitit's backend: slurm, or local and debug for tests) and ``resubmit_queued``.
    """

    name = "slurm"
    Settings = SlurmSettings

    def launch(self, job: SweepJob) -> None:
        """Submit the runnable runs (a refusal is one line: SubmitFailed); with ``cluster = "debug"`` wait."""
        s: SlurmSettings = self.settings(job.table, job.source)
        cluster = job.option("cluster", "slurm")
        try:
            recs = submit(
                job.store,
                job.runs,
                job.flops,
                s,
                max_retries=job.max_retries,
                cluster=cluster,
                resubmit_queued=bool(job.option("resubmit_queued")),
                log=lambda m: job.console.print(m, highlight=False),
            )
        except LoopscaleError:
            raise
        except Exception as exc:  # sbatch refused, submitit failed: one line, the runs stay unsubmitted
            raise SubmitFailed(
                f"slurm: submission failed ({type(exc).__name__}: {_first_lines(exc)}); runs "
                f"submitted before it are queued; fix the cause and rerun to submit the rest"
            ) from None
        if not recs:
            job.console.print("nothing to submit: every run is finished, running or queued", highlight=False)
        if cluster == "debug":  # runs in this process, one after another
            for rec in recs:
                for j in rec["jobs"]:
                    j.result()
        job.console.print(f"follow with: loopscale sweep status {job.store.root}", highlight=False)

    def plan_note(self, settings: Any, total_flops: float) -> str | None:
        """The sweep's GPU-hours at the assumed FLOP/s per GPU."""
        return (
            f"[bold]SLURM:[/] ~{total_flops / settings.flops_per_gpu / 3600:.0f} GPU-hours at "
            f"{settings.flops_per_gpu:.3g} FLOP/s per GPU (\\[slurm] flops_per_gpu)"
        )


def _first_lines(exc: Exception, limit: int = 300) -> str:
    """An exception's message (sbatch's stderr included) on one line, cut to ``limit`` characters."""
    text = " ".join(str(exc).split()) or "no message"
    return text if len(text) <= limit else text[: limit - 3] + "..."
