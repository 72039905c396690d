"""The CLI driven as a careless or unlucky user would (issue 29): a second terminal on the same run, Ctrl-C
(a real SIGINT), a read-only place, a sweep dir from a colleague with links and crafted files. Each case:
no traceback, one error line, the right exit code, nothing outside the target touched, nothing lost or mixed.

As root (CI) a read-only file system cannot be made without mounting one; `read_only` below makes the OS
calls that write under a folder fail with EROFS, as a read-only mount would.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import tomli_w

from conftest import TINY_DATA, TINY_MODEL, tiny_sweep_spec
from loopscale.cli import run_app

LONG = {
    "model": {**TINY_MODEL, "r": 2},
    "data": TINY_DATA,
    "optim": {"transfer": False},
    "run": {
        "steps": 100_000,
        "batch_size": 8,
        "threads": 1,
        "val_tokens": 4096,
        "min_steps": 5,
        "log_every": 1,
        "ckpt_every": 0,
    },
}


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = run_app(argv)
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def _one_error(code: int, text: str, expected: int) -> str:
    assert code == expected, text
    assert "Traceback" not in text, text
    errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, text
    return errors[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _spawn(args: list[str]) -> subprocess.Popen:
    """A command started as from a terminal: Ctrl-C's SIGINT at its default (a pytest worker may ignore it,
    and a child that inherits SIG_IGN never sees KeyboardInterrupt)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "loopscale", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.05)


def test_a_second_terminal_is_refused_then_ctrl_c_and_resume_lose_and_duplicate_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Terminal 1 trains; terminal 2 tries to train the same dir, export and evaluate it: each refused in one
    line naming the holder; terminal 1 gets Ctrl-C (130, a checkpoint, no half-written file); the rerun resumes
    and every step appears once."""
    from loopscale import locks

    cfg = tmp_path / "long.toml"
    cfg.write_text(tomli_w.dumps(LONG))
    run = tmp_path / "run"
    proc = _spawn(["train", str(cfg), "--out", str(run), "--no-progress"])
    try:
        _wait_for(run / "metrics.jsonl", proc)
        holder = locks.live(run)
        assert holder is not None and holder["pid"] == proc.pid and holder["executor"] == "loopscale train"

        line = _one_error(*_cli(["train", str(cfg), "--out", str(run), "--no-progress"], capsys), 2)
        assert f"pid {proc.pid}" in line and "delete" in line
        line = _one_error(*_cli(["export", str(run), str(tmp_path / "hf")], capsys), 2)
        assert "is being written now" in line and f"pid {proc.pid}" in line
        assert not (tmp_path / "hf").exists()
        line = _one_error(*_cli(["eval", str(run), "--tasks", "induction", "--limit", "2"], capsys), 2)
        assert "RUN: not finished: no model.safetensors" in line and f"pid {proc.pid}" in line
        assert not (run / "eval").exists()  # nothing to score yet, nothing written

        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "checkpoint saved" in err
    assert not list(run.glob("*.tmp")) and not list(run.glob(".*.tmp")) and not (run / locks.LOCK).exists()
    assert not (run / "result.json").exists()  # interrupted, not finished: nothing claims otherwise

    import torch

    stopped = int(torch.load(run / "ckpt.pt", weights_only=False)["step"])
    assert 0 < stopped < 100_000
    code, text = _cli(
        ["train", str(cfg), "--out", str(run), "--no-progress", "--set", f"run.steps={stopped + 3}"], capsys
    )
    assert code == 2 and "different config" in text  # the run belongs to its config: a changed one is refused
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] <= stopped  # nothing trained twice, nothing lost


def test_ctrl_c_in_a_long_fit_exits_130_and_leaves_no_file(tmp_path: Path) -> None:
    """A real SIGINT while `fit` bootstraps: exit 130, no fit.json and no temporary file left behind."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for c in (1e13, 3e13, 1e14):
        for r in (1, 2, 4):
            for n in (3e4, 6e4, 1.2e5):
                d = c / (6 * n * (1 + r))
                loss = 2 + 40 * (n + r**0.5 * n) ** -0.3 + 300 * d**-0.3 + rng.normal(0, 0.003)
                rows.append(f"{r},{n},{n},{d},{loss},{c}")
    csv = tmp_path / "runs.csv"  # one failed run: the fit says it excluded it just before it starts fitting
    csv.write_text(
        "r,N_once,N_rec,D,val_loss,C,status\n"
        + "".join(f"{row},ok\n" for row in rows)
        + "2,1e5,1e5,1e7,9.9,1e13,failed\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    proc = _spawn(["fit", str(csv), "-o", str(out / "fit.json"), "--bootstrap", "100000", "--restarts", "20"])
    try:
        seen = ""
        t0 = time.time()
        while "excluded 1 run" not in seen:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, seen
            seen += line
            assert time.time() - t0 < 120, seen
        proc.send_signal(signal.SIGINT)
        _o, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, seen + err
    assert "Traceback" not in err and "interrupted" in err
    assert list(out.iterdir()) == []


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Writes below ``folder`` fail with EROFS at the OS calls (open for writing, mkdir, link, rename, unlink)."""
    import pytest as _pytest

    top = str(folder.resolve())

    def below(p: object) -> bool:
        try:
            return str(Path(os.fsdecode(p)).resolve()).startswith(top)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False

    def refuse(p: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(p))  # type: ignore[arg-type]

    real_open, real_mkdir = os.open, os.mkdir
    real = {name: getattr(os, name) for name in ("link", "rename", "replace", "unlink", "symlink")}

    def open_(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and below(path):
            refuse(path)
        return real_open(path, flags, *a, **k)

    def mkdir_(path, *a, **k):
        if below(path):
            refuse(path)
        return real_mkdir(path, *a, **k)

    def two(name: str):
        def f(src, dst=None, *a, **k):
            if below(dst if dst is not None else src):
                refuse(dst if dst is not None else src)
            return real[name](src, *((dst,) if dst is not None else ()), *a, **k)

        return f

    mp = _pytest.MonkeyPatch()
    mp.setattr(os, "open", open_)
    mp.setattr(os, "mkdir", mkdir_)
    for name in real:
        mp.setattr(os, name, two(name))
    import builtins
    import io

    real_bopen = builtins.open

    def bopen(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and isinstance(file, str | bytes | os.PathLike) and below(file):
            refuse(file)
        return real_bopen(file, mode, *a, **k)

    mp.setattr(builtins, "open", bopen)
    mp.setattr(io, "open", bopen)  # (pathlib opens files with io.open)
    try:
        yield
    finally:
        mp.undo()


def _fit_table(tmp_path: Path) -> Path:
    csv = tmp_path / "runs.csv"
    rows = [(r, n, d) for r in (1, 2, 4) for n in (1e5, 2e5, 4e5) for d in (1e7, 3e7)]
    csv.write_text(
        "r,N_once,N_rec,D,val_loss,C\n"
        + "".join(
            f"{r},{n},{n},{d},{2 + 30 * (n + r**0.5 * n) ** -0.3 + 300 * d**-0.3},{6 * n * d}\n" for r, n, d in rows
        )
    )
    return csv


def test_a_read_only_place_is_one_line_naming_the_path_for_every_writer(tmp_path: Path, capsys) -> None:
    csv = _fit_table(tmp_path)
    fit_json = tmp_path / "fit.json"
    assert _cli(["fit", str(csv), "-o", str(fit_json), "--bootstrap", "0", "--lr-draws", "0"], capsys)[0] == 0
    ro = tmp_path / "ro"
    ro.mkdir()
    spec = tmp_path / "spec.toml"
    spec.write_text(tomli_w.dumps(tiny_sweep_spec({"ckpt_every": 0})))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("to be or not to be " * 200)
    cases = [
        ["fit", str(csv), "-o", str(ro / "fit.json"), "--bootstrap", "0", "--lr-draws", "0"],
        ["report", str(csv), "--fit", str(fit_json), "--out", str(ro / "report")],
        ["sweep", "run", str(spec), "--out", str(ro / "sweep"), "--no-progress", "--slots", "1"],
        ["sweep", "plan", str(spec), "--csv", str(ro / "plan.csv"), "--no-calibrate"],
        ["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(ro / "tok.json")],
    ]
    before = _tree(tmp_path)
    for argv in cases:
        with read_only(ro):
            code, text = _cli(argv, capsys)
        line = _one_error(code, text, 1)
        assert str(ro) in line and "Read-only file system" in line, (argv, line)
    assert _tree(tmp_path) == before  # nothing written anywhere, nothing half-written in ro/


def test_a_hostile_sweep_dir_is_named_run_by_run_and_nothing_outside_is_read_or_touched(tmp_path: Path, capsys) -> None:
    """A colleague's sweep dir: one run dir links out of the sweep, one plan names an id outside it, one result
    has a string loss. `collect` writes the table of the good runs, names each bad one and exits 1; `sweep run`
    refuses the link in one line; nothing outside the sweep dir is read into the table or changed."""
    from loopscale.sweep import prepare, spec_from_dict

    spec = spec_from_dict(tiny_sweep_spec({"ckpt_every": 0}), source="tiny.toml")
    store = prepare(spec, tmp_path / "sw")
    ids = [rs.run_id for rs in spec.runs()]
    good, linked, renamed, crafted = ids[:4]
    for rid in ids:
        (store.run_dir(rid) / "result.json").write_text(
            json.dumps({"status": "ok", "val_loss": 3.0, "r": 2, "N_once": 1000, "N_rec": 500, "D": 1e6})
        )
    outside = tmp_path / "outside"
    (store.runs_dir / linked).rename(outside)
    (store.runs_dir / linked).symlink_to(outside, target_is_directory=True)
    (outside / "result.json").write_text(
        json.dumps({"status": "ok", "val_loss": 99.0, "r": 2, "N_once": 1, "N_rec": 1, "D": 1})
    )
    meta = json.loads((store.run_dir(renamed) / "sweep.json").read_text())
    (store.run_dir(renamed) / "sweep.json").write_text(json.dumps({**meta, "run_id": "../../outside"}))
    (store.run_dir(crafted) / "result.json").write_text(
        json.dumps({"status": "ok", "val_loss": "low", "r": 2, "N_once": 1000, "N_rec": 500, "D": 1e6})
    )
    outside_before = _tree(outside)

    code, text = _cli(["sweep", "collect", str(store.root)], capsys)
    flat = " ".join(text.split())
    assert code == 1 and "Traceback" not in text and "3 run(s) left out" in flat, text
    assert f"runs/{linked}: " in flat and "a link out of the sweep" in flat
    assert f"runs/{renamed}/sweep.json" in flat and "does not match its folder" in flat
    assert f"runs/{crafted}/result.json: invalid (val_loss: expected a finite number" in flat
    table = (store.root / "runs.csv").read_text()
    assert good in table and "99.0" not in table and all(r not in table for r in (linked, renamed, crafted))
    line = _one_error(*_cli(["sweep", "run", str(store.root), "--no-progress"], capsys), 2)
    assert "a link out of the sweep" in line
    assert _tree(outside) == outside_before


def test_a_second_spec_for_a_sweep_dir_is_refused_and_changes_nothing(tmp_path: Path, capsys) -> None:
    spec_a = tmp_path / "a.toml"
    spec_a.write_text(tomli_w.dumps(tiny_sweep_spec({"ckpt_every": 0})))
    b = tiny_sweep_spec({"ckpt_every": 0})
    b["train"]["optim"] = {**b["train"].get("optim", {}), "lr_scale": 3.0}
    spec_b = tmp_path / "b.toml"
    spec_b.write_text(tomli_w.dumps(b))
    from loopscale.sweep import load_spec, prepare

    root = prepare(load_spec(str(spec_a)), tmp_path / "swm").root
    before = _tree(root)
    line = _one_error(*_cli(["sweep", "run", str(spec_b), "--out", str(root), "--no-progress"], capsys), 2)
    assert "already holds another spec" in line and "--change-spec" in line
    line = _one_error(
        *_cli(["sweep", "run", str(root), "--set", "train.optim.lr_scale=3.0", "--no-progress"], capsys), 2
    )
    assert "already holds another spec" in line
    assert _tree(root) == before
