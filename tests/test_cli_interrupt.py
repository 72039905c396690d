"""Exit codes that tell the truth, over every command: Ctrl-C is 130 (typer turns an uncaught KeyboardInterrupt
into a returned code, which ``run_app`` used to drop: exit 0 with nothing written), a user error is 2 and a
refusal of the file system (read-only, full disk) is 1, each one line with no traceback (issue 29, item 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopscale.cli import app, run_app
from loopscale.errors import ConfigError


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


def test_ctrl_c_during_an_extension_import_exits_130(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """CI saw it: SIGINT while scipy.optimize's HiGHS module initialised came back as ``ImportError:
    initialization failed`` (cause: KeyboardInterrupt) and the fit exited 1."""
    info = dict(COMMANDS)[("fit",)]

    def interrupted_import() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ki:
            raise ImportError("initialization failed") from ki

    monkeypatch.setattr(info, "name", "fit")
    monkeypatch.setattr(info, "callback", interrupted_import)
    assert run_app(["fit"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_an_import_error_of_its_own_is_not_an_interrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    info = dict(COMMANDS)[("fit",)]

    def broken() -> None:
        raise ImportError("no module named nothing")

    monkeypatch.setattr(info, "name", "fit")
    monkeypatch.setattr(info, "callback", broken)
    with pytest.raises(ImportError):
        run_app(["fit"])


FAILURES: dict[str, tuple[BaseException, int, str]] = {
    "user-error": (ConfigError("--x", "expected an int", value="y"), 2, "--x: expected an int (got 'y')"),
    "read-only": (OSError(30, "Read-only file system", "/ro/fit.json"), 1, "/ro/fit.json: Read-only file system"),
    "disk-full": (OSError(28, "No space left on device", "/full/x.tmp"), 1, "/full/x.tmp: No space left on device"),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=lambda p: " ".join(p))
def test_a_failure_in_any_command_is_one_line_and_a_non_zero_exit(
    path: tuple[str, ...], failure: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    exc, code, line = FAILURES[failure]

    def failing() -> None:
        raise exc

    info = dict(COMMANDS)[path]
    monkeypatch.setattr(info, "name", path[-1])
    monkeypatch.setattr(info, "callback", failing)
    assert run_app(list(path)) == code
    err = capsys.readouterr().err
    assert " ".join(err.split()) == f"error: {line}" and "Traceback" not in err


def test_ctrl_c_in_a_real_fit_exits_130_and_writes_no_fit_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loopscale.fit as fit

    csv = tmp_path / "runs.csv"
    rows = [(r, n, d) for r in (1, 2) for n in (1e5, 2e5) for d in (1e7, 2e7)]
    csv.write_text(
        "r,N_once,N_rec,D,val_loss,C\n"
        + "".join(f"{r},{n},{n},{d},{3 + 1e3 / n + 1e2 / d},{6 * n * d}\n" for r, n, d in rows)
    )

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fit, "fit_runs", interrupted)
    assert run_app(["fit", str(csv), "-o", str(tmp_path / "fit.json")]) == 130
    assert not (tmp_path / "fit.json").exists()
