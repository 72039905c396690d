"""bench: the same sweep one run at a time and in parallel CPU slots — wall time and bitwise identity.

    python bench/cpu_slots.py                         # the quick preset, --slots 1 then --slots 2
    python bench/cpu_slots.py --spec demo --slots 2 --order parallel-first

Runs ``loopscale sweep run SPEC --slots 1`` and ``--slots N`` into fresh sweep dirs (one after the
other, in the order given; the packed-data cache is warmed first so neither pays for building it),
times each command's wall clock, collects both runs tables and compares them on every column but
``wall_s`` and ``attempts`` with no tolerance. Also reports the machine's load average before and
after each sweep: other jobs on the cores slow the parallel sweep more than the serial one.
bench/RESULTS.md records the numbers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sweep(spec: str, out: Path, slots: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "loopscale",
        "sweep",
        "run",
        spec,
        "--out",
        str(out),
        "--slots",
        str(slots),
        "--no-progress",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="quick")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--order", choices=("serial-first", "parallel-first"), default="serial-first")
    ap.add_argument("--dir", type=Path, default=None, help="where the sweeps go (default: a temporary dir)")
    args = ap.parse_args()

    import pandas as pd

    from loopscale.sweep import load_spec, open_store, runs_table
    from loopscale.train.batches import load_token_data

    root = args.dir or Path(tempfile.mkdtemp(prefix="cpu_slots_"))
    os.environ.setdefault("LOOPSCALE_CACHE", str(root / "cache"))
    for cfg in {
        (rs.config.data.model_dump_json(), rs.config.model.seq_len): rs.config for rs in load_spec(args.spec).runs()
    }.values():
        load_token_data(cfg.data, cfg.model.seq_len)  # warm the packed-row cache: not what is measured
    order = [1, args.slots] if args.order == "serial-first" else [args.slots, 1]
    walls, tables = {}, {}
    for n in order:
        load0 = os.getloadavg()[0]
        walls[n] = sweep(args.spec, root / f"slots{n}", n)
        tables[n], _ = runs_table(open_store(root / f"slots{n}"))
        print(
            f"--slots {n}: {walls[n]:.1f} s wall, {len(tables[n])} runs, load average {load0:.2f} -> "
            f"{os.getloadavg()[0]:.2f}",
            flush=True,
        )
    a, b = tables[1], tables[args.slots]
    cols = [c for c in a.columns if c not in ("wall_s", "attempts")]
    pd.testing.assert_frame_equal(a[cols], b[cols], check_exact=True)
    run_s = {n: float(tables[n]["wall_s"].sum()) for n in order}
    print(f"identical: {len(cols)} columns of {len(a)} runs, no tolerance")
    print(
        f"speed-up {walls[1] / walls[args.slots]:.2f}x; sum of run times {run_s[1]:.0f} s (serial) vs "
        f"{run_s[args.slots]:.0f} s (slots)"
    )


if __name__ == "__main__":
    main()
