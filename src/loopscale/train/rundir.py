"""A run dir's lifecycle: its default name, the identity check, ``--overwrite``, what is written when the run
starts (config.toml) and ends (weights, the final metrics line, result.json last), and reading its result back.

A run dir holds one run (docs/training.md): rerunning the same command resumes it or returns its result.
Asking it for another config must not silently return (or resume) the first one, so a run dir whose
``config.toml`` differs from the requested config is refused with the differing fields named; and the
default name carries a short hash of the resolved config, so two configs never share a default dir.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from loopscale.errors import ConfigError
from loopscale.io import append_jsonl, atomic_write_json, atomic_write_text
from loopscale.record import RESULT, RecordError, RunRecord

if TYPE_CHECKING:
    import torch

CONFIG = "config.toml"
METRICS = "metrics.jsonl"
TECHNIQUE_HASH = "technique.sha256"  # the sha256 of a user technique's source file, when the run began
# What the trainer (and `loopscale eval`'s per-run cache) writes into a run dir; --overwrite removes only these.
ARTEFACTS = (RESULT, METRICS, "ckpt.pt", "model.safetensors", CONFIG, TECHNIQUE_HASH)
ARTEFACT_DIRS = ("eval", "tb")
# Not part of a run's identity: run.fail_at_step is a testing hook (an injected failure, then a retry); where
# the run is tracked on W&B does not change what it trains.
IGNORED = frozenset({"run.fail_at_step", "run.wandb_project", "run.wandb_entity"})


def config_text(cfg: Any) -> str:
    """The resolved config as written to ``config.toml``."""
    return tomli_w.dumps(cfg.as_toml_dict())


def config_hash(cfg: Any) -> str:
    """8 hex digits of the resolved config's sha256: different configs get different default dirs."""
    return hashlib.sha256(config_text(cfg).encode()).hexdigest()[:8]


def default_run_dir(cfg: Any) -> Path:
    """``runs/r<r>-d<d>-s<seed>-<hash>`` (the name `loopscale train --help` shows)."""
    return Path("runs") / f"r{cfg.model.r}-d{cfg.model.width}-s{cfg.run.seed}-{config_hash(cfg)}"


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_diff(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``key: stored -> wanted`` for every field that differs (missing on one side shows as 'unset')."""
    a, b = _flat(stored), _flat(wanted)
    diffs = []
    for key in sorted((set(a) | set(b)) - IGNORED):
        if a.get(key, ...) != b.get(key, ...):
            diffs.append(f"{key}: {_show(a.get(key, ...))} -> {_show(b.get(key, ...))}")
    return diffs


def _show(v: Any) -> str:
    return "unset" if v is ... else repr(v)


def _stored_config(path: Path) -> dict[str, Any]:
    """The stored config, resolved with today's defaults (a field added since then is not a difference)."""
    import tomllib

    from loopscale.train.settings import train_config_from_dict

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            "--out",
            f"{path} cannot be read ({exc}); pass --overwrite to start afresh in this dir, or choose a new --out",
        ) from None
    try:
        return train_config_from_dict(raw, str(path)).as_toml_dict()
    except ConfigError:
        return raw


def check_run_dir(run_dir: Path, cfg: Any) -> None:
    """Refuse a run dir (finished or not) whose stored config differs from ``cfg``, naming the fields."""
    check_out_path(run_dir)
    path = run_dir / CONFIG
    if not path.is_file():
        return
    diffs = config_diff(_stored_config(path), cfg.as_toml_dict())
    if diffs:
        shown = "; ".join(diffs[:6]) + (f"; +{len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise ConfigError(
            "--out",
            f"{run_dir} holds a run of a different config ({shown}); choose a new --out "
            "(or leave --out unset: the default dir name carries the config's hash), or pass "
            "--overwrite to discard that run",
            value=str(run_dir),
        )
    _check_technique_code(run_dir, cfg)


def _check_technique_code(run_dir: Path, cfg: Any) -> None:
    """A run of a user's technique resumes only with the code it began with (its source file's sha256)."""
    stored = run_dir / TECHNIQUE_HASH
    if cfg.model.technique is None or not stored.is_file():
        return
    from loopscale import technique

    then, now = stored.read_text(encoding="utf-8").strip(), str(technique.source_sha256(cfg.model))
    if then != now:
        raise ConfigError(
            "model.technique",
            f"the code of {cfg.model.technique} changed since {run_dir} began "
            f"(sha256 {then[:12]} then, {now[:12]} now); restore it, train into a new --out, or pass "
            "--overwrite to discard that run",
            value=cfg.model.technique,
        )


def check_out_path(run_dir: Path) -> None:
    """--out must be a dir we can create and write: not an existing file, not under a file, not read-only."""
    import os

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("--out", "is an existing file, not a run dir; choose a dir", value=str(run_dir))
    probe = run_dir
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError("--out", f"{probe} is a file, so the run dir cannot be made under it", value=str(run_dir))
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError("--out", f"{probe} is not writable; choose a dir you can write", value=str(run_dir))


def clear_run_dir(run_dir: Path) -> None:
    """--overwrite: remove what a previous run left (only the trainer's own files, never anything else)."""
    for name in ARTEFACTS:
        (run_dir / name).unlink(missing_ok=True)
    for name in ARTEFACT_DIRS:
        if (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name)
    for tmp in run_dir.glob(".*.tmp") if run_dir.is_dir() else ():
        tmp.unlink(missing_ok=True)


# ---- a run's start and end on disk ---------------------------------------------------------------------------------
def prepare_dir(run_dir: Path, cfg: Any, is_main: bool) -> None:
    """Make the run dir and write its config (and a technique's source hash) once the data has loaded."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        check_run_dir(run_dir, cfg)  # again: another process may have written it meanwhile
        if is_main:
            atomic_write_text(run_dir / CONFIG, config_text(cfg))
            if cfg.model.technique is not None:  # the code's version, so a resume cannot pick up edited code
                from loopscale import technique

                atomic_write_text(run_dir / TECHNIQUE_HASH, f"{technique.source_sha256(cfg.model)}\n")
    except OSError as exc:
        raise ConfigError("--out", f"cannot write the run dir: {exc.strerror or exc}", value=str(run_dir)) from None


def read_result(run_dir: str | Path) -> RunRecord | None:
    """The run's result.json as its record; None when there is none or it is no valid record (a file cut short:
    the run is not finished, and training again rewrites it)."""
    try:
        return RunRecord.read(Path(run_dir) / RESULT)
    except RecordError:
        return None


def write_record(run_dir: Path, record: RunRecord) -> None:
    """result.json, atomically: the run is at a terminal status (ok, diverged, failed)."""
    atomic_write_json(run_dir / RESULT, record.dump())


def write_result(run_dir: Path, result: RunRecord, model: torch.nn.Module, *, keep_checkpoint: bool) -> None:
    """The run's end on disk: weights and the final metrics line (status ok), then result.json, which marks
    the run finished, last; then the checkpoint goes (unless kept)."""
    from loopscale.train import checkpoint as ck

    if result.status == "ok":
        ck.save_weights(run_dir, model)
        append_jsonl(
            run_dir / METRICS,
            {
                "step": result.steps,
                "tokens": result.D,
                "val_loss": result.val_loss,
                "val_bpb": result.val_bpb,
                "final": True,
            },
        )
    write_record(run_dir, result)
    if not keep_checkpoint:
        (run_dir / ck.CKPT).unlink(missing_ok=True)
