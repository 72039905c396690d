"""Training-step throughput: tokens/s and achieved FLOP/s per r, width, dtype and compile mode,
and the ratio to plain PyTorch GPT training loops of the same shape.

    python bench/train_throughput.py [--widths 64 128] [--dtypes float32 bfloat16] [--compile]

    python bench/train_throughput.py --widths 128 --L-eff 20 --dtypes float32 --rs 1 4 8 \
        --nanogpt /path/to/nanoGPT --paper /path/to/looped-lm-scaling      # against the real code

A step is what the trainer does: forward, backward, optimiser step, zero_grad. With ``--nanogpt`` and
``--paper`` (clones, never vendored: bench/references.py) the same shape also runs nanoGPT's own
model.py + AdamW and the paper's own nanochat/gpt.py + MuonAdamW (r = 1 and 4), and the table's last
columns are the speed ratios to them. Without them, three plain references (bench/plain_gpt.py), each
an ordinary PyTorch loop, stand in:

    nanoGPT adamw      nanoGPT's block (LayerNorm, GELU, learned positions) + torch AdamW
    paper-plain adamw  the paper's block written plainly + torch AdamW
    paper-plain muonh  the paper's block written plainly + MuonH one matrix at a time (+ AdamW rest)

loopscale runs with MuonH (its default, ``r=k``) and with plain AdamW (``r=1 ... adamw``); on CPU also
with its fused CPU functions turned off (``... unfused``: loopscale/model/fused.py, issue 20) and with
them on but without their compiled kernels (``... no C``: loopscale/model/cpu_kernels.c), so the step
before and after each is measured side by side. Like the trainer, the process first applies
``hardware.tune_cpu_malloc`` on CPU (every variant runs under it; ``--default-malloc`` skips it). "vs same"
is the speed ratio to the paper-plain loop with the same optimiser (the engineering overhead of
loopscale); "vs nanoGPT" also contains the cost of the paper's architecture. All variants run in one
process, interleaved, median of repeats. FLOP/s uses the accounting's F. On a CUDA machine it also
prints MFU against the device's dense bf16 peak and peak memory per r.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loopscale import accounting
from loopscale.config import ModelConfig
from loopscale.model import LoopedLM, cpu_kernels, fused
from loopscale.optim import OptimConfig, build_optimizers
from loopscale.train.hardware import autocast, peak_flops, tune_cpu_malloc
from model_step import hardware
from plain_gpt import PlainGPT, PlainPaperGPT, plain_optimizer


def make_step(model, opts, x, device, dtype):
    def step() -> None:
        with autocast(device, dtype):
            loss = model(x[:, :-1], x[:, 1:]) if isinstance(model, LoopedLM) else model.loss(x[:, :-1], x[:, 1:])
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def with_fused(step, on: bool, kernels: bool = True):
    """Run ``step`` with loopscale's fused CPU functions on or off (``loopscale.model.fused.ENABLED``) and, when
    on, with or without their compiled kernels (``loopscale.model.cpu_kernels.ENABLED``)."""

    def run() -> None:
        fused.ENABLED, cpu_kernels.ENABLED = on, kernels
        try:
            step()
        finally:
            fused.ENABLED = cpu_kernels.ENABLED = True

    return run


def in_autocast(step, device, dtype):
    def run() -> None:
        with autocast(device, dtype):
            step()

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rs", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--compile", action="store_true", help="also time per-block torch.compile (slow to build)")
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--L-eff", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=320, help="a multiple of 64: no padding, every model the same shape")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--nanogpt", type=Path, default=None, help="a clone of karpathy/nanoGPT")
    ap.add_argument("--paper", type=Path, default=None, help="a clone of kschwethelm/looped-lm-scaling")
    ap.add_argument("--default-malloc", action="store_true", help="skip the trainer's glibc malloc settings")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tuned = device.type == "cpu" and not args.default_malloc and tune_cpu_malloc()
    print(
        f"hardware: {hardware()}  device: {device}  malloc: {'tuned (as the trainer)' if tuned else 'default'}"
        + (f"  cpu kernels: {cpu_kernels.status()}" if device.type == "cpu" else "")
    )
    results = []
    for d in args.widths:
        x = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device=device)
        variants: dict[str, tuple] = {}
        for dtype in args.dtypes:
            shape = (args.vocab, d, args.L_eff, args.head_dim, args.seq_len)
            refs = (
                ("nanoGPT adamw", PlainGPT, "adamw"),
                ("paper-plain adamw", PlainPaperGPT, "adamw"),
                ("paper-plain muonh", PlainPaperGPT, "muonh"),
            )
            for name, cls, optim in refs:
                ref = cls(*shape).to(device)
                variants[f"{name} {dtype}"] = (make_step(ref, plain_optimizer(ref, optim), x, device, dtype), None)
            shape_kw = dict(vocab=args.vocab, d=d, head_dim=args.head_dim, seq_len=args.seq_len, x=x)
            if args.nanogpt:
                import references

                variants[f"nanoGPT code {dtype}"] = (
                    in_autocast(references.nanogpt_step(args.nanogpt, n_layer=args.L_eff, **shape_kw), device, dtype),
                    None,
                )
            if args.paper:
                import references

                for r in (1, 4):
                    variants[f"paper code r={r} {dtype}"] = (
                        in_autocast(
                            references.paper_step(args.paper, L_eff=args.L_eff, r=r, **shape_kw), device, dtype
                        ),
                        None,
                    )
            on_cpu = device.type == "cpu"
            unfused = [(r, "muonh", "unfused") for r in args.rs] + [(1, "adamw", "unfused")] if on_cpu else []
            no_c = [(1, "muonh", "no C"), (1, "adamw", "no C")] if on_cpu and cpu_kernels.library() else []
            for compiled in [False, True] if args.compile else [False]:
                for r, optim, how in [(r, "muonh", "") for r in args.rs] + [(1, "adamw", "")] + no_c + unfused:
                    if compiled and how:
                        continue
                    cfg = ModelConfig(
                        d_model=d,
                        head_dim=args.head_dim,
                        L_eff=args.L_eff,
                        r=r,
                        seq_len=args.seq_len,
                        vocab_size=args.vocab,
                    )
                    m = LoopedLM(cfg).to(device)
                    if compiled:
                        for b in m.blocks():
                            b.compile()
                    opt = build_optimizers(
                        m.param_groups(),
                        OptimConfig(name=optim, transfer=False),
                        d_model=d,
                        tokens_per_step=args.batch * args.seq_len,
                        total_tokens=1e9,
                        r=r,
                    )
                    name = (
                        f"r={r} {dtype}{' compile' if compiled else ''}{' adamw' if optim == 'adamw' else ''}"
                        f"{' ' + how if how else ''}"
                    )
                    variants[name] = (
                        with_fused(make_step(m, [opt], x, device, dtype), how != "unfused", how != "no C"),
                        cfg,
                    )
        for name, (step, _) in variants.items():  # warm-up (and compile)
            t0 = time.perf_counter()
            step()
            step()
            if "compile" in name:
                print(f"  compiled {name} in {time.perf_counter() - t0:.1f} s")
        times: dict[str, list[float]] = {k: [] for k in variants}
        mem: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, (step, _) in variants.items():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    mem[name] = torch.cuda.max_memory_allocated() / 2**30
                times[name].append((time.perf_counter() - t0) / args.steps)
        tok = args.batch * args.seq_len
        print(f"\nd_model={d} L_eff={args.L_eff} T={args.seq_len} batch={args.batch} head_dim={args.head_dim}")
        print(
            f"{'variant':>28} {'ms/step':>9} {'tokens/s':>10} {'GFLOP/s':>9} {'vs same':>8} {'vs nanoGPT':>10}"
            f" {'vs r=1':>7}"
            + (f" {'MFU':>6} {'GiB':>6}" if device.type == "cuda" else "")
            + (f" {'vs nanoGPT code':>15}" if args.nanogpt else "")
            + (f" {'vs paper r=1':>12}" if args.paper else "")
        )
        med = {k: statistics.median(v) for k, v in times.items()}
        for name, (_, cfg) in variants.items():
            dtype = next(t for t in args.dtypes if f" {t}" in name)
            optim = "adamw" if "adamw" in name else "muonh"
            t = med[name]
            same = med[f"paper-plain {optim} {dtype}"] / t
            nano = med[f"nanoGPT adamw {dtype}"] / t
            r1 = None
            if cfg is not None and optim == "muonh":
                r1 = name.replace(name.split()[0], "r=1", 1)
            f_tok = accounting.train_flops_per_token(cfg) if cfg is not None else None
            flops = f_tok * tok / t if f_tok else None
            peak = peak_flops(device, dtype)
            row = {
                "d_model": d,
                "variant": name,
                "ms_per_step": t * 1e3,
                "tokens_per_s": tok / t,
                "flops_per_s": flops,
                "speed_vs_same": same,
                "speed_vs_nanogpt": nano,
                "step_vs_r1": (t / med[r1]) if r1 in med else None,
                "mfu": flops / peak if (flops and peak) else None,
                "peak_mem_gib": mem.get(name),
            }
            results.append(row)
            gf = f"{flops / 1e9:9.2f}" if flops else f"{'-':>9}"
            vr1 = f"{row['step_vs_r1']:7.3f}" if row["step_vs_r1"] else f"{'-':>7}"
            line = f"{name:>28} {t * 1e3:9.1f} {tok / t:10.0f} {gf} {same:8.2f} {nano:10.2f} {vr1}"
            if device.type == "cuda":
                line += f" {row['mfu'] or 0:6.1%} {mem.get(name, 0):6.2f}"
            if args.nanogpt:
                row["speed_vs_nanogpt_code"] = med[f"nanoGPT code {dtype}"] / t
                line += f" {row['speed_vs_nanogpt_code']:15.2f}"
            if args.paper:
                row["speed_vs_paper_code"] = med[f"paper code r=1 {dtype}"] / t
                line += f" {row['speed_vs_paper_code']:12.2f}"
            print(line)
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
