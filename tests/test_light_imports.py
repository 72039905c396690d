"""The light entry points never import torch (1.5-3.5 s of a command's start; bench/startup.py).

Configs and specs, `sweep plan --no-calibrate`, `fit`, `plan`, `design` and the report read tables and
numbers only; each check runs in a fresh interpreter, because a test process has torch loaded already.
"""

from __future__ import annotations

import subprocess
import sys

#: imported one after another; the first that loads torch is named.
LIGHT_MODULES = (
    "loopscale.numbers",
    "loopscale.config",
    "loopscale.config.data",
    "loopscale.optim",
    "loopscale.train.settings",
    "loopscale.sweep.spec",
    "loopscale.sweep.plan",
    "loopscale.fit",
    "loopscale.fit.recommend",
    "loopscale.fit.design",
    "loopscale.report",
    "loopscale.report.tables",
    "loopscale.report.build",  # figures and the page: what `loopscale report` runs
    "loopscale.cli",  # every command module, as `loopscale --help` loads them
)


def _run(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_light_modules_do_not_import_torch() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {LIGHT_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'torch' not in sys.modules, f'importing {name} loaded torch'\n"
    )
    _run(code)


def test_light_commands_do_not_import_torch(tmp_path) -> None:
    """`sweep plan demo --no-calibrate` (on a host without a GPU driver), `fit`, `plan` and `design` run
    end to end without torch."""
    runs, fit = tmp_path / "runs.csv", tmp_path / "fit.json"
    code = f"""
import contextlib, io, sys
from loopscale import cores
from loopscale.cli import run_app
from loopscale.fit import synthetic_runs

synthetic_runs(0.46, seed=4).to_csv({str(runs)!r}, index=False)
cores.nvidia_driver = lambda: False  # as on a host without a GPU
commands = {{
    "sweep plan": ["sweep", "plan", "demo", "--no-calibrate"],
    "fit": ["fit", {str(runs)!r}, "--bootstrap", "0", "--lr-draws", "0", "--restarts", "5", "--no-checks", "--no-per-r",
            "--no-restricted", "--no-law-variants", "--out", {str(fit)!r}],
    "plan --fit": ["plan", "-C", "1e19", "--fit", {str(fit)!r}],
    "plan --paper": ["plan", "-C", "1e19", "--paper"],
    "design": ["design", "demo", "--sims", "2", "--bootstrap", "0", "--restarts", "2", "--no-search",
               "--workers", "1"],
}}
for name, argv in commands.items():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = run_app(argv)
    assert code == 0, (name, code)
    assert "torch" not in sys.modules, f"{{name}} loaded torch"
"""
    _run(code)
