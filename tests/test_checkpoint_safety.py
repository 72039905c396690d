"""Checkpoints that must not be trusted or kept: code-running pickles, damaged files, leftovers."""

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loopscale import io
from loopscale.errors import ConfigError
from loopscale.train import RunInterrupted, train
from loopscale.train import checkpoint as ck
from test_train import cfg_with


class _Evil:
    """Unpickling this creates ``marker`` (a stand-in for any code a crafted file could run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _interrupted_run(run_dir: Path, cfg, at: int) -> None:
    """Train until step ``at``, then stop as SIGTERM would: ckpt.pt at that step and no result."""

    def on_step(step: int, total: int) -> None:
        if step == at:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        train(cfg, run_dir, progress=False, on_step=on_step)
    assert (run_dir / "ckpt.pt").exists() and not (run_dir / "result.json").exists()


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line_naming_the_file(tmp_path: Path) -> None:
    run_dir, marker = tmp_path / "run", tmp_path / "PWNED"
    run_dir.mkdir()
    torch.save({"step": 3, "model": {}, "optim": {}, "torch_rng": _Evil(marker)}, run_dir / "ckpt.pt")
    with pytest.raises(ConfigError) as info:
        train(cfg_with(steps=10), run_dir, progress=False)
    msg = str(info.value)
    assert str(run_dir / "ckpt.pt") in msg and "refused" in msg and "\n" not in msg
    assert not marker.exists()
    assert (run_dir / "ckpt.pt").exists()  # left for the user to judge


def test_a_raw_pickle_that_would_run_code_is_never_unpickled(tmp_path: Path, capsys) -> None:
    run_dir, marker = tmp_path / "run", tmp_path / "PWNED"
    run_dir.mkdir()
    (run_dir / "ckpt.pt").write_bytes(pickle.dumps({"step": 1, "x": _Evil(marker)}))
    assert ck.load_checkpoint(run_dir) is None  # not torch.save's format: set aside as damaged
    assert not marker.exists() and not (run_dir / "ckpt.pt").exists()
    assert len(list(run_dir.glob("ckpt.pt.corrupt-*"))) == 1


@pytest.mark.parametrize("damage", ["truncated", "empty", "not a checkpoint"])
def test_a_damaged_checkpoint_is_moved_aside_with_a_warning_and_the_run_restarts_bitwise(
    tmp_path: Path, capsys, damage: str
) -> None:
    cfg = cfg_with("run.ckpt_every=0", steps=12)
    straight = train(cfg, tmp_path / "straight", progress=False)
    run_dir = tmp_path / "run"
    _interrupted_run(run_dir, cfg, at=7)
    path = run_dir / "ckpt.pt"
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"weights": torch.zeros(3)}, path)
    capsys.readouterr()
    resumed = train(cfg, run_dir, progress=False)
    err = capsys.readouterr().err
    aside = list(run_dir.glob("ckpt.pt.corrupt-*"))
    assert len(aside) == 1
    assert f"warning: {path} is unreadable" in err and aside[0].name in err and "step 0" in err
    assert resumed.status == "ok" and resumed.val_loss == straight.val_loss  # from step 0, same bits
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [5, 10, 12, 12]  # the old session's lines were dropped with its checkpoint


def _killed_mid_write(target: Path) -> None:
    """A process killed by SIGKILL inside ``atomic_write_bytes(target)``, after writing, before the rename."""
    code = (
        "import os, signal, sys; import loopscale.io as io; "
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL); "
        "io.atomic_write_bytes(sys.argv[1], b'x' * 100_000)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    assert not target.exists()


def test_temporaries_of_a_write_killed_midway_are_removed_when_the_run_restarts(tmp_path: Path) -> None:
    cfg = cfg_with("run.ckpt_every=0", steps=12)
    run_dir = tmp_path / "run"
    _interrupted_run(run_dir, cfg, at=7)
    for name in ("ckpt.pt", "model.safetensors"):
        _killed_mid_write(run_dir / "spare" / name)  # a real leftover's name, made in a side folder
        for leftover in io.stale_temp_files(run_dir / "spare", [name]):
            leftover.rename(run_dir / leftover.name)
    others = [run_dir / ".lock.host.123.tmp", run_dir / ".attempts.json.abcd1234.tmp", run_dir / "notes.tmp"]
    for p in others:
        p.write_text("not the trainer's")
    assert len(io.stale_temp_files(run_dir, ck.OWN_FILES)) == 2
    res = train(cfg, run_dir, progress=False)
    assert res.status == "ok" and res.steps == 12
    assert io.stale_temp_files(run_dir, ck.OWN_FILES) == []
    assert all(p.exists() for p in others)  # other writers' temporaries are not the trainer's to remove


def test_a_finished_run_drops_the_checkpoint_and_temporaries_a_kill_left(tmp_path: Path) -> None:
    cfg = cfg_with(steps=6)
    run_dir = tmp_path / "run"
    first = train(cfg, run_dir, progress=False)
    assert not (run_dir / "ckpt.pt").exists()
    # a kill between result.json and the checkpoint's removal, and one inside a checkpoint write
    (run_dir / "ckpt.pt").write_bytes(b"left behind")
    (run_dir / ".ckpt.pt.k1ll3d_x.tmp").write_bytes(b"partial")
    again = train(cfg, run_dir, progress=False)
    assert again == first
    assert not (run_dir / "ckpt.pt").exists() and not (run_dir / ".ckpt.pt.k1ll3d_x.tmp").exists()
    assert (run_dir / "model.safetensors").exists()


def test_keep_checkpoint_keeps_it_after_the_run_finishes(tmp_path: Path) -> None:
    cfg = cfg_with("run.keep_checkpoint=true", steps=6)
    train(cfg, tmp_path / "run", progress=False)
    train(cfg, tmp_path / "run", progress=False)
    assert ck.load_checkpoint(tmp_path / "run")["step"] == 6  # and it loads with the safe loader


def test_a_checkpoint_holds_only_what_the_safe_loader_accepts(tmp_path: Path) -> None:
    cfg = cfg_with("run.keep_checkpoint=true", "optim.name=adamw", steps=6)
    train(cfg, tmp_path / "run", progress=False)
    state = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    assert state["step"] == 6 and isinstance(state["torch_rng"], torch.Tensor)
