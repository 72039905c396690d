"""Every usage error anywhere in the CLI: one line plus a usage hint, exit status 2, no traceback.

The commands are discovered from the Typer/click tree, so a new command is covered without editing this file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from loopscale.cli import app, run_app


def _walk(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(typer.main.get_command(app)))
LEAVES = [(p, c) for p, c in COMMANDS if not hasattr(c, "commands")]
GROUPS = [(p, c) for p, c in COMMANDS if hasattr(c, "commands")]


def _ids(items: list[tuple[tuple[str, ...], Any]]) -> list[str]:
    return [" ".join(p) or "loopscale" for p, _ in items]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = run_app(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def _assert_usage_error(code: int, text: str) -> None:
    assert code == 2, text
    assert "Traceback" not in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert 1 <= len(lines) <= 2, text
    assert lines[0].startswith("error: ")
    assert "--help" in text


def test_the_tree_has_every_command() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"train", "eval", "report", "fit", "info", "sweep run", "sweep plan", "tokenizer train"} <= names


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=_ids(COMMANDS))
def test_a_bogus_option_is_one_line_and_exit_2(path, cmd, capsys) -> None:
    _assert_usage_error(*_run([*path, "--no-such-option-xyz"], capsys))


def _required(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.required]


@pytest.mark.parametrize(
    ("path", "cmd"), [(p, c) for p, c in LEAVES if _required(c)], ids=_ids([(p, c) for p, c in LEAVES if _required(c)])
)
def test_a_missing_required_argument_is_one_line_and_exit_2(path, cmd, capsys) -> None:
    code, text = _run(list(path), capsys)
    _assert_usage_error(code, text)
    assert "Missing" in text


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=_ids(LEAVES))
def test_an_option_without_its_value_is_one_line_and_exit_2(path, cmd, capsys) -> None:
    opts = [p for p in cmd.params if p.param_type_name == "option" and not p.is_flag and p.opts[0] != "--help"]
    for opt in opts:
        _assert_usage_error(*_run([*path, opt.opts[0]], capsys))


@pytest.mark.parametrize(("path", "cmd"), GROUPS, ids=_ids(GROUPS))
def test_an_unknown_subcommand_is_one_line_and_exit_2(path, cmd, capsys) -> None:
    code, text = _run([*path, "nosuchcmd"], capsys)
    _assert_usage_error(code, text)
    assert "nosuchcmd" in text


@pytest.mark.parametrize(
    "argv",
    [
        ["nosuchcmd"],
        ["report", "somedir"],
        ["eval", "--batch-size", "0", "x"],
        ["sweep", "run"],
        ["train", "--bogus"],
        ["info", "--budget", "lots"],
    ],
)
def test_the_issue_examples(argv: list[str], capsys) -> None:
    _assert_usage_error(*_run(argv, capsys))


def test_no_arguments_print_the_help_without_a_traceback(capsys) -> None:
    for argv in ([], ["sweep"], ["tokenizer"]):
        code, text = _run(argv, capsys)
        assert code == 2 and "Traceback" not in text and "Usage" in text


# ---- square brackets survive: rich markup must not eat error text, paths or help words -------------------------
_TOKEN = re.compile(r"\[[^\[\]\n]+\]")


def _help_texts(cmd: Any) -> list[str]:
    texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
    return [t.replace("\\[", "[") for t in texts]  # an escaped bracket renders as a bracket


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=_ids(COMMANDS))
def test_help_keeps_every_bracketed_word(path, cmd, capsys, monkeypatch) -> None:
    code, text = _run([*path, "--help"], capsys)
    assert code == 0
    flat = " ".join(re.sub(r"[│╭╮╰╯─]+", " ", text).split())
    for help_text in _help_texts(cmd):
        for token in _TOKEN.findall(" ".join(help_text.split())):
            assert token in flat, f"{token!r} lost from `loopscale {' '.join(path)} --help`"


def test_an_error_with_brackets_is_printed_verbatim(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "spec [run x].toml"
    bad.write_text("[run]\nstepz = 3\n")
    code, text = _run(["train", str(bad)], capsys)
    assert code == 2
    assert f"{bad} + --set" in text or f"{bad}:" in text
    assert "[run x]" in text and "run.stepz: unknown key" in text


def test_a_sweep_spec_error_keeps_its_bracketed_tables(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "spec.toml"
    bad.write_text("[sweep]\nname = 'x'\nbudgets = [1e9]\nr = [1]\n[swep]\nx = 1\n")
    code, text = _run(["sweep", "plan", str(bad), "--no-calibrate"], capsys)
    assert code == 2
    assert "expected [sweep], [train], [local], [slurm], [fit]" in " ".join(text.split())
