"""The README's install text: the two top commands stay what CI runs, and it says what the torch pin pulls."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _commands() -> list[str]:
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(python3 -m venv .*)\n```", section)


def test_the_two_top_commands_are_unchanged_and_the_test_one_is_what_ci_runs() -> None:
    demo, tests = _commands()
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert demo == venv + "pip install torch==2.13.0 && pip install -e . && loopscale demo --quick"
    # --no-compile: the suite writes bytecode on first import instead (tests/conftest.py; docs/testing.md)
    assert (
        tests
        == venv
        + "pip install --no-compile torch==2.13.0 && pip install --no-compile -e '.[dev,eval]' && pytest -q -n 2"
    )
    ci = ROOT / ".ci" / "run"
    if ci.exists():
        assert tests in ci.read_text(encoding="utf-8")


def test_the_readme_says_what_the_torch_pin_pulls_and_how_to_get_the_cpu_wheel() -> None:
    text = " ".join(README.split())
    assert "is the CPU wheel" not in text
    assert "CUDA build" in text and "nvidia-*" in text
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
