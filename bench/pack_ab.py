"""Packs against today's slots, side by side: the same sweeps with ``--pack auto`` and with ``--pack off``.

    python bench/pack_ab.py [--rounds 3] [--demo-rounds 1] [--suites probes quick demo] [--json out.json]

Each measurement is a fresh ``python -m loopscale sweep run SPEC --out NEW_DIR --no-progress`` process (2 CPU
slots, the presets' one thread per run), timed by its wall clock; in every round both settings of a suite run
back to back, the order alternating between rounds, so a slow minute of a shared machine slows both. The token
cache is built before the first measurement. After each pair the two runs tables are compared on every column but
``wall_s`` and ``attempts`` (bitwise where packs compute as solo runs do; otherwise the largest val_loss gap is
printed). Reported per suite: both wall times and their ratio (slots / packed) per round, and the medians; and
the CPU seconds the sweep and its workers used (user + system), whose ratio moves less with what else runs on a
shared machine than the wall clock does.

Suites (what is measured; nothing is extrapolated):

- ``probes``: a slice of the ``probes`` preset: its smallest budget (7.5e10), both widths, all four r and all 8
  seeds, of the baseline (with its r = 1 runs) and the user's technique ``gated`` (trained under torch.vmap):
  112 of its 784 runs (the whole grid is 44 min a way);
- ``quick``: the sweep of ``loopscale demo --quick`` (the ``quick`` preset, 20 runs);
- ``demo``: the sweep of ``loopscale demo`` (the ``demo`` preset, 35 runs, ~10 min a way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SUITES: dict[str, list[str]] = {
    "probes": [
        "probes",
        "--set",
        "sweep.budgets=[7.5e10]",
        "--set",
        'sweep.widths={unit = "d_model", "7.5e10" = [16, 32]}',
        "--variant",
        "baseline",
        "--variant",
        "gated",
    ],
    "quick": ["quick"],
    "demo": ["demo"],
}


def load() -> float:
    return os.getloadavg()[0]


def sweep(args: list[str], out: Path, pack: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the sweep and all its workers: user + system, ``RUSAGE_CHILDREN``)."""
    import resource

    cmd = [sys.executable, "-m", "loopscale", "sweep", "run", *args, "--out", str(out), "--no-progress", "--pack", pack]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compare(a: Path, b: Path) -> str:
    import pandas as pd

    from loopscale.sweep import runs_table
    from loopscale.sweep.store import SweepStore

    ta, _ = runs_table(SweepStore(a))
    tb, _ = runs_table(SweepStore(b))
    cols = [c for c in ta.columns if c not in ("wall_s", "attempts")]
    try:
        pd.testing.assert_frame_equal(ta[cols], tb[cols], check_exact=True)
        return f"identical ({len(ta)} runs x {len(cols)} columns)"
    except AssertionError:
        gap = (ta["val_loss"] - tb["val_loss"]).abs().max()
        return f"differ: largest val_loss gap {gap:.3g}"


def warm(suites: list[str]) -> None:
    """Build the packed token rows of every suite's data and the C kernels before anything is timed."""
    from loopscale.model import cpu_kernels
    from loopscale.sweep import load_spec
    from loopscale.train.batches import load_token_data

    seen = set()
    for name in suites:
        spec_args = SUITES[name]
        sets = [spec_args[i + 1] for i, a in enumerate(spec_args) if a == "--set"]
        for rs in load_spec(spec_args[0], sets).runs():
            key = (rs.config.data.model_dump_json(), rs.config.model.seq_len)
            if key not in seen:
                seen.add(key)
                load_token_data(rs.config.data, rs.config.model.seq_len)
    cpu_kernels.library()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the probes slice and quick")
    ap.add_argument("--demo-rounds", type=int, default=1)
    ap.add_argument("--suites", nargs="+", default=["quick", "probes", "demo"], choices=sorted(SUITES))
    ap.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    args = ap.parse_args()
    from model_step import hardware

    print(f"hardware: {hardware()}; load average {os.getloadavg()}", flush=True)
    warm(args.suites)
    results: dict[str, list[dict]] = {s: [] for s in args.suites}
    root = Path(tempfile.mkdtemp(prefix="pack_ab-"))
    for suite in args.suites:
        rounds = args.demo_rounds if suite == "demo" else args.rounds
        for i in range(rounds):
            order = ["auto", "off"] if i % 2 == 0 else ["off", "auto"]
            rec: dict = {"round": i + 1, "order": order}
            for pack in order:
                out = root / f"{suite}-{i}-{pack}"
                before = load()
                rec[pack], rec[f"cpu_{pack}"] = sweep(SUITES[suite], out, pack)
                rec[f"load_{pack}"] = (round(before, 2), round(load(), 2))
            rec["ratio"] = rec["off"] / rec["auto"]
            rec["cpu_ratio"] = rec["cpu_off"] / rec["cpu_auto"]
            rec["tables"] = compare(root / f"{suite}-{i}-auto", root / f"{suite}-{i}-off")
            results[suite].append(rec)
            print(
                f"{suite} round {i + 1} ({' first, '.join(order)} second): packed {rec['auto']:.1f} s, "
                f"slots {rec['off']:.1f} s, slots / packed {rec['ratio']:.2f}; CPU s {rec['cpu_auto']:.0f} / "
                f"{rec['cpu_off']:.0f} ({rec['cpu_ratio']:.2f}); load {rec['load_auto']} / "
                f"{rec['load_off']}; tables {rec['tables']}",
                flush=True,
            )
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    print(
        "\nsuite     rounds  packed (median)  slots (median)  slots / packed: wall (median, range), "
        "CPU seconds (median, range)"
    )
    for suite, recs in results.items():
        if not recs:
            continue
        ratios, cpu = [r["ratio"] for r in recs], [r["cpu_ratio"] for r in recs]
        print(
            f"{suite:8s}  {len(recs):6d}  {statistics.median(r['auto'] for r in recs):13.1f} s  "
            f"{statistics.median(r['off'] for r in recs):12.1f} s  {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}), {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f})"
        )


if __name__ == "__main__":
    main()
