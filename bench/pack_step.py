"""One training step of k packed members against k solo steps, per member: where a pack's gain comes from.

    python bench/pack_step.py [--widths 16 32 48] [--ks 2 4 8] [--rounds 5] [--head-dim 16] [--batch 32]

The ``probes`` / ``demo`` shape (L_eff 12 as 2 + 2 x 4 + 2, T 64, vocabulary 257, MuonH, fp32, the fused CPU
functions and their kernels, one thread). Each (width, k) runs in a fresh process: a solo model and a pack of k
(``loopscale.model.packed``, ``loopscale.optim.packed``), warmed up, then ``--rounds`` interleaved rounds of 3 steps
each; reported: the median solo step, the median packed step divided by k, their ratio. Also the solo step at
``--batch`` rows and at k times as many rows (one model, a larger batch): the most a pack could gain if it were
free of every per-member cost, since the packed step does what the larger batch does plus the member dimension.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import statistics, sys, time, torch
torch.set_num_threads(1)
from loopscale.config import ModelConfig
from loopscale.model import LoopedLM
from loopscale.model.packed import PackedLM
from loopscale.optim import OptimConfig, build_optimizers
from loopscale.optim.packed import PackedOptimizers
from loopscale.train.hardware import tune_cpu_malloc
tune_cpu_malloc()
d, k, hd, B, rounds = {d}, {k}, {hd}, {batch}, {rounds}
cfg = ModelConfig(d_model=d, head_dim=hd, L_eff=12, n_prelude=2, n_coda=2, r=4, seq_len=64, vocab_size=257)
def make(seed):
    torch.manual_seed(seed); m = LoopedLM(cfg)
    return m, build_optimizers(m.param_groups(), OptimConfig(lr_scale=10), d_model=d, tokens_per_step=B * 64,
                               total_tokens=1e6, r=4)
solo, big = make(0), make(0)
members = [make(s) for s in range(k)]
pack = PackedLM([m for m, _ in members])
popt = PackedOptimizers(pack.stacked(), [o for _, o in members],
                        [{{id(p): n for n, p in m.named_parameters()}} for m, _ in members])
x = torch.randint(0, 257, (k, B, 65))
xb = x.reshape(k * B, 65)
def one(mo, xx):
    m, o = mo; l = m(xx[:, :-1], xx[:, 1:]); l.backward(); o.step(); o.zero_grad()
def packed():
    l = pack(x[:, :, :-1], x[:, :, 1:]); l.sum().backward(); popt.step(); popt.zero_grad()
steps = {{"solo": lambda: one(solo, x[0]), "pack": packed, "big": lambda: one(big, xb)}}
for f in steps.values():
    f(); f()
times = {{n: [] for n in steps}}
for _ in range(rounds):
    for n, f in steps.items():
        t = time.perf_counter()
        for _ in range(3):
            f()
        times[n].append((time.perf_counter() - t) / 3)
med = {{n: statistics.median(v) for n, v in times.items()}}
print(med["solo"], med["pack"] / k, med["big"] / k)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 32, 48])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from model_step import hardware

    print(f"hardware: {hardware()} (children: 1 thread); load average {os.getloadavg()}")
    print(f"{'d':>4} {'k':>3} {'solo ms':>9} {'packed ms/member':>17} {'solo/packed':>12} {'k x rows, ms/member':>20}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for d in args.widths:
        for k in args.ks:
            code = CHILD.format(d=d, k=k, hd=args.head_dim, batch=args.batch, rounds=args.rounds)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            solo, packed, big = (float(v) for v in out.stdout.split())
            print(f"{d:4d} {k:3d} {1e3 * solo:9.1f} {1e3 * packed:17.1f} {solo / packed:12.2f} {1e3 * big:20.1f}")


if __name__ == "__main__":
    main()
