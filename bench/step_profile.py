"""Where a CPU training step's time goes: torch.profiler's self time by part, side by side.

    python bench/step_profile.py [--nanogpt /path/to/nanoGPT] [--optim muonh adamw] [--top 12]

Profiles loopscale's step (forward, backward, optimiser step at issue 20's shape: d = 128, L_eff = 20,
T = 256, batch 16, head_dim 32, vocabulary 320, fp32, r = 1) with its fused CPU functions
(``loopscale/model/fused.py``) and their compiled kernels (``cpu_kernels.c``), the functions without the
kernels (``fused no C``) and neither (``unfused``), and with ``--nanogpt`` the same shape in nanoGPT's own
model.py + AdamW, all in one process, interleaved, ``--repeats`` profiled steps each (median per part).
Parts: matrix multiplies (mm, bmm, addmm, baddbmm), SDPA, the other aten ops (elementwise, reductions,
copies, fills), and Python/autograd (the self time outside aten ops: autograd nodes, custom functions,
the optimiser's Python; the compiled kernels run inside the custom functions, so their time is here).
Like the trainer, the process applies ``hardware.tune_cpu_malloc`` first.
The profiler's own overhead inflates the small ops; bench/train_throughput.py times the steps unprofiled.
"""

from __future__ import annotations

import argparse
import collections
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from loopscale.config import ModelConfig
from loopscale.model import LoopedLM, cpu_kernels, fused
from loopscale.optim import OptimConfig, build_optimizers
from loopscale.train.hardware import tune_cpu_malloc
from model_step import hardware

VOCAB, D, L_EFF, HEAD_DIM, T, BATCH = 320, 128, 20, 32, 256, 16
PARTS = ("matmul", "sdpa", "other aten", "python/autograd")


def part(name: str) -> str:
    if name.startswith(("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addmv")):
        return "matmul"
    if "scaled_dot_product" in name:
        return "sdpa"
    return "other aten" if name.startswith("aten::") else "python/autograd"


def loopscale_step(optim: str, on: bool, x: torch.Tensor, kernels: bool = True):
    cfg = ModelConfig(d_model=D, head_dim=HEAD_DIM, L_eff=L_EFF, r=1, seq_len=T, vocab_size=VOCAB)
    model = LoopedLM(cfg)
    opt = build_optimizers(
        model.param_groups(),
        OptimConfig(name=optim, transfer=False),
        d_model=D,
        tokens_per_step=BATCH * T,
        total_tokens=1e9,
        r=1,
    )

    def step() -> None:
        fused.ENABLED, cpu_kernels.ENABLED = on, kernels
        try:
            model(x[:, :-1], x[:, 1:]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        finally:
            fused.ENABLED = cpu_kernels.ENABLED = True

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nanogpt", type=Path, default=None, help="a clone of karpathy/nanoGPT")
    ap.add_argument("--optim", nargs="+", default=["muonh", "adamw"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=12, help="largest other-aten ops listed per variant")
    args = ap.parse_args()
    tuned = tune_cpu_malloc()
    print(
        f"hardware: {hardware()}  malloc: {'tuned (as the trainer)' if tuned else 'default'}  "
        f"cpu kernels: {cpu_kernels.status()}"
    )
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (BATCH, T + 1))
    steps = {}
    if args.nanogpt:
        import references

        steps["nanoGPT code (AdamW)"] = references.nanogpt_step(
            args.nanogpt, vocab=VOCAB, d=D, n_layer=L_EFF, head_dim=HEAD_DIM, seq_len=T, x=x
        )
    for optim in args.optim:
        steps[f"loopscale r=1 {optim} unfused"] = loopscale_step(optim, False, x)
        if cpu_kernels.library() is not None:
            steps[f"loopscale r=1 {optim} fused no C"] = loopscale_step(optim, True, x, kernels=False)
        steps[f"loopscale r=1 {optim} fused"] = loopscale_step(optim, True, x)
    for step in steps.values():
        step()
        step()
    parts: dict[str, dict[str, list[float]]] = {k: collections.defaultdict(list) for k in steps}
    ops: dict[str, dict[str, list[float]]] = {k: collections.defaultdict(list) for k in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                step()
            totals: collections.Counter[str] = collections.Counter()
            for e in prof.key_averages(group_by_input_shape=True):
                ms = e.self_cpu_time_total / 1e3
                totals[part(e.key)] += ms
                if part(e.key) == "other aten":
                    ops[name][f"{e.key} {e.count}x {str(e.input_shapes)[:60]}"].append(ms)
            for p in PARTS:
                parts[name][p].append(totals[p])
    print(
        f"\nself CPU ms per step (median of {args.repeats} profiled steps), d={D} L_eff={L_EFF} T={T} "
        f"batch={BATCH} head_dim={HEAD_DIM} V={VOCAB} fp32"
    )
    print(f"{'variant':>34} " + " ".join(f"{p:>15}" for p in PARTS) + f" {'total':>8}")
    for name in steps:
        med = [statistics.median(parts[name][p]) for p in PARTS]
        print(f"{name:>34} " + " ".join(f"{m:15.0f}" for m in med) + f" {sum(med):8.0f}")
    for name in steps:
        print(f"\n{name}: largest other-aten ops (ms per step)")
        top = sorted(((statistics.median(v), k) for k, v in ops[name].items()), reverse=True)[: args.top]
        for ms, key in top:
            print(f"  {ms:7.1f}  {key}")


if __name__ == "__main__":
    main()
