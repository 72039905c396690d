"""The local executor: runs one after another in this process, or one subprocess per parallel slot.

* CPU slots (CPU runs, the default): as many runs at once as the cores allow, ``cores // run.threads``
  (``cpu_slots``; ``--slots`` / ``[local] slots`` set it), each in its own worker subprocess with
  ``cores // slots`` cores; results are bitwise those of a serial sweep (same threads per run);
* one slot (one GPU, a single core, runs without ``run.threads``, or ``--slots 1``): in-process,
  sequential; torch is imported once, every run goes through ``execute_run`` (lock, attempts, failure
  records), and a failure never stops the rest;
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field
from rich.console import Console

from loopscale.config import StrictModel
from loopscale.signals import STOP, StopSignals
from loopscale.sweep.attempt import execute_pack, runnable, tidy_finished_run
from loopscale.sweep.executor import Executor, SweepBusy, SweepIncomplete, SweepJob
from loopscale.sweep.packs import PackMode, make_packs, parse_pack
from loopscale.sweep.progress import SweepProgress, duration
from loopscale.sweep.store import SweepStore, last_step

if TYPE_CHECKING:
    from loopscale.sweep.runspec import RunSpec


class LocalSettings(StrictModel):
    """The spec's ``[local]`` table (the CLI flags override it)."""

    isolate: bool = Field(False, description="each run in its own subprocess")
    gpus: list[int] | None = Field(
        None,
        description="GPU ids for parallel slots, positions in CUDA_VISIBLE_DEVICES "
        "when it is set (default: all visible)",
    )
    nproc_per_run: int = Field(1, gt=0, description="torchrun processes (GPUs) per run")
    slots: int | None = Field(
        None,
        gt=0,
        description="CPU runs trained at once (default: cores // run.threads; 1 when the runs do not set run.threads)",
    )
    pack: int | str = Field(
        "auto",
        description="runs of the same shape trained as one pack in one slot: auto, off or the most per pack "
        "(docs/sweep.md, Packs)",
    )


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

                raise ConfigError(
                    "--gpus",
                    f"ids are positions in CUDA_VISIBLE_DEVICES={parent} ({len(visible)} "
                    f"visible GPU(s)); {bad[0]} is not one",
                    value=",".join(map(str, gpus)),
                )
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
    from loopscale.cores import SLOT_CORES_ENV, available_cores

    cores = max(1, available_cores() // max(1, n_slots))
    return {SLOT_CORES_ENV: str(cores), "OMP_NUM_THREADS": str(max(1, cores // max(1, nproc_per_run)))}


def cpu_slots(runs: list[RunSpec], requested: int | None = None) -> int:
    """How many CPU runs train at once: ``requested``, else as many as the cores hold at ``run.threads`` each.

    Runs without ``run.threads`` take every core (one slot): splitting them would change their thread
    count, and with it the bits of their results; ``--slots N`` gives them ``cores // N`` each instead.
    Runs on CUDA never get CPU slots (``--gpus`` makes their slots).
    """
    from loopscale.cores import available_cores, uses_cuda

    if not runs or any(uses_cuda(rs.config.run.device) for rs in runs):
        return 1
    if requested is not None:
        return max(1, requested)
    threads = {rs.config.run.threads for rs in runs}
    if None in threads:
        return 1
    return max(1, available_cores() // max(t for t in threads if t is not None))


def slot_envs(
    runs: list[RunSpec],
    *,
    isolate: bool = False,
    gpus: list[int] | None = None,
    nproc_per_run: int = 1,
    slots: int | None = None,
) -> tuple[list[dict[str, str]], bool]:
    """The environment of each parallel worker slot (empty: one run at a time in this process), and whether
    they are CPU slots (long-lived workers, ``slot_worker``) rather than a process per run (``isolate``)."""
    envs = gpu_slots(gpus, nproc_per_run) if (gpus is None or gpus) else []
    if gpus is None and len(envs) == 1 and nproc_per_run == 1 and not isolate:
        envs = []  # the only GPU (or none): in this process
    n_cpu = cpu_slots(runs, slots) if not envs and nproc_per_run == 1 else 1
    if n_cpu > 1:
        envs = [{} for _ in range(n_cpu)]
    if not envs and (isolate or nproc_per_run > 1):
        envs = [{}]  # a subprocess (torchrun on CPU with nproc_per_run > 1)
    threads = slot_threads(len(envs), nproc_per_run)
    return [{**threads, **env} for env in envs], n_cpu > 1 and not isolate


def _slots_note(runs: list[RunSpec], envs: list[dict[str, str]]) -> str | None:
    """One line on the parallel slots (None for a serial sweep), warning when they oversubscribe the cores."""
    from loopscale.cores import SLOT_CORES_ENV, available_cores

    if len(envs) < 2:
        return None
    share = int(envs[0][SLOT_CORES_ENV])
    threads = max((rs.config.run.threads or share for rs in runs), default=share)
    cores = available_cores()
    note = f"{len(envs)} parallel slots, {threads} thread(s) per run, {cores} cores"
    if threads * len(envs) > cores:
        note += f" - oversubscribed ({threads * len(envs)} threads): runs slow each other down"
    return note


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


def _stop_between_runs(signum: int, first: bool) -> None:
    """In-process sweep: a signal between runs stops the sweep (inside a run the trainer checkpoints first)."""
    from loopscale.train import RunInterrupted

    raise RunInterrupted(f"sweep stopped by signal {signum}; rerun the same command to resume", signum)


class LocalExecutor(Executor):
    """``--executor local``: this machine's CPU slots or GPUs (``run_local``); the spec's ``[local]`` table."""

    name = "local"
    Settings = LocalSettings

    def launch(self, job: SweepJob) -> None:
        """Train the runs here; one line of outcomes, then SweepIncomplete (failed runs) or SweepBusy."""
        local: LocalSettings = self.settings(job.table, job.source)
        store = job.store
        summary = run_local(
            store,
            job.runs,
            job.flops,
            max_retries=job.max_retries,
            console=job.console,
            isolate=bool(job.option("isolate")) or local.isolate,
            gpus=job.option("gpus", local.gpus),
            nproc_per_run=job.option("nproc_per_run") or local.nproc_per_run,
            progress=job.progress,
            slots=job.option("slots") or local.slots,
            pack=parse_pack(job.option("pack") or local.pack, "--pack" if job.option("pack") else "[local] pack"),
        )
        counts = ", ".join(f"{len(v)} {k}" for k, v in summary.outcomes.items())
        job.console.print(
            f"sweep {job.name}: {counts or 'nothing to do'} in {duration(summary.wall_s)}; "
            f"`loopscale sweep collect {store.root}` writes the runs table",
            highlight=False,
        )
        failed = summary.outcomes.get("failed", []) + summary.outcomes.get("gave-up", [])
        failed += [rid for rid in summary.outcomes.get("skipped", []) if store.state(rid).status == "failed"]
        busy = summary.outcomes.get("busy", [])
        if busy and failed:
            job.console.print(busy_message(store, busy), highlight=False, markup=False)
        if failed:
            more = ", ..." if len(failed) > 3 else ""
            raise SweepIncomplete(
                f"{len(failed)} run(s) failed ({', '.join(failed[:3])}{more}); errors in "
                f"`loopscale sweep status {store.root}`; `--retry-failed` runs them again"
            )
        if busy:
            raise SweepBusy(busy_message(store, busy))


def run_local(
    store: SweepStore,
    runs: list[RunSpec],
    flops: dict[str, float],
    *,
    max_retries: int,
    console: Console,
    isolate: bool = False,
    gpus: list[int] | None = None,
    nproc_per_run: int = 1,
    progress: bool = True,
    slots: int | None = None,
    pack: PackMode = "auto",
) -> Summary:
    """Run every runnable run of ``runs``; returns what happened to each.

    ``slots``: CPU runs trained at once (None: ``cpu_slots``' default, as many as the cores hold); each slot
    trains one pack at a time (``sweep.packs.make_packs``: runs of the same shape as one model, ``pack``:
    auto, off or the most per pack; never with several processes per run). A pack holds its slot's threads.
    """
    envs, cpu = slot_envs(runs, isolate=isolate, gpus=gpus, nproc_per_run=nproc_per_run, slots=slots)
    note = _slots_note(runs, envs)
    if note:
        console.print(note, highlight=False, markup=False)
    summary = Summary()
    t0 = time.time()
    states = {rs.run_id: store.state(rs.run_id) for rs in runs}
    finished = {
        rid
        for rid, st in states.items()
        if st.status in ("done", "diverged")
        or (st.status == "failed" and (not st.retryable or st.failures > max_retries))
    }
    for rid in finished:
        summary.add("skipped", rid)
        if states[rid].status in ("done", "diverged"):
            tidy_finished_run(store, rid, states[rid])
    todo = [rs for rs in runs if rs.run_id not in finished]
    packs = make_packs(todo, "off" if nproc_per_run > 1 else pack)
    queue: collections.deque[list[str]] = collections.deque([rs.run_id for rs in p] for p in packs)
    if any(len(p) > 1 for p in packs):
        big = max(len(p) for p in packs)
        console.print(
            f"{len(todo)} runs as {len(packs)} packs (up to {big} runs of one shape trained as one model; --pack off: "
            "one at a time)",
            highlight=False,
            markup=False,
        )
    steps = {rs.run_id: rs.config.total_steps() for rs in runs}
    prog = SweepProgress(
        console,
        total_runs=len(runs),
        total_flops=sum(flops.values()),
        done_runs=len(finished),
        done_flops=sum(flops[r] for r in finished),
        enabled=progress,
    )
    with prog:
        if cpu:
            _run_slot_workers(store, queue, envs, summary, prog, flops, steps, max_retries)
        elif envs:
            _run_subprocesses(store, queue, envs, summary, prog, flops, steps, max_retries, nproc_per_run)
        else:
            _run_in_process(store, queue, summary, prog, flops, steps, max_retries)
    summary.wall_s = time.time() - t0
    return summary


def _run_in_process(
    store: SweepStore,
    queue: collections.deque,
    summary: Summary,
    prog: SweepProgress,
    flops: dict[str, float],
    steps: dict[str, int],
    max_retries: int,
) -> None:
    with StopSignals(STOP, _stop_between_runs):
        while queue:
            ids = _next_runnable(store, queue, max_retries, summary)
            if not ids:
                continue
            for rid in ids:
                prog.start_run(rid, flops[rid], steps[rid], store.state(rid).step or 0)
            outcomes: dict[str, str] = {}
            try:
                outcomes = execute_pack(store, ids, max_retries=max_retries, on_step=prog.step)
            finally:
                for rid in ids:
                    outcome = outcomes.get(rid, "interrupted")
                    prog.end_run(rid, outcome, _message(store, rid, outcome))
            for rid, outcome in outcomes.items():
                if outcome == "retry":
                    queue.append([rid])
                else:
                    summary.add(outcome, rid)


def _worker_cmd(store: SweepStore, run_ids: list[str], max_retries: int, nproc: int) -> list[str]:
    """``sweep run-one DIR ID [ID ...]``: one run, or the runs of one pack."""
    tail = ["-m", "loopscale", "sweep", "run-one", str(store.root), *run_ids, "--max-retries", str(max_retries)]
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
    return (
        f"{len(run_ids)} run(s) busy in another live process, not run here: {', '.join(held[:3])}{more}; "
        f"rerun when it ends (`loopscale sweep status {store.root}`), or if that process is gone for good "
        f"delete its lock ({store.run_dir(run_ids[0]) / 'lock.json'})"
    )


def _run_subprocesses(
    store: SweepStore,
    queue: collections.deque,
    slots: list[dict[str, str]],
    summary: Summary,
    prog: SweepProgress,
    flops: dict[str, float],
    steps: dict[str, int],
    max_retries: int,
    nproc: int,
) -> None:
    active: dict[int, tuple[subprocess.Popen, list[str], Any]] = {}

    def forward(signum: int, first: bool) -> None:
        for proc, _ids, _log in active.values():
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM if first else signal.SIGKILL)

    with StopSignals(STOP, forward) as stop:
        while (queue and stop.caught is None) or active:
            for i, env in enumerate(slots):
                if i in active or not queue or stop.caught is not None:
                    continue
                ids = _next_runnable(store, queue, max_retries, summary)
                if not ids:
                    continue
                log = _pack_log(store, ids)
                cmd = tethered(_worker_cmd(store, ids, max_retries, nproc))
                proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
                active[i] = (proc, ids, log)
                for rid in ids:
                    prog.start_run(
                        rid, flops[rid], steps[rid], store.state(rid).step or 0, slot=i if len(slots) > 1 else None
                    )
            for i, (proc, ids, log) in list(active.items()):
                for rid in ids:
                    step = last_step(store.run_dir(rid))
                    if step is not None:
                        prog.step(rid, step, steps[rid])
                code = proc.poll()
                if code is None:
                    continue
                log.close()
                del active[i]
                for rid in ids:
                    _settle(store, rid, code, max_retries, stop.caught is not None, prog, queue, summary)
            time.sleep(0.2)
    if stop.caught is not None:
        from loopscale.train import RunInterrupted

        raise RunInterrupted(
            "sweep stopped by signal; the running runs saved checkpoints; rerun to resume", stop.caught
        )


@dataclass
class _Slot:
    """A CPU slot's long-lived worker and the runs it trains, one run or one pack (empty: idle)."""

    proc: subprocess.Popen
    run_ids: list[str] = field(default_factory=list)
    buf: bytes = b""
    log_start: int = 0  # the size of the worker.log (the pack's first run's) when the runs were handed out

    def send(self, run_ids: list[str], log: Path) -> None:
        assert self.proc.stdin is not None
        self.log_start = log.stat().st_size if log.exists() else 0
        self.proc.stdin.write(("\t".join(run_ids) + "\n").encode())
        self.proc.stdin.flush()
        self.run_ids = list(run_ids)

    def warnings(self, log: Path) -> list[str]:
        """The ``warning:`` lines the run wrote to its worker.log (shown as the in-process sweep shows them)."""
        try:
            with open(log, "rb") as fh:
                fh.seek(self.log_start)
                text = fh.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.startswith("warning:")]

    def finished(self) -> bool:
        """Whether the worker reported its run's end (reads what its control channel holds, without blocking)."""
        import select

        out = self.proc.stdout
        assert out is not None
        while select.select([out], [], [], 0)[0]:
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                break
            self.buf += chunk
        if b"\n" not in self.buf:
            return False
        _line, self.buf = self.buf.split(b"\n", 1)
        return True


def _spawn_slot(store: SweepStore, env: dict[str, str], max_retries: int, log: Any) -> _Slot:
    cmd = tethered([sys.executable, "-m", "loopscale.sweep.slot_worker", str(store.root), str(max_retries)])
    return _Slot(
        subprocess.Popen(cmd, env={**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    )


def _run_slot_workers(
    store: SweepStore,
    queue: collections.deque,
    envs: list[dict[str, str]],
    summary: Summary,
    prog: SweepProgress,
    flops: dict[str, float],
    steps: dict[str, int],
    max_retries: int,
) -> None:
    """CPU slots: one long-lived worker per slot (torch started once), each handed the next run when idle.

    A worker that dies mid-run (killed, out of memory) has its run recorded as a failure (``_outcome_after_worker``)
    and is replaced; the worker's own output outside runs goes to ``SWEEP_DIR/slot-workers.log``.
    """
    slots: dict[int, _Slot] = {}
    log = open(store.root / "slot-workers.log", "ab")  # noqa: SIM115  (closed below)

    def forward(signum: int, first: bool) -> None:
        for slot in slots.values():
            with contextlib.suppress(OSError):
                slot.proc.send_signal(signal.SIGTERM if first else signal.SIGKILL)

    def settle(i: int, slot: _Slot, code: int) -> None:
        ids, slot.run_ids = slot.run_ids, []
        for line in slot.warnings(store.run_dir(ids[0]) / "worker.log"):
            prog.console.print(f"{ids[0]}: {line}", highlight=False, markup=False)
        for rid in ids:
            _settle(store, rid, code, max_retries, stop.caught is not None, prog, queue, summary)

    try:
        with StopSignals(STOP, forward) as stop:
            while (queue and stop.caught is None) or any(s.run_ids for s in slots.values()):
                for i, env in enumerate(envs):
                    slot = slots.get(i)
                    if (slot is not None and slot.run_ids) or not queue or stop.caught is not None:
                        continue
                    ids = _next_runnable(store, queue, max_retries, summary)
                    if not ids:
                        continue
                    if slot is None or slot.proc.poll() is not None:
                        slot = slots[i] = _spawn_slot(store, env, max_retries, log)
                    _pack_log(store, ids).close()
                    slot.send(ids, store.run_dir(ids[0]) / "worker.log")
                    for rid in ids:
                        prog.start_run(rid, flops[rid], steps[rid], store.state(rid).step or 0, slot=i)
                for i, slot in list(slots.items()):
                    if not slot.run_ids:
                        continue
                    for rid in slot.run_ids:
                        step = last_step(store.run_dir(rid))
                        if step is not None:
                            prog.step(rid, step, steps[rid])
                    if slot.finished():
                        settle(i, slot, 0)
                    elif (code := slot.proc.poll()) is not None:
                        settle(i, slot, code)
                time.sleep(0.2)
    finally:
        _close_slots(slots)
        log.close()
    if stop.caught is not None:
        from loopscale.train import RunInterrupted

        raise RunInterrupted(
            "sweep stopped by signal; the running runs saved checkpoints; rerun to resume", stop.caught
        )


def _close_slots(slots: dict[int, _Slot]) -> None:
    """End every worker: end of input for the idle ones, then a wait (SIGKILL after 60 s: it would hold a lock)."""
    for slot in slots.values():
        with contextlib.suppress(OSError, ValueError):
            assert slot.proc.stdin is not None
            slot.proc.stdin.close()
    for slot in slots.values():
        try:
            slot.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            slot.proc.kill()
            slot.proc.wait()
        if slot.proc.stdout is not None:
            slot.proc.stdout.close()


def _next_runnable(
    store: SweepStore, queue: collections.deque[list[str]], max_retries: int, summary: Summary
) -> list[str] | None:
    """The runs of the next queued pack (or single run) that may start here; the ones that may not are counted
    (busy or skipped)."""
    while queue:
        ids = []
        for rid in queue.popleft():
            ok, why = runnable(store, rid, max_retries)
            if ok:
                ids.append(rid)
            else:
                summary.add("busy" if why == "running elsewhere" else "skipped", rid)
        if ids:
            return ids
    return None


def _pack_log(store: SweepStore, run_ids: list[str]) -> Any:
    """The worker.log of a pack's first run, opened for appending (a worker's output goes there); the other
    runs' logs say where it is."""
    for rid in run_ids:
        store.run_dir(rid).mkdir(parents=True, exist_ok=True)
    for rid in run_ids[1:]:
        with open(store.run_dir(rid) / "worker.log", "a", encoding="utf-8") as fh:
            fh.write(f"trained in a pack of {len(run_ids)} runs; its output is in runs/{run_ids[0]}/worker.log\n")
    return open(store.run_dir(run_ids[0]) / "worker.log", "ab")


def _settle(
    store: SweepStore,
    rid: str,
    code: int,
    max_retries: int,
    interrupted: bool,
    prog: SweepProgress,
    queue: collections.deque[list[str]],
    summary: Summary,
) -> None:
    """A worker's run ended with ``code``: record its outcome, and queue it again (alone) when it is to be retried."""
    outcome = _outcome_after_worker(store, rid, code, max_retries, interrupted=interrupted)
    prog.end_run(rid, outcome, _message(store, rid, outcome))
    if outcome == "retry":
        queue.append([rid])
    else:
        summary.add(outcome, rid)


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
    from loopscale.sweep.attempt import record_failure

    tail = ""
    log = store.run_dir(run_id) / "worker.log"
    if log.exists():
        tail = log.read_bytes()[-2000:].decode("utf-8", "replace")
    att = store.attempts(run_id)
    record_failure(
        store,
        store.load_run(run_id),
        att,
        f"worker exited with status {code} without a result",
        tail,
        retryable=True,
        wall_s=0.0,
    )
    return "retry" if att["failures"] <= max_retries else "failed"
