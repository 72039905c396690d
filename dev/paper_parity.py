"""Generate loopscale's paper-parity fixtures by running the paper's own code (developer tool, not installed).

The paper (arXiv 2604.21106) ships its code as github kschwethelm/looped-lm-scaling, a nanochat fork. This
script imports that clone's model and optimiser (``nanochat/gpt.py``, ``nanochat/optim.py``) and executes
the learning-rate lines of its ``scripts/base_train.py`` verbatim (that script runs a whole job at import,
so the lines between two markers are executed in a namespace that holds the run's settings). It writes
what the paper's code computes, never its code, to ``tests/fixtures/parity/``:

- ``<case>.safetensors`` for six tiny models (vocabulary 100, padded to 128; r = 1 as the paper's
  0+12+0 passthrough, r = 2, 4, 8 with the linear injection, truncated BPTT, hyperconnect K = 2):
  the initial weights under the paper's names (the paper's init, then the norm scales, injection,
  lane scalars and LM head perturbed so that every parameter matters, then rounded to bfloat16 so
  the file is small and both sides load identical fp32 values), 9 batches of token ids, and the
  paper model's logits for the first batch at those weights;
- ``cases.json``: for each case the paper's GPTConfig, per-group learning rates, lr multipliers and
  the losses of its first 8 optimiser steps (plus the loss after them), FLOPs per token, D_ref;
- ``grid.json``: per-group learning rates, D_ref, target tokens, iterations and FLOPs per token for
  a set of paper-grid runs (widths, r, budgets, batch sizes, both probes) at the paper's vocabulary.

``tests/test_parity.py`` checks loopscale against these numbers in CI. Regenerate with::

    git clone https://github.com/kschwethelm/looped-lm-scaling /tmp/paper    # any commit; record it
    python dev/paper_parity.py --paper /tmp/paper

(CPU, about 10 s; needs ``filelock`` besides loopscale's dependencies). The paper's fused optimiser
steps are ``torch.compile``d; inductor fails on CPU with torch 2.13, so they run eagerly here
(``TORCHDYNAMO_DISABLE=1``): the same arithmetic, op for op.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "parity"
VOCAB, D, N_HEAD, T, ROWS, STEPS = 100, 32, 2, 16, 4, 8

# name: GPTConfig fields of the paper's model (its own names) for the tiny parity models, L_eff = 12
CASES: dict[str, dict[str, Any]] = {
    "r1": dict(n_prelude=0, n_recur_block=12, n_coda=0, num_recur=1, bptt_k=1, input_injection="passthrough"),
    "r2": dict(n_prelude=2, n_recur_block=4, n_coda=2, num_recur=2, bptt_k=2),
    "r4": dict(n_prelude=2, n_recur_block=2, n_coda=2, num_recur=4, bptt_k=4),
    "r8": dict(n_prelude=2, n_recur_block=1, n_coda=2, num_recur=8, bptt_k=8),
    "r4_tbptt": dict(n_prelude=2, n_recur_block=2, n_coda=2, num_recur=4, bptt_k=2),
    "r4_hc": dict(
        n_prelude=2, n_recur_block=2, n_coda=2, num_recur=4, bptt_k=4, input_injection="hyperconnect", num_lanes=2
    ),
}

# paper-grid runs: (s, r, budget C, tokens per step B, probe)
GRID: list[tuple[int, int, float, int, str]] = [
    *[(s, r, c, 2**18, "baseline") for s in (6, 10, 20, 34) for r in (1, 2, 4, 8) for c in (4.64e17, 2.15e19)],
    *[(10, r, 1e18, b, "baseline") for r in (1, 4) for b in (2**16, 2**17, 2**19, 2**20)],
    *[(s, r, c, 2**18, "truncated_bptt") for s, c in ((16, 1e18), (40, 2.15e19)) for r in (2, 4, 8)],
    *[(s, r, c, 2**18, "hyperconnect") for s, c in ((18, 2.15e18), (12, 4.64e17)) for r in (2, 4, 8)],
]

_ARGS = dict(
    num_iterations=-1,
    target_flops=-1.0,
    target_param_data_ratio=20,
    total_batch_size=2**18,
    aspect_ratio=64,
    head_dim=128,
    max_seq_len=2048,
    embedding_lr=0.3,
    unembedding_lr=0.004,
    matrix_lr=0.014,
    warmup_ratio=0.0,
    warmdown_ratio=1.0,
    final_lr_frac=0.1,
)


def _segment(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i : text.index(end, i)]


class Paper:
    """The paper's clone: its model classes and the lr lines of scripts/base_train.py."""

    def __init__(self, path: Path) -> None:
        sys.path.insert(0, str(path))
        import nanochat.gpt as gpt

        self.gpt = gpt
        src = (path / "scripts" / "base_train.py").read_text()
        self.lr_block = _segment(src, "param_counts = model.num_scaling_params()", "\nif resuming:\n")
        self.iter_block = _segment(src, "# num_iterations: either it is given", "# Training loop")
        try:
            self.commit = subprocess.run(
                ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            self.commit = "unknown"

    def config(self, **fields: Any) -> Any:
        return self.gpt.GPTConfig(**fields)

    def run_setup(self, model: Any, **args: Any) -> dict[str, Any]:
        """Execute the paper's lr and horizon lines for ``model``; return their namespace."""
        ns: dict[str, Any] = {
            "args": SimpleNamespace(**{**_ARGS, **args}),
            "model": model,
            "model_config": model.config,
            "vocab_size": model.config.vocab_size,
            "GPT": self.gpt.GPT,
            "GPTConfig": self.gpt.GPTConfig,
            "torch": torch,
            "print0": lambda *a, **k: None,
        }
        exec(compile(self.lr_block, "base_train.py[lr]", "exec"), ns)
        exec(compile(self.iter_block, "base_train.py[horizon]", "exec"), ns)
        return ns


def group_lrs(optimizer: Any, hyperconnect: bool) -> dict[str, float]:
    """The paper's param_groups are [lm_head, embedding, norms, (lanes), muon by shape...]."""
    groups = optimizer.param_groups
    out = {"head": groups[0]["initial_lr"], "embed": groups[1]["initial_lr"], "norm": groups[2]["initial_lr"]}
    if hyperconnect:
        out["scalar"] = groups[3]["initial_lr"]
    muon = {g["initial_lr"] for g in groups if g["kind"] == "muon"}
    assert len(muon) == 1, muon
    out["matrix"] = muon.pop()
    return out


@torch.no_grad()
def _perturb(model: Any, g: torch.Generator) -> None:
    """Move every parameter off its symmetric init, so a wrong name mapping cannot go unnoticed."""
    for name, p in model.named_parameters():
        if p.ndim == 1 or name.startswith("lane_"):
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        elif name == "lm_head.weight":
            p.normal_(0.0, 0.05, generator=g)
        elif name == "inject.weight":
            p.add_(0.02 * torch.randn(p.shape, generator=g))
        p.copy_(p.bfloat16().float())


def _train(
    model: Any, ns: dict[str, Any], x: torch.Tensor, y: torch.Tensor, loss_scale: float = 1.0
) -> tuple[list[float], list[float], float]:
    """base_train.py's optimiser steps (one micro-batch each); the losses, lr multipliers, loss after."""
    optimizer, get_lr_multiplier = ns["optimizer"], ns["get_lr_multiplier"]
    losses, multipliers = [], []
    for step in range(STEPS):
        loss = model(x[step], y[step])
        (loss * loss_scale).backward()
        lrm = get_lr_multiplier(step)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
        optimizer.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
        multipliers.append(lrm)
    with torch.no_grad():
        after = model(x[STEPS], y[STEPS]).item()
    return losses, multipliers, after


def make_case(paper: Paper, name: str, fields: dict[str, Any], seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    cfg = paper.config(sequence_len=T, vocab_size=VOCAB, n_head=N_HEAD, n_kv_head=N_HEAD, n_embd=D, **fields)
    with torch.device("meta"):
        model = paper.gpt.GPT(cfg)
    model.to_empty(device="cpu")
    model.init_weights()
    g = torch.Generator().manual_seed(seed)
    _perturb(model, g)
    weights = {k: v.detach().bfloat16().clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, VOCAB, (STEPS + 1, ROWS, T + 1), generator=g)
    x, y = tokens[..., :-1].contiguous(), tokens[..., 1:].contiguous()
    with torch.no_grad():
        logits = model(x[0, :2])

    start = copy.deepcopy(model.state_dict())
    ns = paper.run_setup(model, num_iterations=STEPS, total_batch_size=ROWS * T)
    lrs = group_lrs(ns["optimizer"], fields.get("input_injection") == "hyperconnect")
    losses, multipliers, after = _train(model, ns, x, y)
    # The paper code's own numerical noise: the same run with the loss scaled by 1 + 2^-20, which leaves
    # every update unchanged in exact arithmetic (orthogonalisation and Adam are scale-free) but moves the
    # gradients by float32 rounding; bf16 Polar Express amplifies such last-bit changes.
    model.load_state_dict(start)
    noisy, _, noisy_after = _train(
        model, paper.run_setup(model, num_iterations=STEPS, total_batch_size=ROWS * T), x, y, loss_scale=1 + 2**-20
    )
    self_noise = max(abs(a - b) for a, b in zip([*losses, after], [*noisy, noisy_after], strict=True))
    save_file(
        {**{f"weight/{k}": v for k, v in weights.items()}, "tokens": tokens, "logits": logits.float().contiguous()},
        str(OUT / f"{name}.safetensors"),
    )
    return {
        "gpt_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "seed": seed,
        "rows": ROWS,
        "steps": STEPS,
        "lrs": lrs,
        "lr_multipliers": multipliers,
        "losses": losses,
        "loss_after": after,
        "self_noise": self_noise,
        "flops_per_token": model.estimate_flops(),
        "D_ref": ns["D_REF"],
        "target_tokens": ns["target_tokens"],
    }


def make_grid_run(paper: Paper, s: int, r: int, C: float, B: int, probe: str) -> dict[str, Any]:
    n_recur = 16 // r if r > 1 else 20
    fields: dict[str, Any] = dict(n_prelude=2, n_coda=2, n_recur_block=n_recur, num_recur=r, bptt_k=r)
    if r == 1:
        fields.update(n_prelude=0, n_coda=0, input_injection="passthrough")
    if probe == "truncated_bptt":
        fields["bptt_k"] = -(-r // 2)
    if probe == "hyperconnect":
        fields.update(input_injection="hyperconnect", num_lanes=2)
    d = s * 64
    cfg = paper.config(
        sequence_len=2048, vocab_size=32001, size=s, n_head=d // 128, n_kv_head=d // 128, n_embd=d, **fields
    )
    with torch.device("meta"):
        model = paper.gpt.GPT(cfg)
    ns = paper.run_setup(model, target_flops=C, total_batch_size=B)
    return {
        "s": s,
        "r": r,
        "C": C,
        "tokens_per_step": B,
        "probe": probe,
        "gpt_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "lrs": group_lrs(ns["optimizer"], probe == "hyperconnect"),
        "D_ref": ns["D_REF"],
        "target_tokens": ns["target_tokens"],
        "num_iterations": ns["num_iterations"],
        "flops_per_token": ns["num_flops_per_token"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", type=Path, required=True, help="clone of kschwethelm/looped-lm-scaling")
    args = ap.parse_args()
    torch.set_num_threads(1)
    paper = Paper(args.paper.resolve())
    OUT.mkdir(parents=True, exist_ok=True)
    cases = {name: make_case(paper, name, fields, seed) for seed, (name, fields) in enumerate(CASES.items())}
    grid = [make_grid_run(paper, *run) for run in GRID]
    meta = {
        "paper_commit": paper.commit,
        "torch": torch.__version__,
        "command": "python dev/paper_parity.py --paper PATH",
    }
    (OUT / "cases.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")
    (OUT / "grid.json").write_text(json.dumps({"meta": meta, "runs": grid}, indent=1) + "\n")
    for name, c in cases.items():
        print(f"{name:9s} losses {c['losses'][0]:.5f} -> {c['losses'][-1]:.5f}, self-noise {c['self_noise']:.2e}")
    print(f"{len(grid)} grid runs; fixtures in {OUT}")


if __name__ == "__main__":
    main()
