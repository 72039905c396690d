"""Paired A/B of one CPU training step: this checkout against another checkout of loopscale (e.g. before a refactor).

    git worktree add /tmp/before <commit>   # or any clone of loopscale at the commit to compare with
    python bench/tree_ab.py --other /tmp/before [--rounds 8]

Each round times the same step (bench/step_profile.py's shape: d = 128, L_eff = 20, T = 256, batch 16, head_dim
32, vocabulary 320, fp32, MuonH, the fused CPU functions and their kernels; one thread) in a fresh process of each
checkout, back to back, and takes the ratio within the round, so a slow minute slows both sides. Reported: the
median of the per-round ratios (this / other) and their range. Each checkout runs its own ``src`` and ``bench``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: one process: build the step of that checkout, warm it up, print the mean seconds of ``steps`` steps.
CHILD = """
import sys, time, torch
torch.manual_seed(0); torch.set_num_threads(1)
from step_profile import BATCH, T, VOCAB, loopscale_step
x = torch.randint(0, VOCAB, (BATCH, T + 1))
step = loopscale_step("muonh", True, x)
for _ in range(2):
    step()
t = time.perf_counter()
for _ in range({steps}):
    step()
print((time.perf_counter() - t) / {steps})
"""


def timed(tree: Path, steps: int) -> float:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree / 'bench'}", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(steps=steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree / "bench",
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", type=Path, required=True, help="another checkout of loopscale (its root)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per process")
    args = ap.parse_args()
    other = args.other.resolve()
    if not (other / "src" / "loopscale").is_dir() or not (other / "bench" / "step_profile.py").is_file():
        raise SystemExit(f"--other: {other} is no loopscale checkout with bench/step_profile.py")
    sys.path.insert(0, str(HERE / "bench"))
    from model_step import hardware

    print(f"hardware: {hardware()} (children: 1 thread)")
    ratios = []
    for i in range(args.rounds):
        if i % 2 == 0:  # alternate which checkout goes first
            a, b = timed(HERE, args.steps), timed(other, args.steps)
        else:
            b, a = timed(other, args.steps), timed(HERE, args.steps)
        ratios.append(a / b)
        print(f"round {i + 1}: this {a:.4f} s/step, other {b:.4f} s/step, ratio {a / b:.3f}")
    print(
        f"this / other: median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
        f"{len(ratios)} rounds)"
    )


if __name__ == "__main__":
    main()
