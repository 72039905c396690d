"""A run's validation: the mean next-token loss on the same rows every run of a sweep sees, its standard error
over rows, and bits per byte (docs/training.md, "The run dir": val_loss, val_loss_se, val_bpb).

Apart from the loop so that a solo run (``train.loop``) and a pack's members (``train.pack``) score the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import torch

from loopscale.train.batches import TokenData
from loopscale.train.hardware import autocast
from loopscale.train.settings import TrainConfig


def evaluate_loss(
    model: torch.nn.Module,
    rows: torch.Tensor,
    *,
    micro_batch: int,
    device: torch.device,
    dtype: str,
    dist_world: int = 1,
    rank: int = 0,
) -> float:
    """Mean next-token loss (nats/token) over validation rows, sharded across ranks."""
    return val_loss_stats(
        model, rows, micro_batch=micro_batch, device=device, dtype=dtype, dist_world=dist_world, rank=rank
    ).loss


class ValStats(NamedTuple):
    """The validation estimate: mean loss (nats/token), its standard error over rows, bits per byte."""

    loss: float
    se: float
    bpb: float | None = None


class EvalStopped(Exception):
    """``stop()`` said yes between validation batches (on any rank)."""


_F = TypeVar("_F", bound=Callable[..., Any])


def _no_grad(fn: _F) -> _F:
    """``torch.no_grad()`` as a decorator mypy sees through (torch is read as Any: pyproject.toml, [tool.mypy])."""
    return cast(_F, torch.no_grad()(fn))


@_no_grad
def val_loss_stats(
    model: torch.nn.Module,
    rows: torch.Tensor,
    *,
    micro_batch: int,
    device: torch.device,
    dtype: str,
    dist_world: int = 1,
    rank: int = 0,
    stop: Callable[[], bool] | None = None,
    token_bytes: torch.Tensor | None = None,
) -> ValStats:
    """(mean loss, its standard error over rows, bits per byte): the validation estimate and its own sampling noise.

    Every run of a sweep is scored on the same rows, so this noise is shared by all runs (it shifts
    them together); it bounds how finely one run's loss is known, not the difference between runs.
    ``stop`` is asked before every batch (the ranks agree); a yes raises ``EvalStopped``. ``token_bytes``
    (UTF-8 bytes per id, ``loopscale.data.token_bytes``) adds bits per byte: the nats of targets with bytes over
    ln 2 x their bytes (nanochat's convention); without it ``bpb`` is None.
    """
    was_training = model.training
    model.eval()
    # loss sum, tokens, sum and sum^2 of row means, nats of targets with bytes, their bytes
    total = torch.zeros(6, dtype=torch.float64, device=device)
    tb = token_bytes.to(device) if token_bytes is not None else None
    mine = rows[rank::dist_world]
    shard = -(-rows.size(0) // dist_world)  # the largest rank's rows: every rank asks ``stop`` as often
    for i in range(0, shard if stop is not None else mine.size(0), micro_batch):
        if stop is not None and any_rank(stop(), device, dist_world):
            model.train(was_training)
            raise EvalStopped
        chunk = mine[i : i + micro_batch].to(device)
        if chunk.size(0) == 0:
            continue
        x, y = chunk[:, :-1], chunk[:, 1:]
        with autocast(device, dtype):
            loss = model(x, y, reduction="none").view(y.shape).double()
        row_means = loss.mean(dim=1)
        nb = tb[y].double() if tb is not None else torch.zeros_like(loss)
        total += torch.stack(
            [
                loss.sum(),
                torch.tensor(float(y.numel()), dtype=torch.float64, device=device),
                row_means.sum(),
                row_means.square().sum(),
                (loss * (nb > 0)).sum(),
                nb.sum(),
            ]
        )
    if dist_world > 1:
        torch.distributed.all_reduce(total)
    model.train(was_training)
    n_rows = rows.size(0)
    mean = float(total[0] / total[1])
    bpb = float(total[4] / (math.log(2) * total[5])) if tb is not None and total[5] > 0 else None
    if n_rows < 2:
        return ValStats(mean, float("nan"), bpb)
    var = max(0.0, float(total[3] - total[2] ** 2 / n_rows) / (n_rows - 1))
    return ValStats(mean, math.sqrt(var / n_rows), bpb)


def val_token_bytes(cfg: TrainConfig, data: TokenData) -> torch.Tensor | None:
    """UTF-8 bytes per id for bits per byte, or None where ids outside the tokenizer's vocabulary occur (shards)."""
    from loopscale.data.token_bytes import token_bytes

    table = token_bytes(data.tokenizer)
    if data.max_id >= table.size:
        return None
    if cfg.data.bos_id is not None and cfg.data.bos_id < table.size:
        table[cfg.data.bos_id] = 0  # the documents' separator is no text
    return torch.from_numpy(table)


def any_rank(flag: bool, device: torch.device, world: int) -> bool:
    if world == 1:
        return flag
    t = torch.tensor(float(flag), device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


class Validator:
    """The run's validation: the same rows for the periodic ``loss`` and the ``final`` estimate, sharded across
    processes; the final one can be stopped between batches by a signal."""

    def __init__(
        self,
        model: torch.nn.Module,
        rows: torch.Tensor,
        *,
        micro_batch: int,
        device: torch.device,
        dtype: str,
        world: int = 1,
        rank: int = 0,
    ) -> None:
        self.model, self.rows = model, rows
        self._kw: dict[str, Any] = {
            "micro_batch": micro_batch,
            "device": device,
            "dtype": dtype,
            "dist_world": world,
            "rank": rank,
        }

    @property
    def tokens(self) -> int:
        """Validation tokens (targets) per evaluation."""
        return int(self.rows.size(0) * (self.rows.size(1) - 1))

    def loss(self) -> float:
        """The mean validation loss, for a metrics line during training."""
        return evaluate_loss(self.model, self.rows, **self._kw)

    def final(self, stop: Callable[[], bool], token_bytes: torch.Tensor | None) -> ValStats:
        """The run's result: loss, standard error and bits per byte; raises ``EvalStopped`` when ``stop``."""
        return val_loss_stats(self.model, self.rows, stop=stop, token_bytes=token_bytes, **self._kw)
