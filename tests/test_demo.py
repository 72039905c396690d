"""`loopscale demo --quick` end to end: killed mid-sweep, resumed without redoing runs, report checked."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIGURES = ("isoflop", "frontier", "parity", "residuals", "phi", "equivalence", "allocation", "axes", "test_time")


def _demo(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"}  # wide: no interval is split over two lines
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loopscale",
            "demo",
            "--quick",
            "--out",
            str(out),
            "--bootstrap",
            "20",
            "--lr-draws",
            "100",
            "--eval-limit",
            "12",
            "--no-progress",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finished(out: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (out / "sweep" / "runs").glob("*/result.json")}


@pytest.mark.long
def test_quick_demo_resumes_after_sigkill_and_writes_a_checked_report(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    from loopscale.model import cpu_kernels

    cpu_kernels.library()  # built once in the session's cache, not by both slot workers at once
    out = tmp_path / "demo"
    proc = _demo(out)
    t0 = time.time()
    while len(_finished(out)) < 3:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - t0 < 600
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _finished(out)
    assert 3 <= len(before) < 20

    proc = _demo(out)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    after = _finished(out)
    assert len(after) == 20  # 16 runs of the grid + 4 loop-of-one r = 1 controls
    assert all(after[k] == v for k, v in before.items())  # finished runs were not redone

    head = json.loads((out / "headline.json").read_text())
    assert "phi" in head and head["verdict"] and set(head["restricted"]) == {"phi=0", "phi=1"}
    assert set(head["variants"]) == {"baseline@loop1"} and head["variants"]["baseline@loop1"]["verdict"]
    assert "baseline@loop1:" in err
    # the verdict follows " - ", after the interval's level and method
    assert re.search(r"baseline@loop1: phi = \S+ \[\S+, \S+\] \(95%, profile likelihood\) - ", err)
    assert set(head["axes"]) == {"knowledge", "reading", "math", "reasoning", "symbolic"}
    assert "phi" in err and "report:" in err and "(20 runs)" in " ".join(err.split())  # rich wraps lines
    plain = head["plain"]  # the plain-words headline: first in the terminal, summary.md and the page
    assert plain[0].startswith("What was measured: 20 training runs") and plain[1].startswith("Result: ")
    assert plain[2].startswith("Here r = 1 is the plain stack") and "For reference, the paper" in plain[2]
    assert plain[3].startswith("A different quantity") and "loop of one" in plain[3] and "0.46" not in plain[3]
    assert head["inference"]["phi"]["method"].startswith("profile likelihood")  # the record every text reads
    assert set(head["inference"]["tests"]) >= {"phi=0", "phi=1"} and isinstance(head["claims"], list)
    md = (out / "report" / "summary.md").read_text()
    flat = " ".join(err[err.rindex("headline") :].split())
    assert all(line in md and line in flat for line in plain) and flat.index(plain[0]) < flat.index("details")
    assert "{" not in flat and "knowledge" in flat.lower()  # the axes print as a table, not a JSON dict
    starts = [e for e in (out / "sweep" / "events.jsonl").read_text().splitlines() if '"start"' in e]
    assert any('"local-worker"' in e for e in starts) or (os.cpu_count() or 1) < 2  # runs went to slots
    fit = json.loads((out / "fit.json").read_text())
    assert fit["settings"]["delta"] == 0.02 and fit["settings"]["loss"] == "huber"  # the preset's [fit] table
    assert "held_out" in fit["variants"]["baseline@loop1"]["restricted"]["phi=0"]

    html = (out / "report" / "index.html").read_text()
    for name in FIGURES:
        for ext in ("png", "svg", "pdf"):
            f = out / "report" / "figures" / f"{name}.{ext}"
            assert f.exists() and f.stat().st_size > 1000, f
        img = mpimg.imread(out / "report" / "figures" / f"{name}.png")
        assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 600
        assert img.std() > 0.01  # not blank
    assert html.count("data:image/png;base64,") >= len(FIGURES)
    assert "http://" not in html and "https://" not in html
    runs = (out / "runs.csv").read_text().splitlines()
    assert len(runs) == 21
    # section 9 (test-time recurrence) is drawn: the top budget's looped baseline runs at r_eval 1-16
    import pandas as pd

    axes = pd.read_csv(out / "axes.csv")
    tt = axes[axes["r_eval"] != axes["r"]]
    assert set(tt["C"]) == {4e10} and set(tt["r"]) == {2, 4, 8} and set(tt["variant"]) == {"baseline"}
    assert {(r, e) for r, e in zip(axes["r"], axes["r_eval"], strict=True) if r > 1 and e != r} == {
        (r, e) for r in (2, 4, 8) for e in (1, 2, 4, 8, 16) if e != r
    }
    # issue 43: every φ / Δφ interval on the page, in summary.md and in the terminal is fit.json's under its method,
    # and the verdict is on the first screen of a 1280x800 window (where a browser is installed)
    from report_checks import browser, check_outputs, first_screen, html_units, markdown_units, terminal_units

    found = check_outputs(
        fit,
        {
            "index.html": html_units(html),
            "summary.md": markdown_units(md),
            "demo (terminal)": terminal_units(err[err.rindex("headline") :]),
        },
    )
    assert {f.where for f in found if f.quantity == "phi"} == {"index.html", "summary.md", "demo (terminal)"}
    if browser() is not None:
        shot = out / "report" / "first-screen.png"
        pos = first_screen(out / "report" / "index.html", shot, tmp_path / "chromium-profile")
        print(f"quick demo: verdict at y = {pos['verdict']}, viewport {pos['viewport']}, screenshot {shot}")
        assert pos["verdict"][1] <= min(800, pos["viewport"][1]), pos
    section = html[html.index('id="fig-test_time"') :]
    section = section[: section.index("</section>")]
    assert "data:image/png;base64," in section and "not evaluated" not in section and 'id="tab-test-time"' in section
    assert "test-time r" in err


def test_the_demo_runs_test_time_r_on_the_reference_recipes_looped_runs_at_its_top_budget() -> None:
    import pandas as pd

    from loopscale.demo import _test_time_runs
    from loopscale.eval.runs import RunRef

    runs = pd.DataFrame(
        {
            "variant": ["baseline"] * 4 + ["loop1", "tbptt"],
            "C": [2e10, 4e10, 4e10, 4e10, 8e10, 8e10],
            "r": [2, 1, 2, 8, 1, 4],
        }
    )
    pick = _test_time_runs(runs, "baseline")

    def ref(variant: str, c: float | None, r: int) -> RunRef:
        return RunRef(Path("x"), "x", variant, c, r)

    assert pick(ref("baseline", 4e10, 2)) and pick(ref("baseline", 4.0000001e10, 8))
    assert not pick(ref("baseline", 2e10, 2))  # a lower budget: the report's figure shows the top one
    assert not pick(ref("baseline", 4e10, 1))  # r = 1: a plain stack, no loop to vary
    assert not pick(ref("loop1", 8e10, 1)) and not pick(ref("tbptt", 8e10, 4))  # other recipes
    assert not pick(ref("baseline", None, 2))
    assert not _test_time_runs(runs, "missing")(ref("baseline", 4e10, 2))


def test_a_demo_dir_holding_another_presets_sweep_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`demo --quick` then `demo` into the same folder would have mixed two presets' runs in one sweep dir."""
    from loopscale.demo import run_demo
    from loopscale.errors import ConfigError
    from loopscale.sweep import load_spec, prepare

    prepare(load_spec("quick"), tmp_path / "demo" / "sweep")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match=r"holds a demo of another preset.*--out .*demo-demo"):
        run_demo(tmp_path / "demo", preset="demo", progress=False)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
