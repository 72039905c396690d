"""Which runs of a sweep train together as one pack (``sweep run --pack auto|N|off``; docs/sweep.md, "Packs").

A pack (``loopscale.train.pack``) trains runs of the same shape as one stacked model in one process, each keeping
its own run dir, lock, seed, data, length, learning rates, checkpoints and result. Runs can share a pack when
their configs agree on everything but what a member keeps for itself (``pack_key``): the model (layout, width,
r, T, vocabulary, injection or technique, truncated BPTT), the batch and micro-batch, the device, dtype, threads
and compile mode, the optimiser's kind and its non-learning-rate settings (betas, eps, momentum,
orthogonalisation, weight decay, clipping). Seeds, budgets (so step counts: a member leaves the pack at its own
last step), learning rates and their transfer rules and schedules, the data, and the logging, validation and
checkpoint settings may differ. Runs that log to a tracker (``run.track``) train alone.

Torch-free (``sweep plan`` reads it); whether a user's technique runs under ``torch.vmap`` is found when its pack
starts (``train.pack.why_not_packable``): a technique that does not trains its runs one at a time.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

from loopscale.errors import ConfigError
from loopscale.train.settings import TrainConfig

if TYPE_CHECKING:
    from loopscale.sweep.runspec import RunSpec

PackMode = Literal["auto", "off"] | int

#: what each member of a pack keeps for itself (left out of ``pack_key``); the data as a whole
MEMBER_FIELDS: dict[str, tuple[str, ...]] = {
    "run": (
        "budget",
        "tokens",
        "steps",
        "seed",
        "min_steps",
        "val_tokens",
        "eval_every",
        "log_every",
        "ckpt_every",
        "keep_checkpoint",
        "fail_at_step",
        "wandb_project",
        "wandb_entity",
    ),
    "optim": (
        "matrix_lr",
        "embed_lr",
        "head_lr",
        "norm_lr",
        "scalar_lr",
        "adamw_lr",
        "adamw_single_lr",
        "lr_scale",
        "transfer",
        "d_ref",
        "tokens_per_step_ref",
        "tokens_ref",
        "schedule",
        "warmup_frac",
        "final_lr_frac",
        "decay_frac",
    ),
}

#: the most runs ``--pack auto`` puts in one pack: on a CPU the gain per member levels off by 8 members
#: (bench/RESULTS.md, "Packs"); on a GPU the memory model (``loopscale.train.microbatch.pack_peak``) limits it too
AUTO_MAX = {"cpu": 8, "cuda": 16}


def parse_pack(value: str | int | None, flag: str = "--pack") -> PackMode:
    """``auto``, ``off`` or a number of runs per pack (at least 1; 1 is ``off``), or a one-line ConfigError."""
    if value is None:
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        text = str(value).strip().lower()
        if text in ("auto", "off"):
            return "off" if text == "off" else "auto"
        try:
            n = int(text)
        except ValueError:
            n = 0
    if n < 1:
        raise ConfigError(flag, "expected auto, off or the most runs per pack (a whole number >= 1)", value=value)
    return "off" if n == 1 else n


def pack_key(cfg: TrainConfig) -> str | None:
    """What runs of one pack must share (None: this run trains alone)."""
    if cfg.run.track != "none":
        return None
    blob = cfg.model_dump(mode="json")
    blob.pop("data")
    for section, fields in MEMBER_FIELDS.items():
        for f in fields:
            blob[section].pop(f, None)
    return json.dumps(blob, sort_keys=True)


def device_kind(cfg: TrainConfig) -> str:
    """``cuda`` or ``cpu``: where the run trains (``run.device``; auto is CUDA where a driver is)."""
    from loopscale.cores import uses_cuda

    return "cuda" if uses_cuda(cfg.run.device) else "cpu"


def pack_cap(cfg: TrainConfig, mode: PackMode, device_memory: float | None = None) -> int:
    """The most members of a pack of runs like ``cfg``: ``mode`` (a number), else ``AUTO_MAX`` of the device,
    at most what the memory model fits in ``device_memory`` (bytes; None: this machine's)."""
    if mode == "off":
        return 1
    if isinstance(mode, int):
        return mode
    from loopscale import memory
    from loopscale.train import microbatch

    device = device_kind(cfg)
    cap = AUTO_MAX[device]
    total = device_memory if device_memory is not None else memory.device_total_memory(device)
    if total:
        limit = memory.usable_memory(total, device)
        while cap > 1 and microbatch.pack_peak(cfg, cap, device=device) > limit:
            cap -= 1
    return cap


def make_packs(runs: list[RunSpec], mode: PackMode, *, device_memory: float | None = None) -> list[list[RunSpec]]:
    """The runs as packs, in plan order (a pack where its first run stands): runs of one ``pack_key``, in packs
    of at most ``pack_cap`` split as evenly as that allows (10 runs, at most 8: 5 + 5)."""
    if mode == "off":
        return [[rs] for rs in runs]
    groups: dict[str, list[RunSpec]] = {}
    order: list[tuple[int, str]] = []
    packs: list[tuple[int, list[RunSpec]]] = []
    for i, rs in enumerate(runs):
        key = pack_key(rs.config)
        if key is None:
            packs.append((i, [rs]))
            continue
        if key not in groups:
            groups[key] = []
            order.append((i, key))
        groups[key].append(rs)
    positions = {rs.run_id: i for i, rs in enumerate(runs)}
    for _, key in order:
        members = groups[key]
        cap = max(1, pack_cap(members[0].config, mode, device_memory))
        n = -(-len(members) // cap)
        size, extra = divmod(len(members), n)
        lo = 0
        for j in range(n):
            part = members[lo : lo + size + (1 if j < extra else 0)]
            lo += len(part)
            packs.append((positions[part[0].run_id], part))
    return [p for _, p in sorted(packs, key=lambda ip: ip[0])]
