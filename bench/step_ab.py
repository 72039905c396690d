"""Paired A/B of one CPU training step: nanoGPT's own code against loopscale, round by round.

    python bench/step_ab.py --nanogpt /path/to/nanoGPT [--rounds 20]

On a shared 2-core guest a variant's median moves by ±5 % from one run of bench/train_throughput.py to
the next, more than the differences this issue is about. Here every round times one step of each variant
back to back (nanoGPT's model.py + AdamW; loopscale r = 1 with AdamW and with MuonH, each with the fused
CPU functions and their compiled kernels, and without the kernels), and the speed ratio to nanoGPT's step
is taken within the round, so a slow minute slows both sides of a ratio. Reported: the median of the
per-round ratios and their interquartile range. Shape as bench/step_profile.py (issue 20's: d = 128,
L_eff = 20, T = 256, batch 16, head_dim 32, vocabulary 320, fp32); the trainer's allocator settings apply.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

import references
from loopscale.model import cpu_kernels
from loopscale.train.hardware import tune_cpu_malloc
from model_step import hardware, paired_rounds
from step_profile import BATCH, HEAD_DIM, L_EFF, VOCAB, D, T, loopscale_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nanogpt", type=Path, required=True, help="a clone of karpathy/nanoGPT")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    tune_cpu_malloc()
    print(f"hardware: {hardware()}  cpu kernels: {cpu_kernels.status()}")
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (BATCH, T + 1))
    steps = {
        "nanoGPT code (AdamW)": references.nanogpt_step(
            args.nanogpt, vocab=VOCAB, d=D, n_layer=L_EFF, head_dim=HEAD_DIM, seq_len=T, x=x
        )
    }
    for optim in ("adamw", "muonh"):
        steps[f"loopscale r=1 {optim}"] = loopscale_step(optim, True, x)
        if cpu_kernels.library() is not None:
            steps[f"loopscale r=1 {optim} no C"] = loopscale_step(optim, True, x, kernels=False)
    times = paired_rounds(steps, args.rounds)
    base = times["nanoGPT code (AdamW)"]
    print(f"\n{args.rounds} rounds, d={D} L_eff={L_EFF} T={T} batch={BATCH} head_dim={HEAD_DIM} V={VOCAB} fp32")
    print(f"{'variant':>30} {'median ms':>10} {'vs nanoGPT (median of rounds)':>30} {'IQR':>13}")
    for name, t in times.items():
        ratios = [b / s for b, s in zip(base, t, strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        print(f"{name:>30} {statistics.median(t) * 1e3:10.0f} {statistics.median(ratios):30.3f} {q1:6.3f}-{q3:.3f}")


if __name__ == "__main__":
    main()
