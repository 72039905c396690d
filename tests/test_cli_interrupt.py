"""Ctrl-C exits 130 from every command: typer turns an uncaught KeyboardInterrupt into a returned code, which
``run_app`` used to drop (exit 0 with nothing written)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopscale.cli import app, run_app


def _commands(typer_app: Any = app, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for info in typer_app.registered_commands:
        yield (*prefix, info.name or info.callback.__name__.replace("_", "-")), info
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, (*prefix, group.name or group.typer_instance.info.name))


COMMANDS = sorted(_commands(), key=lambda c: c[0])


def test_every_command_is_listed() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"fit", "report", "export", "train", "demo", "sweep collect", "sweep run", "eval", "plan"} <= names


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=lambda p: " ".join(p))
def test_ctrl_c_in_any_command_exits_130(path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    info = dict(COMMANDS)[path]

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "name", path[-1])  # (typer names a command after its callback otherwise)
    monkeypatch.setattr(info, "callback", interrupted)
    assert run_app(list(path)) == 130
    assert "interrupted" in capsys.readouterr().err


def test_ctrl_c_in_a_real_fit_exits_130_and_writes_no_fit_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loopscale.fit as fit

    csv = tmp_path / "runs.csv"
    rows = [(r, n, d) for r in (1, 2) for n in (1e5, 2e5) for d in (1e7, 2e7)]
    csv.write_text("r,N_once,N_rec,D,val_loss,C\n" + "".join(
        f"{r},{n},{n},{d},{3 + 1e3 / n + 1e2 / d},{6 * n * d}\n" for r, n, d in rows))

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fit, "fit_runs", interrupted)
    assert run_app(["fit", str(csv), "-o", str(tmp_path / "fit.json")]) == 130
    assert not (tmp_path / "fit.json").exists()
