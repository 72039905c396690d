"""bench: how fast the light commands start, side by side with `loopscale info --help` (issue 18).

    python bench/startup.py              # ~1 minute on 2 cores
    python bench/startup.py --repeats 9

Each command runs ``--repeats`` times (default 5) as a fresh ``python -m loopscale`` process; the
table shows the median wall clock, the median CPU time (user + sys: on a shared machine the wall clock
is this times the contention, so CPU time is what an idle machine's wall clock would be) and the peak
RSS of that process. This script imports nothing heavy itself, so a forked child's RSS is its own.
The acceptance: `sweep plan demo --no-calibrate` and `fit` start in under 1.5 s.

`fit RUNS.csv` is timed on the paper grid's 116 synthetic runs with the fit itself cut to almost
nothing (1 start, no bootstrap, no checks); its "startup" column subtracts the fit's own ``wall_s``
(from the fit file: scipy's import and the optimiser), leaving the process, the imports, reading the
table and printing. The row "fit's import chain" is the process that imports what `fit` imports
before it fits (``loopscale.cli``, ``loopscale.fit``, pandas); below the table, ``python -X
importtime``'s cumulative import time of each. The machine may be shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY_FIT = ["--bootstrap", "0", "--restarts", "1", "--no-checks", "--no-per-r", "--no-restricted", "--no-law-variants"]


def hardware() -> str:
    """CPU model, cores and threads per core (bench/fit_speed.py prints this line too); stdlib only."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        keep = [ln for ln in lines if ln.split(":")[0] in ("Model name", "CPU(s)", "Thread(s) per core")]
    except (OSError, subprocess.CalledProcessError):
        keep = [platform.processor()]
    return "; ".join(" ".join(ln.split()) for ln in keep) + f"; os.cpu_count={os.cpu_count()}"


def timed(argv: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one process; output discarded, a failure stops the bench."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def import_times(modules: list[str]) -> dict[str, float]:
    """Cumulative import seconds per module from one ``python -X importtime`` run that imports them in order."""
    code = "; ".join(f"import {m}" for m in modules)
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    ).stderr
    out = {}
    for line in err.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] in modules and parts[1].isdigit():
            out[parts[2]] = int(parts[1]) / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"hardware: {hardware()}")
    print(f"load average at start: {os.getloadavg()}")
    py = [sys.executable]
    ls = [*py, "-m", "loopscale"]
    with tempfile.TemporaryDirectory() as tmp:
        runs, fit_file = Path(tmp) / "runs.csv", Path(tmp) / "fit.json"
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from loopscale.fit import synthetic_runs; "
                f"synthetic_runs(0.46, seed=4).to_csv({str(runs)!r}, index=False)",
            ],
            check=True,
        )
        commands = {
            "python -c pass": [*py, "-c", "pass"],
            "loopscale info --help": [*ls, "info", "--help"],
            "loopscale sweep plan demo --no-calibrate": [*ls, "sweep", "plan", "demo", "--no-calibrate"],
            "loopscale fit --help": [*ls, "fit", "--help"],
            "loopscale fit RUNS.csv (tiny fit)": [*ls, "fit", str(runs), *TINY_FIT, "--out", str(fit_file)],
            "fit's import chain": [*py, "-c", "import loopscale.cli, loopscale.fit"],
            "loopscale plan -C 1e19 --paper": [*ls, "plan", "-C", "1e19", "--paper"],
            "loopscale report --help": [*ls, "report", "--help"],
            "loopscale design --help": [*ls, "design", "--help"],
        }
        print(f"\n{'command':<42} {'wall s':>7} {'min':>5} {'max':>5} {'cpu s':>6} {'startup s':>9} {'peak MB':>8}")
        for name, argv in commands.items():
            walls, cpus, rss, own = [], [], [], []
            for _ in range(args.repeats):
                w, c, mb = timed(argv)
                walls.append(w)
                cpus.append(c)
                rss.append(mb)
                if "tiny fit" in name:
                    own.append(json.loads(fit_file.read_text())["wall_s"])
            med = statistics.median
            start = f"{med(w - o for w, o in zip(walls, own, strict=True)):.2f}" if own else ""
            print(
                f"{name:<42} {med(walls):7.2f} {min(walls):5.2f} {max(walls):5.2f} {med(cpus):6.2f} "
                f"{start:>9} {med(rss):8.0f}"
            )
    chain = ["loopscale.cli", "loopscale.fit", "pandas", "loopscale.fit.pipeline"]
    cum = import_times(chain)
    print("\nimport time of the fit command's chain (python -X importtime, cumulative, one run):")
    for m in chain:
        print(f"  {m:<26} {cum.get(m, float('nan')):.2f} s" + ("  (already imported above)" if m not in cum else ""))
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
