"""One training run: config -> run dir with metrics.jsonl, checkpoints, weights and result.json.

The trainer composes small parts and owns only the loop: the run dir's lifecycle is ``train.rundir``'s, the
validation ``train.validate``'s, the micro-batches ``train.microbatch``'s, the record's columns ``train.result``'s
and the progress line ``train.progress``'s. Contract with the rest of loopscale:

* ``result.json`` is written (atomically) exactly when the run reaches a terminal status:
  ``ok``, ``diverged`` (non-finite or exploding loss) or ``failed`` (an exception, recorded with
  its message and traceback); interrupted runs leave a checkpoint and no result;
* a run dir with ``result.json`` status ok is finished: calling ``train`` again returns it;
* otherwise ``train`` resumes from ``ckpt.pt`` and continues the exact trajectory (data position
  from the step number, model and optimiser state from the checkpoint).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import torch

from loopscale import accounting
from loopscale.errors import ConfigError, LoopscaleError
from loopscale.io import append_jsonl, atomic_write_text, read_jsonl
from loopscale.model import LoopedLM, cpu_kernels
from loopscale.optim import build_optimizers
from loopscale.record import RunRecord
from loopscale.signals import STOP_OR_WARN, StopSignals, second_ctrl_c_stops_at_once
from loopscale.train import checkpoint as ck
from loopscale.train import microbatch, rundir
from loopscale.train.batches import TokenData, load_token_data
from loopscale.train.compiling import compile_for_training, resolved_mode
from loopscale.train.hardware import (
    autocast,
    hardware_info,
    peak_flops,
    resolved_dtype,
    setup_dist,
    setup_threads,
    tune_cpu_malloc,
    versions,
)
from loopscale.train.microbatch import MicroBatches
from loopscale.train.progress import ProgressBar
from loopscale.train.result import failure_record, result_fields
from loopscale.train.rundir import METRICS, prepare_dir, read_result, write_record, write_result
from loopscale.train.settings import TrainConfig
from loopscale.train.track import make_tracker
from loopscale.train.validate import EvalStopped, Validator, ValStats, any_rank, val_token_bytes


class RunInterrupted(LoopscaleError):
    """SIGTERM/SIGINT: a checkpoint was saved; rerunning the same command resumes."""

    def __init__(self, message: str, signum: int | None = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = int(signal.SIGTERM if signum is None else signum)
        self.exit_code = 128 + self.signum


class TrainingFailed(LoopscaleError):
    """The run raised; result.json holds status 'failed' and the error (exit status 1: not a usage error)."""

    exit_code = 1


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    progress: bool = True,
    on_step: Any = None,
    overwrite: bool = False,
    source: str | None = None,
    progress_every: int | None = None,
) -> RunRecord:
    """Run (or resume, or return the finished) training run in ``run_dir``. Returns its result.json's record.

    A run dir holding a different config is refused (``rundir.check_run_dir``) unless ``overwrite``, which
    discards what the dir holds and trains afresh. The data is loaded and checked before anything is written;
    ``source`` (the config file) names config errors raised here without one (data, length, memory).
    ``progress``: a bar on a terminal, else a plain line every ``progress_every`` steps (default 5 % of the run).
    Raises RunInterrupted on SIGTERM/SIGINT (after checkpointing) and TrainingFailed when the run
    raised (after recording it). ``on_step(step, total)`` is called after every step (sweep progress).
    """
    run_dir = Path(run_dir)
    with named_source(source):
        if overwrite:
            rundir.check_out_path(run_dir)
        else:
            rundir.check_run_dir(run_dir, cfg)
            done = read_result(run_dir)
            if done is not None and done.status == "ok":
                ck.tidy_finished(run_dir, keep_checkpoint=cfg.run.keep_checkpoint)  # a kill may have left ckpt.pt
                return done
        total_steps = cfg.check_length()
        if cfg.model.technique is not None:  # its contract, before the run dir exists: a refused one writes nothing
            from loopscale import technique

            technique.cost(cfg.model)
        dist, device = setup_dist(cfg.run.device)
        threads = setup_threads(cfg.run.threads, dist)
        if device.type == "cpu":
            tune_cpu_malloc()
            # built here, before the run dir exists (a bad LOOPSCALE_CPU_KERNELS is refused); a missing compiler is said
            if cpu_kernels.library() is None and dist.is_main and cpu_kernels.status().startswith("unavailable"):
                warn(f"compiled CPU kernels {cpu_kernels.status()} (slower; docs/model.md)")
        t_start = time.time()
        try:
            data = load_data(cfg)
        except LoopscaleError:
            raise  # nothing written: the run dir is made only for data that loads
        except Exception as exc:
            _record_failure(run_dir, cfg, exc, t_start, dist.is_main, prepare=True)
        if overwrite and dist.is_main:
            rundir.clear_run_dir(run_dir)
        if overwrite and dist.world > 1:
            torch.distributed.barrier()
        prepare_dir(run_dir, cfg, dist.is_main)
    try:
        with named_source(source):
            ctx = RunContext(
                cfg,
                run_dir,
                total_steps,
                dist,
                device,
                threads,
                t_start,
                data,
                progress=progress,
                progress_every=progress_every,
                on_step=on_step,
            )
            return _train(ctx)
    except (RunInterrupted, KeyboardInterrupt):
        raise
    except LoopscaleError:
        raise
    except Exception as exc:
        _record_failure(run_dir, cfg, exc, t_start, dist.is_main)


@contextmanager
def named_source(source: str | None) -> Iterator[None]:
    """Config errors raised without a file (data, length, memory) name the config they came from."""
    try:
        yield
    except ConfigError as err:
        if err.source is None and source and not err.field.startswith("--"):  # --out is no file's
            raise err.with_source(source) from None
        raise


def _record_failure(
    run_dir: Path, cfg: TrainConfig, exc: Exception, t_start: float, is_main: bool, prepare: bool = False
) -> NoReturn:
    """Write result.json status 'failed' (error and traceback) and raise TrainingFailed."""
    if is_main:
        if prepare:
            prepare_dir(run_dir, cfg, True)
        write_record(run_dir, failure_record(cfg, exc, t_start))
    raise TrainingFailed(f"{run_dir}: run failed: {type(exc).__name__}: {exc}") from exc


def load_data(cfg: TrainConfig) -> TokenData:
    """The run's token data, checked against the model's vocabulary."""
    data: TokenData = load_token_data(cfg.data, cfg.model.seq_len)
    if cfg.model.vocab_size < data.tokenizer.vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"smaller than the tokenizer's vocabulary ({data.tokenizer.vocab_size})",
            value=cfg.model.vocab_size,
        )
    max_id = data.max_id  # from the cache's meta.json: no scan of the mapped rows in every rank
    if max_id >= cfg.model.vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"the data holds token id {max_id}; set vocab_size > {max_id} (tokenizer and data do not match)",
            value=cfg.model.vocab_size,
        )
    return data


# ---- the pieces of a run (after torchtitan's train / train_step / forward_backward_step, its validator
# and its checkpointer's should-save): each is small and tested alone; ``_train`` only strings them together.


def should_log(done_steps: int, total_steps: int, log_every: int) -> bool:
    """A metrics line after every ``log_every`` steps and after the last step."""
    return done_steps % log_every == 0 or done_steps == total_steps


def should_validate(done_steps: int, total_steps: int, eval_every: int | None) -> bool:
    """A periodic validation every ``eval_every`` steps (0: none); never after the last step, which the
    final evaluation (more tokens, with its standard error) scores instead."""
    if not eval_every:
        return False
    return done_steps % eval_every == 0 and done_steps < total_steps


def should_checkpoint(done_steps: int, total_steps: int, ckpt_every: int | None, *, stopping: bool = False) -> bool:
    """Save ``ckpt.pt`` every ``ckpt_every`` steps (0: never periodically) and whenever a signal stops the run;
    not after the last step, which ``_train`` saves before the final evaluation."""
    if stopping:
        return True
    if not ckpt_every:
        return False
    return done_steps % ckpt_every == 0 and done_steps < total_steps


def diverged(loss: float, limit: float) -> bool:
    """A non-finite loss, or one above ``limit`` (twice a uniform guess's plus one): the run cannot recover."""
    return not math.isfinite(loss) or loss > limit


class Batching(NamedTuple):
    """How a step's ``batch`` rows are split: ``per_rank`` rows per process, in ``n_micro`` micro-batches of
    ``micro`` rows (gradient accumulation); ``val_micro`` rows per validation batch."""

    batch: int
    per_rank: int
    micro: int
    n_micro: int
    val_micro: int
    plan: MicroBatches

    @classmethod
    def for_run(cls, cfg: TrainConfig, device: torch.device, world: int, pack: int = 1) -> Batching:
        """``pack``: the run trains as one of that many members of a pack (``train.pack``; the memory is theirs)."""
        B = cfg.run.batch_size
        if B % world:
            raise ConfigError("run.batch_size", f"must be divisible by the {world} processes", value=B)
        per_rank = B // world
        mb = microbatch.on_device(cfg, device, world, pack)
        micro, val_micro = mb.train or 1, mb.val or 1
        if per_rank % micro:
            raise ConfigError("run.micro_batch", f"must divide the {per_rank} rows per process", value=micro)
        return cls(B, per_rank, micro, per_rank // micro, val_micro, mb)


class Step(NamedTuple):
    """What a training step needs besides its number: the model as trained (DDP and/or compiled), the plain
    model's DDP wrapper (for ``no_sync``), the optimisers, the data and where and how to compute."""

    train_model: Any
    ddp: torch.nn.parallel.DistributedDataParallel | None
    opt: Any
    data: TokenData
    batching: Batching
    data_seed: int
    device: torch.device
    dtype: str
    rank: int
    world: int


def forward_backward_step(s: Step, x: torch.Tensor, y: torch.Tensor, *, last: bool) -> torch.Tensor:
    """One micro-batch: the loss (detached) after adding its share of the gradient. DDP all-reduces the
    gradients only at the ``last`` micro-batch of a step (``no_sync`` before), once per step."""
    sync = nullcontext() if (s.ddp is None or last) else s.ddp.no_sync()
    with sync, autocast(s.device, s.dtype):
        loss = s.train_model(x, y)
    (loss / s.batching.n_micro).backward()
    return loss.detach()


def train_step(s: Step, step: int, total_steps: int) -> tuple[float, float]:
    """Step ``step``: the learning rate, every micro-batch of this process's rows, the optimiser update.
    Returns (the step's training loss averaged over micro-batches and processes, the learning-rate multiplier).

    The rows of step ``step`` depend on the step number only, so a resumed run sees the same data.
    """
    b = s.batching
    lr_mult = s.opt.set_lr_for_step(step, total_steps)
    loss_sum = torch.zeros((), device=s.device)
    for m_i in range(b.n_micro):
        lo = s.rank * b.per_rank + m_i * b.micro
        x, y = s.data.batch(step, b.batch, lo, lo + b.micro, seed=s.data_seed)
        x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
        loss_sum += forward_backward_step(s, x, y, last=m_i == b.n_micro - 1)
    s.opt.step()
    s.opt.zero_grad(set_to_none=True)
    step_loss = loss_sum / b.n_micro
    if s.world > 1:
        torch.distributed.all_reduce(step_loss, op=torch.distributed.ReduceOp.AVG)
    return float(step_loss), lr_mult


class Meter:
    """Tokens per second since the last metrics line."""

    def __init__(self) -> None:
        self.t, self.tokens = time.time(), 0

    def rate(self) -> float | None:
        dt = time.time() - self.t
        return self.tokens / dt if dt > 0 else None

    def reset(self) -> None:
        self.t, self.tokens = time.time(), 0


def step_record(
    done_steps: int,
    tokens_per_step: int,
    lr_mult: float,
    loss: float,
    meter: Meter,
    f_token: float,
    peak: float | None,
    world: int,
    device: torch.device,
) -> dict[str, Any]:
    """A metrics.jsonl line: progress, loss, throughput, model FLOPs utilisation and CUDA memory."""
    rec: dict[str, Any] = {
        "step": done_steps,
        "tokens": done_steps * tokens_per_step,
        "lr_mult": lr_mult,
        "train_loss": loss,
        "tokens_per_s": meter.rate(),
    }
    rec["flops_per_s"] = (rec["tokens_per_s"] or 0) * f_token
    if peak:
        rec["mfu"] = rec["flops_per_s"] / (peak * world)
    if device.type == "cuda":
        rec["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    return rec


def model_and_optimizers(cfg: TrainConfig, device: torch.device) -> tuple[LoopedLM, Any]:
    """The model, initialised from ``run.seed``, and its optimisers (learning rates for the run's length)."""
    torch.manual_seed(cfg.run.seed)
    model = LoopedLM(cfg.model).to(device)
    opt = build_optimizers(
        model.param_groups(),
        cfg.optim,
        d_model=cfg.model.width,
        tokens_per_step=cfg.tokens_per_step,
        total_tokens=cfg.lr_tokens(),
        r=cfg.model.r,
    )
    model.fused_loss = cfg.run.fused_loss
    return model, opt


def resume(run_dir: Path, model: torch.nn.Module, opt: Any, is_main: bool) -> tuple[int, float, float]:
    """Load ``ckpt.pt`` if there is one: (the step to start at, wall seconds of earlier sessions, the last
    training loss); metrics lines past the checkpoint are dropped (they will be redone)."""
    state = ck.load_checkpoint(run_dir, is_main=is_main)
    if state is None:
        if is_main:
            (run_dir / METRICS).unlink(missing_ok=True)
        return 0, 0.0, float("nan")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    torch.set_rng_state(state["torch_rng"])
    start = int(state["step"])
    extra = state.get("extra", {})
    if is_main:
        kept = [r for r in read_jsonl(run_dir / METRICS) if r.get("step", -1) <= start and not r.get("final")]
        atomic_write_text(run_dir / METRICS, "".join(_jsonl(r) for r in kept))
    # wall_s counts every session; the loss is the result's when only the evaluation is left
    return start, float(extra.get("wall_s", 0.0)), float(extra.get("train_loss", math.nan))


@dataclass
class RunContext:
    """One session of a run as ``train`` set it up (the config, its dir and length, processes, device, threads,
    data, progress), handed once to ``_train`` and ``run_record``."""

    cfg: TrainConfig
    run_dir: Path
    total_steps: int
    dist: Any
    device: torch.device
    threads: int
    t_start: float  # when the run started: this session's start, less earlier sessions' wall time after a resume
    data: TokenData
    progress: bool = True
    progress_every: int | None = None
    on_step: Any = None


class Outcome(NamedTuple):
    """How the loop ended: the status, the final estimate, the last training loss, the steps done, and how the
    session ran (validation tokens, autocast dtype, compile mode, micro-batches)."""

    status: str
    final: ValStats
    train_loss: float
    steps: int
    val_tokens: int
    dtype: str
    compile_mode: Any
    plan: MicroBatches


def _train(ctx: RunContext) -> RunRecord:
    """The loop: steps (``train_step``), metrics and validation, checkpoints and signals, then the final
    evaluation and result.json (``run_record``, ``write_result``)."""
    cfg, run_dir, dist, device, data = ctx.cfg, ctx.run_dir, ctx.dist, ctx.device, ctx.data
    total_steps, run, on_step = ctx.total_steps, cfg.run, ctx.on_step
    batching = Batching.for_run(cfg, device, dist.world)
    val_rows = data.val_rows(run.val_tokens)
    if dist.is_main and val_rows.shape[0] * cfg.model.seq_len < run.val_tokens:
        warn(
            f"run.val_tokens = {run.val_tokens:,} but the validation split holds "
            f"{val_rows.shape[0] * cfg.model.seq_len:,} tokens: validating on all of them"
        )

    f_token = accounting.train_flops_per_token(cfg.model)
    tokens_per_step = cfg.tokens_per_step
    model, opt = model_and_optimizers(cfg, device)
    start, wall_before, last_loss = resume(run_dir, model, opt, dist.is_main)
    ctx.t_start -= wall_before
    t_start = ctx.t_start
    ddp = None
    if dist.world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    train_model, _ = compile_for_training(
        ddp or model, model.blocks(), run.compile, device, warn=warn if dist.is_main else None
    )
    dtype = resolved_dtype(device, run.dtype)
    peak = peak_flops(device, run.dtype)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    diverge_at = 2.0 * math.log(cfg.model.vocab_size) + 1.0
    s = Step(train_model, ddp, opt, data, batching, cfg.data.seed, device, dtype, dist.rank, dist.world)
    validator = Validator(
        model, val_rows, micro_batch=batching.val_micro, device=device, dtype=dtype, world=dist.world, rank=dist.rank
    )

    bar = ProgressBar(
        ctx.progress and dist.is_main,
        total_steps,
        start,
        run_dir.name,
        every=ctx.progress_every,
        tokens_per_step=tokens_per_step,
    )
    tracker = make_tracker(run.track if dist.is_main else "none", run_dir, cfg.as_toml_dict())
    status, final = "ok", ValStats(float("nan"), float("nan"), None)
    meter = Meter()
    done_steps = start

    def save(step: int) -> None:
        ck.save_checkpoint(
            run_dir,
            model=model,
            optimizers=opt,
            step=step,
            extra={"wall_s": time.time() - t_start, "train_loss": last_loss},
        )

    with StopSignals(STOP_OR_WARN, second_ctrl_c_stops_at_once) as sig, bar:  # also in the final evaluation
        model.train()
        for step in range(start, total_steps):
            if run.fail_at_step is not None and step == run.fail_at_step:
                raise RuntimeError(f"injected failure at step {step} (run.fail_at_step)")
            last_loss, lr_mult = train_step(s, step, total_steps)
            meter.tokens += tokens_per_step
            done_steps = step + 1
            if diverged(last_loss, diverge_at):
                status = "diverged"
                break
            is_eval = should_validate(done_steps, total_steps, run.eval_every)
            if is_eval or should_log(done_steps, total_steps, run.log_every):
                rec = step_record(
                    done_steps, tokens_per_step, lr_mult, last_loss, meter, f_token, peak, dist.world, device
                )
                if is_eval:
                    rec["val_loss"] = validator.loss()
                if dist.is_main:
                    append_jsonl(run_dir / METRICS, rec)
                    tracker.log(rec)
                meter.reset()
            bar.advance(last_loss)
            if on_step is not None:
                on_step(done_steps, total_steps)
            stop = any_rank(sig.caught is not None, device, dist.world)
            if should_checkpoint(done_steps, total_steps, run.ckpt_every, stopping=stop) and dist.is_main:
                save(done_steps)
            if stop:
                if dist.world > 1:
                    torch.distributed.barrier()
                raise RunInterrupted(
                    f"{run_dir}: stopped by signal {sig.caught} at step {done_steps}/"
                    f"{total_steps}; checkpoint saved, rerun to resume",
                    sig.caught,
                )

        measured = measured_peak(device)
        if status == "ok":
            # The final evaluation can take minutes (tens of millions of tokens): checkpoint first, so a
            # preemption during it costs only the evaluation. A run resumed with every step done comes here.
            if start < total_steps and dist.is_main:
                save(total_steps)
            bar.note(f"final evaluation on {validator.tokens:,} validation tokens")
            try:
                final = validator.final(lambda: sig.caught is not None, val_token_bytes(cfg, data))
            except EvalStopped:
                raise RunInterrupted(
                    f"{run_dir}: stopped by signal {sig.caught} during the final evaluation; "
                    f"checkpoint at step {total_steps}/{total_steps} saved, rerun to evaluate",
                    sig.caught,
                ) from None
            if not math.isfinite(final.loss):
                status = "diverged"
            elif dist.is_main:  # the final validation reaches the tracker too, then it closes
                tracker.log(
                    {"step": total_steps, "val_loss": final.loss, "val_loss_se": final.se, "val_bpb": final.bpb}
                )
        tracker.close()
    compiled = getattr(train_model, "mode", resolved_mode(run.compile, device))
    result = run_record(
        ctx, Outcome(status, final, last_loss, done_steps, validator.tokens, dtype, compiled, batching.plan)
    )
    if measured is not None:  # CUDA: what the allocator saw, beside the prediction (training, then validation)
        result.measured_peak_bytes = measured
        result.measured_val_peak_bytes = measured_peak(device) if status == "ok" else None
    if status == "diverged":
        result.error = f"loss {last_loss:.4g} at step {result.steps} (non-finite or above {diverge_at:.3g})"
    if dist.is_main:
        write_result(run_dir, result, model, keep_checkpoint=cfg.run.keep_checkpoint)
    if dist.world > 1:
        torch.distributed.barrier()
    return result


def run_record(ctx: RunContext, end: Outcome) -> RunRecord:
    """result.json's record (the runs table's columns): the final estimate, the tokens and FLOPs, the setup."""
    cfg, final = ctx.cfg, end.final
    f_token = accounting.train_flops_per_token(cfg.model)
    tokens = end.steps * cfg.tokens_per_step
    ok = end.status == "ok"
    return RunRecord(
        status=end.status,
        val_loss=final.loss if ok else None,
        val_loss_se=final.se if ok and math.isfinite(final.se) else None,
        val_bpb=final.bpb if ok else None,
        train_loss=end.train_loss,
        steps=end.steps,
        total_steps=ctx.total_steps,
        D=tokens,
        C=cfg.run.budget if cfg.run.budget else tokens * f_token,
        flops=tokens * f_token,
        val_tokens=end.val_tokens,
        **result_fields(cfg),
        tokens_per_param=tokens / (accounting.N_unique(cfg.model)),
        wall_s=time.time() - ctx.t_start,
        dtype=end.dtype,
        world_size=ctx.dist.world,
        hardware=hardware_info(ctx.device),
        versions=versions(),
        data_fingerprint=ctx.data.fingerprint,
        threads=ctx.threads,
        compile=end.compile_mode,
        **end.plan.record(),
    )


def measured_peak(device: torch.device) -> int | None:
    """CUDA's peak allocated bytes since the last reset (then reset), or None on CPU."""
    if device.type != "cuda":
        return None
    peak = int(torch.cuda.max_memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def warn(message: str) -> None:
    import sys

    print(f"warning: {message}", file=sys.stderr, flush=True)


def _jsonl(rec: dict[str, Any]) -> str:
    import json

    return json.dumps(rec) + "\n"
