"""Forward+backward throughput of the looped model vs r = 1 and vs two plain PyTorch GPTs.

    python bench/model_step.py [--widths 64 128] [--seq-len 256] [--batch 8] [--repeats 5]

Every model is timed in the same process, interleaved round-robin, median of repeats, so the
ratios are measured side by side. Prints tokens/s, the ratio of each r to r = 1 (targets: r = 8
within 1.10x of r = 1's step time) and of loopscale r = 1 to the plain GPT (target >= 1.0x): "plain" is
nanoGPT's block (LayerNorm, GELU, learned positions), "paper" the paper's block (RMSNorm, RoPE, QK-norm,
squared ReLU, softcap) written straightforwardly without loop machinery — the same mathematics as r = 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loopscale.config import ModelConfig
from loopscale.model import LoopedLM
from plain_gpt import PlainGPT, PlainPaperGPT


def paired_rounds(steps: dict, rounds: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of each step per round, every step timed once per round back to back (so a slow minute slows
    every variant of that round: ratios are taken within a round)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return times


def hardware() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def step_fn(model: torch.nn.Module, x: torch.Tensor):
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model.loss(x, x).backward()

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--L-eff", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=320)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="steps per timed repeat")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--compile", action="store_true", help="also time per-block torch.compile of both models")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    torch.manual_seed(0)
    print(f"hardware: {hardware()}")
    results = []
    for d in args.widths:
        x = torch.randint(0, args.vocab, (args.batch, args.seq_len))
        models: dict[str, torch.nn.Module] = {
            "plain": PlainGPT(args.vocab, d, args.L_eff, args.head_dim, args.seq_len),
            "paper": PlainPaperGPT(args.vocab, d, args.L_eff, args.head_dim, args.seq_len),
        }
        for r in (1, 2, 4, 8):
            cfg = ModelConfig(
                d_model=d, head_dim=args.head_dim, L_eff=args.L_eff, r=r, seq_len=args.seq_len, vocab_size=args.vocab
            )
            models[f"r={r}"] = LoopedLM(cfg)
        if args.compile:
            plain_c = PlainGPT(args.vocab, d, args.L_eff, args.head_dim, args.seq_len)
            for b in plain_c.blocks:
                b.compile()
            models["plain+c"] = plain_c
            for r in (1, 8):
                cfg = ModelConfig(
                    d_model=d,
                    head_dim=args.head_dim,
                    L_eff=args.L_eff,
                    r=r,
                    seq_len=args.seq_len,
                    vocab_size=args.vocab,
                )
                m = LoopedLM(cfg)
                for b in m.blocks():
                    b.compile()
                models[f"r={r}+c"] = m
        steps = {k: step_fn(m, x) for k, m in models.items()}
        for s in steps.values():  # warm-up
            s()
            s()
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.repeats):
            for k, s in steps.items():
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    s()
                times[k].append((time.perf_counter() - t0) / args.steps)
        med = {k: statistics.median(v) for k, v in times.items()}
        tok = args.batch * args.seq_len
        print(f"\nd_model={d}  L_eff={args.L_eff}  T={args.seq_len}  batch={args.batch}  head_dim={args.head_dim}")
        print(
            f"{'model':>8} {'ms/step':>9} {'tokens/s':>10} {'step / r=1':>11} {'r=1 speed / plain':>18}"
            f" {'r=1 speed / paper':>18}"
        )
        for k, t in med.items():
            rel = t / med["r=1+c" if k.endswith("+c") and "r=1+c" in med else "r=1"]
            base = "plain+c" if k.endswith("+c") else "plain"
            vs_plain = med[base] / t if k.startswith("r=1") else float("nan")
            extra = f"{vs_plain:18.2f}" if k.startswith("r=1") else ""
            if k == "r=1":
                extra += f" {med['paper'] / t:18.2f}"
            print(f"{k:>8} {t * 1e3:9.1f} {tok / t:10.0f} {rel:11.3f} {extra}")
            results.append(
                {"d_model": d, "model": k, "ms_per_step": t * 1e3, "tokens_per_s": tok / t, "step_ratio_to_r1": rel}
            )
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
