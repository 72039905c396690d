"""The local executor: runs one after another in this process (CPU), or one subprocess per GPU slot.

* default on CPU (or one GPU): in-process, sequential; torch is imported once, every run goes through
  ``execute_run`` (lock, attempts, failure records), and a failure never stops the rest;
* ``isolate``: each run in its own ``python -m loopscale sweep run-one DIR RUN_ID`` subprocess
  (a crash or leak cannot touch the sweep process; its output goes to ``runs/<id>/worker.log``);
  on Linux a worker gets SIGTERM when the sweep process dies, however it dies (``tethered``);
* several GPUs: one subprocess per GPU (``CUDA_VISIBLE_DEVICES``), or with ``nproc_per_run = k``
  one ``torchrun --nproc-per-node k`` per group of k GPUs (DDP inside the run); each worker gets its
  slot's share of the cores (``slot_threads``).

Failed runs with retries left go to the back of the queue. SIGTERM/SIGINT stop the sweep: the
running runs checkpoint (the trainer's signal path) and a rerun resumes them.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field
from rich.console import Console

from loopscale.config import StrictModel
from loopscale.sweep.execute import execute_run, runnable, tidy_finished_run
from loopscale.sweep.progress import SweepProgress
from loopscale.sweep.spec import RunSpec
from loopscale.sweep.store import SweepStore, _last_step


class LocalSettings(StrictModel):
    """The spec's ``[local]`` table (the CLI flags override it)."""

    isolate: bool = Field(False, description="each run in its own subprocess")
    gpus: list[int] | None = Field(None, description="GPU ids for parallel slots, positions in CUDA_VISIBLE_DEVICES "
                                   "when it is set (default: all visible)")
    nproc_per_run: int = Field(1, gt=0, description="torchrun processes (GPUs) per run")


@dataclass
class Summary:
    outcomes: dict[str, list[str]] = field(default_factory=dict)  # outcome -> run ids
    wall_s: float = 0.0

    def add(self, outcome: str, run_id: str) -> None:
        self.outcomes.setdefault(outcome, []).append(run_id)

    def count(self, outcome: str) -> int:
        return len(self.outcomes.get(outcome, []))


def visible_devices(text: str) -> list[str]:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value, as CUDA reads it: indices or ``GPU-``/``MIG-`` UUIDs,
    up to the first invalid entry (CUDA ignores it and everything after it, so "-1" hides every GPU)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not (item.isdigit() or item.startswith(("GPU-", "MIG-"))):
            break
        out.append(item)
    return out


def gpu_slots(gpus: list[int] | None, nproc_per_run: int) -> list[dict[str, str]]:
    """Environment of each parallel slot: CUDA_VISIBLE_DEVICES groups of ``nproc_per_run`` GPUs.

    Under a parent ``CUDA_VISIBLE_DEVICES`` (a SLURM allocation, a shared node) ``gpus`` are positions in
    that list, as torch's ``cuda:N`` are, so a slot never reaches a GPU the parent cannot see; its entries,
    UUIDs included, are passed on unchanged. Without it, ``gpus`` are the physical ids.
    """
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent is not None:
        visible = visible_devices(parent)
        if gpus is None:
            devices = visible
        else:
            bad = [g for g in gpus if not 0 <= g < len(visible)]
            if bad:
                from loopscale.errors import ConfigError

                raise ConfigError("--gpus", f"ids are positions in CUDA_VISIBLE_DEVICES={parent} ({len(visible)} "
                                  f"visible GPU(s)); {bad[0]} is not one", value=",".join(map(str, gpus)))
            devices = [visible[g] for g in gpus]
    elif gpus is not None:
        devices = [str(g) for g in gpus]
    else:
        import torch

        devices = [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    k = max(1, nproc_per_run)
    groups = [devices[i : i + k] for i in range(0, len(devices) - k + 1, k)]
    return [{"CUDA_VISIBLE_DEVICES": ",".join(grp)} for grp in groups]


def slot_threads(n_slots: int, nproc_per_run: int) -> dict[str, str]:
    """The thread settings of each of ``n_slots`` workers: the slot's share of this machine's cores.

    Every worker would otherwise take all the cores (8 slots on 8 GPUs: 8x oversubscribed). The trainer reads
    ``LOOPSCALE_SLOT_CORES`` (``hardware.setup_threads``; an explicit ``run.threads`` still wins) and divides
    it among a torchrun's ranks; ``OMP_NUM_THREADS`` sizes each process's other OpenMP pools the same way.
    """
    from loopscale.train.hardware import SLOT_CORES_ENV, available_cores

    cores = max(1, available_cores() // max(1, n_slots))
    return {SLOT_CORES_ENV: str(cores), "OMP_NUM_THREADS": str(max(1, cores // max(1, nproc_per_run)))}


def _message(store: SweepStore, run_id: str, outcome: str) -> str:
    st = store.state(run_id)
    res = st.result or {}
    if outcome == "done":
        return f"{run_id}: done, val loss {res.get('val_loss', float('nan')):.4f} ({res.get('wall_s', 0):.1f} s)"
    if outcome in ("failed", "gave-up", "retry", "diverged"):
        err = res.get("error") or (st.attempts.get("errors") or ["?"])[-1]
        what = {"retry": "failed (will retry)", "gave-up": "failed"}.get(outcome, outcome)
        return f"{run_id}: {what}: {str(err).splitlines()[0][:200]}"
    return f"{run_id}: {outcome}"


class _StopOnSignal:
    """Between runs, SIGTERM/SIGINT stop the sweep (inside a run the trainer checkpoints first)."""

    def __init__(self, on_signal: Any = None) -> None:
        self.caught: int | None = None
        self.on_signal = on_signal
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.caught is None
        self.caught = signum
        if self.on_signal is not None:
            self.on_signal(signum, first)
        else:
            from loopscale.train import RunInterrupted

            raise RunInterrupted(f"sweep stopped by signal {signum}; rerun the same command to resume", signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run_local(store: SweepStore, runs: list[RunSpec], flops: dict[str, float], *, max_retries: int,
              console: Console, isolate: bool = False, gpus: list[int] | None = None, nproc_per_run: int = 1,
              progress: bool = True) -> Summary:
    """Run every runnable run of ``runs``; returns what happened to each."""
    slots = gpu_slots(gpus, nproc_per_run) if (gpus is None or gpus) else []
    if gpus is None and len(slots) == 1 and nproc_per_run == 1 and not isolate:
        slots = []  # the only GPU (or none): in this process
    if not slots and (isolate or nproc_per_run > 1):
        slots = [{}]  # a subprocess (torchrun on CPU with nproc_per_run > 1)
    threads = slot_threads(len(slots), nproc_per_run)
    slots = [{**threads, **env} for env in slots]
    summary = Summary()
    t0 = time.time()
    states = {rs.run_id: store.state(rs.run_id) for rs in runs}
    finished = {rid for rid, st in states.items() if st.status in ("done", "diverged")
                or (st.status == "failed" and (not st.retryable or st.failures > max_retries))}
    for rid in finished:
        summary.add("skipped", rid)
        if states[rid].status in ("done", "diverged"):
            tidy_finished_run(store, rid)
    queue = collections.deque(rs.run_id for rs in runs if rs.run_id not in finished)
    steps = {rs.run_id: rs.config.total_steps() for rs in runs}
    prog = SweepProgress(console, total_runs=len(runs), total_flops=sum(flops.values()), done_runs=len(finished),
                         done_flops=sum(flops[r] for r in finished), enabled=progress)
    with prog:
        if slots:
            _run_subprocesses(store, queue, slots, summary, prog, flops, steps, max_retries, nproc_per_run)
        else:
            _run_in_process(store, queue, summary, prog, flops, steps, max_retries)
    summary.wall_s = time.time() - t0
    return summary


def _run_in_process(store: SweepStore, queue: collections.deque, summary: Summary, prog: SweepProgress,
                    flops: dict[str, float], steps: dict[str, int], max_retries: int) -> None:
    with _StopOnSignal():
        while queue:
            rid = queue.popleft()
            ok, why = runnable(store, rid, max_retries)
            if not ok:
                summary.add("busy" if why == "running elsewhere" else "skipped", rid)
                continue
            prog.start_run(rid, flops[rid], steps[rid], store.state(rid).step or 0)
            outcome = "interrupted"
            try:
                outcome = execute_run(store, rid, max_retries=max_retries,
                                      on_step=lambda s, t, rid=rid: prog.step(rid, s, t))
            finally:
                prog.end_run(rid, outcome, _message(store, rid, outcome))
            if outcome == "retry":
                queue.append(rid)
            else:
                summary.add(outcome, rid)


def _worker_cmd(store: SweepStore, run_id: str, max_retries: int, nproc: int) -> list[str]:
    tail = ["-m", "loopscale", "sweep", "run-one", str(store.root), run_id, "--max-retries", str(max_retries)]
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *tail]
    return [sys.executable, *tail]


#: Run argv[2:] so that the kernel sends it SIGTERM when the process argv[1] (the sweep) dies: a killed
#: sweep (even SIGKILL) must not leave a worker training a run that a rerun then reports as busy.
#: PR_SET_PDEATHSIG (1) survives exec; a torchrun agent forwards the SIGTERM to its ranks; the trainer
#: takes it as it takes any SIGTERM (checkpoint, then exit), so a rerun resumes the run.
_TETHER = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit(128 + signal.SIGTERM)
os.execv(sys.argv[2], sys.argv[2:])
"""


def tethered(cmd: list[str], parent: int | None = None) -> list[str]:
    """``cmd`` made to end with the process ``parent`` (default: this one); Linux only, else ``cmd``.

    Through a tiny launcher that execs ``cmd`` rather than a ``preexec_fn``: nothing runs in the forked
    child of a multi-threaded sweep process (the progress bars' thread) before exec.
    """
    if not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-c", _TETHER, str(os.getpid() if parent is None else parent), *cmd]


def busy_message(store: SweepStore, run_ids: list[str]) -> str:
    """One line naming runs another live process holds (host and pid of each lock)."""
    held = []
    for rid in run_ids:
        lock = store.state(rid).lock or {}
        held.append(f"{rid} ({lock.get('host', '?')} pid {lock.get('pid', '?')})" if lock else rid)
    more = ", ..." if len(held) > 3 else ""
    return (f"{len(run_ids)} run(s) busy in another live process, not run here: {', '.join(held[:3])}{more}; "
            f"rerun when it ends (`loopscale sweep status {store.root}`)")


def _run_subprocesses(store: SweepStore, queue: collections.deque, slots: list[dict[str, str]], summary: Summary,
                      prog: SweepProgress, flops: dict[str, float], steps: dict[str, int], max_retries: int,
                      nproc: int) -> None:
    active: dict[int, tuple[subprocess.Popen, str, Any]] = {}

    def forward(signum: int, first: bool) -> None:
        for proc, _rid, _log in active.values():
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM if first else signal.SIGKILL)

    with _StopOnSignal(forward) as stop:
        while (queue and stop.caught is None) or active:
            for i, env in enumerate(slots):
                if i in active or not queue or stop.caught is not None:
                    continue
                rid = queue.popleft()
                ok, why = runnable(store, rid, max_retries)
                if not ok:
                    summary.add("busy" if why == "running elsewhere" else "skipped", rid)
                    continue
                store.run_dir(rid).mkdir(parents=True, exist_ok=True)
                log = open(store.run_dir(rid) / "worker.log", "ab")  # noqa: SIM115  (closed when the worker ends)
                cmd = tethered(_worker_cmd(store, rid, max_retries, nproc))
                proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
                active[i] = (proc, rid, log)
                prog.start_run(rid, flops[rid], steps[rid], store.state(rid).step or 0)
            for i, (proc, rid, log) in list(active.items()):
                step = _last_step(store.run_dir(rid))
                if step is not None:
                    prog.step(rid, step, steps[rid])
                code = proc.poll()
                if code is None:
                    continue
                log.close()
                del active[i]
                outcome = _outcome_after_worker(store, rid, code, max_retries, interrupted=stop.caught is not None)
                prog.end_run(rid, outcome, _message(store, rid, outcome))
                if outcome == "retry":
                    queue.append(rid)
                else:
                    summary.add(outcome, rid)
            time.sleep(0.2)
    if stop.caught is not None:
        from loopscale.train import RunInterrupted

        raise RunInterrupted("sweep stopped by signal; the running runs saved checkpoints; rerun to resume",
                             stop.caught)


def _outcome_after_worker(store: SweepStore, run_id: str, code: int, max_retries: int, *, interrupted: bool) -> str:
    """What a finished worker did, read from the run dir; a crash it could not record is recorded here."""
    st = store.state(run_id)
    if st.status == "done":
        return "done"
    if st.status == "diverged":
        return "diverged"
    if interrupted:
        return "interrupted"
    if st.status == "failed":
        return "retry" if st.retryable and st.failures <= max_retries else "failed"
    if st.status == "running":
        return "busy"
    # the worker died without a record (killed, out of memory, segfault): count it as a failure
    from loopscale.sweep.execute import _record_failure

    tail = ""
    log = store.run_dir(run_id) / "worker.log"
    if log.exists():
        tail = log.read_bytes()[-2000:].decode("utf-8", "replace")
    att = store.attempts(run_id)
    _record_failure(store, store.load_run(run_id), att, f"worker exited with status {code} without a result",
                    tail, retryable=True, wall_s=0.0)
    return "retry" if att["failures"] <= max_retries else "failed"
