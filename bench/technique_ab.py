"""Paired A/B of one CPU training step of looped models: the loop before and after it moved onto the
technique interface (``loopscale.technique``), and a user's technique (loopscale/examples/gated_loop.py) beside the
built-in linear injection it extends.

    python bench/technique_ab.py [--rounds 20]

"before" is loopscale's own loop as it was (``_loop_before`` below: the built-in injection's four steps and
``bptt_k`` read from the config) patched into the same model; "after" is the shipped loop, which asks the
technique for ``block`` and ``grad``. Every round times one step of each variant back to back and the ratios
are taken within the round (bench/step_ab.py). Shape: d = 128, L_eff = 20 (2 + 4x4 + 2 at r = 4), T = 256,
batch 16, head_dim 32, vocabulary 320, fp32, AdamW.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path

import torch

from loopscale.config import ModelConfig
from loopscale.model import KVCache, LoopedLM
from loopscale.optim import OptimConfig
from loopscale.optim.build import build_optimizers
from loopscale.train.hardware import tune_cpu_malloc
from model_step import hardware, paired_rounds

D, L_EFF, T, BATCH, HEAD_DIM, VOCAB, R = 128, 20, 256, 16, 32, 320, 4
EXAMPLE = Path(__file__).resolve().parent.parent / "src" / "loopscale" / "examples" / "gated_loop.py"


def _loop_before(self: LoopedLM, e: torch.Tensor, r: int, cache: KVCache | None) -> torch.Tensor:
    k = self.cfg.k_grad if r == self.cfg.r else r
    n_detached = r - k if torch.is_grad_enabled() else 0
    state = self.inject.init(e)
    for i in range(r):
        with torch.no_grad() if i < n_detached else contextlib.nullcontext():
            u = self.inject.input(i, e, state)
            s = self.norm_recur(self._stack(self.recur, u, cache))
            state = self.inject.update(i, state, s)
    return self.inject.readout(state)


def make_step(cfg: ModelConfig, x: torch.Tensor, before: bool = False):
    torch.manual_seed(0)
    model = LoopedLM(cfg)
    if before:
        model._loop = _loop_before.__get__(model)  # type: ignore[method-assign]
    opt = build_optimizers(
        model.param_groups(),
        OptimConfig(name="adamw", transfer=False),
        d_model=D,
        tokens_per_step=BATCH * T,
        total_tokens=1e9,
        r=cfg.r,
    )

    def step() -> float:
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    tune_cpu_malloc()
    torch.set_num_threads(1)
    print(f"hardware: {hardware()}  threads: 1")
    x = torch.randint(0, VOCAB, (BATCH, T + 1), generator=torch.Generator().manual_seed(0))
    shape = {"d_model": D, "head_dim": HEAD_DIM, "L_eff": L_EFF, "r": R, "seq_len": T, "vocab_size": VOCAB}
    steps = {
        "linear, loop before": make_step(ModelConfig(**shape), x, before=True),
        "linear, loop after": make_step(ModelConfig(**shape), x),
        "tbptt k=2, loop before": make_step(ModelConfig(**shape, bptt_k=2), x, before=True),
        "tbptt k=2, loop after": make_step(ModelConfig(**shape, bptt_k=2), x),
        "example GatedLoop": make_step(ModelConfig(**shape, technique=f"{EXAMPLE}:GatedLoop"), x),
    }
    losses = {name: [step(), step()] for name, step in steps.items()}
    assert losses["linear, loop before"] == losses["linear, loop after"], losses  # the same bits
    assert losses["tbptt k=2, loop before"] == losses["tbptt k=2, loop after"], losses
    times = paired_rounds(steps, args.rounds, warmup=0)  # (the two losses above were the warm-up)
    print(
        f"\n{args.rounds} rounds, d={D} L_eff={L_EFF} r={R} T={T} batch={BATCH} fp32 AdamW; first two losses "
        "bitwise equal before/after"
    )
    pairs = {
        "linear, loop after": "linear, loop before",
        "tbptt k=2, loop after": "tbptt k=2, loop before",
        "example GatedLoop": "linear, loop after",
    }
    print(f"{'variant':>24} {'median ms':>10} {'time / reference (median of rounds)':>36} {'IQR':>13}  reference")
    for name, t in times.items():
        ref = pairs.get(name)
        if ref is None:
            print(f"{name:>24} {statistics.median(t) * 1e3:10.0f}")
            continue
        ratios = [a / b for a, b in zip(t, times[ref], strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        print(
            f"{name:>24} {statistics.median(t) * 1e3:10.0f} {statistics.median(ratios):36.3f} {q1:6.3f}-{q3:.3f}  {ref}"
        )


if __name__ == "__main__":
    main()
