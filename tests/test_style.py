"""The habits CI keeps: ruff's lint and format, mypy on src/, bench/ and dev/ (pyproject.toml [tool.ruff], [tool.mypy]).

They run here so that `pytest -q -n 2`, the README's test command and .ci/run, checks them; each prints the
tool's own report on failure. The tools come with the `dev` extra; a missing one fails (a skipped check
would be silent).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "bench", "dev"]


def _run(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    tool = shutil.which(argv[0], path=str(Path(sys.executable).parent)) or shutil.which(argv[0])
    if tool is None:
        pytest.fail(f"{argv[0]} is not installed: pip install -e '.[dev]'")
    return subprocess.run([tool, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_lint_is_clean() -> None:
    proc = _run("ruff", "check", *PATHS)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    proc = _run("ruff", "format", "--check", *PATHS)
    assert proc.returncode == 0, "run `ruff format src tests bench dev`:\n" + proc.stdout[-5000:]


@pytest.mark.long
def test_mypy_is_clean_on_src() -> None:
    proc = _run("mypy", "--cache-dir", str(ROOT / ".mypy_cache"))
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]


STRICT_MODULES = {"loopscale.fit.*", "loopscale.record", "loopscale.report.*", "loopscale.train.*"}
STRICT_FLAGS = {
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "disallow_untyped_calls",
    "disallow_untyped_decorators",
    "disallow_any_generics",
    "check_untyped_defs",
    "no_implicit_reexport",
    "warn_return_any",
    "warn_unused_ignores",
    "strict_equality",
}


def test_the_strict_modules_are_the_ones_the_docs_name() -> None:
    """fit/, record.py, report/ and train/ stay under mypy's strict flags (docs/testing.md, issue 42 item 5)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    strict = [o for o in cfg.get("overrides", []) if o.get("disallow_untyped_defs")]
    assert len(strict) == 1, "one [[tool.mypy.overrides]] table holds the strict modules"
    table = strict[0]
    assert set(table["module"]) >= STRICT_MODULES
    assert all(table.get(flag) is True for flag in STRICT_FLAGS), sorted(f for f in STRICT_FLAGS if not table.get(f))
