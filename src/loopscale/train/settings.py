"""The training config: [model] + [data] + [optim] + [run], loaded from TOML/YAML with --set overrides.

Here, with the trainer, not in ``loopscale.config``: it computes steps and tokens from a budget through
``loopscale.accounting``, which itself builds on ``config.ModelConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from loopscale import accounting
from loopscale.config import ModelConfig, StrictModel, apply_overrides, load_mapping, validate
from loopscale.config.data import DataConfig
from loopscale.errors import ConfigError
from loopscale.optim import OptimConfig


class RunConfig(StrictModel):
    """Length, batch, evaluation, checkpoints and hardware of one run."""

    budget: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="FLOP budget C; tokens D = C / F (accounting)"
    )
    tokens: float | None = Field(None, gt=0, allow_inf_nan=False, description="training tokens D (instead of budget)")
    steps: int | None = Field(None, gt=0, description="optimiser steps (instead of budget or tokens)")
    batch_size: int = Field(32, gt=0, description="rows of T tokens per optimiser step, all ranks together")
    micro_batch: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(
        None,
        description="rows per forward pass (the rest is gradient accumulation); None: all rows of a "
        "process; 'auto': the most that fit the device's memory (loopscale.memory)",
    )
    seed: int = Field(0, ge=0, description="model init; data order comes from data.seed")
    min_steps: int = Field(20, ge=1, description="refuse runs shorter than this many steps")
    val_tokens: int = Field(131072, gt=0, description="held-out tokens for the validation loss")
    eval_every: int = Field(0, ge=0, description="validation every N steps (0: only at the end)")
    log_every: int = Field(10, gt=0)
    ckpt_every: int = Field(
        100, ge=0, description="checkpoint every N steps (0: only on a signal); always one before the final evaluation"
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="autocast dtype; auto = bfloat16 on CUDA, float32 on CPU"
    )
    compile: Literal["auto", "off", "blocks", "model"] = Field(
        "auto",
        description="torch.compile: model = the whole forward and loss in one graph (per block if "
        "that fails), blocks = each block, off; auto = model on CUDA, off on CPU (true/false: blocks/off)",
    )
    fused_loss: bool = Field(
        True,
        description="head, softcap and cross-entropy by row chunks with the "
        "gradient in the same pass (model/loss.py); false: plain autograd over all logits",
    )
    threads: int | None = Field(
        None,
        gt=0,
        description="torch threads (default: available cores, or a local sweep slot's share of them, / ranks)",
    )
    keep_checkpoint: bool = Field(False, description="keep ckpt.pt after a finished run")
    track: Literal["none", "wandb", "tensorboard"] = "none"
    wandb_project: str | None = Field(None, description="W&B project (default: $WANDB_PROJECT, else loopscale)")
    wandb_entity: str | None = Field(None, description="W&B entity (default: $WANDB_ENTITY, else your default)")
    fail_at_step: int | None = Field(None, ge=0, description="testing: raise at this step")

    @model_validator(mode="before")
    @classmethod
    def _compile_bool(cls, data: Any) -> Any:
        """``compile = true`` meant per-block compilation before the modes existed."""
        if isinstance(data, dict) and isinstance(data.get("compile"), bool):
            data = {**data, "compile": "blocks" if data["compile"] else "off"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _micro_batch(cls, data: Any) -> Any:
        """One line for a bad micro_batch instead of pydantic's report on each member of the union."""
        v = data.get("micro_batch") if isinstance(data, dict) else None
        ok = v is None or v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
        if not ok:
            raise ConfigError("micro_batch", 'expected a positive number of rows or "auto"', value=v)
        return data

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        given = [k for k in ("budget", "tokens", "steps") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ConfigError(given[1], f"give only one of budget, tokens, steps (also set: {given[0]})")
        if isinstance(self.micro_batch, int) and self.batch_size % self.micro_batch:
            raise ConfigError("micro_batch", f"must divide batch_size={self.batch_size}", value=self.micro_batch)
        return self


DEFAULT_STEPS = 200
# Sanity bounds on a run's length: a typo'd exponent (budget = 1e40) is refused, not started. 1e15 tokens is
# ~30x the largest published LM training sets; 1e9 steps is years at a millisecond per step.
MAX_STEPS = 10**9
MAX_TOKENS = 1e15
DEFAULT_MODEL: dict[str, Any] = {
    "d_model": 64,
    "head_dim": 16,
    "L_eff": 12,
    "n_prelude": 2,
    "n_coda": 2,
    "r": 4,
    "seq_len": 256,
    "vocab_size": 257,
}


class TrainConfig(StrictModel):
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(**DEFAULT_MODEL))
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=lambda: RunConfig(steps=DEFAULT_STEPS))

    @property
    def tokens_per_step(self) -> int:
        return self.run.batch_size * self.model.seq_len

    def total_steps(self) -> int:
        """Steps from budget, tokens or steps (budget: round(C / (F B T)), as the accounting does)."""
        run = self.run
        if run.steps is not None:
            return run.steps
        if run.tokens is not None:
            return round(run.tokens / self.tokens_per_step)
        if run.budget is not None:
            return accounting.steps_for_budget(self.model, run.budget, self.tokens_per_step)
        raise ConfigError("run", "set one of run.budget, run.tokens or run.steps")

    def lr_tokens(self) -> float:
        """D of the matrix-lr data rule: for a budget run the paper code's target ``int(C / F)`` (not the
        whole steps actually trained), otherwise the planned tokens (arXiv 2604.21106 §4)."""
        if self.run.budget is not None:
            return float(int(accounting.tokens_for_budget(self.model, self.run.budget)))
        if self.run.tokens is not None:
            return float(self.run.tokens)
        return float(self.total_steps() * self.tokens_per_step)

    def lrs(self) -> dict[str, float]:
        """The peak learning rate per optimiser group this run will use (before the schedule)."""
        from loopscale.optim.transfer import resolve_lrs

        return resolve_lrs(
            self.optim,
            d_model=self.model.width,
            tokens_per_step=self.tokens_per_step,
            total_tokens=self.lr_tokens(),
            r=self.model.r,
        )

    def check_length(self) -> int:
        """The run's steps, refused when too short for a meaningful loss or too long to ever finish."""
        steps = self.total_steps()
        tokens = steps * self.tokens_per_step
        if steps > MAX_STEPS or tokens > MAX_TOKENS:
            what = "budget" if self.run.budget else ("tokens" if self.run.tokens else "steps")
            raise ConfigError(
                f"run.{what}",
                f"gives {steps:.3g} steps, {tokens:.3g} tokens: beyond any run that could finish (limits: "
                f"{MAX_STEPS:.0e} steps, {MAX_TOKENS:.0e} tokens, ~30x the largest published LM training set); "
                "check the exponent",
                value=getattr(self.run, what),
            )
        if steps < self.run.min_steps:
            what = "budget" if self.run.budget else ("tokens" if self.run.tokens else "steps")
            f = accounting.train_flops_per_token(self.model)
            raise ConfigError(
                f"run.{what}",
                f"gives {steps} steps of {self.tokens_per_step} tokens (F = {f:.3g} FLOPs/token), fewer than "
                f"run.min_steps={self.run.min_steps}: too short for a meaningful loss; raise it or lower "
                "run.batch_size",
                value=getattr(self.run, what),
            )
        return steps

    def as_toml_dict(self) -> dict[str, Any]:
        """The config as TOML-ready tables; None becomes "none" where the default is not None."""
        data = self.model_dump(mode="json")
        if self.model.softcap is None:
            data["model"]["softcap"] = "none"
        out: dict[str, Any] = _drop_none(data)
        return out


def _drop_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    return obj


def load_train_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Defaults <- file <- --set overrides, validated with one-line errors naming file and field."""
    data: dict[str, Any] = load_mapping(path) if path is not None else {}
    if overrides:
        data = apply_overrides(data, overrides)
    return train_config_from_dict(data, config_source(path, overrides))


def config_source(path: str | Path | None, overrides: list[str] | None = None) -> str:
    """How errors name a config: ``my.toml``, ``my.toml + --set``, ``--set`` or ``defaults``."""
    if path is None:
        return "--set" if overrides else "defaults"
    return f"{path} + --set" if overrides else str(path)


def train_config_from_dict(data: dict[str, Any], source: str = "config") -> TrainConfig:
    """Defaults <- a mapping of [model] [data] [optim] [run] tables (a sweep builds one per run)."""
    for name in ("model", "data", "optim", "run"):
        if name in data and not isinstance(data[name], dict):
            raise ConfigError(
                name,
                f"expected a table ([{name}] in the file, or --set {name}.KEY=VALUE)",
                value=data[name],
                source=source,
            )
    user_model = dict(data.get("model") or {})
    model = dict(DEFAULT_MODEL)
    if "s" in user_model or "d_model" in user_model:
        model.pop("d_model")  # the user's width wins, in either unit
    model.update(user_model)
    run = dict(data.get("run") or {})
    if not any(k in run for k in ("budget", "tokens", "steps")):
        run["steps"] = DEFAULT_STEPS
    merged = {**data, "model": model, "run": run}
    return validate(TrainConfig, merged, source=source)


def describe_length(cfg: TrainConfig) -> dict[str, Any]:
    """Steps, tokens, FLOPs and tokens per parameter of a run, as the accounting computes them."""
    steps = cfg.total_steps()
    f = accounting.train_flops_per_token(cfg.model)
    tokens = steps * cfg.tokens_per_step
    return {
        "steps": steps,
        "tokens": tokens,
        "flops": tokens * f,
        "flops_per_token": f,
        "tokens_per_param": tokens / accounting.N_unique(cfg.model),
    }
