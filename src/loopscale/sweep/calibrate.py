"""Time estimates: a few real training steps of each distinct model shape on this machine, cached.

For every distinct (model, batch, optimiser, device, threads) of a sweep, cheapest first: one
warm-up step, then timed steps (forward + backward on ``rows`` rows of random tokens, and the
optimiser step) give seconds per row and per optimiser step. The rows are at most 8, the run's
micro-batch, what the time budget allows, and what ``loopscale.memory`` predicts fits this device
(a shape that cannot fit one row is extrapolated, not measured). A run's estimate is
``steps * (rows_per_step * s_per_row + s_opt) + validation + fixed overhead``. Runs that will train in
parallel CPU slots are timed at a slot's thread count (``Calibration(cores=...)``: ``run.threads``, else the
slot's share of the cores), alone; the plan turns the per-run times into a wall time over the slots
(``plan.makespan``). When the time budget
is spent (the paper's grid on a laptop), the remaining shapes are extrapolated from the achieved
FLOP/s of the measured shape nearest in FLOPs/token, and marked so. Results are cached in
``SWEEP_DIR/calibration.json`` under a key of the hardware, so a second plan costs nothing.

Packs (``sweep.packs``): a shape that trains in packs of k is also timed as a pack of k (``measure(pack=k)``:
``train.pack``'s stacked model and optimisers), per member; a pack with m members left in it is estimated from
the solo and the k-member times, linear in m between them (``pack_seconds``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscale import accounting, memory
from loopscale.io import atomic_write_json
from loopscale.train import microbatch
from loopscale.train.settings import TrainConfig

RUN_OVERHEAD_S = 1.5  # data load from the cache, model build, final save (CPU, measured on the demo)
SLOT_START_S = 6.0  # a CPU slot's worker starting: torch and torch._dynamo imports (2 cores, bench/RESULTS.md)
GUESS_FLOPS_PER_S = {"cpu": 2e10, "cuda": 5e13}  # before anything is measured: sizes the first measurement


@dataclass
class Timing:
    s_per_row: float  # forward + backward, one row of T tokens
    s_opt: float  # one optimiser step
    flops_per_s: float  # achieved training FLOP/s
    measured: bool  # False: extrapolated from a measured shape

    def run_seconds(self, cfg: TrainConfig, steps: int) -> float:
        val_rows = math.ceil(cfg.run.val_tokens / cfg.model.seq_len)
        return (
            steps * (cfg.run.batch_size * self.s_per_row + self.s_opt) + val_rows * self.s_per_row / 3 + RUN_OVERHEAD_S
        )


def shape_key(cfg: TrainConfig, device: str, threads: int | None = None) -> str:
    """Everything that changes the speed of a step (not the budget, seed or data); ``threads``: the torch
    threads it runs with when ``run.threads`` leaves them to the machine (a slot's share)."""
    blob = {
        "model": cfg.model.model_dump(mode="json"),
        "micro": cfg.run.micro_batch or cfg.run.batch_size,
        "optim": cfg.optim.name,
        "ns_steps": cfg.optim.ns_steps,
        "threads": cfg.run.threads or threads,
        "dtype": cfg.run.dtype,
        "compile": cfg.run.compile,
        "device": device,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def hardware_key(device: str) -> str:
    import torch

    from loopscale.cores import available_cores
    from loopscale.train.hardware import hardware_info

    info = hardware_info(torch.device(device))
    return f"{info.get('gpu') or info['cpu']}|{available_cores()} cores|torch {torch.__version__}"


def _device(cfg: TrainConfig) -> str:
    import torch

    pref = cfg.run.device
    return "cuda" if pref == "cuda" or (pref == "auto" and torch.cuda.is_available()) else "cpu"


def _run_micro(cfg: TrainConfig, device: str, limit: float | None) -> int:
    """The rows per forward the run would use on this device (``run.micro_batch``, "auto" resolved)."""
    return microbatch.micro_batches(cfg, device=device, limit=limit).train or 1


def measure(
    cfg: TrainConfig, rows: int, *, steps: int = 2, threads: int | None = None, pack: int = 1
) -> tuple[float, float]:
    """(seconds per row of forward+backward, seconds per optimiser step) for this model on this machine,
    with ``run.threads`` torch threads, else ``threads``, else the machine's share (``setup_threads``).
    ``pack``: as a member of a pack of that many (``train.pack``), per member."""
    if pack > 1:
        return _measure_pack(cfg, rows, pack, steps=steps, threads=threads)
    import torch

    from loopscale.model import LoopedLM, cpu_kernels
    from loopscale.optim import build_optimizers
    from loopscale.train.compiling import compile_for_training
    from loopscale.train.hardware import Dist, autocast, resolved_dtype, setup_threads, tune_cpu_malloc

    device = torch.device(_device(cfg))
    setup_threads(cfg.run.threads or threads, Dist())
    if device.type == "cpu":
        tune_cpu_malloc()  # as the trainer does: the timings are the run's
        cpu_kernels.library()
    torch.manual_seed(0)
    model = LoopedLM(cfg.model).to(device)
    model.fused_loss = cfg.run.fused_loss
    step_fn, _ = compile_for_training(model, model.blocks(), cfg.run.compile, device)
    opt = build_optimizers(
        model.param_groups(),
        cfg.optim,
        d_model=cfg.model.width,
        tokens_per_step=cfg.tokens_per_step,
        total_tokens=1e9,
        r=cfg.model.r,
    )
    dtype = resolved_dtype(device, cfg.run.dtype)
    T, V = cfg.model.seq_len, min(cfg.model.vocab_size, 256)
    x = torch.randint(0, V, (rows, T), device=device)
    y = torch.randint(0, V, (rows, T), device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def fwd_bwd() -> None:
        with autocast(device, dtype):
            loss = step_fn(x, y)
        loss.backward()

    fwd_bwd()
    opt.step()
    opt.zero_grad(set_to_none=True)  # warm-up (allocations, compilation)
    t_fb = t_opt = 0.0
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        fwd_bwd()
        sync()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        t_fb += t1 - t0
        t_opt += time.perf_counter() - t1
    return t_fb / steps / rows, t_opt / steps


def _measure_pack(cfg: TrainConfig, rows: int, k: int, *, steps: int, threads: int | None) -> tuple[float, float]:
    """``measure`` of one member of a pack of ``k`` (the pack's times divided by ``k``)."""
    import torch

    from loopscale.model import LoopedLM, cpu_kernels
    from loopscale.model.packed import PackedLM
    from loopscale.optim import build_optimizers
    from loopscale.optim.packed import PackedOptimizers
    from loopscale.train.hardware import Dist, autocast, resolved_dtype, setup_threads, tune_cpu_malloc

    device = torch.device(_device(cfg))
    setup_threads(cfg.run.threads or threads, Dist())
    if device.type == "cpu":
        tune_cpu_malloc()
        cpu_kernels.library()
    models, opts = [], []
    for seed in range(k):
        torch.manual_seed(seed)
        model = LoopedLM(cfg.model).to(device)
        model.fused_loss = cfg.run.fused_loss
        models.append(model)
        opts.append(
            build_optimizers(
                model.param_groups(),
                cfg.optim,
                d_model=cfg.model.width,
                tokens_per_step=cfg.tokens_per_step,
                total_tokens=1e9,
                r=cfg.model.r,
            )
        )
    pack = PackedLM(models)
    popt = PackedOptimizers(pack.stacked(), opts, [{id(p): n for n, p in m.named_parameters()} for m in models])
    dtype = resolved_dtype(device, cfg.run.dtype)
    T, V = cfg.model.seq_len, min(cfg.model.vocab_size, 256)
    x = torch.randint(0, V, (k, rows, T), device=device)
    y = torch.randint(0, V, (k, rows, T), device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def fwd_bwd() -> None:
        with autocast(device, dtype):
            loss = pack(x, y)
        loss.sum().backward()

    fwd_bwd()
    popt.step()
    popt.zero_grad()
    t_fb = t_opt = 0.0
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        fwd_bwd()
        sync()
        t1 = time.perf_counter()
        popt.step()
        popt.zero_grad()
        sync()
        t_fb += t1 - t0
        t_opt += time.perf_counter() - t1
    return t_fb / steps / rows / k, t_opt / steps / k


def pack_seconds(members: list[tuple[TrainConfig, int]], solo: Timing, packed: Timing | None, k: int) -> float:
    """A pack's wall time: its members (config, steps; one shape) step together until each has its steps, a
    step of m members costing m member-steps, a member-step linear in m between the solo time (m = 1) and the
    measured pack of ``k`` (``packed``; None: the solo time, no gain); then each member's validation and fixed
    overhead (``Timing.run_seconds`` without its steps)."""
    B = members[0][0].run.batch_size
    s1 = B * solo.s_per_row + solo.s_opt
    sk = s1 if packed is None or k <= 1 else B * packed.s_per_row + packed.s_opt
    total, done = 0.0, 0
    for j, steps in enumerate(sorted(n for _, n in members)):
        left = len(members) - j  # members still stepping
        if steps > done:
            frac = min(1.0, (left - 1) / (k - 1)) if k > 1 else 0.0
            total += (steps - done) * left * (s1 + (sk - s1) * frac)
            done = steps
    return total + sum(solo.run_seconds(cfg, 0) for cfg, _ in members)


class Calibration:
    """Cached timings per model shape for this hardware; ``timing(cfg)`` after ``ensure(configs)``.

    ``cores``: the cores of one parallel slot, the threads of runs without ``run.threads`` (None: all).
    """

    def __init__(self, path: Path | None, cores: int | None = None) -> None:
        self.path = path
        self.cores = cores
        self.entries: dict[str, dict[str, Any]] = {}
        self.hardware = ""
        self.note = ""
        if path is not None and path.exists():
            try:
                blob = json.loads(path.read_text(encoding="utf-8"))
                self._all = blob
            except (OSError, ValueError):
                self._all = {}
        else:
            self._all = {}

    def ensure(
        self,
        configs: list[TrainConfig],
        *,
        budget_s: float = 60.0,
        rows: int = 8,
        log: Any = None,
        packs: dict[str, int] | None = None,
    ) -> tuple[int, int]:
        """Measure shapes not in the cache, cheapest first, within ``budget_s``. Returns (measured, total).

        Rows per measurement shrink (to 1) so that a warm-up and two timed steps fit in what is left of the
        budget, judged by the FLOP/s measured so far (at first: a rough guess for the device); shapes that
        do not fit even with one row are extrapolated. ``packs``: ``shape_key`` -> the size of the packs that
        shape trains in; each is also timed as such a pack (after every solo shape), within the same budget.
        """
        self.note = ""
        if not configs:
            return 0, 0
        import torch

        device = _device(configs[0])
        if device == "cuda" and not torch.cuda.is_available():
            self.note = "the runs ask for CUDA and this machine has none: no timing (use --flops-per-s)"
            return 0, len({shape_key(c, device, self.cores) for c in configs})
        self.hardware = hardware_key(device)
        self.entries = dict(self._all.get(self.hardware, {}))
        shapes: dict[str, TrainConfig] = {}
        for cfg in configs:
            shapes.setdefault(shape_key(cfg, device, self.cores), cfg)
        todo = [(k, c) for k, c in shapes.items() if k not in self.entries]
        todo.sort(key=lambda kc: accounting.train_flops_per_token(kc[1].model))
        guess = GUESS_FLOPS_PER_S[device]
        total_mem = memory.device_total_memory(device)
        limit = memory.usable_memory(total_mem, device) if total_mem else None
        t_start = time.time()
        for key, cfg in todo:
            f = accounting.train_flops_per_token(cfg.model)
            row_s = f * cfg.model.seq_len / (self._nearest_fps(f) or guess)
            left = budget_s - (time.time() - t_start)
            n_rows = min(rows, _run_micro(cfg, device, limit), int(left / (3 * row_s)))
            if limit is not None and n_rows >= 1:
                n_rows = microbatch.max_rows(cfg, device=device, limit=limit, most=n_rows)
            if n_rows < 1:
                continue  # does not fit in the budget or in memory: extrapolated
            if log is not None:
                log(f"calibrating {cfg.model.layout} d={cfg.model.width} ({n_rows} rows of {cfg.model.seq_len})")
            s_row, s_opt = measure(cfg, n_rows, threads=self.cores)
            self.entries[key] = {
                "s_per_row": s_row,
                "s_opt": s_opt,
                "flops_per_s": f * cfg.model.seq_len / s_row,
                "flops_per_token": f,
                "layout": cfg.model.layout,
                "d_model": cfg.model.width,
                "rows": n_rows,
            }
        for key, cfg in todo:  # then the packs, the same shapes, cheapest first
            k = (packs or {}).get(key, 1)
            pkey = f"{key}|pack{k}"
            if k <= 1 or pkey in self.entries or key not in self.entries:
                continue
            left = budget_s - (time.time() - t_start)
            n_rows = min(int(self.entries[key]["rows"]), int(left / (3 * k * self.entries[key]["s_per_row"])))
            if n_rows < 1:
                continue
            if log is not None:
                log(f"calibrating {cfg.model.layout} d={cfg.model.width} as a pack of {k} ({n_rows} rows each)")
            s_row, s_opt = measure(cfg, n_rows, threads=self.cores, pack=k)
            f = accounting.train_flops_per_token(cfg.model)
            self.entries[pkey] = {
                "s_per_row": s_row,
                "s_opt": s_opt,
                "flops_per_s": f * cfg.model.seq_len / s_row,
                "flops_per_token": f,
                "layout": cfg.model.layout,
                "d_model": cfg.model.width,
                "rows": n_rows,
                "pack": k,
            }
        self._save()
        measured = sum(k in self.entries for k in shapes)
        if not measured:
            self.note = (
                f"no model shape fits in --calibrate-s={budget_s:g} on this machine: no timing "
                "(raise it, or use --flops-per-s)"
            )
        return measured, len(shapes)

    def key(self, cfg: TrainConfig) -> str:
        """``cfg``'s shape key here (the key of ``ensure(packs=...)``)."""
        return shape_key(cfg, _device(cfg), self.cores)

    def pack_timing(self, cfg: TrainConfig) -> tuple[int, Timing] | None:
        """(k, a member's timing in a pack of k) as ``ensure(packs=...)`` measured it for ``cfg``'s shape, or None."""
        prefix = f"{self.key(cfg)}|pack"
        found = [(int(e["pack"]), e) for key, e in self.entries.items() if key.startswith(prefix)]
        if not found:
            return None
        k, e = max(found, key=lambda ke: ke[0])
        return k, Timing(e["s_per_row"], e["s_opt"], e["flops_per_s"], True)

    def _nearest_fps(self, f: float) -> float | None:
        solo = [e for e in self.entries.values() if "pack" not in e]
        if not solo:
            return None
        e = min(solo, key=lambda e: abs(math.log(e["flops_per_token"] / f)))
        return float(e["flops_per_s"])

    def timing(self, cfg: TrainConfig) -> Timing | None:
        key = shape_key(cfg, _device(cfg), self.cores)
        e = self.entries.get(key)
        if e is not None:
            return Timing(e["s_per_row"], e["s_opt"], e["flops_per_s"], True)
        f = accounting.train_flops_per_token(cfg.model)
        fps = self._nearest_fps(f)
        if fps is None:
            return None
        return Timing(f * cfg.model.seq_len / fps, 0.0, fps, False)

    def measured_flops_per_s(self, key: str) -> float | None:
        """The FLOP/s measured for the shape ``key`` (``shape_key``) on any cached machine, the slowest; no
        measuring and no extrapolation (a login node sizing SLURM jobs for GPU nodes it cannot time)."""
        found = [
            float(entries[key]["flops_per_s"])
            for entries in self._all.values()
            if isinstance(entries, dict) and "flops_per_s" in entries.get(key, {})
        ]
        return min(found) if found else None

    def _save(self) -> None:
        if self.path is None:
            return
        self._all[self.hardware] = self.entries
        atomic_write_json(self.path, self._all)


def assumed_timing(cfg: TrainConfig, flops_per_s: float) -> Timing:
    """A timing from an assumed throughput (e.g. a cluster GPU's achieved FLOP/s)."""
    f = accounting.train_flops_per_token(cfg.model)
    return Timing(f * cfg.model.seq_len / flops_per_s, 0.0, flops_per_s, False)
