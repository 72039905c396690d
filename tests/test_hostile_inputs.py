"""Hostile input (issue 29): fit files from elsewhere (a colleague, an editor, a crafted file) and values no
user means. Every reader (`plan`, `report`, `design`) refuses a number it cannot compute with in one line naming
the field, with exit code 2, instead of a traceback."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from loopscale.cli import run_app

FIT = Path(__file__).parent / "fixtures" / "fit" / "fit_v1.json"


def _nested(depth: int) -> dict:
    out: dict = {}
    cur = out
    for _ in range(depth):
        cur["a"] = {}
        cur = cur["a"]
    return out


def _edit(doc: dict, case: str) -> None:
    base = doc["variants"]["baseline"]
    if case == "A<=0":
        base["law"]["params"]["A"] = -1.0
    elif case == "empty law":
        base["law"] = {}
    elif case == "string tokens_per_step":
        doc["tokens_per_step"] = "lots"
    elif case == "phi 1e308":
        base["law"]["params"]["phi"] = 1e308
    elif case == "variant is a string":
        doc["variants"]["baseline"] = "oops"


CASES = {
    "A<=0": "variants.baseline.law.params.A: expected a number > 0",
    "empty law": "variants.baseline.law.params: missing",
    "string tokens_per_step": "tokens_per_step: expected a positive whole number",
    "phi 1e308": "variants.baseline.law.params.phi: expected a finite number",
    "variant is a string": "variants.baseline: expected an object",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_fit_file_is_one_line_naming_the_field(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(FIT.read_text())
    _edit(doc, case)
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(doc))
    for argv in (
        ["plan", "-C", "1e19", "--fit", str(path)],
        ["design", "quick", "--prior", str(path), "--sims", "2", "--no-search"],
    ):
        assert run_app(argv) == 2
        err = capsys.readouterr().err
        assert CASES[case] in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_fit_file_nested_thousands_deep_is_refused_not_a_recursion_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(FIT.read_text())
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # to write it
    try:
        text = json.dumps({**doc, "extra": _nested(5000)})
    finally:
        sys.setrecursionlimit(limit)
    path = tmp_path / "fit.json"
    path.write_text(text)
    assert run_app(["plan", "-C", "1e19", "--fit", str(path)]) == 2
    err = capsys.readouterr().err
    assert "nested too deeply" in err and "Traceback" not in err


def test_the_shipped_fit_files_still_pass_the_checks() -> None:
    from loopscale.fit import read_fit

    doc = read_fit(FIT)
    assert doc["variants"]
    ok = copy.deepcopy(doc)
    ok["variants"]["baseline"]["law"]["params"]["phi"] = None  # undetermined phi (no looped runs) is allowed
    from loopscale.fit.fitfile import check_numbers

    check_numbers(ok, "x")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["plan", "-C", "inf", "--paper"], "--budget"),
        (["plan", "-C", "1e19", "--paper", "--tokens-per-step", "0"], "--tokens-per-step"),
        (["plan", "-C", "1e19", "--paper", "--tokens-per-step", "-5"], "--tokens-per-step"),
        (["design", "quick", "--sigma", "-1", "--sims", "2", "--no-search"], "--sigma"),
        (["design", "quick", "--cell-sigma", "-0.1", "--sims", "2", "--no-search"], "--cell-sigma"),
        (["info", "--set", "run.x=" + "[" * 3000 + "]" * 3000], "--set"),
    ],
)
def test_values_no_user_means_are_one_line_errors(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_app(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {field}:") and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "plan", "quick", "--slots", "1000", "--no-calibrate"],
        ["sweep", "run", "quick", "--slots", "1000", "--out", "never-made"],
        ["demo", "--quick", "--slots", "1000", "--out", "never-made"],
    ],
)
def test_more_cpu_slots_than_cores_is_refused_before_anything_starts(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_app(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --slots: expected at most") and "(got 1000)" in err
    assert not (tmp_path / "never-made").exists() and not (tmp_path / "sweeps").exists()


def test_more_threads_than_cores_is_refused_in_one_line() -> None:
    from loopscale.errors import ConfigError
    from loopscale.train.hardware import Dist, setup_threads

    with pytest.raises(ConfigError, match=r"run.threads: expected at most \d+"):
        setup_threads(1000, Dist(0, 1, 0))
    assert setup_threads(1, Dist(0, 1, 0)) == 1  # the tests' own setting (conftest: one thread per test)


def test_a_file_where_a_folder_must_be_is_one_line_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report --out FILE`, `fit -o FILE/fit.json` and `sweep run --out FILE` ended in FileExistsError /
    NotADirectoryError tracebacks (issue 29); the file system's refusal is now one line naming the path, exit 1."""
    import pandas as pd

    from loopscale.fit.synthetic import synthetic_runs

    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs.csv"
    df = synthetic_runs(0.46, sigma=0.01, seed=0)
    pd.DataFrame(df).to_csv(runs, index=False)
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    for argv in (
        [
            "fit",
            str(runs),
            "--restarts",
            "5",
            "-b",
            "0",
            "--lr-draws",
            "0",
            "--no-checks",
            "--no-per-r",
            "--no-restricted",
            "--no-law-variants",
            "-o",
            str(blocker / "fit.json"),
        ],
        ["sweep", "run", "quick", "--out", str(blocker), "--no-progress"],
    ):
        assert run_app(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {blocker}") and "Traceback" not in err, err
    assert blocker.read_text() == "not a folder"
