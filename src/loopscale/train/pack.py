"""A pack: k same-shaped runs trained as one stacked model in one process (docs/training.md, "Packs").

A pack is a run's engine, not a new kind of run. Each member keeps its own run dir, config, data stream (the
rows of its own step number), RNG, optimiser state and learning rates (its schedule at its own step),
checkpoints, metrics, final evaluation and result.json, written as ``train`` writes them; members may stand at
different steps (one resumed further than another) and leave the pack at their own end. The stacked model
(``model/packed.py``) and optimisers (``optim/packed.py``) compute each member as its solo run does;
validation runs on each member's own ``LoopedLM`` (whose parameters view the pack's stacks), through the solo
code. A member that diverges, raises on its own (an injected failure, its checkpoint's disk) or whose data will
not load is set aside with its result.json and the others go on; an error in the shared step fails every member
still training (each recorded, retryable). SIGTERM/SIGINT checkpoint every member still training, then
``RunInterrupted``; a rerun resumes each from its own checkpoint.

``train_pack`` returns one ``MemberEnd`` per member (in the order given) and never raises for a member's sake.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from loopscale import accounting
from loopscale.errors import ConfigError, LoopscaleError
from loopscale.io import append_jsonl
from loopscale.model import LoopedLM, cpu_kernels
from loopscale.model.packed import PackedLM, technique_packable
from loopscale.optim.packed import PackedOptimizers
from loopscale.record import RunRecord
from loopscale.signals import STOP_OR_WARN, StopSignals, second_ctrl_c_stops_at_once
from loopscale.train import checkpoint as ck
from loopscale.train import rundir
from loopscale.train.batches import TokenData
from loopscale.train.hardware import (
    hardware_info,
    peak_flops,
    resolved_dtype,
    setup_dist,
    setup_threads,
    tune_cpu_malloc,
)
from loopscale.train.loop import (
    Batching,
    Meter,
    Outcome,
    RunContext,
    RunInterrupted,
    diverged,
    load_data,
    model_and_optimizers,
    resume,
    run_record,
    should_checkpoint,
    should_log,
    should_validate,
    step_record,
    warn,
)
from loopscale.train.result import failure_record
from loopscale.train.rundir import METRICS, prepare_dir, read_result, write_record, write_result
from loopscale.train.settings import TrainConfig
from loopscale.train.validate import EvalStopped, Validator, ValStats, val_token_bytes


@dataclass
class MemberEnd:
    """How one member's session ended: ``result`` (result.json's record: ok, diverged or failed), ``config`` (a
    ConfigError: nothing trained, not retryable), ``failed`` (recorded in result.json, retryable) or
    ``interrupted`` (checkpointed by a signal)."""

    kind: str
    result: RunRecord | None = None
    error: str = ""
    traceback: str = ""
    wall_s: float = 0.0
    exc: BaseException | None = None


@dataclass
class _Member:
    """One member while the pack trains."""

    index: int
    ctx: RunContext
    model: LoopedLM
    opt: Any
    batching: Batching
    validator: Validator
    rng: torch.Tensor
    step: int
    last_loss: float
    meter: Meter = field(default_factory=Meter)
    on_step: Callable[[int, int], None] | None = None
    lr_mult: float = 1.0
    pack_size: int = 1  # the pack it started in (its memory plan's)

    @property
    def cfg(self) -> TrainConfig:
        return self.ctx.cfg

    @property
    def run_dir(self) -> Path:
        return self.ctx.run_dir


class _Ends:
    """Each member's end as it happens, handed to ``on_end`` at once (the sweep settles each member then)."""

    def __init__(self, n: int, on_end: Callable[[int, MemberEnd], None] | None) -> None:
        self.ends: list[MemberEnd | None] = [None] * n
        self.on_end = on_end

    def set(self, i: int, e: MemberEnd) -> None:
        self.ends[i] = e
        if self.on_end is not None:
            self.on_end(i, e)

    def done(self, i: int) -> bool:
        return self.ends[i] is not None


def why_not_packable(cfgs: Sequence[TrainConfig]) -> str | None:
    """None if these configs can train as one pack here, else why not (they then train one at a time)."""
    first = cfgs[0]
    if first.model.technique is not None:
        from loopscale import technique

        with torch.device("cpu"):
            why = technique_packable(technique.build(first.model), first.model.width)
        if why is not None:
            return why
    return None


def train_pack(
    cfgs: Sequence[TrainConfig],
    run_dirs: Sequence[str | Path],
    *,
    on_step: Sequence[Callable[[int, int], None] | None] | None = None,
    on_end: Callable[[int, MemberEnd], None] | None = None,
) -> list[MemberEnd]:
    """Train (or resume, or return the finished) runs of the same shape as one pack; one ``MemberEnd`` each.

    ``on_end(i, end)`` is called as soon as member ``i`` ends (its result written, or set aside), while the others
    may still train; it must not raise.

    The configs must agree on everything but what each member keeps for itself (``sweep.packs.pack_key``):
    seeds, lengths, learning rates and schedules, data, logging and checkpoint intervals.
    """
    dirs = [Path(d) for d in run_dirs]
    hooks = list(on_step) if on_step is not None else [None] * len(cfgs)
    ends = _Ends(len(cfgs), on_end)
    totals: dict[int, int] = {}
    for i, (cfg, run_dir) in enumerate(zip(cfgs, dirs, strict=True)):
        try:
            rundir.check_run_dir(run_dir, cfg)
            done = read_result(run_dir)
            if done is not None and done.status == "ok":
                ck.tidy_finished(run_dir, keep_checkpoint=cfg.run.keep_checkpoint)
                ends.set(i, MemberEnd("result", result=done))
                continue
            totals[i] = cfg.check_length()
            if cfg.model.technique is not None:
                from loopscale import technique

                technique.cost(cfg.model)
        except ConfigError as err:
            ends.set(i, MemberEnd("config", error=f"ConfigError: {err}", traceback=traceback.format_exc()))
    if not totals:
        return [e for e in ends.ends if e is not None]
    first = cfgs[next(iter(totals))]
    dist, device = setup_dist(first.run.device)
    if dist.world > 1:  # the executors never pack multi-process runs
        raise ConfigError("run", "a pack trains in one process; run torchrun runs alone")
    threads = setup_threads(first.run.threads, dist)
    if device.type == "cpu":
        tune_cpu_malloc()
        if cpu_kernels.library() is None and cpu_kernels.status().startswith("unavailable"):
            warn(f"compiled CPU kernels {cpu_kernels.status()} (slower; docs/model.md)")
    t_start = time.time()
    datas: dict[str, TokenData] = {}
    members: list[_Member] = []
    for i in totals:
        cfg, run_dir = cfgs[i], dirs[i]
        try:
            key = json.dumps([cfg.data.model_dump(mode="json"), cfg.model.seq_len, cfg.model.vocab_size])
            if key not in datas:
                datas[key] = load_data(cfg)
            prepare_dir(run_dir, cfg, True)
            members.append(
                _setup(i, cfg, run_dir, totals[i], dist, device, threads, t_start, datas[key], hooks[i], len(totals))
            )
        except LoopscaleError as err:
            ends.set(i, MemberEnd("config", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()))
        except Exception as exc:
            ends.set(i, _failed(cfg, run_dir, exc, t_start, prepare=True))
    if members:
        _train_members(members, device, ends)
    return [e if e is not None else MemberEnd("failed", error="no outcome") for e in ends.ends]


def _setup(
    index: int,
    cfg: TrainConfig,
    run_dir: Path,
    total: int,
    dist: Any,
    device: torch.device,
    threads: int,
    t_start: float,
    data: TokenData,
    hook: Callable[[int, int], None] | None,
    pack: int,
) -> _Member:
    """A member as ``train`` would start it: its model and optimisers from its seed, resumed from its checkpoint,
    its RNG state after both (what its solo run's checkpoints would hold), its validation rows."""
    ctx = RunContext(cfg, run_dir, total, dist, device, threads, t_start, data, progress=False)
    batching = Batching.for_run(cfg, device, 1, pack)
    val_rows = data.val_rows(cfg.run.val_tokens)
    if val_rows.shape[0] * cfg.model.seq_len < cfg.run.val_tokens:
        warn(
            f"{run_dir.name}: run.val_tokens = {cfg.run.val_tokens:,} but the validation split holds "
            f"{val_rows.shape[0] * cfg.model.seq_len:,} tokens: validating on all of them"
        )
    model, opt = model_and_optimizers(cfg, device)
    start, wall_before, last_loss = resume(run_dir, model, opt, True)
    ctx.t_start -= wall_before
    rng = torch.get_rng_state()
    dtype = resolved_dtype(device, cfg.run.dtype)
    validator = Validator(model, val_rows, micro_batch=batching.val_micro, device=device, dtype=dtype)
    return _Member(index, ctx, model, opt, batching, validator, rng, start, last_loss, on_step=hook, pack_size=pack)


def _failed(cfg: TrainConfig, run_dir: Path, exc: BaseException, t_start: float, *, prepare: bool = False) -> MemberEnd:
    """A member's own failure: result.json status failed (as ``train`` records it), then its end."""
    tb = traceback.format_exc()
    with contextlib.suppress(OSError):  # its dir cannot be written: the sweep's books record the failure
        if prepare:
            prepare_dir(run_dir, cfg, True)
        write_record(run_dir, failure_record(cfg, exc, t_start))
    return MemberEnd("failed", error=f"{type(exc).__name__}: {exc}", traceback=tb, wall_s=time.time() - t_start)


def _checkpoint(m: _Member, pack_opt: PackedOptimizers | None, slot: int | None, step: int) -> None:
    """The member's ``ckpt.pt``, a solo run's: its weights (copies of its slices), its optimiser state, its RNG."""
    model_state = {k: v.clone() for k, v in m.model.state_dict().items()}
    optim_state = pack_opt.member_state_dict(slot) if pack_opt is not None and slot is not None else m.opt.state_dict()
    ck.save_checkpoint(
        m.run_dir,
        model=_Snapshot(model_state),
        optimizers=_Snapshot(optim_state),
        step=step,
        extra={"wall_s": time.time() - m.ctx.t_start, "train_loss": m.last_loss},
        torch_rng=m.rng,
    )


class _Snapshot:
    """A state dict taken already (``save_checkpoint`` asks its arguments for ``state_dict()``)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state


def _train_members(members: list[_Member], device: torch.device, ends: _Ends) -> None:
    """The pack's loop: every member still training takes one step per pass; each leaves at its own end."""
    first = members[0].cfg
    dtype = resolved_dtype(device, first.run.dtype)
    peak = peak_flops(device, first.run.dtype)
    training = [m for m in members if m.step < m.ctx.total_steps]
    evaluate = [m for m in members if m.step >= m.ctx.total_steps]  # resumed with every step done
    pack: PackedLM | None = None
    popt: PackedOptimizers | None = None

    def rebuild() -> None:
        nonlocal pack, popt
        if not training:
            pack = popt = None
            return
        models = [m.model for m in training]
        if pack is None:
            pack = PackedLM(models)
            names = [{id(p): n for n, p in m.model.named_parameters()} for m in training]
            popt = PackedOptimizers(pack.stacked(), [m.opt for m in training], names)
            return
        assert popt is not None
        keep = [pack.members.index(m.model) for m in training]
        pack.keep(keep)
        popt.keep(keep, pack.stacked())

    def end(m: _Member, e: MemberEnd) -> None:
        ends.set(m.index, e)

    def fail(m: _Member, exc: BaseException) -> None:
        end(m, _failed(m.cfg, m.run_dir, exc, m.ctx.t_start))

    rebuild()
    with StopSignals(STOP_OR_WARN, second_ctrl_c_stops_at_once) as sig:
        for m in evaluate:  # only the final evaluation left
            _finish(m, "ok", dtype, sig, end, fail)
        while training and sig.caught is None:
            failing = [m for m in training if m.cfg.run.fail_at_step is not None and m.step == m.cfg.run.fail_at_step]
            for m in failing:
                try:
                    raise RuntimeError(f"injected failure at step {m.step} (run.fail_at_step)")
                except RuntimeError as exc:
                    fail(m, exc)
            if failing:
                training = [m for m in training if m not in failing]
                rebuild()
                continue
            assert pack is not None and popt is not None
            try:
                losses = _pack_step(pack, popt, training, device, dtype)
            except (KeyboardInterrupt, RunInterrupted):
                raise
            except Exception as exc:  # the shared step: every member still training fails with it
                for m in training:
                    fail(m, exc)
                training = []
                break
            leaving: list[tuple[_Member, str]] = []
            for slot, m in enumerate(training):  # first every member's step, log and hook (a signal may come)
                m.last_loss = losses[slot]
                m.step += 1
                m.meter.tokens += m.cfg.tokens_per_step
                try:
                    if diverged(m.last_loss, 2.0 * math.log(m.cfg.model.vocab_size) + 1.0):
                        leaving.append((m, "diverged"))
                        continue
                    _log(m, peak, device)
                    if m.on_step is not None:
                        m.on_step(m.step, m.ctx.total_steps)
                except Exception as exc:  # this member's own files or hooks
                    fail(m, exc)
                    leaving.append((m, "failed"))
            stop = sig.caught is not None
            for slot, m in enumerate(training):  # then the checkpoints (every member's, when a signal stops)
                if any(m is g for g, _ in leaving):
                    continue
                try:
                    if should_checkpoint(m.step, m.ctx.total_steps, m.cfg.run.ckpt_every, stopping=stop):
                        _checkpoint(m, popt, slot, m.step)
                    if m.step >= m.ctx.total_steps and not stop:
                        _checkpoint(m, popt, slot, m.step)  # before the final evaluation, as train() does
                        leaving.append((m, "ok"))
                except Exception as exc:  # this member's own files
                    fail(m, exc)
                    leaving.append((m, "failed"))
            if leaving:
                gone = [m for m, _ in leaving]
                training = [m for m in training if m not in gone]
                rebuild()
                for m, status in leaving:
                    if status == "diverged" or (status == "ok" and not stop):
                        _finish(m, status, dtype, sig, end, fail)
            if stop:
                break
        if sig.caught is not None:
            for m in training:
                if not ends.done(m.index):
                    ends.set(
                        m.index,
                        MemberEnd(
                            "interrupted",
                            exc=RunInterrupted(
                                f"{m.run_dir}: stopped by signal {sig.caught} at step {m.step}/{m.ctx.total_steps}; "
                                "checkpoint saved, rerun to resume",
                                sig.caught,
                            ),
                        ),
                    )


def _pack_step(
    pack: PackedLM, popt: PackedOptimizers, members: list[_Member], device: torch.device, dtype: str
) -> list[float]:
    """One step of every member (``loop.train_step`` with a member dimension): each member's learning rate at its
    own step, its rows of its own step for every micro-batch, one backward of the members' summed losses (each
    gets its own gradient), the packed update. Returns each member's step loss."""
    from loopscale.train.hardware import autocast

    mults = popt.set_lr_for_steps([m.step for m in members], [m.ctx.total_steps for m in members])
    for m, mult in zip(members, mults, strict=True):
        m.lr_mult = mult
    b = members[0].batching
    k = len(members)
    loss_sum = torch.zeros(k, device=device)
    pack.train()
    for m_i in range(b.n_micro):
        lo = m_i * b.micro
        x, y = _rows(members, lo, lo + b.micro)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, dtype):
            losses = pack(x, y)
        (losses / b.n_micro).sum().backward()
        loss_sum += losses.detach()
    popt.step()
    popt.zero_grad()
    out: list[float] = (loss_sum / b.n_micro).tolist()
    return out


def _rows(members: list[_Member], lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``lo..hi-1`` of each member's batch at its own step, ``[k, rows, T]``: read once when every member
    reads the same stream at the same step (a pack of seeds)."""
    first = members[0]
    same = all(
        m.ctx.data is first.ctx.data and m.step == first.step and m.cfg.data.seed == first.cfg.data.seed
        for m in members
    )
    B = first.batching.batch
    if same:
        x, y = first.ctx.data.batch(first.step, B, lo, hi, seed=first.cfg.data.seed)
        k = len(members)
        return x.unsqueeze(0).expand(k, *x.shape), y.unsqueeze(0).expand(k, *y.shape)
    parts = [m.ctx.data.batch(m.step, B, lo, hi, seed=m.cfg.data.seed) for m in members]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


def _log(m: _Member, peak: float | None, device: torch.device) -> None:
    """The member's metrics line (and periodic validation), as ``train`` writes it."""
    run = m.cfg.run
    is_eval = should_validate(m.step, m.ctx.total_steps, run.eval_every)
    if not (is_eval or should_log(m.step, m.ctx.total_steps, run.log_every)):
        return
    f_token = accounting.train_flops_per_token(m.cfg.model)
    rec = step_record(m.step, m.cfg.tokens_per_step, m.lr_mult, m.last_loss, m.meter, f_token, peak, 1, device)
    if is_eval:
        rec["val_loss"] = m.validator.loss()
    append_jsonl(m.run_dir / METRICS, rec)
    m.meter.reset()


def _finish(
    m: _Member,
    status: str,
    dtype: str,
    sig: StopSignals,
    end: Callable[[_Member, MemberEnd], None],
    fail: Callable[[_Member, BaseException], None],
) -> None:
    """The member's end as ``train`` ends a run: the final evaluation (status ok), then result.json."""
    final = ValStats(float("nan"), float("nan"), None)
    try:
        if status == "ok":
            try:
                final = m.validator.final(lambda: sig.caught is not None, val_token_bytes(m.cfg, m.ctx.data))
            except EvalStopped:
                end(
                    m,
                    MemberEnd(
                        "interrupted",
                        exc=RunInterrupted(
                            f"{m.run_dir}: stopped by signal {sig.caught} during the final evaluation; checkpoint at "
                            f"step {m.ctx.total_steps}/{m.ctx.total_steps} saved, rerun to evaluate",
                            sig.caught,
                        ),
                    ),
                )
                return
            if not math.isfinite(final.loss):
                status = "diverged"
        plan = m.batching.plan
        result = run_record(
            m.ctx,
            Outcome(status, final, m.last_loss, m.step, m.validator.tokens, dtype, "off", plan),
        )
        # the member's own share of the pack's predicted peaks (a solo run's numbers at this micro-batch: the runs
        # table is the same packed or not); the pack's in hardware
        result.predicted_peak_bytes = plan.train_peak / m.pack_size
        result.predicted_val_peak_bytes = plan.val_peak / m.pack_size
        pack_info = {"size": m.pack_size, "predicted_peak_bytes": plan.train_peak}
        result.hardware = {**(result.hardware or hardware_info(m.ctx.device)), "pack": pack_info}
        if status == "diverged":
            limit = 2.0 * math.log(m.cfg.model.vocab_size) + 1.0
            result.error = f"loss {m.last_loss:.4g} at step {result.steps} (non-finite or above {limit:.3g})"
        write_result(m.run_dir, result, m.model, keep_checkpoint=m.cfg.run.keep_checkpoint)
        end(m, MemberEnd("result", result=result))
    except Exception as exc:
        fail(m, exc)
