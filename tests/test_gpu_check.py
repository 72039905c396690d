"""bench/gpu_check.py, the prepared GPU script, at toy sizes on CPU: it must not rot between GPU sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.long
def test_the_gpu_check_runs_its_sections_and_writes_json_and_markdown(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--smoke",
            "--out",
            str(tmp_path),
            "--sections",
            "steps",
            "packs",
            "train",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = report["steps"]
    assert [(m["s"], m["r"]) for m in steps] == [(s, r) for s in (1, 2) for r in (1, 2, 4, 8)]
    assert all(m["tokens_per_s"] > 0 and m["predicted_peak_bytes"] > 0 and "error" not in m for m in steps)
    packs = report["packs"]
    assert [(m["d_model"], m["k"], m["mode"]) for m in packs] == [
        (16, 1, "solo"),
        (32, 1, "solo"),
        *[(d, k, "pack") for d in (16, 32) for k in (1, 2)],
    ]
    assert all(m["tokens_per_s"] > 0 and "error" not in m for m in packs) and packs[-1]["vs_solo"] > 0
    train = report["train"]
    assert train["rc"] == 0 and train["status"] == "ok" and train["steps"] == 20
    assert [s for s, _ in train["loss_curve"]] == [10, 20]
    md = (tmp_path / "gpu_check.md").read_text()
    assert (
        md.startswith("# loopscale GPU check (cpu")
        and "| 2 | 8 | off |" in md
        and "## train" in md
        and "## packs" in md
    )
