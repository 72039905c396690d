"""What every result.json of a run carries besides its outcome: the accounting and the template the runs table
and the fit read (``loopscale.record.RunRecord``), and the record of a run that failed.

One place for both, so that the trainer, a pack's member and a sweep's failure bookkeeping (``sweep.attempt``)
write the same columns.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from loopscale import accounting
from loopscale.record import RunRecord
from loopscale.train.settings import TrainConfig


def result_fields(cfg: TrainConfig) -> dict[str, Any]:
    """The accounting columns every result carries (the runs table reads them)."""
    m = cfg.model
    a = accounting.account(m)
    own: dict[str, Any] = {}
    if m.technique is not None:  # a user's technique: which code, in which version, made the run
        from loopscale import technique

        own = {"technique": m.technique, "technique_sha256": technique.source_sha256(m)}
    return {
        **own,
        "r": m.r,
        "d_model": m.width,
        "n_prelude": m.n_prelude,
        "n_recur": m.n_recur,
        "n_coda": m.n_coda,
        "L_eff": m.L_eff,
        "layout": m.layout,
        "injection": m.builtin_injection,
        "bptt_k": m.bptt_k,
        "N_once": a.N_once,
        "N_rec": a.N_rec,
        "N_emb": a.N_emb,
        "N_norm": a.N_norm,
        "N_total": a.N_total,
        "flops_per_token": a.flops_per_token,
        "seq_len": m.seq_len,
        "batch_size": cfg.run.batch_size,
        # the architecture template, so a fit can rebuild the accounting for other widths
        "vocab_size": m.vocab_size,
        "vocab_multiple": m.vocab_multiple,
        "head_dim": m.head_dim,
        "mlp_ratio": m.mlp_ratio,
        "hc_lanes": m.hc_lanes,
    }


def failure_record(cfg: TrainConfig, exc: BaseException, t_start: float) -> RunRecord:
    """result.json status 'failed': the error and the traceback being handled, the config's columns, the wall time."""
    from loopscale.train.hardware import versions

    return RunRecord(
        status="failed",
        error=f"{type(exc).__name__}: {exc}",
        traceback=traceback.format_exc(),
        **result_fields(cfg),
        wall_s=time.time() - t_start,
        versions=versions(),
    )
