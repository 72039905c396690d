"""The planner: every run's size, length, tokens per parameter and estimated time, before any compute.

All numbers come from ``loopscale.accounting`` (the runs' exact configs); times from
``calibrate`` (this machine) or from an assumed FLOP/s (a cluster). Warnings name the run:
``refused``  fewer steps than ``run.min_steps`` (the trainer would refuse it), or, for a device memory,
           not even one row fits (``loopscale.memory``; the trainer's ``micro_batch = "auto"`` refuses it);
``memory``   a fixed ``run.micro_batch`` (or all rows) predicted above the device's usable memory;
``budget``   whole steps miss C by more than ``checks.budget_tolerance``;
``tokens/param`` outside ``[checks.min_tokens_per_param, checks.max_tokens_per_param]``;
``long``     estimate above ``checks.max_run_hours``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from loopscale import accounting, memory
from loopscale.sweep.calibrate import SLOT_START_S, Calibration, Timing, assumed_timing, pack_seconds
from loopscale.sweep.packs import PackMode, make_packs
from loopscale.sweep.runspec import RunSpec
from loopscale.sweep.spec import SweepSpec
from loopscale.train import microbatch


@dataclass
class PlanRow:
    run: RunSpec
    N_once: int
    N_rec: int
    flops_per_token: float
    steps: int
    tokens: int
    flops: float
    tokens_per_param: float
    est_s: float | None = None
    est_kind: str = ""  # measured / extrapolated / assumed
    warnings: list[str] = field(default_factory=list)
    micro_batch: int | None = None  # rows per forward on the planned device (with a device memory)
    val_micro_batch: int | None = None
    peak_bytes: float | None = None  # predicted peak of one process at ``micro_batch`` rows
    pack: int | None = None  # the pack (index into ``Plan.packs``) the run trains in

    @property
    def refused(self) -> bool:
        return any(w.startswith("refused") for w in self.warnings)

    def as_dict(self) -> dict[str, Any]:
        rs = self.run
        return {
            "run_id": rs.run_id,
            "variant": rs.variant,
            "seed": rs.seed,
            "C": rs.C,
            "r": rs.r,
            "d_model": rs.d_model,
            "layout": rs.config.model.layout,
            "N_once": self.N_once,
            "N_rec": self.N_rec,
            "flops_per_token": self.flops_per_token,
            "steps": self.steps,
            "tokens": self.tokens,
            "flops": self.flops,
            "tokens_per_param": self.tokens_per_param,
            "est_s": self.est_s,
            "est_kind": self.est_kind,
            "micro_batch": self.micro_batch,
            "val_micro_batch": self.val_micro_batch,
            "peak_bytes": self.peak_bytes,
            "pack": self.pack,
            "warnings": "; ".join(self.warnings),
        }


@dataclass
class Plan:
    spec: SweepSpec
    rows: list[PlanRow]
    calibration_note: str = ""
    memory_note: str = ""
    slots: int = 1  # CPU runs trained at once (local.cpu_slots)
    packs: list[list[int]] = field(default_factory=list)  # row indices of each pack (``sweep.packs``)
    pack_s: list[float | None] = field(default_factory=list)  # each pack's estimated wall time

    @property
    def total_flops(self) -> float:
        return sum(r.flops for r in self.rows)

    @property
    def total_s(self) -> float | None:
        """The sum of the runs' estimates: the time one run at a time."""
        if any(r.est_s is None for r in self.rows):
            return None
        return sum(r.est_s or 0.0 for r in self.rows)

    @property
    def unpacked_wall_s(self) -> float | None:
        """The sweep's wall time over its slots one run at a time per slot (``--pack off``): ``makespan`` of the
        estimates, plus each worker's start."""
        if self.total_s is None:
            return None
        if self.slots <= 1:
            return self.total_s
        return makespan([r.est_s or 0.0 for r in self.rows], self.slots) + SLOT_START_S

    @property
    def wall_s(self) -> float | None:
        """The sweep's wall time over its slots with its packs (each slot trains one pack at a time)."""
        if not self.packs or len(self.packs) == len(self.rows):
            return self.unpacked_wall_s
        if any(t is None for t in self.pack_s):
            return None
        times = [t or 0.0 for t in self.pack_s]
        return makespan(times, self.slots) + (SLOT_START_S if self.slots > 1 else 0.0)

    def by_variant(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.run.variant] = out.get(r.run.variant, 0) + 1
        return out


def makespan(seconds: list[float], slots: int) -> float:
    """When the last run ends if ``slots`` workers take the runs in order, each the next when it is free
    (the local executor's queue); about ``sum / slots`` when the runs are many and alike."""
    free = [0.0] * max(1, slots)
    for s in seconds:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)


def plan_row(rs: RunSpec, spec: SweepSpec) -> PlanRow:
    cfg = rs.config
    m = cfg.model
    steps = cfg.total_steps()
    tokens = steps * cfg.tokens_per_step
    f = accounting.train_flops_per_token(m)
    n_once, n_rec = accounting.N_once(m), accounting.N_rec(m)
    row = PlanRow(rs, n_once, n_rec, f, steps, tokens, tokens * f, tokens / (n_once + n_rec))
    ck = spec.checks
    if steps < cfg.run.min_steps:
        row.warnings.append(
            f"refused: {steps} steps < run.min_steps={cfg.run.min_steps} (raise C or lower run.batch_size)"
        )
    elif steps and abs(row.flops - rs.C) / rs.C > ck.budget_tolerance:
        row.warnings.append(
            f"budget: {steps} whole steps give {row.flops:.3g} FLOPs, {100 * (row.flops / rs.C - 1):+.0f}% off C"
        )
    if row.tokens_per_param < ck.min_tokens_per_param:
        row.warnings.append(f"tokens/param {row.tokens_per_param:.2g} < {ck.min_tokens_per_param:g} (too short)")
    elif row.tokens_per_param > ck.max_tokens_per_param:
        row.warnings.append(f"tokens/param {row.tokens_per_param:.3g} > {ck.max_tokens_per_param:g} (too long)")
    return row


def plan_device(rs: RunSpec) -> str:
    """The device a run is planned for against a device memory: CUDA unless it asks for the CPU."""
    return "cpu" if rs.config.run.device == "cpu" else "cuda"


def plan_memory(row: PlanRow, device_memory: float) -> None:
    """Set a row's micro-batches and predicted peak for one process on a device of ``device_memory`` bytes
    (one process per run), with a ``refused`` warning when not even one row fits."""
    cfg, device = row.run.config, plan_device(row.run)
    limit = memory.usable_memory(device_memory, device)
    auto = cfg.run.micro_batch == "auto"
    mb = microbatch.micro_batches(cfg, device=device, limit=limit)
    best = (
        mb
        if auto
        else microbatch.micro_batches(
            cfg.model_copy(update={"run": cfg.run.model_copy(update={"micro_batch": "auto"})}),
            device=device,
            limit=limit,
        )
    )
    row.micro_batch, row.val_micro_batch, row.peak_bytes = mb.train, mb.val, mb.train_peak
    usable = f"{memory.fmt_bytes(limit)} usable of {memory.fmt_bytes(device_memory)}"
    if best.train is None:
        row.warnings.insert(
            0,
            f"refused: one row of {cfg.model.seq_len} tokens needs "
            f"{memory.fmt_bytes(best.train_peak)} > {usable} (loopscale.memory)",
        )
    elif mb.train_peak > limit:
        row.warnings.append(
            f"memory: {memory.fmt_bytes(mb.train_peak)} predicted at micro_batch={mb.train} > "
            f'{usable}; set run.micro_batch = "auto" ({best.train} rows)'
        )


def make_plan(
    spec: SweepSpec,
    *,
    variants: list[str] | None = None,
    calibration: Calibration | None = None,
    flops_per_s: float | None = None,
    calibrate_s: float = 60.0,
    log: Any = None,
    device_memory: float | None = None,
    slots: int | None = None,
    pack: PackMode = "auto",
) -> Plan:
    """Plan every run; estimate times from ``flops_per_s`` if given, else from a (cached) calibration.

    ``device_memory`` (bytes of each run's GPU): also each run's micro-batch and predicted peak memory.
    ``slots``: CPU runs at once, as ``sweep run --slots`` (None: the executor's default, ``cpu_slots``);
    the calibration then times each shape at a slot's threads and the wall time spreads over the slots.
    ``pack``: as ``sweep run --pack``: the runs' packs (``Plan.packs``), each also timed as a pack.
    """
    from loopscale.cores import available_cores
    from loopscale.sweep.local import cpu_slots

    runs = spec.runs(variants)
    rows = [plan_row(rs, spec) for rs in runs]
    n_slots = cpu_slots(runs, slots)
    if calibration is not None and n_slots > 1:
        calibration.cores = max(1, available_cores() // n_slots)
    mem_note = ""
    if device_memory:
        for row in rows:
            plan_memory(row, device_memory)
        mem_note = (
            f"{memory.fmt_bytes(device_memory)} per GPU, "
            f"{memory.fmt_bytes(memory.usable_memory(device_memory))} usable (less 10 % and 1 GiB); "
            "peak and micro-batch of one process per run, predicted by loopscale.memory"
        )
    index = {r.run.run_id: i for i, r in enumerate(rows)}
    packable = [r.run for r in rows if not r.refused]
    groups = [[index[rs.run_id] for rs in p] for p in make_packs(packable, pack)]
    groups += [[i] for i, r in enumerate(rows) if r.refused]
    for g_i, members in enumerate(groups):
        for i in members:
            rows[i].pack = g_i
    note = ""
    timings: list[Timing | None] = [None] * len(rows)
    if flops_per_s:
        timings = [assumed_timing(r.run.config, flops_per_s) for r in rows]
        note = f"estimates assume {flops_per_s:.3g} FLOP/s per run"
    elif calibration is not None:
        sizes: dict[str, int] = {}
        for members in groups:
            key = calibration.key(rows[members[0]].run.config)
            sizes[key] = max(sizes.get(key, 1), len(members))
        measured, total = calibration.ensure(
            [r.run.config for r in rows if not r.refused], budget_s=calibrate_s, log=log, packs=sizes
        )
        timings = [calibration.timing(r.run.config) if measured else None for r in rows]
        note = calibration.note or (
            f"estimates from {measured} of {total} model shapes timed on this machine ({calibration.hardware})"
        )
        if 0 < measured < total:
            note += "; the rest extrapolated from the nearest shape's FLOP/s"
    for row, t in zip(rows, timings, strict=True):
        if t is None or row.refused:
            row.est_s = 0.0 if t is not None else None
            continue
        row.est_s = t.run_seconds(row.run.config, row.steps)
        row.est_kind = "assumed" if flops_per_s else ("measured" if t.measured else "extrapolated")
        if spec.checks.max_run_hours and row.est_s > 3600 * spec.checks.max_run_hours:
            row.warnings.append(f"long: ~{row.est_s / 3600:.1f} h > checks.max_run_hours={spec.checks.max_run_hours:g}")
    pack_s: list[float | None] = []
    for members in groups:
        solo = timings[members[0]]
        if len(members) == 1 or solo is None:
            pack_s.append(rows[members[0]].est_s if len(members) == 1 else None)
            continue
        cfg0 = rows[members[0]].run.config
        found = calibration.pack_timing(cfg0) if calibration is not None and not flops_per_s else None
        runs_steps = [(rows[i].run.config, rows[i].steps) for i in members]
        k, packed = found if found is not None else (1, None)
        pack_s.append(pack_seconds(runs_steps, solo, packed, k))
    return Plan(spec, rows, note, mem_note, n_slots, groups, pack_s)
