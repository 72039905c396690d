"""A run's micro-batches: how many rows one forward takes, planned from ``loopscale.memory``'s peak terms.

The memory model is pure arithmetic on a ModelConfig; this is where it meets a run's TrainConfig (its batch,
``run.micro_batch``, dtype and optimiser) and, for the trainer, the device it runs on. ``sweep plan`` and the
calibration call the pure functions; ``train.loop`` calls ``on_device``. docs/training.md, "GPU memory".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loopscale import memory
from loopscale.errors import ConfigError
from loopscale.train.settings import TrainConfig

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MicroBatches:
    """A run's training and validation micro-batches and their predicted peaks (bytes, one process)."""

    rows_per_process: int
    train: int | None  # None: not even one row fits
    val: int | None
    train_peak: float  # at ``train`` rows (at one row when nothing fits)
    val_peak: float
    limit: float | None  # usable bytes planned for (None: not known)

    @property
    def fits(self) -> bool:
        return self.train is not None and (self.limit is None or self.train_peak <= self.limit)

    def record(self) -> dict[str, Any]:
        """What a run's result.json records."""
        return {
            "micro_batch": self.train,
            "val_micro_batch": self.val,
            "predicted_peak_bytes": self.train_peak,
            "predicted_val_peak_bytes": self.val_peak,
            "memory_limit_bytes": self.limit,
        }


def micro_batches(cfg: TrainConfig, *, device: str, limit: float | None, world: int = 1, pack: int = 1) -> MicroBatches:
    """A run's micro-batches on ``device`` with ``limit`` usable bytes per process.

    ``run.micro_batch``: None = all the process's rows in one forward; an int = that many (at most all);
    ``"auto"`` = the largest divisor of the rows per process whose training peak is within ``limit``
    (all rows when the limit is unknown), and for validation, which keeps no activations, the largest
    divisor (at least the training one) whose validation peak is within it.

    ``pack``: the run is one of ``pack`` same-shaped members trained as one model (``loopscale.train.pack``).
    Every term of a pack's step is its members' side by side (stacked weights, gradients and optimiser state,
    each member's activations, the batched orthogonalisation; the packed loss's chunks hold no more rows per
    member than a solo run's), so its peak is ``pack`` times a member's: each member plans for ``limit / pack``
    and the peaks returned are the pack's. Validation runs one member at a time beside the pack's state, which
    the same product bounds.
    """
    model, run, opt = cfg.model, cfg.run, cfg.optim
    rg = memory.regime(device, run.dtype, fused_loss=run.fused_loss)
    per = max(1, run.batch_size // world)
    k_pack = max(1, pack)
    each = None if limit is None else limit / k_pack

    def tp(k: int) -> memory.Peak:
        return memory.train_peak(model, k, rg, optim=opt.name, ns_dtype=opt.ns_dtype, world=world, accumulate=k < per)

    def vp(k: int) -> memory.Peak:
        return memory.eval_peak(model, k, rg, optim=opt.name, world=world)

    if run.micro_batch != "auto" or each is None:
        k = per if run.micro_batch in (None, "auto") else min(int(run.micro_batch), per)
        return MicroBatches(per, k, k, k_pack * tp(k).total, k_pack * vp(k).total, limit)
    fits = memory.largest_fitting(per, each, tp)
    if fits is None:
        return MicroBatches(per, None, None, k_pack * tp(1).total, k_pack * vp(1).total, limit)
    v = memory.largest_fitting(per, each, vp, at_least=fits) or fits
    return MicroBatches(per, fits, v, k_pack * tp(fits).total, k_pack * vp(v).total, limit)


def pack_peak(cfg: TrainConfig, k: int, *, device: str) -> float:
    """The predicted peak of ``k`` runs like ``cfg`` trained as one pack, at the run's configured micro-batch
    (``micro_batches(pack=k)``; "auto" taken as all rows)."""
    return micro_batches(cfg, device=device, limit=None, pack=k).train_peak


def max_rows(cfg: TrainConfig, *, device: str, limit: float, most: int) -> int:
    """The most rows (1..``most``, any count) one training forward may take within ``limit`` (0: none)."""
    rg = memory.regime(device, cfg.run.dtype, fused_loss=cfg.run.fused_loss)
    for k in range(most, 0, -1):
        if memory.train_peak(cfg.model, k, rg, optim=cfg.optim.name, ns_dtype=cfg.optim.ns_dtype).total <= limit:
            return k
    return 0


def on_device(cfg: TrainConfig, device: torch.device, world: int = 1, pack: int = 1) -> MicroBatches:
    """The run's training and validation micro-batches on this device (``run.micro_batch``; docs/training.md).

    ``"auto"`` plans for the device's usable memory (``memory.usable_memory``: a GPU's total less 10 % and
    1 GiB, half of a CPU host); a run that cannot fit one row is a ConfigError, never retried.
    """
    total = memory.device_total_memory(str(device))
    limit = None if total is None else memory.usable_memory(total, device.type)
    mb = micro_batches(cfg, device=device.type, limit=limit, world=world, pack=pack)
    if mb.train is None:
        raise ConfigError(
            "run.micro_batch",
            f"auto: one row of {cfg.model.seq_len} tokens needs "
            f"{memory.fmt_bytes(mb.train_peak)} (predicted, loopscale.memory) but one process on "
            f"{device} has {memory.fmt_bytes(limit or 0)} usable; use a larger device, more "
            "processes or a smaller model",
            value="auto",
        )
    peak = max(mb.train_peak, mb.val_peak)
    if total is not None and peak > total:  # it cannot run here: refuse now, not after minutes of swapping
        m, r = cfg.model, cfg.run
        raise ConfigError(
            "run.micro_batch",
            f"{mb.train} rows of {m.seq_len} tokens at d_model = {m.d_model}, "
            f"L_eff = {m.L_eff} need {memory.fmt_bytes(peak)} (predicted, loopscale.memory) but "
            f'{device} has {memory.fmt_bytes(total)} in all; set run.micro_batch = "auto", a '
            "smaller run.batch_size or a smaller model",
            value=r.micro_batch,
        )
    return mb
