"""bench: the default fit on 116 runs and on 10,000 runs (time and peak memory), and `design` on the paper grid.

    python bench/fit_large.py                 # each case in its own process (peak RSS per case); ~3-5 min

Cases (synthetic tables drawn from the paper's law on its 116-run grid, sigma = 0.01 nats):
  116      the paper's grid, the full default `fit_runs` (500 starts, phi = 0 / 1 fits, loop_tax, per-r fits,
           200-resample bootstrap, optima, checks) - the number `loopscale fit runs.csv` costs
  10k      the grid with 87 seeds per run (10,000 rows), the same default fit
  10k-means  the same table averaged over seeds first (`--seed-means`: 116 rows with n_seeds)
  design   `loopscale design paper` as the CLI runs it (40 simulated studies with bootstrap + the search)
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Any

import pandas as pd


def table(n: int) -> pd.DataFrame:
    from loopscale.fit import synthetic_runs

    reps = -(-n // 116)
    parts = [synthetic_runs(0.46, seed=s).assign(run_id=lambda d, s=s: d["run_id"] + f"_s{s}") for s in range(reps)]
    return pd.concat(parts, ignore_index=True).iloc[:n].reset_index(drop=True)


def case(name: str) -> dict[str, float | str]:
    from loopscale.fit import fit_runs
    from loopscale.fit.table import as_runs

    t0 = time.perf_counter()
    if name == "design":
        from loopscale.cli import run_app

        code = run_app(["design", "paper", "--json"])
        assert code == 0
        out: dict[str, Any] = {"rows": 116}
    else:
        df = table(116 if name == "116" else 10_000)
        runs = as_runs(df).seed_means() if name == "10k-means" else as_runs(df)
        t0 = time.perf_counter()
        fit = fit_runs(runs)
        out = {"rows": len(runs.df), "phi": fit.variant("baseline").law.params.phi}
    out.update(
        {
            "case": name,
            "wall_s": time.perf_counter() - t0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        print("RESULT " + json.dumps(case(sys.argv[2])))
        return
    names = sys.argv[1:] or ["116", "10k", "10k-means", "design"]
    for name in names:
        proc = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True, check=True)
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        r = json.loads(line[len("RESULT ") :])
        print(
            f"{r['case']:>10}: {r['rows']:>6} rows  {r['wall_s']:7.1f} s  peak RSS {r['peak_rss_mb']:7.0f} MB"
            + (f"  phi {r['phi']:.4f}" if "phi" in r else "")
        )


if __name__ == "__main__":
    main()
